// gpuheap trace format: the one contract between preload/ (writer) and analyzer/ (reader).
// Header-only, no dependencies beyond the C++17 standard library, no exceptions, no
// allocation in the encoders (they write into a caller-provided byte buffer), so the
// in-process writer can use them on the hot path.
//
// The decoders are in format/decode.h, the rules that interpret records the same way on both
// sides (OOM diagnosis, address spaces) in format/rules.h; this header includes both.
//
// Documented once, for users, in docs/trace-format.md. Any change to a record's layout
// bumps kFormatVersion; readers refuse versions newer than they know.
//
// File layout:
//   FileHeader (16 bytes)            magic "GPUHEAP\0", u16 version, u16 flags, u32 reserved
//   Record*                          each: u8 type | u32 payload_len | payload
// All integers little-endian, unaligned. Strings are u32 length + bytes (no NUL).
// A file cut at any byte is read up to the last whole record: the frame carries the
// payload length, and the reader stops (reporting truncation) when a frame is incomplete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace gpuheap {
namespace format {

inline constexpr char kMagic[8] = {'G', 'P', 'U', 'H', 'E', 'A', 'P', '\0'};
// Version 2 added py_code records and Python frame entries in stacks (see kPyFrameTag). A
// version-1 file is still read (it has neither). Version 3 added phase records and the
// symbol records (symbol_string, symbol_frames: frames stored by `gpuheap symbolize` on the
// recording machine); older files are still read. Version 4 added the identity record (the
// job's rank, from the launcher's environment; a file without one reads as before), version 5
// the compact event records (format/compact.h), version 6 the snapshot record (the state a
// rolling window (`gpuheap run --aggregate`) starts from); every record of an older version
// is still valid in the newer ones. Version 7 added the event block (format/block.h), which
// only the compressor writes: a file of records alone (what the preload and every rewriting
// tool write) says kRecordVersion, so that readers of version 6 still read it.
inline constexpr std::uint16_t kFormatVersion = 7;  // the newest version a reader understands
inline constexpr std::uint16_t kRecordVersion = 6;  // what a file without event blocks says
inline constexpr std::uint16_t kFirstCompactVersion = 5;
inline constexpr std::uint16_t kFirstBlockVersion = 7;
inline constexpr std::size_t kFileHeaderSize = 16;
inline constexpr std::size_t kFrameHeaderSize = 5;  // u8 type + u32 payload length
// No record is larger than this; a frame declaring more is corruption, not a big record.
inline constexpr std::uint32_t kMaxPayload = 1u << 20;
inline constexpr std::uint16_t kMaxStackDepth = 256;
inline constexpr std::uint32_t kMaxPhaseName = 256;
// Symbol records (v3): a string longer than this is cut by the writer; an ip has at most
// kMaxSymbolFrames frames (its inline chain, innermost first, then the concrete function).
inline constexpr std::uint32_t kMaxSymbolString = 4096;
inline constexpr std::uint16_t kMaxSymbolFrames = 64;
inline constexpr std::size_t kSymbolFrameEntrySize = 13;  // u32 function | u32 file | u32 line | u8 flags
inline constexpr std::uint8_t kSymbolInlined = 1u << 0;   // symbol frame entry flag

enum class RecordType : std::uint8_t {
  process = 1,         // once, first record: who ran
  device = 2,          // once per device, when first seen (CUDA is not touched at load)
  module = 3,          // a loaded ELF object (for offline symbolization)
  module_unload = 4,   // dlclose of a module
  stack = 5,           // a distinct call stack, written once before first use
  alloc = 6,           // memory handed to the program
  free = 7,            // memory given back by the program
  free_completed = 8,  // pooled block became reusable (GPU work before its free done)
  segment_alloc = 9,   // pool took a segment from the driver
  segment_free = 10,   // pool returned a segment to the driver
  oom = 11,            // an allocation finally failed
  retry = 12,          // pool released its cache and retried after a failed upstream alloc
  empty_cache = 13,    // cached free segments released (API, policy or OOM path)
  thread = 14,         // thread id -> name
  end = 15,            // clean close: no record follows
  py_code = 16,        // a Python code object, written once before a stack names it (v2)
  phase = 17,          // a phase marker: gpuheap_mark/push/pop or an NVTX range (v3)
  symbol_string = 18,  // a string of the stored symbols (function or file name), once (v3)
  symbol_frames = 19,  // the frames of one stack ip, symbolized where the modules were (v3)
  identity = 20,       // the job's rank of this process, right after `process`, if known (v4)
  snapshot = 21,       // part of the state a rolling window's segment starts from (v6)
  event_block = 22,    // compact event frames regrouped by the compressor (v7, format/block.h)
};
// The largest type decode_frame decodes: an event_block is expanded into the frames it holds
// before any record is decoded (format/block.h), so decode_frame never accepts one.
inline constexpr std::uint8_t kMaxRecordType = 21;

// A stack entry with bit 63 set is a Python frame, not a return address (no user-space
// address on x86-64 or aarch64 has that bit): bits 32..62 hold the py_code id (from 1),
// bits 0..31 the index of the code unit being executed (the frame's "lasti"; kPyNoLasti
// when the interpreter had not started the frame). Python frames follow the native ones.
inline constexpr std::uint64_t kPyFrameTag = 1ull << 63;
inline constexpr std::uint32_t kPyNoLasti = 0xFFFFFFFFu;
inline constexpr std::uint32_t kMaxPyCodeId = 0x7FFFFFFFu;
inline constexpr bool is_py_frame(std::uint64_t e) { return (e & kPyFrameTag) != 0; }
inline constexpr std::uint64_t py_frame(std::uint32_t code_id, std::uint32_t lasti) {
  return kPyFrameTag | (static_cast<std::uint64_t>(code_id & kMaxPyCodeId) << 32) | lasti;
}
inline constexpr std::uint32_t py_frame_code(std::uint64_t e) {
  return static_cast<std::uint32_t>((e >> 32) & kMaxPyCodeId);
}
inline constexpr std::uint32_t py_frame_lasti(std::uint64_t e) { return static_cast<std::uint32_t>(e); }

// What kind of memory an alloc/free record is about. Only device_pooled is served from
// gpuheap's pool; everything else is recorded and passed through to the driver.
enum class AllocKind : std::uint8_t {
  device_pooled = 0,       // cudaMalloc / cuMemAlloc_v2 served by the pool
  device_passthrough = 1,  // cudaMalloc / cuMemAlloc_v2 with the pool off
  async = 2,               // cudaMallocAsync / cuMemAllocAsync / FromPoolAsync (stream-ordered)
  managed = 3,             // cudaMallocManaged / cuMemAllocManaged
  host_pinned = 4,         // cudaMallocHost / cudaHostAlloc / cuMemHostAlloc
  pitch = 5,               // cudaMallocPitch / cudaMalloc3D / cuMemAllocPitch_v2
  vmm_physical = 6,        // cuMemCreate (ptr field = handle) / cuMemRelease
  vmm_map = 7,             // cuMemMap / cuMemUnmap (ptr = virtual address)
  va_reserve = 8,          // cuMemAddressReserve / cuMemAddressFree (address space only)
};
inline constexpr int kNumAllocKinds = 9;

inline const char* alloc_kind_name(AllocKind k) {
  switch (k) {
    case AllocKind::device_pooled: return "pooled";
    case AllocKind::device_passthrough: return "device";
    case AllocKind::async: return "async";
    case AllocKind::managed: return "managed";
    case AllocKind::host_pinned: return "host";
    case AllocKind::pitch: return "pitch";
    case AllocKind::vmm_physical: return "vmm_physical";
    case AllocKind::vmm_map: return "vmm_map";
    case AllocKind::va_reserve: return "va_reserve";
  }
  return "unknown";
}

// Kinds whose bytes are device memory the process holds (what a memory cap counts and what
// "held" means in reports); host memory, address-space reservations and mappings of
// already-counted physical memory are not.
inline bool holds_device_memory(AllocKind k) {
  switch (k) {
    case AllocKind::device_pooled:
    case AllocKind::device_passthrough:
    case AllocKind::pitch:
    case AllocKind::async:
    case AllocKind::managed:
    case AllocKind::vmm_physical: return true;
    default: return false;
  }
}

// Flags on alloc/free/segment records.
inline constexpr std::uint8_t kFlagSmallPool = 1u << 0;  // block/segment from the small pool
inline constexpr std::uint8_t kFlagOversize = 1u << 1;   // block at/above max split size
inline constexpr std::uint8_t kFlagFailed = 1u << 2;     // free: the call returned an error

enum class EmptyCacheReason : std::uint8_t { api = 0, threshold = 1, oom_retry = 2, exit = 3 };
enum class EndReason : std::uint8_t { exit = 0, signal = 1, stopped = 2 };
// A phase record marks a point (mark) or opens/closes a range (push/pop) on one thread.
// Ranges nest per thread; a pop closes the innermost open range of its thread (NVTX's
// nvtxRangePop carries no name, so the name of a pop may be empty).
enum class PhaseOp : std::uint8_t { mark = 0, push = 1, pop = 2 };
enum class PhaseSource : std::uint8_t { api = 0 /* gpuheap_mark/push/pop */, nvtx = 1 };

// ---- decoded records (plain structs; strings are views into the frame) ----

struct ProcessRecord {
  std::uint32_t pid = 0, ppid = 0;
  std::uint64_t wall_ns = 0;  // CLOCK_REALTIME at start, ns since epoch
  std::uint64_t mono_ns = 0;  // CLOCK_MONOTONIC at start; event timestamps use this clock
  std::string_view hostname, cmdline /* args joined by '\0' */, version, exe;
};
// Which launcher's environment variables an identity record was read from.
enum class RankSource : std::uint8_t {
  torchrun = 1,  // RANK, LOCAL_RANK, WORLD_SIZE (torchrun, torch.distributed.launch, accelerate, deepspeed)
  ompi = 2,      // OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_SIZE (Open MPI)
  pmi = 3,       // PMI_RANK, MPI_LOCALRANKID, PMI_SIZE (MPICH, Intel MPI, srun --mpi=pmi2)
  slurm = 4,     // SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS (srun)
};
inline constexpr std::uint8_t kMaxRankSource = 4;
inline const char* rank_source_name(RankSource s) {
  switch (s) {
    case RankSource::torchrun: return "torchrun";
    case RankSource::ompi: return "ompi";
    case RankSource::pmi: return "pmi";
    case RankSource::slurm: return "slurm";
  }
  return "unknown";
}
// The process's place in a distributed job, as its launcher's environment said at start.
// -1: the launcher did not say (a rank is always known: no record is written without one).
struct IdentityRecord {
  std::int32_t rank = -1, local_rank = -1, world_size = -1;
  RankSource source = RankSource::torchrun;
};
struct DeviceRecord {
  std::int32_t device = 0;
  std::uint64_t total_memory = 0;
  std::string_view name;
};
struct ModuleRecord {
  std::uint64_t base = 0;        // l_addr: load bias added to the ELF's vaddrs
  std::uint64_t lo = 0, hi = 0;  // absolute address range of its PT_LOAD segments
  std::string_view path;
  std::string_view build_id;  // raw bytes of NT_GNU_BUILD_ID (may be empty)
};
struct ModuleUnloadRecord {
  std::uint64_t ts = 0, base = 0;
};
struct StackRecord {
  std::uint32_t id = 0;  // ids start at 1; 0 means "no stack"
  std::uint16_t depth = 0;
  const unsigned char* ips = nullptr;  // depth little-endian u64 return addresses, innermost first
  std::uint64_t ip(std::size_t i) const {
    std::uint64_t v;
    std::memcpy(&v, ips + 8 * i, 8);
    return v;
  }
};
struct AllocRecord {
  std::uint64_t ts = 0;
  std::uint32_t tid = 0;
  std::int16_t device = 0;
  AllocKind kind = AllocKind::device_pooled;
  std::uint8_t flags = 0;
  std::uint64_t ptr = 0, requested = 0, size = 0, stream = 0;
  std::uint32_t stack = 0;
};
struct FreeRecord {
  std::uint64_t ts = 0;
  std::uint32_t tid = 0;
  std::int16_t device = 0;
  AllocKind kind = AllocKind::device_pooled;
  std::uint8_t flags = 0;
  std::uint64_t ptr = 0, size = 0, stream = 0;
  std::uint32_t stack = 0;
};
struct FreeCompletedRecord {
  std::uint64_t ts = 0;
  std::int16_t device = 0;
  std::uint64_t ptr = 0, size = 0;
};
struct SegmentRecord {  // segment_alloc and segment_free
  std::uint64_t ts = 0;
  std::int16_t device = 0;
  std::uint8_t flags = 0;  // kFlagSmallPool
  std::uint64_t ptr = 0, size = 0;
};
struct OomRecord {
  std::uint64_t ts = 0;
  std::uint32_t tid = 0;
  std::int16_t device = 0;
  AllocKind kind = AllocKind::device_pooled;
  std::uint64_t requested = 0, stream = 0;
  std::uint64_t device_free = 0, device_total = 0;              // cudaMemGetInfo's view (driver) at failure
  std::uint64_t limit = 0;                                      // per-process cap, 0 = none
  std::uint64_t reserved = 0, allocated = 0, largest_free = 0;  // pool state at failure
  std::uint32_t stack = 0;
};
struct RetryRecord {
  std::uint64_t ts = 0;
  std::int16_t device = 0;
  std::uint64_t requested = 0;
};
struct EmptyCacheRecord {
  std::uint64_t ts = 0;
  std::int16_t device = 0;
  EmptyCacheReason reason = EmptyCacheReason::api;
  std::uint64_t released = 0;
};
struct ThreadRecord {
  std::uint32_t tid = 0;
  std::string_view name;
};
// A Python code object, as the interpreter's PyCodeObject had it. The line of a frame is
// computed offline from `linetable` (co_linetable: 3.10's address/line pairs, or 3.11+'s
// location table; which one follows from py_minor) and the frame's lasti.
struct PyCodeRecord {
  std::uint32_t id = 0;  // from 1, per file
  std::uint8_t py_major = 3, py_minor = 0;
  std::int32_t firstlineno = 0;
  std::string_view filename, name /* co_qualname where the version has it */, linetable;
};
struct PhaseRecord {
  std::uint64_t ts = 0;  // CLOCK_MONOTONIC ns, as every event
  std::uint32_t tid = 0;
  PhaseOp op = PhaseOp::mark;
  PhaseSource source = PhaseSource::api;
  std::string_view name;  // at most kMaxPhaseName bytes (the writer cuts longer names)
};
// Written by `gpuheap symbolize` (never by the preload: nothing in the process symbolizes),
// after every other record and before `end`. Strings come first, each once per file; the
// frames of an ip name them by id (from 1; 0: unknown).
struct SymbolStringRecord {
  std::uint32_t id = 0;
  std::string_view text;  // at most kMaxSymbolString bytes
};
struct SymbolFrameEntry {
  std::uint32_t function = 0, file = 0;  // symbol_string ids, 0: unknown
  std::uint32_t line = 0;                // 0: unknown
  std::uint8_t flags = 0;                // kSymbolInlined
};
struct SymbolFramesRecord {
  std::uint64_t ip = 0;  // a stack entry exactly as a stack record holds it (return address)
  std::uint16_t count = 0;
  const unsigned char* entries = nullptr;  // count entries of kSymbolFrameEntrySize bytes
  SymbolFrameEntry entry(std::size_t i) const {
    SymbolFrameEntry e;
    const unsigned char* q = entries + kSymbolFrameEntrySize * i;
    std::memcpy(&e.function, q, 4), std::memcpy(&e.file, q + 4, 4), std::memcpy(&e.line, q + 8, 4);
    e.flags = q[12];
    return e;
  }
};
struct EndRecord {
  std::uint64_t ts = 0;
  EndReason reason = EndReason::exit;
  std::uint64_t records = 0;  // records written before this one (header excluded)
};

// A segment of a rolling-window trace (`gpuheap run --aggregate`) starts with the state of the
// run before it: the process's tables (copied records), then snapshot records, in this order:
// begin, one device part per device, live parts, peak_freed parts, site parts, end. A reader
// seeds its model from them; the events after them continue from that state. A segment is
// published (renamed over the trace's path) only once its snapshot is whole.
enum class SnapshotPart : std::uint8_t {
  begin = 0,       // ts | segment | events_before | first_ts
  device = 1,      // device, its peak of held requested bytes: when, the block bytes then, peak_seq;
                   // its oom, retry and empty_cache records before this file
  live = 2,        // allocations live now (kSnapLiveSize bytes each)
  peak_freed = 3,  // allocations live at their device's peak, freed since (kSnapFreedSize each)
  site = 4,        // per stack: every allocation since the start (kSnapSiteSize each)
  end = 5,         // entries written: live, peak_freed, site (a check that the snapshot is whole)
};
inline constexpr std::uint8_t kMaxSnapshotPart = 5;
// live: u64 seq | u64 ts | u64 ptr | u64 size | u64 requested | u64 stream | u32 tid | u32 stack
//       | i16 device | u8 kind | u8 flags. flags: the alloc record's, and kSnapPending for a
//       pooled block freed by the program whose free_completed has not come yet.
inline constexpr std::size_t kSnapLiveSize = 60;
inline constexpr std::uint8_t kSnapPending = 0x80;
// peak_freed: u32 stack | i16 device | u64 requested | u64 size
inline constexpr std::size_t kSnapFreedSize = 22;
// site: u32 stack | u64 allocs | u64 alloc_bytes (requested) | u64 alloc_allocated | u64 max_live_bytes
inline constexpr std::size_t kSnapSiteSize = 36;
// Entries per live/peak_freed/site record: a record stays below kMaxPayload.
inline constexpr std::uint32_t kSnapMaxEntries = 16384;

struct SnapLive {
  std::uint64_t seq = 0, ts = 0, ptr = 0, size = 0, requested = 0, stream = 0;
  std::uint32_t tid = 0, stack = 0;
  std::int16_t device = 0;
  AllocKind kind = AllocKind::device_pooled;
  std::uint8_t flags = 0;
};
struct SnapFreed {
  std::uint32_t stack = 0;
  std::int16_t device = 0;
  std::uint64_t requested = 0, size = 0;
};
struct SnapSite {
  std::uint32_t stack = 0;
  std::uint64_t allocs = 0, alloc_bytes = 0, alloc_allocated = 0, max_live_bytes = 0;
};
struct SnapshotRecord {
  SnapshotPart part = SnapshotPart::begin;
  // begin: ts (the roll), segment (rolls so far, from 1), events_before (event records of the
  // run not in this file), first_ts (the run's first event). end: the three counts.
  std::uint64_t ts = 0, events_before = 0, first_ts = 0;
  std::uint32_t segment = 0;
  std::uint64_t n_live = 0, n_freed = 0, n_sites = 0;
  // device
  std::int16_t device = 0;
  std::uint64_t peak_requested = 0, peak_allocated = 0, peak_ts = 0, peak_seq = 0;
  std::uint64_t ooms = 0, retries = 0, empty_cache_calls = 0, empty_cache_released = 0;
  // live, peak_freed, site: count entries at `entries`
  std::uint32_t count = 0;
  const unsigned char* entries = nullptr;
  SnapLive live(std::size_t i) const {
    const unsigned char* q = entries + kSnapLiveSize * i;
    SnapLive e;
    std::memcpy(&e.seq, q, 8), std::memcpy(&e.ts, q + 8, 8), std::memcpy(&e.ptr, q + 16, 8);
    std::memcpy(&e.size, q + 24, 8), std::memcpy(&e.requested, q + 32, 8), std::memcpy(&e.stream, q + 40, 8);
    std::memcpy(&e.tid, q + 48, 4), std::memcpy(&e.stack, q + 52, 4), std::memcpy(&e.device, q + 56, 2);
    e.kind = static_cast<AllocKind>(q[58]), e.flags = q[59];
    return e;
  }
  SnapFreed freed(std::size_t i) const {
    const unsigned char* q = entries + kSnapFreedSize * i;
    SnapFreed e;
    std::memcpy(&e.stack, q, 4), std::memcpy(&e.device, q + 4, 2), std::memcpy(&e.requested, q + 6, 8);
    std::memcpy(&e.size, q + 14, 8);
    return e;
  }
  SnapSite site(std::size_t i) const {
    const unsigned char* q = entries + kSnapSiteSize * i;
    SnapSite e;
    std::memcpy(&e.stack, q, 4), std::memcpy(&e.allocs, q + 4, 8), std::memcpy(&e.alloc_bytes, q + 12, 8);
    std::memcpy(&e.alloc_allocated, q + 20, 8), std::memcpy(&e.max_live_bytes, q + 28, 8);
    return e;
  }
};

namespace detail {

// Bounded little-endian writer into a caller buffer. Overflow sets ok=false; encoders
// size their records up front so callers can reserve exactly.
struct Writer {
  unsigned char* p;
  unsigned char* end;
  bool ok = true;
  void bytes(const void* src, std::size_t n) {
    if (n == 0) return;  // src may be null (an empty string_view): memcpy(p, nullptr, 0) is UB
    if (static_cast<std::size_t>(end - p) < n) {
      ok = false;
      return;
    }
    std::memcpy(p, src, n);
    p += n;
  }
  template <class T>
  void put(T v) {
    bytes(&v, sizeof v);  // x86-64 and aarch64 are little-endian; see static_assert below
  }
  void str(std::string_view s) {
    put<std::uint32_t>(static_cast<std::uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
};

struct Reader {
  const unsigned char* p;
  const unsigned char* end;
  bool ok = true;
  template <class T>
  T get() {
    T v{};
    if (static_cast<std::size_t>(end - p) < sizeof v) {
      ok = false;
      return v;
    }
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  }
  std::string_view str() {
    auto n = get<std::uint32_t>();
    if (!ok || static_cast<std::size_t>(end - p) < n) {
      ok = false;
      return {};
    }
    std::string_view s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
  const unsigned char* raw(std::size_t n) {
    if (static_cast<std::size_t>(end - p) < n) {
      ok = false;
      return nullptr;
    }
    auto* r = p;
    p += n;
    return r;
  }
};

// Writes the frame header, then lets `body` fill the payload; patches the length.
template <class Body>
inline std::size_t frame(unsigned char* buf, std::size_t cap, RecordType t, Body&& body) {
  if (cap < kFrameHeaderSize) return 0;
  Writer w{buf + kFrameHeaderSize, buf + cap};
  body(w);
  if (!w.ok) return 0;
  auto len = static_cast<std::uint32_t>(w.p - (buf + kFrameHeaderSize));
  buf[0] = static_cast<unsigned char>(t);
  std::memcpy(buf + 1, &len, 4);
  return kFrameHeaderSize + len;
}

}  // namespace detail

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "trace encoding assumes little-endian");

// ---- file header ----

inline void encode_file_header(unsigned char out[kFileHeaderSize], std::uint16_t version = kRecordVersion) {
  std::memset(out, 0, kFileHeaderSize);
  std::memcpy(out, kMagic, 8);
  std::memcpy(out + 8, &version, sizeof version);
}

enum class HeaderStatus { ok, not_a_trace, newer_version, short_file };

inline HeaderStatus decode_file_header(const unsigned char* p, std::size_t n, std::uint16_t* version) {
  if (n < 8) return n == 0 || std::memcmp(p, kMagic, n) == 0 ? HeaderStatus::short_file : HeaderStatus::not_a_trace;
  if (std::memcmp(p, kMagic, 8) != 0) return HeaderStatus::not_a_trace;
  if (n < kFileHeaderSize) return HeaderStatus::short_file;
  std::uint16_t v;
  std::memcpy(&v, p + 8, 2);
  if (version) *version = v;
  if (v == 0) return HeaderStatus::not_a_trace;
  if (v > kFormatVersion) return HeaderStatus::newer_version;
  return HeaderStatus::ok;
}

// ---- encoders: each returns bytes written into buf (0 if cap is too small) ----
// Layouts are given as payload fields in order.

// process: u32 pid | u32 ppid | u64 wall_ns | u64 mono_ns | str hostname | str cmdline
//          | str version | str exe
inline std::size_t encode(unsigned char* buf, std::size_t cap, const ProcessRecord& r) {
  return detail::frame(buf, cap, RecordType::process, [&](detail::Writer& w) {
    w.put(r.pid), w.put(r.ppid), w.put(r.wall_ns), w.put(r.mono_ns);
    w.str(r.hostname), w.str(r.cmdline), w.str(r.version), w.str(r.exe);
  });
}
// identity: i32 rank | i32 local_rank | i32 world_size | u8 source    (13-byte payload)
inline std::size_t encode(unsigned char* buf, std::size_t cap, const IdentityRecord& r) {
  return detail::frame(buf, cap, RecordType::identity, [&](detail::Writer& w) {
    w.put(r.rank), w.put(r.local_rank), w.put(r.world_size), w.put(static_cast<std::uint8_t>(r.source));
  });
}
// device: i32 device | u64 total_memory | str name
inline std::size_t encode(unsigned char* buf, std::size_t cap, const DeviceRecord& r) {
  return detail::frame(buf, cap, RecordType::device,
                       [&](detail::Writer& w) { w.put(r.device), w.put(r.total_memory), w.str(r.name); });
}
// module: u64 base | u64 lo | u64 hi | str path | str build_id
inline std::size_t encode(unsigned char* buf, std::size_t cap, const ModuleRecord& r) {
  return detail::frame(buf, cap, RecordType::module, [&](detail::Writer& w) {
    w.put(r.base), w.put(r.lo), w.put(r.hi), w.str(r.path), w.str(r.build_id);
  });
}
// module_unload: u64 ts | u64 base
inline std::size_t encode(unsigned char* buf, std::size_t cap, const ModuleUnloadRecord& r) {
  return detail::frame(buf, cap, RecordType::module_unload, [&](detail::Writer& w) { w.put(r.ts), w.put(r.base); });
}
// stack: u32 id | u16 depth | u64 ip[depth]  (innermost frame first; return addresses)
inline std::size_t encode_stack(unsigned char* buf, std::size_t cap, std::uint32_t id, const std::uint64_t* ips,
                                std::uint16_t depth) {
  return detail::frame(buf, cap, RecordType::stack,
                       [&](detail::Writer& w) { w.put(id), w.put(depth), w.bytes(ips, 8u * depth); });
}
// alloc: u64 ts | u32 tid | i16 device | u8 kind | u8 flags | u64 ptr | u64 requested
//        | u64 size | u64 stream | u32 stack        (52-byte payload)
inline std::size_t encode(unsigned char* buf, std::size_t cap, const AllocRecord& r) {
  return detail::frame(buf, cap, RecordType::alloc, [&](detail::Writer& w) {
    w.put(r.ts), w.put(r.tid), w.put(r.device), w.put(static_cast<std::uint8_t>(r.kind)), w.put(r.flags);
    w.put(r.ptr), w.put(r.requested), w.put(r.size), w.put(r.stream), w.put(r.stack);
  });
}
// free: u64 ts | u32 tid | i16 device | u8 kind | u8 flags | u64 ptr | u64 size
//       | u64 stream | u32 stack                      (44-byte payload)
inline std::size_t encode(unsigned char* buf, std::size_t cap, const FreeRecord& r) {
  return detail::frame(buf, cap, RecordType::free, [&](detail::Writer& w) {
    w.put(r.ts), w.put(r.tid), w.put(r.device), w.put(static_cast<std::uint8_t>(r.kind)), w.put(r.flags);
    w.put(r.ptr), w.put(r.size), w.put(r.stream), w.put(r.stack);
  });
}
// free_completed: u64 ts | i16 device | u64 ptr | u64 size
inline std::size_t encode(unsigned char* buf, std::size_t cap, const FreeCompletedRecord& r) {
  return detail::frame(buf, cap, RecordType::free_completed,
                       [&](detail::Writer& w) { w.put(r.ts), w.put(r.device), w.put(r.ptr), w.put(r.size); });
}
// segment_alloc / segment_free: u64 ts | i16 device | u8 flags | u64 ptr | u64 size
inline std::size_t encode(unsigned char* buf, std::size_t cap, const SegmentRecord& r, bool is_free) {
  return detail::frame(buf, cap, is_free ? RecordType::segment_free : RecordType::segment_alloc,
                       [&](detail::Writer& w) {
                         w.put(r.ts), w.put(r.device), w.put(r.flags), w.put(r.ptr), w.put(r.size);
                       });
}
// oom: u64 ts | u32 tid | i16 device | u8 kind | u64 requested | u64 stream | u64 device_free
//      | u64 device_total | u64 limit | u64 reserved | u64 allocated | u64 largest_free | u32 stack
inline std::size_t encode(unsigned char* buf, std::size_t cap, const OomRecord& r) {
  return detail::frame(buf, cap, RecordType::oom, [&](detail::Writer& w) {
    w.put(r.ts), w.put(r.tid), w.put(r.device), w.put(static_cast<std::uint8_t>(r.kind));
    w.put(r.requested), w.put(r.stream), w.put(r.device_free), w.put(r.device_total), w.put(r.limit);
    w.put(r.reserved), w.put(r.allocated), w.put(r.largest_free), w.put(r.stack);
  });
}
// retry: u64 ts | i16 device | u64 requested
inline std::size_t encode(unsigned char* buf, std::size_t cap, const RetryRecord& r) {
  return detail::frame(buf, cap, RecordType::retry,
                       [&](detail::Writer& w) { w.put(r.ts), w.put(r.device), w.put(r.requested); });
}
// empty_cache: u64 ts | i16 device | u8 reason | u64 released
inline std::size_t encode(unsigned char* buf, std::size_t cap, const EmptyCacheRecord& r) {
  return detail::frame(buf, cap, RecordType::empty_cache, [&](detail::Writer& w) {
    w.put(r.ts), w.put(r.device), w.put(static_cast<std::uint8_t>(r.reason)), w.put(r.released);
  });
}
// thread: u32 tid | str name
inline std::size_t encode(unsigned char* buf, std::size_t cap, const ThreadRecord& r) {
  return detail::frame(buf, cap, RecordType::thread, [&](detail::Writer& w) { w.put(r.tid), w.str(r.name); });
}
// end: u64 ts | u8 reason | u64 records
inline std::size_t encode(unsigned char* buf, std::size_t cap, const EndRecord& r) {
  return detail::frame(buf, cap, RecordType::end, [&](detail::Writer& w) {
    w.put(r.ts), w.put(static_cast<std::uint8_t>(r.reason)), w.put(r.records);
  });
}

// py_code: u32 id | u8 py_major | u8 py_minor | i32 firstlineno | str filename | str name
//          | str linetable (raw co_linetable bytes)
inline std::size_t encode(unsigned char* buf, std::size_t cap, const PyCodeRecord& r) {
  return detail::frame(buf, cap, RecordType::py_code, [&](detail::Writer& w) {
    w.put(r.id), w.put(r.py_major), w.put(r.py_minor), w.put(r.firstlineno);
    w.str(r.filename), w.str(r.name), w.str(r.linetable);
  });
}

// phase: u64 ts | u32 tid | u8 op (PhaseOp) | u8 source (PhaseSource) | str name
inline std::size_t encode(unsigned char* buf, std::size_t cap, const PhaseRecord& r) {
  return detail::frame(buf, cap, RecordType::phase, [&](detail::Writer& w) {
    w.put(r.ts), w.put(r.tid), w.put(static_cast<std::uint8_t>(r.op)), w.put(static_cast<std::uint8_t>(r.source));
    w.str(r.name);
  });
}

// symbol_string: u32 id | str text
inline std::size_t encode(unsigned char* buf, std::size_t cap, const SymbolStringRecord& r) {
  return detail::frame(buf, cap, RecordType::symbol_string, [&](detail::Writer& w) { w.put(r.id), w.str(r.text); });
}
// symbol_frames: u64 ip | u16 count | count x (u32 function | u32 file | u32 line | u8 flags)
//                (innermost first: inlined frames, then the concrete function last)
inline std::size_t encode_symbol_frames(unsigned char* buf, std::size_t cap, std::uint64_t ip,
                                        const SymbolFrameEntry* entries, std::uint16_t count) {
  return detail::frame(buf, cap, RecordType::symbol_frames, [&](detail::Writer& w) {
    w.put(ip), w.put(count);
    for (std::uint16_t i = 0; i < count; ++i)
      w.put(entries[i].function), w.put(entries[i].file), w.put(entries[i].line), w.put(entries[i].flags);
  });
}
inline constexpr std::size_t symbol_frames_record_size(std::uint16_t count) {
  return kFrameHeaderSize + 8 + 2 + kSymbolFrameEntrySize * count;
}

// snapshot: u8 part | begin: u64 ts | u32 segment | u64 events_before | u64 first_ts
//                   | device: i16 device | u64 peak_requested | u64 peak_allocated | u64 peak_ts
//                             | u64 peak_seq | u64 ooms | u64 retries | u64 empty_cache_calls
//                             | u64 empty_cache_released
//                   | live, peak_freed, site: u32 count | count entries (their sizes above)
//                   | end: u64 n_live | u64 n_freed | u64 n_sites
// For live, peak_freed and site, `entries` holds the count entries already encoded.
inline std::size_t encode(unsigned char* buf, std::size_t cap, const SnapshotRecord& r) {
  return detail::frame(buf, cap, RecordType::snapshot, [&](detail::Writer& w) {
    w.put(static_cast<std::uint8_t>(r.part));
    switch (r.part) {
      case SnapshotPart::begin: w.put(r.ts), w.put(r.segment), w.put(r.events_before), w.put(r.first_ts); break;
      case SnapshotPart::device:
        w.put(r.device), w.put(r.peak_requested), w.put(r.peak_allocated), w.put(r.peak_ts), w.put(r.peak_seq);
        w.put(r.ooms), w.put(r.retries), w.put(r.empty_cache_calls), w.put(r.empty_cache_released);
        break;
      case SnapshotPart::live: w.put(r.count), w.bytes(r.entries, kSnapLiveSize * r.count); break;
      case SnapshotPart::peak_freed: w.put(r.count), w.bytes(r.entries, kSnapFreedSize * r.count); break;
      case SnapshotPart::site: w.put(r.count), w.bytes(r.entries, kSnapSiteSize * r.count); break;
      case SnapshotPart::end: w.put(r.n_live), w.put(r.n_freed), w.put(r.n_sites); break;
    }
  });
}
// The entry encoders (into q, which has room for one entry).
inline void encode_snap_live(unsigned char* q, const SnapLive& e) {
  std::memcpy(q, &e.seq, 8), std::memcpy(q + 8, &e.ts, 8), std::memcpy(q + 16, &e.ptr, 8);
  std::memcpy(q + 24, &e.size, 8), std::memcpy(q + 32, &e.requested, 8), std::memcpy(q + 40, &e.stream, 8);
  std::memcpy(q + 48, &e.tid, 4), std::memcpy(q + 52, &e.stack, 4), std::memcpy(q + 56, &e.device, 2);
  q[58] = static_cast<unsigned char>(e.kind), q[59] = e.flags;
}
inline void encode_snap_freed(unsigned char* q, const SnapFreed& e) {
  std::memcpy(q, &e.stack, 4), std::memcpy(q + 4, &e.device, 2), std::memcpy(q + 6, &e.requested, 8);
  std::memcpy(q + 14, &e.size, 8);
}
inline void encode_snap_site(unsigned char* q, const SnapSite& e) {
  std::memcpy(q, &e.stack, 4), std::memcpy(q + 4, &e.allocs, 8), std::memcpy(q + 12, &e.alloc_bytes, 8);
  std::memcpy(q + 20, &e.alloc_allocated, 8), std::memcpy(q + 28, &e.max_live_bytes, 8);
}

// Upper bound of an encoded stack record, for buffer reservation.
inline constexpr std::size_t stack_record_size(std::uint16_t depth) { return kFrameHeaderSize + 4 + 2 + 8u * depth; }
inline constexpr std::size_t kMaxEventRecordSize = 128;  // alloc/free/oom/etc. all fit

}  // namespace format
}  // namespace gpuheap

// The decoder and the rules both halves apply to what the records say. Included here so
// that every user of the contract gets all of it from this one header.
#include "format/compact.h"
#include "format/decode.h"
#include "format/rules.h"
