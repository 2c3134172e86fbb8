// gpuheap trace format, version 5: the compact event records (docs/trace-format.md,
// "Compact event records"). alloc, free, free_completed and segment_* are nearly every record
// of a trace; in version 5 the preload writes them as compact frames (a 2-byte header, then
// varints relative to the previous record of the file) instead of the fixed-layout records,
// and a reader turns them back into exactly those records. Encoding and decoding carry a
// CompactState, the same on both sides because both see the records in file order: the
// writer encodes under the sink's lock, the reader decodes in order.
//
// Header-only, no exceptions, no allocation (the state is a fixed-size struct).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "format/trace.h"

namespace gpuheap {
namespace format {

// A frame whose type byte has bit 7 set is compact: u8 type | u8 payload_len | payload. The
// low bits name the record it stands for (alloc, free, free_completed, segment_*).
inline constexpr std::uint8_t kCompactBit = 0x80;
inline constexpr std::size_t kCompactHeaderSize = 2;
inline constexpr std::size_t kCompactMaxPayload = 255;
// A free names its block by its place among the last kCompactAllocs allocations (most recent
// first) where it is there; a free_completed names its free among the last kCompactFrees.
inline constexpr std::size_t kCompactAllocs = 32;
inline constexpr std::size_t kCompactFrees = 16;
inline constexpr std::uint8_t kCompactLiteral = 0xFF;  // reference byte: not in the list, fields follow
// A free by reference: which of its allocation's fields it does not repeat (they follow).
inline constexpr std::uint8_t kFreeOtherDevice = 1, kFreeOtherKind = 2, kFreeOtherSize = 4, kFreeOtherStream = 8;

inline constexpr std::uint8_t compact_type(RecordType t) { return kCompactBit | static_cast<std::uint8_t>(t); }
inline constexpr bool is_compact_type(std::uint8_t t) {
  const std::uint8_t low = t & static_cast<std::uint8_t>(~kCompactBit);
  return (t & kCompactBit) != 0 && low >= static_cast<std::uint8_t>(RecordType::alloc) &&
         low <= static_cast<std::uint8_t>(RecordType::segment_free);
}

// What both sides remember of the records before: the previous event's time and address, the
// recent allocations' addresses and the recent frees. Starts zeroed with each file.
// The two lists are rings (most recent first from head): a push overwrites the oldest entry
// and a drop shifts the shorter side of the list by one, instead of moving the whole list as
// an array kept in order would (a kilobyte on every alloc: most of the decoding's cost).
struct CompactState {
  bool enabled = false;  // reader: the file's version allows compact records (5 and later)
  std::uint64_t ts = 0, ptr = 0;
  std::uint32_t tid = 0;
  std::uint8_t n_allocs = 0, n_frees = 0;
  // What a free of a recent allocation usually repeats: written only where it differs.
  struct Allocated {
    std::uint64_t ptr, size, stream;
    std::int16_t device;
    AllocKind kind;
  };
  struct Freed {
    std::uint64_t ptr, size;
    std::int16_t device;
  };
  static_assert((kCompactAllocs & (kCompactAllocs - 1)) == 0 && (kCompactFrees & (kCompactFrees - 1)) == 0,
                "the rings index with a mask");

  // The i-th most recent allocation (i < n_allocs) / free (i < n_frees).
  const Allocated& alloc_at(std::size_t i) const { return allocs_[(alloc_head_ + i) & (kCompactAllocs - 1)]; }
  const Freed& free_at(std::size_t i) const { return frees_[(free_head_ + i) & (kCompactFrees - 1)]; }

  void push_alloc(const AllocRecord& r) {
    alloc_head_ = (alloc_head_ - 1) & (kCompactAllocs - 1);
    allocs_[alloc_head_] = Allocated{r.ptr, r.size, r.stream, r.device, r.kind};
    if (n_allocs < kCompactAllocs) ++n_allocs;
  }
  void drop_alloc(std::size_t i) { drop(allocs_, kCompactAllocs, alloc_head_, n_allocs, i); }
  int find_alloc(std::uint64_t p) const {
    for (std::size_t i = 0; i < n_allocs; ++i)
      if (alloc_at(i).ptr == p) return static_cast<int>(i);
    return -1;
  }
  void push_free(std::uint64_t p, std::uint64_t size, std::int16_t device) {
    free_head_ = (free_head_ - 1) & (kCompactFrees - 1);
    frees_[free_head_] = Freed{p, size, device};
    if (n_frees < kCompactFrees) ++n_frees;
  }
  void drop_free(std::size_t i) { drop(frees_, kCompactFrees, free_head_, n_frees, i); }
  int find_free(std::uint64_t p, std::uint64_t size, std::int16_t device) const {
    for (std::size_t i = 0; i < n_frees; ++i) {
      const Freed& f = free_at(i);
      if (f.ptr == p && f.size == size && f.device == device) return static_cast<int>(i);
    }
    return -1;
  }

 private:
  // Removes entry i (< n) of the ring of cap entries starting at head: the entries before it
  // move one place back (and head with them), or those after it one place forward.
  template <class T>
  static void drop(T* ring, std::size_t cap, std::uint8_t& head, std::uint8_t& n, std::size_t i) {
    const std::size_t m = cap - 1;
    if (i < n - 1 - i) {
      for (std::size_t j = i; j > 0; --j) ring[(head + j) & m] = ring[(head + j - 1) & m];
      head = static_cast<std::uint8_t>((head + 1) & m);
    } else {
      for (std::size_t j = i; j + 1 < n; ++j) ring[(head + j) & m] = ring[(head + j + 1) & m];
    }
    --n;
  }
  Allocated allocs_[kCompactAllocs] = {};
  Freed frees_[kCompactFrees] = {};
  std::uint8_t alloc_head_ = 0, free_head_ = 0;
};

namespace detail {

inline std::uint64_t zigzag(std::uint64_t delta) {  // delta: a difference mod 2^64
  const auto s = static_cast<std::int64_t>(delta);
  return (static_cast<std::uint64_t>(s) << 1) ^ static_cast<std::uint64_t>(s >> 63);
}
inline std::uint64_t unzigzag(std::uint64_t z) { return (z >> 1) ^ (~(z & 1) + 1); }

struct VarWriter {
  unsigned char* p;
  void u8(std::uint8_t v) { *p++ = v; }
  void var(std::uint64_t v) {
    while (v >= 0x80) *p++ = static_cast<unsigned char>(v | 0x80), v >>= 7;
    *p++ = static_cast<unsigned char>(v);
  }
  void zz(std::uint64_t delta) { var(zigzag(delta)); }
};

// The cursor and the fields built on var(), shared by the checked and the unchecked reader.
template <class Reader>
struct VarFields {
  const unsigned char* p;
  const unsigned char* end;
  bool ok = true;
  std::uint64_t zz() { return unzigzag(self().var()); }
  std::uint32_t u32() {
    std::uint64_t v = self().var();
    if (v > 0xFFFFFFFFu) ok = false;
    return static_cast<std::uint32_t>(v);
  }
  std::int16_t i16() {
    auto v = static_cast<std::int64_t>(zz());
    if (v < INT16_MIN || v > INT16_MAX) ok = false;
    return static_cast<std::int16_t>(v);
  }

 private:
  Reader& self() { return static_cast<Reader&>(*this); }
};

struct VarReader : VarFields<VarReader> {
  std::uint8_t u8() {
    if (p == end) return ok = false, 0;
    return *p++;
  }
  // LEB128, at most 10 bytes; a 10th byte above 1 would not fit 64 bits: corrupt.
  std::uint64_t var() {
    std::uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p == end) return ok = false, 0;
      const std::uint8_t b = *p++;
      if (shift == 63 && b > 1) return ok = false, 0;
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    return ok = false, 0;
  }
};

// VarReader without a bound check on each byte, for a payload whose start has at least
// kCompactMaxRead readable bytes after it (the reader's window): a compact payload's fields
// read at most that many, whatever its bytes say. A read past `end` leaves p beyond it, which
// the decoder's final check (p == end) rejects, so it accepts and rejects exactly what
// VarReader does, with the same values where it accepts.
struct VarReaderUnchecked : VarFields<VarReaderUnchecked> {
  std::uint8_t u8() { return *p++; }
  std::uint64_t var() {
    std::uint8_t b = *p++;
    if (!(b & 0x80)) return b;  // most fields: one byte
    std::uint64_t v = b & 0x7F;
    for (int shift = 7; shift < 64; shift += 7) {
      b = *p++;
      if (shift == 63 && b > 1) return ok = false, 0;
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    return ok = false, 0;
  }
};

// The largest compact payload: alloc, 6 varints of up to 10 bytes, 2 of up to 5, 3 bytes.
inline constexpr std::size_t kCompactMaxEvent = kCompactHeaderSize + 6 * 10 + 2 * 5 + 3;
static_assert(kCompactMaxEvent - kCompactHeaderSize <= kCompactMaxPayload);
// The most bytes a decoder reads from a compact payload, whatever it holds (a damaged one
// too): an alloc's 8 varints read as up to 10 bytes each, and its 2 single bytes.
inline constexpr std::size_t kCompactMaxRead = 8 * 10 + 2;

template <class Body>
inline std::size_t compact_frame(unsigned char* buf, std::size_t cap, RecordType t, Body&& body) {
  if (cap < kCompactMaxEvent) return 0;
  VarWriter w{buf + kCompactHeaderSize};
  body(w);
  buf[0] = compact_type(t);
  buf[1] = static_cast<unsigned char>(w.p - (buf + kCompactHeaderSize));
  return static_cast<std::size_t>(w.p - buf);
}

inline void put_time(VarWriter& w, CompactState& s, std::uint64_t ts) { w.zz(ts - s.ts), s.ts = ts; }
inline void put_ptr(VarWriter& w, CompactState& s, std::uint64_t ptr) { w.zz(ptr - s.ptr), s.ptr = ptr; }
inline void put_tid(VarWriter& w, CompactState& s, std::uint32_t tid) {
  w.zz(static_cast<std::uint64_t>(static_cast<std::int64_t>(tid) - static_cast<std::int64_t>(s.tid))), s.tid = tid;
}
inline void put_device(VarWriter& w, std::int16_t device) {
  w.zz(static_cast<std::uint64_t>(static_cast<std::int64_t>(device)));
}

}  // namespace detail

inline constexpr std::size_t kCompactMaxEventSize = detail::kCompactMaxEvent;

// ---- encoders: each writes one compact frame into buf (cap >= kCompactMaxEventSize, else 0)
// and advances s. Layouts (zz: zigzag varint of the difference to the state's value; var:
// unsigned LEB128 varint) are in docs/trace-format.md.

// alloc: zz ts | zz tid | zz device | u8 kind | u8 flags | zz ptr | var requested
//        | zz (size - requested) | var stream | var stack      (tid: to the previous event's)
inline std::size_t encode_compact(unsigned char* buf, std::size_t cap, CompactState& s, const AllocRecord& r) {
  return detail::compact_frame(buf, cap, RecordType::alloc, [&](detail::VarWriter& w) {
    detail::put_time(w, s, r.ts);
    detail::put_tid(w, s, r.tid), detail::put_device(w, r.device);
    w.u8(static_cast<std::uint8_t>(r.kind)), w.u8(r.flags);
    detail::put_ptr(w, s, r.ptr);
    w.var(r.requested), w.zz(r.size - r.requested), w.var(r.stream), w.var(r.stack);
    s.push_alloc(r);
  });
}
// free: zz ts | zz tid | u8 flags | u8 ref | then
//   ref is 0xFF:  zz device | u8 kind | zz ptr | var size | var stream
//   ref < 0xFF:   ptr is the ref-th most recent allocation's (which leaves the list); u8 other,
//                 then what differs from that allocation: [zz device] [u8 kind] [var size]
//                 [var stream], each present where its bit of `other` is set
// | var stack
inline std::size_t encode_compact(unsigned char* buf, std::size_t cap, CompactState& s, const FreeRecord& r) {
  return detail::compact_frame(buf, cap, RecordType::free, [&](detail::VarWriter& w) {
    detail::put_time(w, s, r.ts);
    detail::put_tid(w, s, r.tid), w.u8(r.flags);
    const int i = s.find_alloc(r.ptr);
    if (i >= 0) {
      const CompactState::Allocated a = s.alloc_at(static_cast<std::size_t>(i));
      s.drop_alloc(static_cast<std::size_t>(i));
      const std::uint8_t other = (r.device != a.device ? kFreeOtherDevice : 0) |
                                 (r.kind != a.kind ? kFreeOtherKind : 0) | (r.size != a.size ? kFreeOtherSize : 0) |
                                 (r.stream != a.stream ? kFreeOtherStream : 0);
      w.u8(static_cast<std::uint8_t>(i)), w.u8(other);
      if (other & kFreeOtherDevice) detail::put_device(w, r.device);
      if (other & kFreeOtherKind) w.u8(static_cast<std::uint8_t>(r.kind));
      if (other & kFreeOtherSize) w.var(r.size);
      if (other & kFreeOtherStream) w.var(r.stream);
    } else {
      w.u8(kCompactLiteral), detail::put_device(w, r.device), w.u8(static_cast<std::uint8_t>(r.kind));
      detail::put_ptr(w, s, r.ptr), w.var(r.size), w.var(r.stream);
    }
    w.var(r.stack);
    s.push_free(r.ptr, r.size, r.device);
  });
}
// free_completed: zz ts | u8 ref [zz device | zz ptr | var size, when ref is 0xFF]
// ref < 0xFF: device, ptr and size are the ref-th most recent free's (which leaves the list).
inline std::size_t encode_compact(unsigned char* buf, std::size_t cap, CompactState& s, const FreeCompletedRecord& r) {
  return detail::compact_frame(buf, cap, RecordType::free_completed, [&](detail::VarWriter& w) {
    detail::put_time(w, s, r.ts);
    const int i = s.find_free(r.ptr, r.size, r.device);
    if (i >= 0) {
      w.u8(static_cast<std::uint8_t>(i)), s.drop_free(static_cast<std::size_t>(i));
    } else {
      w.u8(kCompactLiteral), detail::put_device(w, r.device);
      detail::put_ptr(w, s, r.ptr), w.var(r.size);
    }
  });
}
// segment_alloc / segment_free: zz ts | zz device | u8 flags | zz ptr | var size
inline std::size_t encode_compact(unsigned char* buf, std::size_t cap, CompactState& s, const SegmentRecord& r,
                                  bool is_free) {
  return detail::compact_frame(buf, cap, is_free ? RecordType::segment_free : RecordType::segment_alloc,
                               [&](detail::VarWriter& w) {
                                 detail::put_time(w, s, r.ts);
                                 detail::put_device(w, r.device);
                                 w.u8(r.flags), detail::put_ptr(w, s, r.ptr), w.var(r.size);
                               });
}

}  // namespace format
}  // namespace gpuheap
