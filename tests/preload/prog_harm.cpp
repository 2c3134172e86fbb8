// The job's descriptors and disk (test_reliability.cpp, issue 33). Every mode prints its
// findings as "key=value" lines (on stdout, or into DIR/result when stdio is closed).
//   prog_harm closefds DIR KIB N   cudaMalloc/cudaFree, then closes fds 3..1023 (what daemon
//                                  libraries and closerange do), opens DIR/user.0..7 and writes
//                                  KIB KiB of a known pattern into each, then makes N more
//                                  cudaMalloc/cudaFree pairs (the trace crosses window
//                                  boundaries), then forks: the child rewrites each file's
//                                  first block through its fd (same bytes) and exits 0 only
//                                  if every write worked. Prints child=ok|failed, fds=...;
//                                  the files stay open to the end (exit closes the trace).
//                                  With a 5th argument "unlink", the trace file is unlinked
//                                  first: gpuheap cannot reopen it and must stop tracing.
//   prog_harm stdio DIR            started with fds 0, 1 and 2 closed: opens DIR/user.0..2
//                                  (fds 0..2 natively), writes "user K\n" into each, then
//                                  cudaMalloc/cudaFree (the first event creates the trace),
//                                  closes user.2 and writes "program stderr\n" to fd 2
//                                  (closed natively: EBADF), 10 more pairs. DIR/result gets
//                                  "fds=A,B,C stderr_write=RC/ERRNO".
//   prog_harm disk DIR MIB         one cudaMalloc/cudaFree, waits 100 ms (the background
//                                  thread prepares the next window), prints the trace's
//                                  allocated bytes (trace_alloc=, st_blocks * 512), then
//                                  writes an MIB MiB checkpoint to DIR/ckpt and fsyncs it:
//                                  ckpt=ok, or ckpt=failed errno=E (exit status 1).
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

bool pairs(long n) {
  for (long i = 0; i < n; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, 256 + 16 * static_cast<std::size_t>(i % 64)) != cudaSuccess) return false;
    if (cudaFree(p) != cudaSuccess) return false;
  }
  return true;
}

// Byte `at` of user file k: changes every byte and with the file, so a block of trace
// records, a zero tail or a shifted copy never matches.
unsigned char pattern(int k, std::size_t at) {
  return static_cast<unsigned char>((at * 7 + at / 4096 + k * 31) & 0xff);
}

bool write_all(int fd, const unsigned char* p, std::size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w, n -= static_cast<std::size_t>(w);
  }
  return true;
}

int closefds(const std::string& dir, long kib, long n, bool unlink_trace) {
  if (!pairs(1)) return 3;
  if (unlink_trace) {
    auto fn = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "gpuheap_trace_path"));
    const char* trace = fn ? fn() : nullptr;
    if (trace && *trace) unlink(trace);
  }
  for (int fd = 3; fd < 1024; ++fd) close(fd);
  constexpr int kFiles = 8;
  int fds[kFiles];
  std::vector<unsigned char> buf(static_cast<std::size_t>(kib) << 10);
  for (int k = 0; k < kFiles; ++k) {
    std::string path = dir + "/user." + std::to_string(k);
    fds[k] = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fds[k] < 0) return 4;
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = pattern(k, i);
    if (!write_all(fds[k], buf.data(), buf.size())) return 5;
  }
  std::printf("fds=");
  for (int k = 0; k < kFiles; ++k) std::printf("%d%s", fds[k], k + 1 < kFiles ? "," : "\n");
  if (!pairs(n)) return 6;
  std::fflush(stdout);
  pid_t c = fork();
  if (c == 0) {
    bool ok = true;
    for (int k = 0; k < kFiles; ++k) {
      unsigned char first[4096];
      for (std::size_t i = 0; i < sizeof first; ++i) first[i] = pattern(k, i);
      ok &= pwrite(fds[k], first, sizeof first, 0) == static_cast<ssize_t>(sizeof first);
    }
    _exit(ok ? 0 : 1);
  }
  int st = 0;
  bool child_ok = c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  std::printf("child=%s\n", child_ok ? "ok" : "failed");
  if (!pairs(100)) return 7;  // after the fork too
  std::printf("done\n");
  return 0;
}

int stdio(const std::string& dir) {
  int fds[3];
  for (int k = 0; k < 3; ++k) {
    std::string path = dir + "/user." + std::to_string(k);
    fds[k] = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    std::string line = "user " + std::to_string(k) + "\n";
    if (fds[k] < 0 || !write_all(fds[k], reinterpret_cast<const unsigned char*>(line.data()), line.size())) return 4;
  }
  if (!pairs(1)) return 3;
  close(fds[2]);
  errno = 0;
  ssize_t rc = write(2, "program stderr\n", 15);
  int err = errno;
  if (!pairs(10)) return 5;
  std::string res = "fds=" + std::to_string(fds[0]) + "," + std::to_string(fds[1]) + "," + std::to_string(fds[2]) +
                    " stderr_write=" + std::to_string(rc) + "/" + std::to_string(rc < 0 ? err : 0) + "\n";
  int out = open((dir + "/result").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (out < 0 || !write_all(out, reinterpret_cast<const unsigned char*>(res.data()), res.size())) return 6;
  close(out);
  return 0;
}

int disk(const std::string& dir, long mib) {
  if (!pairs(1)) return 3;
  timespec ms100{0, 100'000'000};
  nanosleep(&ms100, nullptr);
  auto fn = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "gpuheap_trace_path"));
  const char* trace = fn ? fn() : nullptr;
  struct stat st {};
  if (trace && *trace && stat(trace, &st) == 0)
    std::printf("trace_alloc=%lld trace_size=%lld\n", static_cast<long long>(st.st_blocks) * 512,
                static_cast<long long>(st.st_size));
  else std::printf("trace_alloc=none\n");
  std::fflush(stdout);
  int fd = open((dir + "/ckpt").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  std::vector<unsigned char> block(1 << 20, 0x5a);
  bool ok = fd >= 0;
  for (long i = 0; ok && i < mib; ++i) ok = write_all(fd, block.data(), block.size());
  ok = ok && fsync(fd) == 0;
  int err = errno;
  if (fd >= 0) close(fd);
  if (ok) std::printf("ckpt=ok\n");
  else std::printf("ckpt=failed errno=%d\n", err);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  std::string dir = argc > 2 ? argv[2] : ".";
  if (mode == "closefds" && argc > 4)
    return closefds(dir, std::atol(argv[3]), std::atol(argv[4]), argc > 5 && std::strcmp(argv[5], "unlink") == 0);
  if (mode == "stdio") return stdio(dir);
  if (mode == "disk" && argc > 3) return disk(dir, std::atol(argv[3]));
  std::fprintf(stderr, "usage: prog_harm closefds DIR KIB N | stdio DIR | disk DIR MIB\n");
  return 2;
}
