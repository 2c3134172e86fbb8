// For test_pystacks.cpp: lets a Python script (through ctypes) start a thread the Python
// runtime never sees, which allocates device memory: its stack must stay native.
#include <cuda_runtime_api.h>
#include <pthread.h>

#include <cstddef>

namespace {
void* native_worker(void* arg) {
  void* p = nullptr;
  bool ok = cudaMalloc(&p, *static_cast<std::size_t*>(arg)) == cudaSuccess;  // kept: a leak
  return ok ? p : nullptr;
}
}  // namespace

extern "C" __attribute__((visibility("default"))) int py_native_thread_alloc(std::size_t bytes) {
  pthread_t t;
  if (pthread_create(&t, nullptr, native_worker, &bytes) != 0) return 1;
  void* p = nullptr;
  pthread_join(t, &p);
  return p ? 0 : 2;
}
