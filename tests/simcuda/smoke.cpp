// Smoke tests of the simulated CUDA runtime/driver: memory accounting, errors, pointer queries,
// VMM, cuGetProcAddress mapping, multi-device. Streams and events: smoke_stream.cpp.
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "smoke_util.h"

using namespace simcuda_test;

namespace {

std::string dir_of(const void* addr) {
  Dl_info info{};
  if (dladdr(addr, &info) == 0 || info.dli_fname == nullptr) return {};
  std::string p = info.dli_fname;
  return p;
}

size_t free_bytes() {
  size_t f = 0, t = 0;
  EXPECT_EQ(cudaMemGetInfo(&f, &t), cudaSuccess);
  return f;
}

}  // namespace

TEST(Runtime, LoadsTheSimulatorLibraries) {
  const char* expect = std::getenv("SIMCUDA_EXPECT_DIR");
  ASSERT_NE(expect, nullptr);
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // context initialisation
  EXPECT_EQ(dir_of(reinterpret_cast<void*>(&cudaMalloc)), std::string(expect) + "/libcudart.so.13");
  EXPECT_EQ(dir_of(sym("cuGetProcAddress_v2")), std::string(expect) + "/libcuda.so.1");
  EXPECT_EQ(simcuda_is_simulator(), 1);
  int v = 0;
  EXPECT_EQ(cudaRuntimeGetVersion(&v), cudaSuccess);
  EXPECT_EQ(v, 13000);
  EXPECT_EQ(cudaDriverGetVersion(&v), cudaSuccess);
  EXPECT_EQ(v, 13000);
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  EXPECT_STREQ(prop.name, "simcuda device 0");
  EXPECT_EQ(prop.major, 9);
  EXPECT_EQ(prop.minor, 0);
  EXPECT_EQ(prop.totalGlobalMem, simcuda_total_bytes(0));
  EXPECT_GT(prop.multiProcessorCount, 0);
}

TEST(Memory, AllocFreeAndMemGetInfoAreExact) {
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  size_t f0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&f0, &total), cudaSuccess);
  EXPECT_EQ(total, size_t{1} << 30);  // SIMCUDA_TOTAL_MEMORY=1G
  EXPECT_EQ(f0, total - simcuda_used_bytes(0));
  const unsigned long long allocs0 = simcuda_call_count("cuMemAlloc_v2");
  const unsigned long long frees0 = simcuda_call_count("cuMemFree_v2");
  const size_t live0 = simcuda_live_allocations(0);

  void *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 1000), cudaSuccess);
  EXPECT_EQ(free_bytes(), f0 - 1024);
  ASSERT_EQ(cudaMalloc(&b, 512), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&c, 1), cudaSuccess);
  EXPECT_EQ(free_bytes(), f0 - 2048);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 512, 0u);
  EXPECT_EQ(simcuda_live_allocations(0), live0 + 3);
  std::memset(a, 0x5a, 1000);  // device memory is host-addressable in the simulator

  EXPECT_EQ(cudaFree(b), cudaSuccess);
  EXPECT_EQ(free_bytes(), f0 - 1536);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  EXPECT_EQ(cudaFree(c), cudaSuccess);
  EXPECT_EQ(free_bytes(), f0);
  EXPECT_EQ(simcuda_call_count("cuMemAlloc_v2"), allocs0 + 3);
  EXPECT_EQ(simcuda_call_count("cuMemFree_v2"), frees0 + 3);

  void* z = reinterpret_cast<void*>(1);
  EXPECT_EQ(cudaMalloc(&z, 0), cudaSuccess);  // size 0: success, NULL, no driver call
  EXPECT_EQ(z, nullptr);
  EXPECT_EQ(cudaFree(nullptr), cudaSuccess);
  EXPECT_EQ(simcuda_call_count("cuMemAlloc_v2"), allocs0 + 3);
  EXPECT_EQ(simcuda_call_count("cuMemFree_v2"), frees0 + 3);
}

TEST(Memory, BadFreesFailAndChangeNothing) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  const size_t used = simcuda_used_bytes(0);
  int on_stack = 0;
  (void)cudaGetLastError();
  EXPECT_EQ(cudaFree(static_cast<char*>(p) + 16), cudaErrorInvalidValue);  // interior
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaFree(&on_stack), cudaErrorInvalidValue);  // unknown
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaFreeHost(p), cudaErrorInvalidValue);  // wrong kind
  EXPECT_EQ(simcuda_used_bytes(0), used);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(cudaFree(p), cudaErrorInvalidValue);  // double free
  EXPECT_EQ(simcuda_used_bytes(0), used - 4096);
  EXPECT_STREQ(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue");
  EXPECT_STREQ(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
  (void)cudaGetLastError();
}

TEST(Memory, EveryKindIsChargedOrNot) {
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  const size_t u0 = simcuda_used_bytes(0);
  void *managed = nullptr, *pitched = nullptr, *host = nullptr, *host2 = nullptr;
  size_t pitch = 0;
  ASSERT_EQ(cudaMallocManaged(&managed, 1000, cudaMemAttachGlobal), cudaSuccess);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 1024);
  ASSERT_EQ(cudaMallocPitch(&pitched, &pitch, 100, 10), cudaSuccess);
  EXPECT_EQ(pitch, 512u);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 1024 + 5120);
  cudaPitchedPtr p3{};
  ASSERT_EQ(cudaMalloc3D(&p3, cudaExtent{600, 4, 2}), cudaSuccess);
  EXPECT_EQ(p3.pitch, 1024u);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 1024 + 5120 + 8192);
  ASSERT_EQ(cudaMallocHost(&host, 1 << 20), cudaSuccess);  // pinned host memory: not device memory
  ASSERT_EQ(cudaHostAlloc(&host2, 100, cudaHostAllocDefault), cudaSuccess);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 1024 + 5120 + 8192);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  void* async = nullptr;
  ASSERT_EQ(cudaMallocAsync(&async, 700, s), cudaSuccess);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 1024 + 5120 + 8192 + 1024);
  cudaMemPool_t pool = nullptr;
  ASSERT_EQ(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  void* pooled = nullptr;
  ASSERT_EQ(cudaMallocFromPoolAsync(&pooled, 512, pool, s), cudaSuccess);
  EXPECT_EQ(cudaFreeAsync(pooled, s), cudaSuccess);
  EXPECT_EQ(cudaFreeAsync(async, s), cudaSuccess);
  EXPECT_EQ(cudaFreeAsync(async, s), cudaErrorInvalidValue);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaFree(managed), cudaSuccess);
  EXPECT_EQ(cudaFree(pitched), cudaSuccess);
  EXPECT_EQ(cudaFree(p3.ptr), cudaSuccess);
  EXPECT_EQ(cudaFree(host), cudaErrorInvalidValue);  // pinned memory needs cudaFreeHost
  EXPECT_EQ(cudaFreeHost(host), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(host2), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(simcuda_used_bytes(0), u0);
  (void)cudaGetLastError();
}

TEST(Memory, PointerAttributesOfInteriorPointers) {
  void *dev = nullptr, *managed = nullptr, *host = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 4096), cudaSuccess);
  ASSERT_EQ(cudaMallocManaged(&managed, 64, cudaMemAttachGlobal), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&host, 64), cudaSuccess);
  char* inner = static_cast<char*>(dev) + 100;
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, inner), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 0);
  EXPECT_EQ(a.devicePointer, inner);
  EXPECT_EQ(a.hostPointer, nullptr);
  ASSERT_EQ(cudaPointerGetAttributes(&a, static_cast<char*>(managed) + 8), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeManaged);
  ASSERT_EQ(cudaPointerGetAttributes(&a, host), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  int local = 0;
  ASSERT_EQ(cudaPointerGetAttributes(&a, &local), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);

  auto range = driver_fn<decltype(&cuMemGetAddressRange)>("cuMemGetAddressRange");
  auto attr = driver_fn<decltype(&cuPointerGetAttribute)>("cuPointerGetAttribute");
  ASSERT_NE(range, nullptr);
  ASSERT_NE(attr, nullptr);
  CUdeviceptr base = 0;
  size_t size = 0;
  ASSERT_EQ(range(&base, &size, reinterpret_cast<CUdeviceptr>(inner)), CUDA_SUCCESS);
  EXPECT_EQ(base, reinterpret_cast<CUdeviceptr>(dev));
  EXPECT_EQ(size, 4096u);
  EXPECT_EQ(range(&base, &size, reinterpret_cast<CUdeviceptr>(&local)), CUDA_ERROR_NOT_FOUND);
  CUdeviceptr start = 0;
  ASSERT_EQ(attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, reinterpret_cast<CUdeviceptr>(inner)), CUDA_SUCCESS);
  EXPECT_EQ(start, base);
  EXPECT_EQ(attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, reinterpret_cast<CUdeviceptr>(&local)),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
  ASSERT_EQ(cudaPointerGetAttributes(&a, inner), cudaSuccess);  // freed: no longer known
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  EXPECT_EQ(cudaFree(managed), cudaSuccess);
  EXPECT_EQ(cudaFreeHost(host), cudaSuccess);
}

TEST(Memory, ConcurrentAllocFreeKeepsAccounting) {
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  const size_t u0 = simcuda_used_bytes(0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        void* p = nullptr;
        if (cudaMalloc(&p, static_cast<size_t>(1 + (i * 37 + t) % 5000)) == cudaSuccess) cudaFree(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(simcuda_used_bytes(0), u0);
}

TEST(Oom, PastTotalMemory) {
  size_t f = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&f, &total), cudaSuccess);
  ASSERT_EQ(total, size_t{64} << 20);  // SIMCUDA_TOTAL_MEMORY=64M
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ASSERT_EQ(cudaMalloc(&a, size_t{48} << 20), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&b, size_t{32} << 20), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  size_t f2 = 0;
  ASSERT_EQ(cudaMemGetInfo(&f2, &total), cudaSuccess);
  EXPECT_EQ(f2, f - (size_t{48} << 20));
  ASSERT_EQ(cudaMalloc(&c, f2), cudaSuccess);  // exactly the rest fits
  EXPECT_EQ(cudaMalloc(&b, 1), cudaErrorMemoryAllocation);
  void* m = nullptr;
  EXPECT_EQ(cudaMallocManaged(&m, 1, cudaMemAttachGlobal), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaMallocAsync(&m, 1, nullptr), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaFree(c), cudaSuccess);
  EXPECT_EQ(cudaFree(a), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&f2, &total), cudaSuccess);
  EXPECT_EQ(f2, f);
  (void)cudaGetLastError();
}

TEST(Vmm, ReserveCreateMapAccessUnmap) {
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  auto granularity = driver_fn<decltype(&cuMemGetAllocationGranularity)>("cuMemGetAllocationGranularity");
  auto create = driver_fn<decltype(&cuMemCreate)>("cuMemCreate");
  auto release = driver_fn<decltype(&cuMemRelease)>("cuMemRelease");
  auto reserve = driver_fn<decltype(&cuMemAddressReserve)>("cuMemAddressReserve");
  auto addr_free = driver_fn<decltype(&cuMemAddressFree)>("cuMemAddressFree");
  auto map = driver_fn<decltype(&cuMemMap)>("cuMemMap");
  auto unmap = driver_fn<decltype(&cuMemUnmap)>("cuMemUnmap");
  auto set_access = driver_fn<decltype(&cuMemSetAccess)>("cuMemSetAccess");
  ASSERT_TRUE(granularity && create && release && reserve && addr_free && map && unmap && set_access);

  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = 0;
  size_t g = 0;
  ASSERT_EQ(granularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  EXPECT_EQ(g, size_t{2} << 20);
  const size_t u0 = simcuda_used_bytes(0);
  CUmemGenericAllocationHandle h = 0;
  EXPECT_EQ(create(&h, g + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);  // not a granularity multiple
  ASSERT_EQ(create(&h, 2 * g, &prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 2 * g);
  CUdeviceptr va = 0;
  ASSERT_EQ(reserve(&va, 4 * g, 0, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(va % g, 0u);
  ASSERT_EQ(map(va + g, 2 * g, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(map(va + g, 2 * g, 0, h, 0), CUDA_ERROR_ALREADY_MAPPED);
  CUmemAccessDesc desc{};
  desc.location = prop.location;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  ASSERT_EQ(set_access(va + g, 2 * g, &desc, 1), CUDA_SUCCESS);
  auto* bytes = reinterpret_cast<unsigned char*>(va + g);
  bytes[0] = 7;
  bytes[2 * g - 1] = 9;
  EXPECT_EQ(bytes[0] + bytes[2 * g - 1], 16);
  ASSERT_EQ(cudaMemset(bytes + 10, 3, 100), cudaSuccess);  // memset into a VMM mapping
  EXPECT_EQ(bytes[50], 3);
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, bytes + 1000), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(cudaFree(bytes), cudaErrorInvalidValue);  // VMM memory is not cudaFree-able

  // Releasing the handle while mapped keeps the memory until the unmap (cuMemRelease docs).
  ASSERT_EQ(release(h), CUDA_SUCCESS);
  EXPECT_EQ(release(h), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 2 * g);
  EXPECT_EQ(bytes[0], 7);
  EXPECT_EQ(unmap(va + g, g), CUDA_ERROR_INVALID_VALUE);  // must cover whole mappings
  ASSERT_EQ(unmap(va + g, 2 * g), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_used_bytes(0), u0);
  EXPECT_EQ(addr_free(va, 3 * g), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(addr_free(va, 4 * g), CUDA_SUCCESS);
  (void)cudaGetLastError();
}

TEST(ProcAddress, VersionAndPerThreadMapping) {
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  auto gpa = proc_address();
  ASSERT_NE(gpa, nullptr);
  EXPECT_EQ(reinterpret_cast<void*>(gpa), sym("cuGetProcAddress_v2"));
  struct Case {
    const char* base;
    int version;
    cuuint64_t flags;
    const char* expect;
  } cases[] = {
      {"cuMemAlloc", 3000, 0, "cuMemAlloc"},
      {"cuMemAlloc", 3020, 0, "cuMemAlloc_v2"},
      {"cuMemAlloc", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAlloc_v2"},
      {"cuMemFree", 13000, 0, "cuMemFree_v2"},
      {"cuMemGetInfo", 3010, 0, "cuMemGetInfo"},
      {"cuMemGetInfo", 12000, 0, "cuMemGetInfo_v2"},
      {"cuMemAllocPitch", 3020, 0, "cuMemAllocPitch_v2"},
      {"cuGetProcAddress", 11030, 0, "cuGetProcAddress"},
      {"cuGetProcAddress", 12000, 0, "cuGetProcAddress_v2"},
      {"cuStreamDestroy", 3020, 0, "cuStreamDestroy"},
      {"cuStreamDestroy", 4000, 0, "cuStreamDestroy_v2"},
      {"cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, "cuMemAllocAsync"},
      {"cuMemAllocAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemAllocAsync_ptsz"},
      {"cuMemFreeAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemFreeAsync_ptsz"},
      {"cuEventRecord", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuEventRecord_ptsz"},
      {"cuStreamSynchronize", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuStreamSynchronize_ptsz"},
      {"cuLaunchHostFunc", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuLaunchHostFunc_ptsz"},
      {"cuMemsetD8", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, "cuMemsetD8_v2_ptds"},
      {"cuMemcpyHtoD", 13000, 0, "cuMemcpyHtoD_v2"},
  };
  for (const Case& c : cases) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    EXPECT_EQ(gpa(c.base, &fn, c.version, c.flags, &st), CUDA_SUCCESS) << c.base;
    EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS) << c.base;
    ASSERT_NE(sym(c.expect), nullptr) << c.expect;
    EXPECT_EQ(fn, sym(c.expect)) << c.base << " @" << c.version << " expected " << c.expect;
  }
  void* fn = reinterpret_cast<void*>(1);
  CUdriverProcAddressQueryResult st{};
  EXPECT_EQ(gpa("cuNoSuchFunction", &fn, 13000, 0, &st), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
  EXPECT_EQ(fn, nullptr);
  EXPECT_EQ(gpa("cuMemAllocAsync", &fn, 11000, 0, &st), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
  EXPECT_EQ(gpa("cuMemAlloc", &fn, 99000, 0, &st), CUDA_ERROR_INVALID_VALUE);  // newer than driver
  // The old four-argument entry point resolves the same way.
  auto old_gpa = reinterpret_cast<CUresult (*)(const char*, void**, int, cuuint64_t)>(sym("cuGetProcAddress"));
  ASSERT_NE(old_gpa, nullptr);
  EXPECT_EQ(old_gpa("cuMemFree", &fn, 13000, 0), CUDA_SUCCESS);
  EXPECT_EQ(fn, sym("cuMemFree_v2"));

  // The pre-3.2 ABI: 32-bit device pointers and sizes.
  using OldAlloc = CUresult (*)(unsigned int*, unsigned int);
  using OldFree = CUresult (*)(unsigned int);
  void* old_alloc = nullptr;
  void* old_free = nullptr;
  ASSERT_EQ(gpa("cuMemAlloc", &old_alloc, 3000, 0, &st), CUDA_SUCCESS);
  ASSERT_EQ(gpa("cuMemFree", &old_free, 3000, 0, &st), CUDA_SUCCESS);
  const size_t u0 = simcuda_used_bytes(0);
  const unsigned long long v2_allocs = simcuda_call_count("cuMemAlloc_v2");
  unsigned int p32 = 0;
  ASSERT_EQ(reinterpret_cast<OldAlloc>(old_alloc)(&p32, 100), CUDA_SUCCESS);
  EXPECT_NE(p32, 0u);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 512);
  EXPECT_EQ(simcuda_call_count("cuMemAlloc_v2"), v2_allocs);  // counted under its own name only
  EXPECT_EQ(reinterpret_cast<OldFree>(old_free)(p32), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_used_bytes(0), u0);
}

TEST(EntryPoint, RuntimeForwardsToTheDriver) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult st{};
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 13000, cudaEnableDefault, &st), cudaSuccess);
  EXPECT_EQ(st, cudaDriverEntryPointSuccess);
  EXPECT_EQ(fn, sym("cuMemAlloc_v2"));
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuMemAlloc", &fn, 3000, cudaEnableDefault, &st), cudaSuccess);
  EXPECT_EQ(fn, sym("cuMemAlloc"));
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 13000, cudaEnablePerThreadDefaultStream, &st),
            cudaSuccess);
  EXPECT_EQ(fn, sym("cuMemAllocAsync_ptsz"));
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuBogus", &fn, 13000, cudaEnableDefault, &st), cudaSuccess);
  EXPECT_EQ(st, cudaDriverEntryPointSymbolNotFound);
  EXPECT_EQ(fn, nullptr);
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuMemAllocAsync", &fn, 11000, cudaEnableDefault, &st), cudaSuccess);
  EXPECT_EQ(st, cudaDriverEntryPointVersionNotSufficent);

  // Calling through the pointers works on the runtime's context.
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  auto alloc = driver_fn<decltype(&cuMemAlloc)>("cuMemAlloc");
  auto free_fn = driver_fn<decltype(&cuMemFree)>("cuMemFree");
  auto info = driver_fn<decltype(&cuMemGetInfo)>("cuMemGetInfo");
  ASSERT_TRUE(alloc && free_fn && info);
  size_t f0 = 0, f1 = 0, t = 0;
  ASSERT_EQ(info(&f0, &t), CUDA_SUCCESS);
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 3000), CUDA_SUCCESS);
  ASSERT_EQ(info(&f1, &t), CUDA_SUCCESS);
  EXPECT_EQ(f0 - f1, 3072u);
  EXPECT_EQ(free_fn(p), CUDA_SUCCESS);
  EXPECT_EQ(free_fn(p), CUDA_ERROR_INVALID_VALUE);

  // A thread without a current context gets CUDA_ERROR_INVALID_CONTEXT, not a crash.
  CUresult no_ctx_info = CUDA_SUCCESS, no_ctx_alloc = CUDA_SUCCESS;
  std::thread([&] {
    no_ctx_info = info(&f0, &t);
    no_ctx_alloc = alloc(&p, 16);
  }).join();
  EXPECT_EQ(no_ctx_info, CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(no_ctx_alloc, CUDA_ERROR_INVALID_CONTEXT);
}

TEST(MultiDevice, DevicesAreIndependent) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  ASSERT_EQ(n, 2);  // SIMCUDA_DEVICE_COUNT=2
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 1), cudaSuccess);
  EXPECT_STREQ(prop.name, "simcuda device 1");
  EXPECT_EQ(prop.totalGlobalMem, size_t{256} << 20);
  EXPECT_EQ(cudaSetDevice(2), cudaErrorInvalidDevice);
  (void)cudaGetLastError();

  const size_t u0 = simcuda_used_bytes(0), u1 = simcuda_used_bytes(1);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  int d = -1;
  ASSERT_EQ(cudaGetDevice(&d), cudaSuccess);
  EXPECT_EQ(d, 1);
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 5000), cudaSuccess);
  EXPECT_EQ(simcuda_used_bytes(1), u1 + 5120);
  EXPECT_EQ(simcuda_used_bytes(0), u0);
  size_t f = 0, t = 0;
  ASSERT_EQ(cudaMemGetInfo(&f, &t), cudaSuccess);
  EXPECT_EQ(f, t - simcuda_used_bytes(1));
  cudaPointerAttributes a{};
  ASSERT_EQ(cudaPointerGetAttributes(&a, p), cudaSuccess);
  EXPECT_EQ(a.device, 1);

  // Another thread starts on device 0 and cannot exhaust device 1.
  std::thread([&] {
    int dev = -1;
    EXPECT_EQ(cudaGetDevice(&dev), cudaSuccess);
    EXPECT_EQ(dev, 0);
    void* q = nullptr;
    ASSERT_EQ(cudaMalloc(&q, 1000), cudaSuccess);
    EXPECT_EQ(simcuda_used_bytes(0), u0 + 1024);
    cudaPointerGetAttributes(&a, q);
    EXPECT_EQ(a.device, 0);
    EXPECT_EQ(cudaFree(q), cudaSuccess);
  }).join();
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  EXPECT_EQ(simcuda_used_bytes(1), u1);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}
