#include "analyzer/trace/reader.h"

#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/safe_file.h"
#include "analyzer/trace/block_stream.h"

namespace gpuheap {

namespace {
constexpr unsigned char kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
constexpr std::size_t kMaxFrame = format::kFrameHeaderSize + format::kMaxPayload;
// Bytes are produced kChunk at a time into a fixed window (no reallocation, no
// zero-filling): small enough that what was just read is still in L2 when the records are
// decoded, large enough that the per-refill cost is noise. The window also holds what the
// zero-run check looks at: a zero type byte, the frame that may follow it, then kZeroRun.
constexpr std::size_t kInChunk = 1u << 20;
constexpr std::size_t kChunk = 512u << 10;
constexpr std::size_t kZeroProbe = kMaxFrame + TraceReader::kZeroRun;
constexpr std::size_t kWindowCap = kChunk + kZeroProbe;
}  // namespace

struct TraceReader::Zstd {
  ZSTD_DCtx* ctx = nullptr;
  std::vector<unsigned char> in;
  ZSTD_inBuffer ib{nullptr, 0, 0};
  // The last ZSTD_decompressStream() result: 0 once a frame is complete. Non-zero at the
  // end of the file means the stream stops inside a frame: a cut file.
  std::size_t last_rc = 0;
  bool error = false;
  ~Zstd() { ZSTD_freeDCtx(ctx); }
};

TraceReader::TraceReader(const std::string& path) : path_(path) {
  std::string why;
  fd_ = open_regular(path, &file_size_, &why);
  if (fd_ < 0) {
    if (why.find("regular file") != std::string::npos) throw InputError(fmt::format("{}: {}", path, why));
    throw InputError(fmt::format("{}: cannot open: {}", path, why));
  }
  // A constructor that throws runs no destructor: the fd must be closed here (the fuzzer,
  // which opens thousands of bad headers per second, ran out of descriptors).
  try {
    unsigned char head[4] = {0, 0, 0, 0};
    ssize_t got = file_size_ >= 4 ? ::pread(fd_, head, 4, 0) : 0;
    if (got < 0) throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
    compressed_ = got == 4 && std::memcmp(head, kZstdMagic, 4) == 0;
    // Small first: a small trace (a plain one its size, a zstd one up to 256 KiB of data) is
    // read whole into a small window, so thousands of small traces a second (the fuzzer) need
    // not each allocate megabytes. The window grows to its full size at the first refill that
    // did not reach the end, or when a frame fills it.
    cap_ = static_cast<std::size_t>(std::min<std::uint64_t>(kWindowCap, compressed_ ? 256u << 10 : file_size_ + 64));
    window_.reset(new unsigned char[cap_]);  // uninitialized
    buf_ = window_.get();
    if (compressed_) {
      z_ = std::make_unique<Zstd>();
      z_->ctx = ZSTD_createDCtx();
      z_->in.resize(static_cast<std::size_t>(std::clamp<std::uint64_t>(file_size_, 4096, kInChunk)));
    }
    while (len_ < format::kFileHeaderSize && refill()) {
    }
    std::uint16_t version = 0;
    auto hs = format::decode_file_header(buf_, len_, &version);
    switch (hs) {
      case format::HeaderStatus::ok:
        pos_ = format::kFileHeaderSize;
        compact_.enabled = version >= format::kFirstCompactVersion;
        if (version >= format::kFirstBlockVersion) {
          // What was read past the header goes through the expander like the rest.
          x_ = std::make_unique<BlockExpander>(format::kFileHeaderSize, cap_);
          const std::size_t n = len_ - pos_;
          std::memcpy(x_->space(), buf_ + pos_, n);
          x_->added(n);
          len_ = pos_;
        }
        break;
      case format::HeaderStatus::not_a_trace:
        throw NotATraceError(fmt::format("{}: not a gpuheap trace (bad magic)", path));
      case format::HeaderStatus::newer_version:
        throw VersionError(fmt::format("{}: trace format version {} is newer than this gpuheap understands ({})", path,
                                       version, format::kFormatVersion));
      case format::HeaderStatus::short_file:
        // Empty or cut inside its 16-byte header: nothing says it is a trace (a job that died
        // before writing, a wrong path). Every command refuses it rather than report on it.
        if (compressed_)
          throw EmptyTraceError(
              fmt::format("{}: not a gpuheap trace (its zstd stream {}decompresses to {} bytes, "
                          "shorter than the {}-byte header)",
                          path, z_->last_rc != 0 || z_->error ? "is cut short and " : "", len_,
                          format::kFileHeaderSize));
        throw EmptyTraceError(len_ == 0
                                  ? fmt::format("{}: not a gpuheap trace (empty file)", path)
                                  : fmt::format("{}: not a gpuheap trace ({} bytes, shorter than the {}-byte header)",
                                                path, len_, format::kFileHeaderSize));
    }
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

TraceReader::~TraceReader() {
  if (fd_ >= 0) ::close(fd_);
}

std::uint64_t TraceReader::offset() const { return x_ ? x_->raw_offset(base_offset_ + pos_) : base_offset_ + pos_; }

std::size_t TraceReader::fill(unsigned char* dst, std::size_t cap) {
  for (;;) {
    ssize_t n = ::read(fd_, dst, cap);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw InputError(fmt::format("{}: read error: {}", path_, std::strerror(errno)));
    file_read_ += static_cast<std::uint64_t>(n);
    return static_cast<std::size_t>(n);
  }
}

void TraceReader::grow_window() {
  std::unique_ptr<unsigned char[]> w(new unsigned char[kWindowCap]);
  std::memcpy(w.get(), window_.get(), len_);
  window_ = std::move(w);
  buf_ = window_.get();
  cap_ = kWindowCap;
}

std::size_t TraceReader::produce(unsigned char* dst, std::size_t cap) {
  if (!compressed_) {
    std::size_t n = fill(dst, cap);
    if (n == 0) eof_ = true;
    return n;
  }
  auto& z = *z_;
  if (z.ib.pos == z.ib.size) {
    std::size_t n = fill(z.in.data(), z.in.size());
    if (n == 0) {
      eof_ = true;
      return 0;
    }
    z.ib = {z.in.data(), n, 0};
  }
  ZSTD_outBuffer ob{dst, cap, 0};
  std::size_t rc = ZSTD_decompressStream(z.ctx, &ob, &z.ib);
  if (ZSTD_isError(rc)) {
    // A damaged compressed stream: keep what decoded, treat the rest as cut.
    z.error = true;
    eof_ = true;
  } else {
    z.last_rc = rc;
  }
  return ob.pos;
}

bool TraceReader::refill() {
  // The unconsumed tail (a partial frame, or what the zero-run check still looks at) moves
  // to the front of the window; new bytes go after it.
  std::size_t keep = len_ - pos_;
  if (keep && pos_) std::memmove(window_.get(), buf_ + pos_, keep);
  base_offset_ += pos_;
  len_ = keep;
  pos_ = 0;
  const bool more = !eof_ || (x_ && !x_->empty());
  if (cap_ < kWindowCap && (len_ == cap_ || (more && refilled_))) grow_window();
  refilled_ = true;
  if (x_) {
    x_->forget_before(base_offset_);
    return refill_expanded(0);
  }
  std::size_t produced = 0;
  while (!eof_ && produced < kChunk / 2 && len_ < cap_) {
    std::size_t n = produce(window_.get() + len_, std::min(kChunk, cap_ - len_));
    len_ += n;
    produced += n;
  }
  return produced > 0;
}

// The stream's bytes go into the expander, whole frames out of it into the window (a block
// expanded), until half a chunk came, the window is full, or the next frame does not fit.
bool TraceReader::refill_expanded(std::size_t produced) {
  auto& x = *x_;
  while (produced < kChunk / 2 && len_ < cap_) {
    const std::size_t n = x.take(window_.get() + len_, cap_ - len_);
    len_ += n;
    produced += n;
    if (!x.needs_input()) {
      if (n > 0) continue;
      if (cap_ < kWindowCap) {  // a frame larger than the small window's room
        grow_window();
        continue;
      }
      break;  // the window is full for the next frame: what is in it is read first
    }
    if (eof_) {
      if (x.finished()) break;
      x.finish();
      continue;
    }
    unsigned char* dst = x.space();
    x.added(produce(dst, std::min(kChunk, x.room())));
  }
  return produced > 0;
}

void TraceReader::end_of_data() {
  done_ = true;
  if (len_ > pos_ && buf_[pos_] == 0) {
    // A zero type byte. The frame at pos_ may be one the preload copied but for its type
    // byte (stored last): its length field is then a valid one and its bytes anything.
    // Past it, only zeros may follow, to the end of the file or for kZeroRun bytes.
    while (len_ - pos_ < kZeroProbe && refill()) {
    }
    std::uint32_t len = 0;
    if (len_ - pos_ >= format::kFrameHeaderSize) std::memcpy(&len, buf_ + pos_ + 1, 4);
    std::size_t from = pos_ + format::kFrameHeaderSize + (len <= format::kMaxPayload ? len : 0);
    std::size_t to = std::min(len_, from + kZeroRun);
    const unsigned char* nz = nullptr;
    if (len > format::kMaxPayload) {
      nz = buf_ + pos_ + 1;  // a length no frame can have: not a frame being copied
    } else if (from < to) {
      auto* it = std::find_if(buf_ + from, buf_ + to, [](unsigned char c) { return c != 0; });
      if (it != buf_ + to) nz = it;
    }
    if (nz != nullptr) {
      auto at = offset();
      throw CorruptTraceError(fmt::format("{}: damaged trace: a zero type byte at byte offset {} is followed by "
                                          "data at offset {} (a zeroed or overwritten record, not the unwritten "
                                          "end of the file)",
                                          path_, at, base_offset_ + static_cast<std::uint64_t>(nz - buf_)),
                              at);
    }
    unwritten_tail_ = true;
  } else {
    cut_ = len_ > pos_ || (x_ && x_->cut());
  }
  if (compressed_ && (z_->error || z_->last_rc != 0) && !unwritten_tail_) cut_ = true;
  if (!compressed_ && eof_ && file_read_ < file_size_) {
    // Shorter at the end than when opened: truncated while it was read (by the program
    // still writing it, or a copy in progress). What was read is used, as for any cut.
    shrank_ = true;
    cut_ = true;
  }
}

void TraceReader::throw_corrupt() const {
  throw CorruptTraceError(fmt::format("{}: corrupt record (type {}) at byte offset {}", path_,
                                      len_ - pos_ > 0 ? buf_[pos_] : 0, offset()),
                          offset());
}

bool TraceReader::next(format::Record& r) {
  if (done_) return false;
  for (;;) {
    std::size_t consumed = 0;
    auto st = format::decode_frame(buf_ + pos_, len_ - pos_, r, &consumed, &compact_);
    if (st == format::FrameStatus::ok) {
      if (records_ == 0 && r.type != format::RecordType::process)
        throw NotATraceError(fmt::format("{}: not a gpuheap trace: its first record is not a process record (type {})",
                                         path_, static_cast<int>(r.type)));
      last_frame_ = buf_ + pos_, last_frame_len_ = consumed;
      pos_ += consumed;
      ++records_;
      if (r.type == format::RecordType::end) {
        has_end_ = true;
        done_ = true;
      }
      return true;
    }
    if (st == format::FrameStatus::corrupt) throw_corrupt();
    // need_more: an incomplete frame, or a zero type byte (decode_frame's "end of the
    // written data"). More bytes may complete the former; the latter is judged at once.
    if (!(len_ > pos_ && buf_[pos_] == 0) && refill()) continue;
    end_of_data();
    if (records_ == 0) {
      // A header and nothing whole after it: no process record, so nothing to report on.
      throw EmptyTraceError(fmt::format("{}: not a gpuheap trace: no process record after the header ({})", path_,
                                        cut_ ? "the file is cut inside it" : "the process wrote nothing"));
    }
    return false;
  }
}

}  // namespace gpuheap
