#include "analyzer/trace/block_stream.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "format/block.h"

namespace gpuheap {

namespace {
// The expander's buffer holds the largest frame and a chunk of what follows it.
constexpr std::size_t kFullCapacity = format::kFrameHeaderSize + format::kMaxPayload + (512u << 10);
// A trace whose first megabyte after the header holds no compact event gets no block.
constexpr std::size_t kMaxHeld = 1u << 20;
}  // namespace

BlockExpander::BlockExpander(std::uint64_t start, std::size_t initial_capacity)
    : raw_(std::max<std::size_t>(initial_capacity, 64)),
      raw_at_(start),
      out_at_(start),
      base_{start, start, start, start} {}

unsigned char* BlockExpander::space() {
  if (begin_ > 0) {
    std::memmove(raw_.data(), raw_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == raw_.size() && raw_.size() < kFullCapacity) raw_.resize(kFullCapacity);
  return raw_.data() + end_;
}

bool BlockExpander::needs_input() const {
  if (begin_ == end_) return true;
  if (verbatim_ || finished_) return false;
  const format::FrameExtent e = format::frame_extent(raw_.data() + begin_, end_ - begin_);
  return e.kind == format::FrameKind::need_more;
}

std::size_t BlockExpander::take(unsigned char* dst, std::size_t cap) {
  std::size_t out = 0;
  auto cross = [&](std::size_t n) {  // n bytes at begin_ as they are
    std::memcpy(dst + out, raw_.data() + begin_, n);
    begin_ += n, out += n, raw_at_ += n, out_at_ += n;
  };
  while (begin_ < end_ && out < cap) {
    const unsigned char* p = raw_.data() + begin_;
    const std::size_t avail = end_ - begin_;
    const format::FrameExtent e = verbatim_ ? format::FrameExtent{format::FrameKind::stop, 0}
                                            : format::frame_extent(p, avail);
    // A block cut short by the end of the stream: the stream is cut before it (its bytes,
    // which decode_frame would call corrupt, never reach the window).
    if (e.kind == format::FrameKind::need_more && finished_ && p[0] == format::kEventBlockType) {
      cut_ = true;
      raw_at_ += avail;
      begin_ = end_;
      break;
    }
    // The walk's end, or another frame cut short by the end of the stream: the rest as it is.
    if (e.kind == format::FrameKind::stop || (e.kind == format::FrameKind::need_more && finished_)) {
      verbatim_ = true;
      cross(std::min(avail, cap - out));
      continue;
    }
    if (e.kind == format::FrameKind::need_more) break;
    if (e.size > cap - out) break;
    if (p[0] == format::kEventBlockType) {
      const std::size_t len = e.size - format::kFrameHeaderSize;
      const std::size_t n = format::expand_event_block(p + format::kFrameHeaderSize, len, dst + out, cap - out);
      if (n == 0) {
        // Damaged: it crosses as it is, for the reader to refuse at its offset; nothing after
        // it is read anyway.
        verbatim_ = true;
        continue;
      }
      spans_.push_back(Span{out_at_, out_at_ + n, raw_at_, raw_at_ + e.size});
      begin_ += e.size, raw_at_ += e.size;
      out += n, out_at_ += n;
      continue;
    }
    cross(e.size);
  }
  return out;
}

std::uint64_t BlockExpander::raw_offset(std::uint64_t out_offset) const {
  const Span* s = &base_;
  for (auto it = spans_.rbegin(); it != spans_.rend(); ++it) {
    if (it->out_begin <= out_offset) {
      s = &*it;
      break;
    }
  }
  if (out_offset < s->out_end) return s->raw_begin;
  return s->raw_end + (out_offset - s->out_end);
}

void BlockExpander::forget_before(std::uint64_t out_offset) {
  auto it = spans_.begin();
  while (it != spans_.end() && it->out_end <= out_offset) base_ = *it++;
  spans_.erase(spans_.begin(), it);
}

void BlockPacker::release(std::string& out) {
  if (!packing_ || header_) return;
  header_ = true;
  if (packed_) {
    const std::uint16_t v = format::kFirstBlockVersion;
    std::memcpy(held_.data() + 8, &v, sizeof v);
  }
  out += held_;
  held_.clear();
  held_.shrink_to_fit();
}

void BlockPacker::check_held(std::string& out) {
  if (header_ || held_.size() <= kMaxHeld) return;
  flush_run(out);
  release(out);
  verbatim_ = !packed_;
}

void BlockPacker::flush_run(std::string& out) {
  if (run_count_ == 0) return;
  block_.resize(format::kFrameHeaderSize + 16 + run_.size());
  const std::size_t n = format::encode_event_block(block_.data(), block_.size(),
                                                   reinterpret_cast<const unsigned char*>(run_.data()), run_.size(),
                                                   run_count_);
  if (n == 0) throw InputError("event block: the compressor's own run of frames was refused (a bug)");
  packed_ = true;
  release(out);
  out.append(reinterpret_cast<const char*>(block_.data()), n);
  run_.clear();
  run_count_ = 0;
}

void BlockPacker::walk(std::string& out) {
  std::size_t at = 0;
  auto dest = [&]() -> std::string& { return header_ ? out : held_; };
  while (!verbatim_ && at < in_.size()) {
    const auto* p = reinterpret_cast<const unsigned char*>(in_.data()) + at;
    const format::FrameExtent e = format::frame_extent(p, in_.size() - at);
    if (e.kind == format::FrameKind::need_more) break;
    if (e.kind == format::FrameKind::stop) {
      flush_run(out);
      verbatim_ = true;
      break;
    }
    if (e.kind == format::FrameKind::compact && format::block_ts_len(p) > 0) {
      if (run_count_ == format::kMaxBlockEvents || run_.size() + e.size > format::kMaxBlockBytes) flush_run(out);
      run_.append(reinterpret_cast<const char*>(p), e.size);
      ++run_count_;
    } else {
      // Version 5/6 has no event_block: a frame of its type is damage, and a block would be
      // read where the original says it is corrupt.
      if (p[0] == format::kEventBlockType)
        throw InputError(
            fmt::format("a record of type {} (event_block) in a trace of version {}: damaged, not "
                        "rewritten with event blocks",
                        p[0], version_));
      flush_run(out);
      dest().append(reinterpret_cast<const char*>(p), e.size);
    }
    at += e.size;
    check_held(out);
  }
  in_.erase(0, at);
  if (verbatim_) {
    dest() += in_;
    in_.clear();
  }
}

void BlockPacker::write(const unsigned char* p, std::size_t n, std::string& out) {
  if (verbatim_ && in_.empty()) {
    (header_ || !packing_ ? out : held_).append(reinterpret_cast<const char*>(p), n);
    check_held(out);
    return;
  }
  in_.append(reinterpret_cast<const char*>(p), n);
  if (!packing_ && !verbatim_) {
    if (in_.size() < format::kFileHeaderSize) return;
    std::uint16_t version = 0;
    const bool ok = format::decode_file_header(reinterpret_cast<const unsigned char*>(in_.data()), in_.size(),
                                               &version) == format::HeaderStatus::ok;
    if (ok && version >= format::kFirstCompactVersion && version < format::kFirstBlockVersion) {
      packing_ = true;
      version_ = version;
      held_.assign(in_, 0, format::kFileHeaderSize);
      in_.erase(0, format::kFileHeaderSize);
    } else {
      verbatim_ = header_ = true;  // nothing to regroup (older records) or already version 7
      out += in_;
      in_.clear();
      return;
    }
  }
  walk(out);
}

void BlockPacker::finish(std::string& out) {
  if (!packing_ && !header_) {  // shorter than a header: as it is
    out += in_;
    in_.clear();
    return;
  }
  if (!verbatim_) walk(out);
  flush_run(out);
  std::string& d = header_ ? out : held_;
  d += in_;
  in_.clear();
  release(out);
}

}  // namespace gpuheap
