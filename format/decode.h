// gpuheap trace format, reading side: decode_frame (every record type, bounds-checked) and
// decode_event (the fixed-layout event records at constant offsets, the analyzer's hot path).
// Split from format/trace.h, which includes it; like it, header-only, no exceptions, no
// allocation (strings and stack ips in a decoded record point into the frame).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "format/trace.h"

namespace gpuheap {
namespace format {

// One decoded record. Only the member matching `type` is meaningful.
struct Record {
  RecordType type{};
  ProcessRecord process;
  IdentityRecord identity;
  DeviceRecord device;
  ModuleRecord module;
  ModuleUnloadRecord module_unload;
  StackRecord stack;
  AllocRecord alloc;
  FreeRecord free;
  FreeCompletedRecord free_completed;
  SegmentRecord segment;  // segment_alloc and segment_free
  OomRecord oom;
  RetryRecord retry;
  EmptyCacheRecord empty_cache;
  ThreadRecord thread;
  EndRecord end;
  PyCodeRecord py_code;
  PhaseRecord phase;
  SymbolStringRecord symbol_string;
  SymbolFramesRecord symbol_frames;
  SnapshotRecord snapshot;
};

enum class FrameStatus {
  ok,         // one record decoded, `consumed` bytes
  need_more,  // incomplete frame at the end of the data (a truncated file ends here), or a
              // zero type byte: the end of the written data in a file whose preallocated tail
              // was never used (a killed process's trace, or one still being written)
  corrupt,    // unknown type, absurd length, or payload that does not match its type
};

inline bool valid_kind(std::uint8_t k) { return k < kNumAllocKinds; }

namespace detail {

template <class Reader>
inline std::uint32_t get_tid(Reader& r, const CompactState& s) {
  const auto v = static_cast<std::int64_t>(s.tid) + static_cast<std::int64_t>(r.zz());
  if (v < 0 || v > 0xFFFFFFFFll) r.ok = false;
  return static_cast<std::uint32_t>(v);
}

template <class Reader>
inline bool get_kind(Reader& r, AllocKind* k) {
  const std::uint8_t v = r.u8();
  *k = static_cast<AllocKind>(v);
  return v < kNumAllocKinds;
}

// Decodes one compact payload (whole: the caller checked its length) into out (a Record or an
// EventRecord: the members alloc, free, free_completed and segment), its type the record's
// plain type, and advances the state. False: the frame is corrupt, and the state with it (a
// reader stops there). Reader: VarReader, or VarReaderUnchecked where kCompactMaxRead bytes
// can be read from the payload's start.
template <class Out, class Reader>
inline bool decode_compact_body(std::uint8_t t, Reader& r, CompactState& s, Out& out) {
  const auto plain = static_cast<RecordType>(t & static_cast<std::uint8_t>(~kCompactBit));
  const std::uint64_t ts = s.ts + r.zz();
  s.ts = ts;
  bool kind_ok = true;
  switch (plain) {
    case RecordType::alloc: {
      auto& x = out.alloc;
      x.ts = ts, x.tid = s.tid = get_tid(r, s), x.device = r.i16(), kind_ok = get_kind(r, &x.kind), x.flags = r.u8();
      x.ptr = s.ptr += r.zz();
      x.requested = r.var(), x.size = x.requested + r.zz(), x.stream = r.var(), x.stack = r.u32();
      s.push_alloc(x);
      break;
    }
    case RecordType::free: {
      auto& x = out.free;
      x.ts = ts, x.tid = s.tid = get_tid(r, s), x.flags = r.u8();
      const std::uint8_t ref = r.u8();
      if (ref == kCompactLiteral) {
        x.device = r.i16(), kind_ok = get_kind(r, &x.kind), x.ptr = s.ptr += r.zz(), x.size = r.var(),
        x.stream = r.var();
      } else if (ref < s.n_allocs) {
        const CompactState::Allocated a = s.alloc_at(ref);
        s.drop_alloc(ref);
        const std::uint8_t other = r.u8();
        if (other & ~(kFreeOtherDevice | kFreeOtherKind | kFreeOtherSize | kFreeOtherStream)) return false;
        x.ptr = a.ptr;
        x.device = other & kFreeOtherDevice ? r.i16() : a.device;
        if (other & kFreeOtherKind) kind_ok = get_kind(r, &x.kind);
        else x.kind = a.kind;
        x.size = other & kFreeOtherSize ? r.var() : a.size;
        x.stream = other & kFreeOtherStream ? r.var() : a.stream;
      } else {
        return false;
      }
      x.stack = r.u32();
      s.push_free(x.ptr, x.size, x.device);
      break;
    }
    case RecordType::free_completed: {
      auto& x = out.free_completed;
      x.ts = ts;
      // EventRecord::kind() reads a free_completed's kind at the alloc's kind byte: pooled.
      reinterpret_cast<unsigned char*>(&out.alloc)[offsetof(AllocRecord, kind)] = 0;
      const std::uint8_t ref = r.u8();
      if (ref == kCompactLiteral) {
        x.device = r.i16(), x.ptr = s.ptr += r.zz(), x.size = r.var();
      } else if (ref < s.n_frees) {
        const CompactState::Freed& f = s.free_at(ref);
        x.device = f.device, x.ptr = f.ptr, x.size = f.size, s.drop_free(ref);
      } else {
        return false;
      }
      break;
    }
    default: {  // segment_alloc, segment_free (is_compact_type)
      auto& x = out.segment;
      x.ts = ts, x.device = r.i16(), x.flags = r.u8(), x.ptr = s.ptr += r.zz(), x.size = r.var();
      break;
    }
  }
  if (!r.ok || !kind_ok || r.p != r.end) return false;
  out.type = plain;
  return true;
}

}  // namespace detail

namespace detail {
// A snapshot payload (format/trace.h, SnapshotPart); false: corrupt.
inline bool decode_snapshot(Reader& r, SnapshotRecord& x) {
  const auto part = r.get<std::uint8_t>();
  if (part > kMaxSnapshotPart) return false;
  x.part = static_cast<SnapshotPart>(part);
  std::size_t entry = 0;
  switch (x.part) {
    case SnapshotPart::begin:
      x.ts = r.get<std::uint64_t>(), x.segment = r.get<std::uint32_t>();
      x.events_before = r.get<std::uint64_t>(), x.first_ts = r.get<std::uint64_t>();
      return true;
    case SnapshotPart::device:
      x.device = r.get<std::int16_t>(), x.peak_requested = r.get<std::uint64_t>();
      x.peak_allocated = r.get<std::uint64_t>(), x.peak_ts = r.get<std::uint64_t>();
      x.peak_seq = r.get<std::uint64_t>();
      x.ooms = r.get<std::uint64_t>(), x.retries = r.get<std::uint64_t>();
      x.empty_cache_calls = r.get<std::uint64_t>(), x.empty_cache_released = r.get<std::uint64_t>();
      return true;
    case SnapshotPart::end:
      x.n_live = r.get<std::uint64_t>(), x.n_freed = r.get<std::uint64_t>(), x.n_sites = r.get<std::uint64_t>();
      return true;
    case SnapshotPart::live: entry = kSnapLiveSize; break;
    case SnapshotPart::peak_freed: entry = kSnapFreedSize; break;
    case SnapshotPart::site: entry = kSnapSiteSize; break;
  }
  x.count = r.get<std::uint32_t>();
  if (!r.ok || x.count > kSnapMaxEntries) return false;
  x.entries = r.raw(entry * x.count);
  if (x.part == SnapshotPart::live && x.entries)
    for (std::uint32_t i = 0; i < x.count; ++i)
      if (!valid_kind(x.entries[kSnapLiveSize * i + 58])) return false;
  return true;
}
}  // namespace detail

// A compact frame (version 5, format/compact.h) at p[0..n), p[0] having kCompactBit set.
inline FrameStatus decode_compact_frame(const unsigned char* p, std::size_t n, Record& out, std::size_t* consumed,
                                        CompactState* cs) {
  if (!cs || !cs->enabled || !is_compact_type(p[0])) return FrameStatus::corrupt;
  if (n < kCompactHeaderSize || n - kCompactHeaderSize < p[1]) return FrameStatus::need_more;
  detail::VarReader r{p + kCompactHeaderSize, p + kCompactHeaderSize + p[1]};
  if (!detail::decode_compact_body(p[0], r, *cs, out)) return FrameStatus::corrupt;
  *consumed = kCompactHeaderSize + p[1];
  return FrameStatus::ok;
}

// Decodes the frame at p[0..n). Strings/ips in `out` point into p. `cs`: the state of the
// compact records before this one (version 5); without it, or with cs->enabled off (a file
// of an older version), a compact frame is corrupt. One switch with a case per record type,
// longer than the function-size limit by nature.
// NOLINTNEXTLINE(readability-function-size)
inline FrameStatus decode_frame(const unsigned char* p, std::size_t n, Record& out, std::size_t* consumed,
                                CompactState* cs = nullptr) {
  if (n >= 1 && (p[0] & kCompactBit)) return decode_compact_frame(p, n, out, consumed, cs);
  if (n < kFrameHeaderSize) return FrameStatus::need_more;
  std::uint8_t type = p[0];
  std::uint32_t len;
  std::memcpy(&len, p + 1, 4);
  // Type 0 is never written: the preload fills preallocated, zeroed file space and stores a
  // frame's type byte last, so a zero type byte is where the written data ends.
  if (type == 0) return FrameStatus::need_more;
  if (type < 1 || type > kMaxRecordType || len > kMaxPayload) return FrameStatus::corrupt;
  if (n - kFrameHeaderSize < len) return FrameStatus::need_more;
  detail::Reader r{p + kFrameHeaderSize, p + kFrameHeaderSize + len};
  out.type = static_cast<RecordType>(type);
  std::uint8_t kind = 0;
  switch (out.type) {
    case RecordType::process: {
      auto& x = out.process;
      x.pid = r.get<std::uint32_t>(), x.ppid = r.get<std::uint32_t>();
      x.wall_ns = r.get<std::uint64_t>(), x.mono_ns = r.get<std::uint64_t>();
      x.hostname = r.str(), x.cmdline = r.str(), x.version = r.str(), x.exe = r.str();
      break;
    }
    case RecordType::identity: {
      auto& x = out.identity;
      x.rank = r.get<std::int32_t>(), x.local_rank = r.get<std::int32_t>(), x.world_size = r.get<std::int32_t>();
      const auto src = r.get<std::uint8_t>();
      if (src < 1 || src > kMaxRankSource || x.rank < 0 || x.local_rank < -1 || x.world_size < -1)
        return FrameStatus::corrupt;
      x.source = static_cast<RankSource>(src);
      break;
    }
    case RecordType::device: {
      auto& x = out.device;
      x.device = r.get<std::int32_t>(), x.total_memory = r.get<std::uint64_t>(), x.name = r.str();
      break;
    }
    case RecordType::module: {
      auto& x = out.module;
      x.base = r.get<std::uint64_t>(), x.lo = r.get<std::uint64_t>(), x.hi = r.get<std::uint64_t>();
      x.path = r.str(), x.build_id = r.str();
      break;
    }
    case RecordType::module_unload:
      out.module_unload.ts = r.get<std::uint64_t>(), out.module_unload.base = r.get<std::uint64_t>();
      break;
    case RecordType::stack: {
      auto& x = out.stack;
      x.id = r.get<std::uint32_t>(), x.depth = r.get<std::uint16_t>();
      if (x.depth > kMaxStackDepth) return FrameStatus::corrupt;
      x.ips = r.raw(8u * x.depth);
      break;
    }
    case RecordType::alloc: {
      auto& x = out.alloc;
      x.ts = r.get<std::uint64_t>(), x.tid = r.get<std::uint32_t>(), x.device = r.get<std::int16_t>();
      kind = r.get<std::uint8_t>(), x.flags = r.get<std::uint8_t>();
      x.ptr = r.get<std::uint64_t>(), x.requested = r.get<std::uint64_t>(), x.size = r.get<std::uint64_t>();
      x.stream = r.get<std::uint64_t>(), x.stack = r.get<std::uint32_t>();
      if (!valid_kind(kind)) return FrameStatus::corrupt;
      x.kind = static_cast<AllocKind>(kind);
      break;
    }
    case RecordType::free: {
      auto& x = out.free;
      x.ts = r.get<std::uint64_t>(), x.tid = r.get<std::uint32_t>(), x.device = r.get<std::int16_t>();
      kind = r.get<std::uint8_t>(), x.flags = r.get<std::uint8_t>();
      x.ptr = r.get<std::uint64_t>(), x.size = r.get<std::uint64_t>(), x.stream = r.get<std::uint64_t>();
      x.stack = r.get<std::uint32_t>();
      if (!valid_kind(kind)) return FrameStatus::corrupt;
      x.kind = static_cast<AllocKind>(kind);
      break;
    }
    case RecordType::free_completed: {
      auto& x = out.free_completed;
      x.ts = r.get<std::uint64_t>(), x.device = r.get<std::int16_t>();
      x.ptr = r.get<std::uint64_t>(), x.size = r.get<std::uint64_t>();
      break;
    }
    case RecordType::segment_alloc:
    case RecordType::segment_free: {
      auto& x = out.segment;
      x.ts = r.get<std::uint64_t>(), x.device = r.get<std::int16_t>(), x.flags = r.get<std::uint8_t>();
      x.ptr = r.get<std::uint64_t>(), x.size = r.get<std::uint64_t>();
      break;
    }
    case RecordType::oom: {
      auto& x = out.oom;
      x.ts = r.get<std::uint64_t>(), x.tid = r.get<std::uint32_t>(), x.device = r.get<std::int16_t>();
      kind = r.get<std::uint8_t>();
      x.requested = r.get<std::uint64_t>(), x.stream = r.get<std::uint64_t>();
      x.device_free = r.get<std::uint64_t>(), x.device_total = r.get<std::uint64_t>();
      x.limit = r.get<std::uint64_t>(), x.reserved = r.get<std::uint64_t>();
      x.allocated = r.get<std::uint64_t>(), x.largest_free = r.get<std::uint64_t>();
      x.stack = r.get<std::uint32_t>();
      if (!valid_kind(kind)) return FrameStatus::corrupt;
      x.kind = static_cast<AllocKind>(kind);
      break;
    }
    case RecordType::retry:
      out.retry.ts = r.get<std::uint64_t>(), out.retry.device = r.get<std::int16_t>();
      out.retry.requested = r.get<std::uint64_t>();
      break;
    case RecordType::empty_cache: {
      auto& x = out.empty_cache;
      x.ts = r.get<std::uint64_t>(), x.device = r.get<std::int16_t>();
      auto reason = r.get<std::uint8_t>();
      if (reason > static_cast<std::uint8_t>(EmptyCacheReason::exit)) return FrameStatus::corrupt;
      x.reason = static_cast<EmptyCacheReason>(reason), x.released = r.get<std::uint64_t>();
      break;
    }
    case RecordType::thread: out.thread.tid = r.get<std::uint32_t>(), out.thread.name = r.str(); break;
    case RecordType::end: {
      out.end.ts = r.get<std::uint64_t>();
      auto reason = r.get<std::uint8_t>();
      if (reason > static_cast<std::uint8_t>(EndReason::stopped)) return FrameStatus::corrupt;
      out.end.reason = static_cast<EndReason>(reason), out.end.records = r.get<std::uint64_t>();
      break;
    }
    case RecordType::py_code: {
      auto& x = out.py_code;
      x.id = r.get<std::uint32_t>(), x.py_major = r.get<std::uint8_t>(), x.py_minor = r.get<std::uint8_t>();
      x.firstlineno = r.get<std::int32_t>();
      x.filename = r.str(), x.name = r.str(), x.linetable = r.str();
      if (x.id == 0 || x.id > kMaxPyCodeId) return FrameStatus::corrupt;
      break;
    }
    case RecordType::phase: {
      auto& x = out.phase;
      x.ts = r.get<std::uint64_t>(), x.tid = r.get<std::uint32_t>();
      auto op = r.get<std::uint8_t>(), source = r.get<std::uint8_t>();
      x.name = r.str();
      if (op > static_cast<std::uint8_t>(PhaseOp::pop) || source > static_cast<std::uint8_t>(PhaseSource::nvtx) ||
          x.name.size() > kMaxPhaseName)
        return FrameStatus::corrupt;
      x.op = static_cast<PhaseOp>(op), x.source = static_cast<PhaseSource>(source);
      break;
    }
    case RecordType::symbol_string:
      out.symbol_string.id = r.get<std::uint32_t>(), out.symbol_string.text = r.str();
      if (out.symbol_string.id == 0 || out.symbol_string.text.size() > kMaxSymbolString) return FrameStatus::corrupt;
      break;
    case RecordType::symbol_frames: {
      auto& x = out.symbol_frames;
      x.ip = r.get<std::uint64_t>(), x.count = r.get<std::uint16_t>();
      if (x.count == 0 || x.count > kMaxSymbolFrames) return FrameStatus::corrupt;
      x.entries = r.raw(kSymbolFrameEntrySize * x.count);
      break;
    }
    case RecordType::snapshot:
      if (!detail::decode_snapshot(r, out.snapshot)) return FrameStatus::corrupt;
      break;
    case RecordType::event_block: return FrameStatus::corrupt;  // above kMaxRecordType: format/block.h
  }
  // The payload must be consumed exactly: a length that disagrees with the type's layout
  // is corruption (this is what catches most bit flips in length fields).
  if (!r.ok || r.p != r.end) return FrameStatus::corrupt;
  *consumed = kFrameHeaderSize + len;
  return FrameStatus::ok;
}

// ---- fast decoding of the event records ----
// alloc, free, free_completed and segment_* make up nearly every record of a trace. Their
// payloads have fixed layouts, so they are decoded straight from the frame at constant
// offsets into a small EventRecord (no bounds-checked Reader, no 600-byte Record). The
// outcome is exactly decode_frame's: a payload of another length, or a bad kind, is corrupt.

inline constexpr std::uint32_t kAllocPayload = 52, kFreePayload = 44, kFreeCompletedPayload = 26, kSegmentPayload = 27;

struct EventRecord {
  RecordType type{};  // alloc, free, free_completed, segment_alloc or segment_free
  union {
    AllocRecord alloc;
    FreeRecord free;
    FreeCompletedRecord free_completed;
    SegmentRecord segment;
  };
  EventRecord() : alloc() {}
  // The block address and kind of an alloc, free or free_completed, read the same way for
  // the three (no branch on the type: Model::prefetch). ptr is at one offset in the three
  // structs; the kind byte of a free_completed (padding in its struct) is device_pooled,
  // as decode_event and decode_batch_event store it.
  static constexpr std::size_t kKindByte = 14;
  std::uint64_t ptr() const {
    std::uint64_t v;
    std::memcpy(&v, reinterpret_cast<const unsigned char*>(&alloc) + 16, 8);
    return v;
  }
  AllocKind kind() const { return static_cast<AllocKind>(reinterpret_cast<const unsigned char*>(&alloc)[kKindByte]); }
  // An alloc's stack id, read from the bytes; for a free or free_completed, whatever bytes
  // are there (padding, or what decode_batch_event copied from beyond its payload): callers
  // mask it.
  std::uint32_t alloc_stack() const {
    std::uint32_t v;
    std::memcpy(&v, reinterpret_cast<const unsigned char*>(&alloc) + offsetof(AllocRecord, stack), 4);
    return v;
  }
};
static_assert(offsetof(AllocRecord, ptr) == 16 && offsetof(FreeRecord, ptr) == 16 &&
                  offsetof(FreeCompletedRecord, ptr) == 16 && offsetof(AllocRecord, kind) == EventRecord::kKindByte &&
                  offsetof(FreeRecord, kind) == EventRecord::kKindByte &&
                  offsetof(FreeCompletedRecord, device) + 2 <= 14 && offsetof(FreeCompletedRecord, ptr) > 14 &&
                  static_cast<int>(AllocKind::device_pooled) == 0,
              "EventRecord::ptr() and kind() read the three event structs at one offset");

inline bool is_event_type(std::uint8_t t) {
  return t >= static_cast<std::uint8_t>(RecordType::alloc) && t <= static_cast<std::uint8_t>(RecordType::segment_free);
}

namespace detail {
template <class T>
inline T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
// An alloc / free payload is, byte for byte, the in-memory AllocRecord / FreeRecord
// (little-endian, asserted in trace.h; fields at the wire's offsets, kind a byte), so
// decode_event copies it whole (a few vector moves) instead of field by field, which saves
// instructions on every record of the replay's hot path. A layout change must fail here, not
// decode garbage.
static_assert(sizeof(AllocKind) == 1 && offsetof(AllocRecord, tid) == 8 && offsetof(AllocRecord, device) == 12 &&
                  offsetof(AllocRecord, kind) == 14 && offsetof(AllocRecord, flags) == 15 &&
                  offsetof(AllocRecord, ptr) == 16 && offsetof(AllocRecord, requested) == 24 &&
                  offsetof(AllocRecord, size) == 32 && offsetof(AllocRecord, stream) == 40 &&
                  offsetof(AllocRecord, stack) == 48 && sizeof(AllocRecord) >= kAllocPayload,
              "AllocRecord is not the alloc payload's layout");
static_assert(offsetof(FreeRecord, tid) == 8 && offsetof(FreeRecord, device) == 12 &&
                  offsetof(FreeRecord, kind) == 14 && offsetof(FreeRecord, flags) == 15 &&
                  offsetof(FreeRecord, ptr) == 16 && offsetof(FreeRecord, size) == 24 &&
                  offsetof(FreeRecord, stream) == 32 && offsetof(FreeRecord, stack) == 40 &&
                  sizeof(FreeRecord) >= kFreePayload,
              "FreeRecord is not the free payload's layout");
static_assert(std::is_trivially_copyable_v<AllocRecord> && std::is_trivially_copyable_v<FreeRecord>);
}  // namespace detail

// Decodes the payload q[0..len) of an event record of type t (is_event_type(t)). Returns
// false where decode_frame would say corrupt.
inline bool decode_event(std::uint8_t t, const unsigned char* q, std::uint32_t len, EventRecord& out) {
  using detail::load;
  switch (static_cast<RecordType>(t)) {
    case RecordType::alloc: {
      if (len != kAllocPayload || !valid_kind(q[14])) return false;
      auto& x = out.alloc;
      std::memcpy(static_cast<void*>(&x), q, kAllocPayload);  // the payload is the struct (above)
      break;
    }
    case RecordType::free: {
      if (len != kFreePayload || !valid_kind(q[14])) return false;
      auto& x = out.free;
      std::memcpy(static_cast<void*>(&x), q, kFreePayload);
      break;
    }
    case RecordType::free_completed: {
      if (len != kFreeCompletedPayload) return false;
      auto& x = out.free_completed;
      x.ts = load<std::uint64_t>(q), x.device = load<std::int16_t>(q + 8);
      x.ptr = load<std::uint64_t>(q + 10), x.size = load<std::uint64_t>(q + 18);
      // EventRecord::kind() reads a free_completed's kind at the alloc's kind byte: pooled.
      reinterpret_cast<unsigned char*>(&out.alloc)[offsetof(AllocRecord, kind)] = 0;
      break;
    }
    case RecordType::segment_alloc:
    case RecordType::segment_free: {
      if (len != kSegmentPayload) return false;
      auto& x = out.segment;
      x.ts = load<std::uint64_t>(q), x.device = load<std::int16_t>(q + 8), x.flags = q[10];
      x.ptr = load<std::uint64_t>(q + 11), x.size = load<std::uint64_t>(q + 19);
      break;
    }
    default: return false;
  }
  out.type = static_cast<RecordType>(t);
  return true;
}

// decode_event for the replay's batches: alloc, free and free_completed only, without a
// branch on which of the three it is. Those three come in an order no predictor learns (an
// alloc or a free after each other at random), and the switch on the type in decode_event
// mispredicted about a third of these records. The payload is copied whole whatever its
// type (the alloc layout, kBatchRead bytes), a free_completed's ptr and size from where its
// payload has them (6 bytes earlier: an address computed, not a branch), and its kind byte
// (EventRecord::kind) set to device_pooled.
// Requires kBatchRead readable bytes at q (the frame's payload and what follows it).
// Returns false, with `out` unspecified, wherever decode_event would (a payload of another
// length, a bad kind) and for every other type; else `out` is what decode_event gives for
// every field (padding aside).
inline constexpr std::size_t kBatchRead = 56;
namespace detail {
// Payload length by type byte for decode_batch_event's three types; for every other type a
// value no 32-bit length field equals (a u32 sentinel would match a hostile length field of
// 0xFFFFFFFF, and the reader would step that far: the fuzzers found it).
struct BatchPayloads {
  std::uint64_t len[256];
  constexpr BatchPayloads() : len() {
    for (auto& x : len) x = std::uint64_t{1} << 32;
    len[static_cast<std::uint8_t>(RecordType::alloc)] = kAllocPayload;
    len[static_cast<std::uint8_t>(RecordType::free)] = kFreePayload;
    len[static_cast<std::uint8_t>(RecordType::free_completed)] = kFreeCompletedPayload;
  }
  constexpr std::uint64_t operator[](std::uint8_t t) const { return len[t]; }
};
inline constexpr BatchPayloads kBatchPayload{};
}  // namespace detail
inline bool decode_batch_event(std::uint8_t t, const unsigned char* q, std::uint32_t len, EventRecord& out) {
  static_assert(sizeof(AllocRecord) <= kBatchRead && kAllocPayload <= kBatchRead &&
                    offsetof(FreeCompletedRecord, ts) == 0 && offsetof(FreeCompletedRecord, device) == 8 &&
                    offsetof(FreeCompletedRecord, ptr) == 16 && offsetof(FreeCompletedRecord, size) == 24,
                "decode_batch_event's layout assumptions");
  const bool fc = t == static_cast<std::uint8_t>(RecordType::free_completed);
  // Bitwise, not short-circuit: one branch (the caller's, on the result), taken only on damage.
  const bool ok = static_cast<int>(std::uint64_t{len} == detail::kBatchPayload[t]) &
                  static_cast<int>(fc | valid_kind(q[14]));
  auto* dst = reinterpret_cast<unsigned char*>(&out.alloc);
  std::memcpy(dst, q, sizeof(AllocRecord));  // alloc and free: the payload is the struct (above)
  // free_completed: ts (0) and device (8) are where its struct has them; ptr and size are
  // at 10 and 18 in its payload, at 16 and 24 in its struct (alloc: ptr and requested).
  std::memcpy(dst + 16, q + 16 - 6 * static_cast<unsigned>(fc), 16);
  dst[EventRecord::kKindByte] &= static_cast<unsigned char>(fc - 1);  // fc: device_pooled (0)
  out.type = static_cast<RecordType>(t);
  return ok;
}

}  // namespace format
}  // namespace gpuheap
