// A model's allocations, built twice by tests/golden/CMakeLists.txt: as is (orig/diff_prog) and
// with one line inserted at the EDIT mark (edited/diff_prog), so every site below the mark is
// at the next line: `diff` and `check --baseline` across an
// edit (test_golden_diff.cpp).
//   diff_prog         32 MiB of weights, then 16 MiB of activations; all freed at the end
//   diff_prog grow    and a 7 MiB scratch buffer beside them
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// EDIT

// Each site allocates in its own function, which names it (docs/cli.md, Site labels).
__attribute__((noinline)) void* make_weights() {
  void* p = nullptr;
  return cudaMalloc(&p, 32 * MiB) == cudaSuccess ? p : nullptr;
}

__attribute__((noinline)) void* make_activations() {
  void* p = nullptr;
  return cudaMalloc(&p, 16 * MiB) == cudaSuccess ? p : nullptr;
}

__attribute__((noinline)) void* make_scratch() {
  void* p = nullptr;
  return cudaMalloc(&p, 7 * MiB) == cudaSuccess ? p : nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const bool grow = argc > 1 && !std::strcmp(argv[1], "grow");
  void* w = make_weights();
  void* a = make_activations();
  void* s = grow ? make_scratch() : nullptr;
  cudaFree(s);
  cudaFree(a);
  cudaFree(w);
  return 0;
}
