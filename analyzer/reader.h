// Sequential trace reader: memory-maps plain traces, stream-decompresses zstd ones
// (detected by the zstd frame magic, whatever the file is called).
//
// Truncation is reported as two distinct facts: `cut_mid_record()` (the file ends inside a
// frame: everything up to the last whole record is used) and `has_end()` (an `end` record
// was seen: the process closed the trace cleanly). A trace is truncated when either fails.
// A file whose data stops at a zero type byte (`unwritten_tail()`: the preload's
// preallocated space after the last record it wrote, in a killed or still-running process's
// trace) is not cut mid-record; it only lacks its end record.
//
// A file is a trace only with a whole header followed by a process record: an empty file,
// one cut inside its header, or one whose first record is missing or of another type is
// refused with NotATraceError (every command exits 2 on it rather than report on nothing).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "format/trace.h"

namespace gpuheap {

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
    if (!done_ && n >= format::kFrameHeaderSize) {
      const unsigned char* p = buf_ + pos_;
      std::uint32_t len;
      std::memcpy(&len, p + 1, 4);
      if (format::is_event_type(p[0]) && n - format::kFrameHeaderSize >= len &&
          format::decode_event(p[0], p + format::kFrameHeaderSize, len, ev)) {
        pos_ += format::kFrameHeaderSize + len;
        ++records_;
        if (map_ && pos_ - released_ > kReleaseStep) release_read();
        return Got::event;
      }
    }
    return next(r) ? Got::record : Got::none;
  }

  const std::string& path() const { return path_; }
  bool compressed() const { return compressed_; }
  bool cut_mid_record() const { return cut_; }
  bool has_end() const { return has_end_; }
  bool unwritten_tail() const { return unwritten_tail_; }
  bool truncated() const { return cut_ || !has_end_; }
  std::uint64_t records() const { return records_; }
  std::uint64_t offset() const;  // stream offset of the next unread byte
  // Progress: bytes of the *file* consumed so far and its size.
  std::uint64_t file_pos() const;
  std::uint64_t file_size() const { return file_size_; }

 private:
  struct Zstd;
  bool refill();  // zstd: decompress more into the window; false at EOF
  // Plain: gives back the mapped pages already read (MADV_DONTNEED), so RSS stays bounded
  // by the window, not the file. Called each time kReleaseStep more bytes were consumed.
  void release_read();
  static constexpr std::size_t kReleaseStep = std::size_t{64} << 20;

  std::string path_;
  bool compressed_ = false, cut_ = false, has_end_ = false, done_ = false, unwritten_tail_ = false;
  std::uint64_t records_ = 0, file_size_ = 0;
  int fd_ = -1;
  // Plain: the mapping. zstd: a window of decompressed bytes [buf_, buf_+len_).
  const unsigned char* map_ = nullptr;
  const unsigned char* buf_ = nullptr;
  std::size_t len_ = 0, pos_ = 0;
  std::uint64_t base_offset_ = 0;  // stream offset of buf_[0]
  std::size_t released_ = 0;       // plain: mapped bytes already given back (MADV_DONTNEED)
  std::unique_ptr<Zstd> z_;
};

}  // namespace gpuheap
