// The allocation paths: pooled cudaMalloc/cuMemAlloc_v2, pass-through kinds, memory info.
//
// Ordering rule for the trace: a free is recorded before the address can be handed out
// again (pooled: under the pool lock, before the block enters the pending list;
// pass-through: before the real free), an allocation after it was obtained. Then the
// file order is a valid replay order across threads.
#include <algorithm>
#include <mutex>
#include <new>
#include <type_traits>
#include <utility>

#include "preload/core/cuda_upstream.h"
#include "preload/core/limits.h"
#include "preload/core/oom.h"
#include "preload/core/passthrough.h"
#include "preload/core/runtime.h"
#include "preload/core/state.h"
#include "preload/core/stats.h"
#include "preload/hooks/real.h"
#include "preload/record/recorder.h"
#include "preload/record/scratch.h"

namespace gpuheap {
namespace preload {

using format::AllocKind;

namespace {

// A host address that is never device memory (see rt_free).
char g_never_device_memory;

// Whether ptr lies in a pool (a live block or not), retired states included.
bool pool_holds(const void* ptr) noexcept {
  if (contexts().size() == 0) return false;
  return contexts().for_each_including_retired([&](ContextState* s) { return s->pool.contains(ptr); }) != nullptr;
}

// During a stream capture a free is "potentially unsafe" (cuThreadExchangeStreamCaptureMode):
// on a prohibited thread the driver refuses it with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
// invalidates the captures that prohibit it and frees nothing. A pool block is freed without
// a driver call, so the driver is asked with a free of an address it never handed out: a
// capture error is the program's answer (the capture is then invalidated, as natively); any
// other (CUDA_ERROR_INVALID_VALUE, nothing freed) lets the free go on. CUDA_SUCCESS: go on
// (also for a pointer outside the pools: the real free it goes to answers for itself).
CUresult capture_refusal(const void* ptr) noexcept {
  if (!captures_active() || !pool_holds(ptr)) return CUDA_SUCCESS;
  auto real_free = real<Fn::cuMemFree_v2>();
  CUresult rc = real_free ? real_free(addr(&g_never_device_memory)) : CUDA_SUCCESS;
  return is_capture_error(rc) ? rc : CUDA_SUCCESS;
}

}  // namespace

// No frames skipped here: inlining decides how many of ours are on the stack, and the
// analyzer hides libgpuheap.so frames anyway (skipping blindly can drop the user's frame).
std::uint32_t alloc_stack() noexcept { return capture_stack(0); }
std::uint32_t free_stack() noexcept { return settings().free_stacks ? capture_stack(0) : 0; }

void record_alloc(AllocKind kind, int device, std::uint64_t ptr, std::size_t requested, std::size_t size,
                  std::uint8_t flags, std::uint64_t stream, std::uint32_t stack) noexcept {
  if (device >= 0) ensure_device(device);
  if (!(flags & format::kFlagFailed)) stats_alloc(kind, device, ptr, requested, size);
  record(format::AllocRecord{now_ns(), current_tid(), static_cast<std::int16_t>(device), kind, flags, ptr, requested,
                             size, stream, stack});
}

void record_free(AllocKind kind, int device, std::uint64_t ptr, std::size_t size, std::uint8_t flags,
                 std::uint64_t stream, std::uint32_t stack) noexcept {
  if (!(flags & format::kFlagFailed)) stats_free(kind, device, ptr, size);
  record(format::FreeRecord{now_ns(), current_tid(), static_cast<std::int16_t>(device), kind, flags, ptr, size, stream,
                            stack});
}

static std::uint8_t block_flags(const pool::PoolBlock& b) noexcept {
  return static_cast<std::uint8_t>((b.small ? format::kFlagSmallPool : 0) | (b.oversize ? format::kFlagOversize : 0));
}

// Size the driver actually handed out for a pass-through device allocation.
std::size_t driver_size(const void* p, std::size_t requested) noexcept {
  auto range = real<Fn::cuMemGetAddressRange_v2>();
  CUdeviceptr base = 0;
  size_t size = 0;
  if (range && range(&base, &size, addr(p)) == CUDA_SUCCESS && base == addr(p)) return size;
  return requested;
}

// The live allocation sites of a device at this moment, largest first (for the OOM report).
static int live_sites(int device, LiveSite* out, int cap) noexcept {
  constexpr int kSlots = 512;  // distinct sites kept; the rest are folded into none
  LiveSite table[kSlots] = {};
  auto add = [&](std::uint32_t stack, std::uint64_t bytes) {
    for (int i = 0, h = static_cast<int>(stack * 2654435761u % kSlots); i < kSlots; ++i, h = (h + 1) % kSlots) {
      if (table[h].count == 0 || table[h].stack == stack) {
        table[h].stack = stack;
        table[h].bytes += bytes;
        ++table[h].count;
        return;
      }
    }
  };
  // Retired states too, as before: their abandoned pools hold no live block.
  contexts().for_each_including_retired([&](ContextState* s) {
    if (s->device != device) return;
    s->pool.for_each_live([](void* a,
                             const pool::PoolBlock& b) noexcept { (*static_cast<decltype(add)*>(a))(b.tag, b.size); },
                          &add);
  });
  registry().for_each(Family::pointer, [&](const Entry& e) {
    if (e.device == device && counts_against_limit(e.kind)) add(e.stack, e.size);
  });
  registry().for_each(Family::vmm_handle, [&](const Entry& e) {
    if (e.device == device) add(e.stack, e.size);
  });
  std::sort(table, table + kSlots, [](const LiveSite& a, const LiveSite& b) { return a.bytes > b.bytes; });
  int k = 0;
  while (k < cap && k < kSlots && table[k].count) out[k] = table[k], ++k;
  return k;
}

void record_oom(ContextState* st, int device, AllocKind kind, const char* api, std::size_t requested,
                std::uint64_t stream, std::uint32_t stack) noexcept {
  if (!st) st = current_state();
  format::OomRecord r;
  r.ts = now_ns();
  r.tid = current_tid();
  r.device = static_cast<std::int16_t>(device);
  r.kind = kind;
  r.requested = requested;
  r.stream = stream;
  size_t free_b = 0, total_b = 0;
  if (auto info = real<Fn::cuMemGetInfo_v2>(); info && info(&free_b, &total_b) == CUDA_SUCCESS) {
    r.device_free = free_b;
    r.device_total = total_b;
  }
  r.limit = device_limit(device);
  std::uint64_t cached = 0;
  if (st) {
    pool::PoolStats ps = st->pool.stats();
    r.reserved = ps.reserved;
    r.allocated = ps.allocated;
    r.largest_free = ps.largest_free;
    cached = ps.reserved - ps.allocated;
  }
  r.stack = stack;
  if (r.device >= 0) ensure_device(r.device);
  record(r);
  // The report (a table of live sites, its text) takes ~20 KiB of stack: through run_deep
  // (record/scratch.h). Refused (no room, no scratch stack): the OOM is recorded, not reported.
  struct Report {
    const format::OomRecord& r;
    const char* api;
    std::uint64_t cached;
    int device;
  } rep{r, api, cached, device};
  run_deep(
      [](void* arg, bool) {
        auto* p = static_cast<Report*>(arg);
        DeviceBudget* b = budget(p->device);
        LiveSite sites[5];
        int nsites = live_sites(p->device, sites, 5);
        std::int64_t held = b ? b->held() : 0;  // never negative (limits.h); clamped all the same
        report_oom(p->r, p->api, p->cached, held > 0 ? static_cast<std::uint64_t>(held) : 0, sites, nsites);
      },
      &rep);
}

namespace {

struct FreeHookArg {
  int device;
  std::uint32_t stack;
  std::uint64_t stream;
};

// Runs under the pool lock, after the block was validated and before it can be reused.
void record_pooled_free(void* arg, const pool::PoolBlock& b) noexcept {
  auto* a = static_cast<FreeHookArg*>(arg);
  record_free(AllocKind::device_pooled, a->device, addr(b.ptr), b.size, block_flags(b), a->stream, a->stack);
}

// GPUHEAP_RELEASE_THRESHOLD: once the unused cache of a pool exceeds it, fully free segments
// go back to the driver (empty_cache by policy; only already-reusable memory, no waiting).
void apply_release_threshold(ContextState* st) noexcept {
  std::size_t t = settings().release_threshold;
  // Not during a capture: trimming frees segments and queries fences, calls a free never
  // makes natively and the driver may refuse on this thread (capture_refusal).
  if (t && st && !captures_active() && st->pool.cached_unused() > t) st->pool.trim(format::EmptyCacheReason::threshold);
}

enum class PoolFree { freed, not_ours, invalid };

// Frees ptr into the pool of s if it is a live block there.
PoolFree free_in(ContextState* s, const void* ptr, std::uint32_t stack, std::uint64_t stream) noexcept {
  FreeHookArg arg{s->device, stack, stream};
  if (s->pool.deallocate(const_cast<void*>(ptr), nullptr, record_pooled_free, &arg)) {
    apply_release_threshold(s);
    return PoolFree::freed;
  }
  return s->pool.contains(ptr) ? PoolFree::invalid : PoolFree::not_ours;
}

// Frees a pooled block wherever it lives: look the block up by pointer, not by the current
// device (a block may be freed while another device is current).
PoolFree pooled_free(const void* ptr) noexcept {
  if (contexts().size() == 0) return PoolFree::not_ours;
  ContextState* cur = current_state();
  std::uint32_t stack = free_stack();
  auto try_state = [&](ContextState* s) { return free_in(s, ptr, stack, 0); };
  if (cur) {
    PoolFree r = try_state(cur);
    if (r != PoolFree::not_ours) return r;
  }
  // By pointer, retired states too (as before): an abandoned pool contains nothing, so
  // a pointer of a destroyed context is not_ours and goes to the driver.
  PoolFree r = PoolFree::not_ours;
  contexts().for_each_including_retired([&](ContextState* s) {
    if (s != cur) r = try_state(s);
    return r != PoolFree::not_ours;
  });
  return r;
}

struct AllocHookArg {
  int device;
  std::size_t requested;
  std::uint32_t stack;
};

// Runs under the pool lock, right after the block was handed out (Pool::allocate's hook).
void record_pooled_alloc(void* arg, const pool::PoolBlock& b) noexcept {
  auto* a = static_cast<AllocHookArg*>(arg);
  record_alloc(AllocKind::device_pooled, a->device, addr(b.ptr), a->requested, b.size, block_flags(b), 0, a->stack);
}

// The pool path shared by cudaMalloc and cuMemAlloc_v2. False: the pool could not serve it
// (caller falls back to the real allocator, which gives the program the real answer).
bool pooled_alloc(ContextState* st, void** ptr, std::size_t size, std::uint32_t stack) noexcept {
  pool::PoolBlock b;
  AllocHookArg arg{st->device, size, stack};
  if (st->pool.allocate(size, &b, stack, record_pooled_alloc, &arg) != pool::PoolStatus::ok) return false;
  *ptr = b.ptr;
  return true;
}

// After the pool failed: without a cap the real allocator decides (its error is what the
// program sees, and a success means memory appeared meanwhile); with a cap the pool already
// hit it after releasing its cache, so the answer is out-of-memory.
template <class Call>
auto fallback_alloc(ContextState* st, std::size_t size, std::uint32_t stack, void** ptr, const char* api,
                    decltype(std::declval<Call>()()) oom_error, Call call) {
  int dev = st ? st->device : current_device();
  if (device_limit(dev) != 0) {
    record_oom(st, dev, AllocKind::device_pooled, api, size, 0, stack);
    if constexpr (std::is_same_v<decltype(oom_error), cudaError_t>) return latch_runtime_oom();
    return oom_error;
  }
  PassAlloc pa(AllocKind::device_passthrough, {}, size, false);  // no cap here: charges, never refuses
  auto rc = call();
  if (rc == 0 && *ptr) pa.commit(*ptr, size, driver_size(*ptr, size), 0);
  else if (is_out_of_memory(int(rc), std::is_same_v<decltype(rc), cudaError_t>))
    record_oom(st, dev, st ? AllocKind::device_pooled : AllocKind::device_passthrough, api, size, 0, stack);
  else if (rc != 0)  // no device, an old driver, a sticky fault: not for the OOM report
    report_not_oom(api, int(rc), std::is_same_v<decltype(rc), cudaError_t>);
  return rc;
}

}  // namespace

// ---- cudaMalloc / cudaFree ----

cudaError_t rt_malloc(void** ptr, std::size_t size) noexcept {
  HookScope scope;
  auto real_malloc = real<Fn::cudaMalloc>();
  if (!real_malloc) return cudaErrorInitializationError;
  if (!scope.active() || !ptr || size == 0) return real_malloc(ptr, size);
  // During a stream capture the runtime decides: cudaMalloc is "potentially unsafe" there,
  // refused on a prohibited thread (and the capture invalidated), allowed on others; the pool
  // would answer success either way. Its memory is then the driver's, not a pool block.
  if (!settings().pool || captures_active()) {
    PassAlloc pa(AllocKind::device_passthrough, {}, size, true);
    if (!pa.ok()) return latch_runtime_oom();
    cudaError_t rc = real_malloc(ptr, size);
    if (rc == cudaSuccess && *ptr) pa.commit(*ptr, size, driver_size(*ptr, size), 0);
    return rc;
  }
  ContextState* st = current_state();
  if (!st) {
    // No current context yet: cudaMalloc would create the device's primary context; the
    // documented way to do exactly that is cudaFree(0).
    if (auto init = real<Fn::cudaFree>()) init(nullptr);
    st = current_state();
  }
  std::uint32_t stack = alloc_stack();
  if (st && pooled_alloc(st, ptr, size, stack)) return cudaSuccess;
  return fallback_alloc(st, size, stack, ptr, "cudaMalloc", cudaErrorMemoryAllocation,
                        [&] { return real_malloc(ptr, size); });
}

cudaError_t rt_free(void* ptr) noexcept {
  HookScope scope;
  auto real_free = real<Fn::cudaFree>();
  if (!real_free) return cudaErrorInitializationError;
  // cudaFree(0) initializes the context and reports earlier asynchronous errors: untouched.
  if (!ptr || !scope.active()) return real_free(ptr);
  // Refused for a capture: the runtime's answer, latched for cudaGetLastError as it latches it
  // (refused again: the capture is invalidated already).
  if (capture_refusal(ptr) != CUDA_SUCCESS) return real_free(&g_never_device_memory);
  switch (pooled_free(ptr)) {
    case PoolFree::freed: return cudaSuccess;
    case PoolFree::invalid:
      // Inside one of our segments but not a live block (double free, interior pointer):
      // what cudaFree answers for such pointers. Never pass it on: the real free of a
      // segment base would free the whole segment under other live blocks.
      record_free(AllocKind::device_pooled, current_device(), addr(ptr), 0, format::kFlagFailed, 0, free_stack());
      // The runtime answers an invalid pointer with cudaErrorInvalidValue *and* latches it
      // for cudaGetLastError; only the runtime can set that, so ask it to free a host
      // address that is never device memory (found by tests/preload/test_reliability.cpp).
      return real_free(&g_never_device_memory);
    case PoolFree::not_ours: break;
  }
  note_free(AllocKind::device_passthrough, ptr, 0);
  return real_free(ptr);
}

// ---- cuMemAlloc_v2 / cuMemFree_v2 ----

CUresult drv_mem_alloc(CUdeviceptr* dptr, std::size_t size) noexcept {
  HookScope scope;
  auto real_alloc = real<Fn::cuMemAlloc_v2>();
  if (!real_alloc) return CUDA_ERROR_NOT_INITIALIZED;
  // During a capture the driver decides (rt_malloc).
  ContextState* st = (scope.active() && dptr && size && !captures_active()) ? current_state() : nullptr;
  if (!st) {  // pool off, no context (the driver returns its own error), nested, or a capture
    if (!scope.active() || !dptr || !size) return real_alloc(dptr, size);
    PassAlloc pa(AllocKind::device_passthrough, {}, size, false);
    if (!pa.ok()) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real_alloc(dptr, size);
    if (rc == CUDA_SUCCESS && *dptr) {
      void* p = reinterpret_cast<void*>(*dptr);
      pa.commit(p, size, driver_size(p, size), 0);
    }
    return rc;
  }
  std::uint32_t stack = alloc_stack();
  void* p = nullptr;
  if (pooled_alloc(st, &p, size, stack)) {
    *dptr = addr(p);
    return CUDA_SUCCESS;
  }
  void** out = reinterpret_cast<void**>(dptr);
  return fallback_alloc(st, size, stack, out, "cuMemAlloc_v2", CUDA_ERROR_OUT_OF_MEMORY,
                        [&] { return real_alloc(dptr, size); });
}

CUresult drv_mem_free(CUdeviceptr dptr) noexcept {
  HookScope scope;
  auto real_free = real<Fn::cuMemFree_v2>();
  if (!real_free) return CUDA_ERROR_NOT_INITIALIZED;
  void* p = reinterpret_cast<void*>(dptr);
  if (!p || !scope.active()) return real_free(dptr);
  // The driver needs a current context for cuMemFree (CUDA_ERROR_INVALID_CONTEXT without
  // one, freeing nothing); the pool would find the block by pointer and free it anyway.
  if (CUcontext ctx = nullptr;
      real<Fn::cuCtxGetCurrent>() && real<Fn::cuCtxGetCurrent>()(&ctx) == CUDA_SUCCESS && !ctx) {
    // By pointer, retired states too (as before; an abandoned pool contains nothing).
    if (contexts().for_each_including_retired([&](ContextState* s) { return s->pool.contains(p); })) {
      record_free(AllocKind::device_pooled, -1, dptr, 0, format::kFlagFailed, 0, free_stack());
      return CUDA_ERROR_INVALID_CONTEXT;
    }
  }
  if (CUresult rc = capture_refusal(p); rc != CUDA_SUCCESS) return rc;
  switch (pooled_free(p)) {
    case PoolFree::freed: return CUDA_SUCCESS;
    case PoolFree::invalid:
      record_free(AllocKind::device_pooled, current_device(), dptr, 0, format::kFlagFailed, 0, free_stack());
      return CUDA_ERROR_INVALID_VALUE;
    case PoolFree::not_ours: break;
  }
  note_free(AllocKind::device_passthrough, p, 0);
  return real_free(dptr);
}

// ---- cudaFreeAsync / cuMemFreeAsync (and _ptsz) ----
//
// Memory from cudaMalloc may be freed with cudaFreeAsync (CUDA Programming Guide,
// Stream-Ordered Memory Allocator), so a pool block can arrive here. The driver must never
// see it: a segment base would free the whole segment under its other live blocks, an
// interior block would fail where the runtime succeeds. It goes back to the pool, whose
// fences (recorded on every stream the pool knows, after the free) keep it from other
// streams until the work queued on `stream` before the free is done.

namespace {

// The state whose pool holds ptr (a live block or not), retired ones included; or null.
ContextState* pool_owner(const void* ptr) noexcept {
  if (contexts().size() == 0) return nullptr;
  return contexts().for_each_including_retired([&](ContextState* s) { return s->pool.contains(ptr); });
}

// "During stream capture, this function results in the creation of a free node and must
// therefore be passed the address of a graph allocation" (CUDA Runtime API, cudaFreeAsync):
// pool memory is none, so the caller answers as for any pointer that is not one.
bool capturing(CUstream s, bool per_thread) noexcept {
  auto is_capturing = real<Fn::cuStreamIsCapturing>();
  if (per_thread && !s) s = CU_STREAM_PER_THREAD;
  CUstreamCaptureStatus cs = CU_STREAM_CAPTURE_STATUS_NONE;
  return is_capturing && s && s != CU_STREAM_LEGACY && is_capturing(s, &cs) == CUDA_SUCCESS &&
         cs != CU_STREAM_CAPTURE_STATUS_NONE;
}

// The pool part of a stream-ordered free of pool memory (owner holds ptr). False: not a
// block the runtime would free (interior, freed already, a capturing stream), recorded so.
bool pooled_free_async(ContextState* owner, const void* ptr, CUstream s, bool per_thread) noexcept {
  if (!capturing(s, per_thread)) {
    note_free_stream(owner->ctx, s, per_thread);  // before the free: it may seal a fence at once
    if (free_in(owner, ptr, free_stack(), addr(s)) == PoolFree::freed) return true;
  }
  record_free(AllocKind::device_pooled, owner->device, addr(ptr), 0, format::kFlagFailed, addr(s), free_stack());
  return false;
}

}  // namespace

cudaError_t rt_free_async(void* ptr, cudaStream_t stream, bool per_thread) noexcept {
  HookScope scope;
  auto real_free = per_thread ? real<Fn::cudaFreeAsync_ptsz>() : real<Fn::cudaFreeAsync>();
  if (!real_free) return cudaErrorInitializationError;
  ContextState* owner = ptr && scope.active() ? pool_owner(ptr) : nullptr;
  auto s = reinterpret_cast<CUstream>(stream);
  if (!owner) {
    if (ptr && scope.active()) note_free(AllocKind::async, ptr, addr(s));
    return real_free(ptr, stream);
  }
  if (pooled_free_async(owner, ptr, s, per_thread)) return cudaSuccess;
  // Not a block the runtime would free: its answer, latched for cudaGetLastError (rt_free).
  return real_free(&g_never_device_memory, stream);
}

CUresult drv_mem_free_async(CUdeviceptr dptr, CUstream s, bool per_thread) noexcept {
  HookScope scope;
  auto real_free = per_thread ? real<Fn::cuMemFreeAsync_ptsz>() : real<Fn::cuMemFreeAsync>();
  if (!real_free) return CUDA_ERROR_NOT_INITIALIZED;
  void* p = reinterpret_cast<void*>(dptr);
  ContextState* owner = p && scope.active() ? pool_owner(p) : nullptr;
  if (!owner) {
    if (p && scope.active()) note_free(AllocKind::async, p, addr(s));
    return real_free(dptr, s);
  }
  // The driver checks the stream (and, for the default streams, the current context) before
  // the pointer: a free of an address it never handed out gives exactly its answer for
  // this stream, CUDA_ERROR_INVALID_VALUE when only the pointer is wrong.
  const CUdeviceptr never = addr(&g_never_device_memory);
  CUresult probe = real_free(never, s);
  if (probe != CUDA_ERROR_INVALID_VALUE) return probe;
  return pooled_free_async(owner, p, s, per_thread) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// ---- memory info: bytes cached in the pool and not in use are free for the program ----

namespace {
// free = driver free + pool bytes cached and unused; under a cap, total = the cap and
// free = cap - held + cached, never more than what the driver really has (+ our cache).
void add_cached(std::size_t* free_b, std::size_t* total_b) noexcept {
  if (!free_b || !total_b) return;
  ContextState* st = current_state();
  std::size_t cached = st ? st->pool.cached_unused() : 0;
  std::size_t f = *free_b + cached;
  int dev = st ? st->device : current_device();
  if (std::uint64_t lim = device_limit(dev); lim && lim < *total_b) {
    DeviceBudget* b = budget(dev);
    std::int64_t held = b ? b->held() : 0;
    std::int64_t in_cap = static_cast<std::int64_t>(lim) - held + static_cast<std::int64_t>(cached);
    std::size_t cap_free = in_cap > 0 ? static_cast<std::size_t>(in_cap) : 0;
    if (cap_free < f) f = cap_free;
    *total_b = static_cast<std::size_t>(lim);
  }
  *free_b = f < *total_b ? f : *total_b;
}
}  // namespace

cudaError_t rt_mem_get_info(std::size_t* free_b, std::size_t* total_b) noexcept {
  HookScope scope;
  auto fn = real<Fn::cudaMemGetInfo>();
  if (!fn) return cudaErrorInitializationError;
  cudaError_t rc = fn(free_b, total_b);
  if (rc == cudaSuccess && scope.active()) add_cached(free_b, total_b);
  return rc;
}

CUresult drv_mem_get_info(std::size_t* free_b, std::size_t* total_b) noexcept {
  HookScope scope;
  auto fn = real<Fn::cuMemGetInfo_v2>();
  if (!fn) return CUDA_ERROR_NOT_INITIALIZED;
  // No current context: the driver answers with its error; we add nothing (and must not
  // crash there, a trap seen in other interposers).
  CUresult rc = fn(free_b, total_b);
  if (rc == CUDA_SUCCESS && scope.active()) add_cached(free_b, total_b);
  return rc;
}

}  // namespace preload
}  // namespace gpuheap
