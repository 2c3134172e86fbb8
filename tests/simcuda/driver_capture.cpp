// Stream capture, as far as an allocator interposed under it can get it wrong (cuda.h,
// cuStreamBeginCapture and cuThreadExchangeStreamCaptureMode; CUDA C++ Programming Guide,
// "CUDA Graphs" > "Creating a Graph Using Stream Capture" > "Prohibited and Unhandled
// Operations" and "Invalidation"):
//
// * Work pushed into a capturing stream is not run but captured (here: dropped; there are no
//   graphs, cuStreamEndCapture hands back a placeholder graph that is only non-null). An event
//   recorded there becomes a captured event: cuEventQuery / cuEventSynchronize on it return
//   CUDA_ERROR_CAPTURED_EVENT and invalidate that capture.
// * Potentially unsafe calls (allocation and free of memory, synchronizing or querying events,
//   streams, the context) are prohibited on a thread whose capture mode is GLOBAL while this
//   thread has a non-RELAXED capture or another thread a GLOBAL one, or THREAD_LOCAL while
//   this thread has a non-RELAXED capture: they return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
//   and invalidate the captures that prohibited them. RELAXED threads may make them.
// * Work on (or a synchronize of) the legacy stream while a blocking stream of the device
//   captures returns CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and invalidates those captures;
//   synchronizing or querying a capturing stream returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
//   and invalidates its capture; cuCtxSynchronize while any stream of the device captures too.
// * cuStreamEndCapture of an invalidated capture returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
//   with a NULL graph and ends the capture; a non-RELAXED capture must end on its thread
//   (CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD).
// simcuda_capture_violations() counts the captures invalidated by a refused call (test
// control): whether a program's captures fail as they would without an interposer.
#include "driver_internal.h"
#include "simcuda.h"

#include <algorithm>
#include <thread>

namespace simcuda::drv {
namespace {

struct Capture {
  CUstream_st* stream = nullptr;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  std::thread::id thread;
  uint64_t id = 0;
  bool invalidated = false;
};

std::mutex g_mu;
std::vector<Capture> g_captures;  // guarded by g_mu
std::atomic<int> g_active{0};     // g_captures.size(), read without the lock on every gated call
std::atomic<uint64_t> g_violations{0};
uint64_t g_next_id = 1;
thread_local CUstreamCaptureMode t_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
struct PlaceholderGraph {
  int unused = 0;
} g_graph;

Capture* find_locked(CUstream_st* s) {
  for (Capture& c : g_captures)
    if (c.stream == s) return &c;
  return nullptr;
}

// Whether capture c makes a potentially unsafe call on this thread (in mode t_mode) illegal.
bool prohibits(const Capture& c) {
  if (t_mode == CU_STREAM_CAPTURE_MODE_RELAXED || c.mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  if (c.thread == std::this_thread::get_id()) return true;
  return t_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

// Counted once per capture (simcuda_capture_violations): further refused calls change nothing.
void invalidate(Capture& c) {
  if (!c.invalidated) g_violations.fetch_add(1, std::memory_order_relaxed);
  c.invalidated = true;
}

CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptsz) {
  if (mode != CU_STREAM_CAPTURE_MODE_GLOBAL && mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
      mode != CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  if (s->legacy) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // "may not be initiated if stream is CU_STREAM_LEGACY"
  std::lock_guard lock(g_mu);
  if (find_locked(s)) return CUDA_ERROR_ILLEGAL_STATE;  // "only if the stream is not already in capture mode"
  g_captures.push_back({s, mode, std::this_thread::get_id(), g_next_id++, false});
  g_active.store(static_cast<int>(g_captures.size()), std::memory_order_release);
  return CUDA_SUCCESS;
}

CUresult end_capture(CUstream h, CUgraph* graph, bool ptsz) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(g_mu);
  Capture* c = find_locked(s);
  if (!c) return CUDA_ERROR_ILLEGAL_STATE;
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->thread != std::this_thread::get_id())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  bool invalidated = c->invalidated;
  *c = g_captures.back();
  g_captures.pop_back();
  g_active.store(static_cast<int>(g_captures.size()), std::memory_order_release);
  *graph = invalidated ? nullptr : reinterpret_cast<CUgraph>(&g_graph);
  return invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

CUresult capture_info(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id, bool ptsz) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(g_mu);
  if (s->legacy) {
    // "if this is called on CU_STREAM_LEGACY while a blocking stream in the same context is
    // capturing, it will return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT" (not invalidating it).
    for (const Capture& c : g_captures)
      if (c.stream->device == s->device && (c.stream->flags & CU_STREAM_NON_BLOCKING) == 0)
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  const Capture* c = find_locked(s);
  *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
               : (c->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED : CU_STREAM_CAPTURE_STATUS_ACTIVE);
  if (id != nullptr && c) *id = c->id;
  return CUDA_SUCCESS;
}

}  // namespace

CUresult capture_unsafe_call() {
  if (g_active.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  std::lock_guard lock(g_mu);
  bool refused = false;
  for (Capture& c : g_captures)
    if (prohibits(c)) invalidate(c), refused = true;
  return refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult capture_stream_use(CUstream_st* s, bool sync, bool* captured) {
  *captured = false;
  if (g_active.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  std::lock_guard lock(g_mu);
  if (Capture* c = find_locked(s)) {
    if (sync) {  // a capturing stream runs nothing: it cannot be waited for
      invalidate(*c);
      return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    *captured = true;
    return c->invalidated ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
  }
  if (!s->legacy) return CUDA_SUCCESS;
  bool refused = false;
  for (Capture& c : g_captures)
    if (c.stream->device == s->device && (c.stream->flags & CU_STREAM_NON_BLOCKING) == 0) invalidate(c), refused = true;
  return refused ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

CUresult capture_device_sync(int device) {
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  if (g_active.load(std::memory_order_acquire) == 0) return CUDA_SUCCESS;
  std::lock_guard lock(g_mu);
  bool refused = false;
  for (Capture& c : g_captures)
    if (c.stream->device == device) invalidate(c), refused = true;
  return refused ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

CUresult capture_event_use(CUevent e) {
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  uint64_t id = e->captured_in.load(std::memory_order_acquire);
  if (id == 0) return CUDA_SUCCESS;
  std::lock_guard lock(g_mu);
  for (Capture& c : g_captures)
    if (c.id == id) invalidate(c);
  return CUDA_ERROR_CAPTURED_EVENT;
}

uint64_t capture_id_of(CUstream_st* s) {
  if (g_active.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard lock(g_mu);
  const Capture* c = find_locked(s);
  return c ? c->id : 0;
}

}  // namespace simcuda::drv

using namespace simcuda::drv;

SIM_API CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
  SIM_COUNT("cuStreamBeginCapture_v2");
  return begin_capture(h, mode, false);
}
SIM_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode) {
  SIM_COUNT("cuStreamBeginCapture_v2_ptsz");
  return begin_capture(h, mode, true);
}
// Into an existing graph (CUDA 12.3): the same capture here, the graph only has to be given.
SIM_API CUresult cuStreamBeginCaptureToGraph(CUstream h, CUgraph graph, const CUgraphNode*, const CUgraphEdgeData*,
                                             size_t, CUstreamCaptureMode mode) {
  SIM_COUNT("cuStreamBeginCaptureToGraph");
  return graph ? begin_capture(h, mode, false) : CUDA_ERROR_INVALID_VALUE;
}
SIM_API CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream h, CUgraph graph, const CUgraphNode*, const CUgraphEdgeData*,
                                                  size_t, CUstreamCaptureMode mode) {
  SIM_COUNT("cuStreamBeginCaptureToGraph_ptsz");
  return graph ? begin_capture(h, mode, true) : CUDA_ERROR_INVALID_VALUE;
}
SIM_API CUresult cuStreamEndCapture(CUstream h, CUgraph* graph) {
  SIM_COUNT("cuStreamEndCapture");
  return end_capture(h, graph, false);
}
SIM_API CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph* graph) {
  SIM_COUNT("cuStreamEndCapture_ptsz");
  return end_capture(h, graph, true);
}
SIM_API CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id) {
  SIM_COUNT("cuStreamGetCaptureInfo");
  return capture_info(h, status, id, false);
}
SIM_API CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id) {
  SIM_COUNT("cuStreamGetCaptureInfo_ptsz");
  return capture_info(h, status, id, true);
}
// "if this is called on CU_STREAM_LEGACY while a blocking stream in the same context is
// capturing, it will return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT" (cuStreamIsCapturing).
SIM_API CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* status) {
  SIM_COUNT("cuStreamIsCapturing");
  return capture_info(h, status, nullptr, false);
}
SIM_API CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus* status) {
  SIM_COUNT("cuStreamIsCapturing_ptsz");
  return capture_info(h, status, nullptr, true);
}
SIM_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  SIM_COUNT("cuThreadExchangeStreamCaptureMode");
  if (mode == nullptr || (*mode != CU_STREAM_CAPTURE_MODE_GLOBAL && *mode != CU_STREAM_CAPTURE_MODE_THREAD_LOCAL &&
                          *mode != CU_STREAM_CAPTURE_MODE_RELAXED))
    return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, t_mode);
  return CUDA_SUCCESS;
}
SIM_API unsigned long long simcuda_capture_violations() { return g_violations.load(std::memory_order_relaxed); }
