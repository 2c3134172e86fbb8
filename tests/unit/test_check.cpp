// `check`: SIZE parsing, limits, baseline and tolerance.
#include <gtest/gtest.h>

#include <fstream>

#include "analyzer/base/error.h"
#include "analyzer/base/units.h"
#include "analyzer/summary/check.h"
#include "analyzer/summary/report.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {
constexpr std::uint64_t MiB = 1u << 20;

// Peak requested 3000 B... allocated 3 MiB, reserved 20 MiB, leaked 1 MiB.
Analysis sample(std::uint64_t extra = 0, const char* name = "chk.gh") {
  TraceBuilder b;
  b.stack(1, {0x1234});
  b.segment(0x7f0000000000ull, 20 * MiB, false);
  b.alloc(0x7f0000000000ull, 2 * MiB - 1000 + extra, 2 * MiB + extra, 1);
  b.alloc(0x7f0000000000ull + 4 * MiB, MiB, MiB, 1);
  b.free(0x7f0000000000ull);
  b.completed(0x7f0000000000ull);
  b.end();
  return analyze_one(b, name);
}
}  // namespace

TEST(Size, Parse) {
  EXPECT_EQ(parse_size("123B"), 123u);
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("512KiB"), 512u * 1024);
  EXPECT_EQ(parse_size("1.5GiB"), 1536u * MiB);
  EXPECT_EQ(parse_size("2GB"), 2'000'000'000u);
  EXPECT_EQ(parse_size("8G"), 8ull << 30);
  EXPECT_EQ(parse_size("8g"), 8ull << 30);
  EXPECT_EQ(parse_size("1mib"), MiB);
  EXPECT_EQ(parse_size("3 MB"), 3'000'000u);
  EXPECT_EQ(parse_size("10b"), 10u);
  EXPECT_EQ(parse_size("1TiB"), 1ull << 40);
  for (const char* bad : {"", "GiB", "1.2.3", "12XB", "-5", "1e3", "abc", "5 GiBs", "99999999999999999999B"})
    EXPECT_THROW(parse_size(bad), UsageError) << bad;
  // One rule with GPUHEAP_LIMIT: a number without a unit is refused, saying how to write it.
  for (const char* bare : {"8", "123", "1.5", "0.5"}) {
    try {
      parse_size(bare);
      ADD_FAILURE() << bare << " accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("has no unit: write " + std::string(bare) + "B for bytes"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(Check, EachLimitKind) {
  auto a = sample();
  auto m = measure(a);
  EXPECT_EQ(m.requested, static_cast<std::int64_t>(3 * MiB - 1000));
  EXPECT_EQ(m.allocated, static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(m.reserved, static_cast<std::int64_t>(20 * MiB));
  EXPECT_EQ(m.leaked, static_cast<std::int64_t>(MiB));
  struct Case {
    std::optional<std::uint64_t> CheckOptions::*field;
    std::uint64_t ok, bad;
    const char* name;
  };
  Case cases[] = {
      {&CheckOptions::max_requested, 3 * MiB - 1000, 3 * MiB - 1001, "peak requested bytes"},
      {&CheckOptions::max_allocated, 3 * MiB, 3 * MiB - 1, "peak allocated bytes"},
      {&CheckOptions::max_reserved, 20 * MiB, 20 * MiB - 1, "peak reserved bytes"},
      {&CheckOptions::max_leaked, MiB, MiB - 1, "leaked bytes"},
  };
  for (const auto& c : cases) {
    CheckOptions ok, bad;
    ok.*c.field = c.ok;
    bad.*c.field = c.bad;
    EXPECT_TRUE(run_check(a, ok).violations.empty()) << c.name;
    auto r = run_check(a, bad);
    ASSERT_EQ(r.violations.size(), 1u) << c.name;
    EXPECT_NE(r.violations[0].find(c.name), std::string::npos) << r.violations[0];
    EXPECT_NE(r.violations[0].find("top site"), std::string::npos) << r.violations[0];
  }
}

TEST(Check, BaselineAndTolerance) {
  auto base = sample(0, "base.gh");
  std::string path = TraceBuilder::dir() + "/baseline.json";
  std::ofstream(path) << summary_json(base, SummaryOptions{}).dump();
  auto m = measure_baseline(nlohmann::json::parse(std::ifstream(path)));
  EXPECT_EQ(m.allocated, static_cast<std::int64_t>(3 * MiB));
  EXPECT_EQ(m.leaked, static_cast<std::int64_t>(MiB));
  // +4% requested/allocated (leaks unchanged): passes at the default 5%, fails at 3%.
  auto grown = sample(static_cast<std::uint64_t>(0.04 * 3 * MiB), "grown.gh");
  CheckOptions o;
  o.baseline = path;
  EXPECT_TRUE(run_check(grown, o).violations.empty());
  o.tolerance_pct = 3;
  auto r = run_check(grown, o);
  EXPECT_EQ(r.violations.size(), 2u) << r.violations.size();  // requested and allocated grew
  bool saw_alloc = false;
  for (const auto& v : r.violations) saw_alloc |= v.find("peak allocated bytes") != std::string::npos;
  EXPECT_TRUE(saw_alloc);
  o.tolerance_pct = 0;
  EXPECT_TRUE(run_check(base, o).violations.empty());  // identical run
  std::ofstream(TraceBuilder::dir() + "/notsummary.json") << "{\"schema\": \"other\"}";
  o.baseline = TraceBuilder::dir() + "/notsummary.json";
  EXPECT_THROW(run_check(base, o), InputError);
}

// The top site is named by its label (analyzer/symbolize/labels.h): the first frame below PyTorch's
// allocator, not the allocator's own frame. Names come from frames stored in the trace.
TEST(Check, TopSiteIsNamedByItsLabel) {
  TraceBuilder b;
  const char* names[] = {"",
                         "void* c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(int)",
                         "at::detail::empty_cuda(long)",
                         "user_model_forward(int)",
                         "model.cpp",
                         "main"};
  for (std::uint32_t id = 1; id < 6; ++id) b.put(format::SymbolStringRecord{id, names[id]});
  auto frames = [&](std::uint64_t ip, std::uint32_t fn, std::uint32_t line) {
    format::SymbolFrameEntry e{fn, 4, line, 0};
    unsigned char buf[256];
    auto n = format::encode_symbol_frames(buf, sizeof buf, ip, &e, 1);
    b.data.insert(b.data.end(), buf, buf + n);
  };
  frames(0x401000, 1, 10), frames(0x402000, 2, 20), frames(0x403000, 3, 12), frames(0x404000, 5, 40);
  b.stack(1, {0x401000, 0x402000, 0x403000, 0x404000});
  b.alloc(0x9000000, MiB, MiB, 1, AllocKind::async);
  b.end();
  auto a = analyze_one(b, "chk_label.gh");
  CheckOptions o;
  o.max_leaked = 0;
  auto r = run_check(a, o);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_NE(r.violations[0].find("top site: 1.00 MiB in 1 allocations at user_model_forward (model.cpp:12)"),
            std::string::npos)
      << r.violations[0];
  EXPECT_EQ(r.violations[0].find("CachingAllocator"), std::string::npos) << r.violations[0];
}
