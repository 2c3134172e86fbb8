// Reaches the driver the way static cudart, CuPy and JAX do: dlopen("libcuda.so.1"), dlsym
// by handle for cuGetProcAddress_v2, then every function by base name and CUDA version.
#include <cuda.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tests/preload/prog_expect.h"

#define OK(x) EXPECT((x) == CUDA_SUCCESS)

using getproc_t = CUresult (*)(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*);
static getproc_t getproc;

template <class F>
static F get(const char* name, int version = 13000, cuuint64_t flags = CU_GET_PROC_ADDRESS_DEFAULT) {
  void* p = nullptr;
  CUdriverProcAddressQueryResult st{};
  if (getproc(name, &p, version, flags, &st) != CUDA_SUCCESS) return nullptr;
  return reinterpret_cast<F>(p);
}

static bool from_gpuheap(void* fn) {
  Dl_info info{};
  return dladdr(fn, &info) && info.dli_fname && std::strstr(info.dli_fname, "libgpuheap") != nullptr;
}

int main() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  EXPECT(lib != nullptr);
  getproc = reinterpret_cast<getproc_t>(dlsym(lib, "cuGetProcAddress_v2"));
  EXPECT(getproc != nullptr);
  const bool preloaded = std::getenv("LD_PRELOAD") && std::strstr(std::getenv("LD_PRELOAD"), "libgpuheap");
  EXPECT(from_gpuheap(reinterpret_cast<void*>(getproc)) == preloaded);

  OK(get<CUresult (*)(unsigned)>("cuInit")(0));
  CUdevice dev;
  OK(get<CUresult (*)(CUdevice*, int)>("cuDeviceGet")(&dev, 0));
  CUcontext ctx;
  OK(get<CUresult (*)(CUcontext*, CUdevice)>("cuDevicePrimaryCtxRetain")(&ctx, dev));
  OK(get<CUresult (*)(CUcontext)>("cuCtxSetCurrent")(ctx));

  // cuGetProcAddress asked for itself hands out our wrapper, so later lookups stay hooked.
  auto self = get<getproc_t>("cuGetProcAddress");
  EXPECT(self != nullptr && from_gpuheap(reinterpret_cast<void*>(self)) == preloaded);
  // An old CUDA version gets the old 32-bit cuMemAlloc: never our _v2 wrapper.
  void* old_alloc = reinterpret_cast<void*>(get<void*>("cuMemAlloc", 3000));
  EXPECT(old_alloc != nullptr && !from_gpuheap(old_alloc));

  auto mem_alloc = get<CUresult (*)(CUdeviceptr*, size_t)>("cuMemAlloc");
  auto mem_free = get<CUresult (*)(CUdeviceptr)>("cuMemFree");
  EXPECT(from_gpuheap(reinterpret_cast<void*>(mem_alloc)) == preloaded);
  CUdeviceptr a = 0;
  OK(mem_alloc(&a, 2000));
  OK(mem_free(a));
  // By handle through dlsym, exact versioned name.
  auto mem_alloc2 = reinterpret_cast<CUresult (*)(CUdeviceptr*, size_t)>(dlsym(lib, "cuMemAlloc_v2"));
  EXPECT(mem_alloc2 != nullptr && from_gpuheap(reinterpret_cast<void*>(mem_alloc2)) == preloaded);
  OK(mem_alloc2(&a, 3000));
  OK(mem_free(a));
  size_t free_b = 0, total_b = 0;
  OK(get<CUresult (*)(size_t*, size_t*)>("cuMemGetInfo")(&free_b, &total_b));
  EXPECT(free_b <= total_b);

  CUstream s;
  OK(get<CUresult (*)(CUstream*, unsigned)>("cuStreamCreate")(&s, CU_STREAM_NON_BLOCKING));
  auto alloc_async = get<CUresult (*)(CUdeviceptr*, size_t, CUstream)>("cuMemAllocAsync", 13000,
                                                                       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  auto free_async = get<CUresult (*)(CUdeviceptr, CUstream)>("cuMemFreeAsync", 13000,
                                                             CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  EXPECT(from_gpuheap(reinterpret_cast<void*>(alloc_async)) == preloaded);
  OK(alloc_async(&a, 4096, s));
  OK(free_async(a, s));
  CUmemoryPool pool;
  OK(get<CUresult (*)(CUmemoryPool*, CUdevice)>("cuDeviceGetDefaultMemPool")(&pool, dev));
  OK(get<CUresult (*)(CUdeviceptr*, size_t, CUmemoryPool, CUstream)>("cuMemAllocFromPoolAsync")(&a, 8192, pool, s));
  OK(get<CUresult (*)(CUdeviceptr, CUstream)>("cuMemFreeAsync")(a, s));
  OK(get<CUresult (*)(CUstream)>("cuStreamSynchronize")(s));

  OK(get<CUresult (*)(CUdeviceptr*, size_t, unsigned)>("cuMemAllocManaged")(&a, 5000, CU_MEM_ATTACH_GLOBAL));
  OK(mem_free(a));
  size_t pitch = 0;
  OK(get<CUresult (*)(CUdeviceptr*, size_t*, size_t, size_t, unsigned)>("cuMemAllocPitch")(&a, &pitch, 100, 10, 4));
  OK(mem_free(a));
  void* h = nullptr;
  OK(get<CUresult (*)(void**, size_t, unsigned)>("cuMemHostAlloc")(&h, 6000, 0));
  OK(get<CUresult (*)(void*)>("cuMemFreeHost")(h));
  OK(get<CUresult (*)(void**, size_t)>("cuMemAllocHost")(&h, 7000));
  OK(get<CUresult (*)(void*)>("cuMemFreeHost")(h));

  // Virtual memory management, as PyTorch's expandable segments and NCCL use it.
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t gran = 0;
  OK(get<CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags)>(
      "cuMemGetAllocationGranularity")(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CUmemGenericAllocationHandle handle;
  OK(get<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long)>(
      "cuMemCreate")(&handle, gran, &prop, 0));
  CUdeviceptr va = 0;
  OK(get<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(
      "cuMemAddressReserve")(&va, 2 * gran, 0, 0, 0));
  OK(get<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>(
      "cuMemMap")(va, gran, 0, handle, 0));
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  OK(get<CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t)>("cuMemSetAccess")(va, gran, &access, 1));
  OK(get<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap")(va, gran));
  OK(get<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree")(va, 2 * gran));
  OK(get<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease")(handle));

  // Two handles mapped side by side, released while mapped, then one cuMemUnmap over both
  // mappings (as the CUDA samples' multi-device VMM allocator frees its stripes): both
  // mappings and both handles are freed by that one call.
  auto create = get<CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                                 unsigned long long)>("cuMemCreate");
  auto map = get<CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long)>(
      "cuMemMap");
  CUmemGenericAllocationHandle h1, h2;
  OK(create(&h1, gran, &prop, 0));
  OK(create(&h2, 2 * gran, &prop, 0));
  CUdeviceptr va2 = 0;
  OK(get<CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long)>(
      "cuMemAddressReserve")(&va2, 3 * gran, 0, 0, 0));
  OK(map(va2, gran, 0, h1, 0));
  OK(map(va2 + gran, 2 * gran, 0, h2, 0));
  OK(get<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease")(h1));
  OK(get<CUresult (*)(CUmemGenericAllocationHandle)>("cuMemRelease")(h2));
  // Part of the second mapping only: refused, and nothing is unmapped.
  EXPECT(get<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap")(va2, 2 * gran) == CUDA_ERROR_INVALID_VALUE);
  OK(get<CUresult (*)(CUdeviceptr, size_t)>("cuMemUnmap")(va2, 3 * gran));
  OK(get<CUresult (*)(CUdeviceptr, size_t)>("cuMemAddressFree")(va2, 3 * gran));
  OK(get<CUresult (*)(CUstream)>("cuStreamDestroy")(s));
  std::printf("prog_driver: ok (granularity %zu)\n", gran);
  return 0;
}
