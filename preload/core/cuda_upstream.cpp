#include "preload/core/cuda_upstream.h"

#include <time.h>

#include <atomic>
#include <new>

#include <algorithm>

#include "preload/core/limits.h"
#include "preload/core/runtime.h"
#include "preload/hooks/real.h"

namespace gpuheap {
namespace preload {

void StreamRegistry::add(CUcontext ctx, CUstream s) noexcept {
  if (!s) return;
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& e : streams_)
    if (e.second == s) {
      e.first = ctx;  // a destroyed stream's handle can be reused
      return;
    }
  streams_.emplace_back(ctx, s);
}

void StreamRegistry::remove(CUstream s) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = std::find_if(streams_.begin(), streams_.end(), [&](auto& e) { return e.second == s; });
  if (it != streams_.end()) {
    *it = streams_.back();
    streams_.pop_back();
  }
}

std::unique_lock<std::mutex> StreamRegistry::streams_of(CUcontext ctx, std::vector<CUstream>& out) noexcept {
  out.clear();
  std::unique_lock<std::mutex> lk(mu_);
  for (auto& e : streams_)
    if (e.first == ctx) out.push_back(e.second);
  return lk;
}

void StreamRegistry::remove_context(CUcontext ctx) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  streams_.erase(std::remove_if(streams_.begin(), streams_.end(), [&](auto& e) { return e.first == ctx; }),
                 streams_.end());
}

CUcontext StreamRegistry::ctx_of(CUstream s) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& e : streams_)
    if (e.second == s) return e.first;
  return nullptr;
}

void StreamRegistry::forget_all() noexcept {
  // Called in a fork child: another parent thread may have held mu_ (or been inside
  // push_back) at the fork, so nothing here may lock or trust the vector; start afresh
  // (the old buffer is leaked, once per fork).
  new (this) StreamRegistry();
}

namespace {
std::atomic<bool> g_per_thread_seen{false};
}
void note_per_thread_streams() noexcept { g_per_thread_seen.store(true, std::memory_order_relaxed); }
bool per_thread_streams_seen() noexcept { return g_per_thread_seen.load(std::memory_order_relaxed); }
bool strict_fences() noexcept { return settings().strict_fences; }

namespace {
std::atomic<int> g_captures{0};
}
CUresult note_capture_begin(CUresult rc) noexcept {
  if (rc == CUDA_SUCCESS) g_captures.fetch_add(1, std::memory_order_acq_rel);
  return rc;
}
CUresult note_capture_end(CUresult rc) noexcept {
  // An invalidated capture ends too, with a NULL graph (cuStreamEndCapture); other errors
  // (not capturing, the wrong thread) end nothing.
  if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) return rc;
  int n = g_captures.load(std::memory_order_relaxed);
  while (n > 0 && !g_captures.compare_exchange_weak(n, n - 1, std::memory_order_acq_rel)) {
  }
  return rc;
}
bool captures_active() noexcept { return g_captures.load(std::memory_order_acquire) > 0; }

void note_free_stream(CUcontext ctx, CUstream s, bool per_thread) noexcept {
  // Per-thread default streams are not ordered with each other: events on the legacy
  // stream (which waits for every blocking stream) are needed from now on.
  if (s == CU_STREAM_PER_THREAD || (per_thread && !s)) return note_per_thread_streams();
  if (!s || s == CU_STREAM_LEGACY) return;  // the legacy stream: fences cover it already
  // A stream gpuheap did not see created: fenced from now on like the others (removed at
  // its cudaStreamDestroy; recording on a stream destroyed behind our back just fails).
  if (!stream_registry().ctx_of(s)) stream_registry().add(ctx, s);
}

StreamRegistry& stream_registry() noexcept {
  static StreamRegistry* r = new StreamRegistry;  // leaked: usable from exit handlers
  return *r;
}

ContextScope::ContextScope(CUcontext ctx) noexcept {
  auto get = real<Fn::cuCtxGetCurrent>();
  auto set = real<Fn::cuCtxSetCurrent>();
  if (!get || !set || get(&prev_) != CUDA_SUCCESS || prev_ == ctx) return;
  switched_ = set(ctx) == CUDA_SUCCESS;
}

ContextScope::~ContextScope() {
  if (switched_) real<Fn::cuCtxSetCurrent>()(prev_);
}

void* CudaUpstream::allocate(std::size_t bytes) noexcept {
  auto fn = real<Fn::cuMemAlloc_v2>();
  DeviceBudget* b = budget(device_);
  if (!fn || !b) return nullptr;
  // The per-process cap (GPUHEAP_LIMIT) is enforced where memory is taken from the driver:
  // a segment that would take the process over it fails like a real out-of-memory, so the
  // pool's release-and-retry path and the OOM report run exactly as on a full device.
  std::int64_t add = 0;
  if (!b->try_charge(bytes, device_limit(device_), &add)) return nullptr;
  CUdeviceptr p = 0;
  bool ok;
  {
    ContextScope scope(ctx_);
    ok = fn(&p, bytes) == CUDA_SUCCESS;
  }
  if (!ok) {
    b->charge(-add);
    return nullptr;
  }
  return reinterpret_cast<void*>(p);
}

void CudaUpstream::deallocate(void* p, std::size_t bytes) noexcept {
  auto fn = real<Fn::cuMemFree_v2>();
  if (!fn) return;
  {
    ContextScope scope(ctx_);
    fn(reinterpret_cast<CUdeviceptr>(p));
  }
  if (DeviceBudget* b = budget(device_)) b->charge(-static_cast<std::int64_t>(bytes));
}

void CudaUpstream::forget(std::size_t bytes) noexcept {
  fences_.clear();
  spare_events_.clear();
  if (DeviceBudget* b = budget(device_)) b->charge(-static_cast<std::int64_t>(bytes));
}

CUevent CudaUpstream::take_event() noexcept {
  if (!spare_events_.empty()) {
    CUevent e = spare_events_.back();
    spare_events_.pop_back();
    return e;
  }
  CUevent e = nullptr;
  auto create = real<Fn::cuEventCreate>();
  // Timing off: cheaper to record and query (CUDA Driver API, cuEventCreate).
  if (!create || create(&e, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) return nullptr;
  return e;
}

namespace {
// Whether work on the legacy stream would now join a capture: a blocking stream the registry
// does not hold (a per-thread default stream) may be capturing. Asked of the driver only while
// a capture is in progress: "if this is called on CU_STREAM_LEGACY while a blocking stream in
// the same context is capturing, it will return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT"
// (cuStreamIsCapturing), without touching the capture.
bool legacy_capture_implicit(decltype(real<Fn::cuStreamIsCapturing>()) capturing) noexcept {
  if (!capturing || !captures_active()) return false;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  return capturing(CU_STREAM_LEGACY, &cs) != CUDA_SUCCESS || cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

bool capture_in_progress(const std::vector<CUstream>& streams,
                         decltype(real<Fn::cuStreamIsCapturing>()) capturing) noexcept {
  if (!capturing) return false;
  for (CUstream st : streams) {
    CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
    if (capturing(st, &cs) == CUDA_SUCCESS && cs != CU_STREAM_CAPTURE_STATUS_NONE) return true;
  }
  return legacy_capture_implicit(capturing);
}
}  // namespace

pool::Upstream::Fence CudaUpstream::fence_record() noexcept {
  auto record = real<Fn::cuEventRecord>();
  auto capturing = real<Fn::cuStreamIsCapturing>();
  ContextScope scope(ctx_);
  FenceSlot* s = nullptr;
  for (auto& f : fences_)
    if (f.id == 0) {
      s = &f;
      break;
    }
  if (!s) s = &fences_.emplace_back();
  s->id = next_fence_++;
  s->events.clear();
  // Held while recording: a concurrent cudaStreamDestroy waits in remove() until the
  // events are recorded (lock order: pool lock, then registry lock).
  auto registry_lock = stream_registry().streams_of(ctx_, scratch_streams_);
  // A context whose work all goes to the legacy default stream is one FIFO queue: work
  // enqueued after a block is handed out again runs after the work enqueued before its
  // free, so no event is needed (PyTorch's allocator relies on the same stream order).
  // Any stream created through us, or any sign of per-thread default streams (whose work
  // is not ordered with other threads' per-thread streams), turns the events back on.
  if (scratch_streams_.empty() && !per_thread_streams_seen() && !strict_fences()) return s->id;
  // While a stream of the context captures, no complete fence can be recorded: a capturing
  // stream runs nothing new (an event recorded there would be a node of the user's graph,
  // and a query of it CUDA_ERROR_CAPTURED_EVENT), and an event on the legacy stream beside a
  // capturing blocking stream invalidates the user's capture (cudaErrorStreamCaptureImplicit,
  // CUDA Programming Guide, stream capture). Work queued there before the capture may still
  // run, so the blocks stay pending (fence 0) until a fence after the capture covers them.
  if (capture_in_progress(scratch_streams_, capturing)) {
    s->id = 0;
    return 0;
  }
  // The legacy default stream, last: an event there also waits for all blocking streams.
  scratch_streams_.push_back(nullptr);
  for (CUstream st : scratch_streams_) {
    CUevent e = take_event();
    if (!e || !record) continue;
    if (record(e, st) == CUDA_SUCCESS) s->events.push_back(e);
    else put_event(e);  // e.g. a stream destroyed behind our back: nothing to wait for there
  }
  return s->id;
}

CudaUpstream::FenceSlot* CudaUpstream::slot(Fence f) noexcept {
  for (auto& s : fences_)
    if (s.id == f) return &s;
  return nullptr;
}

bool CudaUpstream::poll(FenceSlot& s) noexcept {
  auto query = real<Fn::cuEventQuery>();
  while (!s.events.empty()) {
    CUresult rc = query ? query(s.events.back()) : CUDA_SUCCESS;
    if (rc == CUDA_ERROR_NOT_READY) return false;
    // Success, or an error (a faulted context never completes work): either way there is
    // nothing left to wait for on this event.
    put_event(s.events.back());
    s.events.pop_back();
  }
  return true;
}

bool CudaUpstream::fence_done(Fence f) noexcept {
  FenceSlot* s = slot(f);
  if (!s) return true;
  ContextScope scope(ctx_);
  return poll(*s);
}

void CudaUpstream::fence_wait(Fence f) noexcept {
  FenceSlot* s = slot(f);
  if (!s) return;
  ContextScope scope(ctx_);
  auto sync = real<Fn::cuEventSynchronize>();
  for (CUevent e : s->events)
    if (sync) sync(e);
  poll(*s);
}

void CudaUpstream::fence_release(Fence f) noexcept {
  FenceSlot* s = slot(f);
  if (!s) return;
  for (CUevent e : s->events) put_event(e);  // still pending events are re-recorded later
  s->events.clear();
  s->id = 0;
}

std::uint64_t CudaUpstream::now_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace preload
}  // namespace gpuheap
