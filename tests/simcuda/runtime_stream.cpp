// Simulated runtime: streams, events and host callbacks, forwarded to the driver entry points.
// The _ptsz variants use the per-thread driver table, so stream 0 means the per-thread stream.
#include "runtime_internal.h"

using namespace simcuda::rt;

namespace {

template <typename F>
cudaError_t call(bool ptsz, F&& f) {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api, ptsz); e != cudaSuccess) return record(e);
  return finish(f(*api));
}

}  // namespace

RT_API cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return call(false, [&](const Api& a) { return a.cuStreamCreate(s, CU_STREAM_DEFAULT); });
}
RT_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  return call(false, [&](const Api& a) { return a.cuStreamCreate(s, flags); });  // same flag values
}
RT_API cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int flags, int priority) {
  return call(false, [&](const Api& a) { return a.cuStreamCreateWithPriority(s, flags, priority); });
}
RT_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  return call(false, [&](const Api& a) { return a.cuStreamDestroy_v2(s); });
}
RT_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  return call(false, [&](const Api& a) { return a.cuStreamSynchronize(s); });
}
RT_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
  return call(true, [&](const Api& a) { return a.cuStreamSynchronize(s); });
}
RT_API cudaError_t cudaStreamQuery(cudaStream_t s) {
  return call(false, [&](const Api& a) { return a.cuStreamQuery(s); });
}
RT_API cudaError_t cudaStreamQuery_ptsz(cudaStream_t s) {
  return call(true, [&](const Api& a) { return a.cuStreamQuery(s); });
}
RT_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  return call(false, [&](const Api& a) { return a.cuStreamWaitEvent(s, e, flags); });
}
RT_API cudaError_t cudaStreamWaitEvent_ptsz(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  return call(true, [&](const Api& a) { return a.cuStreamWaitEvent(s, e, flags); });
}
RT_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  return call(false, [&](const Api& a) { return a.cuLaunchHostFunc(s, fn, data); });
}
RT_API cudaError_t cudaLaunchHostFunc_ptsz(cudaStream_t s, cudaHostFn_t fn, void* data) {
  return call(true, [&](const Api& a) { return a.cuLaunchHostFunc(s, fn, data); });
}

// Stream capture: the state is the driver's (driver_capture.cpp); the modes have the same values.
RT_API cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  return call(false, [&](const Api& a) { return a.cuStreamBeginCapture_v2(s, CUstreamCaptureMode(mode)); });
}
RT_API cudaError_t cudaStreamBeginCapture_ptsz(cudaStream_t s, cudaStreamCaptureMode mode) {
  return call(true, [&](const Api& a) { return a.cuStreamBeginCapture_v2(s, CUstreamCaptureMode(mode)); });
}
RT_API cudaError_t cudaStreamBeginCaptureToGraph(cudaStream_t s, cudaGraph_t graph, const cudaGraphNode_t* deps,
                                                 const cudaGraphEdgeData* edges, size_t n, cudaStreamCaptureMode mode) {
  return call(false, [&](const Api& a) {
    return a.cuStreamBeginCaptureToGraph(s, graph, reinterpret_cast<const CUgraphNode*>(deps),
                                         reinterpret_cast<const CUgraphEdgeData*>(edges), n, CUstreamCaptureMode(mode));
  });
}
RT_API cudaError_t cudaStreamBeginCaptureToGraph_ptsz(cudaStream_t s, cudaGraph_t graph, const cudaGraphNode_t* deps,
                                                      const cudaGraphEdgeData* edges, size_t n,
                                                      cudaStreamCaptureMode mode) {
  return call(true, [&](const Api& a) {
    return a.cuStreamBeginCaptureToGraph(s, graph, reinterpret_cast<const CUgraphNode*>(deps),
                                         reinterpret_cast<const CUgraphEdgeData*>(edges), n, CUstreamCaptureMode(mode));
  });
}
RT_API cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  return call(false, [&](const Api& a) { return a.cuStreamEndCapture(s, reinterpret_cast<CUgraph*>(graph)); });
}
RT_API cudaError_t cudaStreamEndCapture_ptsz(cudaStream_t s, cudaGraph_t* graph) {
  return call(true, [&](const Api& a) { return a.cuStreamEndCapture(s, reinterpret_cast<CUgraph*>(graph)); });
}
namespace {
cudaError_t capture_info(bool ptsz, cudaStream_t s, cudaStreamCaptureStatus* status, unsigned long long* id,
                         cudaGraph_t* graph, const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                         size_t* ndeps) {
  // No graphs here: the graph and its dependencies read as none.
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (ndeps) *ndeps = 0;
  return call(ptsz, [&](const Api& a) {
    cuuint64_t cid = 0;
    CUresult r = a.cuStreamGetCaptureInfo(s, reinterpret_cast<CUstreamCaptureStatus*>(status), &cid);
    if (r == CUDA_SUCCESS && id) *id = cid;
    return r;
  });
}
}  // namespace
RT_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t s, cudaStreamCaptureStatus* status, unsigned long long* id,
                                            cudaGraph_t* graph, const cudaGraphNode_t** deps,
                                            const cudaGraphEdgeData** edges, size_t* ndeps) {
  return capture_info(false, s, status, id, graph, deps, edges, ndeps);
}
RT_API cudaError_t cudaStreamGetCaptureInfo_ptsz(cudaStream_t s, cudaStreamCaptureStatus* status,
                                                 unsigned long long* id, cudaGraph_t* graph,
                                                 const cudaGraphNode_t** deps, const cudaGraphEdgeData** edges,
                                                 size_t* ndeps) {
  return capture_info(true, s, status, id, graph, deps, edges, ndeps);
}
RT_API cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  return call(false,
              [&](const Api& a) { return a.cuStreamIsCapturing(s, reinterpret_cast<CUstreamCaptureStatus*>(status)); });
}
RT_API cudaError_t cudaStreamIsCapturing_ptsz(cudaStream_t s, cudaStreamCaptureStatus* status) {
  return call(true,
              [&](const Api& a) { return a.cuStreamIsCapturing(s, reinterpret_cast<CUstreamCaptureStatus*>(status)); });
}
RT_API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  return call(false, [&](const Api& a) {
    return a.cuThreadExchangeStreamCaptureMode(reinterpret_cast<CUstreamCaptureMode*>(mode));
  });
}

RT_API cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return call(false, [&](const Api& a) { return a.cuEventCreate(e, CU_EVENT_DEFAULT); });
}
RT_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  return call(false, [&](const Api& a) { return a.cuEventCreate(e, flags); });  // same flag values
}
RT_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  return call(false, [&](const Api& a) { return a.cuEventRecord(e, s); });
}
RT_API cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  return call(true, [&](const Api& a) { return a.cuEventRecord(e, s); });
}
RT_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
  return call(false, [&](const Api& a) { return a.cuEventRecordWithFlags(e, s, flags); });
}
RT_API cudaError_t cudaEventRecordWithFlags_ptsz(cudaEvent_t e, cudaStream_t s, unsigned int flags) {
  return call(true, [&](const Api& a) { return a.cuEventRecordWithFlags(e, s, flags); });
}
RT_API cudaError_t cudaEventQuery(cudaEvent_t e) {
  return call(false, [&](const Api& a) { return a.cuEventQuery(e); });
}
RT_API cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  return call(false, [&](const Api& a) { return a.cuEventSynchronize(e); });
}
RT_API cudaError_t cudaEventDestroy(cudaEvent_t e) {
  return call(false, [&](const Api& a) { return a.cuEventDestroy_v2(e); });
}
RT_API cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  return call(false, [&](const Api& a) { return a.cuEventElapsedTime_v2(ms, start, end); });
}
