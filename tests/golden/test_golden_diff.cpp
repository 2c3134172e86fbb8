// `diff` (and `check --baseline`) across an edit: orig/diff_prog and edited/diff_prog, the same
// source with one line inserted above every allocation site, under the preload on simcuda.
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

}  // namespace gpuheap::golden
