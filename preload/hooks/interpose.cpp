// Every extern "C" interposer of libgpuheap.so lives here, each a few lines over the
// internal API (runtime.h). Exported: cuda*/cu* interposers, dlsym, pipe2, gpuheap_*
// (exports.map), and the ends that are not exit(): _exit, _Exit and the exec family (ends.h).
#include <dlfcn.h>
#include <stdarg.h>

#include <cstring>

#include "preload/core/cuda_upstream.h"
#include "preload/core/runtime.h"
#include "preload/gpuheap.h"
#include "preload/hooks/ends.h"
#include "preload/hooks/nvtx.h"
#include "preload/hooks/real.h"
#include "preload/record/recorder.h"
#include "preload/record/stackstats.h"
#include "preload/record/unwind.h"

using namespace gpuheap::preload;
using gpuheap::format::AllocKind;

extern char** environ;

#undef cuGetProcAddress  // cuda.h maps it to _v2; we define both exact names

namespace {

inline std::uint64_t u64(const void* p) { return reinterpret_cast<std::uint64_t>(p); }
inline void* vp(CUdeviceptr p) { return reinterpret_cast<void*>(p); }

// Call the real function, or answer "not initialized" when the library is not loaded.
template <Fn F, class... A>
inline cudaError_t rt(A... a) {
  auto f = real<F>();
  return f ? f(a...) : cudaErrorInitializationError;
}
template <Fn F, class... A>
inline CUresult drv(A... a) {
  auto f = real<F>();
  return f ? f(a...) : CUDA_ERROR_NOT_INITIALIZED;
}

// Either layer, as an int (cudaError_t and CUresult are both 0 on success).
template <Fn F, class... A>
inline int call(A... a) {
  auto f = real<F>();
  if (!f) return F < Fn::runtime_end_ ? int(cudaErrorInitializationError) : int(CUDA_ERROR_NOT_INITIALIZED);
  return static_cast<int>(f(a...));
}

// A pass-through allocation: cap charged first, real call, recorded on success (outermost
// hook only); charged to the device `where` names.
template <Fn F, class Ptr, class... A>
inline auto pass_alloc(AllocKind kind, DeviceOf where, Ptr* out, std::size_t req, std::uint64_t stream, A... a) {
  HookScope scope;
  if (!scope.active()) return call<F>(out, a...);
  PassAlloc pa(kind, where, req, F < Fn::runtime_end_);
  if (!pa.ok())  // over GPUHEAP_LIMIT: the API's out-of-memory answer
    return F < Fn::runtime_end_ ? int(latch_runtime_oom()) : int(CUDA_ERROR_OUT_OF_MEMORY);
  int rc = call<F>(out, a...);
  if (rc == 0 && out && *out) pa.commit(reinterpret_cast<void*>(*out), req, req, stream);
  return rc;
}

inline DeviceOf on_stream(const void* s) { return {DeviceOf::stream, s}; }
inline DeviceOf in_pool(const void* m) { return {DeviceOf::mempool, m}; }

// A pass-through free: recorded before the real free.
template <Fn F, class... A>
inline int pass_free(AllocKind kind, const void* p, std::uint64_t stream, A... a) {
  HookScope scope;
  if (scope.active() && p) note_free(kind, p, stream);
  return call<F>(a...);
}

template <Fn F, class S, class... A>
inline int stream_create(S* s, A... a) {
  HookScope scope;  // cudart's create calls the driver's: registered once either way
  int rc = call<F>(s, a...);
  if (rc == 0 && s) note_stream_created(reinterpret_cast<CUstream>(*s));
  return rc;
}

// cudaGetDriverEntryPoint uses the runtime's own CUDA version (CUDA Runtime API docs).
constexpr int kRuntimeVersion = CUDART_VERSION;
constexpr unsigned long long kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

}  // namespace

extern "C" {

// ---- runtime: pooled ----
__attribute__((visibility("default"))) cudaError_t cudaMalloc(void** p, size_t n) { return rt_malloc(p, n); }
__attribute__((visibility("default"))) cudaError_t cudaFree(void* p) { return rt_free(p); }
__attribute__((visibility("default"))) cudaError_t cudaMemGetInfo(size_t* f, size_t* t) {
  return rt_mem_get_info(f, t);
}

// ---- runtime: pass-through ----
#define GPUHEAP_EXPORT __attribute__((visibility("default")))
GPUHEAP_EXPORT cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t s) {
  return cudaError_t(pass_alloc<Fn::cudaMallocAsync>(AllocKind::async, on_stream(s), p, n, u64(s), n, s));
}
GPUHEAP_EXPORT cudaError_t cudaMallocAsync_ptsz(void** p, size_t n, cudaStream_t s) {
  note_per_thread_streams();  // only code built with per-thread default streams calls _ptsz
  return cudaError_t(pass_alloc<Fn::cudaMallocAsync_ptsz>(AllocKind::async, on_stream(s), p, n, u64(s), n, s));
}
GPUHEAP_EXPORT cudaError_t cudaFreeAsync(void* p, cudaStream_t s) { return rt_free_async(p, s, false); }
GPUHEAP_EXPORT cudaError_t cudaFreeAsync_ptsz(void* p, cudaStream_t s) {
  note_per_thread_streams();  // only code built with per-thread default streams calls _ptsz
  return rt_free_async(p, s, true);
}
GPUHEAP_EXPORT cudaError_t cudaMallocFromPoolAsync(void** p, size_t n, cudaMemPool_t m, cudaStream_t s) {
  return cudaError_t(pass_alloc<Fn::cudaMallocFromPoolAsync>(AllocKind::async, in_pool(m), p, n, u64(s), n, m, s));
}
GPUHEAP_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void** p, size_t n, cudaMemPool_t m, cudaStream_t s) {
  note_per_thread_streams();  // only code built with per-thread default streams calls _ptsz
  return cudaError_t(pass_alloc<Fn::cudaMallocFromPoolAsync_ptsz>(AllocKind::async, in_pool(m), p, n, u64(s), n, m, s));
}
GPUHEAP_EXPORT cudaError_t cudaMallocManaged(void** p, size_t n, unsigned flags) {
  return cudaError_t(pass_alloc<Fn::cudaMallocManaged>(AllocKind::managed, {}, p, n, 0, n, flags));
}
GPUHEAP_EXPORT cudaError_t cudaMallocHost(void** p, size_t n) {
  return cudaError_t(pass_alloc<Fn::cudaMallocHost>(AllocKind::host_pinned, {}, p, n, 0, n));
}
GPUHEAP_EXPORT cudaError_t cudaHostAlloc(void** p, size_t n, unsigned flags) {
  return cudaError_t(pass_alloc<Fn::cudaHostAlloc>(AllocKind::host_pinned, {}, p, n, 0, n, flags));
}
GPUHEAP_EXPORT cudaError_t cudaFreeHost(void* p) {
  return cudaError_t(pass_free<Fn::cudaFreeHost>(AllocKind::host_pinned, p, 0, p));
}
GPUHEAP_EXPORT cudaError_t cudaMallocPitch(void** p, size_t* pitch, size_t w, size_t h) {
  HookScope scope;
  if (!scope.active()) return rt<Fn::cudaMallocPitch>(p, pitch, w, h);
  PassAlloc pa(AllocKind::pitch, {}, w * h, true);
  if (!pa.ok()) return latch_runtime_oom();
  cudaError_t rc = rt<Fn::cudaMallocPitch>(p, pitch, w, h);
  if (rc == cudaSuccess && p && *p && pitch) pa.commit(*p, w * h, *pitch * h, 0);
  return rc;
}
GPUHEAP_EXPORT cudaError_t cudaMalloc3D(cudaPitchedPtr* pp, cudaExtent e) {
  HookScope scope;
  if (!scope.active()) return rt<Fn::cudaMalloc3D>(pp, e);
  PassAlloc pa(AllocKind::pitch, {}, e.width * e.height * e.depth, true);
  if (!pa.ok()) return latch_runtime_oom();
  cudaError_t rc = rt<Fn::cudaMalloc3D>(pp, e);
  if (rc == cudaSuccess && pp && pp->ptr)
    pa.commit(pp->ptr, e.width * e.height * e.depth, pp->pitch * e.height * e.depth, 0);
  return rc;
}
GPUHEAP_EXPORT cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaError_t(stream_create<Fn::cudaStreamCreate>(s));
}
GPUHEAP_EXPORT cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags) {
  return cudaError_t(stream_create<Fn::cudaStreamCreateWithFlags>(s, flags));
}
GPUHEAP_EXPORT cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned flags, int prio) {
  return cudaError_t(stream_create<Fn::cudaStreamCreateWithPriority>(s, flags, prio));
}
GPUHEAP_EXPORT cudaError_t cudaStreamDestroy(cudaStream_t s) {
  note_stream_destroyed(s);
  return rt<Fn::cudaStreamDestroy>(s);
}

// A reset destroys the primary context with all its memory (CUDA Runtime API,
// cudaDeviceReset): the pool and registry entries of that context are dropped first.
GPUHEAP_EXPORT cudaError_t cudaDeviceReset(void) {
  note_primary_reset(-1, /*only_if_current=*/true);  // the current device
  return rt<Fn::cudaDeviceReset>();
}

// ---- runtime: driver entry points ----
GPUHEAP_EXPORT cudaError_t cudaGetDriverEntryPoint(const char* sym, void** fn, unsigned long long flags,
                                                   cudaDriverEntryPointQueryResult* st) {
  cudaError_t rc = rt<Fn::cudaGetDriverEntryPoint>(sym, fn, flags, st);
  if (rc == cudaSuccess && fn) *fn = substitute_proc(sym, kRuntimeVersion, flags, *fn);
  return rc;
}
GPUHEAP_EXPORT cudaError_t cudaGetDriverEntryPoint_ptsz(const char* sym, void** fn, unsigned long long flags,
                                                        cudaDriverEntryPointQueryResult* st) {
  // The _ptsz entry is what code built with per-thread default streams calls: its default
  // search is the per-thread one.
  note_per_thread_streams();
  cudaError_t rc = rt<Fn::cudaGetDriverEntryPoint_ptsz>(sym, fn, flags, st);
  if (rc == cudaSuccess && fn) *fn = substitute_proc(sym, kRuntimeVersion, flags ? flags : kPerThread, *fn);
  return rc;
}
GPUHEAP_EXPORT cudaError_t cudaGetDriverEntryPointByVersion(const char* sym, void** fn, unsigned int ver,
                                                            unsigned long long flags,
                                                            cudaDriverEntryPointQueryResult* st) {
  cudaError_t rc = rt<Fn::cudaGetDriverEntryPointByVersion>(sym, fn, ver, flags, st);
  if (rc == cudaSuccess && fn) *fn = substitute_proc(sym, static_cast<int>(ver), flags, *fn);
  return rc;
}
GPUHEAP_EXPORT cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* sym, void** fn, unsigned int ver,
                                                                 unsigned long long flags,
                                                                 cudaDriverEntryPointQueryResult* st) {
  note_per_thread_streams();
  cudaError_t rc = rt<Fn::cudaGetDriverEntryPointByVersion_ptsz>(sym, fn, ver, flags, st);
  if (rc == cudaSuccess && fn) *fn = substitute_proc(sym, static_cast<int>(ver), flags ? flags : kPerThread, *fn);
  return rc;
}

// ---- driver: pooled ----
GPUHEAP_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* p, size_t n) { return drv_mem_alloc(p, n); }
GPUHEAP_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) { return drv_mem_free(p); }
GPUHEAP_EXPORT CUresult cuMemGetInfo_v2(size_t* f, size_t* t) { return drv_mem_get_info(f, t); }

// ---- driver: pass-through ----
GPUHEAP_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, CUstream s) {
  return CUresult(pass_alloc<Fn::cuMemAllocAsync>(AllocKind::async, on_stream(s), p, n, u64(s), n, s));
}
GPUHEAP_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* p, size_t n, CUstream s) {
  return CUresult(pass_alloc<Fn::cuMemAllocAsync_ptsz>(AllocKind::async, on_stream(s), p, n, u64(s), n, s));
}
GPUHEAP_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { return drv_mem_free_async(p, s, false); }
GPUHEAP_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) { return drv_mem_free_async(p, s, true); }
GPUHEAP_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* p, size_t n, CUmemoryPool m, CUstream s) {
  return CUresult(pass_alloc<Fn::cuMemAllocFromPoolAsync>(AllocKind::async, in_pool(m), p, n, u64(s), n, m, s));
}
GPUHEAP_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* p, size_t n, CUmemoryPool m, CUstream s) {
  return CUresult(pass_alloc<Fn::cuMemAllocFromPoolAsync_ptsz>(AllocKind::async, in_pool(m), p, n, u64(s), n, m, s));
}
GPUHEAP_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* p, size_t n, unsigned flags) {
  return CUresult(pass_alloc<Fn::cuMemAllocManaged>(AllocKind::managed, {}, p, n, 0, n, flags));
}
GPUHEAP_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* p, size_t* pitch, size_t w, size_t h, unsigned elem) {
  HookScope scope;
  if (!scope.active()) return drv<Fn::cuMemAllocPitch_v2>(p, pitch, w, h, elem);
  PassAlloc pa(AllocKind::pitch, {}, w * h, false);
  if (!pa.ok()) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = drv<Fn::cuMemAllocPitch_v2>(p, pitch, w, h, elem);
  if (rc == CUDA_SUCCESS && p && *p && pitch) pa.commit(vp(*p), w * h, *pitch * h, 0);
  return rc;
}
GPUHEAP_EXPORT CUresult cuMemHostAlloc(void** p, size_t n, unsigned flags) {
  return CUresult(pass_alloc<Fn::cuMemHostAlloc>(AllocKind::host_pinned, {}, p, n, 0, n, flags));
}
GPUHEAP_EXPORT CUresult cuMemAllocHost_v2(void** p, size_t n) {
  return CUresult(pass_alloc<Fn::cuMemAllocHost_v2>(AllocKind::host_pinned, {}, p, n, 0, n));
}
GPUHEAP_EXPORT CUresult cuMemFreeHost(void* p) {
  return CUresult(pass_free<Fn::cuMemFreeHost>(AllocKind::host_pinned, p, 0, p));
}
GPUHEAP_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t n, const CUmemAllocationProp* prop,
                                    unsigned long long flags) {
  return CUresult(
      pass_alloc<Fn::cuMemCreate>(AllocKind::vmm_physical, DeviceOf{DeviceOf::prop, prop}, h, n, 0, n, prop, flags));
}
GPUHEAP_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  return CUresult(pass_free<Fn::cuMemRelease>(AllocKind::vmm_physical, reinterpret_cast<void*>(h), 0, h));
}
GPUHEAP_EXPORT CUresult cuMemMap(CUdeviceptr p, size_t n, size_t off, CUmemGenericAllocationHandle h,
                                 unsigned long long flags) {
  HookScope scope;
  CUresult rc = drv<Fn::cuMemMap>(p, n, off, h, flags);
  if (scope.active() && rc == CUDA_SUCCESS) note_map(p, n, h);
  return rc;
}
GPUHEAP_EXPORT CUresult cuMemUnmap(CUdeviceptr p, size_t n) {
  HookScope scope;
  if (scope.active() && p) note_unmap(p, n);
  return drv<Fn::cuMemUnmap>(p, n);
}
GPUHEAP_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t n, size_t align, CUdeviceptr want,
                                            unsigned long long flags) {
  return CUresult(pass_alloc<Fn::cuMemAddressReserve>(AllocKind::va_reserve, {}, p, n, 0, n, align, want, flags));
}
GPUHEAP_EXPORT CUresult cuMemAddressFree(CUdeviceptr p, size_t n) {
  return CUresult(pass_free<Fn::cuMemAddressFree>(AllocKind::va_reserve, vp(p), 0, p, n));
}
GPUHEAP_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice d) {
  note_primary_reset(d, false);
  return drv<Fn::cuDevicePrimaryCtxReset_v2>(d);
}
GPUHEAP_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice d) {
  note_primary_reset(d, false);
  return drv<Fn::cuDevicePrimaryCtxReset>(d);
}
GPUHEAP_EXPORT CUresult cuCtxDestroy_v2(CUcontext c) {
  note_context_destroy(c);  // before: the call hands the context's memory back to the driver
  return drv<Fn::cuCtxDestroy_v2>(c);
}
GPUHEAP_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* m, const CUmemPoolProps* props) {
  // Not scoped: cudaMemPoolCreate reaches it from inside the runtime; the pool's device is
  // what cudaMallocFromPoolAsync is charged to.
  CUresult rc = drv<Fn::cuMemPoolCreate>(m, props);
  if (rc == CUDA_SUCCESS && m) note_mempool_created(*m, props);
  return rc;
}
GPUHEAP_EXPORT CUresult cuStreamCreate(CUstream* s, unsigned flags) {
  return CUresult(stream_create<Fn::cuStreamCreate>(s, flags));
}
GPUHEAP_EXPORT CUresult cuStreamCreateWithPriority(CUstream* s, unsigned flags, int prio) {
  return CUresult(stream_create<Fn::cuStreamCreateWithPriority>(s, flags, prio));
}
GPUHEAP_EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  note_stream_destroyed(s);
  return drv<Fn::cuStreamDestroy_v2>(s);
}
// Stream capture (cudaStreamBeginCapture/EndCapture reach these through the runtime's lookups).
GPUHEAP_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return note_capture_begin(drv<Fn::cuStreamBeginCapture_v2>(s, mode));
}
GPUHEAP_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return note_capture_begin(drv<Fn::cuStreamBeginCapture_v2_ptsz>(s, mode));
}
GPUHEAP_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode* deps,
                                                    const CUgraphEdgeData* data, size_t n, CUstreamCaptureMode mode) {
  return note_capture_begin(drv<Fn::cuStreamBeginCaptureToGraph>(s, g, deps, data, n, mode));
}
GPUHEAP_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode* deps,
                                                         const CUgraphEdgeData* data, size_t n,
                                                         CUstreamCaptureMode mode) {
  return note_capture_begin(drv<Fn::cuStreamBeginCaptureToGraph_ptsz>(s, g, deps, data, n, mode));
}
GPUHEAP_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* g) {
  return note_capture_end(drv<Fn::cuStreamEndCapture>(s, g));
}
GPUHEAP_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) {
  return note_capture_end(drv<Fn::cuStreamEndCapture_ptsz>(s, g));
}

// ---- driver: lookups ----
GPUHEAP_EXPORT CUresult cuGetProcAddress_v2(const char* sym, void** fn, int ver, cuuint64_t flags,
                                            CUdriverProcAddressQueryResult* st) {
  CUresult rc = drv<Fn::cuGetProcAddress_v2>(sym, fn, ver, flags, st);
  if (rc == CUDA_SUCCESS && fn) *fn = substitute_proc(sym, ver, flags, *fn);
  return rc;
}
GPUHEAP_EXPORT CUresult cuGetProcAddress(const char* sym, void** fn, int ver, cuuint64_t flags) {
  CUresult rc = drv<Fn::cuGetProcAddress>(sym, fn, ver, flags);
  if (rc == CUDA_SUCCESS && fn) *fn = substitute_proc(sym, ver, flags, *fn);
  return rc;
}

// ---- dlsym: respects the caller's handle (RTLD_NEXT relative to the caller) ----
GPUHEAP_EXPORT void* dlsym(void* handle, const char* name) {
  return hooked_dlsym(handle, name, __builtin_return_address(0));
}

// ---- ends that are not exit(): the trace gets its `end` before the image goes (ends.h) ----
// execv, execvp and the execl* forms go to execve/execvpe with the same arguments, as the C
// library's own do (each calls its internal execve, which no interposer sees).
GPUHEAP_EXPORT void _exit(int status) { end_then_exit(status); }
GPUHEAP_EXPORT void _Exit(int status) { end_then_exit(status); }
GPUHEAP_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  ExecScope scope;
  return libc_execve(path, argv, envp);
}
GPUHEAP_EXPORT int execv(const char* path, char* const argv[]) {
  ExecScope scope;
  return libc_execve(path, argv, environ);
}
GPUHEAP_EXPORT int execvp(const char* file, char* const argv[]) {
  ExecScope scope;
  return libc_execvpe(file, argv, environ);
}
GPUHEAP_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  ExecScope scope;
  return libc_execvpe(file, argv, envp);
}
GPUHEAP_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  ExecScope scope;
  return libc_fexecve(fd, argv, envp);
}
GPUHEAP_EXPORT int execl(const char* path, const char* arg, ...) {
  ExecScope scope;
  va_list ap;
  va_start(ap, arg);
  int rc = exec_list(path, /*search=*/false, /*with_env=*/false, arg, ap);
  va_end(ap);
  return rc;
}
GPUHEAP_EXPORT int execlp(const char* file, const char* arg, ...) {
  ExecScope scope;
  va_list ap;
  va_start(ap, arg);
  int rc = exec_list(file, /*search=*/true, /*with_env=*/false, arg, ap);
  va_end(ap);
  return rc;
}
GPUHEAP_EXPORT int execle(const char* path, const char* arg, ...) {
  ExecScope scope;
  va_list ap;
  va_start(ap, arg);
  int rc = exec_list(path, /*search=*/false, /*with_env=*/true, arg, ap);
  va_end(ap);
  return rc;
}

// ---- pipe2: libunwind's validation pipe is moved out of the program's way (unwind.cpp) ----
GPUHEAP_EXPORT int pipe2(int fds[2], int flags) {
  int rc = next_pipe2(fds, flags);
  if (rc == 0 && stacks_unwinding()) stacks_place_pipe(fds);
  return rc;
}

// ---- the gpuheap_* C API ----
GPUHEAP_EXPORT int gpuheap_active(void) { return recorder_active() ? 1 : 0; }
GPUHEAP_EXPORT void gpuheap_flush(void) { recorder_flush(); }
GPUHEAP_EXPORT const char* gpuheap_trace_path(void) { return recorder_path(); }
GPUHEAP_EXPORT size_t gpuheap_empty_cache(void) { return empty_cache_all(gpuheap::format::EmptyCacheReason::api); }
GPUHEAP_EXPORT int gpuheap_api_version(void) { return GPUHEAP_API_VERSION; }
GPUHEAP_EXPORT const char* gpuheap_version(void) { return GPUHEAP_VERSION; }
GPUHEAP_EXPORT void gpuheap_mark(const char* name) {
  record_phase(gpuheap::format::PhaseOp::mark, gpuheap::format::PhaseSource::api, name);
}
GPUHEAP_EXPORT void gpuheap_push(const char* name) {
  record_phase(gpuheap::format::PhaseOp::push, gpuheap::format::PhaseSource::api, name);
}
GPUHEAP_EXPORT void gpuheap_pop(void) {
  record_phase(gpuheap::format::PhaseOp::pop, gpuheap::format::PhaseSource::api, nullptr);
}
GPUHEAP_EXPORT int gpuheap_stats(int device, gpuheap_stats_t* out) {
  // An older caller's struct may be shorter: fill only the fields it has.
  constexpr std::size_t kMin = offsetof(gpuheap_stats_t, device) + sizeof(int);
  DeviceStats d;
  if (!out || out->size < kMin || !stats_get(device, &d)) return -1;
  gpuheap_stats_t full{sizeof(gpuheap_stats_t), device,     d.requested,     d.requested_peak, d.allocated,
                       d.allocated_peak,        d.reserved, d.reserved_peak, d.allocs,         d.frees};
  std::size_t n = out->size < sizeof full ? out->size : sizeof full;
  std::memcpy(reinterpret_cast<char*>(out) + sizeof full.size, reinterpret_cast<const char*>(&full) + sizeof full.size,
              n - sizeof full.size);
  return 0;
}
GPUHEAP_EXPORT void gpuheap_reset_peak(int device) { stats_reset_peak(device); }
GPUHEAP_EXPORT int gpuheap_stack_stats(gpuheap_stack_stats_t* out) {
  static_assert(sizeof(gpuheap_stack_stats_t) == sizeof(std::size_t) + 8 * static_cast<int>(StackCounter::count));
  if (!out || out->size < sizeof(std::size_t) + sizeof(std::uint64_t)) return -1;
  std::uint64_t v[static_cast<int>(StackCounter::count)];
  stackstats_read(v);  // in the struct's order (stackstats.h)
  std::size_t n = out->size < sizeof(gpuheap_stack_stats_t) ? out->size : sizeof(gpuheap_stack_stats_t);
  std::memcpy(reinterpret_cast<char*>(out) + sizeof(std::size_t), v, n - sizeof(std::size_t));
  return 0;
}
// NVTX's injection entry point (NVTX_INJECTION64_PATH names this library): 1 = attached.
GPUHEAP_EXPORT int InitializeInjectionNvtx2(const void* (*get_export_table)(uint32_t)) {
  return nvtx_attach(get_export_table);
}

}  // extern "C"

namespace gpuheap {
namespace preload {

void* our_wrapper(Fn f) noexcept {
  static void* const table[kNumFns] = {
#define GPUHEAP_ADDR(name, decl) reinterpret_cast<void*>(&::name),
      GPUHEAP_RUNTIME_HOOKS(GPUHEAP_ADDR) nullptr,
      GPUHEAP_DRIVER_HOOKS(GPUHEAP_ADDR) nullptr,
#undef GPUHEAP_ADDR
  };
  return table[static_cast<int>(f)];
}

}  // namespace preload
}  // namespace gpuheap
