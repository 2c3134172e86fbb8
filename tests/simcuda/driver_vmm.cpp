// Simulated virtual memory management (cuMemCreate / cuMemAddressReserve / cuMemMap ...).
//
// A physical handle is a memfd of `size` bytes charged to its device; a reservation is a
// PROT_NONE anonymous mapping; cuMemMap maps the memfd MAP_SHARED|MAP_FIXED into it, still
// PROT_NONE until cuMemSetAccess (as on a GPU, mapped memory is inaccessible until access is
// granted). cuMemRelease only drops the handle's own reference: the memory stays charged until
// the last mapping is unmapped, as the cuMemRelease docs describe.
#include "driver_internal.h"

#include <sys/mman.h>
#include <unistd.h>

#include <vector>

namespace simcuda::drv {
namespace {

struct Physical {
  int fd = -1;
  size_t size = 0;
  int device = 0;
  int refs = 1;  // the handle itself + one per mapping
  bool released = false;
};

struct VmmState {
  std::mutex mu;  // order: VmmState::mu before State::mem_mu
  std::map<uint64_t, Physical> handles;
  uint64_t next_handle = 0x1000;
  std::map<uintptr_t, size_t> reservations;  // base -> size
};

VmmState& vmm() {
  static VmmState* v = new VmmState();
  return *v;
}

bool valid_prop(const CUmemAllocationProp* prop) {
  return prop != nullptr && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && valid_device(prop->location.id);
}

// Caller holds vmm().mu.
void unref_locked(uint64_t handle) {
  auto it = vmm().handles.find(handle);
  if (it == vmm().handles.end() || --it->second.refs > 0) return;
  close(it->second.fd);
  {
    std::lock_guard lock(state().mem_mu);
    Device& d = device(it->second.device);
    d.used -= it->second.size;
    --d.live;
  }
  vmm().handles.erase(it);
}

// Reservation that fully contains [p, p+n), or end().
std::map<uintptr_t, size_t>::iterator find_reservation(uintptr_t p, size_t n) {
  auto& r = vmm().reservations;
  auto it = r.upper_bound(p);
  if (it == r.begin()) return r.end();
  --it;
  if (p + n > it->first + it->second || p + n < p) return r.end();
  return it;
}

// Mappings exactly tiling [p, p+n), in address order; empty if the range is not fully mapped.
std::vector<Allocation> mappings_in(uintptr_t p, size_t n) {
  std::vector<Allocation> out;
  uintptr_t cur = p;
  while (cur < p + n) {
    Allocation a;
    if (!find_allocation(cur, &a) || a.kind != Kind::vmm_map || a.base != cur) return {};
    out.push_back(a);
    cur += a.size;
  }
  if (cur != p + n) return {};
  return out;
}

}  // namespace

void vmm_unref_handle(uint64_t handle) {
  std::lock_guard lock(vmm().mu);
  unref_locked(handle);
}

}  // namespace simcuda::drv

using namespace simcuda::drv;

SIM_API CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                               CUmemAllocationGranularity_flags option) {
  SIM_COUNT("cuMemGetAllocationGranularity");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (granularity == nullptr || !valid_prop(prop)) return CUDA_ERROR_INVALID_VALUE;
  if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
    return CUDA_ERROR_INVALID_VALUE;
  *granularity = kVmmGranularity;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                             unsigned long long flags) {
  SIM_COUNT("cuMemCreate");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (handle == nullptr || !valid_prop(prop) || flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (size == 0 || size % kVmmGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  const int dev = prop->location.id;
  {
    std::lock_guard lock(state().mem_mu);
    Device& d = device(dev);
    if (size > d.total || d.used > d.total - size) return CUDA_ERROR_OUT_OF_MEMORY;
    d.used += size;
    ++d.live;
  }
  int fd = memfd_create("simcuda-vmm", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    if (fd >= 0) close(fd);
    std::lock_guard lock(state().mem_mu);
    device(dev).used -= size;
    --device(dev).live;
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  std::lock_guard lock(vmm().mu);
  uint64_t h = vmm().next_handle++;
  Physical& ph = vmm().handles[h];
  ph.fd = fd;
  ph.size = size;
  ph.device = dev;
  *handle = h;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  SIM_COUNT("cuMemRelease");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(vmm().mu);
  auto it = vmm().handles.find(handle);
  if (it == vmm().handles.end() || it->second.released) return CUDA_ERROR_INVALID_VALUE;
  it->second.released = true;
  unref_locked(handle);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr /*addr hint*/,
                                     unsigned long long flags) {
  SIM_COUNT("cuMemAddressReserve");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (ptr == nullptr || flags != 0 || size == 0 || size % kVmmGranularity != 0) return CUDA_ERROR_INVALID_VALUE;
  if (alignment == 0) alignment = kVmmGranularity;
  if ((alignment & (alignment - 1)) != 0) return CUDA_ERROR_INVALID_VALUE;
  const size_t len = size + alignment;
  void* raw = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  uintptr_t base = round_up(r, alignment);
  if (base > r) munmap(raw, base - r);
  if (r + len > base + size) munmap(reinterpret_cast<void*>(base + size), r + len - (base + size));
  std::lock_guard lock(vmm().mu);
  vmm().reservations[base] = size;
  *ptr = base;
  return CUDA_SUCCESS;
}

// Frees the reservation; mappings still inside it are unmapped (and their handles unreferenced).
SIM_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  SIM_COUNT("cuMemAddressFree");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(vmm().mu);
  auto it = vmm().reservations.find(ptr);
  if (it == vmm().reservations.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
  std::vector<Allocation> inside;
  {
    State& s = state();
    std::lock_guard mlock(s.mem_mu);
    for (auto a = s.allocs.lower_bound(ptr); a != s.allocs.end() && a->first < ptr + size;) {
      inside.push_back(a->second);
      a = s.allocs.erase(a);
    }
  }
  for (const Allocation& a : inside) unref_locked(a.vmm_handle);
  munmap(reinterpret_cast<void*>(ptr), size);
  vmm().reservations.erase(it);
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                          unsigned long long flags) {
  SIM_COUNT("cuMemMap");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (flags != 0 || size == 0 || size % kVmmGranularity != 0 || ptr % kVmmGranularity != 0 ||
      offset % kVmmGranularity != 0)
    return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard lock(vmm().mu);
  auto h = vmm().handles.find(handle);
  if (h == vmm().handles.end() || h->second.released) return CUDA_ERROR_INVALID_HANDLE;
  if (offset > h->second.size || size > h->second.size - offset) return CUDA_ERROR_INVALID_VALUE;
  if (find_reservation(ptr, size) == vmm().reservations.end()) return CUDA_ERROR_INVALID_VALUE;
  for (uintptr_t p = ptr; p < ptr + size; p += kVmmGranularity)
    if (find_allocation(p, nullptr)) return CUDA_ERROR_ALREADY_MAPPED;
  void* m = mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->second.fd,
                 static_cast<off_t>(offset));
  if (m == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
  ++h->second.refs;
  State& s = state();
  std::lock_guard mlock(s.mem_mu);
  Allocation a;
  a.base = ptr;
  a.size = size;
  a.map_len = size;
  a.device = h->second.device;
  a.kind = Kind::vmm_map;
  a.id = s.next_alloc_id++;
  a.vmm_handle = handle;
  s.allocs[ptr] = a;
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  SIM_COUNT("cuMemUnmap");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  std::lock_guard lock(vmm().mu);
  std::vector<Allocation> maps = mappings_in(ptr, size);
  if (maps.empty()) return CUDA_ERROR_INVALID_VALUE;
  // Put the PROT_NONE reservation back in place of the shared mapping.
  mmap(reinterpret_cast<void*>(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
  for (const Allocation& a : maps) {
    Allocation taken;
    if (take_allocation(a.base, {Kind::vmm_map}, &taken) == CUDA_SUCCESS) unref_locked(taken.vmm_handle);
  }
  return CUDA_SUCCESS;
}

SIM_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  SIM_COUNT("cuMemSetAccess");
  if (CUresult r = check_init(); r != CUDA_SUCCESS) return r;
  if (desc == nullptr || count == 0) return CUDA_ERROR_INVALID_VALUE;
  int prot = PROT_NONE;
  for (size_t i = 0; i < count; ++i) {
    if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(desc[i].location.id))
      return CUDA_ERROR_INVALID_DEVICE;
    if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot |= PROT_READ | PROT_WRITE;
    else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) prot |= PROT_READ;
    else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard lock(vmm().mu);
  if (mappings_in(ptr, size).empty()) return CUDA_ERROR_INVALID_VALUE;
  if (mprotect(reinterpret_cast<void*>(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
