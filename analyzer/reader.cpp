#include "analyzer/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <algorithm>
#include <cstring>
#include <vector>

#include <fmt/format.h>

#include "analyzer/error.h"

namespace gpuheap {

namespace {
constexpr unsigned char kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
// Decompressed data is produced kOutChunk at a time into a fixed window (no reallocation,
// no zero-filling): small enough that what was just decompressed is still in L2 when the
// records are decoded, large enough that the per-refill cost is noise.
constexpr std::size_t kInChunk = 1u << 20;
constexpr std::size_t kOutChunk = 512u << 10;
constexpr std::size_t kWindowCap = kOutChunk + format::kFrameHeaderSize + format::kMaxPayload;
}  // namespace

struct TraceReader::Zstd {
  ZSTD_DCtx* ctx = nullptr;
  std::vector<unsigned char> in;
  std::unique_ptr<unsigned char[]> out{new unsigned char[kWindowCap]};  // uninitialized
  ZSTD_inBuffer ib{nullptr, 0, 0};
  std::uint64_t file_read = 0;
  bool eof = false;
  ~Zstd() { ZSTD_freeDCtx(ctx); }
};

TraceReader::TraceReader(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw InputError(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw InputError(fmt::format("{}: not a regular file", path));
  }
  file_size_ = static_cast<std::uint64_t>(st.st_size);
  unsigned char head[4] = {0, 0, 0, 0};
  ssize_t got = file_size_ >= 4 ? ::pread(fd_, head, 4, 0) : 0;
  if (got < 0) throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
  compressed_ = got == 4 && std::memcmp(head, kZstdMagic, 4) == 0;
  if (compressed_) {
    z_ = std::make_unique<Zstd>();
    z_->ctx = ZSTD_createDCtx();
    z_->in.resize(kInChunk);
    refill();
  } else if (file_size_ > 0) {
    void* m = ::mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd_, 0);
    if (m == MAP_FAILED) throw InputError(fmt::format("{}: cannot map: {}", path, std::strerror(errno)));
    ::madvise(m, file_size_, MADV_SEQUENTIAL);
    map_ = static_cast<const unsigned char*>(m);
    buf_ = map_;
    len_ = file_size_;
  }
  std::uint16_t version = 0;
  auto hs = format::decode_file_header(buf_, len_, &version);
  switch (hs) {
    case format::HeaderStatus::ok: pos_ = format::kFileHeaderSize; break;
    case format::HeaderStatus::not_a_trace:
      throw NotATraceError(fmt::format("{}: not a gpuheap trace (bad magic)", path));
    case format::HeaderStatus::newer_version:
      throw VersionError(fmt::format("{}: trace format version {} is newer than this gpuheap understands ({})",
                                     path, version, format::kFormatVersion));
    case format::HeaderStatus::short_file:
      // Empty or cut inside its 16-byte header: nothing says it is a trace (a job that died
      // before writing, a wrong path). Every command refuses it rather than report on it.
      if (compressed_)
        throw EmptyTraceError(fmt::format("{}: not a gpuheap trace (its zstd stream decompresses to {} bytes, "
                                         "shorter than the {}-byte header)",
                                         path, len_, format::kFileHeaderSize));
      throw EmptyTraceError(len_ == 0 ? fmt::format("{}: not a gpuheap trace (empty file)", path)
                                     : fmt::format("{}: not a gpuheap trace ({} bytes, shorter than the {}-byte header)",
                                                   path, len_, format::kFileHeaderSize));
  }
}

TraceReader::~TraceReader() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), file_size_);
  if (fd_ >= 0) ::close(fd_);
}

std::uint64_t TraceReader::offset() const { return base_offset_ + pos_; }

std::uint64_t TraceReader::file_pos() const { return compressed_ ? z_->file_read : pos_; }

bool TraceReader::refill() {
  auto& z = *z_;
  // The unconsumed tail moves to the front of the window. It is a partial frame (at most
  // kFrameHeaderSize + kMaxPayload bytes), or zeros after the data (the preload's unwritten
  // space): then the window may be full, nothing more is decoded, and the caller finds the
  // zero type byte exactly as it would after decompressing the rest.
  std::size_t keep = len_ - pos_;
  if (keep && pos_) std::memmove(z.out.get(), buf_ + pos_, keep);
  base_offset_ += pos_;
  buf_ = z.out.get();
  len_ = keep;
  pos_ = 0;
  std::size_t produced = 0;
  while (produced < kOutChunk / 2 && len_ < kWindowCap) {
    if (z.ib.pos == z.ib.size) {
      if (z.eof) break;
      ssize_t n = ::read(fd_, z.in.data(), z.in.size());
      if (n < 0) throw InputError(fmt::format("{}: read error: {}", path_, std::strerror(errno)));
      if (n == 0) {
        z.eof = true;
        break;
      }
      z.file_read += static_cast<std::uint64_t>(n);
      z.ib = {z.in.data(), static_cast<std::size_t>(n), 0};
    }
    ZSTD_outBuffer ob{z.out.get() + len_, std::min(kOutChunk, kWindowCap - len_), 0};
    std::size_t rc = ZSTD_decompressStream(z.ctx, &ob, &z.ib);
    len_ += ob.pos;
    produced += ob.pos;
    if (ZSTD_isError(rc)) {
      // A damaged or cut compressed stream: keep what decoded, treat the rest as cut.
      z.eof = true;
      z.ib = {nullptr, 0, 0};
      break;
    }
  }
  return produced > 0;
}

void TraceReader::release_read() {
  // Views handed out by earlier next() calls are dead by contract; keep 1 MiB of slack.
  std::size_t upto = (pos_ - (1u << 20)) & ~std::size_t{0xFFFFF};
  ::madvise(const_cast<unsigned char*>(map_) + released_, upto - released_, MADV_DONTNEED);
  released_ = upto;
}

bool TraceReader::next(format::Record& r) {
  if (done_) return false;
  for (;;) {
    std::size_t consumed = 0;
    auto st = format::decode_frame(buf_ + pos_, len_ - pos_, r, &consumed);
    if (st == format::FrameStatus::ok) {
      if (records_ == 0 && r.type != format::RecordType::process)
        throw NotATraceError(fmt::format("{}: not a gpuheap trace: its first record is not a process record (type {})",
                                         path_, static_cast<int>(r.type)));
      pos_ += consumed;
      if (map_ && pos_ - released_ > kReleaseStep) release_read();
      ++records_;
      if (r.type == format::RecordType::end) {
        has_end_ = true;
        done_ = true;
      }
      return true;
    }
    if (st == format::FrameStatus::corrupt) {
      throw CorruptTraceError(fmt::format("{}: corrupt record (type {}) at byte offset {}", path_,
                                          len_ - pos_ > 0 ? buf_[pos_] : 0, offset()),
                              offset());
    }
    // need_more
    if (compressed_ && refill()) continue;
    // A zero type byte is where the preload stopped writing (its file space is preallocated
    // and a frame's type byte is stored last): a killed or still-running process, not a cut.
    if (len_ > pos_ && buf_[pos_] == 0) {
      unwritten_tail_ = true;
    } else {
      cut_ = len_ > pos_;
    }
    done_ = true;
    if (records_ == 0) {
      // A header and nothing whole after it: no process record, so nothing to report on.
      throw EmptyTraceError(fmt::format("{}: not a gpuheap trace: no process record after the header ({})", path_,
                                       cut_ ? "the file is cut inside it" : "the process wrote nothing"));
    }
    return false;
  }
}

}  // namespace gpuheap
