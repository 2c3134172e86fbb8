// Process-lifecycle scenarios for the preload tests.
//   prog_lifecycle live      exit(0) with three live allocations
//   prog_lifecycle fork      allocate, fork a child that never touches CUDA, wait
//   prog_lifecycle busy      allocate/free forever (the test SIGKILLs it); prints "ready"
// Ends that are not exit() (issue 33), each after the three allocations:
//   prog_lifecycle _exit     _exit(3)            prog_lifecycle _Exit   _Exit(3)
//   prog_lifecycle signal_exit   a SIGUSR1 handler calls _exit(4); raise(SIGUSR1)
//   prog_lifecycle exec=FORM     exec /bin/true by FORM (l lp le v vp ve vpe f): status 0
//   prog_lifecycle exec_fail=FORM   exec a missing file by FORM (l lp le v vp ve vpe f: an
//                            fd of /dev/null), which fails; prints "exec failed: ENOENT" (or the
//                            errno's number), then 100 more allocation/free pairs, frees all,
//                            returns 0
//   prog_lifecycle exec_fail_threads   4 threads make 20000 allocation/free pairs each while
//                            the main thread tries 50 execs of a missing file; prints
//                            "failed execs: 50", returns 0
//   prog_lifecycle vfork     a vfork child _exit(0)s, another execs /bin/true, a third fails
//                            to exec and _exit(9)s; then 100 more pairs in the parent, return 0
//   prog_lifecycle sleep DIR [default]   writes its pid to DIR/ready, sleeps up to 20 s;
//                            SIGTERM (its own handler) writes DIR/got-TERM and exits 0;
//                            SIGINT handler counts, and 300 ms after the first writes
//                            DIR/ints=N, exits 0. With "default": no handlers of its own
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

// exec FORM of PATH (a name without '/' for the searching forms), argv {"true"}.
int exec_by(const char* form, const char* path) {
  char* argv[] = {const_cast<char*>("true"), nullptr};
  std::string f = form;
  if (f == "l") return execl(path, "true", static_cast<char*>(nullptr));
  if (f == "lp") return execlp(path, "true", static_cast<char*>(nullptr));
  if (f == "le") return execle(path, "true", static_cast<char*>(nullptr), environ);
  if (f == "v") return execv(path, argv);
  if (f == "vp") return execvp(path, argv);
  if (f == "ve") return execve(path, argv, environ);
  if (f == "vpe") return execvpe(path, argv, environ);
  if (f == "f") {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fd = open("/dev/null", O_RDONLY | O_CLOEXEC);  // not executable: ENOEXEC/EACCES
    return fexecve(fd, argv, environ);
  }
  return -2;
}

void pairs(int n) {
  for (int i = 0; i < n; ++i) {
    void* q = nullptr;
    if (cudaMalloc(&q, 4096) != cudaSuccess) _exit(11);
    cudaFree(q);
  }
}

const char* g_dir = ".";
volatile sig_atomic_t g_ints = 0;
char g_term_path[4096];

void touch(const std::string& name, const std::string& text = "") {
  std::string p = std::string(g_dir) + "/" + name;
  int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0 && write(fd, text.data(), text.size()) < 0) {
  }
  if (fd >= 0) close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "live";
  void* p[3] = {};
  for (int i = 0; i < 3; ++i)
    if (cudaMalloc(&p[i], 1000u * static_cast<unsigned>(i + 1)) != cudaSuccess) return 10;
  if (std::strcmp(mode, "live") == 0) std::exit(0);
  if (std::strcmp(mode, "fork") == 0) {
    pid_t child = fork();
    if (child == 0) {
      // DataLoader-style worker: CPU work only, then _exit.
      volatile long s = 0;
      for (long i = 0; i < 1000000; ++i) s += i;
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    for (void* q : p) cudaFree(q);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 20;
  }
  if (std::strcmp(mode, "busy") == 0) {
    for (long i = 0;; ++i) {
      void* q = nullptr;
      if (cudaMalloc(&q, 4096) != cudaSuccess) return 10;
      cudaFree(q);
      if (i == 1000) {
        std::printf("ready\n");
        std::fflush(stdout);
      }
    }
  }
  if (std::strcmp(mode, "_exit") == 0) _exit(3);
  if (std::strcmp(mode, "_Exit") == 0) _Exit(3);
  if (std::strcmp(mode, "signal_exit") == 0) {
    signal(SIGUSR1, [](int) { _exit(4); });
    raise(SIGUSR1);
    return 12;
  }
  if (std::strncmp(mode, "exec=", 5) == 0) {
    const char* form = mode + 5;
    bool search = std::strchr(form, 'p') != nullptr;
    exec_by(form, search ? "true" : "/bin/true");
    return 13;
  }
  if (std::strncmp(mode, "exec_fail=", 10) == 0) {
    const char* form = mode + 10;
    bool search = std::strchr(form, 'p') != nullptr;
    int rc = exec_by(form, search ? "gpuheap-no-such-program" : "/nonexistent/gpuheap-no-such-program");
    int err = errno;
    if (rc != -1) return 14;
    if (err == ENOENT) std::printf("exec failed: ENOENT\n");
    else std::printf("exec failed: %d\n", err);
    pairs(100);
    for (void* q : p) cudaFree(q);
    return 0;
  }
  if (std::strcmp(mode, "exec_fail_threads") == 0) {
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) ts.emplace_back([] { pairs(20000); });
    int failed = 0;
    for (int k = 0; k < 50; ++k) {
      char* args[] = {const_cast<char*>("x"), nullptr};
      failed += execv("/nonexistent/gpuheap-no-such-program", args) == -1 && errno == ENOENT;
      usleep(1000);
    }
    for (auto& t : ts) t.join();
    std::printf("failed execs: %d\n", failed);
    for (void* q : p) cudaFree(q);
    return 0;
  }
  if (std::strcmp(mode, "vfork") == 0) {
    int bad = 0;
    for (int k = 0; k < 3; ++k) {
      pid_t c = vfork();
      if (c == 0) {
        if (k == 1) execl("/bin/true", "true", static_cast<char*>(nullptr));
        if (k == 2) execl("/nonexistent/gpuheap-no-such-program", "x", static_cast<char*>(nullptr));
        _exit(k == 2 ? 9 : 0);
      }
      int st = 0;
      waitpid(c, &st, 0);
      bad += !WIFEXITED(st) || WEXITSTATUS(st) != (k == 2 ? 9 : 0);
    }
    pairs(100);
    for (void* q : p) cudaFree(q);
    return bad ? 15 : 0;
  }
  if (std::strcmp(mode, "sleep") == 0) {
    g_dir = argc > 2 ? argv[2] : ".";
    std::snprintf(g_term_path, sizeof g_term_path, "%s/got-TERM", g_dir);
    if (argc < 4 || std::strcmp(argv[3], "default") != 0) {
      signal(SIGTERM, [](int) {  // open, close and _exit only: async-signal-safe
        int fd = open(g_term_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd >= 0) close(fd);
        _exit(0);
      });
      signal(SIGINT, [](int) { g_ints = g_ints + 1; });
    }
    touch("ready.tmp", std::to_string(getpid()));
    std::rename((std::string(g_dir) + "/ready.tmp").c_str(), (std::string(g_dir) + "/ready").c_str());
    for (int i = 0; i < 2000; ++i) {
      usleep(10000);
      if (g_ints) {
        usleep(300000);
        touch("ints=" + std::to_string(static_cast<int>(g_ints)));
        return 0;
      }
    }
    return 0;
  }
  return 2;
}
