// Simulated device memory: allocation, free, cuMemGetInfo, pointer queries.
//
// "Device memory" is anonymous MAP_NORESERVE host memory, so large totals cost nothing until
// touched. Every allocation is charged to its device rounded up to 512 bytes (exact numbers,
// no 2 MiB page accounting) so tests can compute cuMemGetInfo results exactly.
#include "driver_internal.h"

#include <sys/mman.h>
#include <unistd.h>

#include <climits>

namespace simcuda::drv {
namespace {

size_t page_size() {
  static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return p;
}

bool kind_in(Kind k, std::initializer_list<Kind> kinds) {
  for (Kind x : kinds)
    if (x == k) return true;
  return false;
}

// Kinds cuMemFree accepts: cuMemAlloc, cuMemAllocPitch, cuMemAllocManaged and stream-ordered
// allocations (cuMemFree may free cuMemAllocAsync memory after synchronising, per the
// "Stream Ordered Memory Allocator" docs).
constexpr std::initializer_list<Kind> kFreeable = {Kind::device, Kind::pitch, Kind::managed, Kind::async};

CUresult mem_get_info(size_t* free_bytes, size_t* total_bytes) {
  int dev = 0;
  if (CUresult r = ctx_device(&dev); r != CUDA_SUCCESS) return r;
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(state().mem_mu);
  const Device& d = device(dev);
  *total_bytes = d.total;
  *free_bytes = d.used >= d.total ? 0 : d.total - d.used;
  return CUDA_SUCCESS;
}

CUresult alloc_in_ctx(uintptr_t* out, size_t size, Kind kind, bool low32) {
  int dev = 0;
  if (CUresult r = ctx_device(&dev); r != CUDA_SUCCESS) return r;
  return alloc_memory(dev, current_ctx(), size, kind, nullptr, low32, out);
}

}  // namespace

CUresult alloc_memory(int dev, CUctx_st* ctx, size_t size, Kind kind, CUmemoryPool pool, bool low32, uintptr_t* out) {
  if (out == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  const bool charged = kind != Kind::host;
  if (size > (SIZE_MAX >> 1)) return CUDA_ERROR_OUT_OF_MEMORY;
  const size_t acct = charged ? round_up(size, kAllocAlign) : 0;
  const size_t len = round_up(size, page_size());
  State& s = state();
  Device& d = device(dev);
  if (charged) {
    std::lock_guard lock(s.mem_mu);
    if (acct > d.total || d.used > d.total - acct) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += acct;
    ++d.live;
  }
  int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
  if (low32) flags |= MAP_32BIT;  // legacy cuMemAlloc returns 32-bit CUdeviceptr_v1 values
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, flags, -1, 0);
  std::lock_guard lock(s.mem_mu);
  if (p == MAP_FAILED) {
    if (charged) {
      d.used -= acct;
      --d.live;
    }
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  Allocation a;
  a.base = reinterpret_cast<uintptr_t>(p);
  a.size = size;
  a.accounted = acct;
  a.map_len = len;
  a.device = dev;
  a.kind = kind;
  a.id = s.next_alloc_id++;
  a.pool = pool;
  a.ctx = ctx;
  s.allocs[a.base] = a;
  *out = a.base;
  return CUDA_SUCCESS;
}

CUresult take_allocation(uintptr_t base, std::initializer_list<Kind> kinds, Allocation* out) {
  State& s = state();
  std::lock_guard lock(s.mem_mu);
  auto it = s.allocs.find(base);
  if (it == s.allocs.end() || !kind_in(it->second.kind, kinds)) return CUDA_ERROR_INVALID_VALUE;
  *out = it->second;
  s.allocs.erase(it);
  return CUDA_SUCCESS;
}

void release_allocation(const Allocation& a) {
  if (a.kind != Kind::vmm_map) munmap(reinterpret_cast<void*>(a.base), a.map_len);
  if (a.accounted == 0) return;
  std::lock_guard lock(state().mem_mu);
  Device& d = device(a.device);
  d.used -= a.accounted;
  --d.live;
}

void mark_graph_allocation(uintptr_t base) {
  State& s = state();
  std::lock_guard lock(s.mem_mu);
  if (auto it = s.allocs.find(base); it != s.allocs.end()) it->second.graph = true;
}

bool find_allocation(uintptr_t p, Allocation* out) {
  State& s = state();
  std::lock_guard lock(s.mem_mu);
  auto it = s.allocs.upper_bound(p);
  if (it == s.allocs.begin()) return false;
  --it;
  if (p >= it->second.base + it->second.size) return false;
  if (out != nullptr) *out = it->second;
  return true;
}

// True when [p, p+n) is covered by live allocations (adjacent VMM mappings may be chained).
bool range_is_known(uintptr_t p, size_t n) {
  uintptr_t end = p + n;
  while (p < end) {
    Allocation a;
    if (!find_allocation(p, &a)) return false;
    p = a.base + a.size;
  }
  return true;
}

void free_context_allocations(CUctx_st* ctx) {
  // A created context owns exactly what was allocated while it was current. A primary
  // context reset also drops the device's context-less allocations (stream-ordered ones),
  // never memory of the device's created contexts nor VMM mappings.
  auto owned = [ctx](const Allocation& a) {
    if (a.ctx == ctx) return true;
    return ctx->primary && a.ctx == nullptr && a.device == ctx->device && a.kind != Kind::vmm_map;
  };
  std::vector<Allocation> victims;
  {
    State& s = state();
    std::lock_guard lock(s.mem_mu);
    for (auto it = s.allocs.begin(); it != s.allocs.end();) {
      if (owned(it->second)) {
        victims.push_back(it->second);
        it = s.allocs.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (const Allocation& a : victims) release_allocation(a);
}

// cuMemFree: implicitly synchronises the allocation's device first, like the real driver, so
// work still queued on any stream never touches freed memory.
CUresult free_device_memory(uintptr_t p) {
  int dev = 0;
  if (CUresult r = ctx_device(&dev); r != CUDA_SUCCESS) return r;
  if (p == 0) return CUDA_SUCCESS;
  Allocation a;
  if (!find_allocation(p, &a) || a.base != p || !kind_in(a.kind, kFreeable)) return CUDA_ERROR_INVALID_VALUE;
  sync_device(a.device);
  if (CUresult r = take_allocation(p, kFreeable, &a); r != CUDA_SUCCESS) return r;
  release_allocation(a);
  return CUDA_SUCCESS;
}

}  // namespace simcuda::drv

using namespace simcuda::drv;

SIM_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t size) {
  SIM_COUNT("cuMemAlloc_v2");
  // Potentially unsafe during stream capture (cuThreadExchangeStreamCaptureMode: "a call to cudaMalloc").
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t p = 0;
  CUresult r = alloc_in_ctx(&p, size, Kind::device, false);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

SIM_API CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int size) {
  SIM_COUNT("cuMemAlloc");
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t p = 0;
  CUresult r = alloc_in_ctx(&p, size, Kind::device, true);
  if (r != CUDA_SUCCESS) return r;
  if (p > UINT_MAX) {  // MAP_32BIT space exhausted: cannot be expressed as CUdeviceptr_v1
    Allocation a;
    if (take_allocation(p, {Kind::device}, &a) == CUDA_SUCCESS) release_allocation(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = static_cast<CUdeviceptr_v1>(p);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemFree_v2(CUdeviceptr p) {
  SIM_COUNT("cuMemFree_v2");
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  return free_device_memory(p);
}

SIM_API CUresult cuMemFree(CUdeviceptr_v1 p) {
  SIM_COUNT("cuMemFree");
  return free_device_memory(p);
}

SIM_API CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  SIM_COUNT("cuMemGetInfo_v2");
  return mem_get_info(free_bytes, total_bytes);
}

SIM_API CUresult cuMemGetInfo(unsigned int* free_bytes, unsigned int* total_bytes) {
  SIM_COUNT("cuMemGetInfo");
  size_t f = 0, t = 0;
  if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult r = mem_get_info(&f, &t);
  if (r != CUDA_SUCCESS) return r;
  *free_bytes = f > UINT_MAX ? UINT_MAX : static_cast<unsigned>(f);
  *total_bytes = t > UINT_MAX ? UINT_MAX : static_cast<unsigned>(t);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t size, unsigned int flags) {
  SIM_COUNT("cuMemAllocManaged");
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  if (dptr == nullptr || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
    return CUDA_ERROR_INVALID_VALUE;
  uintptr_t p = 0;
  CUresult r = alloc_in_ctx(&p, size, Kind::managed, false);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}

// Pitch is the row width rounded up to 512 bytes (the simulated texture pitch alignment).
namespace {
CUresult alloc_pitch(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int elem) {
  if (dptr == nullptr || pitch == nullptr || width == 0 || height == 0) return CUDA_ERROR_INVALID_VALUE;
  if (elem != 4 && elem != 8 && elem != 16) return CUDA_ERROR_INVALID_VALUE;  // documented sizes
  size_t p = round_up(width, kAllocAlign);
  if (height > (SIZE_MAX >> 1) / p) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t out = 0;
  CUresult r = alloc_in_ctx(&out, p * height, Kind::pitch, false);
  if (r != CUDA_SUCCESS) return r;
  *dptr = out;
  *pitch = p;
  return CUDA_SUCCESS;
}
}  // namespace

SIM_API CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height, unsigned int elem) {
  SIM_COUNT("cuMemAllocPitch_v2");
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  return alloc_pitch(dptr, pitch, width, height, elem);
}

SIM_API CUresult cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pitch, unsigned int width, unsigned int height,
                                 unsigned int elem) {
  SIM_COUNT("cuMemAllocPitch");
  if (dptr == nullptr || pitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUdeviceptr p = 0;
  size_t pp = 0;
  CUresult r = alloc_pitch(&p, &pp, width, height, elem);
  if (r != CUDA_SUCCESS) return r;
  if (p > UINT_MAX) {  // cannot be expressed as CUdeviceptr_v1
    Allocation a;
    if (take_allocation(p, {Kind::pitch}, &a) == CUDA_SUCCESS) release_allocation(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  *dptr = static_cast<CUdeviceptr_v1>(p);
  *pitch = static_cast<unsigned>(pp);
  return CUDA_SUCCESS;
}

// Page-locked host memory: not charged to the device (it is host RAM on a real system).
SIM_API CUresult cuMemHostAlloc(void** pp, size_t size, unsigned int flags) {
  SIM_COUNT("cuMemHostAlloc");
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  constexpr unsigned kValid = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
  if (pp == nullptr || (flags & ~kValid) != 0) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t p = 0;
  CUresult r = alloc_in_ctx(&p, size, Kind::host, false);
  if (r == CUDA_SUCCESS) *pp = reinterpret_cast<void*>(p);
  return r;
}

SIM_API CUresult cuMemAllocHost_v2(void** pp, size_t size) {
  SIM_COUNT("cuMemAllocHost_v2");
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  if (pp == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t p = 0;
  CUresult r = alloc_in_ctx(&p, size, Kind::host, false);
  if (r == CUDA_SUCCESS) *pp = reinterpret_cast<void*>(p);
  return r;
}
SIM_API CUresult cuMemAllocHost(void** pp, unsigned int size) {
  SIM_COUNT("cuMemAllocHost");
  if (pp == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uintptr_t p = 0;
  CUresult r = alloc_in_ctx(&p, size, Kind::host, false);
  if (r == CUDA_SUCCESS) *pp = reinterpret_cast<void*>(p);
  return r;
}

SIM_API CUresult cuMemFreeHost(void* p) {
  SIM_COUNT("cuMemFreeHost");
  if (CUresult r = capture_unsafe_call(); r != CUDA_SUCCESS) return r;
  int dev = 0;
  if (CUresult r = ctx_device(&dev); r != CUDA_SUCCESS) return r;
  Allocation a;
  if (take_allocation(reinterpret_cast<uintptr_t>(p), {Kind::host}, &a) != CUDA_SUCCESS)
    return CUDA_ERROR_INVALID_VALUE;
  sync_device(a.device);
  release_allocation(a);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr p) {
  SIM_COUNT("cuMemGetAddressRange_v2");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  Allocation a;
  if (!find_allocation(p, &a)) return CUDA_ERROR_NOT_FOUND;  // documented for unknown addresses
  if (base != nullptr) *base = a.base;
  if (size != nullptr) *size = a.size;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemGetAddressRange(CUdeviceptr_v1* base, unsigned int* size, CUdeviceptr_v1 p) {
  CUdeviceptr b = 0;
  size_t s = 0;
  CUresult r = cuMemGetAddressRange_v2(&b, &s, p);
  if (r != CUDA_SUCCESS) return r;
  if (base != nullptr) *base = static_cast<CUdeviceptr_v1>(b);
  if (size != nullptr) *size = s > UINT_MAX ? UINT_MAX : static_cast<unsigned>(s);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attr, CUdeviceptr p) {
  SIM_COUNT("cuPointerGetAttribute");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (data == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Allocation a;
  if (!find_allocation(p, &a)) return CUDA_ERROR_INVALID_VALUE;  // not a CUDA allocation
  const bool host_visible = a.kind == Kind::host || a.kind == Kind::managed;
  switch (attr) {
    case CU_POINTER_ATTRIBUTE_CONTEXT:
      *static_cast<CUcontext*>(data) = a.ctx != nullptr ? a.ctx : &device(a.device).primary;
      break;
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *static_cast<CUmemorytype*>(data) = a.kind == Kind::host ? CU_MEMORYTYPE_HOST : CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER: *static_cast<CUdeviceptr*>(data) = p; break;
    case CU_POINTER_ATTRIBUTE_HOST_POINTER:
      if (!host_visible) return CUDA_ERROR_INVALID_VALUE;  // device memory has no host mapping
      *static_cast<void**>(data) = reinterpret_cast<void*>(p);
      break;
    case CU_POINTER_ATTRIBUTE_SYNC_MEMOPS: *static_cast<unsigned*>(data) = 1; break;
    case CU_POINTER_ATTRIBUTE_BUFFER_ID: *static_cast<unsigned long long*>(data) = a.id; break;
    case CU_POINTER_ATTRIBUTE_IS_MANAGED: *static_cast<unsigned*>(data) = a.kind == Kind::managed; break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *static_cast<int*>(data) = a.device; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: *static_cast<CUdeviceptr*>(data) = a.base; break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *static_cast<size_t*>(data) = a.size; break;
    case CU_POINTER_ATTRIBUTE_MAPPED: *static_cast<unsigned*>(data) = 1; break;
    case CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE: *static_cast<CUmemoryPool*>(data) = a.pool; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR: *static_cast<CUdeviceptr*>(data) = a.base; break;
    case CU_POINTER_ATTRIBUTE_MAPPING_SIZE: *static_cast<size_t*>(data) = a.size; break;
    case CU_POINTER_ATTRIBUTE_ACCESS_FLAGS:
      *static_cast<unsigned*>(data) = CU_POINTER_ATTRIBUTE_ACCESS_FLAG_READWRITE;
      break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
