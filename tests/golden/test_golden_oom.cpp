// Golden OOM tests: the summary's OOM section (JSON and text) for a fragmentation OOM, a cap
// OOM and a real out-of-memory, with the numbers derived from golden_prog's patterns.
#include "tests/golden/golden.h"

namespace gpuheap::golden {
namespace {

// "frag" under GPUHEAP_LIMIT=40MiB: 20 x 2 MiB fill two 20 MiB segments (the whole cap); the
// even ones are freed: 20 MiB cached in ten 2 MiB holes, none adjacent.
constexpr std::int64_t kCap = 40 * MiB, kLive = 10 * 2 * MiB, kCached = kCap - kLive;

const Prog& frag() {
  static Prog p = run_prog("frag", {"GPUHEAP_LIMIT=40MiB"});
  return p;
}
const json& frag_json() {
  static json j = summary_json({frag().trace()});
  return j;
}

void expect_failing_call(const json& oom, int line) {
  ASSERT_FALSE(oom["stack"].empty()) << oom.dump();
  const json& f = oom["stack"][0];
  EXPECT_NE(f["function"].get<std::string>().find("failing_request"), std::string::npos) << f.dump();
  EXPECT_EQ(basename(f["file"]), "golden_prog.cpp");
  EXPECT_EQ(f["line"], line);
}

TEST(GoldenOom, Fragmentation) {
  ASSERT_EQ(frag().run.status, 0) << frag().run.err;
  const json& j = frag_json();
  ASSERT_EQ(j["ooms"].size(), 2u) << j["ooms"].dump();
  EXPECT_EQ(j["devices"][0]["num_ooms"], 2);
  const json& o = j["ooms"][0];
  EXPECT_EQ(o["device"], 0);
  EXPECT_EQ(o["kind"], "pooled");
  EXPECT_EQ(o["requested"], 4 * MiB);
  EXPECT_EQ(o["limit"], kCap);
  EXPECT_EQ(o["pool_reserved"], kCap);
  EXPECT_EQ(o["pool_allocated"], kLive);
  EXPECT_EQ(o["pool_largest_free"], 2 * MiB);
  EXPECT_EQ(o["replay_reserved"], kCap);
  EXPECT_EQ(o["replay_allocated"], kLive);
  EXPECT_EQ(o["held"], kCap);
  EXPECT_EQ(o["reserved_unused"], kCached);
  EXPECT_EQ(o["fits_without_fragmentation"], true);
  EXPECT_EQ(o["cause"], "fragmentation");
  EXPECT_NE(o["suggestion"].get<std::string>().find("allocate long-lived buffers first"), std::string::npos);
  EXPECT_EQ(o["fragmentation"]["free_pieces"], 10);
  EXPECT_EQ(o["fragmentation"]["free_bytes"], kCached);
  EXPECT_EQ(o["fragmentation"]["largest_free"], 2 * MiB);
  expect_failing_call(o, frag().lines.at("oom_frag"));
  ASSERT_EQ(o["top_live"].size(), 1u);
  EXPECT_EQ(o["top_live"][0]["bytes"], kLive);
  EXPECT_EQ(o["top_live"][0]["count"], 10);
  EXPECT_NE(top_frame(o["top_live"][0])["function"].get<std::string>().find("frag"), std::string::npos);
}

// 30 MiB (an own segment) while 40 MiB of the cap is held: the cap fails, the device has room;
// 20 MiB cached is less than the request, so fragmentation is not the cause.
TEST(GoldenOom, CapExceeded) {
  const json& j = frag_json();
  ASSERT_EQ(j["ooms"].size(), 2u);
  const json& o = j["ooms"][1];
  EXPECT_EQ(o["requested"], 30 * MiB);
  EXPECT_EQ(o["held"], kCap);
  EXPECT_EQ(o["reserved_unused"], kCached);
  EXPECT_EQ(o["fits_without_fragmentation"], false);
  EXPECT_EQ(o["cause"], "limit");
  EXPECT_NE(o["suggestion"].get<std::string>().find("GPUHEAP_LIMIT=40.0 MiB is what failed"), std::string::npos)
      << o["suggestion"];
  EXPECT_GT(o["device_free"].get<std::int64_t>(), 30 * MiB);
  expect_failing_call(o, frag().lines.at("oom_cap"));
}

// The in-process report (stderr) diagnosed both OOMs the same way as the summary.
TEST(GoldenOom, SameDiagnosisAsStderrReport) {
  const std::string& err = frag().run.err;
  auto first = err.find("CUDA out of memory. Tried to allocate 4.00 MiB");
  auto second = err.find("CUDA out of memory. Tried to allocate 30.00 MiB");
  ASSERT_NE(first, std::string::npos) << err;
  ASSERT_NE(second, std::string::npos) << err;
  auto in_first = [&](const char* s) {
    auto at = err.find(s, first);
    return at != std::string::npos && at < second;
  };
  EXPECT_TRUE(in_first("held by this process 40.00 MiB")) << err;
  EXPECT_TRUE(in_first("reserved but unused 20.00 MiB")) << err;
  EXPECT_TRUE(in_first("): with it gone the request would have fit")) << err;
  EXPECT_TRUE(in_first("allocate long-lived buffers first")) << err;
  EXPECT_NE(err.find("): with it gone the request would not have fit", second), std::string::npos) << err;
  EXPECT_NE(err.find("the per-process cap GPUHEAP_LIMIT=40.0 MiB is what failed", second), std::string::npos) << err;
}

// The summary's diagnosis lines of every OOM, in order: "fragmentation cost ..." and
// "suggestion: ...", without the text report's indent.
std::vector<std::string> summary_diagnosis(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if ((line.rfind("  fragmentation cost ", 0) == 0 && line.find("the request") != std::string::npos) ||
        line.rfind("  suggestion: ", 0) == 0)
      out.push_back(line.substr(2));
  return out;
}

// The stderr report and the summary say the same sentences (one rule, format/rules.h): each
// diagnosis line of the summary is a whole line of stderr, in the same order, and the JSON
// suggestion is the same string.
void expect_identical_diagnosis(const Prog& p, std::size_t ooms) {
  const std::vector<std::string> lines = summary_diagnosis(summary_text({p.trace()}));
  ASSERT_EQ(lines.size(), 2 * ooms) << summary_text({p.trace()});
  std::size_t at = 0;
  for (const std::string& l : lines) {
    const std::string want = "\ngpuheap:   " + l + "\n";
    auto found = p.run.err.find(want, at);
    ASSERT_NE(found, std::string::npos) << "stderr lacks \"" << l << "\":\n" << p.run.err;
    at = found + 1;
  }
  const json j = summary_json({p.trace()});
  ASSERT_EQ(j["ooms"].size(), ooms);
  for (std::size_t i = 0; i < ooms; ++i)
    EXPECT_EQ("suggestion: " + j["ooms"][i]["suggestion"].get<std::string>(), lines[2 * i + 1]);
}

TEST(GoldenOom, StderrAndSummaryDiagnosisAreIdentical) {
  ASSERT_EQ(frag().run.status, 0) << frag().run.err;
  expect_identical_diagnosis(frag(), 2);  // fragmentation, then the cap
}

TEST(GoldenOom, TextSection) {
  std::string t = summary_text({frag().trace()});
  auto at = t.find("OOM on device 0 at ");
  ASSERT_NE(at, std::string::npos) << t;
  EXPECT_NE(t.find("pooled request of 4.00 MiB failed", at), std::string::npos) << t;
  EXPECT_NE(t.find("  held by this process 40.0 MiB; pool reserved but unused 20.0 MiB\n", at), std::string::npos) << t;
  EXPECT_NE(t.find("  fragmentation cost 20.0 MiB here (free in the pool, largest free block 2.00 MiB): with it "
                   "gone the request would have fit\n",
                   at),
            std::string::npos)
      << t;
  EXPECT_NE(t.find("  suggestion: the pool's free memory is split", at), std::string::npos) << t;
  auto second = t.find("pooled request of 30.0 MiB failed", at);
  ASSERT_NE(second, std::string::npos) << t;
  EXPECT_NE(t.find("request would not have fit", second), std::string::npos);
  EXPECT_NE(t.find("suggestion: the per-process cap GPUHEAP_LIMIT=40.0 MiB is what failed", second), std::string::npos);
  char want[64];
  std::snprintf(want, sizeof want, "golden_prog.cpp:%d", frag().lines.at("oom_cap"));
  EXPECT_NE(t.find(want, second), std::string::npos) << t;
}

// A 32 MiB device, 16 MiB live, 24 MiB asked: no cap, nothing cached: the live data needs it.
TEST(GoldenOom, RealOutOfMemory) {
  Prog p = run_prog("real", {"SIMCUDA_TOTAL_MEMORY=32M"});
  ASSERT_EQ(p.run.status, 0) << p.run.err;
  json j = summary_json({p.trace()});
  ASSERT_EQ(j["ooms"].size(), 1u);
  const json& o = j["ooms"][0];
  EXPECT_EQ(o["requested"], 24 * MiB);
  EXPECT_EQ(o["limit"], 0);
  EXPECT_EQ(o["device_total"], 32 * MiB);
  EXPECT_EQ(o["device_free"], 16 * MiB);
  EXPECT_EQ(o["pool_reserved"], 16 * MiB);
  EXPECT_EQ(o["held"], 16 * MiB);
  EXPECT_EQ(o["reserved_unused"], 0);
  EXPECT_EQ(o["fits_without_fragmentation"], false);
  EXPECT_EQ(o["cause"], "live_allocations");
  expect_failing_call(o, p.lines.at("oom_real"));
  // The in-process report on stderr gives the same diagnosis.
  EXPECT_NE(p.run.err.find("CUDA out of memory. Tried to allocate 24.00 MiB"), std::string::npos) << p.run.err;
  EXPECT_NE(p.run.err.find("suggestion: the live allocations really need this much"), std::string::npos);
  expect_identical_diagnosis(p, 1);
}

}  // namespace
}  // namespace gpuheap::golden
