// `diff` (and `check --baseline`) across an edit: orig/diff_prog and edited/diff_prog, the same
// source with one line inserted above every allocation site, under the preload on simcuda.
#include <fstream>

#include "tests/golden/golden.h"

namespace gpuheap::golden {
namespace {

std::string trace_of(const std::string& prog, std::vector<std::string> args = {}) {
  auto r = test::run(prog, std::move(args));
  EXPECT_EQ(r.status, 0) << prog;
  EXPECT_EQ(r.traces.size(), 1u) << prog;
  return r.traces.empty() ? std::string() : r.traces[0];
}

}  // namespace

// Before: one row per site gone and one per site new ("#1 peak -32.0 MiB (32.0 MiB -> 0 B)",
// "#2 peak +32.0 MiB (0 B -> 32.0 MiB)", the same visible stack); now the sites moved.
TEST(GoldenDiff, AnInsertedLineMovesEverySite) {
  const std::string a = trace_of("orig/diff_prog"), b = trace_of("edited/diff_prog");
  auto r = cli({"diff", a, b});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("  no differences\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  2 more site(s) moved"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("32.0 MiB"), std::string::npos) << r.out;
}

// The edit also added a 7 MiB buffer: the only row, new in B; the unchanged weights and
// activations only moved.
TEST(GoldenDiff, ANewBufferIsTheOnlyRow) {
  const std::string a = trace_of("orig/diff_prog"), b = trace_of("edited/diff_prog", {"grow"});
  auto r = cli({"diff", a, b});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("#1  peak +7.00 MiB (0 B -> 7.00 MiB)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("make_scratch"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("#2 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  2 more site(s) moved"), std::string::npos) << r.out;
}

// check --baseline across the same edit names the new buffer with its growth, not the largest
// site (before: "top site: 32.0 MiB in 1 allocations at ... make_weights").
TEST(GoldenDiff, BaselineGateNamesTheSiteThatGrew) {
  const std::string a = trace_of("orig/diff_prog"), b = trace_of("edited/diff_prog", {"grow"});
  auto s = cli({"summary", "--json", a});
  ASSERT_EQ(s.status, 0) << s.err;
  const std::string base = test::make_dir() + "/base.json";
  std::ofstream(base) << s.out;
  auto r = cli({"check", "--baseline", base, b});
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  const auto fail = r.out.find("FAIL: peak requested bytes");
  ASSERT_NE(fail, std::string::npos) << r.out;
  const std::string line = r.out.substr(fail, r.out.find('\n', fail) - fail);
  EXPECT_NE(line.find("grew: +7.00 MiB at "), std::string::npos) << line;
  EXPECT_NE(line.find("make_scratch"), std::string::npos) << line;
  EXPECT_NE(line.find("(0 B -> 7.00 MiB, new)"), std::string::npos) << line;
  EXPECT_EQ(line.find("make_weights"), std::string::npos) << line;
  EXPECT_EQ(line.find("top site"), std::string::npos) << line;
}

}  // namespace gpuheap::golden
