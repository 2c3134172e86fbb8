// Post-mortem symbolization (test_post_mortem.cpp): a named function and an inlined helper
// allocate, so that the trace's frames have a function, a file:line and an inline chain.
// The test copies this binary elsewhere, runs it, stores its frames in the trace, then
// removes the binary and checks that the names are still there.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>

static inline __attribute__((always_inline)) void* grab(std::size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n) != cudaSuccess) return nullptr;  // SYMBOLS_GRAB_LINE
  return p;
}

__attribute__((noinline)) void* alloc_weights(std::size_t n) { return grab(n); }

int main() {
  void* w = alloc_weights(8u << 20);  // kept to the end: a leak with a name
  void* t = grab(1u << 20);
  if (w == nullptr || t == nullptr) return 1;
  cudaFree(t);
  std::printf("prog_symbols: ok\n");
  return 0;
}
