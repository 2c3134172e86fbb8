#include "analyzer/live/follow.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/safe_file.h"
#include "analyzer/trace/reader.h"

namespace gpuheap::live {

namespace {
constexpr unsigned char kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
// What one read asks for: an idle poll reads at most this much of the zeroed window tail
// (the preload's windows run to 4 MiB ahead of the data), a busy one loops. A frame longer
// than this is read whole by the next read, sized from its length field.
constexpr std::size_t kChunk = 64u << 10;
// The first read of a poll after one that stopped at the zeros: a page, so an idle refresh of
// a job that appends nothing reads one page, not a chunk of zeros.
constexpr std::size_t kProbe = 4096;
// Bounds on what phase records can make the step tracker keep (a hostile trace).
constexpr std::size_t kMaxNames = 1024, kMaxThreads = 4096;
}  // namespace

std::pair<std::string, std::uint64_t> StepTracker::step() const {
  std::pair<std::string, std::uint64_t> best;
  for (const auto& [name, n] : counts)
    if (n > best.second || (n == best.second && name == last_started)) best = {name, n};
  return best;
}

bool StepTracker::on_phase(const format::PhaseRecord& p) {
  std::size_t slot = std::find(tids.begin(), tids.end(), p.tid) - tids.begin();
  if (slot == tids.size()) {
    if (tids.size() >= kMaxThreads) return false;
    tids.push_back(p.tid);
    open.emplace_back();
  }
  auto& st = open[slot];
  bool top_start = false;
  if (p.op == format::PhaseOp::pop) {
    if (!st.empty()) st.pop_back();
  } else if (st.empty()) {
    top_start = true;
    auto it = std::find_if(counts.begin(), counts.end(), [&](const auto& c) { return c.first == p.name; });
    if (it != counts.end()) ++it->second;
    else if (counts.size() < kMaxNames) counts.emplace_back(std::string(p.name), 1);
    last_started = std::string(p.name);
  }
  if (p.op == format::PhaseOp::push && st.size() < Model::kMaxOpenPhases) st.emplace_back(p.name);
  now.clear();
  for (const auto& n : st) now += (now.empty() ? "" : "/") + n;
  return top_start;
}

TraceFollower::TraceFollower(const std::string& path) : path_(path), model_(std::make_unique<Model>(path)) {
  std::string why;
  std::uint64_t size = 0;
  fd_ = open_regular(path, &size, &why);
  if (fd_ < 0) throw InputError(fmt::format("{}: cannot open: {}", path, why));
  try {
    unsigned char head[format::kFileHeaderSize] = {};
    ssize_t got = ::pread(fd_, head, sizeof head, 0);
    if (got < 0) throw InputError(fmt::format("{}: cannot read: {}", path, std::strerror(errno)));
    if (got >= 4 && std::memcmp(head, kZstdMagic, 4) == 0) {
      compressed_ = true;  // read by the first poll()
      return;
    }
    std::uint16_t version = 0;
    switch (format::decode_file_header(head, static_cast<std::size_t>(got), &version)) {
      case format::HeaderStatus::ok: break;
      case format::HeaderStatus::short_file:
        throw EmptyTraceError(fmt::format("{}: no whole header yet ({} bytes)", path, got));
      case format::HeaderStatus::not_a_trace: throw NotATraceError(fmt::format("{}: not a gpuheap trace", path));
      case format::HeaderStatus::newer_version:
        throw VersionError(fmt::format("{}: trace format version {} is newer than this gpuheap understands ({})", path,
                                       version, format::kFormatVersion));
    }
    if (version >= format::kFirstBlockVersion) {
      // Event blocks are written only by the compressor: a finished trace (`zstd -d` of a
      // compressed one), read whole like a compressed one, through the expanding reader.
      compressed_ = true;
      return;
    }
    compact_.enabled = version >= format::kFirstCompactVersion;
    off_ = read_ = format::kFileHeaderSize;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

TraceFollower::~TraceFollower() {
  if (fd_ >= 0) ::close(fd_);
}

// A compressed trace is a finished one (compressed after its process ended): the whole
// stream, through the ordinary reader.
void TraceFollower::read_compressed() {
  TraceReader rd(path_);
  format::Record r;
  while (rd.next(r)) {
    if (r.type == format::RecordType::phase && steps_.on_phase(r.phase) && step_cb_) step_cb_();
    if (record_cb_) record_cb_(r);
    model_->feed(r);
  }
  records_ = rd.records();
  has_end_ = rd.has_end();
  gone_ = !has_end_;
  read_ = rd.file_pos();
  ::close(fd_);
  fd_ = -1;
}

std::size_t TraceFollower::decode(const unsigned char* p, std::size_t n) {
  std::size_t pos = 0;
  format::Record r;
  while (!has_end_) {
    std::size_t used = 0;
    auto st = format::decode_frame(p + pos, n - pos, r, &used, &compact_);
    if (st == format::FrameStatus::need_more) break;  // a zero type byte or a frame not whole yet
    if (st == format::FrameStatus::corrupt)
      throw CorruptTraceError(fmt::format("{}: corrupt record (type {}) at byte offset {}", path_, p[pos], off_ + pos),
                              off_ + pos);
    if (records_ == 0 && r.type != format::RecordType::process)
      throw NotATraceError(fmt::format("{}: not a gpuheap trace: its first record is not a process record", path_));
    if (r.type == format::RecordType::phase && steps_.on_phase(r.phase) && step_cb_) step_cb_();
    if (record_cb_) record_cb_(r);
    model_->feed(r);
    ++records_;
    pos += used;
    if (r.type == format::RecordType::end) has_end_ = true;
  }
  return pos;
}

std::uint64_t TraceFollower::poll() {
  if (fd_ < 0 || ended()) return 0;
  if (compressed_) {
    read_compressed();
    return read_;
  }
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw InputError(fmt::format("{}: cannot stat: {}", path_, std::strerror(errno)));
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t start = off_;
  std::size_t want = at_zeros_ ? kProbe : kChunk;
  at_zeros_ = false;
  while (off_ < size && !has_end_) {
    want = static_cast<std::size_t>(std::min<std::uint64_t>(want, size - off_));
    if (buf_.size() < want) buf_.resize(want);
    ssize_t got = ::pread(fd_, buf_.data(), want, static_cast<off_t>(off_));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw InputError(fmt::format("{}: read error: {}", path_, std::strerror(errno)));
    if (got == 0) break;  // shorter than fstat said: cut meanwhile; what is whole was used
    read_ += static_cast<std::uint64_t>(got);
    const std::size_t n = static_cast<std::size_t>(got), used = decode(buf_.data(), n);
    off_ += used;
    if (used == n) {
      want = kChunk;
      continue;
    }
    // Stopped inside what was read: at a zero type byte (the end of the data for now), or
    // at a frame that runs past the read. That frame starts the next read, sized to hold it
    // whole when it alone is longer than a chunk; one the file does not hold whole yet (cut
    // at a window's end) is waited for.
    const unsigned char* f = buf_.data() + used;
    if (f[0] == 0) {
      at_zeros_ = true;
      break;
    }
    if (used > 0) {
      want = kChunk;
      continue;
    }
    if (n < format::kFrameHeaderSize) break;
    std::uint32_t len;
    std::memcpy(&len, f + 1, 4);
    const std::size_t frame = format::kFrameHeaderSize + std::min<std::uint32_t>(len, format::kMaxPayload);
    if (frame <= n || off_ + frame > size) break;
    want = frame;
  }
  return off_ - start;
}

void TraceFollower::mark_gone() { gone_ = true; }

void TraceFollower::finish() {
  if (finished_ || !ended()) return;
  model_->finish(false, has_end_, records_);
  finished_ = true;
}

}  // namespace gpuheap::live
