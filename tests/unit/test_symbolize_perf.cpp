// Symbolizer throughput: many distinct addresses in large real modules (libc with its
// separate debug info when libc6-dbg is installed, libstdc++ from its symbol table, and
// this test binary with its big gtest-laden DWARF). Reports must symbolize 100k distinct
// addresses in seconds, so 10k per module must stay well under a second or two.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>

#include "analyzer/symbolize/symbolize.h"
#include "self_modules.h"

namespace {

double symbolize_range(const symtest::OwnedModule& m, const std::vector<symtest::OwnedModule>& all, std::size_t count,
                       std::size_t* named) {
  gpuheap::Symbolizer s;
  for (const auto& x : all) s.add_module(x.record());
  std::uint64_t stride = (m.hi - m.lo) / count;
  auto t0 = std::chrono::steady_clock::now();
  *named = 0;
  for (std::size_t i = 0; i < count; ++i) {
    auto frames = s.symbolize({m.lo + i * stride}, true);
    if (!frames.empty() && !frames.back().function.empty()) ++*named;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(SymbolizePerf, TenThousandDistinctAddressesPerModule) {
  auto mods = symtest::loaded_modules();
  constexpr std::size_t kCount = 10000;
  const symtest::OwnedModule* targets[] = {symtest::module_named(mods, "/libc.so.6"),
                                           symtest::module_named(mods, "/libstdc++.so.6"), &mods.front()};
  for (const auto* m : targets) {
    ASSERT_NE(m, nullptr);
    std::size_t named = 0;
    double secs = symbolize_range(*m, mods, kCount, &named);
    std::printf("symbolize: %zu addresses in %s: %.3f s (%zu with a function name)\n", kCount, m->path.c_str(), secs,
                named);
    // Addresses stride over data segments too; only the text part has names.
    EXPECT_GT(named, kCount / 10) << m->path;
    EXPECT_LT(secs, 5.0) << m->path;
  }
}

}  // namespace
