#include "analyzer/trace/trace_head.h"

#include <algorithm>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/text_safe.h"
#include "analyzer/trace/reader.h"

namespace gpuheap {

TraceHead read_trace_head(const std::string& path) {
  TraceReader reader(path);
  format::Record r;
  if (!reader.next(r) || r.type != format::RecordType::process) throw NotATraceError(path + ": not a gpuheap trace");
  TraceHead h;
  h.path = path, h.pid = r.process.pid, h.hostname = std::string(r.process.hostname);
  // The preload writes the identity record right after `process` or not at all.
  if (reader.next(r) && r.type == format::RecordType::identity)
    h.rank = r.identity.rank, h.local_rank = r.identity.local_rank, h.world_size = r.identity.world_size;
  return h;
}

namespace {

template <class T>
bool accepts(const std::vector<T>& list, const T& v) {
  return list.empty() || std::find(list.begin(), list.end(), v) != list.end();
}

std::string describe(const TraceHead& h) {
  return fmt::format("pid {} on {}{}", h.pid, text_safe(h.hostname.empty() ? "?" : h.hostname),
                     h.rank >= 0 ? fmt::format(" rank {}", h.rank) : std::string(" (no rank)"));
}

}  // namespace

std::vector<std::string> select_traces(const std::vector<std::string>& paths, const TraceSelection& sel) {
  if (!sel.any()) return paths;
  std::vector<std::string> keep;
  std::string seen;
  for (const auto& p : paths) {
    const TraceHead h = read_trace_head(p);
    if (accepts(sel.pids, std::int64_t{h.pid}) && accepts(sel.ranks, std::int64_t{h.rank}) &&
        accepts(sel.hosts, h.hostname))
      keep.push_back(p);
    seen += fmt::format("{}{}", seen.empty() ? "" : "; ", describe(h));
  }
  if (keep.empty()) {
    std::string what;
    auto add = [&](const char* flag, const auto& list) {
      for (const auto& v : list) what += fmt::format("{}{} {}", what.empty() ? "" : " ", flag, v);
    };
    add("--pid", sel.pids), add("--rank", sel.ranks), add("--host", sel.hosts);
    throw InputError(fmt::format("{}: no trace matches (the traces are of {})", text_safe(what), seen));
  }
  return keep;
}

}  // namespace gpuheap
