// `gpuheap diff` end to end: the per-device totals (text and --json, against the two traces'
// own summary --json numbers), the --fail-on gate's exit codes around the tolerance, growth
// from 0 bytes, and incomplete traces.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "analyzer/base/units.h"
#include "analyzer/summary/check.h"
#include "analyzer/summary/report.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;
using nlohmann::json;

namespace {

constexpr std::uint64_t MiB = 1u << 20;

Result sh(const std::string& args) { return run(std::string(GPUHEAP_CLI) + " " + args); }
// stdout only (diff --json writes its gate lines to stderr)
Result sh_out(const std::string& args) { return run("(" + std::string(GPUHEAP_CLI) + " " + args + " 2>/dev/null)"); }

std::size_t count_of(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// A pooled block of `pooled` bytes in a 20 MiB segment (freed), then `small` requested bytes
// in a 2 MiB small segment (freed), then a pass-through allocation of `leak` bytes left live.
TraceBuilder job(std::uint64_t pooled, std::uint64_t small, std::uint64_t leak, bool end = true) {
  TraceBuilder b;
  b.stack(1, {0x401000, 0x402000});
  b.stack(2, {0x401800, 0x402000});
  b.segment(0x7f0000000000ull, 20 * MiB, false);
  b.alloc(0x7f0000000000ull, pooled, pooled, 1);
  if (small) {
    b.segment(0x7f1000000000ull, 2 * MiB, true);
    b.alloc(0x7f1000000000ull, small, (small + 511) / 512 * 512, 2, AllocKind::device_pooled, format::kFlagSmallPool);
  }
  if (leak) b.alloc(0x1000000, leak, leak, 2, AllocKind::device_passthrough);
  b.free(0x7f0000000000ull);
  b.completed(0x7f0000000000ull);
  if (small) {
    b.free(0x7f1000000000ull);
    b.completed(0x7f1000000000ull);
  }
  if (end) b.end();
  return b;
}

// A job whose only allocation is a pass-through one of `bytes`: requested = allocated =
// reserved = bytes, freed (leaked 0).
TraceBuilder plain(std::uint64_t bytes, int device = 0) {
  TraceBuilder b;
  if (device != 0) b.put(format::DeviceRecord{device, 16ull << 30, "Test GPU"});
  b.stack(1, {0x401000});
  b.alloc(0x1000000, bytes, bytes, 1, AllocKind::device_passthrough, 0, 1, device);
  b.free(0x1000000, AllocKind::device_passthrough, 1, device);
  b.end();
  return b;
}

std::string pct(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%+.1f%%", p);
  return buf;
}

std::string line_of(const std::string& out, const std::string& start) {
  auto at = out.find("\n" + start);
  if (at == std::string::npos) return {};
  auto end = out.find('\n', at + 1);
  return out.substr(at + 1, end - at - 1);
}

}  // namespace

TEST(Diff, TotalsPerDeviceComeBeforeTheSiteTable) {
  auto a = job(3 * MiB, 0, 1 * MiB).write("diff_ta.gh");
  auto b = job(5 * MiB, 1000, 1 * MiB).write("diff_tb.gh");
  auto r = sh("diff " + a + " " + b);
  ASSERT_EQ(r.code, 0) << r.out;
  auto totals = r.out.find("gpuheap diff totals: A = " + a);
  auto sites = r.out.find("Per-site change");
  ASSERT_NE(totals, std::string::npos) << r.out;
  ASSERT_NE(sites, std::string::npos) << r.out;
  EXPECT_LT(totals, sites);
  EXPECT_NE(r.out.find("  device 0 "), std::string::npos) << r.out;
  // A: 3 MiB pooled + 1 MiB pass-through at once; reserved 20 MiB segment + 1 MiB.
  // B: 5 MiB + 1000 B (1024 B block) + 1 MiB; reserved 20 + 2 + 1 MiB.
  const std::int64_t req_a = 4 * MiB, req_b = 6 * MiB + 1000, res_a = 21 * MiB, res_b = 23 * MiB;
  auto req = line_of(r.out, "    peak requested");
  EXPECT_NE(req.find(human_bytes(req_a)), std::string::npos) << req;
  EXPECT_NE(req.find(human_bytes(req_b)), std::string::npos) << req;
  EXPECT_NE(req.find("+" + human_bytes(req_b - req_a)), std::string::npos) << req;
  EXPECT_NE(req.find(pct(100.0 * static_cast<double>(req_b - req_a) / static_cast<double>(req_a))), std::string::npos)
      << req;
  auto res = line_of(r.out, "    peak reserved");
  EXPECT_NE(res.find(human_bytes(res_a)), std::string::npos) << res;
  EXPECT_NE(res.find(pct(100.0 * static_cast<double>(res_b - res_a) / static_cast<double>(res_a))), std::string::npos)
      << res;
  auto leaked = line_of(r.out, "    leaked at end");
  EXPECT_NE(leaked.find("+0.0%"), std::string::npos) << leaked;
  auto count = line_of(r.out, "    allocations");
  EXPECT_NE(count.find(" 2 "), std::string::npos) << count;
  EXPECT_NE(count.find(" 3 "), std::string::npos) << count;
  EXPECT_NE(count.find("+1 "), std::string::npos) << count;
  EXPECT_NE(count.find("+50.0%"), std::string::npos) << count;
  // Without --fail-on: no gate lines, exit 0 whatever grew.
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

TEST(Diff, JsonMatchesTheTwoSummaries) {
  auto a = job(3 * MiB, 0, 1 * MiB).write("diff_ja.gh");
  auto b = job(5 * MiB, 1000, 2 * MiB).write("diff_jb.gh");
  auto d = sh_out("diff --json " + a + " " + b);
  ASSERT_EQ(d.code, 0) << d.out;
  json doc = json::parse(d.out);
  json sa = json::parse(sh_out("summary --json " + a).out), sb = json::parse(sh_out("summary --json " + b).out);
  EXPECT_EQ(doc["schema"], "gpuheap.diff/1");
  EXPECT_EQ(doc["a"]["path"], a);
  EXPECT_EQ(doc["b"]["path"], b);
  ASSERT_EQ(doc["devices"].size(), 1u);
  const json& dev = doc["devices"][0];
  EXPECT_EQ(dev["device"], 0);
  const std::pair<const char*, const char*> peaks[] = {{"requested", "requested_bytes"},
                                                       {"allocated", "allocated_bytes"},
                                                       {"reserved", "reserved_bytes"}};
  for (auto [ours, theirs] : peaks) {
    EXPECT_EQ(dev[ours]["a"], sa["devices"][0][theirs]["peak"]) << ours;
    EXPECT_EQ(dev[ours]["b"], sb["devices"][0][theirs]["peak"]) << ours;
    EXPECT_EQ(dev[ours]["delta"].get<std::int64_t>(),
              dev[ours]["b"].get<std::int64_t>() - dev[ours]["a"].get<std::int64_t>());
  }
  EXPECT_EQ(dev["leaked"]["a"], sa["leaked_bytes"]);
  EXPECT_EQ(dev["leaked"]["b"], sb["leaked_bytes"]);
  EXPECT_EQ(dev["leaked"]["a"], 1 * MiB);
  EXPECT_DOUBLE_EQ(dev["leaked"]["change_pct"].get<double>(), 100.0);
  EXPECT_EQ(dev["count"]["a"], sa["devices"][0]["allocations"]["allocated"]);
  EXPECT_EQ(dev["count"]["b"], sb["devices"][0]["allocations"]["allocated"]);
  // Sites: named as summary --json names them (stack frames), with A/B/delta.
  ASSERT_FALSE(doc["sites"].empty());
  json site2;
  for (const auto& s : doc["sites"])
    if (s["count"]["a"] == 1 && s["count"]["b"] == 2) site2 = s;
  ASSERT_FALSE(site2.is_null()) << doc["sites"].dump();
  EXPECT_EQ(site2["total_bytes"]["a"], 1 * MiB);
  EXPECT_EQ(site2["total_bytes"]["b"], 2 * MiB + 1000);
  EXPECT_EQ(site2["total_bytes"]["delta"], 1 * MiB + 1000);
  bool named = false;
  for (const auto& s : sb["most_allocations"])
    if (s["stack"] == site2["stack"]) {
      named = true;
      EXPECT_EQ(s["count"], 2);
    }
  EXPECT_TRUE(named) << site2.dump() << "\n" << sb["most_allocations"].dump();
  EXPECT_EQ(doc["verdict"]["gated"], false);
  EXPECT_EQ(doc["verdict"]["passed"], true);
}

TEST(Diff, FailOnAroundTheTolerance) {
  auto a = plain(100 * MiB).write("diff_fa.gh");
  auto b5 = plain(105 * MiB).write("diff_fb5.gh");  // +5.0%
  auto b6 = plain(106 * MiB).write("diff_fb6.gh");  // +6.0%
  auto r = sh("diff --fail-on reserved,leaked " + a + " " + b5);
  EXPECT_EQ(r.code, 0) << r.out;  // exactly the default 5% is allowed
  EXPECT_NE(r.out.find("gpuheap diff: ok: no growth of reserved,leaked beyond --tolerance 5%"), std::string::npos)
      << r.out;
  r = sh("diff --fail-on reserved,leaked " + a + " " + b6);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("gpuheap diff: FAIL: reserved on device 0: A 100 MiB (104857600 B) -> B 106 MiB "
                       "(111149056 B), +6.0% exceeds --tolerance 5%"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(count_of(r.out, "FAIL:"), 1u) << r.out;  // one FAIL line: leaked did not grow
  EXPECT_EQ(r.out.find("ok:"), std::string::npos) << r.out;
  // Each of the peaks is gated on its own; count did not change.
  EXPECT_EQ(sh("diff --fail-on requested " + a + " " + b6).code, 1);
  EXPECT_EQ(sh("diff --fail-on allocated --fail-on count " + a + " " + b6).code, 1);
  EXPECT_EQ(sh("diff --fail-on count " + a + " " + b6).code, 0);
  EXPECT_EQ(sh("diff --fail-on reserved --tolerance 6 " + a + " " + b6).code, 0);
  EXPECT_EQ(sh("diff --fail-on reserved --tolerance 5.9 " + a + " " + b6).code, 1);
  EXPECT_EQ(sh("diff --fail-on reserved --tolerance 0 " + a + " " + a).code, 0);
  // The absolute slack: growth up to it never fails.
  EXPECT_EQ(sh("diff --fail-on reserved --tolerance-bytes 6MiB " + a + " " + b6).code, 0);
  EXPECT_EQ(sh("diff --fail-on reserved --tolerance-bytes 5MiB " + a + " " + b6).code, 1);
  // The byte slack does not excuse a growing allocation count (1 -> 3 allocations is +200%).
  TraceBuilder three;
  three.stack(1, {0x401000});
  for (std::uint64_t i = 0; i < 3; ++i) {
    three.alloc(0x1000000 + i * 0x100000, 1024, 1024, 1, AllocKind::device_passthrough, 0, 1, 0);
    three.free(0x1000000 + i * 0x100000, AllocKind::device_passthrough, 1, 0);
  }
  three.end();
  auto c3 = three.write("diff_fc3.gh");
  r = sh("diff --fail-on count --tolerance-bytes 64KiB " + a + " " + c3);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL: count on device 0"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("exceeds --tolerance 5% and --tolerance-bytes"), std::string::npos) << r.out;
  // Shrinking never fails; without --fail-on diff exits 0.
  EXPECT_EQ(sh("diff --fail-on reserved,requested,allocated,leaked,count --tolerance 0 " + b6 + " " + a).code, 0);
  EXPECT_EQ(sh("diff " + a + " " + b6).code, 0);
  // --json: the verdict in the document, the same exit code, stdout still one document.
  auto j = sh_out("diff --json --fail-on reserved " + a + " " + b6);
  EXPECT_EQ(j.code, 1);
  json doc = json::parse(j.out);
  EXPECT_EQ(doc["verdict"]["passed"], false);
  ASSERT_EQ(doc["verdict"]["breaches"].size(), 1u);
  EXPECT_EQ(doc["verdict"]["breaches"][0]["metric"], "reserved");
  EXPECT_EQ(doc["verdict"]["breaches"][0]["b"], 106 * MiB);
  EXPECT_DOUBLE_EQ(doc["verdict"]["breaches"][0]["change_pct"].get<double>(), 6.0);
}

TEST(Diff, GrowthFromZeroIsInfinite) {
  auto a = job(3 * MiB, 0, 0).write("diff_za.gh");     // nothing leaked
  auto b = job(3 * MiB, 0, 4096).write("diff_zb.gh");  // 4 KiB leaked
  auto r = sh("diff --fail-on leaked --tolerance 1000000 " + a + " " + b);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL: leaked on device 0: A 0 B (0 B) -> B 4.00 KiB (4096 B), +inf%"), std::string::npos)
      << r.out;
  EXPECT_NE(line_of(r.out, "    leaked at end").find("+inf%"), std::string::npos) << r.out;
  EXPECT_EQ(sh("diff --fail-on leaked --tolerance-bytes 4KiB " + a + " " + b).code, 0);
  auto j = json::parse(sh_out("diff --json " + a + " " + b).out);
  EXPECT_TRUE(j["devices"][0]["leaked"]["change_pct"].is_null());
  // A device only B used: every metric grows from 0 there.
  auto c = plain(1 * MiB, 1).write("diff_zc.gh");
  r = sh("diff --fail-on count " + a + " " + c);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("device 1 (only in B)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("FAIL: count on device 1: A 0 -> B 1, +inf%"), std::string::npos) << r.out;
}

TEST(Diff, IncompleteTraceFailsTheGateUnlessAllowed) {
  auto a = job(3 * MiB, 0, 0).write("diff_ia.gh");
  auto b = job(3 * MiB, 0, 0, /*end=*/false).write("diff_ib.gh");
  auto r = sh("diff --fail-on reserved " + a + " " + b);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL: " + b + " is incomplete (no end record"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("ok:"), std::string::npos) << r.out;
  r = sh("diff --fail-on reserved --allow-truncated " + a + " " + b);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("note: " + b + " is incomplete"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ok: no growth of reserved"), std::string::npos) << r.out;
  // Not a gate without --fail-on: diff shows what the trace holds, exit 0 as before.
  EXPECT_EQ(sh("diff " + a + " " + b).code, 0);
  auto j = sh_out("diff --json --fail-on reserved " + b + " " + a);
  EXPECT_EQ(j.code, 1);
  EXPECT_EQ(json::parse(j.out)["verdict"]["incomplete"].size(), 1u);
}

TEST(Diff, BadGateOptionsAreUsageErrors) {
  auto a = plain(MiB).write("diff_ua.gh");
  for (const char* opt : {"--fail-on bogus", "--fail-on reserved,bogus", "--fail-on reserved --tolerance nan",
                          "--fail-on reserved --tolerance -1", "--fail-on reserved --tolerance inf",
                          "--fail-on reserved --tolerance-bytes 12XB"}) {
    auto r = sh(std::string("diff ") + opt + " " + a + " " + a);
    EXPECT_EQ(r.code, 2) << opt << "\n" << r.out;
    EXPECT_EQ(r.out.find("ok"), std::string::npos) << opt << "\n" << r.out;
  }
}

namespace {

// A site of a symbolized trace: (function, line) per frame in model.cpp, innermost first,
// with one pass-through allocation of `bytes` (freed at the end).
struct SymSite {
  std::vector<std::pair<std::string, std::uint32_t>> frames;
  std::uint64_t bytes;
};

// The trace's own symbol records name every frame (as `gpuheap symbolize` writes them), so
// two traces can differ in exactly the lines of their sites.
TraceBuilder sym_job(const std::vector<SymSite>& sites) {
  TraceBuilder b;
  std::map<std::string, std::uint32_t> ids{{"model.cpp", 1}};
  b.put(format::SymbolStringRecord{1, "model.cpp"});
  for (const auto& s : sites)
    for (const auto& [fn, line] : s.frames)
      if (ids.emplace(fn, static_cast<std::uint32_t>(ids.size() + 1)).second)
        b.put(format::SymbolStringRecord{ids[fn], fn});
  std::uint64_t ip = 0x401000, addr = 0x1000000;
  for (std::uint32_t id = 1; id <= sites.size(); ++id) {
    std::vector<std::uint64_t> stack;
    for (const auto& [fn, line] : sites[id - 1].frames) {
      format::SymbolFrameEntry e{ids[fn], 1, line, 0};
      unsigned char buf[256];
      auto n = format::encode_symbol_frames(buf, sizeof buf, ip, &e, 1);
      b.data.insert(b.data.end(), buf, buf + n);
      stack.push_back(ip);
      ip += 0x100;
    }
    b.stack(id, stack);
  }
  for (std::uint32_t id = 1; id <= sites.size(); ++id, addr += 0x10000000)
    b.alloc(addr, sites[id - 1].bytes, sites[id - 1].bytes, id, AllocKind::device_passthrough);
  addr = 0x1000000;
  for (std::size_t i = 0; i < sites.size(); ++i, addr += 0x10000000) b.free(addr, AllocKind::device_passthrough);
  b.end();
  return b;
}

// The weights (32 MiB) and activations (16 MiB) of a model, called from main; `shift` lines
// inserted above every allocation and call.
std::vector<SymSite> model_sites(std::uint32_t shift, std::uint64_t acts = 16 * MiB) {
  return {{{{"make_weights(int)", 10 + shift}, {"main", 40 + shift}}, 32 * MiB},
          {{{"make_acts(int)", 20 + shift}, {"main", 41 + shift}}, acts}};
}

}  // namespace

// One line inserted above every site: the same sites, moved, not two sites gone and two new
// ones of the same size (before: "#1 peak -32.0 MiB (32.0 MiB -> 0 B)" and "#2 peak +32.0 MiB").
TEST(Diff, SitesWhoseLinesMovedAreTheSameSites) {
  auto a = analyze_one(sym_job(model_sites(0)), "diff_mv_a.gh");
  auto b = analyze_one(sym_job(model_sites(1)), "diff_mv_b.gh");
  auto rows = diff_sites(*a.traces[0], *b.traces[0], false);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    EXPECT_FALSE(r.changed()) << r.key << " -> " << r.key_b;
    ASSERT_EQ(r.moved.size(), 2u) << r.key;  // the allocating function and main
    EXPECT_EQ(r.moved[0].line_b, r.moved[0].line_a + 1);
  }
  auto text = diff_text(rows, 10, *a.traces[0], *b.traces[0]);
  EXPECT_NE(text.find("  no differences\n"), std::string::npos) << text;
  EXPECT_NE(text.find("2 more site(s) moved"), std::string::npos) << text;
  EXPECT_EQ(text.find("32.0 MiB"), std::string::npos) << text;
}

// A moved site whose bytes grew is one row: its growth, and the lines it moved from and to.
TEST(Diff, MovedSiteThatGrewIsOneRow) {
  auto a = sym_job(model_sites(0)).write("diff_mg_a.gh");
  auto b = sym_job(model_sites(3, 20 * MiB)).write("diff_mg_b.gh");
  auto r = sh("diff " + a + " " + b);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("#1  peak +4.00 MiB (16.0 MiB -> 20.0 MiB)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("moved: model.cpp:20 -> 23 (make_acts(int))"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("#2 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 more site(s) moved"), std::string::npos) << r.out;  // the weights
  json doc = json::parse(sh_out("diff --json " + a + " " + b).out);
  ASSERT_EQ(doc["sites"].size(), 1u) << doc.dump();
  const json& s = doc["sites"][0];
  EXPECT_EQ(s["peak_bytes"]["delta"], 4 * MiB);
  EXPECT_EQ(s["key"], "make_acts(int)|model.cpp|20;main|model.cpp|41;");
  EXPECT_EQ(s["key_b"], "make_acts(int)|model.cpp|23;main|model.cpp|44;");
  ASSERT_EQ(s["moved"].size(), 2u);
  EXPECT_EQ(s["moved"][0],
            (json{{"frame", 0}, {"function", "make_acts(int)"}, {"file", "model.cpp"}, {"a", 20}, {"b", 23}}));
  EXPECT_EQ(doc["sites_changed"], 1);
  EXPECT_EQ(doc["sites_moved_unchanged"], 1);
}

// Two sites of one function, moved 15 and 16 lines: paired in the order of their lines (10 with
// 25, 20 with 36), not each with the nearest line (20 with 25); a third site added below
// them in B stays a new site.
TEST(Diff, SitesOfOneFunctionPairInLineOrder) {
  auto f = [](std::uint32_t line, std::uint64_t bytes) { return SymSite{{{"f", line}, {"main", 5}}, bytes}; };
  auto a = analyze_one(sym_job({f(10, 1 * MiB), f(20, 2 * MiB)}), "diff_amb_a.gh");
  auto b = analyze_one(sym_job({f(36, 2 * MiB), f(45, 3 * MiB), f(25, 1 * MiB)}), "diff_amb_b.gh");
  auto rows = diff_sites(*a.traces[0], *b.traces[0], false);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].d_peak(), static_cast<std::int64_t>(3 * MiB));  // the new site, alone
  EXPECT_EQ(rows[0].peak_a, 0);
  EXPECT_TRUE(rows[0].moved.empty());
  for (std::size_t i : {1u, 2u}) {
    EXPECT_FALSE(rows[i].changed()) << rows[i].key << " -> " << rows[i].key_b;
    ASSERT_EQ(rows[i].moved.size(), 1u);
    EXPECT_EQ(rows[i].moved[0].line_b, rows[i].moved[0].line_a == 10 ? 25 : 36);
  }
  // The same pairs whatever order the sites were recorded in.
  auto c = analyze_one(sym_job({f(25, 1 * MiB), f(45, 3 * MiB), f(36, 2 * MiB)}), "diff_amb_c.gh");
  auto again = diff_sites(*a.traces[0], *c.traces[0], false);
  ASSERT_EQ(again.size(), rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(again[i].key + again[i].key_b, rows[i].key + rows[i].key_b);
}

// check --baseline names the sites that grew (paired with the baseline's as diff pairs them),
// not the largest site. Before: "top site: 32.0 MiB in 1 allocations at make_weights ...".
TEST(CheckBaseline, NamesTheSitesThatGrew) {
  auto base = analyze_one(sym_job(model_sites(0)), "chk_grow_a.gh");
  const std::string path = TraceBuilder::dir() + "/grow_baseline.json";
  std::ofstream(path) << summary_json(base, SummaryOptions{}).dump();
  // One line inserted above everything; the activations grew 4 MiB, a 7 MiB buffer is new.
  auto sites = model_sites(1, 20 * MiB);
  sites.push_back({{{"make_scratch(int)", 31}, {"main", 42}}, 7 * MiB});
  auto grown = analyze_one(sym_job(sites), "chk_grow_b.gh");
  CheckOptions o;
  o.baseline = path;
  auto r = run_check(grown, o);
  ASSERT_FALSE(r.violations.empty());
  const std::string& v = r.violations[0];
  EXPECT_NE(v.find("peak requested bytes"), std::string::npos) << v;
  const auto scratch = v.find("grew: +7.00 MiB at make_scratch (model.cpp:31) ["),
             acts = v.find("+4.00 MiB at make_acts (model.cpp:21) [");
  ASSERT_NE(scratch, std::string::npos) << v;
  ASSERT_NE(acts, std::string::npos) << v;
  EXPECT_LT(scratch, acts) << v;  // largest growth first
  EXPECT_NE(v.find("(0 B -> 7.00 MiB, new)"), std::string::npos) << v;
  EXPECT_NE(v.find("(16.0 MiB -> 20.0 MiB, moved)"), std::string::npos) << v;
  EXPECT_EQ(v.find("make_weights"), std::string::npos) << v;  // unchanged: not named
  // A baseline that lists only its largest site cannot tell new from cut: said so.
  SummaryOptions top1;
  top1.top = 1;
  std::ofstream(path) << summary_json(base, top1).dump();
  auto cut = run_check(grown, o);
  ASSERT_FALSE(cut.violations.empty());
  EXPECT_NE(cut.violations[0].find("7.00 MiB at make_scratch (model.cpp:31) ["), std::string::npos)
      << cut.violations[0];
  EXPECT_NE(cut.violations[0].find("growth unknown"), std::string::npos) << cut.violations[0];
  EXPECT_EQ(cut.violations[0].find(", new)"), std::string::npos) << cut.violations[0];
}

// With more sites grown than named, the rest are counted, and those the baseline does not
// list (growth unknown) are said to be among them.
TEST(CheckBaseline, CountsTheRestAndTheUnknown) {
  std::vector<SymSite> few, many;
  for (std::uint32_t i = 0; i < 6; ++i) few.push_back({{{"f", 10 + i}, {"main", 50}}, MiB});
  many = few;
  for (auto& s : many) s.bytes = 2 * MiB;                // every listed site grew 1 MiB
  many.push_back({{{"g", 70}, {"main", 51}}, 3 * MiB});  // not in a --top 5 baseline
  const std::string path = TraceBuilder::dir() + "/rest_baseline.json";
  SummaryOptions top5;
  std::ofstream(path) << summary_json(analyze_one(sym_job(few), "chk_rest_a.gh"), top5).dump();
  CheckOptions o;
  o.baseline = path;
  auto r = run_check(analyze_one(sym_job(many), "chk_rest_b.gh"), o);
  ASSERT_FALSE(r.violations.empty());
  // 5 listed sites grew by 1 MiB, 1 unlisted of f and g each: unknown.
  EXPECT_NE(r.violations[0].find("; and 4 more site(s), 2 of them not among the sites the baseline lists"),
            std::string::npos)
      << r.violations[0];
}
