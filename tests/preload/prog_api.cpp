// Calls every interposed runtime function by symbol, plus the driver through
// cudaGetDriverEntryPoint(ByVersion). Exits non-zero (with a message) when a call does not
// behave as the CUDA documentation says, so a wrapper that changes behaviour fails the test.
// The test (Preload.RuntimeApiBySymbol in test_preload.cpp) then checks the events in its trace.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/preload/prog_expect.h"

#define CHECK(x) \
  do { \
    cudaError_t rc_ = (x); \
    if (rc_ != cudaSuccess) { \
      std::fprintf(stderr, "prog_api: %s -> %d at line %d\n", #x, rc_, __LINE__); \
      return 10; \
    } \
  } while (0)

int main() {
  CHECK(cudaFree(nullptr));  // context-init idiom: passes straight through
  void* a = nullptr;
  CHECK(cudaMalloc(&a, 1000));
  EXPECT(a != nullptr && reinterpret_cast<std::uintptr_t>(a) % 512 == 0);
  CHECK(cudaMemset(a, 0x11, 1000));
  cudaPointerAttributes attr{};
  CHECK(cudaPointerGetAttributes(&attr, static_cast<char*>(a) + 100));
  EXPECT(attr.type == cudaMemoryTypeDevice && attr.device == 0);
  void* big = nullptr;
  CHECK(cudaMalloc(&big, 3u << 20));
  CHECK(cudaFree(a));
  CHECK(cudaFree(big));

  // A second free of the same pointer: what the runtime answers for an invalid pointer.
  EXPECT(cudaFree(a) == cudaErrorInvalidValue);
  // A pointer gpuheap never saw (a host address) goes to the real free, which rejects it.
  int local = 0;
  EXPECT(cudaFree(&local) != cudaSuccess);
  cudaGetLastError();

  std::size_t free_b = 0, total_b = 0;
  CHECK(cudaMemGetInfo(&free_b, &total_b));
  EXPECT(free_b <= total_b && total_b > 0);
  if (const char* expect_cached = std::getenv("PROG_API_EXPECT_CACHED")) {
    // With the pool on, the freed blocks are cached and reported as free: the simulated
    // driver charges the 2 MiB + 20 MiB segments, cudaMemGetInfo must add them back.
    using used_fn = std::size_t (*)(int);
    auto used = reinterpret_cast<used_fn>(dlsym(RTLD_DEFAULT, "simcuda_used_bytes"));
    EXPECT(used != nullptr);
    std::size_t cached = std::strtoull(expect_cached, nullptr, 10);
    EXPECT(free_b == total_b - used(0) + cached);
  }

  cudaStream_t s1, s2, s3;
  CHECK(cudaStreamCreate(&s1));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithPriority(&s3, cudaStreamNonBlocking, 0));

  void* as = nullptr;
  CHECK(cudaMallocAsync(&as, 4096, s1));
  CHECK(cudaFreeAsync(as, s1));
  cudaMemPool_t mp;
  CHECK(cudaDeviceGetDefaultMemPool(&mp, 0));
  void* ap = nullptr;
  CHECK(cudaMallocFromPoolAsync(&ap, 8192, mp, s2));
  CHECK(cudaFreeAsync(ap, s2));
  CHECK(cudaStreamSynchronize(s1));
  CHECK(cudaStreamSynchronize(s2));

  void* m = nullptr;
  CHECK(cudaMallocManaged(&m, 5000, cudaMemAttachGlobal));
  CHECK(cudaFree(m));
  void* h1 = nullptr;
  CHECK(cudaMallocHost(&h1, 6000));
  std::memset(h1, 1, 6000);
  CHECK(cudaFreeHost(h1));
  void* h2 = nullptr;
  CHECK(cudaHostAlloc(&h2, 7000, cudaHostAllocDefault));
  CHECK(cudaFreeHost(h2));
  void* pitched = nullptr;
  std::size_t pitch = 0;
  CHECK(cudaMallocPitch(&pitched, &pitch, 100, 10));
  EXPECT(pitch >= 100);
  CHECK(cudaFree(pitched));
  cudaPitchedPtr pp{};
  CHECK(cudaMalloc3D(&pp, cudaExtent{100, 10, 2}));
  CHECK(cudaFree(pp.ptr));

  // Driver functions handed out by the runtime: our wrappers, recorded like direct calls.
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CHECK(cudaGetDriverEntryPoint("cuMemAlloc", &fn, cudaEnableDefault, &q));
  EXPECT(q == cudaDriverEntryPointSuccess && fn != nullptr);
  auto mem_alloc = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(fn);
  CHECK(cudaGetDriverEntryPointByVersion("cuMemFree", &fn, 12000, cudaEnableDefault, &q));
  auto mem_free = reinterpret_cast<CUresult (*)(CUdeviceptr)>(fn);
  CUdeviceptr d = 0;
  EXPECT(mem_alloc(&d, 2u << 20) == CUDA_SUCCESS);  // 2 MiB: large pool
  EXPECT(mem_free(d) == CUDA_SUCCESS);

  CHECK(cudaStreamDestroy(s1));
  CHECK(cudaStreamDestroy(s2));
  CHECK(cudaStreamDestroy(s3));
  CHECK(cudaDeviceSynchronize());
  std::printf("prog_api: ok\n");
  return 0;
}
