// The pool's upstream on a real (or simulated) GPU: segments from cuMemAlloc_v2, fences from
// events recorded on every stream of the context that gpuheap has seen created, plus the
// legacy default stream. Called with the owning pool's lock held.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "pool/pool.h"

namespace gpuheap {
namespace preload {

// Streams created through our hooks, per context. Fences record an event on each.
class StreamRegistry {
 public:
  void add(CUcontext ctx, CUstream s) noexcept;
  void remove(CUstream s) noexcept;
  // Copies the streams of ctx into out (cleared first). The returned lock keeps the
  // registry locked while the caller uses them: remove() (called before the real destroy)
  // waits, so no event is ever recorded on a stream already destroyed.
  std::unique_lock<std::mutex> streams_of(CUcontext ctx, std::vector<CUstream>& out) noexcept;
  // The context of a stream created through us (nullptr if unknown).
  CUcontext ctx_of(CUstream s) noexcept;
  void remove_context(CUcontext ctx) noexcept;  // its streams died with it
  void forget_all() noexcept;                   // after fork: the child's CUDA state is not the parent's

 private:
  std::mutex mu_;
  std::vector<std::pair<CUcontext, CUstream>> streams_;
};
StreamRegistry& stream_registry() noexcept;

// Per-thread default streams in use (a _ptsz/_ptds entry point was looked up or called):
// then even a context without created streams needs event fences.
void note_per_thread_streams() noexcept;
bool per_thread_streams_seen() noexcept;
// A stream-ordered free into the pool of ctx on stream s (per_thread: through a _ptsz
// entry point): from now on the pool's fences cover s, so the block is reused by other
// streams only after the work queued on s before the free.
void note_free_stream(CUcontext ctx, CUstream s, bool per_thread) noexcept;
// Stream captures in progress anywhere in the process (cuStreamBeginCapture_v2 that succeeded,
// less cuStreamEndCapture that ended one). While any is, allocation and free may be
// "potentially unsafe" calls the driver refuses on this thread (CUDA Programming Guide, stream
// capture; cuThreadExchangeStreamCaptureMode), which the pool would never make: the callers
// let the driver answer instead. Each returns rc.
CUresult note_capture_begin(CUresult rc) noexcept;
CUresult note_capture_end(CUresult rc) noexcept;
bool captures_active() noexcept;
// The capture errors, the same numbers in the runtime and the driver API (900..908).
inline bool is_capture_error(int rc) noexcept {
  return rc >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && rc <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
}
// GPUHEAP_STRICT_FENCES (read at load): always fence with events, even for
// legacy-stream-only programs.
bool strict_fences() noexcept;

class CudaUpstream final : public pool::Upstream {
 public:
  CudaUpstream(CUcontext ctx, int device) noexcept : ctx_(ctx), device_(device) {}
  void* allocate(std::size_t bytes) noexcept override;
  void deallocate(void* p, std::size_t bytes) noexcept override;
  Fence fence_record() noexcept override;
  bool fence_done(Fence f) noexcept override;
  void fence_wait(Fence f) noexcept override;
  void fence_release(Fence f) noexcept override;
  std::uint64_t now_ns() noexcept override;

  CUcontext context() const noexcept { return ctx_; }
  // The context was destroyed with `bytes` of segments: its events are gone (never query
  // or destroy them again) and the bytes leave the cap accounting.
  void forget(std::size_t bytes) noexcept;
  int device() const noexcept { return device_; }

 private:
  struct FenceSlot {
    std::uint64_t id = 0;
    std::vector<CUevent> events;  // not yet known complete
  };
  FenceSlot* slot(Fence f) noexcept;
  CUevent take_event() noexcept;
  void put_event(CUevent e) noexcept { spare_events_.push_back(e); }
  // Drops completed events of the slot; true when none remain.
  bool poll(FenceSlot& s) noexcept;

  CUcontext ctx_;
  int device_;
  std::uint64_t next_fence_ = 1;
  std::vector<FenceSlot> fences_;
  std::vector<CUevent> spare_events_;
  std::vector<CUstream> scratch_streams_;
};

// Makes ctx current on this thread for the scope (the pool may be driven from a thread whose
// current context is another device's, e.g. a free of a block from another device).
class ContextScope {
 public:
  explicit ContextScope(CUcontext ctx) noexcept;
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

 private:
  CUcontext prev_ = nullptr;
  bool switched_ = false;
};

}  // namespace preload
}  // namespace gpuheap
