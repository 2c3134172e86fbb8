// The internal C++ API behind the extern "C" interposers (interpose.cpp holds all of those,
// each a few lines over this). Nothing here throws; every path that cannot do its job
// passes the call straight to the real CUDA function.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "format/trace.h"

namespace gpuheap {
namespace detail {

// ---- recursion guard ----
// cudart's cudaMalloc calls cuMemAlloc_v2 underneath (through the pointers it got from our
// cuGetProcAddress), and our pool grows through the driver: one user call must be recorded
// once, so an interposer entered while another is active on this thread passes through.
extern thread_local int t_hook_depth;

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

// ---- settings (environment, read once at load) ----
struct Settings {
  bool enabled = true;       // false: setuid, GPUHEAP_DISABLE=1, or after fork without follow
  bool pool = true;          // GPUHEAP_POOL (default 1)
  bool free_stacks = false;  // GPUHEAP_FREE_STACKS: also unwind at frees (default 0)
  bool unsafe_reuse = false; // GPUHEAP_UNSAFE_REUSE=1: TEST ONLY, reuse without fences
  std::uint64_t seal_ns = 200000;  // GPUHEAP_SEAL_US
  std::size_t release_threshold = 0;  // GPUHEAP_RELEASE_THRESHOLD: trim cache above this
};
const Settings& settings() noexcept;

// ---- pooled device memory (cudaMalloc / cuMemAlloc_v2) ----
cudaError_t rt_malloc(void** ptr, std::size_t size) noexcept;
cudaError_t rt_free(void* ptr) noexcept;
CUresult drv_mem_alloc(CUdeviceptr* ptr, std::size_t size) noexcept;
CUresult drv_mem_free(CUdeviceptr ptr) noexcept;
cudaError_t rt_mem_get_info(std::size_t* free, std::size_t* total) noexcept;
CUresult drv_mem_get_info(std::size_t* free, std::size_t* total) noexcept;

// ---- pass-through allocations: recorded, never pooled ----
// Records an allocation that the real function already made (call only on success).
void note_alloc(format::AllocKind kind, const void* ptr, std::size_t requested, std::size_t size,
                std::uint64_t stream) noexcept;
// Records a free before the real free runs (so the address cannot be handed out again in
// between); `kind` is the caller's family, refined from the allocation registry.
void note_free(format::AllocKind kind, const void* ptr, std::uint64_t stream) noexcept;

// Cap check for a pass-through allocation of `size` bytes of `kind` on the current device:
// over GPUHEAP_LIMIT even after releasing the pool's cache -> records the OOM, reports it
// and returns false (the caller answers with the API's out-of-memory error).
bool admit(format::AllocKind kind, std::size_t size) noexcept;

// A cap (not the driver) refused a runtime allocation: the runtime itself must record the
// error for cudaGetLastError, as for a real failure. Asks it for an allocation no device can
// satisfy (inside a HookScope: nothing recorded) and returns cudaErrorMemoryAllocation.
cudaError_t latch_runtime_oom() noexcept;

// Fork child: forget the parent's pass-through registry without taking its locks.
void registry_reset_in_child() noexcept;

// ---- streams (for the pool's fences) ----
void note_stream_created(CUstream s) noexcept;
void note_stream_destroyed(CUstream s) noexcept;

// ---- lookups that can hand out driver/runtime functions ----
void* hooked_dlsym(void* handle, const char* name, const void* caller) noexcept;
// After a successful cuGetProcAddress/cudaGetDriverEntryPoint: returns the pointer to hand
// back (our wrapper for the exact versioned function the driver resolved, else `real`).
void* substitute_proc(const char* symbol, int cuda_version, std::uint64_t flags, void* real) noexcept;

// ---- C API helpers ----
std::size_t empty_cache_all(format::EmptyCacheReason reason) noexcept;

}  // namespace detail
}  // namespace gpuheap
