// Event-by-event exports: csv (every event), rmm-csv (RMM's logging adaptor columns, for its
// replay benchmark) and chrome (trace-event JSON for Perfetto / chrome://tracing).
#include <ctime>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/progress.h"
#include "analyzer/export/export.h"
#include "analyzer/export/export_out.h"
#include "analyzer/trace/reader.h"

namespace gpuheap::exporter {

void walk_trace(const std::string& path, bool progress_on,
                const std::function<void(const format::Record&, const Model&)>& fn) {
  TraceReader rd(path);
  Model m(path, 2);  // the timeline is not needed here: 2 buckets cost nothing
  Progress progress(path, rd.file_size(), progress_on);
  format::Record r;
  std::uint64_t n = 0;
  while (rd.next(r)) {
    if (r.type == format::RecordType::snapshot)  // events before the window are not there to export
      throw InputError(path +
                       " is a rolling window (gpuheap run --aggregate): the events before it are not in the "
                       "file, and this output needs every event; summary reads its peaks, leaks and sites");
    m.feed(r);
    fn(r, m);
    if ((++n & (Progress::kCheckEvery - 1)) == 0) progress.update(rd.file_pos(), n);
  }
  progress.finish();
}

LiveTotals device_totals(const Model& m, int device) {
  for (const auto& d : m.devices)
    if (d.device == device)
      return {d.stat[kRequestedBytes][kAllPools].current, d.stat[kAllocatedBytes][kAllPools].current,
              d.stat[kActiveBytes][kAllPools].current, d.stat[kReservedBytes][kAllPools].current};
  return {};
}

namespace {

using format::RecordType;

std::uint64_t rel(std::uint64_t ts, const TraceInfo& in) { return ts >= in.mono_ns ? ts - in.mono_ns : 0; }

}  // namespace

void export_csv(const std::vector<std::string>& traces, const ExportOptions& opt, OutFile& out) {
  // host and rank last: the columns before them keep their places. A pid names a process of
  // one host only; the traces of a job on several hosts may share pids.
  out.put(
      "pid,time_ns,event,device,kind,ptr,size,requested,stream,tid,flags,stack,"
      "requested_bytes,allocated_bytes,active_bytes,reserved_bytes,host,rank\n");
  for (const auto& path : traces) {
    std::string who;  // ",HOST,RANK" of this trace, from its process and identity records
    bool who_known = false;
    std::int32_t who_rank = -1;
    walk_trace(path, opt.progress, [&](const format::Record& r, const Model& m) {
      int dev = event_device(r);
      if (dev == INT32_MIN || (opt.device >= 0 && dev != opt.device)) return;
      auto it = std::back_inserter(out.buf());
      const auto& in = m.info;
      if (!who_known || who_rank != in.rank) {
        fmt::memory_buffer b;
        b.push_back(',');
        csv_str(b, utf8_clean(in.hostname));
        b.push_back(',');
        if (in.rank >= 0) fmt::format_to(std::back_inserter(b), "{}", in.rank);
        who.assign(b.data(), b.size()), who_known = true, who_rank = in.rank;
      }
      auto row = [&](std::uint64_t ts, const char* ev, const char* kind, std::uint64_t ptr, std::uint64_t size,
                     const std::string& req, std::uint64_t stream, std::uint32_t tid, unsigned flags,
                     std::uint32_t stack) {
        auto t = device_totals(m, dev);
        fmt::format_to(it, "{},{},{},{},{},{:#x},{},{},{},{},{},{},{},{},{},{}{}\n", in.pid, rel(ts, in), ev, dev, kind,
                       ptr, size, req, stream, tid, flags, stack, t.requested, t.allocated, t.active, t.reserved, who);
      };
      switch (r.type) {
        case RecordType::alloc: {
          const auto& a = r.alloc;
          row(a.ts, "alloc", format::alloc_kind_name(a.kind), a.ptr, a.size, std::to_string(a.requested), a.stream,
              a.tid, a.flags, a.stack);
          break;
        }
        case RecordType::free: {
          const auto& f = r.free;
          row(f.ts, "free", format::alloc_kind_name(f.kind), f.ptr, f.size, "", f.stream, f.tid, f.flags, f.stack);
          break;
        }
        case RecordType::free_completed:
          row(r.free_completed.ts, "free_completed", "pooled", r.free_completed.ptr, r.free_completed.size, "", 0, 0, 0,
              0);
          break;
        case RecordType::segment_alloc:
        case RecordType::segment_free:
          row(r.segment.ts, r.type == RecordType::segment_alloc ? "segment_alloc" : "segment_free", "pooled",
              r.segment.ptr, r.segment.size, "", 0, 0, r.segment.flags, 0);
          break;
        case RecordType::oom: {
          const auto& o = r.oom;
          row(o.ts, "oom", format::alloc_kind_name(o.kind), 0, 0, std::to_string(o.requested), o.stream, o.tid, 0,
              o.stack);
          break;
        }
        case RecordType::retry:
          row(r.retry.ts, "retry", "pooled", 0, 0, std::to_string(r.retry.requested), 0, 0, 0, 0);
          break;
        case RecordType::empty_cache:
          row(r.empty_cache.ts, "empty_cache", "pooled", 0, r.empty_cache.released, "", 0, 0,
              static_cast<unsigned>(r.empty_cache.reason), 0);
          break;
        default: break;
      }
      out.maybe_flush();
    });
  }
}

// RMM's logging_resource_adaptor writes "Thread,Time,Action,Pointer,Size,Stream" with the
// wall time as HH:MM:SS.microseconds, actions allocate / free / "allocate failure", and the
// size of a free equal to its allocation's. Its replay benchmark (log_parser.hpp) parses
// Pointer as hex and Stream with a plain integer conversion, so the stream is written in
// decimal. Only device memory that a memory resource could hand out is written (not host,
// address-space or physical-handle records).
void export_rmm_csv(const std::string& trace, const ExportOptions& opt, OutFile& out) {
  out.put("Thread,Time,Action,Pointer,Size,Stream\n");
  std::unordered_map<std::uint64_t, std::uint64_t> live;  // ptr -> requested size
  auto replayable = [](format::AllocKind k) {
    return format::holds_device_memory(k) && k != format::AllocKind::vmm_physical;
  };
  walk_trace(trace, opt.progress, [&](const format::Record& r, const Model& m) {
    auto it = std::back_inserter(out.buf());
    auto time = [&](std::uint64_t ts) {
      std::uint64_t w = m.info.to_wall(ts);
      auto secs = static_cast<std::time_t>(w / 1'000'000'000u);
      std::tm tm{};
      ::gmtime_r(&secs, &tm);
      return fmt::format("{:02}:{:02}:{:02}.{:06}", tm.tm_hour, tm.tm_min, tm.tm_sec, (w / 1000) % 1'000'000);
    };
    if (r.type == RecordType::alloc) {
      const auto& a = r.alloc;
      if (!replayable(a.kind) || (opt.device >= 0 && a.device != opt.device)) return;
      live[a.ptr] = a.requested;
      fmt::format_to(it, "{},{},allocate,{:#x},{},{}\n", a.tid, time(a.ts), a.ptr, a.requested, a.stream);
    } else if (r.type == RecordType::free) {
      const auto& f = r.free;
      if (!replayable(f.kind) || (f.flags & format::kFlagFailed) || (opt.device >= 0 && f.device != opt.device)) return;
      auto l = live.find(f.ptr);
      if (l == live.end()) return;  // freed memory the trace never saw allocated: nothing to replay
      fmt::format_to(it, "{},{},free,{:#x},{},{}\n", f.tid, time(f.ts), f.ptr, l->second, f.stream);
      live.erase(l);
    } else if (r.type == RecordType::oom) {
      const auto& o = r.oom;
      if (opt.device >= 0 && o.device != opt.device) return;
      fmt::format_to(it, "{},{},allocate failure,0x0,{},{}\n", o.tid, time(o.ts), o.requested, o.stream);
    }
    out.maybe_flush();
  });
}

namespace {

// Chrome trace-event "stackFrames": one entry per distinct (parent, frame), ids as strings.
class ChromeStacks {
 public:
  // Leaf frame id of a stack of trace `ti` ("" for no stack).
  const std::string& leaf(std::size_t ti, std::uint32_t stack, StackResolver& res) {
    auto key = (static_cast<std::uint64_t>(ti) << 32) | stack;
    auto it = leaf_.find(key);
    if (it != leaf_.end()) return it->second;
    std::string id;
    const auto& fr = res.frames(stack);
    for (auto f = fr.rbegin(); f != fr.rend(); ++f) {
      std::string name = frame_name(*f);
      std::string k = id;
      k += '\x1f';
      k += name;
      auto [n, fresh] = ids_.emplace(std::move(k), "");
      if (fresh) {
        n->second = std::to_string(ids_.size());
        frames_.push_back({n->second, name, id});
      }
      id = n->second;
    }
    return leaf_.emplace(key, id).first->second;
  }
  void write(fmt::memory_buffer& b) const {
    b.append(std::string_view("\"stackFrames\":{"));
    bool first = true;
    for (const auto& f : frames_) {
      if (!first) b.push_back(',');
      first = false;
      json_str(b, f.id);
      b.append(std::string_view(":{\"name\":"));
      json_str(b, f.name);
      if (!f.parent.empty()) {
        b.append(std::string_view(",\"parent\":"));
        json_str(b, f.parent);
      }
      b.push_back('}');
    }
    b.push_back('}');
  }

 private:
  struct F {
    std::string id, name, parent;
  };
  std::unordered_map<std::string, std::string> ids_;
  std::unordered_map<std::uint64_t, std::string> leaf_;
  std::vector<F> frames_;
};

}  // namespace

void export_chrome(const std::vector<std::string>& traces, const ExportOptions& opt, OutFile& out) {
  // Symbols need the whole trace's modules and stacks: a first replay collects them.
  AnalyzeOptions aopt;
  aopt.progress = opt.progress;
  aopt.timeline_buckets = 2;
  Analysis a = analyze(traces, aopt);
  std::uint64_t start = UINT64_MAX;
  for (const auto& t : a.traces) start = std::min(start, t->info.wall_ns);
  ChromeStacks stacks;
  out.put("{\"displayTimeUnit\":\"ns\",\"otherData\":{\"generator\":\"gpuheap " GPUHEAP_VERSION
          "\"},\"traceEvents\":[\n");
  bool first = true;
  auto sep = [&] {
    if (!first) out.buf().append(std::string_view(",\n"));
    first = false;
  };
  for (std::size_t ti = 0; ti < traces.size(); ++ti) {
    const Model& full = *a.traces[ti];
    StackResolver res(full, opt.all_frames);
    std::uint32_t pid = full.info.pid;
    auto it = std::back_inserter(out.buf());
    std::string cmd;
    for (const auto& c : full.info.command) cmd += (cmd.empty() ? "" : " ") + c;
    sep();
    fmt::format_to(it, "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{},\"args\":{{\"name\":", pid);
    json_str(out.buf(), "gpuheap: " + cmd);
    out.put("}}");
    std::map<int, LiveTotals> last;  // per device: the values last written
    walk_trace(traces[ti], opt.progress, [&](const format::Record& r, const Model& m) {
      int dev = event_device(r);
      if (dev == INT32_MIN || (opt.device >= 0 && dev != opt.device)) return;
      auto ts_of = [&](std::uint64_t ts) {
        std::uint64_t w = m.info.to_wall(ts) - std::min(m.info.to_wall(ts), start);
        return fmt::format("{}.{:03}", w / 1000, w % 1000);
      };
      std::uint64_t ts = 0;
      auto o = std::back_inserter(out.buf());
      auto instant = [&](const char* name, const char* cat, const char* scope, std::uint32_t tid, std::uint32_t stack,
                         const std::string& args) {
        sep();
        fmt::format_to(o, "{{\"ph\":\"i\",\"name\":\"{}\",\"cat\":\"{}\",\"s\":\"{}\",\"pid\":{},\"tid\":{},\"ts\":{}",
                       name, cat, scope, pid, tid, ts_of(ts));
        if (stack) {
          const auto& leaf = stacks.leaf(ti, stack, res);
          if (!leaf.empty()) {
            out.buf().append(std::string_view(",\"sf\":"));
            json_str(out.buf(), leaf);
          }
        }
        fmt::format_to(o, ",\"args\":{{{}}}}}", args);
      };
      switch (r.type) {
        case RecordType::alloc:
          ts = r.alloc.ts;
          instant("alloc", "alloc", "t", r.alloc.tid, r.alloc.stack,
                  fmt::format("\"device\":{},\"kind\":\"{}\",\"ptr\":\"{:#x}\",\"size\":{},\"requested\":{}", dev,
                              format::alloc_kind_name(r.alloc.kind), r.alloc.ptr, r.alloc.size, r.alloc.requested));
          break;
        case RecordType::free:
          ts = r.free.ts;
          instant("free", "alloc", "t", r.free.tid, r.free.stack,
                  fmt::format("\"device\":{},\"kind\":\"{}\",\"ptr\":\"{:#x}\"", dev,
                              format::alloc_kind_name(r.free.kind), r.free.ptr));
          break;
        case RecordType::free_completed: ts = r.free_completed.ts; break;
        case RecordType::segment_alloc:
        case RecordType::segment_free:
          ts = r.segment.ts;
          instant(r.type == RecordType::segment_alloc ? "segment_alloc" : "segment_free", "segment", "p", 0, 0,
                  fmt::format("\"device\":{},\"ptr\":\"{:#x}\",\"size\":{}", dev, r.segment.ptr, r.segment.size));
          break;
        case RecordType::oom:
          ts = r.oom.ts;
          instant("OOM", "oom", "g", r.oom.tid, r.oom.stack,
                  fmt::format("\"device\":{},\"requested\":{},\"device_free\":{},\"reserved\":{},\"allocated\":{}", dev,
                              r.oom.requested, r.oom.device_free, r.oom.reserved, r.oom.allocated));
          break;
        case RecordType::retry:
          ts = r.retry.ts;
          instant("retry", "oom", "p", 0, 0, fmt::format("\"device\":{},\"requested\":{}", dev, r.retry.requested));
          break;
        case RecordType::empty_cache:
          ts = r.empty_cache.ts;
          instant("empty_cache", "segment", "p", 0, 0,
                  fmt::format("\"device\":{},\"released\":{}", dev, r.empty_cache.released));
          break;
        default: return;
      }
      // Counter tracks, one per series (a counter event with several args is drawn stacked,
      // which would add requested to reserved); written only when the value moved.
      auto t = device_totals(m, dev);
      auto [li, fresh] = last.try_emplace(dev);
      auto& l = li->second;
      auto counter = [&](const char* series, std::int64_t now, std::int64_t& was, bool force) {
        if (now == was && !force) return;
        was = now;
        sep();
        fmt::format_to(o, "{{\"ph\":\"C\",\"name\":\"cuda:{} {}\",\"pid\":{},\"ts\":{},\"args\":{{\"bytes\":{}}}}}",
                       dev, series, pid, ts_of(ts), now);
      };
      counter("requested", t.requested, l.requested, fresh);
      counter("allocated", t.allocated, l.allocated, fresh);
      counter("active", t.active, l.active, fresh);
      counter("reserved", t.reserved, l.reserved, fresh);
      out.maybe_flush();
    });
  }
  out.put("\n],");
  stacks.write(out.buf());
  out.put("}\n");
}

}  // namespace gpuheap::exporter
