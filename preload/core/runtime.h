// The internal C++ API behind the extern "C" interposers (interpose.cpp holds all of those,
// each a few lines over this). Nothing here throws; every path that cannot do its job
// passes the call straight to the real CUDA function.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "format/trace.h"
#include "preload/core/options.h"
#include "preload/core/stats.h"  // gpuheap_stats / gpuheap_reset_peak

namespace gpuheap {
namespace preload {

// ---- recursion guard ----
// cudart's cudaMalloc calls cuMemAlloc_v2 underneath (through the pointers it got from our
// cuGetProcAddress), and our pool grows through the driver: one user call must be recorded
// once, so an interposer entered while another is active on this thread passes through.
extern constinit thread_local int t_hook_depth;

class HookScope {
 public:
  HookScope() noexcept : outer_(t_hook_depth++ == 0) {}
  ~HookScope() { --t_hook_depth; }
  HookScope(const HookScope&) = delete;
  HookScope& operator=(const HookScope&) = delete;
  // True when this is the outermost hook on the thread and gpuheap is active.
  bool active() const noexcept;

 private:
  bool outer_;
};

// ---- settings (environment, read once at load: options.h) ----
const Settings& settings() noexcept;

// ---- pooled device memory (cudaMalloc / cuMemAlloc_v2) ----
cudaError_t rt_malloc(void** ptr, std::size_t size) noexcept;
cudaError_t rt_free(void* ptr) noexcept;
CUresult drv_mem_alloc(CUdeviceptr* ptr, std::size_t size) noexcept;
CUresult drv_mem_free(CUdeviceptr ptr) noexcept;
// Stream-ordered frees (cudaFreeAsync, cuMemFreeAsync; per_thread: their _ptsz variants,
// where stream 0 is the calling thread's default stream). Pool memory goes back to the pool
// (reusable by other streams once the work queued on `stream` before the free is done);
// anything else is recorded and passed on.
cudaError_t rt_free_async(void* ptr, cudaStream_t stream, bool per_thread) noexcept;
CUresult drv_mem_free_async(CUdeviceptr ptr, CUstream stream, bool per_thread) noexcept;
cudaError_t rt_mem_get_info(std::size_t* free, std::size_t* total) noexcept;
CUresult drv_mem_get_info(std::size_t* free, std::size_t* total) noexcept;

// ---- pass-through allocations: recorded, never pooled ----
// Where a pass-through allocation's memory lives, i.e. which device's cap it is charged to
// (host_pinned memory: none). cudaMallocAsync allocates on the stream's device, a pool
// allocation on the pool's device (CUDA Runtime API, cudaMallocFromPoolAsync), cuMemCreate
// on prop->location (CUDA Driver API, cuMemCreate); everything else on the current device.
struct DeviceOf {
  enum What : std::uint8_t { current, stream, mempool, prop } what = current;
  const void* obj = nullptr;  // the CUstream, CUmemoryPool or CUmemAllocationProp*
};

// One pass-through allocation. The constructor charges `size` to its device's cap before
// the real call (reserve, then allocate: concurrent callers can never overshoot
// GPUHEAP_LIMIT); over the cap even after the pool released its cache, ok() is false and
// the OOM is recorded and reported (the caller answers with the API's out-of-memory error).
// commit() after the real call succeeded records the allocation and keeps the charge,
// adjusted to the size the driver really handed out; without commit it is rolled back.
class PassAlloc {
 public:
  // runtime: a cuda* call (which binds the primary context itself if the thread has none).
  PassAlloc(format::AllocKind kind, DeviceOf where, std::size_t size, bool runtime) noexcept;
  ~PassAlloc();
  PassAlloc(const PassAlloc&) = delete;
  PassAlloc& operator=(const PassAlloc&) = delete;
  bool ok() const noexcept { return ok_; }
  void commit(const void* ptr, std::size_t requested, std::size_t size, std::uint64_t stream) noexcept;

 private:
  format::AllocKind kind_;
  int device_ = -1;
  std::int64_t charged_ = 0;
  bool ok_ = true;
  bool committed_ = false;
};

// Records a free before the real free runs (so the address cannot be handed out again in
// between); `kind` is the caller's family, refined from the allocation registry. A VMM
// handle released while still mapped stays held (and charged) until its last cuMemUnmap:
// the memory is freed only then (CUDA Driver API, cuMemRelease).
void note_free(format::AllocKind kind, const void* ptr, std::uint64_t stream) noexcept;
// cuMemUnmap(ptr, size), before the real call: frees every mapping in the range.
void note_unmap(CUdeviceptr ptr, std::size_t size) noexcept;
// cuMemMap succeeded: the mapping refers to `handle`.
void note_map(CUdeviceptr ptr, std::size_t size, CUmemGenericAllocationHandle handle) noexcept;
// cuMemPoolCreate succeeded: remember the pool's device.
void note_mempool_created(CUmemoryPool pool, const CUmemPoolProps* props) noexcept;

// A cap (not the driver) refused a runtime allocation: the runtime itself must record the
// error for cudaGetLastError, as for a real failure. Asks it for an allocation no device can
// satisfy (inside a HookScope: nothing recorded) and returns cudaErrorMemoryAllocation.
cudaError_t latch_runtime_oom() noexcept;

// Fork child: forget the parent's pass-through registry without taking its locks.
void registry_reset_in_child() noexcept;

// ---- streams (for the pool's fences) ----
void note_stream_created(CUstream s) noexcept;
// Before the real destroy: fences the stream's pending frees while it is still known.
void note_stream_destroyed(CUstream s) noexcept;

// ---- context teardown ----
// Before the real call destroys ctx (cuCtxDestroy) or the primary context of `device`
// (cudaDeviceReset, cuDevicePrimaryCtxReset): its memory goes with it, so its pool and
// pass-through entries are dropped without freeing anything through the driver, recorded
// as frees (and segment_free), and uncharged from the cap. only_if_current: only when the
// primary context is the current one (device -1: the current device) (cudaDeviceReset with another context current
// resets only the runtime's state). Unscoped: the runtime reaches the driver's reset from
// inside cudaDeviceReset.
void note_context_destroyed(CUcontext ctx) noexcept;
// cuCtxDestroy, before the real call: note_context_destroyed, unless ctx is a primary
// context (which the driver refuses to destroy) or holds nothing gpuheap tracks.
void note_context_destroy(CUcontext ctx) noexcept;
void note_primary_reset(int device, bool only_if_current) noexcept;

// ---- lookups that can hand out driver/runtime functions ----
void* hooked_dlsym(void* handle, const char* name, const void* caller) noexcept;
// After a successful cuGetProcAddress/cudaGetDriverEntryPoint: returns the pointer to hand
// back (our wrapper for the exact versioned function the driver resolved, else `real`).
void* substitute_proc(const char* symbol, int cuda_version, std::uint64_t flags, void* real) noexcept;

// ---- C API helpers ----
std::size_t empty_cache_all(format::EmptyCacheReason reason) noexcept;

}  // namespace preload
}  // namespace gpuheap
