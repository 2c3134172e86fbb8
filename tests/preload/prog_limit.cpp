// GPUHEAP_LIMIT and cache control on the simulated runtime, with exact numbers.
//   prog_limit cap        run with GPUHEAP_LIMIT=64MiB (device has more)
//   prog_limit fraction   run with GPUHEAP_LIMIT=0.25 and SIMCUDA_TOTAL_MEMORY=256M
//   prog_limit perdevice  run with GPUHEAP_LIMIT=0:32MiB and SIMCUDA_DEVICE_COUNT=2
//   prog_limit threshold  run with GPUHEAP_RELEASE_THRESHOLD=1b
//   prog_limit uncapped   run with SIMCUDA_TOTAL_MEMORY=256M (and an invalid GPUHEAP_LIMIT)
//   prog_limit race       run with GPUHEAP_LIMIT=64MiB GPUHEAP_POOL=0: threads race pass-through kinds to the cap
//   prog_limit devices    run with GPUHEAP_LIMIT=1:8MiB, SIMCUDA_DEVICE_COUNT=2, device 0 current
//   prog_limit vmm        run with GPUHEAP_LIMIT=8MiB: cuMemRelease before cuMemUnmap
//   prog_limit sizemax    cudaMalloc(SIZE_MAX) with nothing held, then again holding one 1 MiB
//                         block: both fail with cudaErrorMemoryAllocation, the next 1 MiB
//                         one still succeeds (the OOM reports on stderr: the test checks them)
//   prog_limit reset      run with GPUHEAP_LIMIT=64MiB: cudaDeviceReset / cuDevicePrimaryCtxReset
//                         with live, pending and cached pool memory
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/preload/prog_expect.h"

namespace {
constexpr std::size_t MiB = 1u << 20;

bool info(std::size_t* f, std::size_t* t) { return cudaMemGetInfo(f, t) == cudaSuccess; }

std::size_t used(int dev) {
  auto fn = reinterpret_cast<std::size_t (*)(int)>(dlsym(RTLD_DEFAULT, "simcuda_used_bytes"));
  return fn ? fn(dev) : 0;
}
template <class F>
F drv(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));  // gpuheap's dlsym: its wrappers
}

// Threads allocate 1 MiB pieces of pass-through kinds until the cap refuses; nothing is
// freed meanwhile, so exactly cap/1 MiB of them must succeed, never one more.
int race(int threads, int rounds) {
  for (int round = 0; round < rounds; ++round) {
    std::atomic<int> go{0};
    std::vector<std::vector<void*>> got(static_cast<std::size_t>(threads));
    std::vector<std::thread> ts;
    for (int i = 0; i < threads; ++i)
      ts.emplace_back([&, i] {
        while (go.load() == 0) {
        }
        for (int k = 0;; ++k) {
          void* p = nullptr;
          cudaError_t rc = (k + i) % 2 ? cudaMallocManaged(&p, MiB) : cudaMalloc(&p, MiB);
          if (rc != cudaSuccess) break;
          got[static_cast<std::size_t>(i)].push_back(p);
        }
      });
    go.store(1);
    for (auto& t : ts) t.join();
    std::size_t n = 0;
    for (auto& v : got) n += v.size();
    if (n != 64 || used(0) != 64 * MiB) {
      std::fprintf(stderr, "prog_limit race: round %d: %zu MiB allocated under a 64 MiB cap\n", round, n);
      return 12;
    }
    for (auto& v : got)
      for (void* p : v) cudaFree(p);
    cudaDeviceSynchronize();
  }
  return 0;
}

CUmemAllocationProp device_prop(int dev) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  return prop;
}

using create_fn = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
using release_fn = CUresult (*)(CUmemGenericAllocationHandle);
}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "cap";
  std::size_t f = 0, t = 0;
  cudaFree(nullptr);
  if (!std::strcmp(mode, "cap")) {
    EXPECT(info(&f, &t));
    EXPECT(t == 64 * MiB && f == 64 * MiB);
    void* b[7] = {};
    for (int i = 0; i < 6; ++i) EXPECT(cudaMalloc(&b[i], 10 * MiB) == cudaSuccess);  // own 10 MiB segments
    EXPECT(info(&f, &t) && f == 4 * MiB);
    // The device has room, the cap has not: the answer is the real out-of-memory error.
    EXPECT(cudaMalloc(&b[6], 10 * MiB) == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);  // latched like a real failure
    EXPECT(cudaGetLastError() == cudaSuccess);
    EXPECT(cudaFree(b[5]) == cudaSuccess);
    EXPECT(info(&f, &t) && f == 14 * MiB);               // cached memory is free for the program
    EXPECT(cudaMalloc(&b[5], 10 * MiB) == cudaSuccess);  // served from the cache
    // Pass-through kinds count against the cap too; the pool gives back its cache first.
    void* m = nullptr;
    EXPECT(cudaMallocManaged(&m, 8 * MiB) == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaFree(b[4]) == cudaSuccess && cudaFree(b[3]) == cudaSuccess);
    EXPECT(cudaMallocManaged(&m, 8 * MiB) == cudaSuccess);
    EXPECT(used(0) == 40 * MiB + 8 * MiB);  // two cached segments went back to the driver
    EXPECT(info(&f, &t) && f == 64 * MiB - 48 * MiB);
    EXPECT(cudaFree(m) == cudaSuccess);
    for (int i = 0; i < 3; ++i) EXPECT(cudaFree(b[i]) == cudaSuccess);
    EXPECT(cudaFree(b[5]) == cudaSuccess);
    auto empty = reinterpret_cast<std::size_t (*)()>(dlsym(RTLD_DEFAULT, "gpuheap_empty_cache"));
    EXPECT(empty != nullptr);
    EXPECT(empty() == 40 * MiB);
    EXPECT(used(0) == 0);
  } else if (!std::strcmp(mode, "fraction")) {
    EXPECT(info(&f, &t) && t == 64 * MiB);
  } else if (!std::strcmp(mode, "perdevice")) {
    EXPECT(info(&f, &t) && t == 32 * MiB);
    EXPECT(cudaSetDevice(1) == cudaSuccess);
    EXPECT(info(&f, &t) && t > 32 * MiB);
    void* p = nullptr;
    EXPECT(cudaMalloc(&p, 40 * MiB) == cudaSuccess);  // device 1 is not capped
    EXPECT(cudaSetDevice(0) == cudaSuccess);
    EXPECT(cudaFree(p) == cudaSuccess);  // freed while device 0 is current
    void* q = nullptr;
    EXPECT(cudaMalloc(&q, 40 * MiB) == cudaErrorMemoryAllocation);
  } else if (!std::strcmp(mode, "sizemax")) {
    void* a = nullptr;
    void* huge = nullptr;
    void* b = nullptr;
    EXPECT(cudaFree(nullptr) == cudaSuccess);  // the context, nothing held yet
    EXPECT(cudaMalloc(&huge, SIZE_MAX) == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaMalloc(&a, MiB) == cudaSuccess);
    EXPECT(cudaMalloc(&huge, SIZE_MAX) == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaMalloc(&b, MiB) == cudaSuccess);
    EXPECT(cudaFree(a) == cudaSuccess && cudaFree(b) == cudaSuccess);
  } else if (!std::strcmp(mode, "uncapped")) {
    EXPECT(info(&f, &t) && t == 256 * MiB);  // run with SIMCUDA_TOTAL_MEMORY=256M
    void* p = nullptr;
    EXPECT(cudaMalloc(&p, 100 * MiB) == cudaSuccess && cudaFree(p) == cudaSuccess);
  } else if (!std::strcmp(mode, "threshold")) {
    void* a = nullptr;
    void* b = nullptr;
    EXPECT(cudaMalloc(&a, 10 * MiB) == cudaSuccess && cudaMalloc(&b, 10 * MiB) == cudaSuccess);
    EXPECT(cudaFree(a) == cudaSuccess);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the seal interval
    EXPECT(cudaFree(b) == cudaSuccess);                         // a's fence is done: its segment goes back
    EXPECT(used(0) <= 10 * MiB);
  } else if (!std::strcmp(mode, "race")) {
    if (int rc = race(4, 5)) return rc;
  } else if (!std::strcmp(mode, "devices")) {
    // Device 0 is current and uncapped; everything below lives on device 1 (cap 8 MiB).
    auto create = drv<create_fn>("cuMemCreate");
    auto release = drv<release_fn>("cuMemRelease");
    EXPECT(create && release);
    CUmemAllocationProp prop = device_prop(1);
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    EXPECT(create(&h, 8 * MiB, &prop, 0) == CUDA_SUCCESS);
    EXPECT(used(1) == 8 * MiB && used(0) == 0);
    EXPECT(create(&h2, 2 * MiB, &prop, 0) == CUDA_ERROR_OUT_OF_MEMORY);  // device 1 is full
    cudaStream_t s1 = nullptr;
    EXPECT(cudaSetDevice(1) == cudaSuccess && cudaStreamCreate(&s1) == cudaSuccess);
    cudaMemPool_t pool1 = nullptr;
    cudaMemPoolProps pp{};
    pp.allocType = cudaMemAllocationTypePinned;
    pp.location.type = cudaMemLocationTypeDevice;
    pp.location.id = 1;
    EXPECT(cudaMemPoolCreate(&pool1, &pp) == cudaSuccess);
    EXPECT(cudaSetDevice(0) == cudaSuccess);
    void* p = nullptr;
    EXPECT(cudaMallocAsync(&p, MiB, s1) == cudaErrorMemoryAllocation);  // the stream's device
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaMallocFromPoolAsync(&p, MiB, pool1, nullptr) == cudaErrorMemoryAllocation);  // the pool's
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaMalloc(&p, 16 * MiB) == cudaSuccess && cudaFree(p) == cudaSuccess);  // device 0: no cap
    EXPECT(release(h) == CUDA_SUCCESS);
    void* a = nullptr;
    void* b = nullptr;
    EXPECT(cudaMallocAsync(&a, 4 * MiB, s1) == cudaSuccess);
    EXPECT(cudaMallocFromPoolAsync(&b, 4 * MiB, pool1, nullptr) == cudaSuccess);
    EXPECT(used(1) == 8 * MiB);
    EXPECT(cudaMallocAsync(&p, MiB, s1) == cudaErrorMemoryAllocation);
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(cudaFreeAsync(a, s1) == cudaSuccess && cudaFreeAsync(b, s1) == cudaSuccess);
    EXPECT(cudaStreamSynchronize(s1) == cudaSuccess);
  } else if (!std::strcmp(mode, "vmm")) {
    auto create = drv<create_fn>("cuMemCreate");
    auto release = drv<release_fn>("cuMemRelease");
    auto reserve = drv<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(
        "cuMemAddressReserve");
    auto map = drv<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>(
        "cuMemMap");
    auto unmap = drv<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap");
    auto addr_free = drv<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree");
    EXPECT(create && release && reserve && map && unmap && addr_free);
    CUmemAllocationProp prop = device_prop(0);
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    EXPECT(create(&h, 8 * MiB, &prop, 0) == CUDA_SUCCESS);
    EXPECT(reserve(&va, 8 * MiB, 0, 0, 0) == CUDA_SUCCESS && map(va, 8 * MiB, 0, h, 0) == CUDA_SUCCESS);
    // The usual idiom: drop the handle at once, the mapping keeps the memory alive.
    EXPECT(release(h) == CUDA_SUCCESS);
    EXPECT(used(0) == 8 * MiB);
    EXPECT(info(&f, &t) && f == 0);
    void* m = nullptr;
    EXPECT(cudaMallocManaged(&m, MiB) == cudaErrorMemoryAllocation);  // still held: still capped
    EXPECT(cudaGetLastError() == cudaErrorMemoryAllocation);
    EXPECT(unmap(va, 8 * MiB) == CUDA_SUCCESS);  // the last mapping: now the memory is freed
    EXPECT(used(0) == 0);
    EXPECT(info(&f, &t) && f == 8 * MiB);
    EXPECT(cudaMallocManaged(&m, MiB) == cudaSuccess && cudaFree(m) == cudaSuccess);
    EXPECT(addr_free(va, 8 * MiB) == CUDA_SUCCESS);
  } else if (!std::strcmp(mode, "reset")) {
    void *p = nullptr, *small = nullptr, *m = nullptr;
    EXPECT(cudaMalloc(&p, 10 * MiB) == cudaSuccess && cudaMalloc(&small, 1000) == cudaSuccess);
    EXPECT(cudaMallocManaged(&m, 8 * MiB) == cudaSuccess);
    EXPECT(used(0) == 20 * MiB);                   // 10 MiB segment, 2 MiB small segment, 8 MiB managed
    EXPECT(info(&f, &t) && f == 46 * MiB - 1024);  // + the small segment's unused cache
    EXPECT(cudaDeviceReset() == cudaSuccess);      // all of it is gone with the context
    EXPECT(used(0) == 0);
    EXPECT(info(&f, &t) && f == 64 * MiB);  // and out of the cap
    void* q = nullptr;
    EXPECT(cudaMalloc(&q, 10 * MiB) == cudaSuccess);
    EXPECT(used(0) == 10 * MiB);  // a fresh segment, not the dead one
    EXPECT(cudaMemset(q, 1, 10 * MiB) == cudaSuccess);
    auto reset = drv<CUresult (*)(CUdevice)>("cuDevicePrimaryCtxReset");  // the driver's way
    EXPECT(reset && reset(0) == CUDA_SUCCESS);
    EXPECT(used(0) == 0);
    EXPECT(info(&f, &t) && f == 64 * MiB);
    EXPECT(cudaMalloc(&q, 10 * MiB) == cudaSuccess && used(0) == 10 * MiB);
    EXPECT(cudaFree(q) == cudaSuccess);        // pending behind its fence, segment cached
    EXPECT(cudaDeviceReset() == cudaSuccess);  // drops a pending block and a cached segment
    EXPECT(used(0) == 0);
  }
  std::printf("prog_limit %s: ok\n", mode);
  return 0;
}
