// `gpuheap replay` as a command: one replay (text or --json), a --sweep table of policies x
// limits, or --find-min-limit. Engine in replay.cpp, reports in replay_report.cpp.
#include <iostream>
#include <memory>
#include <numeric>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/units.h"
#include "analyzer/cli/cli_options.h"
#include "analyzer/cli/command.h"
#include "analyzer/replay/replay.h"

namespace gpuheap {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::size_t b = 0;
  for (;;) {
    std::size_t e = s.find(sep, b);
    std::string part = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!part.empty()) out.push_back(part);
    if (e == std::string::npos) return out;
    b = e + 1;
  }
}

void print_json(const nlohmann::json& j) {
  std::cout << j.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

// Segment sizes the policy can ask the driver for are multiples of this: the limits that
// matter are too (a limit between two multiples behaves as the lower one when nothing else
// is charged).
std::uint64_t granularity(const ReplayPolicy& p) {
  if (p.kind != ReplayPolicy::Kind::gpuheap) return std::uint64_t{2} << 20;  // none; torch's 2/20 MiB, 2 MiB steps
  return std::gcd(std::gcd(p.pool.small_segment, p.pool.large_segment), p.pool.huge_round);
}

int sweep(const ReplayCli& cli, const std::vector<ReplayPolicy>& policies, const std::vector<std::uint64_t>& limits) {
  nlohmann::json rows = nlohmann::json::array();
  std::string text = fmt::format("{:<40} {:>12} {:>6} {:>14} {:>14} {:>10}  {}\n", "policy", "limit", "device",
                                 "peak reserved", "peak allocated", "frag", "fits");
  for (const auto& p : policies) {
    for (std::uint64_t lim : limits) {
      ReplayOptions o;
      o.policy = p, o.limit = lim;
      ReplayResult r = replay_trace(cli.trace, o);
      for (const auto& d : r.devices) {
        // Fragmentation: the free bytes pinned by live blocks at the reserved peak, as a
        // share of the peak (what empty_cache could not have given back then).
        double share = d.reserved.peak
                           ? static_cast<double>(d.non_releasable_at_peak) / static_cast<double>(d.reserved.peak)
                           : 0.0;
        bool fits = !(r.oom.hit && r.oom.device == d.device);
        const char* verdict = !lim ? "-" : fits ? (r.oom.hit ? "yes (another device fails)" : "yes") : "NO";
        text += fmt::format("{:<40} {:>12} {:>6} {:>14} {:>14} {:>9.1f}%  {}\n", p.name,
                            lim ? human_bytes(lim) : "none", d.device,
                            human_bytes(static_cast<std::uint64_t>(d.reserved.peak)),
                            human_bytes(static_cast<std::uint64_t>(d.allocated.peak)), 100 * share, verdict);
        rows.push_back({{"policy", p.name},
                        {"limit", lim},
                        {"device", d.device},
                        {"peak_reserved", d.reserved.peak},
                        {"peak_allocated", d.allocated.peak},
                        {"non_releasable_at_peak", d.non_releasable_at_peak},
                        // this device / the whole job (another device may be the one that fails)
                        {"fits", lim ? nlohmann::json(fits) : nlohmann::json(nullptr)},
                        {"job_fits", lim ? nlohmann::json(!r.oom.hit) : nlohmann::json(nullptr)}});
      }
    }
  }
  if (cli.json) print_json({{"schema", "gpuheap.replay-sweep/1"}, {"trace", cli.trace}, {"rows", rows}});
  else
    std::cout << text
              << "(frag: non-releasable bytes at the reserved peak / peak reserved; fits: no "
                 "allocation fails under the limit)\n";
  return 0;
}

}  // namespace

int replay_command(const ReplayCli& cli) {
  std::vector<ReplayPolicy> policies;
  // "--sweep all": the three policy families with their defaults.
  std::string list = cli.sweep.empty() ? cli.policy : cli.sweep == "all" ? "gpuheap;torch;none" : cli.sweep;
  for (const auto& p : split(list, ';')) policies.push_back(parse_policy(p));
  if (policies.empty()) throw UsageError("replay: no policy given");
  std::vector<std::uint64_t> limits;
  for (const auto& l : split(cli.limits.empty() ? cli.limit : cli.limits, ',')) limits.push_back(parse_size(l));
  if (limits.empty()) limits.push_back(0);
  if (cli.find_min_limit) {
    if (policies.size() != 1 || !cli.limit.empty() || !cli.limits.empty())
      throw UsageError("replay --find-min-limit: one policy, no --limit/--limits");
    ReplayOptions o;
    o.policy = policies[0];
    MinLimit m = find_min_limit(cli.trace, o, granularity(o.policy));
    if (cli.json) {
      print_json({{"schema", "gpuheap.replay-min-limit/1"},
                  {"trace", cli.trace},
                  {"policy", o.policy.name},
                  {"min_limit", m.limit},
                  {"granularity", m.granularity},
                  {"replays", m.replays},
                  {"includes", "the trace's device allocations: pool segments and other device kinds"},
                  {"excludes", "the CUDA context and memory libraries take without an allocation call"},
                  {"at_min_limit", replay_json(m.at_limit)}});
    } else {
      std::cout << fmt::format(
          "gpuheap replay: {} needs a per-device limit of at least {} ({} B) under policy {} "
          "(to {}; {} replays)\n"
          "  counted: the trace's device allocations (pool segments and the other device kinds); not counted: the "
          "CUDA context and what libraries take without an allocation call (not in the trace; "
          "nvidia-smi shows them): leave room for them\n",
          cli.trace, human_bytes(m.limit), m.limit, o.policy.name, human_bytes(m.granularity), m.replays);
    }
    return 0;
  }
  if (policies.size() > 1 || limits.size() > 1 || !cli.sweep.empty() || !cli.limits.empty())
    return sweep(cli, policies, limits);
  ReplayOptions o;
  o.policy = policies[0], o.limit = limits[0];
  ReplayResult r = replay_trace(cli.trace, o);
  if (cli.json) print_json(replay_json(r));
  else std::cout << replay_text(r);
  if (!cli.quiet)
    std::fprintf(stderr, "gpuheap: replayed %llu events in %.3f s (%.1f M events/s)\n",
                 static_cast<unsigned long long>(r.events), r.seconds,
                 r.seconds > 0 ? static_cast<double>(r.events) / r.seconds / 1e6 : 0.0);
  return r.oom.hit ? 1 : 0;
}

}  // namespace gpuheap

namespace gpuheap::cli {
namespace {

struct ReplayCliOptions {
  ReplayCli replay;
  DebuginfodOptions debuginfod;
};

}  // namespace

// The trace through gpuheap's pool under other policies and limits (analyzer/replay/).
Command add_replay(CLI::App& app, bool& verbose) {
  auto o = std::make_shared<ReplayCliOptions>();
  ReplayCli& rp = o->replay;
  auto* cmd = app.add_subcommand("replay", "What-if: replay a trace through a pool policy and memory limit");
  cmd->add_option("trace", rp.trace, "The trace (raw or .zst)")->required();
  cmd->add_option("--policy", rp.policy,
                  "Pool policy: gpuheap (default), gpuheap:KEY=SIZE,..., torch[:KEY=VALUE,...] (PyTorch's "
                  "caching allocator) or none");
  cmd->add_option("--limit", rp.limit, "Per-device memory limit (SIZE): exit 1 if the job would run out")
      ->check(size_value());
  cmd->add_flag("--json", rp.json, "One JSON document (schema gpuheap.replay/1)");
  cmd->add_option("--sweep", rp.sweep,
                  "Policies separated by ';' (or all = gpuheap;torch;none): one table row per policy x limit");
  cmd->add_option("--limits", rp.limits, "Limits (SIZEs) separated by ',' for the --sweep table")->check(size_list());
  cmd->footer(kSizeRule);
  cmd->add_flag("--find-min-limit", rp.find_min_limit, "Bisect the smallest per-device limit that fits");
  cmd->add_flag("-q,--quiet", rp.quiet, "No events/s line on stderr");
  add_debuginfod(cmd, o->debuginfod);
  add_verbose(cmd, verbose);
  return {cmd, [o] {
            o->debuginfod.apply();
            return replay_command(o->replay);
          }};
}

}  // namespace gpuheap::cli
