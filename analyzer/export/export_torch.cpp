// torch-snapshot: the pickle that torch.cuda.memory._snapshot() / _dump_snapshot() write, so
// that pytorch.org/memory_viz and `python -m torch.cuda._memory_viz` open a gpuheap trace.
//   {"segments": [segment...], "device_traces": [[entry...] per device ordinal]}
// The viewer starts from the final `segments` and replays `device_traces` backwards, so
// both come from one replay here: every trace entry is applied to the segment/block state,
// and that state at the end is what `segments` lists (gaps in a segment as inactive blocks).
// Pickle protocol 2 (memory_viz's own unpickler rejects 5; 2 needs no framing), integers
// beyond 32 bits as LONG1, strings and each stack's frame list memoized (written once).
#include <iterator>
#include <map>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "analyzer/base/error.h"
#include "analyzer/export/export.h"
#include "analyzer/export/export_out.h"

namespace gpuheap::exporter {

namespace {

class Pickler {
 public:
  explicit Pickler(OutFile& out) : out_(out), b_(out.buf()) {
    op(0x80);
    op(2);
  }
  void op(unsigned char c) { b_.push_back(static_cast<char>(c)); }
  void u32(std::uint32_t v) {
    for (int i = 0; i < 4; ++i) op(static_cast<unsigned char>(v >> (8 * i)));
  }
  void integer(std::int64_t v) {
    if (v >= 0 && v < 256) {
      op('K'), op(static_cast<unsigned char>(v));
    } else if (v >= 0 && v < 65536) {
      op('M'), op(static_cast<unsigned char>(v)), op(static_cast<unsigned char>(v >> 8));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J'), u32(static_cast<std::uint32_t>(v));
    } else {
      // LONG1: n little-endian two's-complement bytes, the fewest that keep the value.
      int n = 1;
      for (; n < 8; ++n) {
        unsigned sh = 64 - 8 * static_cast<unsigned>(n);
        if (static_cast<std::int64_t>(static_cast<std::uint64_t>(v) << sh) >> sh == v) break;
      }
      unsigned char bytes[8];
      for (int i = 0; i < 8; ++i) bytes[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(v) >> (8 * i));
      op(0x8a), op(static_cast<unsigned char>(n));
      for (int i = 0; i < n; ++i) op(bytes[i]);
    }
  }
  void uinteger(std::uint64_t v) {
    if (v <= static_cast<std::uint64_t>(INT64_MAX)) return integer(static_cast<std::int64_t>(v));
    // Past INT64_MAX (only corrupt traces): nine bytes, the ninth a zero sign byte.
    op(0x8a), op(9);
    for (int i = 0; i < 8; ++i) op(static_cast<unsigned char>(v >> (8 * i)));
    op(0);
  }
  void boolean(bool v) { op(v ? 0x88 : 0x89); }
  void str(const std::string& raw) {
    auto it = strings_.find(raw);
    if (it != strings_.end()) return get(it->second);
    std::string s = utf8_clean(raw);
    op('X');
    u32(static_cast<std::uint32_t>(s.size()));
    b_.append(s);
    strings_.emplace(raw, put());
  }
  // Stores the object just written in the memo; returns its index.
  std::uint32_t put() {
    std::uint32_t i = memo_++;
    op('r');
    u32(i);
    return i;
  }
  void get(std::uint32_t i) {
    op('j');
    u32(i);
  }
  void key(const char* k, std::int64_t v) { str(k), integer(v); }
  void ukey(const char* k, std::uint64_t v) { str(k), uinteger(v); }
  void skey(const char* k, const std::string& v) { str(k), str(v); }
  void flush() { out_.maybe_flush(); }
  // List items go in MARK ... APPENDS batches of 1000, as Python's pickler writes them:
  // memory_viz's unpickler spreads one batch into a call's arguments, and millions would
  // overflow its stack. Call item() before each element, end_items() after the last.
  void begin_items() { batch_ = 0; }
  void item() {
    if (batch_ % 1000 == 0) {
      if (batch_) op('e');
      op('(');
    }
    ++batch_;
  }
  void end_items() {
    if (batch_) op('e');
    batch_ = 0;
  }

 private:
  OutFile& out_;
  fmt::memory_buffer& b_;
  std::uint32_t memo_ = 0;
  std::size_t batch_ = 0;
  std::unordered_map<std::string, std::uint32_t> strings_;
};

struct Seg {
  int device = 0;
  std::uint64_t size = 0, stream = 0;
  bool small = false;
  std::uint32_t stack = 0;
};
struct Blk {
  int device = 0;
  std::uint64_t size = 0, requested = 0, stream = 0;
  std::uint32_t stack = 0;
  bool pending = false;  // freed, waiting for free_completed (active_pending_free)
};

// Pass-through device kinds are one cudaMalloc each: a segment holding one block, as torch
// shows PYTORCH_NO_CUDA_MEMORY_CACHING allocations.
bool own_segment(format::AllocKind k) {
  using format::AllocKind;
  return k == AllocKind::device_passthrough || k == AllocKind::pitch || k == AllocKind::async ||
         k == AllocKind::managed;
}

struct Entry {
  const char* action;
  std::uint64_t addr, size, stream, time_us;
  std::uint32_t stack;
};
// The last `cap` entries pushed (all of them when cap is 0), oldest first from at(0).
struct EntryRing {
  std::vector<Entry> v;
  std::size_t head = 0;  // the oldest entry once the ring is full
  std::uint64_t dropped = 0;
  void push(const Entry& e, std::size_t cap) {
    if (cap == 0 || v.size() < cap) return v.push_back(e);
    v[head] = e;
    head = head + 1 == v.size() ? 0 : head + 1;
    ++dropped;
  }
  const Entry& at(std::size_t i) const { return v[(head + i) % v.size()]; }
};

// What --max-entries dropped: a warning, and (only then: other snapshots are unchanged) a
// top-level "gpuheap_dropped_entries" list, the count per device as device_traces is
// indexed. torch's snapshot has no such field; its viewers ignore keys they do not know.
void dropped_entries(Pickler& p, const std::map<int, EntryRing>& traces, int max_dev, std::size_t cap) {
  std::uint64_t total = 0;
  for (const auto& [dev, ring] : traces) {
    if (!ring.dropped) continue;
    total += ring.dropped;
    spdlog::warn(
        "torch-snapshot: cuda:{}: kept the last {} of {} trace entries (--max-entries {}; 0 keeps all): "
        "the viewer shows the blocks allocated before them as already there",
        dev, ring.v.size(), ring.v.size() + ring.dropped, cap);
  }
  if (!total) return;
  p.str("gpuheap_dropped_entries");
  p.op(']');
  p.put();
  p.begin_items();
  for (int d = 0; d <= max_dev; ++d) {
    auto it = traces.find(d);
    p.item();
    p.uinteger(it == traces.end() ? 0 : it->second.dropped);
  }
  p.end_items();
}

// Each stack's frame list is pickled once and memoized; later uses refer to the memo.
class FrameMemo {
 public:
  FrameMemo(Pickler& p, StackResolver& res) : p_(p), res_(res) {}
  void operator()(std::uint32_t stack) {
    auto it = memo_.find(stack);
    if (it != memo_.end()) return p_.get(it->second);
    p_.op(']');
    std::uint32_t idx = p_.put();
    const auto& fr = res_.frames(stack);  // innermost first, as torch lists them
    if (!fr.empty()) {
      p_.op('(');  // at most 256 frames (kMaxStackDepth, plus inlined ones): one batch
      for (const auto& f : fr) {
        p_.op('}'), p_.op('(');
        p_.skey("filename", f.file.empty() ? f.module : f.file);
        p_.key("line", f.line);
        p_.skey("name", frame_name(f));
        p_.op('u');
      }
      p_.op('e');
    }
    memo_.emplace(stack, idx);
  }

 private:
  Pickler& p_;
  StackResolver& res_;
  std::unordered_map<std::uint32_t, std::uint32_t> memo_;  // stack id -> memo index
};

// The snapshot's state replayed from the trace: the segments and blocks at the end, and the
// entries kept per device.
struct TorchState {
  explicit TorchState(const ExportOptions& o) : opt(o) {}
  const ExportOptions& opt;
  std::map<std::uint64_t, Seg> segs;
  std::map<std::uint64_t, Blk> blocks;
  std::unordered_map<std::uint64_t, bool> own;  // ptr -> has its own synthetic segment
  // Entries are kept per device (the pickle lists them device by device) and written after
  // the segments, whose final state is known only at the end: the last opt.max_entries of
  // each device, as torch's _record_memory_history(max_entries=N) keeps them (a ring per
  // device), else a long trace held every event in memory (48 bytes each). The segments
  // come from every event all the same; the viewer shows blocks allocated before the kept
  // entries as already there.
  std::map<int, EntryRing> traces;
  int max_dev = -1;

  bool add(const Model& m, int dev, const char* action, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
           std::uint64_t ts, std::uint32_t stack) {
    if (opt.device >= 0 && dev != opt.device) return false;
    if (dev < 0 || dev >= static_cast<int>(Model::kMaxDevices)) return false;
    max_dev = std::max(max_dev, dev);
    traces[dev].push({action, addr, size, stream, m.info.to_wall(ts) / 1000, stack}, opt.max_entries);
    return true;
  }

  void on_alloc(const Model& m, const format::AllocRecord& x) {
    bool mine = own_segment(x.kind);
    if (x.kind != format::AllocKind::device_pooled && !mine) return;
    if (!mine) {
      // A pooled block in no recorded segment (a trace that does not start at the
      // pool's start): its own segment, since the viewer needs every block inside one.
      auto sg = segs.upper_bound(x.ptr);
      mine = sg == segs.begin() || x.ptr >= std::prev(sg)->first + std::prev(sg)->second.size;
    }
    if (mine && add(m, x.device, "segment_alloc", x.ptr, x.size, x.stream, x.ts, x.stack))
      segs[x.ptr] = {x.device, x.size, x.stream, false, x.stack};
    if (add(m, x.device, "alloc", x.ptr, x.size, x.stream, x.ts, x.stack)) {
      blocks[x.ptr] = {x.device, x.size, x.requested, x.stream, x.stack, false};
      own[x.ptr] = mine;
    }
  }

  void on_free(const Model& m, const format::FreeRecord& x) {
    if (x.flags & format::kFlagFailed) return;
    auto b = blocks.find(x.ptr);
    if (b == blocks.end() || b->second.pending) return;
    if (!add(m, b->second.device, "free_requested", x.ptr, b->second.size, b->second.stream, x.ts, x.stack)) return;
    if (own[x.ptr]) {
      add(m, b->second.device, "free_completed", x.ptr, b->second.size, b->second.stream, x.ts, x.stack);
      add(m, b->second.device, "segment_free", x.ptr, b->second.size, b->second.stream, x.ts, x.stack);
      segs.erase(x.ptr);
      own.erase(x.ptr);
      blocks.erase(b);
    } else {
      b->second.pending = true;
    }
  }

  void on_free_completed(const Model& m, const format::FreeCompletedRecord& x) {
    auto b = blocks.find(x.ptr);
    if (b == blocks.end() || !b->second.pending) return;
    if (add(m, b->second.device, "free_completed", x.ptr, b->second.size, b->second.stream, x.ts, b->second.stack)) {
      own.erase(x.ptr);
      blocks.erase(b);
    }
  }

  void on_record(const format::Record& r, const Model& m) {
    using format::RecordType;
    switch (r.type) {
      case RecordType::segment_alloc: {
        const auto& s = r.segment;
        if (add(m, s.device, "segment_alloc", s.ptr, s.size, 0, s.ts, 0))
          segs[s.ptr] = {s.device, s.size, 0, (s.flags & format::kFlagSmallPool) != 0, 0};
        break;
      }
      case RecordType::segment_free: {
        const auto& s = r.segment;
        if (add(m, s.device, "segment_free", s.ptr, s.size, 0, s.ts, 0)) segs.erase(s.ptr);
        break;
      }
      case RecordType::alloc: on_alloc(m, r.alloc); break;
      case RecordType::free: on_free(m, r.free); break;
      case RecordType::free_completed: on_free_completed(m, r.free_completed); break;
      case RecordType::oom: {
        const auto& o = r.oom;
        // torch's oom entry carries the driver's free bytes where others have an address.
        add(m, o.device, "oom", o.device_free, o.requested, o.stream, o.ts, o.stack);
        break;
      }
      default: break;
    }
  }
};

// One segment's blocks inside [addr, addr + size): the live ones, and the gaps between as
// inactive. Nested in the segments' batch: blocks batch on their own counter.
void write_segment_blocks(Pickler& p, FrameMemo& frames, const TorchState& st, std::uint64_t addr, const Seg& s) {
  p.op(']'), p.put();
  std::size_t nb = 0;
  auto block = [&](std::uint64_t at, std::uint64_t size, std::uint64_t req, const char* state, std::uint32_t stack) {
    if (nb % 1000 == 0) {
      if (nb) p.op('e');
      p.op('(');
    }
    ++nb;
    p.op('}'), p.op('(');
    p.ukey("address", at);
    p.ukey("size", size);
    p.ukey("requested_size", req);
    p.skey("state", state);
    p.str("frames"), frames(stack);
    p.op('u');
  };
  std::uint64_t at = addr;
  for (auto b = st.blocks.lower_bound(addr); b != st.blocks.end() && b->first < addr + s.size; ++b) {
    if (b->first > at) block(at, b->first - at, 0, "inactive", 0);
    block(b->first, b->second.size, b->second.requested, b->second.pending ? "active_pending_free" : "active_allocated",
          b->second.stack);
    at = std::max(at, b->first + b->second.size);
  }
  if (at < addr + s.size) block(at, addr + s.size - at, 0, "inactive", 0);
  if (nb) p.op('e');
}

void write_segments(Pickler& p, FrameMemo& frames, const TorchState& st) {
  p.str("segments");
  p.op(']');
  p.put();
  p.begin_items();
  for (const auto& [addr, s] : st.segs) {
    p.item();
    p.op('}'), p.op('(');
    p.key("device", s.device);
    p.ukey("address", addr);
    p.ukey("total_size", s.size);
    // Blocks inside [addr, addr + size): the live ones, and the gaps between as inactive.
    std::uint64_t allocated = 0, active = 0, requested = 0, stream = s.stream;
    auto first = st.blocks.lower_bound(addr);
    for (auto b = first; b != st.blocks.end() && b->first < addr + s.size; ++b) {
      active += b->second.size;
      requested += b->second.requested;
      if (!b->second.pending) allocated += b->second.size;
      if (b == first && !stream) stream = b->second.stream;
    }
    p.ukey("allocated_size", allocated);
    p.ukey("active_size", active);
    p.ukey("requested_size", requested);
    p.ukey("stream", stream);
    p.skey("segment_type", s.small ? "small" : "large");
    p.str("segment_pool_id");
    p.integer(0), p.integer(0), p.op(0x86);
    p.str("is_expandable"), p.boolean(false);
    p.str("frames"), frames(s.stack);
    p.str("blocks");
    write_segment_blocks(p, frames, st, addr, s);
    p.op('u');
    p.flush();
  }
  p.end_items();
}

void write_device_traces(Pickler& p, FrameMemo& frames, const TorchState& st) {
  p.str("device_traces");
  p.op(']');
  p.put();
  p.op('(');
  for (int d = 0; d <= st.max_dev; ++d) {
    p.op(']'), p.put();
    auto it = st.traces.find(d);
    if (it == st.traces.end()) continue;
    p.begin_items();
    for (std::size_t i = 0; i < it->second.v.size(); ++i) {
      const Entry& e = it->second.at(i);
      p.item();
      p.op('}'), p.op('(');
      p.str("action"), p.str(e.action);
      p.ukey(std::string_view(e.action) == "oom" ? "device_free" : "addr", e.addr);
      p.ukey("size", e.size);
      p.ukey("stream", e.stream);
      p.ukey("time_us", e.time_us);
      p.str("frames"), frames(e.stack);
      p.op('u');
      p.flush();
    }
    p.end_items();
  }
  p.op('e');
}

}  // namespace

void export_torch(const std::string& trace, const ExportOptions& opt, OutFile& out) {
  // Frames need the whole trace's modules: a first replay collects them.
  AnalyzeOptions aopt;
  aopt.progress = opt.progress;
  aopt.timeline_buckets = 2;
  Analysis a = analyze({trace}, aopt);
  StackResolver res(*a.traces[0], opt.all_frames);

  Pickler p(out);
  FrameMemo frames(p, res);
  TorchState st(opt);
  walk_trace(trace, opt.progress, [&](const format::Record& r, const Model& m) { st.on_record(r, m); });

  p.op('}');
  p.put();
  p.op('(');
  write_segments(p, frames, st);
  write_device_traces(p, frames, st);
  dropped_entries(p, st.traces, st.max_dev, opt.max_entries);
  p.op('u');
  p.op('.');
}

}  // namespace gpuheap::exporter
