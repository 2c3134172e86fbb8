// Simulated streams and events.
//
// Each stream (the per-device legacy default stream, every per-thread default stream and every
// created stream) owns a worker thread, started on first real work, that runs its ops in order.
// Legacy default stream semantics (CUDA Programming Guide, "Default Stream"): an op on the
// legacy stream waits for all earlier work on the device's blocking streams, and an op on a
// blocking stream waits for earlier legacy-stream work. CU_STREAM_NON_BLOCKING streams do not
// take part. Per-thread default streams are blocking streams.
// Simplification: cuStreamSynchronize(legacy) waits only for ops enqueued on the legacy stream.
#include "driver_internal.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <thread>

namespace simcuda::drv {
namespace {

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

bool idle(CUstream_st* s, uint64_t* enq_out = nullptr) {
  std::lock_guard lock(s->mu);
  if (enq_out != nullptr) *enq_out = s->enqueued;
  return s->completed.load(std::memory_order_acquire) == s->enqueued;
}

void worker(CUstream_st* s) {
  for (;;) {
    Op op;
    {
      std::unique_lock lock(s->mu);
      s->cv_work.wait(lock, [s] { return !s->queue.empty() || s->destroyed; });
      if (s->queue.empty()) {  // destroyed and drained; the object is intentionally leaked
        s->worker_started = false;
        return;
      }
      op = std::move(s->queue.front());
      s->queue.pop_front();
    }
    for (auto& [t, seq] : op.deps) wait_stream(t, seq);
    if (op.fn) op.fn();
    {
      std::lock_guard lock(s->mu);
      s->completed.fetch_add(1, std::memory_order_acq_rel);
    }
    s->cv_done.notify_all();
  }
}

// Per-thread default streams, one per device, destroyed (drained, then the worker exits) when
// the thread exits.
struct PerThreadStreams {
  std::vector<CUstream_st*> by_device;
  ~PerThreadStreams() {
    for (CUstream_st* s : by_device) {
      if (s == nullptr) continue;
      Device& d = device(s->device);
      {
        std::lock_guard order(d.order_mu);
        d.streams.erase(std::remove(d.streams.begin(), d.streams.end(), s), d.streams.end());
      }
      std::lock_guard lock(s->mu);
      s->destroyed = true;
      s->cv_work.notify_all();
    }
  }
};
thread_local PerThreadStreams t_ptds;

CUstream_st* per_thread_stream(int dev) {
  auto& v = t_ptds.by_device;
  if (v.size() < static_cast<size_t>(state().device_count)) v.resize(state().device_count, nullptr);
  if (v[dev] == nullptr) {
    auto* s = new CUstream_st();
    s->device = dev;
    s->per_thread = true;
    Device& d = device(dev);
    std::lock_guard order(d.order_mu);
    d.streams.push_back(s);
    v[dev] = s;
  }
  return v[dev];
}

CUresult create_stream(CUstream* out, unsigned flags, int priority) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & ~unsigned{CU_STREAM_NON_BLOCKING}) != 0) return CUDA_ERROR_INVALID_VALUE;
  int dev = 0;
  if (CUresult r = ctx_device(&dev); r != CUDA_SUCCESS) return r;
  auto* s = new CUstream_st();
  s->device = dev;
  s->ctx = current_ctx();
  s->flags = flags;
  s->priority = std::clamp(priority, -5, 0);  // cuCtxGetStreamPriorityRange: [-5, 0]
  {
    Device& d = device(dev);
    std::lock_guard order(d.order_mu);
    d.streams.push_back(s);
  }
  std::lock_guard lock(state().handle_mu);
  state().streams.insert(s);
  *out = s;
  return CUDA_SUCCESS;
}

void retire_stream(CUstream_st* s) {
  Device& d = device(s->device);
  {
    std::lock_guard order(d.order_mu);
    d.streams.erase(std::remove(d.streams.begin(), d.streams.end(), s), d.streams.end());
  }
  std::lock_guard lock(s->mu);
  s->destroyed = true;
  s->cv_work.notify_all();
}

CUresult lookup_event(CUevent e) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (e == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  std::lock_guard lock(state().handle_mu);
  return state().events.count(e) != 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

void unref_event(CUevent e) {
  if (e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete e;
}

CUresult event_record(CUevent e, CUstream h, bool ptsz) {
  if (CUresult r = lookup_event(e); r != CUDA_SUCCESS) return r;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  bool captured = false;
  if (CUresult r = capture_stream_use(s, false, &captured); r != CUDA_SUCCESS) return r;
  if (captured) {  // a node of the graph being captured: the event now stands for it
    e->captured_in.store(capture_id_of(s), std::memory_order_release);
    return CUDA_SUCCESS;
  }
  e->captured_in.store(0, std::memory_order_release);
  uint64_t gen = 0;
  {
    std::lock_guard lock(e->mu);
    gen = ++e->recorded;
  }
  e->refs.fetch_add(1, std::memory_order_relaxed);
  enqueue(
      s,
      [e, gen] {
        {
          std::lock_guard lock(e->mu);
          if (e->done.load(std::memory_order_relaxed) < gen) {
            e->time_ns.store(now_ns(), std::memory_order_relaxed);
            e->done.store(gen, std::memory_order_release);
          }
        }
        e->cv.notify_all();
        unref_event(e);
      },
      /*trivial=*/true);
  return CUDA_SUCCESS;
}

CUresult stream_sync(CUstream h, bool ptsz) {
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  bool captured = false;
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  if (CUresult r = capture_stream_use(s, true, &captured); r != CUDA_SUCCESS) return r;
  sync_stream(s);
  return CUDA_SUCCESS;
}

CUresult stream_query(CUstream h, bool ptsz) {
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  bool captured = false;
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  if (CUresult r = capture_stream_use(s, true, &captured); r != CUDA_SUCCESS) return r;
  return idle(s) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult launch_host_func(CUstream h, CUhostFn fn, void* data, bool ptsz) {
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  bool captured = false;
  if (CUresult r = capture_stream_use(s, false, &captured); r != CUDA_SUCCESS || captured) return r;
  enqueue(
      s, [fn, data] { fn(data); }, /*trivial=*/false);
  return CUDA_SUCCESS;
}

CUresult stream_wait_event(CUstream h, CUevent e, unsigned flags, bool ptsz) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = lookup_event(e); r != CUDA_SUCCESS) return r;
  CUstream_st* s = nullptr;
  if (CUresult r = resolve_stream(h, ptsz, &s); r != CUDA_SUCCESS) return r;
  bool captured = false;
  if (CUresult r = capture_stream_use(s, false, &captured); r != CUDA_SUCCESS || captured) return r;
  uint64_t gen = 0;
  {
    std::lock_guard lock(e->mu);
    gen = e->recorded;  // waits for the most recent record, as documented
  }
  if (e->done.load(std::memory_order_acquire) >= gen) return CUDA_SUCCESS;
  e->refs.fetch_add(1, std::memory_order_relaxed);
  enqueue(
      s,
      [e, gen] {
        {
          std::unique_lock lock(e->mu);
          e->cv.wait(lock, [e, gen] { return e->done.load(std::memory_order_acquire) >= gen; });
        }
        unref_event(e);
      },
      /*trivial=*/false);
  return CUDA_SUCCESS;
}

}  // namespace

CUresult resolve_stream(CUstream h, bool ptsz, CUstream_st** out) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    int dev = 0;
    if (CUresult r = ctx_device(&dev); r != CUDA_SUCCESS) return r;
    bool per_thread = h == CU_STREAM_PER_THREAD || (h == nullptr && ptsz);
    *out = per_thread ? per_thread_stream(dev) : &device(dev).legacy;
    return CUDA_SUCCESS;
  }
  std::lock_guard lock(state().handle_mu);
  if (state().streams.count(h) == 0) return CUDA_ERROR_INVALID_HANDLE;
  *out = h;
  return CUDA_SUCCESS;
}

uint64_t enqueue(CUstream_st* s, std::function<void()> fn, bool trivial) {
  Device& d = device(s->device);
  std::lock_guard order(d.order_mu);
  Op op;
  if (s->legacy) {
    for (CUstream_st* t : d.streams) {
      if (t == s || (t->flags & CU_STREAM_NON_BLOCKING) != 0) continue;
      uint64_t enq = 0;
      if (!idle(t, &enq)) op.deps.emplace_back(t, enq);
    }
  } else if ((s->flags & CU_STREAM_NON_BLOCKING) == 0) {
    uint64_t enq = 0;
    if (!idle(&d.legacy, &enq)) op.deps.emplace_back(&d.legacy, enq);
  }
  std::unique_lock lock(s->mu);
  if (trivial && op.deps.empty() && s->completed.load(std::memory_order_acquire) == s->enqueued) {
    // Nothing to wait for: run now. Keeps event records on idle streams cheap (gpuheap's pool
    // records one per tracked stream every few hundred microseconds).
    ++s->enqueued;
    fn();
    s->completed.fetch_add(1, std::memory_order_acq_rel);
    uint64_t seq = s->enqueued;
    lock.unlock();
    s->cv_done.notify_all();
    return seq;
  }
  op.fn = std::move(fn);
  s->queue.push_back(std::move(op));
  uint64_t seq = ++s->enqueued;
  if (!s->worker_started) {
    s->worker_started = true;
    std::thread(worker, s).detach();
  }
  lock.unlock();
  s->cv_work.notify_one();
  return seq;
}

void wait_stream(CUstream_st* s, uint64_t seq) {
  if (s->completed.load(std::memory_order_acquire) >= seq) return;
  std::unique_lock lock(s->mu);
  s->cv_done.wait(lock, [s, seq] { return s->completed.load(std::memory_order_acquire) >= seq; });
}

void sync_stream(CUstream_st* s) {
  uint64_t target = 0;
  {
    std::lock_guard lock(s->mu);
    target = s->enqueued;
  }
  wait_stream(s, target);
}

void sync_device(int dev) {
  Device& d = device(dev);
  std::vector<std::pair<CUstream_st*, uint64_t>> targets;
  {
    std::lock_guard order(d.order_mu);
    uint64_t enq = 0;
    if (!idle(&d.legacy, &enq)) targets.emplace_back(&d.legacy, enq);
    for (CUstream_st* t : d.streams)
      if (!idle(t, &enq)) targets.emplace_back(t, enq);
  }
  // Streams are never freed (see retire_stream), so the pointers stay valid.
  for (auto& [t, seq] : targets) wait_stream(t, seq);
}

void destroy_context_streams(CUctx_st* ctx) {
  std::vector<CUstream_st*> victims;
  {
    std::lock_guard lock(state().handle_mu);
    for (auto it = state().streams.begin(); it != state().streams.end();) {
      if ((*it)->ctx == ctx) {
        victims.push_back(*it);
        it = state().streams.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (CUstream_st* s : victims) retire_stream(s);
}

}  // namespace simcuda::drv

using namespace simcuda::drv;

SIM_API CUresult cuStreamCreate(CUstream* s, unsigned int flags) {
  SIM_COUNT("cuStreamCreate");
  return create_stream(s, flags, 0);
}

SIM_API CUresult cuStreamCreateWithPriority(CUstream* s, unsigned int flags, int priority) {
  SIM_COUNT("cuStreamCreateWithPriority");
  return create_stream(s, flags, priority);
}

// Returns at once; pending work still runs, then the worker exits (cuStreamDestroy docs).
SIM_API CUresult cuStreamDestroy_v2(CUstream h) {
  SIM_COUNT("cuStreamDestroy_v2");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) return CUDA_ERROR_INVALID_HANDLE;
  {
    std::lock_guard lock(state().handle_mu);
    if (state().streams.erase(h) == 0) return CUDA_ERROR_INVALID_HANDLE;
  }
  retire_stream(h);
  return CUDA_SUCCESS;
}
SIM_API CUresult cuStreamDestroy(CUstream h) { return cuStreamDestroy_v2(h); }

SIM_API CUresult cuStreamSynchronize(CUstream h) {
  SIM_COUNT("cuStreamSynchronize");
  return stream_sync(h, false);
}
SIM_API CUresult cuStreamSynchronize_ptsz(CUstream h) {
  SIM_COUNT("cuStreamSynchronize_ptsz");
  return stream_sync(h, true);
}
SIM_API CUresult cuStreamQuery(CUstream h) {
  SIM_COUNT("cuStreamQuery");
  return stream_query(h, false);
}
SIM_API CUresult cuStreamQuery_ptsz(CUstream h) {
  SIM_COUNT("cuStreamQuery_ptsz");
  return stream_query(h, true);
}

SIM_API CUresult cuStreamWaitEvent(CUstream h, CUevent e, unsigned int flags) {
  SIM_COUNT("cuStreamWaitEvent");
  return stream_wait_event(h, e, flags, false);
}
SIM_API CUresult cuStreamWaitEvent_ptsz(CUstream h, CUevent e, unsigned int flags) {
  SIM_COUNT("cuStreamWaitEvent_ptsz");
  return stream_wait_event(h, e, flags, true);
}

SIM_API CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void* data) {
  SIM_COUNT("cuLaunchHostFunc");
  return launch_host_func(h, fn, data, false);
}
SIM_API CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void* data) {
  SIM_COUNT("cuLaunchHostFunc_ptsz");
  return launch_host_func(h, fn, data, true);
}

SIM_API CUresult cuEventCreate(CUevent* e, unsigned int flags) {
  SIM_COUNT("cuEventCreate");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr unsigned kValid = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if ((flags & ~kValid) != 0) return CUDA_ERROR_INVALID_VALUE;
  // CU_EVENT_INTERPROCESS requires CU_EVENT_DISABLE_TIMING (cuEventCreate docs).
  if ((flags & CU_EVENT_INTERPROCESS) != 0 && (flags & CU_EVENT_DISABLE_TIMING) == 0) return CUDA_ERROR_INVALID_VALUE;
  int dev = 0;
  if (CUresult r = ctx_device(&dev); r != CUDA_SUCCESS) return r;
  auto* ev = new CUevent_st();
  ev->device = dev;
  ev->flags = flags;
  std::lock_guard lock(state().handle_mu);
  state().events.insert(ev);
  *e = ev;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuEventRecord(CUevent e, CUstream h) {
  SIM_COUNT("cuEventRecord");
  return event_record(e, h, false);
}
SIM_API CUresult cuEventRecord_ptsz(CUevent e, CUstream h) {
  SIM_COUNT("cuEventRecord_ptsz");
  return event_record(e, h, true);
}
SIM_API CUresult cuEventRecordWithFlags(CUevent e, CUstream h, unsigned int) {
  SIM_COUNT("cuEventRecordWithFlags");
  return event_record(e, h, false);
}
SIM_API CUresult cuEventRecordWithFlags_ptsz(CUevent e, CUstream h, unsigned int) {
  SIM_COUNT("cuEventRecordWithFlags_ptsz");
  return event_record(e, h, true);
}

// A never-recorded event counts as complete (cuEventQuery docs).
SIM_API CUresult cuEventQuery(CUevent e) {
  SIM_COUNT("cuEventQuery");
  if (CUresult r = lookup_event(e); r != CUDA_SUCCESS) return r;
  if (CUresult r = capture_event_use(e); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(e->mu);
  return e->done.load(std::memory_order_acquire) >= e->recorded ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_API CUresult cuEventSynchronize(CUevent e) {
  SIM_COUNT("cuEventSynchronize");
  if (CUresult r = lookup_event(e); r != CUDA_SUCCESS) return r;
  if (CUresult r = capture_event_use(e); r != CUDA_SUCCESS) return r;
  std::unique_lock lock(e->mu);
  uint64_t gen = e->recorded;
  e->cv.wait(lock, [e, gen] { return e->done.load(std::memory_order_acquire) >= gen; });
  return CUDA_SUCCESS;
}

// Returns at once; a pending record still completes and then frees the event.
SIM_API CUresult cuEventDestroy_v2(CUevent e) {
  SIM_COUNT("cuEventDestroy_v2");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  {
    std::lock_guard lock(state().handle_mu);
    if (e == nullptr || state().events.erase(e) == 0) return CUDA_ERROR_INVALID_HANDLE;
  }
  unref_event(e);
  return CUDA_SUCCESS;
}
SIM_API CUresult cuEventDestroy(CUevent e) { return cuEventDestroy_v2(e); }

SIM_API CUresult cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = lookup_event(start); r != CUDA_SUCCESS) return r;
  if (CUresult r = lookup_event(end); r != CUDA_SUCCESS) return r;
  if (((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) != 0) return CUDA_ERROR_INVALID_HANDLE;
  int64_t t0 = 0, t1 = 0;
  for (CUevent e : {start, end}) {
    std::lock_guard lock(e->mu);
    if (e->recorded == 0) return CUDA_ERROR_INVALID_HANDLE;  // never recorded
    if (e->done.load(std::memory_order_acquire) < e->recorded) return CUDA_ERROR_NOT_READY;
    (e == start ? t0 : t1) = e->time_ns.load(std::memory_order_relaxed);
  }
  *ms = static_cast<float>(static_cast<double>(t1 - t0) / 1e6);
  return CUDA_SUCCESS;
}
SIM_API CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
  return cuEventElapsedTime_v2(ms, start, end);
}
