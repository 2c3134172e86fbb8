// gpuheap trace format, version 7: the event block (docs/trace-format.md, "Event blocks").
// Only the compressor writes it (`gpuheap compress`, the end of `gpuheap run`, `gpuheap
// symbolize` of a compressed trace): each run of consecutive compact event frames (format/
// compact.h) becomes one framed record holding the frames' timestamps first, then the rest of
// each frame. The timestamp deltas are near-random bytes; interleaved with every event they
// break zstd's matches on the fields that repeat (types, lengths, stacks, sizes), and apart
// they do not. The preload never writes a block (a trace being written stays crash-safe).
//
// A block is a property of the file's bytes, not of its records: a reader expands it back
// into exactly the compact frames it came from, byte for byte, before it decodes any record
// (no CompactState, nothing about what the fields mean), so everything above the reader sees
// the trace the compressor was given.
//
// event_block payload:  var count | count x ts | count x (u8 type | u8 rest_len | rest)
//   ts:   the bytes of the frame's first field (its zz ts varint, 1..10 bytes) as they were;
//   type: the compact frame's type byte (is_compact_type); rest: its payload after the ts.
// Each event expands to the compact frame  type | ts_len + rest_len | ts | rest.
// The expansion is shorter than the block's payload (by the count's varint), so a buffer of
// the payload's size always holds it.
//
// Header-only, no exceptions, no allocation (callers provide every buffer).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "format/trace.h"  // and format/compact.h, through it

namespace gpuheap {
namespace format {

// The most events one block holds: large enough that a block's header is noise and zstd sees
// long runs of each kind of byte (the gain levels off past a thousand events), small enough
// that a block of the largest compact frames stays under kMaxPayload.
inline constexpr std::size_t kMaxBlockEvents = 4096;
// The most bytes of compact frames one block takes: its payload (count, then these bytes
// regrouped) stays within kMaxPayload.
inline constexpr std::size_t kMaxBlockBytes = kMaxPayload - 16;
inline constexpr std::uint8_t kEventBlockType = static_cast<std::uint8_t>(RecordType::event_block);

// Where the frame at p ends, judged by its header alone, the same way by the writer and the
// reader of blocks (so both stop at the same byte): a compact frame (bit 7 of its type),
// any other frame, the end of the frames (a zero type byte, a length no record can have:
// what follows is not walked, it crosses as it is), or more bytes are needed.
enum class FrameKind : std::uint8_t { compact, record, stop, need_more };
struct FrameExtent {
  FrameKind kind;
  std::size_t size;  // the whole frame's bytes (compact, record)
};
inline FrameExtent frame_extent(const unsigned char* p, std::size_t n) {
  if (n == 0) return {FrameKind::need_more, 0};
  if (p[0] == 0) return {FrameKind::stop, 0};
  std::size_t size;
  if (p[0] & kCompactBit) {
    if (n < kCompactHeaderSize) return {FrameKind::need_more, 0};
    size = kCompactHeaderSize + p[1];
  } else {
    if (n < kFrameHeaderSize) return {FrameKind::need_more, 0};
    std::uint32_t len;
    std::memcpy(&len, p + 1, 4);
    if (len > kMaxPayload) return {FrameKind::stop, 0};
    size = kFrameHeaderSize + len;
  }
  if (n < size) return {FrameKind::need_more, 0};
  return {(p[0] & kCompactBit) ? FrameKind::compact : FrameKind::record, size};
}

namespace detail {
// The length of the varint at p (at most 10 bytes, all before end); 0 if it does not end there.
inline std::size_t varint_len(const unsigned char* p, const unsigned char* end) {
  for (std::size_t i = 0; i < 10 && p + i < end; ++i)
    if (!(p[i] & 0x80)) return i + 1;
  return 0;
}
inline std::size_t varint_size(std::uint64_t v) {
  std::size_t n = 1;
  while (v >= 0x80) v >>= 7, ++n;
  return n;
}
}  // namespace detail

// The bytes of the timestamp of the compact frame at f (a whole frame): what a block takes
// apart; 0 when the frame cannot go into a block (not an event type, no whole first varint).
inline std::size_t block_ts_len(const unsigned char* f) {
  if (!is_compact_type(f[0])) return 0;
  const unsigned char* body = f + kCompactHeaderSize;
  return detail::varint_len(body, body + f[1]);
}

// The event_block frame of the `count` compact frames in [frames, frames + n): each one whole,
// with block_ts_len() > 0. Writes 5 + varint(count) + n bytes into out and returns that; 0
// (nothing usable written) when cap is smaller, count is 0 or above kMaxBlockEvents, n above
// kMaxBlockBytes, or the bytes are not such frames.
inline std::size_t encode_event_block(unsigned char* out, std::size_t cap, const unsigned char* frames, std::size_t n,
                                      std::size_t count) {
  const std::size_t payload = detail::varint_size(count) + n;
  if (count == 0 || count > kMaxBlockEvents || n > kMaxBlockBytes || cap < kFrameHeaderSize + payload) return 0;
  out[0] = kEventBlockType;
  const auto len = static_cast<std::uint32_t>(payload);
  std::memcpy(out + 1, &len, 4);
  detail::VarWriter w{out + kFrameHeaderSize};
  w.var(count);
  unsigned char* rest = w.p;  // the ts bytes go first: find where the rest starts
  const unsigned char* f = frames;
  for (std::size_t i = 0; i < count; ++i) {
    if (static_cast<std::size_t>(frames + n - f) < kCompactHeaderSize) return 0;
    const std::size_t size = kCompactHeaderSize + f[1], ts = block_ts_len(f);
    if (ts == 0 || static_cast<std::size_t>(frames + n - f) < size) return 0;
    rest += ts;
    f += size;
  }
  if (f != frames + n) return 0;
  const unsigned char* const ts_end = rest;  // where the timestamps stop and the rest starts
  const unsigned char* const in_end = frames + n;
  unsigned char* const out_end = out + cap;
  constexpr std::size_t kCopyTs = 16, kCopyRest = 32;  // as in expand_event_block
  for (f = frames; f != in_end; f += kCompactHeaderSize + f[1]) {
    const std::size_t ts = block_ts_len(f), len = f[1] - ts;
    const unsigned char* const src = f + kCompactHeaderSize;
    // Fixed-size copies where they stay within the input, the timestamps' region and out (the
    // bytes past each field are written over by the next one): a few moves instead of calls.
    if (ts_end - w.p >= static_cast<std::ptrdiff_t>(kCopyTs) && in_end - src >= static_cast<std::ptrdiff_t>(kCopyTs))
      std::memcpy(w.p, src, kCopyTs);
    else std::memcpy(w.p, src, ts);
    w.p += ts;
    *rest++ = f[0];
    *rest++ = static_cast<unsigned char>(len);
    if (len <= kCopyRest && out_end - rest >= static_cast<std::ptrdiff_t>(kCopyRest) &&
        in_end - (src + ts) >= static_cast<std::ptrdiff_t>(kCopyRest))
      std::memcpy(rest, src + ts, kCopyRest);
    else std::memcpy(rest, src + ts, len);
    rest += len;
  }
  return kFrameHeaderSize + payload;
}

// Expands the event_block payload [p, p + len) into out (cap >= len always suffices): writes
// its compact frames, in order, and returns their bytes. 0 when the payload is not a block:
// a count of 0 or above kMaxBlockEvents, a timestamp that is no varint, a type that is not a
// compact event's, a frame longer than a compact frame can be, lengths that do not add up to
// exactly len; or cap too small. out must not overlap the payload.
inline std::size_t expand_event_block(const unsigned char* p, std::size_t len, unsigned char* out, std::size_t cap) {
  const unsigned char* const end = p + len;
  detail::VarReader r{p, end};
  const std::uint64_t count = r.var();
  if (!r.ok || count == 0 || count > kMaxBlockEvents) return 0;
  const unsigned char* rest = r.p;  // past the timestamps
  for (std::uint64_t i = 0; i < count; ++i) {
    const std::size_t ts = detail::varint_len(rest, end);
    if (ts == 0) return 0;
    rest += ts;
  }
  const unsigned char* ts = r.p;
  unsigned char* o = out;
  constexpr std::size_t kCopyTs = 16, kCopyRest = 32;  // a timestamp's 10 bytes; most events' rest
  for (std::uint64_t i = 0; i < count; ++i) {
    if (end - rest < 2 || !is_compact_type(rest[0])) return 0;
    const std::size_t ts_len = detail::varint_len(ts, end), rest_len = rest[1];
    const std::size_t size = kCompactHeaderSize + ts_len + rest_len;
    const std::size_t room = static_cast<std::size_t>(out + cap - o);
    if (ts_len + rest_len > kCompactMaxPayload || static_cast<std::size_t>(end - rest) - 2 < rest_len || room < size)
      return 0;
    o[0] = rest[0];
    o[1] = static_cast<unsigned char>(ts_len + rest_len);
    if (rest_len <= kCopyRest && room >= kCompactHeaderSize + kCopyTs + kCopyRest &&
        static_cast<std::size_t>(end - ts) >= kCopyTs && static_cast<std::size_t>(end - rest) >= 2 + kCopyRest) {
      // Most events: copies of a fixed size, which compile to a few moves instead of two calls
      // of memcpy (the expansion's cost when a trace is read). The bytes they write past the
      // frame are the next frame's place, or past what is returned, and within cap.
      std::memcpy(o + kCompactHeaderSize, ts, kCopyTs);
      std::memcpy(o + kCompactHeaderSize + ts_len, rest + 2, kCopyRest);
    } else {
      std::memcpy(o + kCompactHeaderSize, ts, ts_len);
      std::memcpy(o + kCompactHeaderSize + ts_len, rest + 2, rest_len);
    }
    ts += ts_len;
    rest += 2 + rest_len;
    o += size;
  }
  if (rest != end) return 0;
  return static_cast<std::size_t>(o - out);
}

}  // namespace format
}  // namespace gpuheap
