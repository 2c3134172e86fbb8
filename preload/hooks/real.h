// The real CUDA entry points behind our interposers, and how we find them.
//
// A hooked function can be reached three ways (CUDA C++ Programming Guide, "Driver Entry
// Point Access"; static cudart takes the third for every driver function):
// by symbol (dynamic libcudart, as PyTorch uses), through dlsym(handle, name), and through
// cuGetProcAddress / cudaGetDriverEntryPoint (static cudart, CuPy, JAX, NCCL, PyTorch's
// expandable segments). Each route hands us the real pointer it resolved, which we keep
// (first one wins); anything never handed to us is resolved lazily from the loaded
// libcudart (a wheel's renamed libcudart-<hash>.so copy included: real.cpp) / libcuda by
// handle, never through RTLD_DEFAULT (that finds our own symbols).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

// cuda.h maps these to _v2; we need both exact names as distinct functions.
#undef cuGetProcAddress
#undef cuDevicePrimaryCtxReset

namespace gpuheap {
namespace preload {

// X(name, declared_as): the function `name` has the signature of `declared_as` from the
// CUDA headers (the _ptsz variants are not declared unless per-thread streams are on).
#define GPUHEAP_RUNTIME_HOOKS(X) \
  X(cudaMalloc, cudaMalloc) \
  X(cudaFree, cudaFree) \
  X(cudaMemGetInfo, cudaMemGetInfo) \
  X(cudaMallocAsync, cudaMallocAsync) \
  X(cudaMallocAsync_ptsz, cudaMallocAsync) \
  X(cudaFreeAsync, cudaFreeAsync) \
  X(cudaFreeAsync_ptsz, cudaFreeAsync) \
  X(cudaMallocFromPoolAsync, cudaMallocFromPoolAsync) \
  X(cudaMallocFromPoolAsync_ptsz, cudaMallocFromPoolAsync) \
  X(cudaMallocManaged, cudaMallocManaged) \
  X(cudaMallocHost, cudaMallocHost) \
  X(cudaHostAlloc, cudaHostAlloc) \
  X(cudaFreeHost, cudaFreeHost) \
  X(cudaMallocPitch, cudaMallocPitch) \
  X(cudaMalloc3D, cudaMalloc3D) \
  X(cudaStreamCreate, cudaStreamCreate) \
  X(cudaStreamCreateWithFlags, cudaStreamCreateWithFlags) \
  X(cudaStreamCreateWithPriority, cudaStreamCreateWithPriority) \
  X(cudaStreamDestroy, cudaStreamDestroy) \
  X(cudaDeviceReset, cudaDeviceReset) \
  X(cudaGetDriverEntryPoint, cudaGetDriverEntryPoint) \
  X(cudaGetDriverEntryPoint_ptsz, cudaGetDriverEntryPoint) \
  X(cudaGetDriverEntryPointByVersion, cudaGetDriverEntryPointByVersion) \
  X(cudaGetDriverEntryPointByVersion_ptsz, cudaGetDriverEntryPointByVersion)

#define GPUHEAP_DRIVER_HOOKS(X) \
  X(cuMemAlloc_v2, cuMemAlloc_v2) \
  X(cuMemFree_v2, cuMemFree_v2) \
  X(cuMemGetInfo_v2, cuMemGetInfo_v2) \
  X(cuMemAllocAsync, cuMemAllocAsync) \
  X(cuMemAllocAsync_ptsz, cuMemAllocAsync) \
  X(cuMemFreeAsync, cuMemFreeAsync) \
  X(cuMemFreeAsync_ptsz, cuMemFreeAsync) \
  X(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync) \
  X(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync) \
  X(cuMemAllocManaged, cuMemAllocManaged) \
  X(cuMemAllocPitch_v2, cuMemAllocPitch_v2) \
  X(cuMemHostAlloc, cuMemHostAlloc) \
  X(cuMemAllocHost_v2, cuMemAllocHost_v2) \
  X(cuMemFreeHost, cuMemFreeHost) \
  X(cuMemCreate, cuMemCreate) \
  X(cuMemRelease, cuMemRelease) \
  X(cuMemMap, cuMemMap) \
  X(cuMemUnmap, cuMemUnmap) \
  X(cuMemAddressReserve, cuMemAddressReserve) \
  X(cuMemAddressFree, cuMemAddressFree) \
  X(cuStreamCreate, cuStreamCreate) \
  X(cuStreamCreateWithPriority, cuStreamCreateWithPriority) \
  X(cuStreamDestroy_v2, cuStreamDestroy_v2) \
  X(cuStreamBeginCapture_v2, cuStreamBeginCapture_v2) \
  X(cuStreamBeginCapture_v2_ptsz, cuStreamBeginCapture_v2) \
  X(cuStreamBeginCaptureToGraph, cuStreamBeginCaptureToGraph) \
  X(cuStreamBeginCaptureToGraph_ptsz, cuStreamBeginCaptureToGraph) \
  X(cuStreamEndCapture, cuStreamEndCapture) \
  X(cuStreamEndCapture_ptsz, cuStreamEndCapture) \
  X(cuMemPoolCreate, cuMemPoolCreate) \
  X(cuDevicePrimaryCtxReset, gpuheap_cuDevicePrimaryCtxReset_v1_decl) \
  X(cuDevicePrimaryCtxReset_v2, cuDevicePrimaryCtxReset_v2) \
  X(cuCtxDestroy_v2, cuCtxDestroy_v2) \
  X(cuGetProcAddress, gpuheap_cuGetProcAddress_v1_decl) \
  X(cuGetProcAddress_v2, cuGetProcAddress_v2)

// Driver functions gpuheap itself calls (not interposed).
#define GPUHEAP_DRIVER_USED(X) \
  X(cuCtxGetCurrent, cuCtxGetCurrent) \
  X(cuCtxSetCurrent, cuCtxSetCurrent) \
  X(cuCtxGetDevice, cuCtxGetDevice) \
  X(cuEventCreate, cuEventCreate) \
  X(cuEventRecord, cuEventRecord) \
  X(cuEventQuery, cuEventQuery) \
  X(cuEventSynchronize, cuEventSynchronize) \
  X(cuEventDestroy_v2, cuEventDestroy_v2) \
  X(cuDeviceGet, cuDeviceGet) \
  X(cuDeviceGetName, cuDeviceGetName) \
  X(cuDeviceTotalMem_v2, cuDeviceTotalMem_v2) \
  X(cuMemGetAddressRange_v2, cuMemGetAddressRange_v2) \
  X(cuStreamIsCapturing, cuStreamIsCapturing) \
  X(cuDeviceGetCount, cuDeviceGetCount) \
  X(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool) \
  X(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) \
  X(cuDevicePrimaryCtxRelease_v2, cuDevicePrimaryCtxRelease_v2) \
  X(cuDevicePrimaryCtxGetState, cuDevicePrimaryCtxGetState)

}  // namespace preload
}  // namespace gpuheap

// CUDA 13's cuda.h declares the 4-argument cuGetProcAddress only for its own build.
extern "C" CUresult gpuheap_cuGetProcAddress_v1_decl(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags);
// The pre-11.0 cuDevicePrimaryCtxReset (cuda.h declares only _v2 under that name).
extern "C" CUresult gpuheap_cuDevicePrimaryCtxReset_v1_decl(CUdevice dev);

namespace gpuheap {
namespace preload {

enum class Fn : int {
#define GPUHEAP_ENUM(name, decl) name,
  GPUHEAP_RUNTIME_HOOKS(GPUHEAP_ENUM) runtime_end_,
  GPUHEAP_DRIVER_HOOKS(GPUHEAP_ENUM) hooks_end_,
  GPUHEAP_DRIVER_USED(GPUHEAP_ENUM) count_
#undef GPUHEAP_ENUM
};
inline constexpr int kNumFns = static_cast<int>(Fn::count_);

const char* fn_name(Fn f) noexcept;
bool fn_is_runtime(Fn f) noexcept;
bool fn_is_hooked(Fn f) noexcept;
// Index of the interposer by exact exported name, or -1.
int hooked_fn_by_name(const char* name) noexcept;
// Our interposer for a hooked function (the address a lookup hands back instead).
void* our_wrapper(Fn f) noexcept;

// Real pointer (resolved lazily; nullptr if the library is not loaded).
void* resolve(Fn f) noexcept;
// Remember a real pointer a lookup returned (first non-null one wins).
void note_real(Fn f, void* real) noexcept;

// glibc's dlsym, found through dlvsym (never GLIBC_PRIVATE internals).
using dlsym_fn = void* (*)(void*, const char*);
dlsym_fn real_dlsym() noexcept;
// dlsym as the caller would have seen it without us (RTLD_NEXT relative to the caller).
void* lookup_for_caller(void* handle, const char* name, const void* caller) noexcept;

// pipe2(2) as the program would call it without us: the next definition (libc's, or another
// preloaded library's), the system call itself when there is none.
int next_pipe2(int fds[2], int flags) noexcept;

// Typed access: real<Fn::cudaMalloc>() etc.
template <Fn F>
struct FnType;
#define GPUHEAP_TYPE(name, decl) \
  template <> \
  struct FnType<Fn::name> { \
    using type = decltype(&::decl); \
  };
GPUHEAP_RUNTIME_HOOKS(GPUHEAP_TYPE)
GPUHEAP_DRIVER_HOOKS(GPUHEAP_TYPE)
GPUHEAP_DRIVER_USED(GPUHEAP_TYPE)
#undef GPUHEAP_TYPE

extern std::atomic<void*> g_real[kNumFns];

template <Fn F>
inline typename FnType<F>::type real() noexcept {
  void* p = g_real[static_cast<int>(F)].load(std::memory_order_acquire);
  if (__builtin_expect(p == nullptr, 0)) p = resolve(F);
  return reinterpret_cast<typename FnType<F>::type>(p);
}

}  // namespace preload
}  // namespace gpuheap
