// cuCtxCreate / cuCtxDestroy on the simulated driver, the driver API reached through
// cuGetProcAddress (gpuheap's wrappers where it has them).
//   prog_ctx [DEV2]   run with SIMCUDA_DEVICE_COUNT=2 and DEV2=1 (default 0), with or without
//                     GPUHEAP_LIMIT=64MiB
// A created context on device 0 gets pooled blocks (one freed, the rest left live), pitch,
// managed and pinned host memory, then is destroyed with all of it. Afterwards a stale free
// fails, the dead handle is refused (and reported destroyed to a thread where it stayed
// current), cuCtxDestroy of the primary context is refused and
// leaves its memory alone, and the primary context can allocate close to a 64 MiB cap. A
// second context, on DEV2, gets the recycled handle (the simulator hands destroyed handles
// out again, as the real driver may) and is destroyed with a live block.
// Prints, for the test: CLOCK_MONOTONIC windows of each context's life and destroy call, and
// the pointers left live in the first context.
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <time.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "tests/preload/prog_expect.h"

#define OK(x) EXPECT((x) == CUDA_SUCCESS)

namespace {
constexpr std::size_t MiB = 1u << 20;

using getproc_t = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
getproc_t getproc;

template <class F>
F get(const char* name) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  if (getproc(name, &p, 13000, CU_GET_PROC_ADDRESS_DEFAULT, &st) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<F>(p);
}

std::size_t used(int dev) {
  auto fn = reinterpret_cast<std::size_t (*)(int)>(dlsym(RTLD_DEFAULT, "simcuda_used_bytes"));
  return fn ? fn(dev) : 0;
}

unsigned long long mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // the clock of gpuheap's record timestamps
  return static_cast<unsigned long long>(ts.tv_sec) * 1000000000ull + static_cast<unsigned long long>(ts.tv_nsec);
}
}  // namespace

int main(int argc, char** argv) {
  const int dev2 = argc > 1 ? std::atoi(argv[1]) : 0;
  EXPECT(cudaFree(nullptr) == cudaSuccess);  // the primary context of device 0, current
  getproc = reinterpret_cast<getproc_t>(dlsym(RTLD_DEFAULT, "cuGetProcAddress_v2"));
  EXPECT(getproc != nullptr);
  auto create_v2 = reinterpret_cast<CUresult (*)(CUcontext*, unsigned, CUdevice)>(
      dlsym(RTLD_DEFAULT, "cuCtxCreate_v2"));
  auto create = get<CUresult (*)(CUcontext*, CUctxCreateParams*, unsigned, CUdevice)>("cuCtxCreate");  // _v4
  auto destroy = get<CUresult (*)(CUcontext)>("cuCtxDestroy");
  auto get_current = get<CUresult (*)(CUcontext*)>("cuCtxGetCurrent");
  auto push = get<CUresult (*)(CUcontext)>("cuCtxPushCurrent");
  auto get_device = get<CUresult (*)(CUdevice*)>("cuCtxGetDevice");
  auto mem_alloc = get<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc");
  auto mem_free = get<CUresult (*)(CUdeviceptr)>("cuMemFree");
  auto alloc_pitch = get<CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned)>("cuMemAllocPitch");
  auto alloc_managed = get<CUresult (*)(CUdeviceptr*, size_t, unsigned)>("cuMemAllocManaged");
  auto alloc_host = get<CUresult (*)(void**, size_t)>("cuMemAllocHost");
  EXPECT(create_v2 && create && destroy && get_current && push && get_device && mem_alloc && mem_free && alloc_pitch &&
         alloc_managed && alloc_host);

  if (argc > 1 && std::string(argv[1]) == "cycle") {
    // `prog_ctx cycle`: 100 contexts created and destroyed in turn on device 0, more than
    // gpuheap's table of 64 pool states; the handle comes back each time. A worker thread
    // allocates in each context (a live block, dropped by the destroy) and the main thread
    // allocates and frees one.
    auto set_current = get<CUresult (*)(CUcontext)>("cuCtxSetCurrent");
    EXPECT(set_current != nullptr);
    CUcontext first = nullptr;
    int reused = 0;
    for (int i = 0; i < 100; ++i) {
      CUcontext ctx = nullptr;
      OK(create_v2(&ctx, 0, 0));
      if (i == 0) first = ctx;
      reused += ctx == first;
      CUresult worker_rc = CUDA_ERROR_UNKNOWN;
      std::thread([&] {
        CUdeviceptr w = 0;
        worker_rc = set_current(ctx);
        if (worker_rc == CUDA_SUCCESS) worker_rc = mem_alloc(&w, 2 * MiB);
      }).join();
      OK(worker_rc);
      CUdeviceptr m = 0;
      OK(mem_alloc(&m, 1 * MiB));
      OK(mem_free(m));
      OK(destroy(ctx));
    }
    std::printf("cycle reused=%d\n", reused);
    return 0;
  }

  CUcontext primary = nullptr, cur = nullptr;
  OK(get_current(&primary));
  void* p0 = nullptr;
  EXPECT(cudaMalloc(&p0, 3000) == cudaSuccess);  // primary memory that must outlive everything below
  const std::size_t used0 = used(0);

  // ---- a created context on device 0, destroyed with its memory ----
  const unsigned long long t_create = mono_ns();
  CUcontext ctx = nullptr;
  OK(create_v2(&ctx, 0, 0));
  OK(get_current(&cur));
  EXPECT(cur == ctx && ctx != primary);  // pushed current
  CUdeviceptr a = 0, b = 0, c = 0, pitched = 0, managed = 0;
  std::size_t pitch = 0;
  void* host = nullptr;
  OK(mem_alloc(&a, 30 * MiB));
  OK(mem_alloc(&b, 8 * MiB));
  OK(mem_alloc(&c, 1000));
  OK(alloc_pitch(&pitched, &pitch, 1000, 100, 4));
  OK(alloc_managed(&managed, 4 * MiB, CU_MEM_ATTACH_GLOBAL));
  OK(alloc_host(&host, 64 * 1024));
  OK(mem_free(b));  // the one freed by the program; the rest goes with the context
  EXPECT(used(0) > used0 + 34 * MiB);
  // Another thread has ctx current too: "ctx will remain current to those threads, and
  // attempting to access ctx from those threads will result in the error
  // CUDA_ERROR_CONTEXT_IS_DESTROYED" (cuCtxDestroy).
  std::atomic<int> phase{0};
  CUresult other_dev = CUDA_SUCCESS, other_alloc = CUDA_SUCCESS;
  std::thread other([&] {
    if (push(ctx) != CUDA_SUCCESS) return phase.store(-1);
    phase.store(1);
    while (phase.load() != 2) std::this_thread::yield();
    CUdevice d = -1;
    CUdeviceptr p = 0;
    other_dev = get_device(&d);
    other_alloc = mem_alloc(&p, MiB);
  });
  while (phase.load() == 0) std::this_thread::yield();
  EXPECT(phase.load() == 1);
  const unsigned long long t_destroy = mono_ns();
  OK(destroy(ctx));
  const unsigned long long t_destroyed = mono_ns();
  phase.store(2);
  other.join();
  EXPECT(other_dev == CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT(other_alloc == CUDA_ERROR_CONTEXT_IS_DESTROYED);
  std::printf("ctx1 %llu %llu %llu\n", t_create, t_destroy, t_destroyed);
  std::printf("live %#llx %#llx %#llx %#llx %#llx\n", static_cast<unsigned long long>(a),
              static_cast<unsigned long long>(c), static_cast<unsigned long long>(pitched),
              static_cast<unsigned long long>(managed), reinterpret_cast<unsigned long long>(host));
  OK(get_current(&cur));
  EXPECT(cur == primary);    // popped from this thread's stack
  EXPECT(used(0) == used0);  // the driver freed all of it
  // A pointer of the dead context: the driver's answer, whatever gpuheap made of it.
  EXPECT(mem_free(a) == CUDA_ERROR_INVALID_VALUE);
  EXPECT(destroy(ctx) == CUDA_ERROR_INVALID_CONTEXT);  // already destroyed
  EXPECT(push(ctx) == CUDA_ERROR_INVALID_CONTEXT);
  // "Cannot destroy primary context": refused, and the primary context's memory stays.
  EXPECT(destroy(primary) == CUDA_ERROR_INVALID_CONTEXT);
  EXPECT(used(0) == used0);

  // ---- the primary context keeps working, up to the cap ----
  void* q = nullptr;
  EXPECT(cudaMalloc(&q, 60 * MiB) == cudaSuccess);  // fits a 64 MiB cap only if ctx's charge went back
  EXPECT(cudaMemset(q, 1, 60 * MiB) == cudaSuccess);
  EXPECT(cudaFree(q) == cudaSuccess);
  EXPECT(cudaFree(p0) == cudaSuccess);
  EXPECT(cudaDeviceSynchronize() == cudaSuccess);

  // ---- the recycled handle, now on dev2 ----
  const std::size_t used2 = used(dev2);
  const unsigned long long t_create2 = mono_ns();
  CUcontext ctx2 = nullptr;
  OK(create(&ctx2, nullptr, 0, dev2));
  EXPECT(ctx2 == ctx);
  CUdevice d = -1;
  OK(get_device(&d));
  EXPECT(d == dev2);
  CUdeviceptr e = 0, f = 0;
  OK(mem_alloc(&e, 6 * MiB));
  OK(mem_alloc(&f, 2 * MiB));
  OK(mem_free(e));
  EXPECT(used(dev2) > used2);
  const unsigned long long t_destroy2 = mono_ns();
  OK(destroy(ctx2));
  const unsigned long long t_destroyed2 = mono_ns();
  std::printf("ctx2 %llu %llu %llu\n", t_create2, t_destroy2, t_destroyed2);
  EXPECT(used(dev2) == used2);
  OK(get_current(&cur));
  EXPECT(cur == primary);
  void* r = nullptr;
  EXPECT(cudaMalloc(&r, MiB) == cudaSuccess && cudaFree(r) == cudaSuccess);
  std::printf("prog_ctx: ok\n");
  return 0;
}
