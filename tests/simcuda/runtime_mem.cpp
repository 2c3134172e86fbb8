// Simulated runtime: memory API, implemented on the driver entry points (see runtime_internal.h).
#include "runtime_internal.h"

using namespace simcuda::rt;

namespace {

CUdeviceptr dp(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

cudaError_t malloc_async(void** ptr, size_t size, cudaStream_t s, bool ptsz) {
  if (ptr == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api, ptsz); e != cudaSuccess) return record(e);
  CUdeviceptr p = 0;
  CUresult r = api->cuMemAllocAsync(&p, size, s);
  if (r == CUDA_SUCCESS) *ptr = reinterpret_cast<void*>(p);
  return finish(r);
}

cudaError_t malloc_from_pool(void** ptr, size_t size, cudaMemPool_t pool, cudaStream_t s, bool ptsz) {
  if (ptr == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api, ptsz); e != cudaSuccess) return record(e);
  CUdeviceptr p = 0;
  CUresult r = api->cuMemAllocFromPoolAsync(&p, size, pool, s);
  if (r == CUDA_SUCCESS) *ptr = reinterpret_cast<void*>(p);
  return finish(r);
}

cudaError_t free_async(void* p, cudaStream_t s, bool ptsz) {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api, ptsz); e != cudaSuccess) return record(e);
  return finish(api->cuMemFreeAsync(dp(p), s));
}

cudaError_t memset_impl(void* p, int value, size_t n, cudaStream_t s, bool async, bool ptsz) {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api, ptsz); e != cudaSuccess) return record(e);
  auto v = static_cast<unsigned char>(value);
  return finish(async ? api->cuMemsetD8Async(dp(p), v, n, s) : api->cuMemsetD8_v2(dp(p), v, n));
}

cudaError_t memcpy_impl(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s, bool async,
                        bool ptsz) {
  if (kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) return record(cudaErrorInvalidMemcpyDirection);
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api, ptsz); e != cudaSuccess) return record(e);
  // Unified addressing: every direction is a cuMemcpy on the simulator.
  return finish(async ? api->cuMemcpyAsync(dp(dst), dp(src), n, s) : api->cuMemcpy(dp(dst), dp(src), n));
}

}  // namespace

// cudaMalloc(&p, 0) succeeds with p == NULL without reaching the driver (real runtime behaviour).
RT_API cudaError_t cudaMalloc(void** ptr, size_t size) {
  if (ptr == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  if (size == 0) {
    *ptr = nullptr;
    return cudaSuccess;
  }
  CUdeviceptr p = 0;
  CUresult r = api->cuMemAlloc_v2(&p, size);
  if (r == CUDA_SUCCESS) *ptr = reinterpret_cast<void*>(p);
  return finish(r);
}

// cudaFree(NULL) only initialises the context. Otherwise it synchronises the device and frees.
// The synchronisation is cuMemFree's implicit one (free_device_memory), not cuCtxSynchronize:
// on a RELAXED thread cudaFree is allowed during another stream's capture (an implicit
// synchronisation is only "potentially unsafe", cuThreadExchangeStreamCaptureMode), while an
// explicit device synchronisation is refused whenever any stream of the device captures.
RT_API cudaError_t cudaFree(void* p) {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  if (p == nullptr) return cudaSuccess;
  return finish(api->cuMemFree_v2(dp(p)));
}

RT_API cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  return finish(api->cuMemGetInfo_v2(free_bytes, total_bytes));
}

RT_API cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s) { return malloc_async(p, n, s, false); }
RT_API cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t s) { return malloc_async(p, n, s, true); }
RT_API cudaError_t cudaFreeAsync(void* p, cudaStream_t s) { return free_async(p, s, false); }
RT_API cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) { return free_async(p, s, true); }
RT_API cudaError_t cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t pool, cudaStream_t s) {
  return malloc_from_pool(p, n, pool, s, false);
}
RT_API cudaError_t cudaMallocFromPoolAsync_ptsz(void** p, size_t n, cudaMemPool_t pool, cudaStream_t s) {
  return malloc_from_pool(p, n, pool, s, true);
}

RT_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) return record(e);
  return finish(api->cuDeviceGetDefaultMemPool(pool, device));
}

RT_API cudaError_t cudaMemPoolCreate(cudaMemPool_t* pool, const cudaMemPoolProps* props) {
  if (props == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) return record(e);
  CUmemPoolProps p{};
  p.allocType = static_cast<CUmemAllocationType>(props->allocType);
  p.handleTypes = static_cast<CUmemAllocationHandleType>(props->handleTypes);
  p.location.type = static_cast<CUmemLocationType>(props->location.type);
  p.location.id = props->location.id;
  p.maxSize = props->maxSize;
  return finish(api->cuMemPoolCreate(pool, &p));
}

RT_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) return record(e);
  return finish(api->cuMemPoolDestroy(pool));
}

RT_API cudaError_t cudaMallocManaged(void** ptr, size_t size, unsigned int flags) {
  if (ptr == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  CUdeviceptr p = 0;
  CUresult r = api->cuMemAllocManaged(&p, size, flags);  // cudaMemAttach* == CU_MEM_ATTACH_*
  if (r == CUDA_SUCCESS) *ptr = reinterpret_cast<void*>(p);
  return finish(r);
}

RT_API cudaError_t cudaMallocHost(void** ptr, size_t size) {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  return finish(api->cuMemAllocHost_v2(ptr, size));
}

RT_API cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int flags) {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  return finish(api->cuMemHostAlloc(ptr, size, flags));  // cudaHostAlloc* == CU_MEMHOSTALLOC_*
}

RT_API cudaError_t cudaFreeHost(void* ptr) {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  if (ptr == nullptr) return cudaSuccess;
  return finish(api->cuMemFreeHost(ptr));
}

RT_API cudaError_t cudaMallocPitch(void** ptr, size_t* pitch, size_t width, size_t height) {
  if (ptr == nullptr || pitch == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  CUdeviceptr p = 0;
  CUresult r = api->cuMemAllocPitch_v2(&p, pitch, width, height, 4);
  if (r == CUDA_SUCCESS) *ptr = reinterpret_cast<void*>(p);
  return finish(r);
}

RT_API cudaError_t cudaMalloc3D(cudaPitchedPtr* out, cudaExtent extent) {
  if (out == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  CUdeviceptr p = 0;
  size_t pitch = 0;
  CUresult r = api->cuMemAllocPitch_v2(&p, &pitch, extent.width, extent.height * extent.depth, 4);
  if (r == CUDA_SUCCESS) {
    out->ptr = reinterpret_cast<void*>(p);
    out->pitch = pitch;
    out->xsize = extent.width;
    out->ysize = extent.height;
  }
  return finish(r);
}

RT_API cudaError_t cudaMemset(void* p, int v, size_t n) { return memset_impl(p, v, n, nullptr, false, false); }
RT_API cudaError_t cudaMemset_ptds(void* p, int v, size_t n) { return memset_impl(p, v, n, nullptr, false, true); }
RT_API cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t s) {
  return memset_impl(p, v, n, s, true, false);
}
RT_API cudaError_t cudaMemsetAsync_ptsz(void* p, int v, size_t n, cudaStream_t s) {
  return memset_impl(p, v, n, s, true, true);
}
RT_API cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind k) {
  return memcpy_impl(d, s, n, k, nullptr, false, false);
}
RT_API cudaError_t cudaMemcpy_ptds(void* d, const void* s, size_t n, cudaMemcpyKind k) {
  return memcpy_impl(d, s, n, k, nullptr, false, true);
}
RT_API cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t st) {
  return memcpy_impl(d, s, n, k, st, true, false);
}
RT_API cudaError_t cudaMemcpyAsync_ptsz(void* d, const void* s, size_t n, cudaMemcpyKind k, cudaStream_t st) {
  return memcpy_impl(d, s, n, k, st, true, true);
}

// Pointers the driver does not know are reported as cudaMemoryTypeUnregistered (CUDA >= 11).
RT_API cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  if (attr == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  *attr = cudaPointerAttributes{};
  CUmemorytype type{};
  if (api->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, dp(ptr)) != CUDA_SUCCESS) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    attr->hostPointer = const_cast<void*>(ptr);
    return cudaSuccess;
  }
  unsigned managed = 0;
  int ordinal = 0;
  api->cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, dp(ptr));
  api->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, dp(ptr));
  attr->device = ordinal;
  attr->devicePointer = const_cast<void*>(ptr);
  if (managed != 0) {
    attr->type = cudaMemoryTypeManaged;
    attr->hostPointer = const_cast<void*>(ptr);
  } else if (type == CU_MEMORYTYPE_HOST) {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(ptr);
  } else {
    attr->type = cudaMemoryTypeDevice;
  }
  return cudaSuccess;
}
