// The default text summary of a real training trace fits a screen or two (issue 17): the
// shipped PyTorch GPT traces (examples/traces, recorded on an H100 with symbols stored and on
// an H200 without) through the gpuheap binary. --full and --json stay whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "analyzer/symbolize/labels.h"
#include "test_analyzer_util.h"

using gpuheap::test::run;
using nlohmann::json;

namespace {

const std::string kH100 = GPUHEAP_SOURCE_DIR "/tests/gpu/traces/h100-gpt-train-v3.trace.zst";
const std::string kH200 = GPUHEAP_SOURCE_DIR "/tests/gpu/traces/h200-gpt-train-v2.trace.zst";

// stdout only: the warning about modules missing here goes to stderr.
std::string summary(const std::string& args) {
  auto r = run("(" + std::string(GPUHEAP_CLI) + " summary -q " + args + " 2>/dev/null)");
  EXPECT_EQ(r.code, 0) << r.out;
  return r.out;
}
const std::string& text(const std::string& trace) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(trace);
  return it != cache.end() ? it->second : cache.emplace(trace, summary(trace)).first->second;
}
const json& doc(const std::string& trace) {
  static std::map<std::string, json> cache;
  auto it = cache.find(trace);
  return it != cache.end() ? it->second : cache.emplace(trace, json::parse(summary("--json " + trace))).first->second;
}
std::size_t lines(const std::string& s) { return static_cast<std::size_t>(std::count(s.begin(), s.end(), '\n')); }

// The text of one numbered entry ("  #1 ...") of the section starting at `title`.
std::string entry(const std::string& t, const std::string& title, int n) {
  auto sec = t.find(title);
  if (sec == std::string::npos) return "";
  auto at = t.find("  #" + std::to_string(n) + " ", sec);
  if (at == std::string::npos) return "";
  auto end = t.find("\n  #", at + 1);
  const auto blank = t.find("\n\n", at);
  if (end == std::string::npos || blank < end) end = blank;
  return t.substr(at, end - at + 1);
}

// The label as the default view prints it: a C++ label without its template arguments.
std::string shown_label(const json& site) {
  const std::string label = site["label"];
  const json& f = site["stack"][site["label_frame"].get<std::size_t>()];
  return f["module"] == "python" ? label : gpuheap::short_name(label);
}

}  // namespace

TEST(SummaryView, DefaultFitsTwoScreensAndNamesTheTopSites) {
  for (const auto& trace : {kH200, kH100}) {
    const std::string& t = text(trace);
    // Two screens, and the few lines of "Memory by category" (issue 34) that the h200 trace's
    // summary, at exactly 100 lines before, needs.
    EXPECT_LE(lines(t), 110u) << trace << "\n" << t;
    // Every listed site is still there, named by its label, in the JSON's order.
    const json& j = doc(trace);
    ASSERT_EQ(j["peak_consumers"].size(), 5u);
    for (int i = 0; i < 5; ++i) {
      const json& s = j["peak_consumers"][i];
      const std::string e = entry(t, "Peak memory consumers", i + 1);
      EXPECT_NE(e.find("[" + s["library"].get<std::string>() + "] " + shown_label(s)), std::string::npos)
          << i << ": " << s["label"] << "\n"
          << e;
      EXPECT_NE(e.find("\n        at "), std::string::npos) << e;  // with a stack
    }
    // The text lists the program's own leaks; JSON every site, library ones marked so.
    std::vector<json> own;
    for (const auto& s : j["leaks"])
      if (s["category"] != "library") own.push_back(s);
    EXPECT_NE(t.find("libraries hold"), std::string::npos);
    for (std::size_t i = 0; i < own.size(); ++i) {
      const json& s = own[i];
      const std::string e = entry(t, "Leaks (", static_cast<int>(i) + 1);
      EXPECT_NE(e.find(shown_label(s)), std::string::npos) << e;
      // Its stack, or the peak consumer's that is the same.
      EXPECT_TRUE(e.find("\n        at ") != std::string::npos ||
                  e.find("; stack as peak consumer #") != std::string::npos)
          << e;
    }
    EXPECT_NE(t.find("Most allocations (by count)"), std::string::npos);
    EXPECT_NE(t.find("Fragmentation at peak reserved"), std::string::npos);
    // The pool rows are --pools' (and --full's); the all-pools rows stay.
    EXPECT_NE(t.find(" Requested memory      |"), std::string::npos);
    EXPECT_EQ(t.find("from large pool"), std::string::npos) << t;
  }
  const std::string pools = summary("--pools " + kH200);
  EXPECT_NE(pools.find("       from large pool |"), std::string::npos);
  EXPECT_NE(pools.find(" Oversize allocations  |"), std::string::npos);
  EXPECT_GT(lines(pools), lines(text(kH200)));
}

TEST(SummaryView, ModuleCallFramesAreFoldedAndCounted) {
  const std::string& t = text(kH100);
  EXPECT_EQ(t.find("at Module._call_impl"), std::string::npos) << t;
  EXPECT_EQ(t.find("at Module._wrapped_call_impl"), std::string::npos) << t;
  // Peak consumer #1: what is shown and what is counted add up to the whole stack.
  const json& site = doc(kH100)["peak_consumers"][0];
  const std::string e = entry(t, "Peak memory consumers", 1);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(e, m, std::regex(R"(\.\.\. (\d+) allocator frames?, (\d+) native frames?\n)"))) << e;
  std::size_t counted = std::stoul(m[1]) + std::stoul(m[2]);
  ASSERT_TRUE(std::regex_search(e, m, std::regex(R"(\.\.\. (\d+) more frames?, (\d+) module-call frames folded\n)")))
      << e;
  const std::size_t folded = std::stoul(m[2]);
  counted += std::stoul(m[1]) + folded;
  const std::size_t shown = static_cast<std::size_t>(std::count(e.begin(), e.end(), '\n')) - 3;  // site, two counts
  EXPECT_EQ(counted + shown, site["stack"].size()) << e;
  // The frames folded are nn.Module's call machinery between the frames shown.
  std::size_t calls = 0, shown_at = 0;
  for (const auto& f : site["stack"]) {
    const std::string fn = f["function"];
    if (shown_at < shown && e.find("at " + fn + " (") != std::string::npos) ++shown_at;
    else if (shown_at > 0 && shown_at < shown)
      calls += fn.find("_call_impl") != std::string::npos || fn == "Sequential.forward";
  }
  EXPECT_GE(folded, 4u);
  EXPECT_EQ(calls, folded) << e;
}

TEST(SummaryView, FullShowsEveryFrame) {
  const std::string full = summary("--full " + kH100);
  EXPECT_EQ(full.find("frames folded"), std::string::npos);
  EXPECT_EQ(full.find("allocator frame"), std::string::npos);
  EXPECT_EQ(full.find("stack as peak consumer"), std::string::npos);
  EXPECT_NE(full.find("from small pool"), std::string::npos);
  const json& site = doc(kH100)["peak_consumers"][0];
  const std::string e = entry(full, "Peak memory consumers", 1);
  std::istringstream in(e);
  std::string line;
  std::getline(in, line);  // the site's line
  std::size_t i = 0;
  for (; std::getline(in, line); ++i) {
    ASSERT_LT(i, site["stack"].size()) << e;
    const json& f = site["stack"][i];
    const std::string fn = f["function"];
    const std::string want = (f.value("inlined", false) ? "[inlined] " : "") + (fn.empty() ? std::string("0x") : fn);
    EXPECT_EQ(line.rfind("        at " + want, 0), 0u) << i << ": " << line;
  }
  EXPECT_EQ(i, site["stack"].size());
  EXPECT_NE(e.find("at Module._call_impl ("), std::string::npos);
}

TEST(SummaryView, TemplateNamesElidedInTheDefaultTextOnly) {
  // The H100 trace has its frames' names: ATen's reduction kernel is a 300-character template.
  const std::string& t = text(kH100);
  const auto most = t.find("Most allocations (by count)");
  ASSERT_NE(most, std::string::npos);
  EXPECT_NE(t.find("[PyTorch] at::native::gpu_reduce_kernel<...>\n", most), std::string::npos) << t;
  EXPECT_EQ(t.find("gpu_reduce_kernel<float"), std::string::npos) << t;
  const std::string full = summary("--full " + kH100);
  EXPECT_NE(full.find("[PyTorch] at::native::gpu_reduce_kernel<float, float, 4, 4, at::native::func_wrapper_t<"),
            std::string::npos);
  EXPECT_EQ(full.find("gpu_reduce_kernel<...>"), std::string::npos);
  // The JSON label is the whole name (a schema: scripts read it).
  bool whole = false;
  for (const auto& s : doc(kH100)["most_allocations"])
    whole = whole || s["label"].get<std::string>().rfind("at::native::gpu_reduce_kernel<float, float, 4, 4,", 0) == 0;
  EXPECT_TRUE(whole) << doc(kH100)["most_allocations"].dump();
  EXPECT_EQ(summary("--json " + kH100).find("<...>"), std::string::npos);
}

TEST(SummaryView, DiffNamesAndCutsSitesAsTheSummaryDoes) {
  // The two traces' sites differ (one has stored names, one has not): every row is a change.
  auto r = run("(" + std::string(GPUHEAP_CLI) + " diff -q --top 3 " + kH200 + " " + kH100 + " 2>/dev/null)");
  ASSERT_EQ(r.code, 0) << r.out;
  const auto rows = r.out.find("Per-site change");
  ASSERT_NE(rows, std::string::npos) << r.out;
  const std::string t = r.out.substr(rows);
  EXPECT_NE(t.find("\n        [PyTorch] Block.forward (torch_job.py:49)\n        ... 6 allocator frames, 12 native "
                   "frames\n"),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("module-call frames folded\n"), std::string::npos) << t;
  EXPECT_EQ(t.find("at c10::cuda::CUDACachingAllocator"), std::string::npos) << t;
  EXPECT_EQ(t.find("at Module._call_impl"), std::string::npos) << t;
}

// The GPU's table opens the summary, not the 4 bytes of pinned host memory (issue 35).
TEST(SummaryView, TheDeviceTableComesBeforeTheHostOne) {
  const std::string& t = text(kH100);
  const auto device = t.find("gpuheap memory summary, device ID 0");
  const auto host = t.find("Host (no device)");
  ASSERT_NE(device, std::string::npos) << t;
  ASSERT_NE(host, std::string::npos) << t;
  EXPECT_LT(device, host) << t;
  EXPECT_LT(t.find("  device 0:  "), t.find("  host:      pinned host memory")) << t;
}

// Two peak consumers on one Python line (issue 35: #1 and #2 both `Block.forward
// (torch_job.py:49)`) each name the operator that tells them apart.
TEST(SummaryView, SitesOfOneLineNameTheirOperators) {
  const std::string& t = text(kH100);
  const std::string one = entry(t, "Peak memory consumers", 1), two = entry(t, "Peak memory consumers", 2);
  const std::string line = "Block.forward (torch_job.py:49) via at::";
  ASSERT_NE(one.find(line), std::string::npos) << one;
  ASSERT_NE(two.find(line), std::string::npos) << two;
  auto op = [&](const std::string& e) { return e.substr(e.find(" via "), e.find('\n') - e.find(" via ")); };
  EXPECT_NE(op(one), op(two));
  EXPECT_NE(op(one).find("addmm"), std::string::npos) << one;
  EXPECT_EQ(one.find("(anonymous namespace)"), std::string::npos) << one;
}
