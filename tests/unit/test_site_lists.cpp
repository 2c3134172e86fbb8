// SiteLists (report.h): the merged site lists the report page's text and JSON summaries and
// its flame graphs share must be exactly what each view computes on its own; and the flame
// graphs' tree, node cap and label table (flame.cpp) against their straightforward forms.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <unordered_map>

#include <fmt/format.h>

#include "analyzer/export/export.h"
#include "analyzer/summary/report.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {
constexpr std::uint64_t kSeg = 0x7f0000000000ull;
constexpr std::uint64_t MiB = 1u << 20;

// One process. Stacks 1 and 2 symbolize alike (they merge); stack 3 is NCCL's; stack 4 makes
// many small allocations (first by count, last by bytes); `v` varies sizes and counts so
// that the two processes' lists differ; an OOM has live sites.
TraceBuilder process(std::uint32_t pid, std::uint64_t v) {
  TraceBuilder b(1'700'000'000'000'000'000ull + pid * 1000, pid);
  b.module(0x400000, 0x500000, "/nonexistent/app");
  b.module(0x600000, 0x700000, "/nonexistent/libnccl.so.2");
  b.stack(1, {0x401000, 0x402000});
  b.stack(2, {0x401000, 0x402000});
  b.stack(3, {0x601000, 0x403000});
  b.stack(4, {0x404000, 0x402000});
  b.stack(5, {0x405000});
  b.segment(kSeg, 256 * MiB, false);
  std::uint64_t at = kSeg;
  auto alloc = [&](std::uint64_t bytes, std::uint32_t stack) {
    b.alloc(at, bytes, bytes, stack);
    std::uint64_t p = at;
    at += bytes;
    return p;
  };
  alloc((3 + v) * MiB, 1);
  alloc((2 + 2 * v) * MiB, 2);
  const std::uint64_t nccl = alloc((4 + v) * MiB, 3);
  for (std::uint64_t i = 0; i < 6 + v; ++i) {  // temporaries: freed before the next allocation
    std::uint64_t p = alloc(4096 * (i + 1), 4);
    b.free(p);
    b.completed(p);
  }
  alloc((1 + v) * MiB, 5);
  for (std::uint64_t i = 0; i < 3 + 2 * v; ++i) alloc(8192, 4);  // leaks
  b.free(nccl);
  b.completed(nccl);
  format::OomRecord o;
  o.ts = b.tick(), o.tid = 1, o.device = 0, o.requested = 300 * MiB, o.stack = 5;
  b.put(o);
  b.end();
  return b;
}

Analysis two_processes() {
  AnalyzeOptions o;
  o.progress = false;
  o.warn_truncated = false;
  return analyze({process(101, 0).write("sites-a.gh"), process(202, 3).write("sites-b.gh")}, o);
}

std::vector<SiteRow> merged_alone(const Model& m, std::vector<SiteRow> rows, bool by_count) {
  StackResolver res(m, false);
  return merge_sites(rows, res, by_count);
}

void expect_same(const std::vector<SiteRow>& a, const std::vector<SiteRow>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].stack, b[i].stack) << what << " #" << i;
    EXPECT_EQ(a[i].bytes, b[i].bytes) << what << " #" << i;
    EXPECT_EQ(a[i].count, b[i].count) << what << " #" << i;
    EXPECT_EQ(a[i].allocated, b[i].allocated) << what << " #" << i;
  }
}
}  // namespace

TEST(ReportSiteLists, EachListIsWhatMergingThatTraceAloneGives) {
  auto a = two_processes();
  ASSERT_EQ(a.traces.size(), 2u);
  SiteLists sites(a, false);
  std::vector<std::vector<SiteRow>> by_count_of;
  for (std::size_t t = 0; t < 2; ++t) {
    const Model& m = *a.traces[t];
    std::vector<SiteRow> by_count, temps, leaks;
    for (std::uint32_t id = 0; id < m.sites.size(); ++id) {
      const auto& s = m.sites[id];
      if (s.allocs) by_count.push_back({id, s.alloc_bytes, s.allocs, s.alloc_allocated});
      if (s.temporaries) temps.push_back({id, s.temporary_bytes, s.temporaries, s.temporary_allocated});
    }
    for (const auto& l : m.leaks) leaks.push_back({l.stack, l.bytes, l.count, l.allocated});
    // Asked twice: the second answer is the cached one.
    for (int pass = 0; pass < 2; ++pass) {
      expect_same(sites.most_allocations(t), merged_alone(m, by_count, true), "most_allocations");
      expect_same(sites.temporary(t), merged_alone(m, temps, true), "temporary");
      expect_same(sites.leaks(t), merged_alone(m, leaks, false), "leaks");
      for (std::size_t d = 0; d < m.devices.size(); ++d) {
        std::vector<SiteRow> rows;
        for (const auto& s : m.devices[d].peak_consumers) rows.push_back({s.stack, s.bytes, s.count, s.allocated});
        expect_same(sites.peak(t, d), merged_alone(m, rows, false), "peak");
        StackResolver res(m, false);
        auto libs = peak_by_library(merge_sites(rows, res), res);
        ASSERT_EQ(sites.peak_libraries(t, d).size(), libs.size());
        for (std::size_t i = 0; i < libs.size(); ++i) {
          EXPECT_EQ(sites.peak_libraries(t, d)[i].library, libs[i].library);
          EXPECT_EQ(sites.peak_libraries(t, d)[i].bytes, libs[i].bytes);
        }
      }
      ASSERT_FALSE(m.ooms.empty());
      for (std::size_t o = 0; o < m.ooms.size(); ++o) {
        std::vector<SiteRow> rows;
        for (const auto& s : m.ooms[o].top_live) rows.push_back({s.stack, s.bytes, s.count, s.allocated});
        expect_same(sites.oom_live(t, o), merged_alone(m, rows, false), "oom_live");
      }
    }
    // The fixture means something: stacks 1 and 2 merged, count order is not bytes order.
    ASSERT_GE(sites.most_allocations(t).size(), 3u);
    EXPECT_LT(sites.most_allocations(t).size(), by_count.size());
    EXPECT_NE(sites.most_allocations(t)[0].stack, merged_alone(m, by_count, false)[0].stack);
    by_count_of.push_back(sites.most_allocations(t));
  }
  EXPECT_NE(by_count_of[0][0].count, by_count_of[1][0].count);  // the two processes differ
}

TEST(ReportSiteLists, SharedWithTheFlameGraphsTheSummariesAreUnchanged) {
  auto a = two_processes();
  for (bool full : {false, true})
    for (const char* library : {"", "NCCL"}) {
      SummaryOptions o;
      o.full = full;
      o.library = library;
      const auto json_alone = summary_json(a, o).dump();
      const auto text_alone = summary_text(a, o);
      ASSERT_NE(text_alone.find("##### process 2 of 2"), std::string::npos);
      // As the report does: the flame graphs first, on the same resolvers, then both views;
      // and the other order.
      SiteLists sites(a, false);
      for (auto m : {exporter::FlameMetric::peak, exporter::FlameMetric::leaked, exporter::FlameMetric::allocated})
        EXPECT_FALSE(exporter::flame_samples(a, m, false, sites.resolvers()).empty());
      EXPECT_EQ(summary_json(a, o, sites).dump(), json_alone) << full << library;
      EXPECT_EQ(summary_text(a, o, sites), text_alone) << full << library;
      SiteLists other(a, false);
      EXPECT_EQ(summary_text(a, o, other), text_alone) << full << library;
      EXPECT_EQ(summary_json(a, o, other).dump(), json_alone) << full << library;
    }
}

TEST(ReportSiteLists, RefusesAnotherAnalysisOrFrameView) {
  auto a = two_processes();
  auto b = two_processes();
  SiteLists sites(a, false);
  SummaryOptions o;
  EXPECT_THROW(summary_json(b, o, sites), std::invalid_argument);
  EXPECT_THROW(summary_text(b, o, sites), std::invalid_argument);
  o.all_frames = true;
  EXPECT_THROW(summary_json(a, o, sites), std::invalid_argument);
  EXPECT_THROW(summary_text(a, o, sites), std::invalid_argument);
}

TEST(ReportStackResolver, LibraryIsTheLabelOfItsFrames) {
  auto a = two_processes();
  StackResolver res(*a.traces[0], false);
  for (std::uint32_t s = 0; s <= 6; ++s) EXPECT_EQ(res.library(s), library_label(res.frames(s))) << s;
  EXPECT_EQ(res.library(3), "NCCL");
  EXPECT_EQ(res.library(1), "app");
}

namespace {
// build_flame and cap_flame as they were before the tree was built as numbers and capped
// with totals from one pass: every node made, then a bisection whose every probe recounts
// the merged nodes. The reference build_flame must match node for node.
exporter::FlameTree build_by_nodes(const std::vector<exporter::FlameSample>& samples, exporter::FlameLabels& labels) {
  using exporter::FlameNode;
  exporter::FlameTree t;
  t.nodes.emplace_back();
  t.nodes[0].name = "all";
  std::unordered_map<std::uint64_t, std::uint32_t> child;
  auto step = [&](std::uint32_t parent, std::uint32_t label, std::uint64_t w) {
    auto [it, fresh] = child.emplace(std::uint64_t{parent} << 32 | label, static_cast<std::uint32_t>(t.nodes.size()));
    if (fresh) {
      const auto& l = labels[label];
      FlameNode n;
      n.name = l.name, n.file = l.file, n.line = l.line, n.parent = parent;
      t.nodes.push_back(std::move(n));
      t.nodes[parent].children.push_back(it->second);
    }
    t.nodes[it->second].value += w;
    return it->second;
  };
  for (const auto& s : samples) {
    t.nodes[0].value += s.weight;
    std::uint32_t at = 0;
    for (const auto& p : s.prefix) at = step(at, labels.intern(p, "", 0), s.weight);
    for (const Frame* f : s.frames) at = step(at, labels.of(f), s.weight);
  }
  for (auto& n : t.nodes)
    std::sort(n.children.begin(), n.children.end(), [&](std::uint32_t x, std::uint32_t y) {
      if (t.nodes[x].value != t.nodes[y].value) return t.nodes[x].value > t.nodes[y].value;
      return t.nodes[x].name < t.nodes[y].name;
    });
  return t;
}

void cap_by_probes(exporter::FlameTree& t, std::size_t max_nodes) {
  using exporter::FlameNode;
  if (max_nodes < 2) max_nodes = 2;
  if (t.nodes.size() <= max_nodes) return;
  std::vector<std::uint32_t> order(t.nodes.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    if (t.nodes[x].value != t.nodes[y].value) return t.nodes[x].value > t.nodes[y].value;
    return x < y;
  });
  std::vector<char> keep(t.nodes.size(), 0);
  auto total_for = [&](std::size_t k) {
    std::fill(keep.begin(), keep.end(), 0);
    for (std::size_t i = 0; i < k; ++i) keep[order[i]] = 1;
    std::size_t merged = 0;
    for (std::size_t i = 0; i < t.nodes.size(); ++i) {
      if (!keep[i]) continue;
      for (auto c : t.nodes[i].children)
        if (!keep[c]) {
          ++merged;
          break;
        }
    }
    return k + merged;
  };
  std::size_t lo = 1, hi = max_nodes;
  while (lo < hi) {
    std::size_t mid = (lo + hi + 1) / 2;
    if (total_for(mid) <= max_nodes) lo = mid;
    else hi = mid - 1;
  }
  total_for(lo);
  exporter::FlameTree out;
  std::vector<std::uint32_t> remap(t.nodes.size(), ~0u);
  std::vector<std::uint32_t> queue{0};
  out.nodes.push_back(t.nodes[0]);
  out.nodes[0].children.clear();
  remap[0] = 0;
  for (std::size_t qi = 0; qi < queue.size(); ++qi) {
    std::uint32_t old = queue[qi], now = remap[old];
    std::uint64_t dropped = 0, dropped_n = 0;
    for (auto c : t.nodes[old].children) {
      if (!keep[c]) {
        dropped += t.nodes[c].value;
        ++dropped_n;
        continue;
      }
      FlameNode n = t.nodes[c];
      n.children.clear();
      n.parent = now;
      remap[c] = static_cast<std::uint32_t>(out.nodes.size());
      out.nodes[now].children.push_back(remap[c]);
      out.nodes.push_back(std::move(n));
      queue.push_back(c);
    }
    if (dropped_n) {
      FlameNode n;
      n.name = fmt::format("[{} smaller frame{}]", dropped_n, dropped_n == 1 ? "" : "s");
      n.value = dropped;
      n.parent = now;
      out.nodes[now].children.push_back(static_cast<std::uint32_t>(out.nodes.size()));
      out.nodes.push_back(std::move(n));
    }
  }
  t = std::move(out);
}
}  // namespace

TEST(FlameCap, TreeOfNumbersCappedInOnePassIsWhatEveryNodeAndProbeGave) {
  std::mt19937_64 rng(7);
  // Random stacks over a small frame alphabet (shared prefixes, ties in value, siblings of
  // one name on two lines) and caps from tiny to the whole tree.
  std::vector<Frame> alphabet(12);
  for (std::size_t i = 0; i < alphabet.size(); ++i) {
    alphabet[i].function = fmt::format("f{}", i / 2);
    alphabet[i].line = static_cast<int>(i % 2);
  }
  std::size_t capped = 0;
  for (int round = 0; round < 60; ++round) {
    std::vector<exporter::FlameSample> samples(1 + rng() % 300);
    for (auto& s : samples) {
      s.weight = 1 + rng() % (round % 3 == 0 ? 4 : 100000);
      std::size_t depth = 1 + rng() % 9;
      for (std::size_t d = 0; d < depth; ++d) s.frames.push_back(&alphabet[rng() % (d < 2 ? 4 : alphabet.size())]);
      if (rng() % 5 == 0) s.prefix.push_back(fmt::format("pid {}", rng() % 3));
    }
    exporter::FlameLabels labels;
    const auto whole = build_by_nodes(samples, labels);
    for (std::size_t cap : {std::size_t{0}, std::size_t{2}, std::size_t{3}, std::size_t{5}, std::size_t{17},
                            whole.nodes.size() / 2, whole.nodes.size() - 1, whole.nodes.size(), SIZE_MAX}) {
      std::size_t uncapped = 0;
      auto fast = exporter::build_flame(samples, labels, cap, &uncapped);
      auto slow = whole;
      cap_by_probes(slow, cap);
      EXPECT_EQ(uncapped, whole.nodes.size());
      capped += fast.nodes.size() < whole.nodes.size();
      ASSERT_EQ(fast.nodes.size(), slow.nodes.size()) << round << " cap " << cap;
      for (std::size_t i = 0; i < fast.nodes.size(); ++i) {
        EXPECT_EQ(fast.nodes[i].name, slow.nodes[i].name) << round << " cap " << cap << " node " << i;
        EXPECT_EQ(fast.nodes[i].file, slow.nodes[i].file);
        EXPECT_EQ(fast.nodes[i].line, slow.nodes[i].line);
        EXPECT_EQ(fast.nodes[i].value, slow.nodes[i].value);
        EXPECT_EQ(fast.nodes[i].parent, slow.nodes[i].parent);
        EXPECT_EQ(fast.nodes[i].children, slow.nodes[i].children);
      }
    }
  }
  EXPECT_GT(capped, 100u);
}

TEST(FlameLabels, OneIdPerNameFileAndLine) {
  Frame a, b, c, d, e;
  a.function = "f", a.file = "x.cc", a.line = 3;
  b = a;                      // another frame, the same label
  c = a, c.line = 4;          // another line
  d.module = "/lib/libm.so";  // no function: module+offset
  d.offset = 0x10;
  e = d, e.ip = 99;  // same module+offset, another address: the same label
  exporter::FlameLabels labels;
  const auto ia = labels.of(&a);
  EXPECT_EQ(labels.intern("f", "x.cc", 3), ia);  // interned names and frames share the table
  const auto ip = labels.intern("pid 7", "", 0);
  EXPECT_EQ(labels.of(&b), ia);
  EXPECT_NE(labels.of(&c), ia);
  EXPECT_NE(labels.of(&d), ia);
  EXPECT_EQ(labels.of(&e), labels.of(&d));
  EXPECT_EQ(labels.intern("pid 7", "", 0), ip);
  EXPECT_EQ(labels[labels.of(&d)].name, "libm.so+0x10");
  EXPECT_EQ(labels[labels.of(&c)].line, 4);
  EXPECT_EQ(labels[ia].file, "x.cc");
  EXPECT_EQ(labels[ip].name, "pid 7");
}
