// cuGetProcAddress / cuGetProcAddress_v2 of the simulated driver.
//
// Deliberately a static table and never dlsym: gpuheap interposes dlsym and hands out its own
// wrappers, which would make the driver resolve to the preload and recurse.
// Semantics (cuda.h, "Driver Entry Point Access"): `symbol` is the base name; among the table
// rows for it, the one with the highest introduction version <= cudaVersion wins; with
// CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM a _ptsz/_ptds row is preferred when one exists.
#include "driver_internal.h"

#include <cstring>

namespace simcuda::drv {
namespace {

struct Entry {
  const char* name;
  int version;      // CUDA version that introduced this ABI of the symbol
  bool per_thread;  // _ptsz / _ptds variant
  void* fn;
};

#define E(base, ver, fn) \
  { base, ver, false, reinterpret_cast<void*>(&fn) }
#define P(base, ver, fn) \
  { base, ver, true, reinterpret_cast<void*>(&fn) }

const Entry kTable[] = {
    E("cuInit", 2000, cuInit),
    E("cuDriverGetVersion", 2020, cuDriverGetVersion),
    E("cuGetErrorString", 6000, cuGetErrorString),
    E("cuGetErrorName", 6000, cuGetErrorName),
    E("cuGetProcAddress", 11030, cuGetProcAddress),
    E("cuGetProcAddress", 12000, cuGetProcAddress_v2),
    E("cuDeviceGet", 2000, cuDeviceGet),
    E("cuDeviceGetCount", 2000, cuDeviceGetCount),
    E("cuDeviceGetName", 2000, cuDeviceGetName),
    E("cuDeviceTotalMem", 2000, cuDeviceTotalMem),
    E("cuDeviceTotalMem", 3020, cuDeviceTotalMem_v2),
    E("cuDeviceGetAttribute", 2000, cuDeviceGetAttribute),
    E("cuDevicePrimaryCtxRetain", 7000, cuDevicePrimaryCtxRetain),
    E("cuDevicePrimaryCtxGetState", 7000, cuDevicePrimaryCtxGetState),
    E("cuDevicePrimaryCtxRelease", 7000, cuDevicePrimaryCtxRelease),
    E("cuDevicePrimaryCtxRelease", 11000, cuDevicePrimaryCtxRelease_v2),
    E("cuDevicePrimaryCtxReset", 7000, cuDevicePrimaryCtxReset),
    E("cuDevicePrimaryCtxReset", 11000, cuDevicePrimaryCtxReset_v2),
    E("cuCtxCreate", 2000, cuCtxCreate),
    E("cuCtxCreate", 3020, cuCtxCreate_v2),
    E("cuCtxCreate", 11040, cuCtxCreate_v3),
    E("cuCtxCreate", 12050, cuCtxCreate_v4),
    E("cuCtxDestroy", 2000, cuCtxDestroy),
    E("cuCtxDestroy", 4000, cuCtxDestroy_v2),
    E("cuCtxGetCurrent", 4000, cuCtxGetCurrent),
    E("cuCtxSetCurrent", 4000, cuCtxSetCurrent),
    E("cuCtxPushCurrent", 2000, cuCtxPushCurrent),
    E("cuCtxPushCurrent", 4000, cuCtxPushCurrent_v2),
    E("cuCtxPopCurrent", 2000, cuCtxPopCurrent),
    E("cuCtxPopCurrent", 4000, cuCtxPopCurrent_v2),
    E("cuCtxGetDevice", 2000, cuCtxGetDevice),
    E("cuCtxSynchronize", 2000, cuCtxSynchronize),
    E("cuMemAlloc", 2000, cuMemAlloc),
    E("cuMemAlloc", 3020, cuMemAlloc_v2),
    E("cuMemFree", 2000, cuMemFree),
    E("cuMemFree", 3020, cuMemFree_v2),
    E("cuMemGetInfo", 2000, cuMemGetInfo),
    E("cuMemGetInfo", 3020, cuMemGetInfo_v2),
    E("cuMemAllocPitch", 2000, cuMemAllocPitch),
    E("cuMemAllocPitch", 3020, cuMemAllocPitch_v2),
    E("cuMemAllocHost", 2000, cuMemAllocHost),
    E("cuMemAllocHost", 3020, cuMemAllocHost_v2),
    E("cuMemHostAlloc", 2020, cuMemHostAlloc),
    E("cuMemFreeHost", 2000, cuMemFreeHost),
    E("cuMemAllocManaged", 6000, cuMemAllocManaged),
    E("cuMemGetAddressRange", 2000, cuMemGetAddressRange),
    E("cuMemGetAddressRange", 3020, cuMemGetAddressRange_v2),
    E("cuPointerGetAttribute", 4000, cuPointerGetAttribute),
    E("cuMemAllocAsync", 11020, cuMemAllocAsync),
    P("cuMemAllocAsync", 11020, cuMemAllocAsync_ptsz),
    E("cuMemFreeAsync", 11020, cuMemFreeAsync),
    P("cuMemFreeAsync", 11020, cuMemFreeAsync_ptsz),
    E("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync),
    P("cuMemAllocFromPoolAsync", 11020, cuMemAllocFromPoolAsync_ptsz),
    E("cuDeviceGetDefaultMemPool", 11020, cuDeviceGetDefaultMemPool),
    E("cuMemPoolCreate", 11020, cuMemPoolCreate),
    E("cuMemPoolDestroy", 11020, cuMemPoolDestroy),
    E("cuMemCreate", 10020, cuMemCreate),
    E("cuMemRelease", 10020, cuMemRelease),
    E("cuMemMap", 10020, cuMemMap),
    E("cuMemUnmap", 10020, cuMemUnmap),
    E("cuMemAddressReserve", 10020, cuMemAddressReserve),
    E("cuMemAddressFree", 10020, cuMemAddressFree),
    E("cuMemSetAccess", 10020, cuMemSetAccess),
    E("cuMemGetAllocationGranularity", 10020, cuMemGetAllocationGranularity),
    E("cuStreamCreate", 2000, cuStreamCreate),
    E("cuStreamCreateWithPriority", 5050, cuStreamCreateWithPriority),
    E("cuStreamDestroy", 2000, cuStreamDestroy),
    E("cuStreamDestroy", 4000, cuStreamDestroy_v2),
    E("cuStreamSynchronize", 2000, cuStreamSynchronize),
    P("cuStreamSynchronize", 7000, cuStreamSynchronize_ptsz),
    E("cuStreamQuery", 2000, cuStreamQuery),
    P("cuStreamQuery", 7000, cuStreamQuery_ptsz),
    E("cuStreamWaitEvent", 3020, cuStreamWaitEvent),
    P("cuStreamWaitEvent", 7000, cuStreamWaitEvent_ptsz),
    E("cuLaunchHostFunc", 10000, cuLaunchHostFunc),
    P("cuLaunchHostFunc", 10000, cuLaunchHostFunc_ptsz),
    E("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2),
    P("cuStreamBeginCapture", 10010, cuStreamBeginCapture_v2_ptsz),
    E("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph),
    P("cuStreamBeginCaptureToGraph", 12030, cuStreamBeginCaptureToGraph_ptsz),
    E("cuStreamEndCapture", 10000, cuStreamEndCapture),
    P("cuStreamEndCapture", 10000, cuStreamEndCapture_ptsz),
    E("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo),
    P("cuStreamGetCaptureInfo", 10010, cuStreamGetCaptureInfo_ptsz),
    E("cuStreamIsCapturing", 10000, cuStreamIsCapturing),
    P("cuStreamIsCapturing", 10000, cuStreamIsCapturing_ptsz),
    E("cuThreadExchangeStreamCaptureMode", 10010, cuThreadExchangeStreamCaptureMode),
    E("cuEventCreate", 2000, cuEventCreate),
    E("cuEventRecord", 2000, cuEventRecord),
    P("cuEventRecord", 7000, cuEventRecord_ptsz),
    E("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags),
    P("cuEventRecordWithFlags", 11010, cuEventRecordWithFlags_ptsz),
    E("cuEventQuery", 2000, cuEventQuery),
    E("cuEventSynchronize", 2000, cuEventSynchronize),
    E("cuEventDestroy", 2000, cuEventDestroy),
    E("cuEventDestroy", 4000, cuEventDestroy_v2),
    E("cuEventElapsedTime", 2000, cuEventElapsedTime),
    E("cuEventElapsedTime", 12080, cuEventElapsedTime_v2),
    E("cuMemsetD8", 2000, cuMemsetD8),
    E("cuMemsetD8", 3020, cuMemsetD8_v2),
    P("cuMemsetD8", 7000, cuMemsetD8_v2_ptds),
    E("cuMemsetD8Async", 3020, cuMemsetD8Async),
    P("cuMemsetD8Async", 7000, cuMemsetD8Async_ptsz),
    E("cuMemcpy", 4000, cuMemcpy),
    P("cuMemcpy", 7000, cuMemcpy_ptds),
    E("cuMemcpyAsync", 4000, cuMemcpyAsync),
    P("cuMemcpyAsync", 7000, cuMemcpyAsync_ptsz),
    E("cuMemcpyHtoD", 2000, cuMemcpyHtoD),
    E("cuMemcpyHtoD", 3020, cuMemcpyHtoD_v2),
    P("cuMemcpyHtoD", 7000, cuMemcpyHtoD_v2_ptds),
    E("cuMemcpyDtoH", 2000, cuMemcpyDtoH),
    E("cuMemcpyDtoH", 3020, cuMemcpyDtoH_v2),
    P("cuMemcpyDtoH", 7000, cuMemcpyDtoH_v2_ptds),
    E("cuMemcpyDtoD", 2000, cuMemcpyDtoD),
    E("cuMemcpyDtoD", 3020, cuMemcpyDtoD_v2),
    P("cuMemcpyDtoD", 7000, cuMemcpyDtoD_v2_ptds),
};

#undef E
#undef P

CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  constexpr cuuint64_t kValid = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  // "If the specified CUDA version is greater than the driver version, the API will return
  // CUDA_ERROR_INVALID_VALUE."
  if ((flags & ~kValid) != 0 || version > driver_version()) return CUDA_ERROR_INVALID_VALUE;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const Entry* best = nullptr;
  bool known = false;
  for (const Entry& e : kTable) {
    if (std::strcmp(e.name, symbol) != 0) continue;
    known = true;
    if (e.version > version || (e.per_thread && !per_thread)) continue;
    // Per-thread rows win over legacy rows whenever they are eligible.
    if (best == nullptr || (e.per_thread && !best->per_thread) ||
        (e.per_thread == best->per_thread && e.version > best->version))
      best = &e;
  }
  *pfn = best != nullptr ? best->fn : nullptr;
  if (status != nullptr)
    *status = best != nullptr ? CU_GET_PROC_ADDRESS_SUCCESS
              : known         ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                              : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return best != nullptr ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

}  // namespace
}  // namespace simcuda::drv

SIM_API CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* symbolStatus) {
  SIM_COUNT("cuGetProcAddress_v2");
  return simcuda::drv::lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

SIM_API CUresult cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion, cuuint64_t flags) {
  SIM_COUNT("cuGetProcAddress");
  return simcuda::drv::lookup(symbol, pfn, cudaVersion, flags, nullptr);
}
