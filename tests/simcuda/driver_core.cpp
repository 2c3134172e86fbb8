// Simulated driver: global state, initialisation, devices, error strings, counters and the
// simcuda_* test-control API (contexts: driver_ctx.cpp).
#include "driver_internal.h"
#include "simcuda.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace simcuda::drv {
namespace {

// Parses "17179869184", "256M", "4G", "1.5GiB"-style values (binary suffixes). 0 on error.
size_t parse_bytes(const char* s) {
  if (s == nullptr || *s == '\0') return 0;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (end == s || v <= 0) return 0;
  double mult = 1;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case 'K':
      mult = 1024.0;
      ++end;
      break;
    case 'M':
      mult = 1024.0 * 1024;
      ++end;
      break;
    case 'G':
      mult = 1024.0 * 1024 * 1024;
      ++end;
      break;
    case 'T':
      mult = 1024.0 * 1024 * 1024 * 1024;
      ++end;
      break;
    default: break;
  }
  if (*end == 'i' || *end == 'I') ++end;
  if (*end == 'b' || *end == 'B') ++end;
  if (*end != '\0') return 0;
  return static_cast<size_t>(v * mult);
}

}  // namespace

int driver_version() {
  static const int v = [] {
    const char* e = std::getenv("SIMCUDA_DRIVER_VERSION");
    if (e == nullptr || *e == '\0') return kDriverVersion;
    char* end = nullptr;
    long n = std::strtol(e, &end, 10);
    return end != e && *end == '\0' && n >= 1000 && n <= kDriverVersion ? static_cast<int>(n) : kDriverVersion;
  }();
  return v;
}

namespace {

State* make_state() {
  auto* s = new State();
  int count = 1;
  if (const char* e = std::getenv("SIMCUDA_DEVICE_COUNT"); e != nullptr && *e != '\0') {
    char* end = nullptr;
    long v = std::strtol(e, &end, 10);
    if (end != e && *end == '\0' && v >= 0 && v <= 64) count = static_cast<int>(v);
  }
  size_t total = size_t{16} << 30;
  if (size_t t = parse_bytes(std::getenv("SIMCUDA_TOTAL_MEMORY")); t != 0) total = t;
  s->device_count = count;
  s->devices.reset(new Device[count > 0 ? count : 1]);
  for (int i = 0; i < count; ++i) {
    Device& d = s->devices[i];
    d.ordinal = i;
    d.total = total;
    d.primary.device = i;
    d.primary.primary = true;
    d.legacy.device = i;
    d.legacy.legacy = true;
    d.default_pool.device = i;
    d.default_pool.is_default = true;
    s->pools.insert(&d.default_pool);
  }
  return s;
}

struct CounterSlot {
  const char* name;
  std::atomic<uint64_t> value{0};
};
constexpr int kMaxCounters = 256;
CounterSlot g_counters[kMaxCounters];
int g_counter_count = 0;
std::mutex g_counter_mu;

struct ErrorText {
  CUresult code;
  const char* name;
  const char* text;
};
// Texts follow the cuda.h documentation of CUresult.
constexpr ErrorText kErrors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_CONTEXT_IS_DESTROYED, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY",
     "the provided execution affinity is not supported"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

}  // namespace

State& state() {
  static State* s = make_state();
  return *s;
}

std::atomic<uint64_t>* counter_slot(const char* name) {
  std::lock_guard lock(g_counter_mu);
  for (int i = 0; i < g_counter_count; ++i)
    if (std::strcmp(g_counters[i].name, name) == 0) return &g_counters[i].value;
  if (g_counter_count == kMaxCounters) return &g_counters[kMaxCounters - 1].value;  // never hit
  g_counters[g_counter_count].name = name;
  return &g_counters[g_counter_count++].value;
}

CUresult check_init() {
  return state().initialized.load(std::memory_order_acquire) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

bool valid_device(int d) { return d >= 0 && d < state().device_count; }
Device& device(int ordinal) { return state().devices[ordinal]; }

}  // namespace simcuda::drv

using namespace simcuda::drv;

// ---- initialisation, version, errors ------------------------------------------------------------

SIM_API CUresult cuInit(unsigned int flags) {
  SIM_COUNT("cuInit");
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  State& s = state();
  if (s.device_count == 0) return CUDA_ERROR_NO_DEVICE;
  s.initialized.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDriverGetVersion(int* version) {
  if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *version = driver_version();
  return CUDA_SUCCESS;
}

SIM_API CUresult cuGetErrorString(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors)
    if (e.code == error) return *str = e.text, CUDA_SUCCESS;
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuGetErrorName(CUresult error, const char** str) {
  if (str == nullptr) return CUDA_ERROR_INVALID_VALUE;
  for (const auto& e : kErrors)
    if (e.code == error) return *str = e.name, CUDA_SUCCESS;
  *str = nullptr;
  return CUDA_ERROR_INVALID_VALUE;
}

// ---- devices --------------------------------------------------------------------------------

SIM_API CUresult cuDeviceGetCount(int* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  *count = state().device_count;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGet(CUdevice* dev, int ordinal) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(name, static_cast<size_t>(len), "simcuda device %d", dev);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  SIM_COUNT("cuDeviceTotalMem_v2");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard lock(state().mem_mu);
  *bytes = device(dev).total;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  size_t b = 0;
  CUresult r = cuDeviceTotalMem_v2(&b, dev);
  if (r == CUDA_SUCCESS) *bytes = b > 0xffffffffu ? 0xffffffffu : static_cast<unsigned>(b);
  return r;
}

// Values describe an H100-like device (compute capability 9.0, 132 SMs); attributes we do not
// model report 0 like an unsupported feature would.
SIM_API CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice dev) {
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (value == nullptr || attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
  if (!valid_device(dev)) return CUDA_ERROR_INVALID_DEVICE;
  int v = 0;
  switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 132; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: v = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y:
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: v = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: v = 65536; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 50 << 20; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 5120; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: v = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: v = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: v = 2; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = dev + 1; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: v = 1; break;
    default: v = 0; break;
  }
  *value = v;
  return CUDA_SUCCESS;
}

// ---- test-control API -----------------------------------------------------------------------

SIM_API int simcuda_device_count(void) { return state().device_count; }

SIM_API size_t simcuda_total_bytes(int dev) {
  if (!valid_device(dev)) return 0;
  std::lock_guard lock(state().mem_mu);
  return device(dev).total;
}

SIM_API int simcuda_set_total_bytes(int dev, size_t bytes) {
  if (!valid_device(dev)) return -1;
  std::lock_guard lock(state().mem_mu);
  device(dev).total = bytes;
  return 0;
}

SIM_API size_t simcuda_used_bytes(int dev) {
  if (!valid_device(dev)) return 0;
  std::lock_guard lock(state().mem_mu);
  return device(dev).used;
}

SIM_API size_t simcuda_live_allocations(int dev) {
  if (!valid_device(dev)) return 0;
  std::lock_guard lock(state().mem_mu);
  return device(dev).live;
}

SIM_API unsigned long long simcuda_call_count(const char* name) {
  if (name == nullptr) return 0;
  std::lock_guard lock(g_counter_mu);
  for (int i = 0; i < g_counter_count; ++i)
    if (std::strcmp(g_counters[i].name, name) == 0) return g_counters[i].value.load();
  return 0;
}

SIM_API void simcuda_reset_call_counts(void) {
  std::lock_guard lock(g_counter_mu);
  for (int i = 0; i < g_counter_count; ++i) g_counters[i].value.store(0);
}

SIM_API int simcuda_is_simulator(void) { return 1; }
