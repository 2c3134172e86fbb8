// Test helper: loads a whole trace file (tests/trace_walk.h) and keeps what tests assert on.
#pragma once

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "format/trace.h"
#include "tests/trace_walk.h"

namespace gpuheap::test {

struct TraceFile {
  bool ok = false;         // header valid
  bool truncated = false;  // ended inside a frame
  bool corrupt = false;
  bool has_end = false;
  bool process_first = false;
  std::vector<unsigned char> bytes;
  std::vector<format::AllocRecord> allocs;
  std::vector<format::FreeRecord> frees;
  std::vector<format::SegmentRecord> segments, segment_frees;
  std::vector<format::FreeCompletedRecord> completed;
  std::vector<format::OomRecord> ooms;
  std::vector<format::RetryRecord> retries;
  std::vector<format::EmptyCacheRecord> empty_caches;
  struct Phase {
    format::PhaseOp op;
    format::PhaseSource source;
    std::uint32_t tid;
    std::string name;
  };
  std::vector<Phase> phases;
  std::set<std::uint32_t> stack_ids;
  std::map<std::uint32_t, int> stack_depths;  // frames of each stack record
  std::set<int> devices;
  std::size_t modules = 0, records = 0;
  bool stack_before_use = true;  // every stack id used was defined earlier
  bool device_before_use = true;
  format::ProcessRecord process;
  std::string cmdline;

  std::size_t count_allocs(format::AllocKind k) const {
    std::size_t n = 0;
    for (auto& a : allocs) n += a.kind == k;
    return n;
  }
  std::size_t count_frees(format::AllocKind k) const {
    std::size_t n = 0;
    for (auto& f : frees) n += f.kind == k;
    return n;
  }
};

inline TraceFile load_trace(const std::string& path) {
  TraceFile t;
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return t;
  unsigned char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) t.bytes.insert(t.bytes.end(), buf, buf + n);
  std::fclose(f);
  if (format::decode_file_header(t.bytes.data(), t.bytes.size(), nullptr) != format::HeaderStatus::ok) return t;
  t.ok = true;
  const WalkEnd e = walk_records(t.bytes.data(), t.bytes.size(), format::kFileHeaderSize, [&](const format::Record& r) {
    if (t.records == 0) t.process_first = r.type == format::RecordType::process;
    ++t.records;
    auto use_stack = [&](std::uint32_t id) {
      if (id != 0 && !t.stack_ids.count(id)) t.stack_before_use = false;
    };
    auto use_device = [&](int d) {
      if (d >= 0 && !t.devices.count(d)) t.device_before_use = false;
    };
    switch (r.type) {
      case format::RecordType::process:
        t.process = r.process;
        t.cmdline.assign(r.process.cmdline);
        break;
      case format::RecordType::device: t.devices.insert(r.device.device); break;
      case format::RecordType::module: ++t.modules; break;
      case format::RecordType::stack:
        t.stack_ids.insert(r.stack.id);
        t.stack_depths[r.stack.id] = r.stack.depth;
        break;
      case format::RecordType::alloc:
        use_stack(r.alloc.stack);
        use_device(r.alloc.device);
        t.allocs.push_back(r.alloc);
        break;
      case format::RecordType::free:
        use_stack(r.free.stack);
        t.frees.push_back(r.free);
        break;
      case format::RecordType::segment_alloc: t.segments.push_back(r.segment); break;
      case format::RecordType::segment_free: t.segment_frees.push_back(r.segment); break;
      case format::RecordType::free_completed: t.completed.push_back(r.free_completed); break;
      case format::RecordType::oom: t.ooms.push_back(r.oom); break;
      case format::RecordType::retry: t.retries.push_back(r.retry); break;
      case format::RecordType::empty_cache: t.empty_caches.push_back(r.empty_cache); break;
      case format::RecordType::phase:
        t.phases.push_back({r.phase.op, r.phase.source, r.phase.tid, std::string(r.phase.name)});
        break;
      case format::RecordType::end: t.has_end = true; break;
      default: break;
    }
  });
  t.truncated = e.status == format::FrameStatus::need_more && e.offset < t.bytes.size();
  t.corrupt = e.status == format::FrameStatus::corrupt;
  return t;
}

}  // namespace gpuheap::test
