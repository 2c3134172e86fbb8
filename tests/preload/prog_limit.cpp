// GPUHEAP_LIMIT and cache control on the simulated runtime, with exact numbers.
//   prog_limit cap        run with GPUHEAP_LIMIT=64MiB (device has more)
//   prog_limit fraction   run with GPUHEAP_LIMIT=0.25 and SIMCUDA_TOTAL_MEMORY=256M
//   prog_limit perdevice  run with GPUHEAP_LIMIT=0:32MiB and SIMCUDA_DEVICE_COUNT=2
//   prog_limit threshold  run with GPUHEAP_RELEASE_THRESHOLD=1
//   prog_limit uncapped   run with SIMCUDA_TOTAL_MEMORY=256M (and an invalid GPUHEAP_LIMIT)
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#define EXPECT(c)                                                                   \
  do {                                                                              \
    if (!(c)) {                                                                     \
      std::fprintf(stderr, "prog_limit: expectation %s failed at line %d\n", #c, __LINE__); \
      return 11;                                                                    \
    }                                                                               \
  } while (0)

namespace {
constexpr std::size_t MiB = 1u << 20;

bool info(std::size_t* f, std::size_t* t) { return cudaMemGetInfo(f, t) == cudaSuccess; }

std::size_t used(int dev) {
  auto fn = reinterpret_cast<std::size_t (*)(int)>(dlsym(RTLD_DEFAULT, "simcuda_used_bytes"));
  return fn ? fn(dev) : 0;
}
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
    EXPECT(info(&f, &t) && f == 14 * MiB);  // cached memory is free for the program
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
    EXPECT(cudaFree(b) == cudaSuccess);  // a's fence is done: its segment goes back
    EXPECT(used(0) <= 10 * MiB);
  }
  std::printf("prog_limit %s: ok\n", mode);
  return 0;
}
