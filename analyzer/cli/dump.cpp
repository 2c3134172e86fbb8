#include <unistd.h>

#include <cinttypes>
#include <string>

#include <fmt/format.h>

#include "analyzer/base/progress.h"
#include "analyzer/base/text_safe.h"
#include "analyzer/cli/commands.h"
#include "analyzer/trace/reader.h"

namespace gpuheap {

namespace {

// Quoted fields: NULs (argv separators in cmdline) as spaces, the rest through text_safe.
std::string printable(std::string_view s) {
  std::string o(s);
  for (char& c : o)
    if (c == '\0') c = ' ';
  return text_safe(o, true);
}
std::string hex(std::string_view s) {
  std::string o;
  for (unsigned char c : s) o += fmt::format("{:02x}", c);
  return o;
}
const char* empty_reason(format::EmptyCacheReason r) {
  switch (r) {
    case format::EmptyCacheReason::api: return "api";
    case format::EmptyCacheReason::threshold: return "threshold";
    case format::EmptyCacheReason::oom_retry: return "oom_retry";
    case format::EmptyCacheReason::exit: return "exit";
  }
  return "?";
}
const char* end_reason(format::EndReason r) {
  switch (r) {
    case format::EndReason::exit: return "exit";
    case format::EndReason::signal: return "signal";
    case format::EndReason::stopped: return "stopped";
  }
  return "?";
}
std::string flags(std::uint8_t f) {
  std::string o;
  if (f & format::kFlagSmallPool) o += "small,";
  if (f & format::kFlagOversize) o += "oversize,";
  if (f & format::kFlagFailed) o += "failed,";
  if (f & ~7u) o += fmt::format("{:#x},", f & ~7u);
  if (o.empty()) return "-";
  o.pop_back();
  return o;
}

// A snapshot record (format v6, a rolling window's head): its part on one line, then one
// indented line per entry.
void format_snapshot(const format::SnapshotRecord& x, fmt::memory_buffer& b) {
  using P = format::SnapshotPart;
  auto it = std::back_inserter(b);
  switch (x.part) {
    case P::begin:
      fmt::format_to(it, "snapshot begin ts={} segment={} events_before={} first_ts={}\n", x.ts, x.segment,
                     x.events_before, x.first_ts);
      return;
    case P::device:
      fmt::format_to(it,
                     "snapshot device device={} peak_requested={} peak_allocated={} peak_ts={} peak_seq={} ooms={} "
                     "retries={} empty_cache_calls={} empty_cache_released={}\n",
                     x.device, x.peak_requested, x.peak_allocated, x.peak_ts, x.peak_seq, x.ooms, x.retries,
                     x.empty_cache_calls, x.empty_cache_released);
      return;
    case P::end:
      fmt::format_to(it, "snapshot end live={} peak_freed={} sites={}\n", x.n_live, x.n_freed, x.n_sites);
      return;
    case P::live:
      fmt::format_to(it, "snapshot live count={}\n", x.count);
      for (std::uint32_t i = 0; i < x.count; ++i) {
        const auto e = x.live(i);
        fmt::format_to(it,
                       "  seq={} ts={} device={} kind={} ptr={:#x} requested={} size={} stream={:#x} tid={} "
                       "stack={} flags={}{}\n",
                       e.seq, e.ts, e.device, format::alloc_kind_name(e.kind), e.ptr, e.requested, e.size, e.stream,
                       e.tid, e.stack, flags(e.flags & ~format::kSnapPending),
                       e.flags & format::kSnapPending ? " pending" : "");
      }
      return;
    case P::peak_freed:
      fmt::format_to(it, "snapshot peak_freed count={}\n", x.count);
      for (std::uint32_t i = 0; i < x.count; ++i) {
        const auto e = x.freed(i);
        fmt::format_to(it, "  device={} stack={} requested={} size={}\n", e.device, e.stack, e.requested, e.size);
      }
      return;
    case P::site:
      fmt::format_to(it, "snapshot site count={}\n", x.count);
      for (std::uint32_t i = 0; i < x.count; ++i) {
        const auto e = x.site(i);
        fmt::format_to(it, "  stack={} allocs={} bytes={} allocated={} max_live={}\n", e.stack, e.allocs, e.alloc_bytes,
                       e.alloc_allocated, e.max_live_bytes);
      }
      return;
  }
}

// One record as one line of text.
void format_record(const format::Record& r, fmt::memory_buffer& b) {
  using T = format::RecordType;
  auto it = std::back_inserter(b);
  switch (r.type) {
    case T::process: {
      const auto& p = r.process;
      fmt::format_to(it,
                     "process pid={} ppid={} wall_ns={} mono_ns={} host=\"{}\" cmdline=\"{}\" version=\"{}\" "
                     "exe=\"{}\"\n",
                     p.pid, p.ppid, p.wall_ns, p.mono_ns, printable(p.hostname), printable(p.cmdline),
                     printable(p.version), printable(p.exe));
      break;
    }
    case T::identity:
      fmt::format_to(it, "identity rank={} local_rank={} world_size={} source={}\n", r.identity.rank,
                     r.identity.local_rank, r.identity.world_size, format::rank_source_name(r.identity.source));
      break;
    case T::device:
      fmt::format_to(it, "device device={} total_memory={} name=\"{}\"\n", r.device.device, r.device.total_memory,
                     printable(r.device.name));
      break;
    case T::module:
      fmt::format_to(it, "module base={:#x} lo={:#x} hi={:#x} path=\"{}\" build_id={}\n", r.module.base, r.module.lo,
                     r.module.hi, printable(r.module.path), r.module.build_id.empty() ? "-" : hex(r.module.build_id));
      break;
    case T::module_unload:
      fmt::format_to(it, "module_unload ts={} base={:#x}\n", r.module_unload.ts, r.module_unload.base);
      break;
    case T::stack: {
      fmt::format_to(it, "stack id={} depth={} ips=", r.stack.id, r.stack.depth);
      for (std::size_t i = 0; i < r.stack.depth; ++i) {
        std::uint64_t e = r.stack.ip(i);
        if (format::is_py_frame(e))  // a Python frame: py:CODE_ID@LASTI ("-" when not started)
          fmt::format_to(it, "{}py:{}@{}", i ? "," : "", format::py_frame_code(e),
                         format::py_frame_lasti(e) == format::kPyNoLasti ? std::string("-")
                                                                         : std::to_string(format::py_frame_lasti(e)));
        else fmt::format_to(it, "{}{:#x}", i ? "," : "", e);
      }
      fmt::format_to(it, "\n");
      break;
    }
    case T::alloc: {
      const auto& a = r.alloc;
      fmt::format_to(it,
                     "alloc ts={} device={} kind={} ptr={:#x} requested={} size={} stream={:#x} tid={} stack={} "
                     "flags={}\n",
                     a.ts, a.device, format::alloc_kind_name(a.kind), a.ptr, a.requested, a.size, a.stream, a.tid,
                     a.stack, flags(a.flags));
      break;
    }
    case T::free: {
      const auto& f = r.free;
      fmt::format_to(it, "free ts={} device={} kind={} ptr={:#x} size={} stream={:#x} tid={} stack={} flags={}\n", f.ts,
                     f.device, format::alloc_kind_name(f.kind), f.ptr, f.size, f.stream, f.tid, f.stack,
                     flags(f.flags));
      break;
    }
    case T::free_completed:
      fmt::format_to(it, "free_completed ts={} device={} ptr={:#x} size={}\n", r.free_completed.ts,
                     r.free_completed.device, r.free_completed.ptr, r.free_completed.size);
      break;
    case T::segment_alloc:
    case T::segment_free:
      fmt::format_to(it, "{} ts={} device={} ptr={:#x} size={} flags={}\n",
                     r.type == T::segment_alloc ? "segment_alloc" : "segment_free", r.segment.ts, r.segment.device,
                     r.segment.ptr, r.segment.size, flags(r.segment.flags));
      break;
    case T::oom: {
      const auto& o = r.oom;
      fmt::format_to(it,
                     "oom ts={} device={} kind={} requested={} stream={:#x} tid={} device_free={} device_total={} "
                     "limit={} reserved={} allocated={} largest_free={} stack={}\n",
                     o.ts, o.device, format::alloc_kind_name(o.kind), o.requested, o.stream, o.tid, o.device_free,
                     o.device_total, o.limit, o.reserved, o.allocated, o.largest_free, o.stack);
      break;
    }
    case T::retry:
      fmt::format_to(it, "retry ts={} device={} requested={}\n", r.retry.ts, r.retry.device, r.retry.requested);
      break;
    case T::empty_cache:
      fmt::format_to(it, "empty_cache ts={} device={} reason={} released={}\n", r.empty_cache.ts, r.empty_cache.device,
                     empty_reason(r.empty_cache.reason), r.empty_cache.released);
      break;
    case T::snapshot: format_snapshot(r.snapshot, b); break;
    case T::event_block: break;  // never decoded: the reader expands blocks into their events
    case T::thread: fmt::format_to(it, "thread tid={} name=\"{}\"\n", r.thread.tid, printable(r.thread.name)); break;
    case T::py_code:
      fmt::format_to(it, "py_code id={} python={}.{} firstlineno={} file=\"{}\" name=\"{}\" linetable={}\n",
                     r.py_code.id, r.py_code.py_major, r.py_code.py_minor, r.py_code.firstlineno,
                     printable(r.py_code.filename), printable(r.py_code.name),
                     r.py_code.linetable.empty() ? "-" : hex(r.py_code.linetable));
      break;
    case T::phase: {
      static constexpr const char* kOps[] = {"mark", "push", "pop"};
      static constexpr const char* kSources[] = {"api", "nvtx"};
      fmt::format_to(it, "phase ts={} tid={} op={} source={} name=\"{}\"\n", r.phase.ts, r.phase.tid,
                     kOps[static_cast<int>(r.phase.op)], kSources[static_cast<int>(r.phase.source)],
                     printable(r.phase.name));
      break;
    }
    case T::symbol_string:
      fmt::format_to(it, "symbol_string id={} text=\"{}\"\n", r.symbol_string.id, printable(r.symbol_string.text));
      break;
    case T::symbol_frames: {
      // Each frame: function and file as symbol_string ids (0: unknown), line, innermost first.
      fmt::format_to(it, "symbol_frames ip={:#x} count={} frames=", r.symbol_frames.ip, r.symbol_frames.count);
      for (std::size_t i = 0; i < r.symbol_frames.count; ++i) {
        auto e = r.symbol_frames.entry(i);
        fmt::format_to(it, "{}function={},file={},line={}{}", i ? ";" : "", e.function, e.file, e.line,
                       (e.flags & format::kSymbolInlined) != 0 ? ",inlined" : "");
      }
      fmt::format_to(it, "\n");
      break;
    }
    case T::end:
      fmt::format_to(it, "end ts={} reason={} records={}\n", r.end.ts, end_reason(r.end.reason), r.end.records);
      break;
  }
}

}  // namespace

int dump_trace(const std::string& path, std::FILE* out, bool progress_on) {
  TraceReader rd(path);
  // Not while the dump itself goes to a terminal: the line would land among its lines.
  Progress progress(path, rd.file_size(), progress_on && !::isatty(::fileno(out)));
  format::Record r;
  fmt::memory_buffer b;
  auto flush = [&] {
    std::fwrite(b.data(), 1, b.size(), out);
    b.clear();
  };
  while (rd.next(r)) {
    format_record(r, b);
    if (b.size() > (1u << 16)) flush();
    if ((rd.records() & (Progress::kCheckEvery - 1)) == 0) progress.update(rd.file_pos(), rd.records());
  }
  progress.finish();
  if (rd.cut_mid_record())
    fmt::format_to(std::back_inserter(b), "# truncated: file cut mid-record at byte offset {} after {} records\n",
                   rd.offset(), rd.records());
  if (rd.unwritten_tail())
    fmt::format_to(std::back_inserter(b), "# data ends at byte offset {}: the rest of the file was never written\n",
                   rd.offset());
  if (!rd.has_end())
    fmt::format_to(std::back_inserter(b), "# truncated: no end record after {} records\n", rd.records());
  flush();
  return 0;
}

}  // namespace gpuheap
