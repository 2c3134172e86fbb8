// Fork scenarios for the reliability tests.
//   prog_fork child_cuda        parent initialises CUDA and allocates, then forks a child that
//                               calls cudaMalloc/cudaFree; both print what CUDA answered
//   prog_fork child_cuda_fresh  the same, but the parent forks before touching CUDA (a
//                               fork-based worker pool started first)
//   prog_fork loader N EXIT     parent allocates, then forks N DataLoader-style children one
//                               after another that never touch CUDA (a little CPU work, then
//                               exit(0) if EXIT is "exit", else _exit(0)); prints the median
//                               and minimum fork+exit+wait time in microseconds
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) / 1e3;
}

int child_uses_cuda(const char* who) {
  void* p = nullptr;
  int rc = cudaMalloc(&p, 4096);
  int rc2 = rc == cudaSuccess ? cudaFree(p) : -1;
  std::printf("%s malloc=%d free=%d\n", who, rc, rc2);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "child_cuda";
  if (std::strcmp(mode, "child_cuda_fresh") == 0) {
    pid_t c = fork();
    if (c == 0) _exit(child_uses_cuda("child"));
    int st = 0;
    waitpid(c, &st, 0);
    child_uses_cuda("parent");
    return WIFEXITED(st) ? WEXITSTATUS(st) : 20;
  }
  void* keep = nullptr;
  if (cudaMalloc(&keep, 4096) != cudaSuccess) return 10;
  if (std::strcmp(mode, "child_cuda") == 0) {
    pid_t c = fork();
    if (c == 0) {
      child_uses_cuda("child");
      std::exit(0);
    }
    int st = 0;
    waitpid(c, &st, 0);
    child_uses_cuda("parent");
    cudaFree(keep);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 20;
  }
  if (std::strcmp(mode, "loader") == 0) {
    int n = argc > 2 ? std::atoi(argv[2]) : 100;
    bool use_exit = argc > 3 && std::strcmp(argv[3], "exit") == 0;
    std::vector<double> us;
    for (int i = 0; i < n; ++i) {
      double t0 = now_us();
      pid_t c = fork();
      if (c == 0) {
        volatile long s = 0;
        for (long k = 0; k < 10000; ++k) s = s + k;
        if (use_exit) std::exit(0);
        _exit(0);
      }
      int st = 0;
      waitpid(c, &st, 0);
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 21;
      us.push_back(now_us() - t0);
    }
    // Median and minimum: robust against other load on a shared 2-core machine.
    std::sort(us.begin(), us.end());
    std::printf("fork_exit_us=%.1f min_us=%.1f\n", us[us.size() / 2], us[0]);
    cudaFree(keep);
    return 0;
  }
  return 2;
}
