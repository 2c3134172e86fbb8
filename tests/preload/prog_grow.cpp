// A job whose memory grows step by step, for `gpuheap top` (test_top.cpp): STEPS steps, each a
// "step" range (gpuheap_push, found with dlsym) that keeps one more allocation of
// (step number) MiB, then sleeps MS milliseconds. `hang` after the steps: waits to be killed
// (the test kills it: a trace without an end record). Prints each step on stdout.
//   prog_grow STEPS MS [hang]
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/preload/prog_expect.h"

int main(int argc, char** argv) {
  EXPECT(argc >= 3);
  const int steps = std::atoi(argv[1]), ms = std::atoi(argv[2]);
  const bool hang = argc > 3 && std::strcmp(argv[3], "hang") == 0;
  auto* push = reinterpret_cast<void (*)(const char*)>(dlsym(RTLD_DEFAULT, "gpuheap_push"));
  auto* pop = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "gpuheap_pop"));
  EXPECT(push && pop);
  for (int i = 1; i <= steps; ++i) {
    push("step");
    void* p = nullptr;
    EXPECT(cudaMalloc(&p, static_cast<std::size_t>(i) << 20) == cudaSuccess);
    void* tmp = nullptr;  // a temporary, freed within the step
    EXPECT(cudaMalloc(&tmp, 4096) == cudaSuccess && cudaFree(tmp) == cudaSuccess);
    pop();
    std::printf("step %d\n", i);
    std::fflush(stdout);
    ::usleep(static_cast<useconds_t>(ms) * 1000);
  }
  while (hang) ::pause();
  return 0;
}
