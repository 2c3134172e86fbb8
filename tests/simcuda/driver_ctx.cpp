// Simulated driver: contexts. One primary context per device (retain/release/reset) plus
// contexts made with cuCtxCreate (any version) and destroyed with cuCtxDestroy; a per-thread
// stack of current contexts.
//
// A created context owns what was allocated while it was current (Allocation::ctx) and the
// streams created in it; cuCtxDestroy frees them. Destroyed context objects are recycled by
// the next cuCtxCreate, like the real driver whose handles are heap addresses that come back
// (CUDA.jl #2346: "after destroying a context, creating a new one may result in the same
// handle being reused"): tools keyed by CUcontext must cope with that.
#include "driver_internal.h"

#include <vector>

namespace simcuda::drv {
namespace {

thread_local std::vector<CUctx_st*> t_ctx_stack;  // top = current context

bool is_primary(CUcontext c) {
  State& s = state();
  for (int i = 0; i < s.device_count; ++i)
    if (c == &s.devices[i].primary) return true;
  return false;
}

// A handle that may be made current: a primary context or a created one not destroyed. The
// registry lookup keeps garbage pointers from being dereferenced.
bool usable(CUcontext c) {
  if (c == nullptr) return false;
  if (is_primary(c)) return true;
  std::lock_guard lock(state().handle_mu);
  return state().contexts.count(c) != 0 && !c->destroyed.load(std::memory_order_acquire);
}

constexpr unsigned kSchedFlags = CU_CTX_SCHED_MASK;

// The part shared by every cuCtxCreate version: a new context, pushed current.
CUresult create_context(CUcontext* pctx, unsigned flags, CUdevice dev) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  // "Only one of the scheduling flags can be set when creating a context."
  const unsigned sched = flags & kSchedFlags;
  if ((flags & ~unsigned{CU_CTX_FLAGS_MASK}) != 0 || (sched & (sched - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  CUctx_st* c = nullptr;
  {
    State& s = state();
    std::lock_guard lock(s.handle_mu);
    if (!s.spare_contexts.empty()) {
      c = s.spare_contexts.back();
      s.spare_contexts.pop_back();
    } else {
      c = new CUctx_st();
      s.contexts.insert(c);
    }
    c->device = dev;
    c->flags = flags;
    c->refs.store(1);  // "created with a usage count of 1"
    c->destroyed.store(false, std::memory_order_release);
  }
  // "If a context is already current to the thread, it is supplanted by the newly created
  // context and may be restored by a subsequent call to cuCtxPopCurrent()."
  t_ctx_stack.push_back(c);
  *pctx = c;
  return CUDA_SUCCESS;
}

}  // namespace

CUctx_st* current_ctx() { return t_ctx_stack.empty() ? nullptr : t_ctx_stack.back(); }

CUresult ctx_device(int* dev) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  CUctx_st* c = current_ctx();
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  // Still current here after another thread destroyed it: documented for cuCtxDestroy.
  if (c->destroyed.load(std::memory_order_acquire)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  *dev = c->device;
  return CUDA_SUCCESS;
}

}  // namespace simcuda::drv

using namespace simcuda::drv;

// ---- primary contexts -------------------------------------------------------------------------

SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  SIM_COUNT("cuDevicePrimaryCtxRetain");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  device(dev).primary.refs.fetch_add(1);
  *pctx = &device(dev).primary;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags, int* active) {
  SIM_COUNT("cuDevicePrimaryCtxGetState");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = device(dev).primary.refs.load() > 0 ? 1 : 0;
  return CUDA_SUCCESS;
}

// The context (and its memory) stays usable when the count reaches 0; the real driver would
// destroy it. Tests only need the reference counting to be accepted.
SIM_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  SIM_COUNT("cuDevicePrimaryCtxRelease_v2");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int expected = device(dev).primary.refs.load();
  while (expected > 0 && !device(dev).primary.refs.compare_exchange_weak(expected, expected - 1)) {
  }
  return expected > 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}
SIM_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { return cuDevicePrimaryCtxRelease_v2(dev); }

// Like cuDevicePrimaryCtxReset: waits for the device, then destroys the primary context's
// allocations and streams (cudaDeviceReset). Created contexts on the device keep theirs.
SIM_API CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  SIM_COUNT("cuDevicePrimaryCtxReset_v2");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  sync_device(dev);
  destroy_context_streams(&device(dev).primary);
  free_context_allocations(&device(dev).primary);
  return CUDA_SUCCESS;
}
SIM_API CUresult cuDevicePrimaryCtxReset(CUdevice dev) { return cuDevicePrimaryCtxReset_v2(dev); }

// ---- created contexts ---------------------------------------------------------------------------

SIM_API CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  SIM_COUNT("cuCtxCreate_v2");
  return create_context(pctx, flags, dev);
}
// The CUDA 2.x ABI: the same arguments.
SIM_API CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  SIM_COUNT("cuCtxCreate");
  return create_context(pctx, flags, dev);
}

// CUDA 11.4: with execution affinity, which "is only supported under Volta+ MPS": the
// simulated device has none, so only an empty list is accepted.
SIM_API CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int num_params, unsigned int flags,
                                CUdevice dev) {
  SIM_COUNT("cuCtxCreate_v3");
  if (num_params < 0 || (num_params > 0 && params == nullptr)) return CUDA_ERROR_INVALID_VALUE;
  if (num_params > 0) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
  return create_context(pctx, flags, dev);
}

// CUDA 12.5 (what cuCtxCreate means in CUDA 13 headers): NULL params is a plain context;
// execution affinity and CIG (graphics interop) mode are not simulated.
SIM_API CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags, CUdevice dev) {
  SIM_COUNT("cuCtxCreate_v4");
  if (params != nullptr) {
    if (params->cigParams != nullptr) return CUDA_ERROR_NOT_SUPPORTED;  // "if CIG is not supported"
    if (params->numExecAffinityParams < 0 ||
        (params->numExecAffinityParams > 0 && params->execAffinityParams == nullptr))
      return CUDA_ERROR_INVALID_VALUE;
    if (params->numExecAffinityParams > 0) return CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY;
  }
  return create_context(pctx, flags, dev);
}

// cuCtxDestroy: the context "will be destroyed regardless of how many threads it is current
// to", with every allocation made in it (cuMemAlloc, cuMemAllocHost, cuMemAllocManaged,
// cuMemAllocPitch) and its streams; stream-ordered and VMM memory survive. It is popped from
// the calling thread's stack when current there; other threads keep it current and get
// CUDA_ERROR_CONTEXT_IS_DESTROYED. A primary context is refused, as the real driver does
// ("Cannot destroy primary context", CUDA_ERROR_INVALID_CONTEXT); so is a destroyed one.
SIM_API CUresult cuCtxDestroy_v2(CUcontext ctx) {
  SIM_COUNT("cuCtxDestroy_v2");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (is_primary(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  {
    std::lock_guard lock(state().handle_mu);
    // Marked under the lock: of two racing destroys exactly one succeeds.
    if (state().contexts.count(ctx) == 0 || ctx->destroyed.load(std::memory_order_acquire))
      return CUDA_ERROR_INVALID_CONTEXT;
    ctx->destroyed.store(true, std::memory_order_release);
  }
  sync_device(ctx->device);  // queued work may still touch the memory freed below
  destroy_context_streams(ctx);
  free_context_allocations(ctx);
  if (!t_ctx_stack.empty() && t_ctx_stack.back() == ctx) t_ctx_stack.pop_back();
  // Recycled only now, so a concurrent cuCtxCreate never gets a half-destroyed context.
  std::lock_guard lock(state().handle_mu);
  state().spare_contexts.push_back(ctx);
  return CUDA_SUCCESS;
}
SIM_API CUresult cuCtxDestroy(CUcontext ctx) {
  SIM_COUNT("cuCtxDestroy");
  return cuCtxDestroy_v2(ctx);
}

// ---- the current context ------------------------------------------------------------------------

SIM_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pctx = current_ctx();
  return CUDA_SUCCESS;
}

// cuCtxSetCurrent replaces the top of the calling thread's stack (pushes onto an empty one);
// NULL pops, as documented.
SIM_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (ctx != nullptr && !usable(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  if (ctx == nullptr) {
    if (!t_ctx_stack.empty()) t_ctx_stack.pop_back();
  } else if (t_ctx_stack.empty()) {
    t_ctx_stack.push_back(ctx);
  } else {
    t_ctx_stack.back() = ctx;
  }
  return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (!usable(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
  t_ctx_stack.push_back(ctx);
  return CUDA_SUCCESS;
}
SIM_API CUresult cuCtxPushCurrent(CUcontext ctx) { return cuCtxPushCurrent_v2(ctx); }

SIM_API CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (t_ctx_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (pctx != nullptr) *pctx = t_ctx_stack.back();
  t_ctx_stack.pop_back();
  return CUDA_SUCCESS;
}
SIM_API CUresult cuCtxPopCurrent(CUcontext* pctx) { return cuCtxPopCurrent_v2(pctx); }

SIM_API CUresult cuCtxGetDevice(CUdevice* dev) {
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  int d = 0;
  if (CUresult r = ctx_device(&d); r != CUDA_SUCCESS) return r;
  *dev = d;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxSynchronize() {
  SIM_COUNT("cuCtxSynchronize");
  int d = 0;
  if (CUresult r = ctx_device(&d); r != CUDA_SUCCESS) return r;
  if (CUresult r = capture_device_sync(d); r != CUDA_SUCCESS) return r;
  sync_device(d);
  return CUDA_SUCCESS;
}
