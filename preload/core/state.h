// Per-context pool state shared by the allocation paths (alloc.cpp) and set-up (runtime.cpp).
#pragma once

#include <cuda.h>

#include <atomic>

#include "pool/pool.h"
#include "preload/core/contexts.h"
#include "preload/core/cuda_upstream.h"

namespace gpuheap {
namespace preload {

// Pool observer that turns pool events into trace records for one device.
class TraceObserver final : public pool::PoolObserver {
 public:
  explicit TraceObserver(int device) noexcept : device_(device) {}
  void on_segment_alloc(void* ptr, std::size_t size, bool small) noexcept override;
  void on_segment_free(void* ptr, std::size_t size, bool small) noexcept override;
  void on_free_completed(void* ptr, std::size_t size) noexcept override;
  void on_retry(std::size_t requested) noexcept override;
  void on_empty_cache(std::size_t released, format::EmptyCacheReason reason) noexcept override;

 private:
  int device_;
};

// One per CUDA context gpuheap has served (contexts, not devices: memory of one context is
// not usable in another, even on the same device). Never destroyed: CUDA must not be called
// from static destructors after main.
struct ContextState {
  CUcontext ctx = nullptr;
  int device = 0;
  // The context was destroyed (its pool abandoned). The driver hands the same CUcontext
  // value to a later cuCtxCreate, possibly on another device: lookups by handle skip a
  // retired state, and only a new context on the same device takes it back.
  std::atomic<bool> retired{false};
  CudaUpstream upstream;
  TraceObserver observer;
  pool::Pool pool;
  ContextState(CUcontext c, int dev, const pool::PoolConfig& cfg) noexcept
      : ctx(c), device(dev), upstream(c, dev), observer(dev), pool(upstream, cfg, &observer) {}
};

// The table of every state created so far (contexts.h). Lookups by context handle go
// through its live states; lookups by pointer or by stream may visit retired ones too.
using ContextTable = BasicContextTable<ContextState>;
ContextTable& contexts() noexcept;

// State for the calling thread's current context; nullptr when there is none (or the pool
// is off). Creates it on first use (or revives a retired one: contexts.h).
ContextState* current_state() noexcept;
// The device ordinal of the current context (-1 if none).
int current_device() noexcept;

}  // namespace preload
}  // namespace gpuheap
