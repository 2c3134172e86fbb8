// Lookups that hand out CUDA functions: dlsym, cuGetProcAddress(_v2) and
// cudaGetDriverEntryPoint(ByVersion). Static cudart (nvcc's default, CuPy), JAX/XLA, NCCL
// and PyTorch's expandable segments reach the driver only this way, so each lookup of a
// function we interpose returns our wrapper and remembers the real pointer it resolved.
#include <string.h>

#include "preload/core/runtime.h"
#include "preload/hooks/real.h"

namespace gpuheap {
namespace preload {

namespace {

// cuGetProcAddress takes base names ("cuMemAlloc") and a CUDA version; the driver picks the
// versioned function for that version (CUDA Driver API, cuGetProcAddress: "symbol: the base
// name of the driver API function to look for. As an example, for the driver API
// cuMemAlloc_v2, symbol would be cuMemAlloc"). We must map to the exact same function:
// returning a newer ABI to an older caller has broken real programs (vLLM).
struct ProcEntry {
  const char* base;
  int min_version;  // first CUDA version whose lookup resolves to `fn`
  Fn fn;
  Fn ptsz;  // variant for CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (or == fn)
};

constexpr ProcEntry kProcs[] = {
    {"cuMemAlloc", 3020, Fn::cuMemAlloc_v2, Fn::cuMemAlloc_v2},
    {"cuMemFree", 3020, Fn::cuMemFree_v2, Fn::cuMemFree_v2},
    {"cuMemGetInfo", 3020, Fn::cuMemGetInfo_v2, Fn::cuMemGetInfo_v2},
    {"cuMemAllocPitch", 3020, Fn::cuMemAllocPitch_v2, Fn::cuMemAllocPitch_v2},
    {"cuMemAllocHost", 3020, Fn::cuMemAllocHost_v2, Fn::cuMemAllocHost_v2},
    {"cuMemHostAlloc", 0, Fn::cuMemHostAlloc, Fn::cuMemHostAlloc},
    {"cuMemFreeHost", 0, Fn::cuMemFreeHost, Fn::cuMemFreeHost},
    {"cuMemAllocManaged", 0, Fn::cuMemAllocManaged, Fn::cuMemAllocManaged},
    {"cuMemAllocAsync", 0, Fn::cuMemAllocAsync, Fn::cuMemAllocAsync_ptsz},
    {"cuMemFreeAsync", 0, Fn::cuMemFreeAsync, Fn::cuMemFreeAsync_ptsz},
    {"cuMemAllocFromPoolAsync", 0, Fn::cuMemAllocFromPoolAsync, Fn::cuMemAllocFromPoolAsync_ptsz},
    {"cuMemCreate", 0, Fn::cuMemCreate, Fn::cuMemCreate},
    {"cuMemRelease", 0, Fn::cuMemRelease, Fn::cuMemRelease},
    {"cuMemMap", 0, Fn::cuMemMap, Fn::cuMemMap},
    {"cuMemUnmap", 0, Fn::cuMemUnmap, Fn::cuMemUnmap},
    {"cuMemAddressReserve", 0, Fn::cuMemAddressReserve, Fn::cuMemAddressReserve},
    {"cuMemAddressFree", 0, Fn::cuMemAddressFree, Fn::cuMemAddressFree},
    {"cuStreamCreate", 0, Fn::cuStreamCreate, Fn::cuStreamCreate},
    {"cuStreamCreateWithPriority", 0, Fn::cuStreamCreateWithPriority, Fn::cuStreamCreateWithPriority},
    {"cuStreamDestroy", 4000, Fn::cuStreamDestroy_v2, Fn::cuStreamDestroy_v2},
    {"cuStreamBeginCapture", 10010, Fn::cuStreamBeginCapture_v2, Fn::cuStreamBeginCapture_v2_ptsz},
    {"cuStreamBeginCaptureToGraph", 12030, Fn::cuStreamBeginCaptureToGraph, Fn::cuStreamBeginCaptureToGraph_ptsz},
    {"cuStreamEndCapture", 0, Fn::cuStreamEndCapture, Fn::cuStreamEndCapture_ptsz},
    {"cuMemPoolCreate", 0, Fn::cuMemPoolCreate, Fn::cuMemPoolCreate},
    // First match wins: the newer version of a name comes first.
    {"cuDevicePrimaryCtxReset", 11000, Fn::cuDevicePrimaryCtxReset_v2, Fn::cuDevicePrimaryCtxReset_v2},
    {"cuDevicePrimaryCtxReset", 7000, Fn::cuDevicePrimaryCtxReset, Fn::cuDevicePrimaryCtxReset},
    {"cuCtxDestroy", 4000, Fn::cuCtxDestroy_v2, Fn::cuCtxDestroy_v2},
    // Asking for cuGetProcAddress itself must give our wrapper, or later lookups escape us.
    {"cuGetProcAddress", 12000, Fn::cuGetProcAddress_v2, Fn::cuGetProcAddress_v2},
    {"cuGetProcAddress", 0, Fn::cuGetProcAddress, Fn::cuGetProcAddress},
};

}  // namespace

void* substitute_proc(const char* symbol, int cuda_version, std::uint64_t flags, void* real_fn) noexcept {
  if (!symbol || !real_fn || symbol[0] != 'c' || symbol[1] != 'u') return real_fn;
  // (A per-thread lookup alone says nothing: cudart resolves both variants of everything.)
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  for (const ProcEntry& e : kProcs) {
    if (strcmp(e.base, symbol) != 0 || cuda_version < e.min_version) continue;
    Fn f = per_thread ? e.ptsz : e.fn;
    note_real(f, real_fn);
    // Only hand out the wrapper if it will call exactly the function the driver chose.
    if (g_real[static_cast<int>(f)].load(std::memory_order_acquire) != real_fn) return real_fn;
    return our_wrapper(f);
  }
  // Older versions than our table covers (e.g. the 32-bit cuMemAlloc of CUDA < 3.2) and
  // everything else pass through untouched.
  return real_fn;
}

void* hooked_dlsym(void* handle, const char* name, const void* caller) noexcept {
  void* p = lookup_for_caller(handle, name, caller);
  if (!p || !name || name[0] != 'c' || name[1] != 'u') return p;
  int i = hooked_fn_by_name(name);
  if (i < 0) return p;
  Fn f = static_cast<Fn>(i);
  void* wrapper = our_wrapper(f);
  if (p == wrapper) return p;  // RTLD_DEFAULT found us already
  note_real(f, p);
  // A second, different copy (two libcudart versions in one process) keeps its own
  // function: our wrapper would call the first one's.
  if (g_real[i].load(std::memory_order_acquire) != p) return p;
  return wrapper;
}

}  // namespace preload
}  // namespace gpuheap
