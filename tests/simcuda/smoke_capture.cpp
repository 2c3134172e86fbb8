// Stream capture in the simulator (driver_capture.cpp), through the toolkit's runtime like a
// user program: what is prohibited in which capture mode, and the invalidated capture.
#include <thread>

#include "smoke_util.h"

namespace {

struct CaptureStream {
  cudaStream_t s = nullptr;
  explicit CaptureStream(unsigned flags = cudaStreamNonBlocking) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess);
  }
  ~CaptureStream() { cudaStreamDestroy(s); }
};

cudaStreamCaptureStatus status_of(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  EXPECT_EQ(cudaStreamGetCaptureInfo(s, &st), cudaSuccess);
  return st;
}

TEST(Capture, MallocInGlobalCaptureIsRefusedAndInvalidates) {
  CaptureStream cs;
  ASSERT_EQ(cudaStreamBeginCapture(cs.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(status_of(cs.s), cudaStreamCaptureStatusActive);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 1024), cudaErrorStreamCaptureUnsupported);
  EXPECT_EQ(status_of(cs.s), cudaStreamCaptureStatusInvalidated);
  cudaGraph_t g = reinterpret_cast<cudaGraph_t>(1);
  EXPECT_EQ(cudaStreamEndCapture(cs.s, &g), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  EXPECT_EQ(status_of(cs.s), cudaStreamCaptureStatusNone);
  cudaGetLastError();
}

TEST(Capture, RelaxedThreadMayAllocateAndQueryUncapturedEvents) {
  CaptureStream cs;
  cudaEvent_t before = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&before, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(before, cs.s), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(cs.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeGlobal);  // the previous mode comes back
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(before), cudaSuccess);  // recorded before the capture
  EXPECT_EQ(cudaFree(p), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(cs.s, &g), cudaSuccess);
  EXPECT_NE(g, nullptr);
  cudaEventDestroy(before);
}

TEST(Capture, CapturedEventCannotBeQueried) {
  CaptureStream cs;
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(cs.s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(e, cs.s), cudaSuccess);  // a node of the graph, not work
  EXPECT_EQ(cudaEventQuery(e), cudaErrorCapturedEvent);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(cs.s, &g), cudaErrorStreamCaptureInvalidated);
  cudaEventDestroy(e);
  cudaGetLastError();
}

TEST(Capture, OtherThreadsGlobalCaptureProhibitsThisThreadUnlessRelaxedOrThreadLocal) {
  CaptureStream cs;
  ASSERT_EQ(cudaStreamBeginCapture(cs.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaError_t global_rc = cudaSuccess, local_rc = cudaSuccess;
  std::thread([&] {
    cudaSetDevice(0);
    void* p = nullptr;
    cudaStreamCaptureMode m = cudaStreamCaptureModeThreadLocal;
    cudaThreadExchangeStreamCaptureMode(&m);
    local_rc = cudaMalloc(&p, 512);  // another thread's capture is ignored in this mode
    if (local_rc == cudaSuccess) cudaFree(p);
    cudaThreadExchangeStreamCaptureMode(&m);
    global_rc = cudaMalloc(&p, 512);  // the default mode: prohibited, the capture invalidated
    cudaGetLastError();
  }).join();
  EXPECT_EQ(local_rc, cudaSuccess);
  EXPECT_EQ(global_rc, cudaErrorStreamCaptureUnsupported);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(cs.s, &g), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
}

TEST(Capture, LegacyStreamBesideBlockingCaptureIsImplicitDependency) {
  CaptureStream blocking(cudaStreamDefault);
  ASSERT_EQ(cudaStreamBeginCapture(blocking.s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  cudaStreamCaptureStatus st{};
  EXPECT_EQ(cudaStreamGetCaptureInfo(cudaStreamLegacy, &st), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(status_of(blocking.s), cudaStreamCaptureStatusActive);  // a query does not invalidate
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(e, cudaStreamLegacy), cudaErrorStreamCaptureImplicit);
  EXPECT_EQ(status_of(blocking.s), cudaStreamCaptureStatusInvalidated);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(blocking.s, &g), cudaErrorStreamCaptureInvalidated);
  cudaEventDestroy(e);
  cudaGetLastError();
}

TEST(Capture, ThreadLocalCaptureMustEndOnItsThread) {
  CaptureStream cs;
  ASSERT_EQ(cudaStreamBeginCapture(cs.s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  cudaError_t rc = cudaSuccess;
  std::thread([&] {
    cudaGraph_t g = nullptr;
    rc = cudaStreamEndCapture(cs.s, &g);
    cudaGetLastError();
  }).join();
  EXPECT_EQ(rc, cudaErrorStreamCaptureWrongThread);
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(cs.s, &g), cudaSuccess);
}

TEST(Capture, IsCapturingAndTheLegacyStream) {
  CaptureStream cs(cudaStreamDefault);
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusActive;
  EXPECT_EQ(cudaStreamIsCapturing(cs.s, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusNone);
  ASSERT_EQ(cudaStreamBeginCapture(cs.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  EXPECT_EQ(cudaStreamIsCapturing(cs.s, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusActive);
  EXPECT_EQ(cudaStreamIsCapturing(cudaStreamLegacy, &st), cudaErrorStreamCaptureImplicit);
  unsigned long long before = simcuda_capture_violations();
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(cs.s, &g), cudaSuccess);  // queries do not invalidate
  EXPECT_EQ(simcuda_capture_violations(), before);
  cudaGetLastError();
}

TEST(Capture, GraphAllocationsAreTheOnlyMemoryFreedInACapture) {
  CaptureStream cs;
  void* plain = nullptr;
  ASSERT_EQ(cudaMallocAsync(&plain, 4096, cs.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(cs.s), cudaSuccess);
  size_t live = simcuda_live_allocations(0);
  ASSERT_EQ(cudaStreamBeginCapture(cs.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  void* g_mem = nullptr;
  EXPECT_EQ(cudaMallocAsync(&g_mem, 8192, cs.s), cudaSuccess);  // an allocation node
  EXPECT_NE(g_mem, nullptr);
  EXPECT_EQ(cudaFreeAsync(plain, cs.s), cudaErrorInvalidValue);  // not a graph allocation
  EXPECT_EQ(cudaFreeAsync(g_mem, cs.s), cudaSuccess);            // a free node
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(cs.s, &g), cudaSuccess);
  EXPECT_EQ(simcuda_live_allocations(0), live);
  EXPECT_EQ(cudaFreeAsync(plain, cs.s), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(cs.s), cudaSuccess);
  cudaGetLastError();
}

TEST(Capture, RelaxedFreeBesideAnotherThreadsGlobalCapture) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  CaptureStream cs;
  ASSERT_EQ(cudaStreamBeginCapture(cs.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaError_t relaxed_rc = cudaErrorUnknown;
  std::thread([&] {
    cudaSetDevice(0);
    cudaStreamCaptureMode m = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&m);
    relaxed_rc = cudaFree(p);  // its implicit synchronisation is allowed on a relaxed thread
    cudaThreadExchangeStreamCaptureMode(&m);
  }).join();
  EXPECT_EQ(relaxed_rc, cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);  // an explicit one is not
  cudaGraph_t g = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(cs.s, &g), cudaErrorStreamCaptureInvalidated);
  cudaGetLastError();
}

}  // namespace
