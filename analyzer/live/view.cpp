// `gpuheap top`'s JSON and text lines, and the loop that prints them (view.h).
#include "analyzer/live/view.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>

#include "analyzer/base/units.h"
#include "analyzer/summary/report.h"  // category_totals_json

namespace gpuheap::live {

namespace {

nlohmann::json stat_json(const Stat& s) { return {{"current", s.current}, {"peak", s.peak}}; }

// The steps seen on a device: a step's growth is the requested bytes at the start of the
// next step minus those at its own start (known once the next one started).
nlohmann::json steps_json(const DeviceNow& d) {
  nlohmann::json out = nlohmann::json::array();
  for (std::size_t i = 0; i < d.step_starts.size(); ++i) {
    nlohmann::json j = {{"step", d.step_starts[i].first}, {"start_requested", d.step_starts[i].second}};
    j["growth"] = i + 1 < d.step_starts.size() ? nlohmann::json(d.step_starts[i + 1].second - d.step_starts[i].second)
                                               : nlohmann::json(nullptr);
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json process_json(const ProcessNow& p, std::size_t top) {
  nlohmann::json devs = nlohmann::json::array();
  for (const auto& d : p.devices)
    devs.push_back({{"device", d.device},
                    {"name", d.name},
                    {"total_memory", d.total_memory},
                    {"requested_bytes", stat_json(d.requested)},
                    {"allocated_bytes", stat_json(d.allocated)},
                    {"reserved_bytes", stat_json(d.reserved)},
                    {"num_ooms", d.ooms},
                    {"num_alloc_retries", d.retries},
                    {"peak_held", {{"bytes", d.peak_held}, {"allocated_bytes", d.peak_held_allocated}}},
                    {"steps", steps_json(d)},
                    {"categories", category_totals_json(d.categories)}});
  nlohmann::json sites = nlohmann::json::array();
  for (const auto& s : group_sites(p.sites, Group::line, Sort::bytes, top))
    sites.push_back({{"label", s.line},
                     {"function", s.function},
                     {"category", s.category},
                     {"bytes", s.bytes},
                     {"count", s.count},
                     {"growth", s.growth}});
  nlohmann::json j = {{"pid", p.pid},        {"host", p.host},  {"trace", p.trace},   {"state", p.state},
                      {"phase", p.phase},    {"devices", devs}, {"top_sites", sites}, {"growth_since", p.growth_since},
                      {"records", p.records}};
  j["step"] = p.step_name.empty()
                  ? nlohmann::json(nullptr)
                  : nlohmann::json{{"name", p.step_name}, {"number", p.step_known ? nlohmann::json(p.step) : nullptr}};
  j["categories_are"] = p.categories_are;
  j["training_found"] = p.training_found;
  return j;
}

}  // namespace

std::string categories_line(const CategoryBytes& c) {
  std::string out;
  for (std::size_t i = 0; i < kNumCategories; ++i)
    if (c.count[i])
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ", category_name(static_cast<Category>(i)),
                         human_bytes(c.bytes[i]));
  return out;
}

nlohmann::json snapshot_json(const Snapshot& s, std::size_t top, bool final_line) {
  nlohmann::json procs = nlohmann::json::array();
  for (const auto& p : s.processes) procs.push_back(process_json(p, top));
  nlohmann::json j = {{"schema", "gpuheap.top/1"},
                      {"refresh", s.refresh},
                      {"elapsed_s", static_cast<double>(static_cast<std::int64_t>(s.elapsed_s * 1000)) / 1000},
                      {"state", s.ended ? "ended" : "running"},
                      {"processes", std::move(procs)},
                      {"notes", s.notes}};
  if (!s.waiting.empty()) j["waiting"] = s.waiting;
  if (final_line) j["message"] = "process ended";
  return j;
}

std::string snapshot_text(const Snapshot& s, std::size_t top) {
  std::string out;
  if (!s.waiting.empty()) out += fmt::format("[{:.1f}s] {}\n", s.elapsed_s, s.waiting);
  for (const auto& p : s.processes) {
    std::string step = p.step_name.empty() ? ""
                       : p.step_known      ? fmt::format(" step {} ({})", p.step, p.step_name)
                                           : fmt::format(" step ? ({})", p.step_name);
    std::string phase = p.phase.empty() ? "" : " phase " + p.phase;
    for (const auto& d : p.devices)
      out += fmt::format(
          "[{:.1f}s] pid {} {} device {}: requested {} (peak {}) allocated {} (peak {}) reserved {} "
          "(peak {}) ooms {} retries {}{}{}\n",
          s.elapsed_s, p.pid, p.state, d.device, human_bytes(d.requested.current), human_bytes(d.requested.peak),
          human_bytes(d.allocated.current), human_bytes(d.allocated.peak), human_bytes(d.reserved.current),
          human_bytes(d.reserved.peak), d.ooms, d.retries, step, phase);
    for (const auto& d : p.devices)
      if (d.categories.total())
        out += fmt::format("  device {} by category ({}): {}\n", d.device, p.categories_are,
                           categories_line(d.categories));
    for (const auto& x : group_sites(p.sites, Group::line, Sort::bytes, top))
      out += fmt::format("  {:>10} x{:<5} {:>11}  {}\n", human_bytes(x.bytes), x.count,
                         (x.growth < 0 ? "-" : "+") + human_bytes(static_cast<std::uint64_t>(std::abs(x.growth))),
                         x.line);
  }
  for (const auto& n : s.notes) out += "  note: " + n + "\n";
  return out;
}

int run_view(Job& job, const ViewOptions& opt) {
  if (!opt.json && !opt.once && ::isatty(STDOUT_FILENO)) return run_curses(job, opt);
  const auto period = std::chrono::duration<double>(opt.interval);
  auto next = std::chrono::steady_clock::now();
  for (;;) {
    if (opt.tick) opt.tick();
    job.refresh();
    Snapshot s = job.snapshot();
    const bool last = s.ended || opt.once;
    const std::string line = opt.json ? snapshot_json(s, opt.top, s.ended)
                                                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
                                            "\n"
                                      : snapshot_text(s, opt.top);
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
    if (s.ended) std::fprintf(stderr, "gpuheap top: process ended\n");
    if (last) return 0;
    next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
    const auto now = std::chrono::steady_clock::now();
    if (next < now) next = now;
    std::this_thread::sleep_until(next);
  }
}

}  // namespace gpuheap::live
