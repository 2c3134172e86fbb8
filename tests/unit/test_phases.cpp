// Phases (analyzer/model/model_phases.cpp), windows (model_window.cpp, phases.cpp) and growth on
// synthetic traces; the CLI's --phase/--time/--after/--max-growth and their exit codes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "analyzer/base/error.h"
#include "analyzer/model/phases.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {

constexpr auto kPass = AllocKind::device_passthrough;
using Op = format::PhaseOp;

void phase(TraceBuilder& b, Op op, std::string_view name = "", std::uint32_t tid = 1) {
  b.put(format::PhaseRecord{b.tick(), tid, op, format::PhaseSource::api, name});
}

// step { A=100; forward { B=200 C=300; free C } backward { D=50 } } pop(unmatched)
// thread 2: loader (never popped); mark checkpoint; E=1000; end.
TraceBuilder nested() {
  TraceBuilder b;
  b.stack(1, {0x401000});
  b.stack(2, {0x402000});
  b.stack(3, {0x403000});
  phase(b, Op::push, "step");
  b.alloc(0x1000, 100, 100, 1, kPass);
  phase(b, Op::push, "forward");
  b.alloc(0x2000, 200, 200, 2, kPass);
  b.alloc(0x3000, 300, 300, 2, kPass);
  b.free(0x3000, kPass);
  phase(b, Op::pop);
  phase(b, Op::push, "backward");
  b.alloc(0x4000, 50, 50, 3, kPass);
  phase(b, Op::pop);
  phase(b, Op::pop);
  phase(b, Op::pop);  // nothing open on thread 1: ignored
  phase(b, Op::push, "loader", 2);
  phase(b, Op::mark, "checkpoint");
  b.alloc(0x5000, 1000, 1000, 1, kPass);
  b.end();
  return b;
}

const PhaseInstance& find(const Model& m, const std::string& name) {
  for (const auto& p : m.phases)
    if (p.name == name) return p;
  throw std::runtime_error("no phase " + name);
}

Analysis windowed(const TraceBuilder& b, const std::string& name, WindowSpec spec) {
  AnalyzeOptions o;
  o.progress = false, o.warn_truncated = false;
  return analyze_window({b.write(name)}, o, spec);
}

std::uint64_t site_allocs(const Model& m, std::uint32_t stack) {
  return stack < m.sites.size() ? m.sites[stack].allocs : 0;
}

Result sh(const std::string& args) { return run(std::string(GPUHEAP_CLI) + " " + args); }

// warmup { weights=1000 } then 4 steps: each allocates a 500-byte temporary and frees it;
// steps 2..4 keep 100 bytes each (a leak per step). Weights live to the end.
TraceBuilder training(bool leak_per_step) {
  TraceBuilder b;
  b.stack(1, {0x401000});
  b.stack(2, {0x402000});
  phase(b, Op::push, "warmup");
  b.alloc(0x10000, 1000, 1000, 1, kPass);
  phase(b, Op::pop);
  for (int i = 0; i < 4; ++i) {
    phase(b, Op::push, "step");
    b.alloc(0x20000, 500, 500, 2, kPass);
    b.free(0x20000, kPass);
    if (leak_per_step && i > 0) b.alloc(0x30000 + 0x1000 * static_cast<std::uint64_t>(i), 100, 100, 2, kPass);
    phase(b, Op::pop);
  }
  b.end();
  return b;
}

}  // namespace

TEST(Phases, NestingThreadsUnmatchedPopsAndOpenAtEnd) {
  auto a = analyze_one(nested(), "phases_nested.gh");
  const auto& m = *a.traces[0];
  ASSERT_EQ(m.phases.size(), 5u);
  EXPECT_EQ(m.unmatched_pops, 1u);
  const auto& step = find(m, "step");
  const auto& fwd = find(m, "forward");
  const auto& bwd = find(m, "backward");
  EXPECT_EQ(step.depth, 0);
  EXPECT_EQ(fwd.depth, 1);
  EXPECT_EQ(bwd.depth, 1);
  ASSERT_EQ(fwd.devices.size(), 1u);
  EXPECT_EQ(fwd.devices[0].peak_requested, 600);  // A + B + C
  EXPECT_EQ(fwd.devices[0].allocs, 2u);
  EXPECT_EQ(fwd.devices[0].end_requested, 300);
  EXPECT_EQ(bwd.devices[0].peak_requested, 350);
  EXPECT_EQ(bwd.devices[0].allocs, 1u);
  EXPECT_EQ(step.devices[0].peak_requested, 600);
  EXPECT_EQ(step.devices[0].allocs, 4u);
  EXPECT_LT(fwd.start, fwd.end);
  EXPECT_LE(step.start, fwd.start);
  EXPECT_GE(step.end, bwd.end);
  const auto& loader = find(m, "loader");
  EXPECT_EQ(loader.tid, 2u);
  EXPECT_EQ(loader.depth, 0);  // thread 2 has its own nesting
  EXPECT_TRUE(loader.open_at_end);
  EXPECT_EQ(loader.devices[0].peak_requested, 1350);
  const auto& mark = find(m, "checkpoint");
  EXPECT_TRUE(mark.mark);
  EXPECT_EQ(mark.start, mark.end);
  EXPECT_FALSE(step.open_at_end);

  auto rows = phase_rows(m, 0);
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0].name, "step");
  EXPECT_EQ(rows[1].name, "forward");
  EXPECT_EQ(rows[1].depth, 1);
}

TEST(Phases, SameNameInstancesAggregateInTheTable) {
  auto a = analyze_one(training(true), "phases_agg.gh");
  auto rows = phase_rows(*a.traces[0], 0);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[1].name, "step");
  EXPECT_EQ(rows[1].count, 4u);
  EXPECT_EQ(rows[1].peak_requested, 1000 + 500 + 200);  // the 4th step: weights, 2 leaks, temporary
  EXPECT_EQ(rows[1].allocs, 4u + 3u);
}

TEST(Phases, PhaseWindowRestrictsPeaksSitesAndLeaks) {
  auto b = nested();
  auto fw = windowed(b, "phases_win_fwd.gh", {"forward", "", ""});
  const auto& m = *fw.traces[0];
  const auto& d = m.devices.at(0);
  EXPECT_EQ(d.stat[kRequestedBytes][0].peak, 600);
  EXPECT_EQ(d.stat[kRequestedBytes][0].allocated, 500);  // B + C made inside
  EXPECT_EQ(d.stat[kRequestedBytes][0].current, 1350);   // the end state is the trace's
  EXPECT_EQ(site_allocs(m, 1), 0u);
  EXPECT_EQ(site_allocs(m, 2), 2u);
  EXPECT_EQ(m.leaked_bytes, 200u);  // B: made in forward, live at its end
  EXPECT_EQ(d.peak_held, 600);
  std::uint64_t consumers = 0;
  for (const auto& s : d.peak_consumers) consumers += s.bytes;
  EXPECT_EQ(consumers, 600u);  // A (from before) + B + C at forward's peak

  // backward: the peak since its start (torch's reset_peak_memory_stats at the start).
  auto bw = windowed(b, "phases_win_bwd.gh", {"backward", "", ""});
  EXPECT_EQ(bw.traces[0]->devices.at(0).stat[kRequestedBytes][0].peak, 350);
  EXPECT_EQ(bw.traces[0]->leaked_bytes, 50u);

  // Whole trace for comparison: the peak is at the end (E).
  auto all = analyze_one(b, "phases_win_all.gh");
  EXPECT_EQ(all.traces[0]->devices.at(0).stat[kRequestedBytes][0].peak, 1350);
  EXPECT_EQ(all.traces[0]->leaked_bytes, 1350u);
}

TEST(Phases, TimeAndAfterWindows) {
  auto b = nested();
  auto after = windowed(b, "phases_after.gh", {"", "", "checkpoint"});
  EXPECT_EQ(after.traces[0]->leaked_bytes, 1000u);  // only E was made after the mark
  EXPECT_EQ(after.traces[0]->devices.at(0).stat[kRequestedBytes][0].peak, 1350);
  // --time forward:backward = from forward's start to backward's end.
  auto t = windowed(b, "phases_time.gh", {"", "forward:backward", ""});
  EXPECT_EQ(t.traces[0]->devices.at(0).stat[kRequestedBytes][0].peak, 600);
  EXPECT_EQ(site_allocs(*t.traces[0], 2) + site_allocs(*t.traces[0], 3), 3u);
  // Seconds: the trace starts at TraceBuilder::kMono, records are 1 us apart; 0:0.000001
  // holds only the first record (the push), no allocation.
  auto s = windowed(b, "phases_secs.gh", {"", ":0.000001", ""});
  EXPECT_EQ(s.traces[0]->devices.at(0).stat[kRequestedBytes][0].peak, 0);
  EXPECT_EQ(s.traces[0]->leaked_bytes, 0u);
  EXPECT_THROW(windowed(b, "phases_bad.gh", {"nosuch", "", ""}), InputError);
  EXPECT_THROW(windowed(b, "phases_bad2.gh", {"", "1:x", ""}), InputError);
}

TEST(Phases, GrowthFromTheSecondInstance) {
  auto a = analyze_one(training(true), "phases_growth.gh");
  auto g = phase_growth(*a.traces[0], "");
  ASSERT_TRUE(g.valid);
  EXPECT_EQ(g.phase, "step");
  EXPECT_EQ(g.instances, 4u);
  ASSERT_EQ(g.devices.size(), 1u);
  EXPECT_EQ(g.devices[0].ends, (std::vector<std::int64_t>{1000, 1100, 1200, 1300}));
  EXPECT_EQ(g.growth, 200);
  auto flat = analyze_one(training(false), "phases_flat.gh");
  EXPECT_EQ(phase_growth(*flat.traces[0], "").growth, 0);
  EXPECT_FALSE(phase_growth(*flat.traces[0], "warmup").valid);  // one instance
  EXPECT_THROW(phase_growth(*flat.traces[0], "nosuch"), InputError);
}

TEST(Phases, CliSummaryTableJsonAndExitCodes) {
  auto path = nested().write("phases_cli.gh");
  auto r = sh("summary " + path);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("By phase, device 0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n    forward "), std::string::npos) << r.out;  // nested: indented
  EXPECT_NE(r.out.find("checkpoint (mark)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 pops without an open range"), std::string::npos) << r.out;

  r = sh("summary --json --phase forward " + path);
  ASSERT_EQ(r.code, 0) << r.out;
  auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["devices"][0]["requested_bytes"]["peak"], 600);
  EXPECT_EQ(doc["leaked_bytes"], 200);
  EXPECT_EQ(doc["window"]["spec"], "phase forward");
  EXPECT_EQ(doc["phases"].size(), 5u);
  EXPECT_EQ(doc["phases"][1]["name"], "forward");
  EXPECT_EQ(doc["phases"][1]["devices"][0]["peak_requested"], 600);
  EXPECT_EQ(doc["unmatched_pops"], 1);

  r = sh("summary --phase nosuch " + path);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("known phases: backward, checkpoint, forward, loader, step"), std::string::npos) << r.out;
  EXPECT_EQ(sh("summary --phase checkpoint " + path).code, 2);  // a mark has no inside
  EXPECT_EQ(sh("summary --time 1:x " + path).code, 2);
}

TEST(Phases, CliCheckAfterAndMaxGrowth) {
  auto flat = training(false).write("phases_check_flat.gh");
  auto leaky = training(true).write("phases_check_leaky.gh");
  // Weights live to the end: a plain leak gate fails every training job...
  EXPECT_EQ(sh("check --max-leaked 0 " + flat).code, 1);
  // ...after the warm-up, nothing made is left.
  auto r = sh("check --after warmup --max-leaked 0 " + flat);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("restricted to after warmup"), std::string::npos) << r.out;
  EXPECT_EQ(sh("check --after warmup --max-leaked 0 " + leaky).code, 1);
  EXPECT_EQ(sh("check --max-growth 0 " + flat).code, 0);
  r = sh("check --max-growth 150B " + leaky);
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("FAIL: growth of live requested bytes over 'step' (4 instances"), std::string::npos) << r.out;
  EXPECT_EQ(sh("check --max-growth 200B " + leaky).code, 0);
  // No repeated phase: the gate cannot be measured, which fails it.
  EXPECT_EQ(sh("check --max-growth 1GiB --growth-phase warmup " + leaky).code, 1);
  EXPECT_EQ(sh("check --max-growth 1GiB --growth-phase nosuch " + leaky).code, 2);
  r = sh("summary --json " + leaky);
  auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["growth"]["phase"], "step");
  EXPECT_EQ(doc["growth"]["growth_bytes"], 200);
  EXPECT_EQ(sh("summary " + leaky)
                    .out.find("Growth, device 0: 1.27 KiB requested live at the end of 'step' #4 vs 1.07 KiB") !=
                std::string::npos,
            true);
}

TEST(Phases, DeepNestingIsBoundedAndStillMatched) {
  // 300 nested pushes: beyond Model::kMaxOpenPhases they are matched by their pops but not
  // kept, so the pops still close the right ranges and nothing is reported unmatched.
  TraceBuilder b;
  for (int i = 0; i < 300; ++i) phase(b, Op::push, "deep");
  b.alloc(0x1000, 100, 100, 0, kPass);
  for (int i = 0; i < 300; ++i) phase(b, Op::pop);
  phase(b, Op::push, "after");
  b.alloc(0x2000, 50, 50, 0, kPass);
  phase(b, Op::pop);
  b.end();
  auto a = analyze_one(b, "phases_deep.gh");
  const auto& m = *a.traces[0];
  EXPECT_EQ(m.untracked_ranges, 300u - Model::kMaxOpenPhases);
  EXPECT_EQ(m.unmatched_pops, 0u);
  EXPECT_EQ(m.phases.size(), Model::kMaxOpenPhases + 1);
  for (const auto& p : m.phases) EXPECT_FALSE(p.open_at_end) << p.name;
  EXPECT_EQ(m.phases.front().devices.at(0).peak_requested, 100);
  const auto& after = find(m, "after");
  EXPECT_EQ(after.depth, 0);
  EXPECT_EQ(after.devices.at(0).peak_requested, 150);
  EXPECT_EQ(after.devices.at(0).allocs, 1u);
}

// "Which lines caused the peak" (issue 35): the summary names the ranges open at the peak
// and which instance of each it was; --group-by sums the peak's sites by line, function,
// file or module.
TEST(Phases, SummaryNamesTheStepOfThePeakAndGroupsItsSites) {
  TraceBuilder b;
  b.stack(1, {0x401000});
  b.stack(2, {0x402000});
  b.module(0x400000, 0x410000, "/job/bin/trainer");
  for (int i = 0; i < 3; ++i) {
    phase(b, Op::push, "step");
    phase(b, Op::push, "forward");
    const std::uint64_t n = i == 1 ? 5000 : 1000;  // the peak: the second step's forward
    b.alloc(0x1000, n, n, 1, kPass);
    b.alloc(0x2000, 300, 300, 2, kPass);
    b.free(0x1000, kPass);
    b.free(0x2000, kPass);
    phase(b, Op::pop);
    phase(b, Op::pop);
  }
  b.end();
  const std::string path = b.write("peak_step.gh");
  auto r = sh("summary " + path);
  EXPECT_NE(r.out.find("  the peak fell in step (#2 of 3) > forward (#2 of 3)\n"), std::string::npos) << r.out;
  r = sh("summary --group-by module " + path);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("  by module:\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("in 2 allocations from 2 sites trainer\n"), std::string::npos) << r.out;
  r = sh("summary --group-by line " + path);
  EXPECT_NE(r.out.find("in 1 allocation from 1 site"), std::string::npos) << r.out;
  EXPECT_EQ(sh("summary --group-by stack " + path).code, 2);
  // The JSON summary carries the same groups: one per module here, both sites in it.
  // (the output has the symbolizer's warning about the missing /job/bin/trainer beside the JSON)
  const auto json_of = [](const std::string& out) {
    return nlohmann::json::parse(out.substr(out.find('{'), out.rfind('}') + 1 - out.find('{')));
  };
  r = sh("summary --json --group-by module " + path);
  ASSERT_EQ(r.code, 0) << r.out;
  const auto doc = json_of(r.out);
  ASSERT_EQ(doc.at("peak_groups").size(), 1u) << r.out;
  const auto& g = doc["peak_groups"][0];
  EXPECT_EQ(g.at("by"), "module");
  EXPECT_EQ(g.at("key"), "trainer");
  EXPECT_EQ(g.at("bytes"), 5300);
  EXPECT_EQ(g.at("count"), 2);
  EXPECT_EQ(g.at("sites"), 2);
  EXPECT_DOUBLE_EQ(g.at("percent").get<double>(), 100.0);
  EXPECT_FALSE(json_of(sh("summary --json " + path).out).contains("peak_groups"));
}
