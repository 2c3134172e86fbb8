// Allocation sites under an allocator's frames (test_labels_cli.cpp): user_model_forward
// allocates through at::detail::empty_cuda -> c10::cuda::CUDACachingAllocator::allocate
// (liblabels' stand-ins, in libtorch_labels_test.so), direct_workspace calls cudaMalloc itself.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdio>

namespace c10::cuda::CUDACachingAllocator {
void* allocate(std::size_t n);
void raw_delete(void* p);
}  // namespace c10::cuda::CUDACachingAllocator
namespace at::detail {
void* empty_cuda(std::size_t n);
}  // namespace at::detail

__attribute__((noinline)) void* user_model_forward(std::size_t n) {
  void* p = at::detail::empty_cuda(n);  // LABELS_FORWARD_LINE
  asm volatile("" ::: "memory");
  return p;
}

__attribute__((noinline)) void* direct_workspace(std::size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n) != cudaSuccess) return nullptr;
  asm volatile("" ::: "memory");
  return p;
}

int main() {
  void* weights = user_model_forward(8u << 20);  // kept to the end: the top leak
  for (int i = 0; i < 3; ++i) c10::cuda::CUDACachingAllocator::raw_delete(user_model_forward(1u << 20));
  void* ws = direct_workspace(2u << 20);
  if (weights == nullptr || ws == nullptr) return 1;
  cudaFree(ws);
  std::printf("prog_labels: ok\n");
  return 0;
}
