// Sequential trace reader: reads plain traces into a window with read(2) (never mmap: a
// file truncated while it is read, e.g. by the still-running program, would raise SIGBUS),
// stream-decompresses zstd ones (detected by the zstd frame magic, whatever the file is
// called) into the same window. Memory stays bounded by the window whatever the file holds.
//
// Truncation is reported as two distinct facts: `cut_mid_record()` (the file ends inside a
// frame: everything up to the last whole record is used) and `has_end()` (an `end` record
// was seen: the process closed the trace cleanly). A trace is truncated when either fails.
// A file whose data stops at a zero type byte (`unwritten_tail()`: the preload's
// preallocated space after the last record it wrote, in a killed or still-running process's
// trace) is not cut mid-record; it only lacks its end record. That holds only when
// nothing but zeros follows (after the one frame that may have been copied but for its type
// byte), to the end of the file or for longer than the largest record (kZeroRun bytes, so a
// file of gigabytes of zeros, e.g. a zstd bomb, is not read to its end). A zero type byte
// followed by other data is damage: CorruptTraceError. A file that shrank while it was read
// (`shrank()`), and a zstd stream that ends inside a frame, are cut.
//
// A file is a trace only with a whole header followed by a process record: an empty file,
// one cut inside its header, or one whose first record is missing or of another type is
// refused with NotATraceError (every command exits 2 on it rather than report on nothing).
//
// A version-7 stream (a compressed trace, or one decompressed with `zstd -d`) holds event
// blocks (format/block.h): its bytes go through a BlockExpander before they reach the window,
// so the window holds the frames the compressor was given and everything above it reads
// them as it read the original. Offsets (offset(), errors) are the stream's own, before
// expansion (an event's inside a block: the block's).
#pragma once

#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "format/trace.h"

namespace gpuheap {

class BlockExpander;

class TraceReader {
 public:
  // Throws NotATraceError (no header) / VersionError / InputError (unreadable).
  explicit TraceReader(const std::string& path);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  // Decodes the next record into r (string/ip views stay valid until the next call).
  // Returns false at the end of the data, or after the `end` record. Throws
  // CorruptTraceError naming the byte offset (in the decompressed stream) of a bad frame,
  // NotATraceError when the first record is not a process record (or there is none).
  bool next(format::Record& r);

  // The replay's fast path. Event records (alloc, free, free_completed, segment_*) are
  // decoded in place into `ev` (Got::event); any other record, and the rare event frame that
  // straddles a zstd window, goes through next(r) (Got::record). Got::none where next()
  // returns false. Errors, truncation and counters are exactly next()'s.
  enum class Got { none, event, record };
  Got next_any(format::EventRecord& ev, format::Record& r) {
    std::size_t n = len_ - pos_;
    if (!done_ && n >= format::kCompactHeaderSize && (buf_[pos_] & format::kCompactBit)) {
      if (next_compact(ev)) return Got::event;
    } else if (!done_ && n >= format::kFrameHeaderSize) {
      const unsigned char* p = buf_ + pos_;
      std::uint32_t len;
      std::memcpy(&len, p + 1, 4);
      if (format::is_event_type(p[0]) && n - format::kFrameHeaderSize >= len &&
          format::decode_event(p[0], p + format::kFrameHeaderSize, len, ev)) {
        pos_ += format::kFrameHeaderSize + len;
        ++records_;
        return Got::event;
      }
    }
    return next(r) ? Got::record : Got::none;
  }

  // The replay's batch: decodes the alloc, free and free_completed records that follow, up to
  // max, in place into out[0..n) and returns n; stops before any other record, an incomplete
  // frame, or one that next_any would not decode in place (next_any then takes it, with
  // next()'s errors). The same records, with the same fields (their padding bytes aside), as
  // n calls of next_any; a corrupt compact frame throws next_any's CorruptTraceError here (the
  // records decoded before it in this batch are then never fed: the replay stops anyway).
  std::size_t next_events(format::EventRecord* out, std::size_t max) {
    if (done_) return 0;
    const unsigned char* p = buf_ + pos_;
    const unsigned char* const end = buf_ + len_;
    std::size_t n = 0;
    // Branch-free decoding while the window holds kBatchRead bytes past the frame header
    // (decode_batch_event reads that far); the window's last frames the exact way below.
    while (n < max && static_cast<std::size_t>(end - p) >= format::kFrameHeaderSize + format::kBatchRead) {
      std::uint32_t len;
      std::memcpy(&len, p + 1, 4);
      if (!format::decode_batch_event(p[0], p + format::kFrameHeaderSize, len, out[n])) break;
      p += format::kFrameHeaderSize + len;
      ++n;
    }
    while (n < max && static_cast<std::size_t>(end - p) >= format::kFrameHeaderSize) {
      std::uint32_t len;
      std::memcpy(&len, p + 1, 4);
      const std::uint8_t t = p[0];
      if (!batch_type(t) || static_cast<std::size_t>(end - p) - format::kFrameHeaderSize < len ||
          !format::decode_event(t, p + format::kFrameHeaderSize, len, out[n]))
        break;
      p += format::kFrameHeaderSize + len;
      ++n;
    }
    if (n < max && compact_.enabled && records_ > 0) n = compact_events(p, out, n, max);
    pos_ = static_cast<std::size_t>(p - buf_);
    records_ += n;
    return n;
  }

  // The raw bytes of the frame next() last decoded (valid until the next call): what
  // `gpuheap symbolize` copies unchanged into the rewritten trace.
  const unsigned char* last_frame() const { return last_frame_; }
  std::size_t last_frame_size() const { return last_frame_len_; }

  const std::string& path() const { return path_; }
  bool compressed() const { return compressed_; }
  bool cut_mid_record() const { return cut_; }
  bool has_end() const { return has_end_; }
  bool unwritten_tail() const { return unwritten_tail_; }
  bool truncated() const { return cut_ || !has_end_; }
  // The file was shorter at its end than when it was opened (cut_mid_record() is then set).
  bool shrank() const { return shrank_; }
  std::uint64_t records() const { return records_; }
  std::uint64_t offset() const;  // stream offset of the next unread byte
  // Progress: bytes of the *file* consumed so far and its size (when it was opened).
  std::uint64_t file_pos() const { return file_read_; }
  std::uint64_t file_size() const { return file_size_; }

  // A run of zero bytes this long after a zero type byte (and the frame that may follow it)
  // ends the data: longer than any record, so no record the preload wrote can be in it.
  static constexpr std::size_t kZeroRun = format::kFrameHeaderSize + format::kMaxPayload + 1;

 private:
  static bool batch_type(std::uint8_t t) {
    using format::RecordType;
    return t == static_cast<std::uint8_t>(RecordType::alloc) || t == static_cast<std::uint8_t>(RecordType::free) ||
           t == static_cast<std::uint8_t>(RecordType::free_completed);
  }
  static bool compact_batch_type(std::uint8_t t) {
    using format::RecordType;
    return t == format::compact_type(RecordType::alloc) || t == format::compact_type(RecordType::free) ||
           t == format::compact_type(RecordType::free_completed);
  }
  // The compact frame at p, whole in the window (len bytes of payload), decoded into ev:
  // without a bound check per byte where the window holds kCompactMaxRead bytes past its
  // header (VarReaderUnchecked), else with them. False: corrupt.
  bool decode_compact_at(const unsigned char* p, std::size_t len, format::EventRecord& ev) {
    const unsigned char* q = p + format::kCompactHeaderSize;
    if (static_cast<std::size_t>(buf_ + len_ - q) >= format::detail::kCompactMaxRead) {
      format::detail::VarReaderUnchecked r{q, q + len};
      return format::detail::decode_compact_body(p[0], r, compact_, ev);
    }
    format::detail::VarReader r{q, q + len};
    return format::detail::decode_compact_body(p[0], r, compact_, ev);
  }
  // next_events' compact frames (version 5): decodes the compact alloc, free and
  // free_completed frames whole in the window from p on into out[n..max), advancing p; returns
  // the new n. Throws next()'s CorruptTraceError on a bad one (with pos_ at it).
  std::size_t compact_events(const unsigned char*& p, format::EventRecord* out, std::size_t n, std::size_t max) {
    const unsigned char* const end = buf_ + len_;
    while (n < max && static_cast<std::size_t>(end - p) >= format::kCompactHeaderSize && compact_batch_type(p[0])) {
      const std::size_t len = p[1];
      if (static_cast<std::size_t>(end - p) - format::kCompactHeaderSize < len) break;
      if (!decode_compact_at(p, len, out[n])) {
        pos_ = static_cast<std::size_t>(p - buf_);
        records_ += n;
        throw_corrupt();
      }
      p += format::kCompactHeaderSize + len;
      ++n;
    }
    return n;
  }
  // A whole compact frame (version 5) at pos_ decoded into ev; false (nothing consumed) for
  // anything else, which next() then takes. Throws next()'s CorruptTraceError on a bad one.
  bool next_compact(format::EventRecord& ev) {
    const unsigned char* p = buf_ + pos_;
    const std::size_t len = p[1];
    if (!compact_.enabled || !format::is_compact_type(p[0]) || records_ == 0 ||
        len_ - pos_ - format::kCompactHeaderSize < len)
      return false;
    if (!decode_compact_at(p, len, ev)) throw_corrupt();
    pos_ += format::kCompactHeaderSize + len;
    ++records_;
    return true;
  }
  [[noreturn]] void throw_corrupt() const;  // the frame at pos_ is corrupt
  struct Zstd;
  bool refill();  // more bytes into the window (read or decompressed); false when none came
  std::size_t fill(unsigned char* dst, std::size_t cap);  // plain: read(2) up to cap bytes
  // One read(2), or one step of decompression, into dst; sets eof_ at the end.
  std::size_t produce(unsigned char* dst, std::size_t cap);
  bool refill_expanded(std::size_t produced);  // refill() of a version-7 stream
  void grow_window();
  void end_of_data();  // sets cut_/unwritten_tail_/shrank_ where the data stops; may throw

  std::string path_;
  bool compressed_ = false, cut_ = false, has_end_ = false, done_ = false, unwritten_tail_ = false;
  bool eof_ = false, shrank_ = false, refilled_ = false;
  std::uint64_t records_ = 0, file_size_ = 0, file_read_ = 0;
  int fd_ = -1;
  // The window of stream bytes [buf_, buf_+len_), buf_ = window_.
  std::unique_ptr<unsigned char[]> window_;
  const unsigned char* buf_ = nullptr;
  std::size_t len_ = 0, pos_ = 0, cap_ = 0;  // cap_: the window's size
  std::uint64_t base_offset_ = 0;            // stream offset of buf_[0]
  std::unique_ptr<Zstd> z_;
  std::unique_ptr<BlockExpander> x_;  // version 7: the stream's bytes go through it
  format::CompactState compact_;      // the compact records' state (version 5)
  const unsigned char* last_frame_ = nullptr;
  std::size_t last_frame_len_ = 0;
};

// The device an event record (alloc, free, free_completed, segment, oom, retry,
// empty_cache) is about; INT32_MIN for a record about no device.
inline int event_device(const format::Record& r) {
  using format::RecordType;
  switch (r.type) {
    case RecordType::alloc: return r.alloc.device;
    case RecordType::free: return r.free.device;
    case RecordType::free_completed: return r.free_completed.device;
    case RecordType::segment_alloc:
    case RecordType::segment_free: return r.segment.device;
    case RecordType::oom: return r.oom.device;
    case RecordType::retry: return r.retry.device;
    case RecordType::empty_cache: return r.empty_cache.device;
    default: return INT32_MIN;
  }
}

}  // namespace gpuheap
