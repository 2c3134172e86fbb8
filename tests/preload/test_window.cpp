// The rolling window (GPUHEAP_AGGREGATE, `gpuheap run --aggregate`; preload/record/aggregate.h):
// a long run's trace stays near its budget, and the summary of the window equals the full
// trace's on what docs/cli.md says stays exact: the peak, the live set at the peak, the leaks
// and the per-site allocation totals. A program killed with SIGKILL leaves a window that reads.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "tests/preload/run_prog.h"

namespace gpuheap::test {
namespace {

using nlohmann::json;

constexpr long long kBudget = 256 << 10;
const std::string kAggregate = "GPUHEAP_AGGREGATE=256KiB";

long long file_size(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
}

json summary(const std::string& trace) {
  CmdRun r = run_cmd(kBuild + "/gpuheap summary --json " + trace + " 2>/dev/null");
  EXPECT_EQ(r.status, 0) << trace;
  return json::parse(r.out, nullptr, false);
}

// A site list as (stack id, bytes, allocated bytes, count) rows: the frames are the same
// stacks under the same ids (the window copies the stack records).
json rows(const json& list) {
  json out = json::array();
  for (const auto& s : list) out.push_back({s["stack_id"], s["bytes"], s["allocated_bytes"], s["count"]});
  return out;
}

long steps() { return small_scale() ? 20000 : 60000; }

TEST(RollingWindow, SummaryOfTheWindowEqualsTheFullTrace) {
  ProgRun full = run("prog_window", {std::to_string(steps())});
  ASSERT_EQ(full.status, 0) << full.err;
  ASSERT_EQ(full.traces.size(), 1u);
  ProgRun win = run("prog_window", {std::to_string(steps())}, {kAggregate});
  ASSERT_EQ(win.status, 0) << win.err;
  ASSERT_EQ(win.traces.size(), 1u) << "only the published segment is left";
  EXPECT_EQ(win.err.find("aggregate"), std::string::npos) << win.err;

  const long long full_size = file_size(full.traces[0]), win_size = file_size(win.traces[0]);
  EXPECT_GT(full_size, 4 * kBudget) << "the run must roll the window several times";
  // The budget, plus the head: tables and the snapshot (a few live blocks, a few sites).
  EXPECT_LT(win_size, kBudget + (32 << 10)) << "window " << win_size << " of a full trace of " << full_size;

  json f = summary(full.traces[0]), w = summary(win.traces[0]);
  ASSERT_FALSE(f.is_discarded() || w.is_discarded());
  ASSERT_TRUE(w["trace"].contains("window"));
  EXPECT_FALSE(f["trace"].contains("window"));
  EXPECT_GE(w["trace"]["window"]["segment"].get<int>(), 3);
  EXPECT_GT(w["trace"]["window"]["events_before"].get<long long>(), 0);

  ASSERT_EQ(w["devices"].size(), f["devices"].size());
  // Two runs: the same bytes, at moments of their own.
  EXPECT_EQ(w["devices"][0]["peak_held"]["bytes"], f["devices"][0]["peak_held"]["bytes"]);
  EXPECT_EQ(w["devices"][0]["peak_held"]["allocated_bytes"], f["devices"][0]["peak_held"]["allocated_bytes"]);
  EXPECT_EQ(rows(w["peak_consumers"]), rows(f["peak_consumers"]));
  EXPECT_EQ(rows(w["leaks"]), rows(f["leaks"]));
  EXPECT_EQ(w["leaked_bytes"], f["leaked_bytes"]);
  EXPECT_EQ(w["leaked_count"], f["leaked_count"]);
  EXPECT_EQ(w["devices"][0]["num_ooms"], f["devices"][0]["num_ooms"]);
  EXPECT_EQ(w["devices"][0]["num_alloc_retries"], f["devices"][0]["num_alloc_retries"]);
  EXPECT_EQ(w["devices"][0]["empty_cache"], f["devices"][0]["empty_cache"]);
  EXPECT_EQ(f["devices"][0]["num_ooms"].get<int>(), 1);
  EXPECT_EQ(rows(w["most_allocations"]), rows(f["most_allocations"]));
  // What the test compares is there to compare: the peak holds the 12 early blocks and the leak.
  EXPECT_EQ(f["devices"][0]["peak_held"]["bytes"].get<long long>(), (78ll + 3) << 20);
  EXPECT_EQ(f["leaked_bytes"].get<long long>(), 3ll << 20);
}

TEST(RollingWindow, KilledProgramsWindowReads) {
  ProgRun r = run_with("prog_window", {std::to_string(steps()), "hang"}, {kAggregate}, true, [](pid_t pid, int fd) {
    char c;
    std::string line;
    while (line.find("ready") == std::string::npos && read(fd, &c, 1) == 1) line += c;
    kill(pid, SIGKILL);
  });
  ASSERT_EQ(r.status, 128 + SIGKILL);
  ASSERT_EQ(r.traces.size(), 1u) << "only the published segment is left";
  EXPECT_LT(file_size(r.traces[0]), 2 * kBudget);
  json w = summary(r.traces[0]);
  ASSERT_FALSE(w.is_discarded());
  ASSERT_TRUE(w["trace"].contains("window"));
  EXPECT_FALSE(w["trace"]["has_end"].get<bool>());
  EXPECT_EQ(w["devices"][0]["peak_held"]["bytes"].get<long long>(), (78ll + 3) << 20);
  // Still live when killed: the leak and the two kept blocks (1 and 2 MiB).
  EXPECT_EQ(w["leaked_bytes"].get<long long>(), 6ll << 20);
}

// `gpuheap run --aggregate` hands the budget to the preload (GPUHEAP_AGGREGATE); the
// finishing step (symbolize, compress) keeps the window readable; a size below the smallest
// window is refused before the program starts.
TEST(RollingWindow, RunAggregate) {
  const std::string dir = make_dir();
  CmdRun r = run_in(dir, "-q --aggregate=256KiB -o t.trace " + kProgs + "/prog_window " + std::to_string(steps()));
  ASSERT_EQ(r.status, 0) << r.out;
  json w = summary(dir + "/t.trace.zst");
  ASSERT_FALSE(w.is_discarded());
  ASSERT_TRUE(w["trace"].contains("window")) << "the window's budget reached the preload";
  EXPECT_EQ(w["devices"][0]["peak_held"]["bytes"].get<long long>(), (78ll + 3) << 20);
  EXPECT_EQ(w["leaked_bytes"].get<long long>(), 3ll << 20);
  // Where the window's figures would mislead: the pool table says it covers the window only,
  // and check gates only what is exact (leaks); a peak gate on a window is refused (exit 2),
  // never passed on the window's smaller peak.
  const std::string t = dir + "/t.trace.zst";
  CmdRun text = run_cmd(kBuild + "/gpuheap summary " + t + " 2>&1");
  EXPECT_NE(text.out.find("  (the window only, from "), std::string::npos) << text.out;
  CmdRun peak_gate = run_cmd(kBuild + "/gpuheap check -q --max-requested 64MiB " + t + " 2>&1");
  EXPECT_EQ(peak_gate.status, 2) << peak_gate.out;
  EXPECT_NE(peak_gate.out.find("rolling window"), std::string::npos) << peak_gate.out;
  CmdRun leak_gate = run_cmd(kBuild + "/gpuheap check -q --max-leaked 4MiB " + t + " 2>&1");
  EXPECT_EQ(leak_gate.status, 0) << leak_gate.out;
  EXPECT_EQ(run_cmd(kBuild + "/gpuheap check -q --max-leaked 2MiB " + t + " 2>&1").status, 1);
  CmdRun bad = run_in(dir, "--aggregate=12 -o u.trace " + kProgs + "/prog_window 1");
  EXPECT_EQ(bad.status, 2) << bad.out;
  EXPECT_NE(bad.out.find("--aggregate=12"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace gpuheap::test
