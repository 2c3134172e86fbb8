// Rules both halves apply to what the trace records say, kept here so that they cannot
// drift: the preload's in-process OOM report and the analyzer's summary diagnose an OOM with
// the same words from this code, and both key pass-through allocations by the same address
// spaces. Like format/trace.h (which includes it): header-only, no exceptions, no allocation
// (text goes into caller buffers through snprintf), so the preload can use it in its hooks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "format/trace.h"

namespace gpuheap {
namespace format {

// ---- address spaces ----

// Where an allocation's handle lives. cuMemMap's address lies inside a cuMemAddressReserve
// range and may equal its start, and a VMM handle is a number, not an address: the same
// value can name a pointer, a handle, a mapping and a reservation at once, so each kind is
// looked up in its own space (the preload's registry, the analyzer's live map).
enum class AddressSpace : std::uint8_t { pointer = 0, vmm_handle = 1, vmm_map = 2, va = 3 };
inline constexpr int kNumAddressSpaces = 4;

inline constexpr AddressSpace address_space(AllocKind k) noexcept {
  switch (k) {
    case AllocKind::vmm_physical: return AddressSpace::vmm_handle;
    case AllocKind::vmm_map: return AddressSpace::vmm_map;
    case AllocKind::va_reserve: return AddressSpace::va;
    default: return AddressSpace::pointer;
  }
}

// One u64 key for (address, kind): the address, with its address space in the top bits
// (addresses and VMM handles stay below 2^58). The analyzer's live maps (summary's model,
// replay's non-pool kinds) key by it, so a free finds its allocation by the same rule the
// preload's registry uses.
inline constexpr std::uint64_t space_key(std::uint64_t ptr, AllocKind k) noexcept {
  return ptr ^ (static_cast<std::uint64_t>(address_space(k)) << 58);
}

// ---- rolling windows ----

// The records a rolling window's segment (`gpuheap run --aggregate`) copies into its head,
// ahead of its snapshot: the trace's tables, which later events name by id. The preload
// copies them at a roll; `gpuheap top` reads them as the head of the segment it moves to.
inline constexpr bool is_table_record(RecordType t) noexcept {
  switch (t) {
    case RecordType::process:
    case RecordType::identity:
    case RecordType::device:
    case RecordType::module:
    case RecordType::module_unload:
    case RecordType::stack:
    case RecordType::thread:
    case RecordType::py_code:
    case RecordType::symbol_string:
    case RecordType::symbol_frames: return true;
    default: return false;
  }
}

// ---- sizes in text ----

// "512 B", "2.00 MiB", "40.0 MiB", "130 GiB": three significant digits, binary units. Both
// reports print sizes this way so that a sentence with a size in it reads the same in both.
inline const char* format_bytes(std::uint64_t b, char* buf, std::size_t cap) noexcept {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (b < 1024) {
    std::snprintf(buf, cap, "%llu B", static_cast<unsigned long long>(b));
    return buf;
  }
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 5) v /= 1024.0, ++u;
  std::snprintf(buf, cap, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, units[u]);
  return buf;
}
inline constexpr std::size_t kBytesTextSize = 32;  // enough for any format_bytes result

// ---- OOM diagnosis ----

enum class OomCause : std::uint8_t { fragmentation, limit, live_allocations };

inline constexpr const char* oom_cause_name(OomCause c) noexcept {
  switch (c) {
    case OomCause::fragmentation: return "fragmentation";
    case OomCause::limit: return "limit";
    case OomCause::live_allocations: return "live_allocations";
  }
  return "?";
}

// What the diagnosis is made from. The preload fills it from its live state, the analyzer
// from the oom record and its replay; the record's fields are the same numbers either way.
struct OomFacts {
  std::uint64_t requested = 0;
  std::uint64_t largest_free = 0;   // the pool's largest free block
  std::uint64_t cached_unused = 0;  // the pool's cache: reserved - allocated
  std::uint64_t limit = 0;          // GPUHEAP_LIMIT of the device, 0: none
  std::uint64_t held = 0;           // device bytes the process held (what the cap counts)
  std::uint64_t device_free = 0;    // the driver's free memory
};

inline OomFacts oom_facts(const OomRecord& r, std::uint64_t held) noexcept {
  OomFacts f;
  f.requested = r.requested, f.largest_free = r.largest_free, f.limit = r.limit, f.held = held;
  f.cached_unused = r.reserved > r.allocated ? r.reserved - r.allocated : 0;
  f.device_free = r.device_free;
  return f;
}

struct OomDiagnosis {
  OomCause cause = OomCause::live_allocations;
  bool fits_without_fragmentation = false;  // cached_unused >= request > largest free block
};

// Fragmentation first (the cache had the bytes, only not in one piece); then the cap, when it
// and not the device failed; else the live data really needs the memory.
inline constexpr OomDiagnosis diagnose_oom(const OomFacts& f) noexcept {
  OomDiagnosis d;
  d.fits_without_fragmentation = f.cached_unused >= f.requested && f.largest_free < f.requested;
  if (d.fits_without_fragmentation) d.cause = OomCause::fragmentation;
  else if (f.limit && f.held + f.requested > f.limit && f.device_free > f.requested) d.cause = OomCause::limit;
  else d.cause = OomCause::live_allocations;
  return d;
}

// The diagnosis in words: `fit` is the "fragmentation cost ..." sentence, `suggestion`
// what to do. Each report prints them behind its own line prefix.
struct OomText {
  char fit[160];
  char suggestion[320];
};

inline void oom_text(const OomFacts& f, const OomDiagnosis& d, OomText* out) noexcept {
  char cu[kBytesTextSize], lf[kBytesTextSize], cap[kBytesTextSize], df[kBytesTextSize];
  // The analyzer's one verdict (analyzer/model/fragmentation.h words it at the peak): the
  // pool's free bytes at the failed request are what fragmentation cost there.
  std::snprintf(out->fit, sizeof out->fit,
                "fragmentation cost %s here (free in the pool, largest free block %s): with it gone the request "
                "%s have fit",
                format_bytes(f.cached_unused, cu, sizeof cu), format_bytes(f.largest_free, lf, sizeof lf),
                d.fits_without_fragmentation ? "would" : "would not");
  switch (d.cause) {
    case OomCause::fragmentation:
      std::snprintf(out->suggestion, sizeof out->suggestion, "%s",
                    "the pool's free memory is split in pieces smaller than the request; allocate long-lived "
                    "buffers first, free large temporaries earlier, or release the cache (gpuheap_empty_cache(), "
                    "GPUHEAP_RELEASE_THRESHOLD) before this allocation");
      break;
    case OomCause::limit:
      std::snprintf(out->suggestion, sizeof out->suggestion,
                    "the per-process cap GPUHEAP_LIMIT=%s is what failed; the device itself has %s free",
                    format_bytes(f.limit, cap, sizeof cap), format_bytes(f.device_free, df, sizeof df));
      break;
    case OomCause::live_allocations:
      std::snprintf(out->suggestion, sizeof out->suggestion, "%s",
                    "the live allocations really need this much; reduce the batch or model size, or free what "
                    "the largest live sites below hold");
      break;
  }
}

}  // namespace format
}  // namespace gpuheap
