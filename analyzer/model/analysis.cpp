#include "analyzer/model/analysis.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <spdlog/spdlog.h>

#include "analyzer/base/progress.h"
#include "analyzer/model/merge_order.h"
#include "analyzer/trace/reader.h"

namespace gpuheap {

namespace {

void warn_trace(const TraceReader& rd, const Model& m) {
  if (rd.shrank())
    spdlog::warn(
        "{}: the file shrank while it was read (from {} to {} bytes): cut at byte {}, using the {} "
        "whole records before it",
        rd.path(), rd.file_size(), rd.file_pos(), rd.offset(), rd.records());
  else if (rd.cut_mid_record())
    spdlog::warn("{}: file cut mid-record at byte {}: using the {} whole records before it", rd.path(), rd.offset(),
                 rd.records());
  if (!rd.has_end())
    spdlog::warn("{}: no end record (the process died or is still running); trace ends at ts {}{}", rd.path(),
                 m.info.last_ts,
                 rd.unwritten_tail() ? fmt::format(", byte {} (the rest is space it never wrote)", rd.offset()) : "");
}

// One trace: the batched replay.
void replay_single(TraceReader& rd, Model& m, Progress& progress) {
  // Events are decoded a batch of kBatch records ahead of the replay (in place, into small
  // EventRecords), and their hash slots prefetched while the batch before is replayed, one
  // record's before each record there: each event's cache misses are in flight kBatch
  // records before it is replayed. A batch ends before any
  // record but alloc/free/free_completed; that record (stacks, modules, segments...) is fed
  // once the batches before it are: those holding views into the reader's buffer must be
  // fed before the next read.
  // One prefetch stage only: a second one half a window later (reading the live entry to
  // prefetch what it points at) stalled on that entry, which had often not arrived 8 or 16
  // records after its prefetch, and cost instructions on every record; without it the
  // replay was no slower.
  constexpr std::size_t kBatch = 16;
  std::vector<format::EventRecord> batches(2 * kBatch);
  format::EventRecord* ahead = batches.data();
  format::EventRecord* behind = ahead + kBatch;
  std::size_t n_behind = 0;
  format::EventRecord e;
  format::Record slow;
  std::uint64_t n = 0, next_progress = Progress::kCheckEvery;
  for (;;) {
    const std::size_t got = rd.next_events(ahead, kBatch);
    m.feed_batch(behind, n_behind, ahead, got);
    std::swap(ahead, behind);
    n_behind = got;
    n += got;
    if (got < kBatch) {
      m.feed_batch(behind, n_behind, nullptr, 0);
      n_behind = 0;
      auto one = rd.next_any(e, slow);
      if (one == TraceReader::Got::none) break;
      if (one == TraceReader::Got::event) m.feed(e);
      else m.feed(slow);
      ++n;
    }
    if (n >= next_progress) {
      progress.update(rd.file_pos(), n);
      next_progress = n + Progress::kCheckEvery;
    }
  }
}

// The simultaneous totals of one device (of one host) across the merged traces, created on
// first use.
MergedDevice& merged_device(Analysis& out, const std::string& host, int device, const AnalyzeOptions& opt) {
  for (auto& m : out.merged)
    if (m.device == device && m.host == host) return m;
  out.merged.push_back({});
  out.merged.back().host = host;
  out.merged.back().device = device;
  out.merged.back().timeline = Timeline{opt.timeline_buckets};
  return out.merged.back();
}

// Feeds one event of a device to its trace's model and adds what it changed to the merged
// totals at aligned time bw.
void feed_merged_event(Analysis& out, Model& m, const format::Record& rec, int device, std::uint64_t bw,
                       const AnalyzeOptions& opt) {
  auto before = m.totals(device);
  m.feed(rec);
  auto after = m.totals(device);
  auto& md = merged_device(out, m.info.hostname, device, opt);
  if (after.requested != before.requested) md.requested.add(after.requested - before.requested);
  if (after.reserved != before.reserved) md.reserved.add(after.reserved - before.reserved);
  if (after.allocated != before.allocated) {
    md.allocated.add(after.allocated - before.allocated);
    if (md.allocated.current == md.allocated.peak && after.allocated > before.allocated) md.peak_allocated_wall_ns = bw;
  }
  md.timeline.sample(bw - std::min(bw, out.merged_start_wall_ns), md.requested.current, md.allocated.current,
                     md.reserved.current);
}

// The process exited: the driver frees everything it still held (its cache, its leaks), so it
// leaves the simultaneous totals. Without an end record (killed, or still running) nothing is
// known, and its memory stays counted.
void release_at_end(Analysis& out, const Model& m, std::uint64_t bw, std::size_t trace) {
  for (auto& md : out.merged) {
    if (md.host != m.info.hostname) continue;
    auto left = m.totals(md.device);
    if (!left.requested && !left.allocated && !left.reserved) continue;
    md.released_at_end.push_back(trace);
    md.requested.add(-left.requested);
    md.allocated.add(-left.allocated);
    md.reserved.add(-left.reserved);
    md.timeline.sample(bw - std::min(bw, out.merged_start_wall_ns), md.requested.current, md.allocated.current,
                       md.reserved.current);
  }
}

// Several traces: k-way merge by aligned (wall-clock) time (merge_order.h).
void replay_merged(std::vector<std::unique_ptr<TraceReader>>& readers, Analysis& out, const AnalyzeOptions& opt,
                   Progress& progress) {
  MergeOrder order(readers);
  // The process record comes first; fed here so the clock alignment is known.
  order.start([&](std::size_t i, const format::Record& r) { out.traces[i]->feed(r); });
  out.merged_start_wall_ns = UINT64_MAX;
  for (auto& t : out.traces) out.merged_start_wall_ns = std::min(out.merged_start_wall_ns, t->info.wall_ns);
  std::uint64_t n = 0, bw = 0;
  std::size_t best = 0;
  const format::Record* rec = nullptr;
  while (order.next(best, rec, bw)) {
    auto& m = *out.traces[best];
    int device = merged_event_device(*rec);
    if (device != INT32_MIN) {
      feed_merged_event(out, m, *rec, device, bw, opt);
    } else {
      m.feed(*rec);
      if (rec->type == format::RecordType::end) release_at_end(out, m, bw, best);
    }
    if ((++n & (Progress::kCheckEvery - 1)) == 0 && progress.active()) {
      std::uint64_t done = 0;
      for (auto& r : readers) done += r->file_pos();
      progress.update(done, n);
    }
  }
}

}  // namespace

Analysis analyze(const std::vector<std::string>& paths, const AnalyzeOptions& opt) {
  Analysis out;
  std::vector<std::unique_ptr<TraceReader>> readers;
  for (const auto& p : paths) {
    readers.push_back(std::make_unique<TraceReader>(p));
    out.traces.push_back(std::make_unique<Model>(p, opt.timeline_buckets));
    if (out.traces.size() <= opt.windows.size()) out.traces.back()->set_window(opt.windows[out.traces.size() - 1]);
  }
  std::uint64_t total = 0;
  for (auto& r : readers) total += r->file_size();
  Progress progress(paths.size() == 1 ? paths[0] : fmt::format("{} traces", paths.size()), total, opt.progress);

  if (readers.size() == 1) replay_single(*readers[0], *out.traces[0], progress);
  else replay_merged(readers, out, opt, progress);
  progress.finish();  // before any warning, so that none lands on the progress line
  for (std::size_t i = 0; i < readers.size(); ++i) {
    auto& rd = *readers[i];
    auto& m = *out.traces[i];
    m.finish(rd.cut_mid_record(), rd.has_end(), rd.records());
    if (opt.warn_truncated) warn_trace(rd, m);
  }
  for (auto& md : out.merged) {
    for (std::size_t ti = 0; ti < out.traces.size(); ++ti) {
      const auto& t = out.traces[ti];
      if (t->info.hostname != md.host) continue;
      for (auto& d : t->devices)
        if (d.device == md.device) {
          md.sum_of_peaks_allocated += d.stat[kAllocatedBytes][0].peak;
          md.sum_of_peaks_reserved += d.stat[kReservedBytes][0].peak;
          md.traces.push_back(ti);
        }
    }
  }
  std::sort(out.merged.begin(), out.merged.end(), [](const MergedDevice& a, const MergedDevice& b) {
    return a.host != b.host ? a.host < b.host : a.device < b.device;
  });
  return out;
}

bool Analysis::several_hosts() const {
  for (const auto& t : traces)
    if (t->info.hostname != traces[0]->info.hostname) return true;
  return false;
}

}  // namespace gpuheap
