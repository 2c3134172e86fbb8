// Memory by category (docs/categories.md) on a job shaped like a PyTorch one
// (py/torch_shaped.py: PyTorch's frame names, no torch) run on the simulated runtime: the
// OOM report names the category that grew since the OOM's step began, and the report of
// several ranks stacks their GPU's merged timeline by category.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include <string>
#include "tests/category_areas.h"

#include "tests/preload/run_prog.h"

namespace gpuheap::test {
namespace {

constexpr std::uint64_t MiB = 1u << 20;
const std::string kTorchShaped = std::string(PY_SCRIPT_DIR) + "/torch_shaped.py";

// Step 4's forward runs out of memory at its 4th activation of 8 MiB: 4 MiB of parameters
// and 8 MiB of optimizer state live, and 3 activations (24 MiB) made since step 3 ended.
TEST(CategoryOom, NamesTheCategoryThatGrewSinceThePreviousStep) {
  auto r = run(PYTHON3_EXE, {kTorchShaped, "oom"}, {"GPUHEAP_POOL=0", "GPUHEAP_LIMIT=40MiB"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  ASSERT_NE(r.out.find("OOM step 4"), std::string::npos) << r.out << r.err;
  ASSERT_EQ(r.traces.size(), 1u);
  const auto text = run_cmd(kBuild + "/gpuheap summary -q " + r.traces[0] + " 2>&1").out;
  const auto oom = text.find("OOM on device 0 at ");
  ASSERT_NE(oom, std::string::npos) << text;
  const auto block = text.substr(oom, text.find("\n\n", oom) - oom);
  EXPECT_NE(block.find("  by category (as known at the OOM, in the forward of step 4 of 4; docs/categories.md):\n"
                       "    parameter 4.00 MiB (11.1%), optimizer_state 8.00 MiB (22.2%), activation 24.0 MiB "
                       "(66.7%)\n"
                       "  activation grew most since the end of step 3: +24.0 MiB (0 B -> 24.0 MiB)\n"),
            std::string::npos)
      << block;

  const auto js = run_cmd(kBuild + "/gpuheap summary -q --json " + r.traces[0] + " 2>/dev/null");
  ASSERT_EQ(js.status, 0);
  const auto doc = nlohmann::json::parse(js.out);
  ASSERT_EQ(doc["ooms"].size(), 1u);
  const auto& c = doc["ooms"][0]["categories"];
  EXPECT_EQ(c["step"], 4);
  EXPECT_EQ(c["phase"], "forward");
  EXPECT_EQ(c["totals"]["activation"]["bytes"], 24 * MiB);
  EXPECT_EQ(c["totals"]["activation"]["count"], 3);
  EXPECT_EQ(c["totals"]["parameter"]["bytes"], 4 * MiB);
  EXPECT_EQ(c["totals"]["optimizer_state"]["bytes"], 8 * MiB);
  EXPECT_EQ(c["since"]["reference"], "end_of_previous_step");
  EXPECT_EQ(c["since"]["step"], 4);
  EXPECT_EQ(c["since"]["totals"]["activation"]["bytes"], 0);
  EXPECT_EQ(c["since"]["totals"]["optimizer_state"]["bytes"], 8 * MiB);
  EXPECT_EQ(c["since"]["totals"]["gradient"]["bytes"], 0);  // zero_grad(set_to_none=True) freed them
  ASSERT_EQ(c["grew"].size(), 1u) << c.dump();
  EXPECT_EQ(c["grew"][0]["category"], "activation");
  EXPECT_EQ(c["grew"][0]["bytes"], 24 * MiB);
}

// Reads the child's stdout until a whole line `want`.
void wait_line(int out, const std::string& want) {
  std::string line;
  char c;
  while (read(out, &c, 1) == 1) {
    if (c != '\n') {
      line += c;
      continue;
    }
    if (line == want) return;
    line.clear();
  }
}

// The data `gpuheap report` embeds (JSON inside <script type="application/json">).
nlohmann::json page_data(const std::string& html) {
  const auto text = run_cmd("cat " + html).out;
  auto a = text.find("id=\"gpuheap-data\">");
  if (a == std::string::npos) return nullptr;
  a += std::string("id=\"gpuheap-data\">").size();
  return nlohmann::json::parse(text.substr(a, text.find("</script>", a) - a));
}

nlohmann::json summary_categories(const std::string& trace) {
  const auto js = run_cmd(kBuild + "/gpuheap summary -q --json " + trace + " 2>/dev/null");
  EXPECT_EQ(js.status, 0) << trace;
  return js.status == 0 ? nlohmann::json::parse(js.out)["categories"] : nlohmann::json();
}

// Three processes on the GPU of the simulated runtime: rank 0 trains one step and holds what
// it leaves (parameters, optimizer state) while a CUDA C program (no frame a rule reads: it
// decides nothing) holds 40 MiB and, meanwhile, rank 1 trains two steps. `gpuheap report` of
// the three stacks the GPU's merged timeline by category as it does each process's: at every
// point the areas add up to the merged requested line, and at its peak (rank 1's) they are
// rank 1's categories at its peak, plus rank 0's live at its end, plus the C program's 40 MiB
// as unknown (said on the chart: one process decided nothing).
TEST(CategoryReport, MergedTimelineOfRanksByCategory) {
  const std::string go = make_dir() + "/go";
  ProgRun rank1, hold;
  auto rank0 = run_with(
      PYTHON3_EXE, {kTorchShaped, "train", "1", "0", go}, {"GPUHEAP_POOL=0", "RANK=0", "WORLD_SIZE=2"}, true,
      [&](pid_t, int out) {
        wait_line(out, "held");
        hold = run_with("prog_hold", {"40", go}, {"GPUHEAP_POOL=0"}, true, [&](pid_t, int out2) {
          wait_line(out2, "held");
          rank1 = run(PYTHON3_EXE, {kTorchShaped, "train", "2", "0"}, {"GPUHEAP_POOL=0", "RANK=1", "WORLD_SIZE=2"});
          close(open(go.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600));
        });
      });
  for (const auto* p : {&rank0, &hold, &rank1}) {
    ASSERT_EQ(p->status, 0) << p->out << p->err;
    ASSERT_EQ(p->traces.size(), 1u) << p->err;
  }
  const std::string html = make_dir() + "/report.html";
  const auto rep = run_cmd(kBuild + "/gpuheap report -q -o " + html + " " + rank0.traces[0] + " " + rank1.traces[0] +
                           " " + hold.traces[0] + " 2>&1");
  ASSERT_EQ(rep.status, 0) << rep.out;
  const auto data = page_data(html);
  ASSERT_TRUE(data.is_object());
  const nlohmann::json* merged = nullptr;
  for (const auto& t : data["timelines"])
    if (t["label"].get<std::string>().find("all 3 processes on it together") != std::string::npos) merged = &t;
  ASSERT_NE(merged, nullptr) << data["timelines"].dump().substr(0, 2000);
  ASSERT_TRUE(merged->contains("categories")) << merged->dump().substr(0, 2000);
  const auto& cats = (*merged)["categories"];
  EXPECT_EQ(cats["undecided"], 1);
  const auto& names = cats["names"];
  const auto& series = cats["bytes"];
  const auto& req = (*merged)["requested"];
  const std::size_t peak = gpuheap::test::areas_sum_to_requested(cats, req);
  if (::testing::Test::HasFailure()) return;
  const auto c0 = summary_categories(rank0.traces[0]);
  const auto c1 = summary_categories(rank1.traces[0]);
  ASSERT_EQ(c1["at_peak"].size(), 1u);
  auto of = [](const nlohmann::json& totals, const std::string& name) -> std::uint64_t {
    return totals.contains(name) ? totals[name]["bytes"].get<std::uint64_t>() : 0;
  };
  const auto& peak1 = c1["at_peak"][0]["totals"];
  const auto& end0 = c0["leaked"];
  EXPECT_EQ(of(end0, "parameter"), 4 * MiB);
  EXPECT_EQ(of(end0, "optimizer_state"), 8 * MiB);
  EXPECT_EQ(of(peak1, "activation"), 8 * MiB);  // step 2's backward: what the forward saved
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const std::string n = names[k];
    const std::uint64_t want = of(peak1, n) + of(end0, n) + (n == "unknown" ? 40 * MiB : 0);
    EXPECT_EQ(series[k][peak].get<std::uint64_t>(), want) << n;
    total += want;
  }
  for (const char* n : {"parameter", "optimizer_state", "activation", "gradient", "unknown"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n << " in " << names.dump();
  EXPECT_EQ(total, req[peak].get<std::uint64_t>());
}

}  // namespace
}  // namespace gpuheap::test
