// Internal interface of the simulated runtime (libcudart.so.13).
//
// The runtime keeps no device state of its own: it loads libcuda.so.1 with dlopen at first use,
// gets cuGetProcAddress_v2 with dlsym (through the public dlsym, so a preloaded gpuheap sees
// it), then resolves every driver function by *base name* through cuGetProcAddress_v2, twice:
// once with CU_GET_PROC_ADDRESS_DEFAULT (legacy stream) and once with
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM for the cuda*_ptsz / _ptds entry points.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1  // declares the cuda*_ptsz / _ptds variants and old names
#include <cuda.h>
#include <cuda_runtime_api.h>

#define RT_API extern "C" __attribute__((visibility("default")))

namespace simcuda::rt {

// X(member, base name)
#define SIMCUDA_DRIVER_FUNCTIONS(X) \
  X(cuInit, "cuInit") \
  X(cuDriverGetVersion, "cuDriverGetVersion") \
  X(cuDeviceGet, "cuDeviceGet") \
  X(cuDeviceGetCount, "cuDeviceGetCount") \
  X(cuDeviceGetName, "cuDeviceGetName") \
  X(cuDeviceTotalMem_v2, "cuDeviceTotalMem") \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute") \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") \
  X(cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset") \
  X(cuCtxGetCurrent, "cuCtxGetCurrent") \
  X(cuCtxSetCurrent, "cuCtxSetCurrent") \
  X(cuCtxGetDevice, "cuCtxGetDevice") \
  X(cuCtxSynchronize, "cuCtxSynchronize") \
  X(cuMemAlloc_v2, "cuMemAlloc") \
  X(cuMemFree_v2, "cuMemFree") \
  X(cuMemGetInfo_v2, "cuMemGetInfo") \
  X(cuMemAllocAsync, "cuMemAllocAsync") \
  X(cuMemFreeAsync, "cuMemFreeAsync") \
  X(cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync") \
  X(cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool") \
  X(cuMemPoolCreate, "cuMemPoolCreate") \
  X(cuMemPoolDestroy, "cuMemPoolDestroy") \
  X(cuMemAllocManaged, "cuMemAllocManaged") \
  X(cuMemAllocHost_v2, "cuMemAllocHost") \
  X(cuMemHostAlloc, "cuMemHostAlloc") \
  X(cuMemFreeHost, "cuMemFreeHost") \
  X(cuMemAllocPitch_v2, "cuMemAllocPitch") \
  X(cuPointerGetAttribute, "cuPointerGetAttribute") \
  X(cuStreamCreate, "cuStreamCreate") \
  X(cuStreamCreateWithPriority, "cuStreamCreateWithPriority") \
  X(cuStreamDestroy_v2, "cuStreamDestroy") \
  X(cuStreamSynchronize, "cuStreamSynchronize") \
  X(cuStreamQuery, "cuStreamQuery") \
  X(cuStreamWaitEvent, "cuStreamWaitEvent") \
  X(cuLaunchHostFunc, "cuLaunchHostFunc") \
  X(cuStreamBeginCapture_v2, "cuStreamBeginCapture") \
  X(cuStreamBeginCaptureToGraph, "cuStreamBeginCaptureToGraph") \
  X(cuStreamEndCapture, "cuStreamEndCapture") \
  X(cuStreamGetCaptureInfo, "cuStreamGetCaptureInfo") \
  X(cuStreamIsCapturing, "cuStreamIsCapturing") \
  X(cuThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode") \
  X(cuEventCreate, "cuEventCreate") \
  X(cuEventRecord, "cuEventRecord") \
  X(cuEventRecordWithFlags, "cuEventRecordWithFlags") \
  X(cuEventQuery, "cuEventQuery") \
  X(cuEventSynchronize, "cuEventSynchronize") \
  X(cuEventDestroy_v2, "cuEventDestroy") \
  X(cuEventElapsedTime_v2, "cuEventElapsedTime") \
  X(cuMemsetD8_v2, "cuMemsetD8") \
  X(cuMemsetD8Async, "cuMemsetD8Async") \
  X(cuMemcpy, "cuMemcpy") \
  X(cuMemcpyAsync, "cuMemcpyAsync")

struct Api {
#define SIMCUDA_MEMBER(name, base) decltype(&::name) name = nullptr;
  SIMCUDA_DRIVER_FUNCTIONS(SIMCUDA_MEMBER)
#undef SIMCUDA_MEMBER
  decltype(&::cuGetProcAddress_v2) cuGetProcAddress_v2 = nullptr;
};

// Loads the driver once. Returns cudaSuccess or the (sticky) initialisation error.
cudaError_t load(const Api** api, bool per_thread);
// load() plus: make the calling thread's current device's primary context current, as the real
// runtime does before any call that needs a context.
cudaError_t enter(const Api** api, bool per_thread = false);
// Maps a driver result to the runtime error and records it as the thread's last error.
cudaError_t finish(CUresult r);
// Records a runtime error as the thread's last error and returns it.
cudaError_t record(cudaError_t e);
cudaError_t to_runtime(CUresult r);
int current_device();  // thread's device (0 until cudaSetDevice)

}  // namespace simcuda::rt
