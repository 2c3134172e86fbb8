// Smoke tests of simulated streams and events: asynchronous execution, ordering, legacy default
// stream semantics, per-thread default streams, implicit synchronisation of cudaFree.
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "smoke_util.h"

using namespace simcuda_test;
using namespace std::chrono_literals;

namespace {

struct SlowWrite {
  int* target;
  int value;
  std::chrono::milliseconds delay;
  std::atomic<bool> done{false};
};

void slow_write(void* arg) {
  auto* w = static_cast<SlowWrite*>(arg);
  std::this_thread::sleep_for(w->delay);
  __atomic_store_n(w->target, w->value, __ATOMIC_RELEASE);  // the test polls it concurrently
  w->done.store(true);
}

struct Log {
  std::atomic<int> next{0};
  int order[8] = {};
};
struct LogEntry {
  Log* log;
  int id;
};
void log_entry(void* arg) {
  auto* e = static_cast<LogEntry*>(arg);
  e->log->order[e->log->next.fetch_add(1)] = e->id;
}

}  // namespace

TEST(Streams, WorkRunsAsynchronouslyAndInOrder) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  int* buf = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), 64), cudaSuccess);
  SlowWrite w{buf, 42, 100ms};
  ASSERT_EQ(cudaLaunchHostFunc(s, slow_write, &w), cudaSuccess);
  // The memset is queued behind the slow write, so it must overwrite the 42.
  ASSERT_EQ(cudaMemsetAsync(buf, 0x11, sizeof(int), s), cudaSuccess);
  EXPECT_FALSE(w.done.load());  // enqueueing did not block
  EXPECT_EQ(cudaStreamQuery(s), cudaErrorNotReady);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // not-ready is not a latched error
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_TRUE(w.done.load());
  EXPECT_EQ(*buf, 0x11111111);
  EXPECT_EQ(cudaStreamQuery(s), cudaSuccess);
  int host = 0;
  ASSERT_EQ(cudaMemcpyAsync(&host, buf, sizeof(int), cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(host, 0x11111111);
  EXPECT_EQ(cudaFree(buf), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
  (void)cudaGetLastError();
}

TEST(Streams, EventsCompleteWhenTheStreamReachesThem) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  cudaEvent_t before = nullptr, after = nullptr, never = nullptr;
  ASSERT_EQ(cudaEventCreate(&before), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&after), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&never, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(never), cudaSuccess);  // never recorded counts as complete
  int target = 0;
  SlowWrite w{&target, 1, 80ms};
  ASSERT_EQ(cudaEventRecord(before, s), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s, slow_write, &w), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(after, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady);
  ASSERT_EQ(cudaEventSynchronize(after), cudaSuccess);
  EXPECT_TRUE(w.done.load());
  EXPECT_EQ(cudaEventQuery(after), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(before), cudaSuccess);
  float ms = 0;
  ASSERT_EQ(cudaEventElapsedTime(&ms, before, after), cudaSuccess);
  EXPECT_GE(ms, 75.0f);
  EXPECT_EQ(cudaEventElapsedTime(&ms, before, never), cudaErrorInvalidResourceHandle);
  // Re-recording makes the event pending again until the new record is reached.
  SlowWrite w2{&target, 2, 50ms};
  ASSERT_EQ(cudaLaunchHostFunc(s, slow_write, &w2), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(after, s), cudaSuccess);
  EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady);
  // An event destroyed while pending is released once the stream reaches it.
  ASSERT_EQ(cudaEventDestroy(after), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(target, 2);
  EXPECT_EQ(cudaEventDestroy(before), cudaSuccess);
  EXPECT_EQ(cudaEventDestroy(never), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  (void)cudaGetLastError();
}

TEST(Streams, RecordAndQueryOnIdleStreamAreCheap) {
  cudaStream_t s = nullptr;
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  constexpr int kIters = 20000;
  auto t0 = std::chrono::steady_clock::now();
  int incomplete = 0;
  for (int i = 0; i < kIters; ++i) {
    ASSERT_EQ(cudaEventRecord(e, s), cudaSuccess);
    if (cudaEventQuery(e) != cudaSuccess) ++incomplete;
  }
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  const double per_pair_us = static_cast<double>(ns) / kIters / 1000.0;
  RecordProperty("record_query_us", std::to_string(per_pair_us));
  std::printf("[simcuda] idle-stream event record+query: %.3f us\n", per_pair_us);
  EXPECT_EQ(incomplete, 0);  // idle stream: the record completes immediately
  EXPECT_LT(per_pair_us, 20.0);
  EXPECT_EQ(cudaEventDestroy(e), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(Streams, FreeSynchronisesButPoolReuseWouldNot) {
  // The scenario gpuheap's tests rely on: work still queued on a stream uses a buffer.
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  int* buf = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&buf), 4096), cudaSuccess);
  *buf = 0;
  SlowWrite w{buf, 99, 100ms};
  ASSERT_EQ(cudaLaunchHostFunc(s, slow_write, &w), cudaSuccess);
  // A caching allocator handing `buf` out again right now would see the late write: detectable.
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(__atomic_load_n(buf, __ATOMIC_ACQUIRE), 0);
  EXPECT_FALSE(w.done.load());
  // cudaFree synchronises the device first, so the write lands before the memory goes away.
  ASSERT_EQ(cudaFree(buf), cudaSuccess);
  EXPECT_TRUE(w.done.load());
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(Streams, LegacyDefaultStreamOrdersAgainstBlockingStreams) {
  cudaStream_t blocking = nullptr, nonblocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&nonblocking, cudaStreamNonBlocking), cudaSuccess);
  Log log;
  int sink = 0;
  SlowWrite slow{&sink, 1, 80ms};
  LogEntry first{&log, 1}, legacy{&log, 2}, after_legacy{&log, 3}, independent{&log, 4};
  ASSERT_EQ(cudaLaunchHostFunc(blocking, slow_write, &slow), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(blocking, log_entry, &first), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(nullptr, log_entry, &legacy), cudaSuccess);           // waits for `blocking`
  ASSERT_EQ(cudaLaunchHostFunc(blocking, log_entry, &after_legacy), cudaSuccess);    // waits for legacy
  ASSERT_EQ(cudaLaunchHostFunc(nonblocking, log_entry, &independent), cudaSuccess);  // waits for nobody
  ASSERT_EQ(cudaStreamSynchronize(nonblocking), cudaSuccess);
  EXPECT_EQ(log.order[0], 4);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(log.next.load(), 4);
  EXPECT_EQ(log.order[1], 1);
  EXPECT_EQ(log.order[2], 2);
  EXPECT_EQ(log.order[3], 3);
  EXPECT_EQ(cudaStreamDestroy(blocking), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(nonblocking), cudaSuccess);
}

TEST(Streams, PerThreadDefaultStreamThroughPtszEntryPoints) {
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);
  using AllocAsync = decltype(&cuMemAllocAsync);
  using FreeAsync = decltype(&cuMemFreeAsync);
  using HostFunc = decltype(&cuLaunchHostFunc);
  using Sync = decltype(&cuStreamSynchronize);
  const auto pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  auto alloc = driver_fn<AllocAsync>("cuMemAllocAsync", pt);
  auto free_fn = driver_fn<FreeAsync>("cuMemFreeAsync", pt);
  auto host_fn = driver_fn<HostFunc>("cuLaunchHostFunc", pt);
  auto sync = driver_fn<Sync>("cuStreamSynchronize", pt);
  auto legacy_sync = driver_fn<Sync>("cuStreamSynchronize");
  ASSERT_TRUE(alloc && free_fn && host_fn && sync && legacy_sync);
  const unsigned long long ptsz0 = simcuda_call_count("cuMemAllocAsync_ptsz");
  const size_t u0 = simcuda_used_bytes(0);
  CUdeviceptr p = 0;
  ASSERT_EQ(alloc(&p, 1000, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(simcuda_call_count("cuMemAllocAsync_ptsz"), ptsz0 + 1);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 1024);
  int sink = 0;
  SlowWrite slow{&sink, 5, 80ms};
  ASSERT_EQ(host_fn(nullptr, slow_write, &slow), CUDA_SUCCESS);  // stream 0 = this thread's stream
  ASSERT_EQ(free_fn(p, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(free_fn(p, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(simcuda_used_bytes(0), u0 + 1024);  // the free waits for the stream
  ASSERT_EQ(sync(nullptr), CUDA_SUCCESS);
  EXPECT_TRUE(slow.done.load());
  EXPECT_EQ(simcuda_used_bytes(0), u0);

  // Another thread's per-thread stream is independent of this one's.
  SlowWrite slow2{&sink, 6, 150ms};
  ASSERT_EQ(host_fn(nullptr, slow_write, &slow2), CUDA_SUCCESS);
  std::atomic<bool> other_done{false};
  std::thread([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(sync(nullptr), CUDA_SUCCESS);  // its own, empty per-thread stream
    other_done.store(!slow2.done.load());
  }).join();
  EXPECT_TRUE(other_done.load());
  ASSERT_EQ(sync(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(sink, 6);
}
