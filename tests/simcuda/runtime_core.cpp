// Simulated runtime: driver loading, error handling, devices, versions, driver entry points.
#include "runtime_internal.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>

namespace simcuda::rt {
namespace {

constexpr int kMaxDevices = 64;

struct Runtime {
  cudaError_t status = cudaErrorInitializationError;
  Api legacy;
  Api per_thread;
  std::mutex ctx_mu;
  CUcontext primary[kMaxDevices] = {};
};

Runtime& runtime() {
  static Runtime* r = new Runtime();  // never destroyed: used from atexit handlers and threads
  return *r;
}

thread_local int t_device = -1;
thread_local cudaError_t t_last_error = cudaSuccess;

bool resolve(decltype(&::cuGetProcAddress_v2) gpa, const char* base, void** out, cuuint64_t flags) {
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  return gpa(base, out, CUDART_VERSION, flags, &status) == CUDA_SUCCESS && *out != nullptr;
}

bool fill(Api& api, decltype(&::cuGetProcAddress_v2) gpa, cuuint64_t flags) {
  api.cuGetProcAddress_v2 = gpa;
  bool ok = true;
#define SIMCUDA_RESOLVE(name, base) ok = resolve(gpa, base, reinterpret_cast<void**>(&api.name), flags) && ok;
  SIMCUDA_DRIVER_FUNCTIONS(SIMCUDA_RESOLVE)
#undef SIMCUDA_RESOLVE
  return ok;
}

void init_once() {
  Runtime& r = runtime();
  // Like the real runtime: dlopen the driver by soname (our RUNPATH $ORIGIN finds the simulator
  // next to us) and look up only cuGetProcAddress_v2 by handle.
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    r.status = cudaErrorInsufficientDriver;
    return;
  }
  auto gpa = reinterpret_cast<decltype(&::cuGetProcAddress_v2)>(dlsym(h, "cuGetProcAddress_v2"));
  if (gpa == nullptr || !fill(r.legacy, gpa, CU_GET_PROC_ADDRESS_DEFAULT) ||
      !fill(r.per_thread, gpa, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)) {
    r.status = cudaErrorInsufficientDriver;
    return;
  }
  CUresult init = r.legacy.cuInit(0);
  r.status = init == CUDA_SUCCESS ? cudaSuccess : to_runtime(init);
}

CUresult primary_ctx(const Api& api, int dev, CUcontext* out) {
  Runtime& r = runtime();
  if (dev < 0 || dev >= kMaxDevices) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(r.ctx_mu);
  if (r.primary[dev] == nullptr) {
    CUresult res = api.cuDevicePrimaryCtxRetain(&r.primary[dev], dev);
    if (res != CUDA_SUCCESS) return res;
  }
  *out = r.primary[dev];
  return CUDA_SUCCESS;
}

struct ErrorText {
  cudaError_t code;
  const char* name;
  const char* text;
};
// Texts as documented in driver_types.h.
constexpr ErrorText kErrors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorDeviceUninitialized, "cudaErrorDeviceUninitialized", "invalid device context"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorSymbolNotFound, "cudaErrorSymbolNotFound", "named symbol not found"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorAlreadyMapped, "cudaErrorAlreadyMapped", "resource already mapped"},
    {cudaErrorNotMapped, "cudaErrorNotMapped", "resource not mapped"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorIllegalState, "cudaErrorIllegalState", "the operation cannot be performed in the present state"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorCapturedEvent, "cudaErrorCapturedEvent",
     "operation not permitted on an event last recorded in a capturing stream"},
    {cudaErrorStreamCaptureWrongThread, "cudaErrorStreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

}  // namespace

cudaError_t to_runtime(CUresult r) {
  switch (r) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_NOT_INITIALIZED: return cudaErrorInitializationError;
    case CUDA_ERROR_DEINITIALIZED: return cudaErrorCudartUnloading;
    case CUDA_ERROR_NO_DEVICE: return cudaErrorNoDevice;
    case CUDA_ERROR_INVALID_DEVICE: return cudaErrorInvalidDevice;
    case CUDA_ERROR_INVALID_CONTEXT: return cudaErrorDeviceUninitialized;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_NOT_FOUND: return cudaErrorSymbolNotFound;
    case CUDA_ERROR_NOT_READY: return cudaErrorNotReady;
    case CUDA_ERROR_ALREADY_MAPPED: return cudaErrorAlreadyMapped;
    case CUDA_ERROR_NOT_MAPPED: return cudaErrorNotMapped;
    case CUDA_ERROR_NOT_SUPPORTED: return cudaErrorNotSupported;
    case CUDA_ERROR_ILLEGAL_STATE: return cudaErrorIllegalState;
    // The stream-capture errors have the same numbers in both APIs (900..908).
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: return cudaErrorStreamCaptureInvalidated;
    case CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: return cudaErrorStreamCaptureImplicit;
    case CUDA_ERROR_CAPTURED_EVENT: return cudaErrorCapturedEvent;
    case CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD: return cudaErrorStreamCaptureWrongThread;
    default: return cudaErrorUnknown;
  }
}

cudaError_t record(cudaError_t e) {
  // cudaErrorNotReady is a status, not an error: the real runtime does not latch it.
  if (e != cudaSuccess && e != cudaErrorNotReady) t_last_error = e;
  return e;
}

cudaError_t finish(CUresult r) { return record(to_runtime(r)); }

cudaError_t load(const Api** api, bool per_thread) {
  static std::once_flag once;
  std::call_once(once, init_once);
  Runtime& r = runtime();
  if (r.status != cudaSuccess) return r.status;
  *api = per_thread ? &r.per_thread : &r.legacy;
  return cudaSuccess;
}

int current_device() { return t_device < 0 ? 0 : t_device; }

// The runtime uses whatever context is current (e.g. one set with the driver API); only when
// none is, it binds the primary context of the thread's device.
cudaError_t enter(const Api** api, bool per_thread) {
  if (cudaError_t e = load(api, per_thread); e != cudaSuccess) return e;
  CUcontext cur = nullptr;
  if ((*api)->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr) return cudaSuccess;
  CUcontext ctx = nullptr;
  if (CUresult res = primary_ctx(**api, current_device(), &ctx); res != CUDA_SUCCESS) return to_runtime(res);
  return to_runtime((*api)->cuCtxSetCurrent(ctx));
}

}  // namespace simcuda::rt

using namespace simcuda::rt;

RT_API cudaError_t cudaGetLastError() {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

RT_API cudaError_t cudaPeekAtLastError() { return t_last_error; }

RT_API const char* cudaGetErrorString(cudaError_t error) {
  for (const auto& e : kErrors)
    if (e.code == error) return e.text;
  return "unrecognized error code";
}

RT_API const char* cudaGetErrorName(cudaError_t error) {
  for (const auto& e : kErrors)
    if (e.code == error) return e.name;
  return "cudaErrorUnknown";
}

RT_API cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return record(cudaErrorInvalidValue);
  *version = CUDART_VERSION;
  return cudaSuccess;
}

RT_API cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (load(&api, false) != cudaSuccess) {
    *version = 0;  // documented: 0 when no driver is installed
    return cudaSuccess;
  }
  return finish(api->cuDriverGetVersion(version));
}

RT_API cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) {
    *count = 0;
    return record(e);
  }
  return finish(api->cuDeviceGetCount(count));
}

RT_API cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) return record(e);
  CUcontext cur = nullptr;
  CUdevice d = 0;
  if (api->cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur != nullptr && api->cuCtxGetDevice(&d) == CUDA_SUCCESS) {
    *device = d;
  } else {
    *device = current_device();
  }
  return cudaSuccess;
}

// Like CUDA 12+, cudaSetDevice initialises the device's primary context immediately.
RT_API cudaError_t cudaSetDevice(int device) {
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) return record(e);
  int count = 0;
  api->cuDeviceGetCount(&count);
  if (device < 0 || device >= count) return record(cudaErrorInvalidDevice);
  t_device = device;
  CUcontext ctx = nullptr;
  if (CUresult r = primary_ctx(*api, device, &ctx); r != CUDA_SUCCESS) return finish(r);
  return finish(api->cuCtxSetCurrent(ctx));
}

RT_API cudaError_t cudaDeviceSynchronize() {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  return finish(api->cuCtxSynchronize());
}

// Destroys all allocations and streams of the current device (cuDevicePrimaryCtxReset).
RT_API cudaError_t cudaDeviceReset() {
  const Api* api = nullptr;
  if (cudaError_t e = enter(&api); e != cudaSuccess) return record(e);
  CUdevice d = 0;
  if (CUresult r = api->cuCtxGetDevice(&d); r != CUDA_SUCCESS) return finish(r);
  return finish(api->cuDevicePrimaryCtxReset_v2(d));
}

RT_API cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) return record(e);
  // cudaDeviceAttr values equal the CUdevice_attribute values.
  return finish(api->cuDeviceGetAttribute(value, static_cast<CUdevice_attribute>(attr), device));
}

RT_API cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr) return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) return record(e);
  std::memset(prop, 0, sizeof(*prop));
  if (CUresult r = api->cuDeviceGetName(prop->name, sizeof(prop->name), device); r != CUDA_SUCCESS) return finish(r);
  api->cuDeviceTotalMem_v2(&prop->totalGlobalMem, device);
  auto attr = [&](CUdevice_attribute a) {
    int v = 0;
    api->cuDeviceGetAttribute(&v, a, device);
    return v;
  };
  prop->major = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  prop->minor = attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  prop->multiProcessorCount = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  prop->warpSize = attr(CU_DEVICE_ATTRIBUTE_WARP_SIZE);
  prop->maxThreadsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
  prop->maxThreadsPerMultiProcessor = attr(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR);
  prop->maxThreadsDim[0] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X);
  prop->maxThreadsDim[1] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y);
  prop->maxThreadsDim[2] = attr(CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z);
  prop->maxGridSize[0] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X);
  prop->maxGridSize[1] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y);
  prop->maxGridSize[2] = attr(CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z);
  prop->sharedMemPerBlock = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK));
  prop->totalConstMem = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY));
  prop->regsPerBlock = attr(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK);
  prop->l2CacheSize = attr(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE);
  prop->memoryBusWidth = attr(CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH);
  prop->textureAlignment = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT));
  prop->texturePitchAlignment = static_cast<size_t>(attr(CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT));
  prop->asyncEngineCount = attr(CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT);
  prop->pciBusID = attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  prop->unifiedAddressing = attr(CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
  prop->managedMemory = attr(CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY);
  prop->concurrentManagedAccess = attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS);
  prop->canMapHostMemory = attr(CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY);
  prop->concurrentKernels = attr(CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS);
  prop->memoryPoolsSupported = attr(CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED);
  prop->memPitch = SIZE_MAX;
  return cudaSuccess;
}

namespace {
cudaError_t entry_point(const char* symbol, void** fn, unsigned version, unsigned long long flags,
                        cudaDriverEntryPointQueryResult* status, bool ptsz) {
  if (symbol == nullptr || fn == nullptr || flags > cudaEnablePerThreadDefaultStream)
    return record(cudaErrorInvalidValue);
  const Api* api = nullptr;
  if (cudaError_t e = load(&api, false); e != cudaSuccess) return record(e);
  // cudaEnableDefault means per-thread for code built with per-thread default streams, which is
  // what the _ptsz entry points are for. The cudaEnable* values equal the CU_GET_PROC_ADDRESS_*.
  cuuint64_t cu_flags = flags;
  if (flags == cudaEnableDefault && ptsz) cu_flags = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult r = api->cuGetProcAddress_v2(symbol, fn, static_cast<int>(version), cu_flags, &st);
  if (status != nullptr) *status = static_cast<cudaDriverEntryPointQueryResult>(st);
  if (r == CUDA_ERROR_NOT_FOUND) {  // documented: cudaSuccess with *funcPtr = NULL
    *fn = nullptr;
    return cudaSuccess;
  }
  return finish(r);
}
}  // namespace

RT_API cudaError_t cudaGetDriverEntryPoint(const char* symbol, void** fn, unsigned long long flags,
                                           cudaDriverEntryPointQueryResult* status) {
  return entry_point(symbol, fn, CUDART_VERSION, flags, status, false);
}
RT_API cudaError_t cudaGetDriverEntryPoint_ptsz(const char* symbol, void** fn, unsigned long long flags,
                                                cudaDriverEntryPointQueryResult* status) {
  return entry_point(symbol, fn, CUDART_VERSION, flags, status, true);
}
RT_API cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int version,
                                                    unsigned long long flags, cudaDriverEntryPointQueryResult* status) {
  return entry_point(symbol, fn, version, flags, status, false);
}
RT_API cudaError_t cudaGetDriverEntryPointByVersion_ptsz(const char* symbol, void** fn, unsigned int version,
                                                         unsigned long long flags,
                                                         cudaDriverEntryPointQueryResult* status) {
  return entry_point(symbol, fn, version, flags, status, true);
}
