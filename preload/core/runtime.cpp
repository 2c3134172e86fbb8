// Start-up, settings, per-context pool states, fork handling and the trace observer.
#include "preload/core/runtime.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <new>

#include "preload/core/fork.h"
#include "preload/core/limits.h"
#include "preload/core/state.h"
#include "preload/core/stderr_line.h"
#include "preload/hooks/real.h"
#include "preload/record/outpath.h"
#include "preload/record/recorder.h"

namespace gpuheap {
namespace preload {

constinit thread_local int t_hook_depth = 0;

namespace {

constinit Settings g_settings;  // read once by gpuheap_init; pool changes in a fork child
std::atomic<bool> g_enabled{false};

// Context -> state (contexts.h). Constant-initialized: usable from the first hook, before
// any constructor of ours ran.
constinit ContextTable g_contexts;

struct ThreadCache {
  CUcontext ctx;
  ContextState* state;
};
thread_local ThreadCache t_cache{nullptr, nullptr};
std::atomic<unsigned> g_fork_generation{0};
thread_local unsigned t_cache_generation = 0;

bool serves(const ContextState* s, CUcontext ctx) noexcept {
  return s && s->ctx == ctx && !s->retired.load(std::memory_order_acquire);
}

// The state serving ctx, made on first use. nullptr (the caller passes through): no device
// for ctx, a full table, or host memory short (nothrow: never abort the job over it).
ContextState* find_or_create(CUcontext ctx) noexcept {
  auto device_of = [] {
    CUdevice dev = 0;
    auto get_dev = real<Fn::cuCtxGetDevice>();
    return get_dev && get_dev(&dev) == CUDA_SUCCESS ? static_cast<int>(dev) : -1;
  };
  auto make = [ctx](int dev) -> ContextState* {
    pool::PoolConfig cfg;
    cfg.seal_interval_ns = g_settings.seal_ns;
    cfg.unsafe_reuse = g_settings.unsafe_reuse;
    return new (std::nothrow) ContextState(ctx, dev, cfg);
  };
  return g_contexts.find_or_create(ctx, device_of, make);
}

bool device_info(int device, char* name, std::size_t cap, std::uint64_t* total) noexcept {
  HookScope guard;  // the driver calls below must not be recorded
  auto get = real<Fn::cuDeviceGet>();
  auto get_name = real<Fn::cuDeviceGetName>();
  auto get_total = real<Fn::cuDeviceTotalMem_v2>();
  CUdevice d = 0;
  if (!get || get(&d, device) != CUDA_SUCCESS) return false;
  if (get_name && get_name(name, static_cast<int>(cap), d) != CUDA_SUCCESS) name[0] = '\0';
  size_t t = 0;
  if (get_total && get_total(&t, d) == CUDA_SUCCESS) *total = t;
  return true;
}

void atfork_child() noexcept {
  // CUDA is not usable in a child forked after initialization (CUDA Programming Guide,
  // "CUDA does not support fork() after initialization"); a pool carried over would hand
  // out parent memory without the error the real runtime gives. Pass everything through.
  // A parent that never created a context leaves the child free to use CUDA (a fork-based
  // worker pool started before any CUDA call): then the pool stays on.
  // Locks another parent thread may have held at the fork are rebuilt, never taken.
  if (g_contexts.reset_in_child()) g_settings.pool = false;
  registry_reset_in_child();
  g_fork_generation.fetch_add(1, std::memory_order_acq_rel);
  stream_registry().forget_all();
}

// "PID:START" of this process: START (clock ticks since boot, field 22 of /proc/self/stat)
// tells a reused pid apart. Stack buffers only.
void process_identity(char* out, std::size_t cap) noexcept {
  char buf[1024];
  unsigned long long start = 0;
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
  if (fd >= 0) close(fd);
  if (n > 0) {
    buf[n] = '\0';
    const char* p = strrchr(buf, ')');  // the name may hold spaces and ')'
    for (int i = 0; p && i < 20; ++i) p = strchr(p + 1, ' ');
    if (p) start = strtoull(p + 1, nullptr, 10);
  }
  snprintf(out, cap, "%ld:%llu", static_cast<long>(getpid()), start);
}

// GPUHEAP_FOLLOW_FORK=0: only the process started first is traced, not its forked or exec'd
// children. The first process that loads gpuheap claims GPUHEAP_FOLLOW_FORK_ROOT (its
// PID:START, which its children inherit); a process that finds another's there does nothing,
// as under GPUHEAP_DISABLE. Chosen over dropping libgpuheap from LD_PRELOAD: an exec that
// keeps the pid is still the started process (wrapper scripts that `exec python ...`, pyenv
// shims, `sh -c 'prog'`), LD_PRELOAD is left as the user wrote it (no guessing which entry
// is us in a list of paths and names), and a child that re-adds LD_PRELOAD itself is still
// not traced. Forked children stop at the fork already (recorder.cpp). setenv runs in the
// constructor: host memory only, no hook; it is racy only if another thread reads the
// environment right then (a thread started by an earlier library's constructor, or a late
// dlopen of gpuheap), which is why `gpuheap run` exports what it can itself. Returns whether
// to trace.
bool claim_follow_fork_root(const Settings& s) noexcept {
  char me[64];
  process_identity(me, sizeof me);
  if (s.follow_fork_root[0]) return strcmp(s.follow_fork_root, me) == 0;
  setenv("GPUHEAP_FOLLOW_FORK_ROOT", me, 1);
  return true;
}

// A relative GPUHEAP_OUTPUT (or the default, "./...") is resolved once, here, in the
// directory the first traced process loaded gpuheap in, and exported absolute: a process
// that changes directory before its first event, and every program it execs
// (`sh -c 'cd /tmp && prog'`, pyenv shims), still writes where the job started. Without a
// working directory the pattern stays relative (the recorder joins the directory it finds
// when it starts). Under `gpuheap run` the pattern arrives absolute and nothing is exported.
void resolve_output_once(Settings& s) noexcept {
  if (s.output && s.output[0] == '/') return;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) return;
  if (common::absolute_output_pattern(s.output, cwd, s.output_abs, sizeof s.output_abs) < 0) return;
  s.output = s.output_abs;
  setenv("GPUHEAP_OUTPUT", s.output_abs, 1);
}

__attribute__((constructor)) void gpuheap_init() noexcept {
  Settings& s = g_settings;
  // Never act inside setuid/setgid programs (secure-execution mode, getauxval(3)): not even
  // the environment is read.
  if (getauxval(AT_SECURE) != 0) return;
  stderr_remember();  // before anything of ours is opened or printed (stderr_line.h)
  read_settings(&s);
  if (s.disable) return;
  if (!s.follow_fork && !claim_follow_fork_root(s)) return;
  resolve_output_once(s);
  limits_init(s.limit);
  set_device_info_fn(device_info);
  fork_set(ForkRank::runtime, {nullptr, nullptr, atfork_child});
  recorder_start(s);
  g_enabled.store(true, std::memory_order_release);
}

}  // namespace

bool HookScope::active() const noexcept { return outer_ && g_enabled.load(std::memory_order_relaxed); }

const Settings& settings() noexcept { return g_settings; }

ContextState* current_state() noexcept {
  if (!g_settings.pool) return nullptr;
  auto get = real<Fn::cuCtxGetCurrent>();
  CUcontext ctx = nullptr;
  if (!get || get(&ctx) != CUDA_SUCCESS || !ctx) return nullptr;
  unsigned gen = g_fork_generation.load(std::memory_order_relaxed);
  if (t_cache.ctx == ctx && serves(t_cache.state, ctx) && t_cache_generation == gen) return t_cache.state;
  ContextState* s = find_or_create(ctx);
  t_cache = {ctx, s};
  t_cache_generation = gen;
  return s;
}

ContextTable& contexts() noexcept { return g_contexts; }

int current_device() noexcept {
  auto get = real<Fn::cuCtxGetDevice>();
  CUdevice d = 0;
  if (!get || get(&d) != CUDA_SUCCESS) return -1;
  return static_cast<int>(d);
}

std::size_t empty_cache_all(format::EmptyCacheReason reason) noexcept {
  HookScope guard;
  std::size_t total = 0;
  // Live only: a retired state's pool was abandoned with its context.
  g_contexts.for_each_live([&](ContextState* s) { total += s->pool.empty_cache(reason); });
  return total;
}

// ---- trace observer (called under the pool lock) ----

void TraceObserver::on_segment_alloc(void* ptr, std::size_t size, bool small) noexcept {
  ensure_device(device_);
  stats_reserve(device_, static_cast<std::int64_t>(size));
  format::SegmentRecord r{now_ns(), static_cast<std::int16_t>(device_),
                          static_cast<std::uint8_t>(small ? format::kFlagSmallPool : 0),
                          reinterpret_cast<std::uint64_t>(ptr), size};
  record(r, false);
}

void TraceObserver::on_segment_free(void* ptr, std::size_t size, bool small) noexcept {
  stats_reserve(device_, -static_cast<std::int64_t>(size));
  format::SegmentRecord r{now_ns(), static_cast<std::int16_t>(device_),
                          static_cast<std::uint8_t>(small ? format::kFlagSmallPool : 0),
                          reinterpret_cast<std::uint64_t>(ptr), size};
  record(r, true);
}

void TraceObserver::on_free_completed(void* ptr, std::size_t size) noexcept {
  record(format::FreeCompletedRecord{now_ns(), static_cast<std::int16_t>(device_), reinterpret_cast<std::uint64_t>(ptr),
                                     size});
}

void TraceObserver::on_retry(std::size_t requested) noexcept {
  record(format::RetryRecord{now_ns(), static_cast<std::int16_t>(device_), requested});
}

void TraceObserver::on_empty_cache(std::size_t released, format::EmptyCacheReason reason) noexcept {
  record(format::EmptyCacheRecord{now_ns(), static_cast<std::int16_t>(device_), reason, released});
}

}  // namespace preload
}  // namespace gpuheap

namespace gpuheap {
namespace preload {

void note_stream_created(CUstream s) noexcept {
  auto get = real<Fn::cuCtxGetCurrent>();
  CUcontext ctx = nullptr;
  if (!s || !get || get(&ctx) != CUDA_SUCCESS || !ctx) return;
  stream_registry().add(ctx, s);
}

void note_stream_destroyed(CUstream s) noexcept {
  // Blocks freed before the destroy may still be used by work queued on s; "the resources
  // associated with stream will be released automatically once the device has completed
  // all work in stream" (CUDA Runtime API, cudaStreamDestroy), so an event recorded on s now
  // completes after that work. Seal the pending frees of s's context while s is still in
  // the registry, so their fence includes s; later fences no longer need it.
  if (CUcontext ctx = stream_registry().ctx_of(s)) {
    // Retired states too, as before (their pools are empty: sealing them is a no-op).
    g_contexts.for_each_including_retired([&](ContextState* st) {
      if (st->ctx == ctx) st->pool.seal_pending();
    });
  }
  stream_registry().remove(s);
}

}  // namespace preload
}  // namespace gpuheap
