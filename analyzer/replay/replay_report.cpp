// `gpuheap replay`, continued (engine in replay.cpp): policy parsing, the text and JSON
// reports, the policy x limit sweep table and the minimal-limit bisection.
#include <algorithm>
#include <cstdio>
#include <string_view>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/base/units.h"
#include "analyzer/model/fragmentation.h"
#include "analyzer/replay/replay.h"
#include "format/rules.h"

namespace gpuheap {
namespace {

using nlohmann::json;

// The OOM verdict in the words of the summary and the in-process report (format/rules.h):
// the replayed pool's free bytes at the failed request are what fragmentation cost there.
format::OomDiagnosis oom_verdict(const ReplayOom& o, format::OomText* text) {
  format::OomFacts f;
  f.requested = o.requested, f.largest_free = o.largest_free;
  f.cached_unused = o.reserved > o.allocated ? o.reserved - o.allocated : 0;
  const format::OomDiagnosis d = format::diagnose_oom(f);
  format::oom_text(f, d, text);
  return d;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

std::uint64_t positive_size(std::string_view key, std::string_view v) {
  if (key == "round" && v.substr(0, 5) == "pow2:")
    throw UsageError(
        fmt::format("policy key round: takes a SIZE; PyTorch's power-of-two divisions ({}) are not "
                    "modelled by gpuheap's pool",
                    v));
  std::uint64_t n = parse_size(v);
  if (n == 0) throw UsageError(fmt::format("policy key {}: must be more than 0", key));
  return n;
}

json stat_json(const Stat& s) {
  return {{"current", s.current}, {"peak", s.peak}, {"allocated", s.allocated}, {"freed", s.freed}};
}

// "torch:KEY=VALUE,...": PYTORCH_CUDA_ALLOC_CONF's keys that the model follows; the others
// are refused rather than silently ignored.
// Calls f(key, value) for each "KEY=VALUE" of a comma-separated list; `seps` are the
// characters accepted between key and value.
template <typename F>
void for_each_policy_key(const ReplayPolicy& p, std::string_view rest, const char* seps, F&& f) {
  while (!rest.empty()) {
    std::size_t comma = rest.find(',');
    std::string_view kv = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
    std::size_t eq = kv.find_first_of(seps);
    if (eq == std::string_view::npos) throw UsageError(fmt::format("policy '{}': '{}' is not KEY=VALUE", p.name, kv));
    f(trim(kv.substr(0, eq)), trim(kv.substr(eq + 1)));
  }
}

// "torch:KEY=VALUE,..." (PYTORCH_CUDA_ALLOC_CONF also writes KEY:VALUE).
void parse_torch_keys(ReplayPolicy& p, std::string_view rest) {
  TorchConfig& c = p.torch;
  for_each_policy_key(p, rest, "=:", [&](std::string_view k, std::string_view v) {
    if (k == "max_split_size" || k == "max_split_size_mb") {
      std::uint64_t n = k == "max_split_size" ? parse_size(v) : parse_size(std::string(v) + "MiB");
      // PyTorch refuses max_split_size_mb at or below its 20 MiB large segment.
      if (n <= TorchAllocator::kLargeBuffer)
        throw UsageError(fmt::format("policy '{}': max_split_size must be more than 20 MiB (PyTorch's rule)", p.name));
      c.max_split_size = n;
    } else if (k == "roundup_power2_divisions") {
      std::uint64_t n = 0;
      for (char ch : v) {
        if (ch < '0' || ch > '9' || n > 1024) throw UsageError(fmt::format("policy '{}': bad {} '{}'", p.name, k, v));
        n = n * 10 + static_cast<std::uint64_t>(ch - '0');
      }
      if (v.empty() || (n > 1 && (n & (n - 1))))
        throw UsageError(fmt::format("policy '{}': {} must be a power of two", p.name, k));
      c.roundup_power2_divisions = n;
    } else if (k == "expandable_segments") {
      if (v != "false" && v != "False")
        throw UsageError(fmt::format("policy '{}': expandable_segments:True is not modelled", p.name));
    } else {
      throw UsageError(
          fmt::format("policy '{}': unknown or unmodelled key '{}' (known: max_split_size, "
                      "max_split_size_mb, roundup_power2_divisions, expandable_segments=false)",
                      p.name, k));
    }
  });
}

}  // namespace

ReplayPolicy parse_policy(const std::string& text) {
  ReplayPolicy p;
  p.name = std::string(trim(text));
  std::string_view s = p.name;
  if (s == "none") {
    p.kind = ReplayPolicy::Kind::none;
    return p;
  }
  std::string_view head = s.substr(0, s.find(':'));
  if (head == "torch") {
    p.kind = ReplayPolicy::Kind::torch;
    if (head.size() < s.size()) parse_torch_keys(p, s.substr(head.size() + 1));
    return p;
  }
  if (head != "gpuheap")
    throw UsageError(
        fmt::format("unknown policy '{}' (known: gpuheap, gpuheap:KEY=VALUE,..., torch, torch:KEY=VALUE,..., none)",
                    p.name));
  if (head.size() == s.size()) return p;
  std::string_view rest = s.substr(head.size() + 1);
  pool::PoolConfig& c = p.pool;
  for_each_policy_key(p, rest, "=", [&](std::string_view k, std::string_view v) {
    // The keys are PoolConfig's size settings (pool/pool.h).
    if (k == "round") c.round = positive_size(k, v);
    else if (k == "max_split" || k == "max_split_size") c.max_split_size = positive_size(k, v);
    else if (k == "small_max") c.small_max = positive_size(k, v);
    else if (k == "small_segment") c.small_segment = positive_size(k, v);
    else if (k == "medium_max") c.medium_max = positive_size(k, v);
    else if (k == "large_segment") c.large_segment = positive_size(k, v);
    else if (k == "huge_round") c.huge_round = positive_size(k, v);
    else if (k == "large_split_min") c.large_split_min = parse_size(v);
    else
      throw UsageError(
          fmt::format("policy '{}': unknown key '{}' (known: round, max_split, small_max, small_segment, "
                      "medium_max, large_segment, huge_round, large_split_min)",
                      p.name, k));
  });
  return p;
}

std::string replay_text(const ReplayResult& r) {
  std::string s = fmt::format("gpuheap replay: {} under policy {}", r.trace, r.policy);
  s += r.limit ? fmt::format(", limit {} ({} B) per device\n", human_bytes(r.limit), r.limit) : ", no limit\n";
  if (r.truncated) s += "  note: the trace is truncated; replayed what it holds\n";
  for (const auto& d : r.devices) {
    s += fmt::format("device {}{}{}:\n", d.device, d.name.empty() ? "" : " ", d.name);
    auto row = [&](const char* what, std::int64_t v) {
      s += fmt::format("  {:<34} {:>12}  ({} B)\n", what, human_bytes(static_cast<std::uint64_t>(v)), v);
    };
    row("peak reserved", d.reserved.peak);
    if (d.recorded_reserved_peak) row("  recorded peak reserved", static_cast<std::int64_t>(d.recorded_reserved_peak));
    row("peak allocated", d.allocated.peak);
    row("peak requested", d.requested.peak);
    row("non-releasable at peak reserved", static_cast<std::int64_t>(d.non_releasable_at_peak));
    s += "  " + fragmentation_at_peak(d.non_releasable_at_peak, static_cast<std::uint64_t>(d.reserved.peak)) + "\n";
    row("largest free block at peak", static_cast<std::int64_t>(d.largest_free_at_peak));
    s += fmt::format("  {:<34} {:>12}\n", "segments at peak", d.segments_at_peak);
    if (d.retries) s += fmt::format("  {:<34} {:>12}\n", "release-and-retry (OOM path)", d.retries);
    if (d.bypass_allocations) {
      row("not served by torch's allocator", static_cast<std::int64_t>(d.bypass_bytes));
      s += fmt::format(
          "    in {} allocation{} made by libraries themselves (cuBLAS, cuDNN, ...), at most {} at once:\n"
          "    cudaMalloc'd directly, not in the figures above (nor in torch.cuda.max_memory_reserved());\n"
          "    they count toward the limit\n",
          d.bypass_allocations, d.bypass_allocations == 1 ? "" : "s", human_bytes(d.bypass_peak));
    }
  }
  if (r.other_kind_events)
    s += fmt::format(
        "  ({} alloc/free events of other kinds not replayed; their device bytes count toward "
        "the limit)\n",
        r.other_kind_events);
  if (r.unmatched_frees)
    s += fmt::format("  ({} frees of addresses not live in the trace ignored)\n", r.unmatched_frees);
  const ReplayOom& o = r.oom;
  if (o.hit) {
    s += fmt::format(
        "OUT OF MEMORY on device {} at +{} (record {}): {} ({} B) requested, {} reserved, {} allocated, "
        "largest free block {}\n",
        o.device, human_duration_ns(o.ts_ns), o.event_index, human_bytes(o.requested), o.requested,
        human_bytes(o.reserved), human_bytes(o.allocated), human_bytes(o.largest_free));
    format::OomText text;
    oom_verdict(o, &text);
    s += fmt::format("  {}\n", text.fit);
    if (o.frames.empty()) s += o.stack ? fmt::format("  <stack {} not in the trace>\n", o.stack) : "  <no stack>\n";
    for (const auto& f : o.frames) s += "    " + f + "\n";
  } else if (r.limit) {
    s += fmt::format("fits: no allocation fails under the limit\n");
  }
  return s;
}

json replay_json(const ReplayResult& r) {
  json devs = json::array();
  for (const auto& d : r.devices) {
    json j = {{"device", d.device},
              {"name", d.name},
              {"reserved_bytes", stat_json(d.reserved)},
              {"allocated_bytes", stat_json(d.allocated)},
              {"requested_bytes", stat_json(d.requested)},
              {"non_releasable_bytes_at_peak", d.non_releasable_at_peak},
              {"largest_free_block_at_peak", d.largest_free_at_peak},
              {"segments_at_peak", d.segments_at_peak},
              {"peak_held_bytes", d.peak_held},
              {"alloc_retries", d.retries},
              {"bypass_allocations", d.bypass_allocations},
              {"bypass_bytes", d.bypass_bytes},
              {"bypass_peak_bytes", d.bypass_peak}};
    if (d.recorded_reserved_peak) j["recorded_reserved_peak"] = d.recorded_reserved_peak;
    devs.push_back(std::move(j));
  }
  json oom = {{"would_oom", r.oom.hit}};
  if (r.oom.hit) {
    const ReplayOom& o = r.oom;
    format::OomText text;
    oom.update({{"device", o.device},
                {"ts_ns", o.ts_ns},
                {"record", o.event_index},
                {"requested", o.requested},
                {"reserved", o.reserved},
                {"allocated", o.allocated},
                {"largest_free", o.largest_free},
                {"fits_without_fragmentation", oom_verdict(o, &text).fits_without_fragmentation},
                {"stack_id", o.stack},
                {"stack", o.frames}});
  }
  return {{"schema", "gpuheap.replay/1"},
          {"trace", r.trace},
          {"policy", r.policy},
          {"limit", r.limit},
          {"truncated", r.truncated},
          {"events", r.events},
          {"other_kind_events", r.other_kind_events},
          {"unmatched_frees", r.unmatched_frees},
          {"devices", std::move(devs)},
          {"oom", std::move(oom)}};
}

MinLimit find_min_limit(const std::string& path, const ReplayOptions& opt, std::uint64_t granularity) {
  MinLimit m;
  m.granularity = granularity;
  ReplayOptions o = opt;
  o.limit = 0;
  ReplayResult unlimited = replay_trace(path, o);
  ++m.replays;
  std::uint64_t need = 0;
  for (const auto& d : unlimited.devices) need = std::max(need, d.peak_held);
  // Invariant: hi * g fits (the unlimited run never asked for more than its peak held), lo * g
  // does not (lo = 0 means "not tested": a limit of 0 is no limit).
  std::uint64_t hi = (need + granularity - 1) / granularity, lo = 0;
  m.at_limit = std::move(unlimited);
  if (hi == 0) return m;  // nothing device-held: any limit fits
  m.at_limit.limit = hi * granularity;
  while (hi - lo > 1) {
    std::uint64_t mid = lo + (hi - lo) / 2;
    o.limit = mid * granularity;
    ReplayResult t = replay_trace(path, o);
    ++m.replays;
    if (t.oom.hit) {
      lo = mid;
    } else {
      hi = mid;
      m.at_limit = std::move(t);
    }
  }
  m.limit = hi * granularity;
  return m;
}

}  // namespace gpuheap
