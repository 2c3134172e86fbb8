// Site labels and summary filters on a real trace (issue 17): prog_labels allocates through
// stand-ins for PyTorch's allocator frames (c10::cuda::CUDACachingAllocator::allocate under
// at::detail::empty_cuda, in libtorch_labels_test.so), called from user_model_forward; the
// site is labelled user_model_forward in summary text, JSON and check, and the summary's
// --depth/--full/--top/--library/--pid/--device options select what is shown.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "tests/preload/run_prog.h"

namespace {

using gpuheap::test::kBuild;
using nlohmann::json;

struct Cli {
  int status = -1;
  std::string out;
};
Cli cli(const std::string& args) {
  auto r = gpuheap::test::run_cmd("env -u LD_PRELOAD " + kBuild + "/gpuheap " + args + " 2>&1");
  return {r.status, r.out};
}
std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (auto at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}

// Two runs of prog_labels (two processes, two traces), recorded once for every test.
const std::vector<std::string>& traces() {
  static std::vector<std::string> t = [] {
    std::vector<std::string> v;
    for (int i = 0; i < 2; ++i) {
      auto r = gpuheap::test::run("prog_labels");
      EXPECT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(r.traces.size(), 1u) << r.err;
      if (!r.traces.empty()) v.push_back(r.traces[0]);
    }
    return v;
  }();
  return t;
}
const std::string& trace() { return traces().at(0); }

}  // namespace

TEST(LabelsCli, SummaryTextLabelsTheSiteBelowTheAllocator) {
  auto s = cli("summary -q " + trace());
  ASSERT_EQ(s.status, 0) << s.out;
  // The leak and the peak consumer: labelled by the program's frame, library PyTorch (by the
  // allocator's module name); the allocator frames are counted, not shown.
  EXPECT_NE(s.out.find("in 1 allocation [PyTorch] user_model_forward (prog_labels.cpp:"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("... 2 allocator frames"), std::string::npos) << s.out;
  EXPECT_EQ(s.out.find("at c10::cuda::CUDACachingAllocator::allocate"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("at user_model_forward("), std::string::npos) << s.out;
  // The direct cudaMalloc site has no allocator frames: its own function is the label.
  EXPECT_NE(s.out.find("direct_workspace (prog_labels.cpp:"), std::string::npos) << s.out;

  // The count lists are one line per site by default (their stacks with --depth/--full).
  const auto most = s.out.find("Most allocations"), leaks = s.out.find("Leaks (");
  ASSERT_LT(most, leaks);
  EXPECT_EQ(s.out.substr(most, leaks - most).find("        at "), std::string::npos) << s.out;
  const std::string d3 = cli("summary -q --depth 3 " + trace()).out;
  const auto most3 = d3.find("Most allocations");
  ASSERT_NE(most3, std::string::npos) << d3;
  EXPECT_NE(d3.find("        at ", most3), std::string::npos) << d3;

  // --full: every frame, the allocator's included.
  auto f = cli("summary -q --full " + trace());
  ASSERT_EQ(f.status, 0) << f.out;
  EXPECT_NE(f.out.find("at c10::cuda::CUDACachingAllocator::allocate("), std::string::npos) << f.out;
  EXPECT_NE(f.out.find("at at::detail::empty_cuda("), std::string::npos) << f.out;
  EXPECT_EQ(f.out.find("allocator frames"), std::string::npos) << f.out;
  EXPECT_GT(f.out.size(), s.out.size());
}

TEST(LabelsCli, JsonHasTheLabelAndDepthCutsStacks) {
  auto s = cli("summary -q --json " + trace());
  ASSERT_EQ(s.status, 0) << s.out;
  auto doc = json::parse(s.out);
  ASSERT_FALSE(doc["leaks"].empty());
  const auto& leak = doc["leaks"][0];
  EXPECT_EQ(leak["label"], "user_model_forward");
  EXPECT_EQ(leak["library"], "PyTorch");
  // Without --depth the stack is whole and label_frame points into it.
  const auto& st = leak["stack"];
  const std::size_t at = leak["label_frame"].get<std::size_t>();
  ASSERT_LT(at, st.size());
  EXPECT_EQ(st[at]["function"].get<std::string>().rfind("user_model_forward", 0), 0u) << st.dump();
  EXPECT_EQ(st[0]["function"].get<std::string>().rfind("c10::cuda::CUDACachingAllocator::allocate", 0), 0u);
  EXPECT_FALSE(leak.contains("frames_hidden"));
  EXPECT_EQ(doc["peak_consumers"][0]["label"], "user_model_forward");

  // --depth 1: the label's frame only, the rest counted.
  auto d = json::parse(cli("summary -q --json --depth 1 " + trace()).out);
  const auto& dl = d["leaks"][0];
  ASSERT_EQ(dl["stack"].size(), 1u) << dl.dump();
  EXPECT_EQ(dl["stack"][0]["function"].get<std::string>().rfind("user_model_forward", 0), 0u);
  EXPECT_EQ(dl["label_frame"], 0);
  EXPECT_EQ(dl["frames_hidden"].get<std::size_t>(), st.size() - 1);
}

TEST(LabelsCli, DepthAndTopInText) {
  auto d = cli("summary -q --depth 1 " + trace());
  ASSERT_EQ(d.status, 0) << d.out;
  EXPECT_NE(d.out.find("at user_model_forward("), std::string::npos) << d.out;
  EXPECT_EQ(d.out.find("at main ("), std::string::npos) << d.out;
  EXPECT_NE(d.out.find("... 1 more frame\n"), std::string::npos) << d.out;
  auto two = cli("summary -q --depth 2 " + trace());
  EXPECT_NE(two.out.find("at main ("), std::string::npos) << two.out;
  // --top 1: one entry per list.
  auto t = cli("summary -q --top 1 " + trace());
  EXPECT_EQ(count(t.out, "  #2 "), 0u) << t.out;
  EXPECT_GT(count(cli("summary -q " + trace()).out, "  #2 "), 0u);
}

TEST(LabelsCli, LibraryFilterSelectsSites) {
  auto all = cli("summary -q " + trace());
  auto torch = cli("summary -q --library pytorch " + trace());  // any case
  ASSERT_EQ(torch.status, 0) << torch.out;
  EXPECT_NE(torch.out.find("library:   pytorch"), std::string::npos) << torch.out;
  EXPECT_NE(torch.out.find("[PyTorch] user_model_forward"), std::string::npos) << torch.out;
  EXPECT_EQ(torch.out.find("direct_workspace"), std::string::npos) << torch.out;
  EXPECT_NE(all.out.find("direct_workspace"), std::string::npos) << all.out;
  // The program's own site: its library is the program.
  auto prog = cli("summary -q --library PROG_LABELS " + trace());
  EXPECT_NE(prog.out.find("[prog_labels] direct_workspace"), std::string::npos) << prog.out;
  EXPECT_EQ(prog.out.find("[PyTorch]"), std::string::npos) << prog.out;
  auto j = json::parse(cli("summary -q --json --library cuBLAS " + trace()).out);
  EXPECT_TRUE(j["leaks"].empty());
  EXPECT_TRUE(j["peak_consumers"].empty());
  EXPECT_EQ(j["leaked_bytes"], 8u << 20);  // totals are the whole trace's
}

TEST(LabelsCli, PidAndDeviceSelect) {
  ASSERT_EQ(traces().size(), 2u);
  auto both = cli("summary -q " + traces()[0] + " " + traces()[1]);
  ASSERT_EQ(both.status, 0) << both.out;
  EXPECT_NE(both.out.find("process 2 of 2"), std::string::npos);
  // The pid from the trace's own header.
  auto j = json::parse(cli("summary -q --json " + traces()[1]).out);
  const auto pid = j["trace"]["pid"].get<std::uint64_t>();
  auto one = cli("summary -q --pid " + std::to_string(pid) + " " + traces()[0] + " " + traces()[1]);
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_EQ(one.out.find("process 2 of 2"), std::string::npos) << one.out;
  EXPECT_NE(one.out.find("pid:       " + std::to_string(pid)), std::string::npos) << one.out;
  EXPECT_NE(one.out.find(traces()[1]), std::string::npos);
  EXPECT_EQ(one.out.find(traces()[0]), std::string::npos);
  auto none = cli("summary -q --pid 1 " + traces()[0] + " " + traces()[1]);
  EXPECT_EQ(none.status, 2) << none.out;
  EXPECT_NE(none.out.find("--pid 1: no trace matches"), std::string::npos) << none.out;

  auto dev = cli("summary -q --device 7 " + trace());
  EXPECT_EQ(dev.status, 2) << dev.out;
  EXPECT_NE(dev.out.find("--device 7: no such device in the trace (devices: 0)"), std::string::npos) << dev.out;
  EXPECT_EQ(cli("summary -q --json --device 7 " + trace()).status, 2);
  EXPECT_EQ(cli("summary -q --device 0 " + trace()).status, 0);
}

TEST(LabelsCli, CheckNamesTheTopSiteByItsLabel) {
  auto c = cli("check -q --max-leaked 0 --max-requested 1MiB " + trace());
  EXPECT_EQ(c.status, 1) << c.out;
  EXPECT_EQ(count(c.out, "top site: 8.00 MiB in 1 allocations at user_model_forward (prog_labels.cpp:"), 2u) << c.out;
  EXPECT_EQ(c.out.find("CUDACachingAllocator"), std::string::npos) << c.out;
}
