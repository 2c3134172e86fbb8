// Allocation patterns with known numbers, run under the preload on simcuda by test_golden.cpp.
// Each mode prints "line NAME N" for the source line of every allocation site the test names
// (the __LINE__ of the call, on the same line), so file:line expectations follow this file.
// clang-format is off from the includes on: it would move each call to a line of its own.
//   golden_prog pooled   3 x 1000 B + 3 MiB, free one 1000 B, then 2000 B; free all
//   golden_prog kinds    async, managed, host pinned and VMM allocations
//   golden_prog sites    temporaries, many small allocations, one peak allocation, a leak
//   golden_prog frag     under GPUHEAP_LIMIT=40MiB: fragmentation OOM, then a cap OOM
//   golden_prog real     under SIMCUDA_TOTAL_MEMORY=32M: an OOM the live data really causes
//   golden_prog churn    20,000 random-size (fixed seed) allocs/frees, then 7 leaks of k x 2 MiB
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

// clang-format off
#define CHECK(c)                                                                  \
  do {                                                                            \
    if (!(c)) {                                                                   \
      std::fprintf(stderr, "golden_prog: %s failed at line %d\n", #c, __LINE__);  \
      return 11;                                                                  \
    }                                                                             \
  } while (0)

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

void line(const char* name, int n) { std::printf("line %s %d\n", name, n); }

// Every freed block becomes reusable at the next allocation: GPUHEAP_SEAL_US=0 fences each
// free at once and the synchronize completes the fence before the pool looks at it.
int pooled() {
  void* a[3] = {};
  for (auto& p : a) CHECK(cudaMalloc(&p, 1000) == cudaSuccess);
  void* b = nullptr;
  CHECK(cudaMalloc(&b, 3 * MiB) == cudaSuccess);
  CHECK(cudaFree(a[1]) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  void* d = nullptr;
  CHECK(cudaMalloc(&d, 2000) == cudaSuccess);
  CHECK(cudaFree(b) == cudaSuccess);
  CHECK(cudaFree(a[0]) == cudaSuccess);
  CHECK(cudaFree(a[2]) == cudaSuccess);
  CHECK(cudaFree(d) == cudaSuccess);
  return 0;
}

template <class F>
F driver(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q) != cudaSuccess) return nullptr;
  return reinterpret_cast<F>(fn);
}

int kinds() {
  cudaStream_t s;
  CHECK(cudaStreamCreate(&s) == cudaSuccess);
  void *as1 = nullptr, *as2 = nullptr;
  CHECK(cudaMallocAsync(&as1, 4096, s) == cudaSuccess);
  CHECK(cudaMallocAsync(&as2, 8192, s) == cudaSuccess);
  CHECK(cudaFreeAsync(as1, s) == cudaSuccess);  // as2 stays: current 8192
  CHECK(cudaStreamSynchronize(s) == cudaSuccess);
  void* m = nullptr;
  CHECK(cudaMallocManaged(&m, 5000, cudaMemAttachGlobal) == cudaSuccess);
  CHECK(cudaFree(m) == cudaSuccess);
  void* h = nullptr;
  CHECK(cudaMallocHost(&h, 6000) == cudaSuccess);  // stays
  auto create = driver<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                                    unsigned long long)>("cuMemCreate");
  auto reserve = driver<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(
      "cuMemAddressReserve");
  auto map = driver<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>(
      "cuMemMap");
  auto unmap = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
  auto addr_free = driver<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
  auto release = driver<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease");
  CHECK(create && reserve && map && unmap && addr_free && release);
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  CUmemGenericAllocationHandle h1, h2;
  CHECK(create(&h1, 2 * MiB, &prop, 0) == CUDA_SUCCESS);
  CHECK(create(&h2, 4 * MiB, &prop, 0) == CUDA_SUCCESS);
  CUdeviceptr va = 0;
  CHECK(reserve(&va, 8 * MiB, 0, 0, 0) == CUDA_SUCCESS);
  CHECK(map(va, 2 * MiB, 0, h1, 0) == CUDA_SUCCESS);
  CHECK(map(va + 2 * MiB, 4 * MiB, 0, h2, 0) == CUDA_SUCCESS);
  CHECK(unmap(va + 2 * MiB, 4 * MiB) == CUDA_SUCCESS);
  CHECK(release(h2) == CUDA_SUCCESS);  // left: h1 (2 MiB) mapped, va reserved
  CHECK(cudaStreamDestroy(s) == cudaSuccess);
  return 0;
}

// One call site per function (noinline, -O0): each is one site in the reports.
__attribute__((noinline)) int make_temporaries() {
  for (int i = 0; i < 5; ++i) {
    void* p = nullptr;
    line("temporary", __LINE__); CHECK(cudaMalloc(&p, 4096) == cudaSuccess);
    CHECK(cudaFree(p) == cudaSuccess);
  }
  return 0;
}

__attribute__((noinline)) int many_small(void** out) {
  for (int i = 0; i < 7; ++i) {
    line("many", __LINE__); CHECK(cudaMalloc(&out[i], 512) == cudaSuccess);
  }
  return 0;
}

__attribute__((noinline)) int peak_function() {
  void* p = nullptr;
  line("peak", __LINE__); CHECK(cudaMalloc(&p, 12 * MiB) == cudaSuccess);
  CHECK(cudaFree(p) == cudaSuccess);
  return 0;
}

__attribute__((noinline)) int leaky_function() {
  for (int i = 0; i < 2; ++i) {
    void* p = nullptr;
    line("leak", __LINE__); CHECK(cudaMalloc(&p, 300000) == cudaSuccess);
  }
  return 0;
}

int sites() {
  void* small[7] = {};
  if (int rc = make_temporaries()) return rc;
  if (int rc = many_small(small)) return rc;
  if (int rc = peak_function()) return rc;
  for (auto* p : small) CHECK(cudaFree(p) == cudaSuccess);
  return leaky_function();
}

__attribute__((noinline)) int failing_request(std::size_t n, const char* name) {
  void* p = nullptr;
  line(name, __LINE__); cudaError_t rc = cudaMalloc(&p, n);
  CHECK(rc == cudaErrorMemoryAllocation);
  cudaGetLastError();
  return 0;
}

// 20 x 2 MiB fill two 20 MiB segments (the 40 MiB cap); every other block freed leaves
// 20 MiB cached in 2 MiB holes, so 4 MiB cannot be placed: fragmentation. Then 30 MiB (own
// segment) exceeds the cap while the device has room.
int frag() {
  void* b[20] = {};
  for (auto& p : b) CHECK(cudaMalloc(&p, 2 * MiB) == cudaSuccess);
  for (int i = 0; i < 20; i += 2) CHECK(cudaFree(b[i]) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  if (int rc = failing_request(4 * MiB, "oom_frag")) return rc;
  if (int rc = failing_request(30 * MiB, "oom_cap")) return rc;
  for (int i = 1; i < 20; i += 2) CHECK(cudaFree(b[i]) == cudaSuccess);
  return 0;
}

// A 32 MiB device: 16 MiB live (own segment), then 24 MiB cannot exist beside it.
int real() {
  void* p = nullptr;
  CHECK(cudaMalloc(&p, 16 * MiB) == cudaSuccess);
  if (int rc = failing_request(24 * MiB, "oom_real")) return rc;
  CHECK(cudaFree(p) == cudaSuccess);
  return 0;
}

// The same requests every run; which cached block serves each depends on when the pool's
// fences complete (the default seal timing), so block bytes differ from run to run while
// requested bytes must not. Leaks: 1+2+...+7 = 28 x 2 MiB = 58,720,256 bytes requested.
int churn() {
  std::uint64_t x = 0x9E3779B97F4A7C15ull;
  auto next = [&x] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return x;
  };
  void* live[64] = {};
  for (int i = 0; i < 20000; ++i) {
    auto& slot = live[next() % 64];
    if (slot) {
      CHECK(cudaFree(slot) == cudaSuccess);
      slot = nullptr;
    } else {
      // Mostly small, sometimes a few MiB: both pools, splits and reuse of larger blocks.
      std::size_t n = next() % 4 == 0 ? 1 + next() % (6 * MiB) : 1 + next() % (64 * 1024);
      CHECK(cudaMalloc(&slot, n) == cudaSuccess);
    }
  }
  for (auto& p : live)
    if (p) CHECK(cudaFree(p) == cudaSuccess);
  for (int k = 1; k <= 7; ++k) {
    void* p = nullptr;
    line("churn_leak", __LINE__); CHECK(cudaMalloc(&p, k * 2 * MiB) == cudaSuccess);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "pooled";
  CHECK(cudaFree(nullptr) == cudaSuccess);
  int rc = 2;
  if (!std::strcmp(mode, "pooled")) rc = pooled();
  else if (!std::strcmp(mode, "kinds")) rc = kinds();
  else if (!std::strcmp(mode, "sites")) rc = sites();
  else if (!std::strcmp(mode, "frag")) rc = frag();
  else if (!std::strcmp(mode, "real")) rc = real();
  else if (!std::strcmp(mode, "churn")) rc = churn();
  std::fflush(stdout);
  return rc;
}
