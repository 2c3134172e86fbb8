// When trace files are created (test_files.cpp): only processes that record an event get one.
//   prog_files none                 no CUDA call at all; prints "none pid=PID"
//   prog_files exec                 a wrapper that only execs `prog_files none`
//   prog_files spawn N              no CUDA call; forks N children that exec `prog_files none`
//                                   (compiler-subprocess style), one child that exit()s and
//                                   one that _exit()s, and waits for all
//   prog_files parent_cuda          cudaMalloc, then forks a child that execs `prog_files none`
//                                   and one that exit()s without CUDA; waits; cudaFree
//   prog_files late DIR             the first CUDA event comes late: after a fork+exec child
//                                   and a plain fork child ran, from the third of 4 threads
//                                   started before it; DIR is where traces go. Prints
//                                   file_before=0|1 (a t.PID.trace in DIR before the first
//                                   event), path_before= and path_after= (gpuheap_trace_path)
//                                   and start_ns= (CLOCK_MONOTONIC when main began)
//   prog_files cuda                 cudaMalloc and cudaFree once, nothing else
//   prog_files chdir_child DIR      no CUDA call; forks a child that chdir()s to DIR and only
//                                   then makes its first CUDA call (cudaMalloc, cudaFree)
//   prog_files bad_list DIR         appends DIR/gone.trace (no such file) and DIR/empty.trace
//                                   (created, a trace header and nothing else) to
//                                   $GPUHEAP_PATH_FILE, then allocates and frees once
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

// fork + exec `prog_files none`; returns the child's pid.
pid_t spawn_none() {
  std::string exe = self_exe();
  pid_t c = fork();
  if (c == 0) {
    execl(exe.c_str(), exe.c_str(), "none", static_cast<char*>(nullptr));
    _exit(127);
  }
  return c;
}

// A child that does CPU work only, then ends through exit(3) or _exit(2).
pid_t fork_plain(bool use_exit) {
  pid_t c = fork();
  if (c == 0) {
    volatile long s = 0;
    for (long k = 0; k < 100000; ++k) s = s + k;
    if (use_exit) std::exit(0);
    _exit(0);
  }
  return c;
}

bool wait_ok(pid_t c) {
  int st = 0;
  return c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

const char* trace_path() {
  auto fn = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "gpuheap_trace_path"));
  const char* p = fn ? fn() : nullptr;
  return p ? p : "(none)";
}

std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

int late(const char* dir, std::uint64_t start_ns) {
  bool ok = wait_ok(spawn_none());
  ok = wait_ok(fork_plain(true)) && ok;
  struct stat st {};
  std::string mine = std::string(dir) + "/t." + std::to_string(getpid()) + ".trace";
  std::printf("file_before=%d\n", stat(mine.c_str(), &st) == 0 ? 1 : 0);
  std::printf("path_before=%s\n", trace_path());
  std::printf("start_ns=%llu\n", static_cast<unsigned long long>(start_ns));
  std::fflush(stdout);
  // Four threads; the third makes the process's first CUDA call, the others follow it.
  std::vector<std::thread> ts;
  std::atomic<int> turn{0}, failures{0};
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([t, &turn, &failures] {
      while (t != 2 && turn.load() == 0) std::this_thread::yield();
      for (int i = 0; i < 50; ++i) {
        void* p = nullptr;
        if (cudaMalloc(&p, 1024u * static_cast<unsigned>(t + 1)) != cudaSuccess || cudaFree(p) != cudaSuccess)
          failures.fetch_add(1);
        if (t == 2 && i == 0) turn.store(1);
      }
    });
  }
  for (auto& th : ts) th.join();
  void* keep = nullptr;  // one live allocation at exit: the summary reports it
  if (cudaMalloc(&keep, 4096) != cudaSuccess) failures.fetch_add(1);
  std::printf("path_after=%s\n", trace_path());
  std::printf("failures=%d\n", failures.load());
  return ok && failures.load() == 0 ? 0 : 1;
}

// Entries `gpuheap run` must not name: a file that does not exist, one without events.
int bad_list(const std::string& dir) {
  const char* list = std::getenv("GPUHEAP_PATH_FILE");
  if (!list) return 3;
  static const unsigned char kHeader[16] = {'G', 'P', 'U', 'H', 'E', 'A', 'P', 0, 1, 0, 0, 0, 0, 0, 0, 0};
  int fd = open((dir + "/empty.trace").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, kHeader, sizeof kHeader) != static_cast<ssize_t>(sizeof kHeader)) return 4;
  close(fd);
  std::string lines = dir + "/gone.trace\n" + dir + "/empty.trace\n";
  fd = open(list, O_WRONLY | O_APPEND);
  if (fd < 0 || write(fd, lines.data(), lines.size()) != static_cast<ssize_t>(lines.size())) return 5;
  close(fd);
  void* p = nullptr;
  return cudaMalloc(&p, 4096) == cudaSuccess && cudaFree(p) == cudaSuccess ? 0 : 6;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t start_ns = mono_ns();
  const char* mode = argc > 1 ? argv[1] : "none";
  if (std::strcmp(mode, "none") == 0) {
    std::printf("none pid=%d\n", static_cast<int>(getpid()));
    return 0;
  }
  if (std::strcmp(mode, "exec") == 0) {
    std::string exe = self_exe();
    execl(exe.c_str(), exe.c_str(), "none", static_cast<char*>(nullptr));
    return 127;
  }
  if (std::strcmp(mode, "spawn") == 0) {
    int n = argc > 2 ? std::atoi(argv[2]) : 4;
    std::vector<pid_t> kids;
    for (int i = 0; i < n; ++i) kids.push_back(spawn_none());
    kids.push_back(fork_plain(true));
    kids.push_back(fork_plain(false));
    bool ok = true;
    for (pid_t c : kids) ok = wait_ok(c) && ok;
    return ok ? 0 : 1;
  }
  if (std::strcmp(mode, "parent_cuda") == 0) {
    void* p = nullptr;
    if (cudaMalloc(&p, 4096) != cudaSuccess) return 10;
    bool ok = wait_ok(spawn_none());
    ok = wait_ok(fork_plain(true)) && ok;
    if (cudaFree(p) != cudaSuccess) return 11;
    return ok ? 0 : 1;
  }
  if (std::strcmp(mode, "cuda") == 0) {
    void* p = nullptr;
    return cudaMalloc(&p, 4096) == cudaSuccess && cudaFree(p) == cudaSuccess ? 0 : 10;
  }
  if (std::strcmp(mode, "chdir_child") == 0 && argc > 2) {
    pid_t c = fork();
    if (c == 0) {
      void* p = nullptr;
      std::exit(chdir(argv[2]) == 0 && cudaMalloc(&p, 4096) == cudaSuccess && cudaFree(p) == cudaSuccess ? 0 : 12);
    }
    return wait_ok(c) ? 0 : 1;
  }
  if (std::strcmp(mode, "late") == 0 && argc > 2) return late(argv[2], start_ns);
  if (std::strcmp(mode, "bad_list") == 0 && argc > 2) return bad_list(argv[2]);
  return 2;
}
