// The order in which analyze() replays several traces together (analysis.cpp), for every pass
// that must see their records in that same order: the merged category timelines
// (category_timeline.cpp) take each bucket's categories at the moment of the merged
// timeline's maximum, which only the same interleaving of the processes' events reproduces.
// Each trace's records up to its first event go first (its process record among them: the
// clock alignment); then every record by aligned (wall-clock) time, the earliest first, the
// lowest trace index among equal times.
#pragma once

#include <climits>
#include <cstdint>
#include <memory>
#include <vector>

#include "analyzer/trace/reader.h"
#include "analyzer/trace/tables.h"

namespace gpuheap {

// The GPU an event the merge adds to the simultaneous totals is about (alloc, free,
// free_completed, segments); INT32_MIN for any other record (OOM, retry and empty_cache
// records go through Model::feed like the records about no device).
inline int merged_event_device(const format::Record& r) {
  using format::RecordType;
  bool pool_event = r.type == RecordType::alloc || r.type == RecordType::free || r.type == RecordType::free_completed ||
                    r.type == RecordType::segment_alloc || r.type == RecordType::segment_free;
  return pool_event ? event_device(r) : INT32_MIN;
}

class MergeOrder {
 public:
  explicit MergeOrder(std::vector<std::unique_ptr<TraceReader>>& readers) : readers_(readers), st_(readers.size()) {}

  // Hands each trace's records before its first event to early(i, record).
  template <class Early>
  void start(Early&& early) {
    for (std::size_t i = 0; i < st_.size(); ++i) {
      pull(i);
      while (st_[i].have && !merged_type(st_[i].rec.type)) {
        clock(i);
        early(i, st_[i].rec);
        pull(i);
      }
    }
  }

  // The next record by aligned time: its trace `i`, the record (valid until the next call)
  // and its wall-clock time `bw`. False once every trace is read. `ahead(i, record)` sees
  // each record when it is read, the other traces' turns before it is handed out (a pass
  // prefetches what it will look up then).
  bool next(std::size_t& i, const format::Record*& rec, std::uint64_t& bw) {
    return next(i, rec, bw, [](std::size_t, const format::Record&) {});
  }
  template <class Ahead>
  bool next(std::size_t& i, const format::Record*& rec, std::uint64_t& bw, Ahead&& ahead) {
    if (last_ < st_.size()) {
      pull(last_);
      if (st_[last_].have) ahead(last_, st_[last_].rec);
    }
    last_ = SIZE_MAX;
    for (std::size_t k = 0; k < st_.size(); ++k) {
      if (!st_[k].have) continue;
      const std::uint64_t w = st_[k].clock.to_wall(st_[k].last_ts);
      if (last_ == SIZE_MAX || w < bw) last_ = k, bw = w;
    }
    if (last_ == SIZE_MAX) return false;
    clock(last_);
    i = last_, rec = &st_[last_].rec;
    return true;
  }

 private:
  struct Stream {
    format::Record rec;
    bool have = false;
    std::uint64_t last_ts = 0;
    TraceInfo clock;  // wall_ns and mono_ns: those of the process record handed out last
  };

  // The events the merge orders; what comes before a trace's first one goes first.
  static bool merged_type(format::RecordType t) {
    using format::RecordType;
    return t == RecordType::alloc || t == RecordType::free || t == RecordType::segment_alloc ||
           t == RecordType::free_completed || t == RecordType::oom;
  }
  // Records that carry no timestamp are processed as soon as they come up (ts of the last
  // event of that trace), so stacks/modules always precede their first use.
  static std::uint64_t record_ts(const format::Record& r, std::uint64_t last) {
    using format::RecordType;
    switch (r.type) {
      case RecordType::alloc: return r.alloc.ts;
      case RecordType::free: return r.free.ts;
      case RecordType::free_completed: return r.free_completed.ts;
      case RecordType::segment_alloc:
      case RecordType::segment_free: return r.segment.ts;
      case RecordType::oom: return r.oom.ts;
      case RecordType::retry: return r.retry.ts;
      case RecordType::empty_cache: return r.empty_cache.ts;
      case RecordType::module_unload: return r.module_unload.ts;
      case RecordType::end: return r.end.ts;
      case RecordType::process: return r.process.mono_ns;
      default: return last;
    }
  }
  void pull(std::size_t i) {
    st_[i].have = readers_[i]->next(st_[i].rec);
    if (st_[i].have) st_[i].last_ts = record_ts(st_[i].rec, st_[i].last_ts);
  }
  // A process record handed out sets its trace's clock alignment from then on, as it sets
  // Model::info (TraceInfo::to_wall) when it is fed.
  void clock(std::size_t i) {
    if (st_[i].rec.type != format::RecordType::process) return;
    st_[i].clock.wall_ns = st_[i].rec.process.wall_ns, st_[i].clock.mono_ns = st_[i].rec.process.mono_ns;
  }

  std::vector<std::unique_ptr<TraceReader>>& readers_;
  std::vector<Stream> st_;
  std::size_t last_ = SIZE_MAX;  // the stream of the record handed out last (read on by next())
};

}  // namespace gpuheap
