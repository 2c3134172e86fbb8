// A stand-in for PyTorch's allocator (test_labels_cli.cpp): functions named as
// c10's caching allocator and ATen's tensor factory, in a library named like libtorch's, so
// that the analyzer labels their sites by the program's frame below them (analyzer/symbolize/labels.h).
#include <cuda_runtime_api.h>

#include <cstddef>

namespace c10 {
namespace cuda {
namespace CUDACachingAllocator {
__attribute__((noinline, visibility("default"))) void* allocate(std::size_t n) {
  void* p = nullptr;
  if (cudaMalloc(&p, n) != cudaSuccess) return nullptr;
  return p;
}
__attribute__((noinline, visibility("default"))) void raw_delete(void* p) { cudaFree(p); }
}  // namespace CUDACachingAllocator
}  // namespace cuda
}  // namespace c10

namespace at {
namespace detail {
__attribute__((noinline, visibility("default"))) void* empty_cuda(std::size_t n) {
  void* p = c10::cuda::CUDACachingAllocator::allocate(n);
  asm volatile("" ::: "memory");  // no tail call: the frame stays in the stack
  return p;
}
}  // namespace detail
}  // namespace at
