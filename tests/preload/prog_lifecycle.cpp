// Process-lifecycle scenarios for the preload tests.
//   prog_lifecycle live      exit(0) with three live allocations
//   prog_lifecycle fork      allocate, fork a child that never touches CUDA, wait
//   prog_lifecycle busy      allocate/free forever (the test SIGKILLs it); prints "ready"
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

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
  return 2;
}
