// Memory by category (docs/categories.md) on a job shaped like a PyTorch one
// (py/torch_shaped.py: PyTorch's frame names, no torch) run on the simulated runtime: the
// OOM report names the category that grew since the OOM's step began.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

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

}  // namespace
}  // namespace gpuheap::test
