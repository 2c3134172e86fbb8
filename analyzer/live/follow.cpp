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
// Rolls followed in one poll: a job rolling faster than top reads is followed at the next.
constexpr int kMaxRollsPerPoll = 4;

// The events a snapshot counts in events_before (preload/record/aggregate.h: every record the
// sink's append_event writes), from the run's start: a snapshot's begin sets the count.
void count_event(const format::Record& r, std::uint64_t& events) {
  if (format::is_event_type(static_cast<std::uint8_t>(r.type))) ++events;
  else if (r.type == format::RecordType::snapshot && r.snapshot.part == format::SnapshotPart::begin)
    events = r.snapshot.events_before;
}

// What heads a segment: where its events start (past the snapshot) and the events before it.
struct SegmentHead {
  bool ok = false;  // tables, then a whole snapshot: a segment
  bool compact = false;
  std::uint64_t end = 0, events_before = 0;
};

// Reads the head of the file at fd (written whole before it was renamed into place). Anything
// else (no snapshot before the first event, a damaged or newer file) is no segment.
SegmentHead scan_head(int fd, std::vector<unsigned char>& buf) {
  SegmentHead h;
  unsigned char head[format::kFileHeaderSize] = {};
  std::uint16_t version = 0;
  if (::pread(fd, head, sizeof head, 0) != static_cast<ssize_t>(sizeof head) ||
      format::decode_file_header(head, sizeof head, &version) != format::HeaderStatus::ok)
    return h;
  format::CompactState cs;
  h.compact = cs.enabled = version >= format::kFirstCompactVersion;
  std::uint64_t off = format::kFileHeaderSize;
  std::size_t want = kChunk;
  for (;;) {
    if (buf.size() < want) buf.resize(want);
    ssize_t got = ::pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return h;
    const auto n = static_cast<std::size_t>(got);
    std::size_t pos = 0;
    format::Record r;
    for (std::size_t used = 0; pos < n; pos += used) {
      const auto st = format::decode_frame(buf.data() + pos, n - pos, r, &used, &cs);
      if (st == format::FrameStatus::corrupt) return h;
      if (st == format::FrameStatus::need_more) break;
      if (r.type == format::RecordType::snapshot) {
        if (r.snapshot.part == format::SnapshotPart::begin) h.events_before = r.snapshot.events_before;
        if (r.snapshot.part != format::SnapshotPart::end) continue;
        h.ok = true, h.end = off + pos + used;
        return h;
      }
      if (!format::is_table_record(r.type)) return h;
    }
    if (pos > 0) {
      off += pos, want = kChunk;
      continue;
    }
    // A frame longer than the read: read it whole (its length field), unless it is not there.
    if (n < format::kFrameHeaderSize || buf[0] == 0 || (buf[0] & format::kCompactBit)) return h;
    std::uint32_t len;
    std::memcpy(&len, buf.data() + 1, 4);
    const std::size_t frame = format::kFrameHeaderSize + std::min<std::uint32_t>(len, format::kMaxPayload);
    if (frame <= n || frame <= want) return h;
    want = frame;
  }
}
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
// stream, through the ordinary reader; with skip_head, the records after its snapshot only
// (a rolling window's last segment going on where the one read before stopped).
void TraceFollower::read_compressed(bool skip_head) {
  TraceReader rd(path_);
  format::Record r;
  std::uint64_t fed = 0;
  for (bool head = skip_head; rd.next(r);) {
    if (head) {
      head = !(r.type == format::RecordType::snapshot && r.snapshot.part == format::SnapshotPart::end);
      continue;
    }
    if (r.type == format::RecordType::phase && steps_.on_phase(r.phase) && step_cb_) step_cb_();
    if (record_cb_) record_cb_(r);
    model_->feed(r);
    ++fed;
  }
  records_ = skip_head ? records_ + fed : rd.records();
  has_end_ = rd.has_end();
  gone_ = !has_end_;
  read_ += rd.file_pos();
  if (fd_ >= 0) ::close(fd_);
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
    count_event(r, events_);
    ++records_;
    pos += used;
    if (r.type == format::RecordType::end) has_end_ = true;
  }
  return pos;
}

std::uint64_t TraceFollower::poll() {
  if (fd_ < 0 || ended()) return 0;
  if (compressed_) {
    read_compressed(false);
    return read_;
  }
  std::uint64_t consumed = read_appended();
  for (int i = 0; i < kMaxRollsPerPoll && !ended() && follow_roll(consumed); ++i) consumed += read_appended();
  return consumed;
}

bool TraceFollower::follow_roll(std::uint64_t& consumed) {
  struct stat now {};
  struct stat mine {};
  if (::stat(path_.c_str(), &now) != 0) return follow_finished(consumed);
  if (!S_ISREG(now.st_mode) || ::fstat(fd_, &mine) != 0) return false;
  if ((now.st_dev == mine.st_dev && now.st_ino == mine.st_ino) ||
      (now.st_dev == not_segment_.first && now.st_ino == not_segment_.second))
    return false;
  // Another file has the name. The preload renames the next segment over it only after its
  // last append to the old one: read that to its end first.
  consumed += read_appended();
  if (ended()) return false;  // a finished trace rewritten under its name (symbols stored): no roll
  std::string why;
  std::uint64_t size = 0;
  const int fd = open_regular(path_, &size, &why);
  if (fd < 0) return false;  // gone meanwhile (compressed, moved): the next poll looks again
  struct stat st {};
  const SegmentHead h = scan_head(fd, buf_);
  if (!h.ok || ::fstat(fd, &st) != 0) {
    not_segment_ = {st.st_dev, st.st_ino};
    ::close(fd);
    return false;
  }
  ++rolls_;
  if (h.events_before != events_) {
    reseed(fd, h.compact, consumed);
    return true;
  }
  // The events go on where the old segment stopped: the head (the tables known already, the
  // state this Model has) is skipped.
  ::close(fd_);
  fd_ = fd, off_ = h.end, read_ += h.end, at_zeros_ = false;
  compact_ = format::CompactState{};
  compact_.enabled = h.compact;
  return true;
}

// The path is gone: `gpuheap run` finished the trace (stored its symbols, compressed it to
// TRACE.zst, removed TRACE) after its process rolled to a segment not read yet and exited.
// The finished trace is that last segment, whole: it is read as a roll is followed (its head
// skipped when the events go on, else a new Model from its snapshot). Without TRACE.zst the
// old segment stays, the trace incomplete.
bool TraceFollower::follow_finished(std::uint64_t& consumed) {
  const std::string done = path_ + ".zst";
  struct stat st {};
  if (::stat(done.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  consumed += read_appended();  // the old segment to its end first
  if (ended()) return false;
  std::uint64_t events_before = 0;
  {
    TraceReader rd(done);
    format::Record r;
    bool got = false, same_process = false;
    while ((got = rd.next(r)) && format::is_table_record(r.type))
      if (r.type == format::RecordType::process) same_process = is_this_process(r.process);
    // No snapshot after the tables: no segment of a rolling window, left alone; nor another
    // process's trace that happens to lie there (a TRACE.zst left by an earlier run).
    if (!got || !same_process || r.type != format::RecordType::snapshot ||
        r.snapshot.part != format::SnapshotPart::begin)
      return false;
    events_before = r.snapshot.events_before;
  }
  ++rolls_;
  path_ = done;
  const bool goes_on = events_before == events_;
  std::unique_ptr<Model> prev = goes_on ? nullptr : new_model();
  const std::uint64_t before = read_;
  read_compressed(goes_on);
  consumed += read_ - before;
  if (prev) keep_peaks(*prev);
  return true;
}

// The process this follower has read the trace of: the same pid, host and start times.
bool TraceFollower::is_this_process(const format::ProcessRecord& p) const {
  const TraceInfo& mine = model_->info;
  return mine.have_process && p.pid == mine.pid && p.wall_ns == mine.wall_ns && p.mono_ns == mine.mono_ns &&
         p.hostname == mine.hostname;
}

std::unique_ptr<Model> TraceFollower::new_model() {
  std::unique_ptr<Model> prev = std::move(model_);
  model_ = std::make_unique<Model>(path_);
  ++missed_;
  if (new_model_cb_) new_model_cb_();
  return prev;
}

// The seeded Model's statistics start from the live set; the peaks this follower saw before
// stay (the run reached them).
void TraceFollower::keep_peaks(const Model& prev) {
  for (const auto& od : prev.devices)
    for (auto& nd : model_->devices) {
      if (nd.device != od.device) continue;
      for (int p = 0; p < 3; ++p)
        for (int m = 0; m < kNumMetrics; ++m)
          nd.stat.pool(p)[m].peak = std::max(nd.stat.pool(p)[m].peak, od.stat.pool(p)[m].peak);
    }
}

void TraceFollower::reseed(int fd, bool compact, std::uint64_t& consumed) {
  const std::unique_ptr<Model> prev = new_model();
  ::close(fd_);
  fd_ = fd, off_ = format::kFileHeaderSize, read_ += off_, at_zeros_ = false;
  compact_ = format::CompactState{};
  compact_.enabled = compact;
  consumed += read_appended();
  keep_peaks(*prev);
}

std::uint64_t TraceFollower::read_appended() {
  if (fd_ < 0) return 0;  // a finished trace read whole (follow_finished)
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
