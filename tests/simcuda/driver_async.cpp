// Simulated stream-ordered allocator, memory pools, memset and memcpy.
//
// cuMemAllocAsync charges the device immediately (the memory is usable by later work in the
// stream, and we cannot know when the stream "reaches" the allocation in a meaningful way).
// cuMemFreeAsync forgets the pointer at once (a second free fails) but unmaps and uncharges it
// only when the stream reaches the free, so pending work on the stream may still use it.
// Pools have no release threshold / reuse model: freed bytes go straight back to the device.
#include "driver_internal.h"

#include <cstring>

namespace simcuda::drv {
namespace {

CUresult alloc_async(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream h, bool ptsz) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  int dev = s->device;
  if (pool != nullptr) {
    std::lock_guard lock(state().handle_mu);
    if (state().pools.count(pool) == 0) return CUDA_ERROR_INVALID_VALUE;
    dev = pool->device;
  } else {
    pool = &device(dev).default_pool;
  }
  bool captured = false;
  if (CUresult r = capture_stream_use(s, false, &captured); r != CUDA_SUCCESS) return r;
  uintptr_t p = 0;
  CUresult r = alloc_memory(dev, nullptr, size, Kind::async, pool, false, &p);
  // Into a capturing stream: an allocation node of the graph. There are no graphs to launch
  // here, so its memory is simply live from now on, marked as the graph's.
  if (r == CUDA_SUCCESS && captured) mark_graph_allocation(p);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

CUresult free_async(CUdeviceptr p, CUstream h, bool ptsz) {
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  bool captured = false;
  if (CUresult r = capture_stream_use(s, false, &captured); r != CUDA_SUCCESS) return r;
  Allocation a;
  // "During stream capture, this function results in the creation of a free node and must
  // therefore be passed the address of a graph allocation" (cuMemFreeAsync).
  if (captured && (!find_allocation(p, &a) || a.base != p || !a.graph)) return CUDA_ERROR_INVALID_VALUE;
  if (take_allocation(p, {Kind::async, Kind::device, Kind::pitch, Kind::managed}, &a) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  if (captured) {  // the free node: no graph is ever launched here, so it is freed now
    release_allocation(a);
    return CUDA_SUCCESS;
  }
  enqueue(
      s, [a] { release_allocation(a); }, /*trivial=*/true);
  return CUDA_SUCCESS;
}

CUresult memset_async(CUdeviceptr dst, unsigned char v, size_t n, CUstream h, bool ptsz, bool sync) {
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  bool captured = false;  // captured, not run (driver_capture.cpp)
  if (CUresult r = capture_stream_use(s, false, &captured); r != CUDA_SUCCESS || captured) return r;
  if (n == 0) return CUDA_SUCCESS;
  if (!range_is_known(dst, n)) return CUDA_ERROR_INVALID_VALUE;
  uint64_t seq = enqueue(
      s, [dst, v, n] { std::memset(reinterpret_cast<void*>(dst), v, n); }, false);
  if (sync) wait_stream(s, seq);
  return CUDA_SUCCESS;
}

// Unified addressing: any pointer may be host memory, so only null pointers are rejected.
CUresult memcpy_async(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h, bool ptsz, bool sync) {
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  bool captured = false;  // captured, not run (driver_capture.cpp)
  if (CUresult r = capture_stream_use(s, false, &captured); r != CUDA_SUCCESS || captured) return r;
  if (n == 0) return CUDA_SUCCESS;
  if (dst == 0 || src == 0) return CUDA_ERROR_INVALID_VALUE;
  uint64_t seq = enqueue(
      s, [dst, src, n] { std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), n); }, false);
  if (sync) wait_stream(s, seq);
  return CUDA_SUCCESS;
}

CUdeviceptr dp(const void* p) { return reinterpret_cast<CUdeviceptr>(p); }

}  // namespace
}  // namespace simcuda::drv

using namespace simcuda::drv;

SIM_API CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t size, CUstream h) {
  SIM_COUNT("cuMemAllocAsync");
  return alloc_async(dptr, size, nullptr, h, false);
}
SIM_API CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t size, CUstream h) {
  SIM_COUNT("cuMemAllocAsync_ptsz");
  return alloc_async(dptr, size, nullptr, h, true);
}
SIM_API CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream h) {
  SIM_COUNT("cuMemAllocFromPoolAsync");
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return alloc_async(dptr, size, pool, h, false);
}
SIM_API CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t size, CUmemoryPool pool, CUstream h) {
  SIM_COUNT("cuMemAllocFromPoolAsync_ptsz");
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return alloc_async(dptr, size, pool, h, true);
}
SIM_API CUresult cuMemFreeAsync(CUdeviceptr p, CUstream h) {
  SIM_COUNT("cuMemFreeAsync");
  return free_async(p, h, false);
}
SIM_API CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream h) {
  SIM_COUNT("cuMemFreeAsync_ptsz");
  return free_async(p, h, true);
}

SIM_API CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  SIM_COUNT("cuDeviceGetDefaultMemPool");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *pool = &device(dev).default_pool;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  SIM_COUNT("cuMemPoolCreate");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (props->allocType != CU_MEM_ALLOCATION_TYPE_PINNED || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(props->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  auto* p = new CUmemPoolHandle_st();
  p->device = props->location.id;
  std::lock_guard lock(state().handle_mu);
  state().pools.insert(p);
  *pool = p;
  return CUDA_SUCCESS;
}

// Allocations still live from the pool stay valid (freed by cuMemFreeAsync/cuMemFree later).
SIM_API CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  SIM_COUNT("cuMemPoolDestroy");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(state().handle_mu);
  if (pool == nullptr || pool->is_default || state().pools.erase(pool) == 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;  // the handle object is leaked on purpose: allocations still point at it
}

// cuMemsetD8 is asynchronous on a real GPU for device memory; the simulator waits for it so
// host code reading managed/host memory right after sees the result.
SIM_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
  SIM_COUNT("cuMemsetD8_v2");
  return memset_async(dst, v, n, nullptr, false, true);
}
SIM_API CUresult cuMemsetD8_v2_ptds(CUdeviceptr dst, unsigned char v, size_t n) {
  SIM_COUNT("cuMemsetD8_v2_ptds");
  return memset_async(dst, v, n, nullptr, true, true);
}
SIM_API CUresult cuMemsetD8(CUdeviceptr_v1 dst, unsigned char v, unsigned int n) { return cuMemsetD8_v2(dst, v, n); }
SIM_API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream h) {
  SIM_COUNT("cuMemsetD8Async");
  return memset_async(dst, v, n, h, false, false);
}
SIM_API CUresult cuMemsetD8Async_ptsz(CUdeviceptr dst, unsigned char v, size_t n, CUstream h) {
  SIM_COUNT("cuMemsetD8Async_ptsz");
  return memset_async(dst, v, n, h, true, false);
}

SIM_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  SIM_COUNT("cuMemcpy");
  return memcpy_async(dst, src, n, nullptr, false, true);
}
SIM_API CUresult cuMemcpy_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  SIM_COUNT("cuMemcpy_ptds");
  return memcpy_async(dst, src, n, nullptr, true, true);
}
SIM_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  SIM_COUNT("cuMemcpyAsync");
  return memcpy_async(dst, src, n, h, false, false);
}
SIM_API CUresult cuMemcpyAsync_ptsz(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream h) {
  SIM_COUNT("cuMemcpyAsync_ptsz");
  return memcpy_async(dst, src, n, h, true, false);
}
SIM_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  SIM_COUNT("cuMemcpyHtoD_v2");
  return memcpy_async(dst, dp(src), n, nullptr, false, true);
}
SIM_API CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dst, const void* src, size_t n) {
  SIM_COUNT("cuMemcpyHtoD_v2_ptds");
  return memcpy_async(dst, dp(src), n, nullptr, true, true);
}
SIM_API CUresult cuMemcpyHtoD(CUdeviceptr_v1 dst, const void* src, unsigned int n) {
  return cuMemcpyHtoD_v2(dst, src, n);
}
SIM_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  SIM_COUNT("cuMemcpyDtoH_v2");
  return memcpy_async(dp(dst), src, n, nullptr, false, true);
}
SIM_API CUresult cuMemcpyDtoH_v2_ptds(void* dst, CUdeviceptr src, size_t n) {
  SIM_COUNT("cuMemcpyDtoH_v2_ptds");
  return memcpy_async(dp(dst), src, n, nullptr, true, true);
}
SIM_API CUresult cuMemcpyDtoH(void* dst, CUdeviceptr_v1 src, unsigned int n) { return cuMemcpyDtoH_v2(dst, src, n); }
SIM_API CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  SIM_COUNT("cuMemcpyDtoD_v2");
  return memcpy_async(dst, src, n, nullptr, false, true);
}
SIM_API CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  SIM_COUNT("cuMemcpyDtoD_v2_ptds");
  return memcpy_async(dst, src, n, nullptr, true, true);
}
SIM_API CUresult cuMemcpyDtoD(CUdeviceptr_v1 dst, CUdeviceptr_v1 src, unsigned int n) {
  return cuMemcpyDtoD_v2(dst, src, n);
}
