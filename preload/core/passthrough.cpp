// Pass-through allocations (every kind the pool does not serve): cap reservation on the
// right device, the registry that later frees are matched against, and VMM handles that
// outlive their cuMemRelease while mapped.
#include <new>

#include "preload/core/cuda_upstream.h"
#include "preload/core/limits.h"
#include "preload/core/passthrough.h"
#include "preload/core/runtime.h"
#include "preload/core/state.h"
#include "preload/hooks/real.h"

namespace gpuheap {
namespace preload {

using format::AllocKind;

Registry& registry() noexcept {
  static Registry* r = new Registry;  // leaked: frees can run from exit handlers
  return *r;
}

void registry_reset_in_child() noexcept { new (&registry()) Registry(); }

cudaError_t latch_runtime_oom() noexcept {
  if (auto m = real<Fn::cudaMalloc>()) {
    void* p = nullptr;
    if (m(&p, SIZE_MAX) == cudaSuccess && p) real<Fn::cudaFree>()(p);  // cannot happen; never leak
  }
  return cudaErrorMemoryAllocation;
}

namespace {

CUcontext current_ctx() noexcept {
  CUcontext ctx = nullptr;
  auto get = real<Fn::cuCtxGetCurrent>();
  if (!get || get(&ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

int device_of_ctx(CUcontext ctx) noexcept {
  // Live only: a retired state's handle may since name a context on another device.
  if (ContextState* s = contexts().find(ctx)) return s->device;
  ContextScope scope(ctx);
  return current_device();
}

// Pools created through cuMemPoolCreate (cudaMemPoolCreate reaches it too), by handle. A
// handle value reused after cuMemPoolDestroy comes back through cuMemPoolCreate and is
// overwritten there.
struct PoolDevice {
  CUmemoryPool pool;
  int device;
};
constexpr int kMaxPools = 256;
PoolDevice g_pools[kMaxPools];
int g_num_pools = 0;
std::mutex g_pools_mu;

int mempool_device(CUmemoryPool pool) noexcept {
  {
    std::lock_guard<std::mutex> lk(g_pools_mu);
    for (int i = 0; i < g_num_pools; ++i)
      if (g_pools[i].pool == pool) return g_pools[i].device;
  }
  // A device's default pool is not created through cuMemPoolCreate.
  auto get_default = real<Fn::cuDeviceGetDefaultMemPool>();
  auto count = real<Fn::cuDeviceGetCount>();
  int n = 0;
  if (get_default && count && count(&n) == CUDA_SUCCESS)
    for (int d = 0; d < n; ++d)
      if (CUmemoryPool p = nullptr; get_default(&p, d) == CUDA_SUCCESS && p == pool) return d;
  return current_device();
}

int stream_device(CUstream s) noexcept {
  // The legacy and per-thread default streams belong to the current context.
  if (!s || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) return current_device();
  if (CUcontext ctx = stream_registry().ctx_of(s)) return device_of_ctx(ctx);
  return current_device();  // a stream not created through us: best guess
}

int resolve_device(AllocKind kind, DeviceOf where) noexcept {
  if (kind == AllocKind::host_pinned) return -1;
  switch (where.what) {
    case DeviceOf::stream: return stream_device(static_cast<CUstream>(const_cast<void*>(where.obj)));
    case DeviceOf::mempool: return mempool_device(static_cast<CUmemoryPool>(const_cast<void*>(where.obj)));
    case DeviceOf::prop: {
      auto* prop = static_cast<const CUmemAllocationProp*>(where.obj);
      if (!prop) return current_device();
      // Host-located physical memory (CU_MEM_LOCATION_TYPE_HOST*) is not device memory.
      return prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop->location.id : -1;
    }
    case DeviceOf::current: break;
  }
  return current_device();
}

// Like the pool's own OOM path: give the cache of the device's pools back first.
void release_pool_caches(int device) noexcept {
  // Live only: a retired state's pool was abandoned with its context.
  contexts().for_each_live([&](ContextState* s) {
    if (s->device == device) s->pool.empty_cache(format::EmptyCacheReason::oom_retry);
  });
}

void uncharge(const Entry& e) noexcept {
  if (e.charged)
    if (DeviceBudget* b = budget(e.device)) b->charge(-e.charged);
}

}  // namespace

void note_mempool_created(CUmemoryPool pool, const CUmemPoolProps* props) noexcept {
  if (!pool || !props || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE) return;
  std::lock_guard<std::mutex> lk(g_pools_mu);
  for (int i = 0; i < g_num_pools; ++i)
    if (g_pools[i].pool == pool) return void(g_pools[i].device = props->location.id);
  if (g_num_pools < kMaxPools) g_pools[g_num_pools++] = {pool, props->location.id};
}

PassAlloc::PassAlloc(AllocKind kind, DeviceOf where, std::size_t size, bool runtime) noexcept
    : kind_(kind), device_(resolve_device(kind, where)) {
  if (device_ < 0 && runtime && kind != AllocKind::host_pinned && where.what == DeviceOf::current) {
    // A thread's first runtime call binds the device's primary context; without one yet the
    // charge would go nowhere. cudaFree(0) is the documented way to make that binding.
    if (auto init = real<Fn::cudaFree>()) init(nullptr);
    device_ = current_device();
  }
  DeviceBudget* b = counts_against_limit(kind) ? budget(device_) : nullptr;
  if (!b) return;
  std::uint64_t lim = device_limit(device_);
  if (b->try_charge(size, lim, &charged_)) return;
  release_pool_caches(device_);
  if (b->try_charge(size, lim, &charged_)) return;
  ok_ = false;
  record_oom(nullptr, device_, kind, format::alloc_kind_name(kind), size, 0, alloc_stack());
}

PassAlloc::~PassAlloc() {
  if (!committed_ && charged_)
    if (DeviceBudget* b = budget(device_)) b->charge(-charged_);
}

void PassAlloc::commit(const void* ptr, std::size_t requested, std::size_t size, std::uint64_t stream) noexcept {
  if (!ok_ || committed_) return;
  committed_ = true;
  Entry e{kind_, static_cast<std::int16_t>(device_), size};
  e.stack = alloc_stack();
  e.ctx = current_ctx();
  if (counts_against_limit(kind_))
    if (DeviceBudget* b = budget(device_)) {
      // The driver may round up (pitch, granularity): the charge follows what it handed out.
      b->charge(static_cast<std::int64_t>(size) - charged_);
      e.charged = static_cast<std::int64_t>(size);
    }
  registry().put(format::address_space(kind_), addr(ptr), e);
  record_alloc(kind_, device_, addr(ptr), requested, size, 0, stream, e.stack);
}

void note_map(CUdeviceptr ptr, std::size_t size, CUmemGenericAllocationHandle handle) noexcept {
  Entry e{AllocKind::vmm_map, static_cast<std::int16_t>(current_device()), size};
  e.stack = alloc_stack();
  e.ctx = current_ctx();
  e.handle = handle;
  registry().update(Family::vmm_handle, handle, [](Entry& h) {
    ++h.maps;
    return false;
  });
  registry().put(Family::vmm_map, ptr, e);
  record_alloc(AllocKind::vmm_map, e.device, ptr, size, size, 0, 0, e.stack);
}

namespace {
// One free of the registry entry at ptr; returns the bytes it covered (0: none there, which
// is recorded as a failed free only when `record_missing`).
std::uint64_t free_entry(AllocKind kind, const void* ptr, std::uint64_t stream, bool record_missing) noexcept {
  Entry e{kind, -1, 0};
  const Family fam = format::address_space(kind);
  bool found;
  if (fam == Family::vmm_handle) {
    // cuMemRelease of a handle still mapped: "the memory allocation will be freed when all
    // outstanding mappings to the memory are unmapped" (CUDA Driver API, cuMemRelease). It
    // stays held and charged; the free is recorded at the last cuMemUnmap.
    bool deferred = false;
    found = registry().update(fam, addr(ptr), [&](Entry& h) {
      e = h;
      if (h.maps == 0) return true;
      deferred = h.released = true;
      return false;
    });
    if (deferred) return e.size;
  } else {
    found = registry().take(fam, addr(ptr), &e);
  }
  if (!found) {
    if (record_missing) record_free(kind, -1, addr(ptr), 0, format::kFlagFailed, stream, free_stack());
    return 0;
  }
  uncharge(e);
  std::uint32_t stack = free_stack();
  record_free(e.kind, e.device, addr(ptr), e.size, 0, stream, stack);
  if (fam != Family::vmm_map || !e.handle) return e.size;
  Entry h{AllocKind::vmm_physical, -1, 0};
  bool last = false;
  registry().update(Family::vmm_handle, e.handle, [&](Entry& x) {
    if (x.maps) --x.maps;
    last = x.maps == 0 && x.released;
    if (last) h = x;
    return last;
  });
  if (last) {
    uncharge(h);
    record_free(AllocKind::vmm_physical, h.device, e.handle, h.size, 0, 0, stack);
  }
  return e.size;
}
}  // namespace

void note_free(AllocKind kind, const void* ptr, std::uint64_t stream) noexcept { free_entry(kind, ptr, stream, true); }

void note_unmap(CUdeviceptr ptr, std::size_t size) noexcept {
  // One cuMemUnmap may cover several adjacent cuMemMap ranges (the CUDA samples' multi-device
  // VMM allocator maps one stripe per device and unmaps the whole range in one call), but
  // only whole ones: "the range must be the entire contiguous address range that was mapped
  // to" (CUDA Driver API, cuMemUnmap); anything else is refused (CUDA_ERROR_INVALID_VALUE)
  // and unmaps nothing. So the range is checked first: exactly tiled by tracked mappings,
  // each is freed in address order; otherwise one failed free, and nothing changes.
  const std::uint64_t end = ptr + size;
  std::uint64_t at = ptr;
  while (at < end) {
    std::uint64_t n = 0;
    registry().update(Family::vmm_map, at, [&](Entry& e) {
      n = e.size;
      return false;
    });
    if (!n) break;
    at += n;
  }
  if (size == 0 || at != end) {
    record_free(AllocKind::vmm_map, -1, ptr, 0, format::kFlagFailed, 0, free_stack());
    return;
  }
  for (at = ptr; at < end;) {
    std::uint64_t n = free_entry(AllocKind::vmm_map, reinterpret_cast<const void*>(at), 0, true);
    if (!n) break;  // unmapped meanwhile by another thread (the program's race)
    at += n;
  }
}

namespace {
void record_dropped_block(void* arg, const pool::PoolBlock& b) noexcept {
  auto flags = static_cast<std::uint8_t>((b.small ? format::kFlagSmallPool : 0) |
                                         (b.oversize ? format::kFlagOversize : 0));
  record_free(AllocKind::device_pooled, *static_cast<int*>(arg), addr(b.ptr), b.size, flags, 0, 0);
}
}  // namespace

void note_context_destroyed(CUcontext ctx) noexcept {
  if (!ctx) return;
  HookScope guard;  // nothing below is the program's own call
  // Retired before its pool is emptied (contexts.h): a thread racing the teardown then
  // makes or revives one; a program using a context it is destroying gets what the driver
  // gives it.
  contexts().retire(ctx, [](ContextState* s) {
    int dev = s->device;
    s->upstream.forget(s->pool.abandon(record_dropped_block, &dev));
  });
  // Stream-ordered allocations live in memory pools, which a reset does not destroy
  // (CUDA Runtime API, cudaDeviceReset); VMM handles are not tied to a context.
  registry().erase_if(Family::pointer, [&](std::uint64_t key, const Entry& e) {
    if (e.ctx != ctx || e.kind == AllocKind::async) return false;
    uncharge(e);
    record_free(e.kind, e.device, key, e.size, 0, 0, 0);
    return true;
  });
  stream_registry().remove_context(ctx);
}

namespace {
// The device's primary context (retained and released again to learn its handle; retaining
// an inactive one creates it), or null.
CUcontext primary_ctx(int device) noexcept {
  auto retain = real<Fn::cuDevicePrimaryCtxRetain>();
  auto release = real<Fn::cuDevicePrimaryCtxRelease_v2>();
  CUcontext primary = nullptr;
  if (!retain || !release || retain(&primary, device) != CUDA_SUCCESS) return nullptr;
  release(device);
  return primary;
}
}  // namespace

void note_context_destroy(CUcontext ctx) noexcept {
  if (!ctx) return;
  HookScope guard;
  // The device of what gpuheap tracks in ctx; nothing tracked (or destroyed already): no-op.
  // Live only: a retired state of ctx was torn down already.
  int dev = -1;
  contexts().for_each_live([&](ContextState* s) {
    if (s->ctx == ctx) dev = s->device;
  });
  if (dev < 0)
    registry().for_each(Family::pointer, [&](const Entry& e) {
      if (e.ctx == ctx) dev = e.device;
    });
  if (dev < 0) return;
  // The driver refuses to destroy a primary context ("Cannot destroy primary context",
  // CUDA_ERROR_INVALID_CONTEXT): its memory stays live. Recognised without creating anything:
  // only an active primary context is looked up to compare handles.
  auto get_state = real<Fn::cuDevicePrimaryCtxGetState>();
  unsigned flags = 0;
  int active = 0;
  if (get_state && get_state(dev, &flags, &active) == CUDA_SUCCESS && active && primary_ctx(dev) == ctx) return;
  // Recorded before the real destroy: once it returns, the driver may hand the addresses
  // (and the handle) to another thread, whose allocations must come after these frees.
  note_context_destroyed(ctx);
}

void note_primary_reset(int device, bool only_if_current) noexcept {
  if (device < 0) device = current_device();
  if (device < 0) return;
  // Only look the primary context up when something of this device is tracked: retaining
  // an inactive primary context would create it.
  // Live states only: a retired one holds nothing.
  bool tracked = false;
  contexts().for_each_live([&](ContextState* s) { tracked |= s->device == device; });
  registry().for_each(Family::pointer, [&](const Entry& e) { tracked |= e.device == device && e.ctx; });
  if (!tracked) return;
  CUcontext primary = primary_ctx(device);
  if (primary && (!only_if_current || current_ctx() == primary)) note_context_destroyed(primary);
}

}  // namespace preload
}  // namespace gpuheap
