// The per-process (per-rank) table and its spread (ranks.h).
#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"
#include "analyzer/summary/ranks.h"

namespace gpuheap {

namespace {

std::uint64_t wall_since_start(const Analysis& a, const TraceInfo& in, std::uint64_t ts) {
  const std::uint64_t w = in.to_wall(ts);
  return w > a.merged_start_wall_ns ? w - a.merged_start_wall_ns : 0;
}

RankRow row_of(const Analysis& a, std::size_t ti, const DeviceState* d) {
  const TraceInfo& in = a.traces[ti]->info;
  RankRow r;
  r.trace = ti, r.rank = in.rank, r.local_rank = in.local_rank, r.world_size = in.world_size;
  r.host = in.hostname, r.pid = in.pid;
  if (!d) return r;
  r.device = d->device;
  r.peak_requested = d->peak_held, r.peak_reserved = d->stat[kReservedBytes][0].peak;
  r.peak_ns = d->peak_held > 0 ? wall_since_start(a, in, d->peak_held_ts) : 0;
  r.leaked_bytes = d->leaked_bytes;
  return r;
}

bool row_before(const RankRow& x, const RankRow& y) {
  if ((x.rank < 0) != (y.rank < 0)) return x.rank >= 0;
  if (x.rank != y.rank) return x.rank < y.rank;
  if (x.rank < 0 && x.trace != y.trace) return x.trace < y.trace;
  if (x.host != y.host) return x.host < y.host;
  if (x.pid != y.pid) return x.pid < y.pid;
  return x.device < y.device;
}

template <class Get>
RankSpread spread(const std::vector<RankRow>& rows, Get get) {
  RankSpread s;
  s.max = s.min = get(rows[0]);
  for (std::size_t i = 1; i < rows.size(); ++i) {
    const std::int64_t v = get(rows[i]);
    if (v > s.max) s.max = v, s.max_row = i;
    if (v < s.min) s.min = v, s.min_row = i;
  }
  return s;
}

std::string bytes(std::int64_t v) { return human_bytes(static_cast<std::uint64_t>(std::max<std::int64_t>(v, 0))); }

std::string spread_text(const char* what, const RankSpread& s, const std::vector<RankRow>& rows, bool hosts) {
  std::string ratio = s.min > 0 ? fmt::format("max/min {:.2f}", s.ratio()) : std::string("max/min unknown (min 0 B)");
  return fmt::format("  {}: max {} at {}, min {} at {}, {}\n", what, bytes(s.max), row_name(rows[s.max_row], hosts),
                     bytes(s.min), row_name(rows[s.min_row], hosts), ratio);
}

// "4 ranks", "3 processes" (some without a rank), "6 GPUs of 3 processes" (a process on two).
std::string spread_over(const std::vector<RankRow>& rows) {
  bool ranked = true;
  for (const auto& r : rows) ranked &= r.rank >= 0;
  std::size_t procs = 0;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    bool seen = false;
    for (std::size_t j = 0; j < i; ++j) seen |= rows[j].trace == rows[i].trace;
    procs += !seen;
  }
  const char* who = ranked ? "ranks" : "processes";
  if (procs == rows.size()) return fmt::format("{} {}", rows.size(), who);
  return fmt::format("{} GPUs of {} {}", rows.size(), procs, who);
}

nlohmann::json spread_json(const RankSpread& s) {
  return {{"max", s.max},
          {"min", s.min},
          {"max_row", s.max_row},
          {"min_row", s.min_row},
          {"max_over_min", s.min > 0 ? nlohmann::json(s.ratio()) : nlohmann::json(nullptr)}};
}

}  // namespace

std::vector<RankRow> rank_rows(const Analysis& a, int device) {
  std::vector<RankRow> rows;
  for (std::size_t ti = 0; ti < a.traces.size(); ++ti) {
    bool any = false;
    for (const auto& d : a.traces[ti]->devices) {
      if (d.device < 0 || (device >= 0 && d.device != device)) continue;  // pinned host memory: no GPU
      rows.push_back(row_of(a, ti, &d));
      any = true;
    }
    if (!any && device < 0) rows.push_back(row_of(a, ti, nullptr));
  }
  std::stable_sort(rows.begin(), rows.end(), row_before);
  return rows;
}

RankSpread peak_requested_spread(const std::vector<RankRow>& rows) {
  return spread(rows, [](const RankRow& r) { return r.peak_requested; });
}
RankSpread peak_reserved_spread(const std::vector<RankRow>& rows) {
  return spread(rows, [](const RankRow& r) { return r.peak_reserved; });
}

std::string row_name(const RankRow& r, bool several_hosts) {
  std::string who = r.rank >= 0 ? fmt::format("rank {}", r.rank) : fmt::format("pid {}", r.pid);
  std::string where = r.device >= 0 ? fmt::format("device {}", r.device) : std::string("no device");
  if (several_hosts) where = fmt::format("host {}, {}", text_safe(r.host), where);
  return fmt::format("{} ({})", who, where);
}

std::string merged_device_name(const Analysis& a, const MergedDevice& md) {
  std::string s = fmt::format("device {}", md.device);
  if (a.several_hosts()) s += fmt::format(" of host {}", text_safe(md.host));
  std::vector<std::int32_t> ranks;
  for (std::size_t ti : md.traces)
    if (a.traces[ti]->info.rank >= 0) ranks.push_back(a.traces[ti]->info.rank);
  if (ranks.empty()) return s;
  std::sort(ranks.begin(), ranks.end());
  return s + fmt::format(" ({} {})", ranks.size() == 1 ? "rank" : "ranks", fmt::join(ranks, ", "));
}

std::string ranks_text(const Analysis& a, int device) {
  if (a.traces.size() < 2) return {};
  const auto rows = rank_rows(a, device);
  if (rows.empty()) return {};
  const bool hosts = a.several_hosts();
  std::string out = fmt::format("Processes: {} traces, times since the earliest start (wall clock)\n", a.traces.size());
  out += fmt::format("  {:>5} {:<16} {:>6} {:>8} {:>14} {:>14} {:>10} {:>12}\n", "rank", "host", "device", "pid",
                     "peak requested", "peak reserved", "peak at", "leaked");
  for (const auto& r : rows)
    out += fmt::format("  {:>5} {:<16} {:>6} {:>8} {:>14} {:>14} {:>10} {:>12}\n",
                       r.rank >= 0 ? std::to_string(r.rank) : "-", text_safe(r.host.empty() ? "?" : r.host),
                       r.device >= 0 ? std::to_string(r.device) : "-", r.pid, bytes(r.peak_requested),
                       bytes(r.peak_reserved), r.peak_requested > 0 ? human_duration_ns(r.peak_ns) : "-",
                       human_bytes(r.leaked_bytes));
  out += fmt::format("Spread across {}:\n", spread_over(rows));
  out += spread_text("peak requested", peak_requested_spread(rows), rows, hosts);
  out += spread_text("peak reserved", peak_reserved_spread(rows), rows, hosts);
  return out + "\n";
}

nlohmann::json ranks_json(const Analysis& a, int device) {
  if (a.traces.size() < 2) return nullptr;
  const auto rows = rank_rows(a, device);
  nlohmann::json jr = nlohmann::json::array();
  auto opt_int = [](std::int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  for (const auto& r : rows)
    jr.push_back({{"process", r.trace},
                  {"rank", opt_int(r.rank)},
                  {"local_rank", opt_int(r.local_rank)},
                  {"world_size", opt_int(r.world_size)},
                  {"host", r.host},
                  {"device", opt_int(r.device)},
                  {"pid", r.pid},
                  {"peak_requested", r.peak_requested},
                  {"peak_reserved", r.peak_reserved},
                  {"peak_ns", r.peak_ns},
                  {"leaked_bytes", r.leaked_bytes}});
  nlohmann::json spread = nullptr;
  if (!rows.empty())
    spread = {{"peak_requested", spread_json(peak_requested_spread(rows))},
              {"peak_reserved", spread_json(peak_reserved_spread(rows))}};
  return {{"rows", std::move(jr)}, {"spread", std::move(spread)}};
}

}  // namespace gpuheap
