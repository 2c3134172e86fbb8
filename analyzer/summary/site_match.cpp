#include "analyzer/summary/site_match.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string_view>

namespace gpuheap {

namespace {

bool named(const Frame& f) { return !f.function.empty() || !f.file.empty(); }

// Lines are compared outermost frame first: the order of the call tree, which an edit that
// inserts or deletes lines keeps among the sites of one function. Read from the frames in
// place: a deep stack's copy per site would cost as much as its frames.
int line_at(const std::vector<Frame>& fr, std::size_t i) {  // i counted from the outermost
  const Frame& f = fr[fr.size() - 1 - i];
  return named(f) ? f.line : 0;
}

bool lines_less(const std::vector<Frame>& x, const std::vector<Frame>& y) {
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i)
    if (line_at(x, i) != line_at(y, i)) return line_at(x, i) < line_at(y, i);
  return x.size() < y.size();
}

std::int64_t distance(const std::vector<Frame>& x, const std::vector<Frame>& y) {
  std::int64_t d = 0;
  for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
    const std::int64_t lx = line_at(x, i), ly = line_at(y, i);
    d += lx < ly ? ly - lx : lx - ly;
  }
  return d;
}

// Same function and file (or module+offset, or address) in every frame.
bool same_shape(const std::vector<Frame>& x, const std::vector<Frame>& y) {
  if (x.size() != y.size()) return false;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const Frame &f = x[i], &g = y[i];
    if (named(f) != named(g)) return false;
    if (named(f)
            ? (f.function != g.function || f.file != g.file)
            : (f.module.empty() != g.module.empty() ||
               (f.module.empty() ? f.ip != g.ip : f.offset != g.offset || base_name(f.module) != base_name(g.module))))
      return false;
  }
  return true;
}

std::uint64_t shape_hash(const std::vector<Frame>& fr) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](std::string_view s) {
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  };
  for (const auto& f : fr) {
    if (named(f)) {
      mix(f.function), mix(f.file);
    } else {
      const std::uint64_t v = f.module.empty() ? f.ip : f.offset;
      mix(base_name(f.module));
      mix(std::string_view(reinterpret_cast<const char*>(&v), sizeof v));
    }
  }
  return h;
}

struct Entry {
  long index;
  const std::vector<Frame>* frames;
};

// Above this many candidate pairs in one shape the alignment's table would be large; such a
// group is paired in order from the first site (still deterministic).
constexpr std::size_t kMaxAlignCells = std::size_t{1} << 22;

// Pairs every entry of `few` with one of `many` (few.size() <= many.size()), keeping the
// order, with the least total distance; ties pair the earlier entry of `many`.
std::vector<std::pair<std::size_t, std::size_t>> align(const std::vector<Entry>& few, const std::vector<Entry>& many) {
  const std::size_t n = few.size(), m = many.size();
  std::vector<std::pair<std::size_t, std::size_t>> out;
  if ((n + 1) * (m + 1) > kMaxAlignCells) {
    for (std::size_t i = 0; i < n; ++i) out.emplace_back(i, i);
    return out;
  }
  constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max() / 4;
  // cost[i][j]: the least total distance pairing few[0..i) into many[0..j).
  std::vector<std::int64_t> cost((n + 1) * (m + 1), kInf);
  auto at = [&](std::size_t i, std::size_t j) -> std::int64_t& { return cost[i * (m + 1) + j]; };
  for (std::size_t j = 0; j <= m; ++j) at(0, j) = 0;
  for (std::size_t i = 1; i <= n; ++i)
    for (std::size_t j = i; j <= m; ++j)
      at(i, j) = std::min(j > i ? at(i, j - 1) : kInf,
                          at(i - 1, j - 1) + distance(*few[i - 1].frames, *many[j - 1].frames));
  // Walking back from the end, leaving many[j-1] out whenever that costs no more puts the
  // pairs on the earliest entries of `many` the optimum allows.
  for (std::size_t i = n, j = m; i > 0;) {
    if (j > i && at(i, j - 1) <= at(i, j)) {
      --j;
    } else {
      out.emplace_back(i - 1, j - 1);
      --i, --j;
    }
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<LineMove> line_moves(const std::vector<Frame>& a, const std::vector<Frame>& b) {
  std::vector<LineMove> out;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i)
    if (named(a[i]) && a[i].line != b[i].line) out.push_back({i, a[i].line, b[i].line});
  return out;
}

std::vector<SitePair> match_sites(const std::vector<const std::vector<Frame>*>& a,
                                  const std::vector<const std::vector<Frame>*>& b) {
  struct Group {
    std::vector<Entry> a, b;
  };
  // Grouped by shape: a hash, then the frames themselves (a bucket holds one group per shape).
  std::map<std::uint64_t, std::vector<Group>> buckets;  // ordered: the pairs come out in one order
  auto group_of = [&](const std::vector<Frame>& fr) -> Group& {
    auto& bucket = buckets[shape_hash(fr)];
    for (auto& g : bucket) {
      const Entry& e = g.a.empty() ? g.b.front() : g.a.front();
      if (same_shape(*e.frames, fr)) return g;
    }
    return bucket.emplace_back();
  };
  for (std::size_t i = 0; i < a.size(); ++i) group_of(*a[i]).a.push_back({static_cast<long>(i), a[i]});
  for (std::size_t i = 0; i < b.size(); ++i) group_of(*b[i]).b.push_back({static_cast<long>(i), b[i]});
  auto by_lines = [](const Entry& x, const Entry& y) {
    if (lines_less(*x.frames, *y.frames)) return true;
    if (lines_less(*y.frames, *x.frames)) return false;
    return x.index < y.index;
  };
  std::vector<SitePair> out;
  for (auto& [hash, bucket] : buckets) {
    for (auto& g : bucket) {
      std::sort(g.a.begin(), g.a.end(), by_lines);
      std::sort(g.b.begin(), g.b.end(), by_lines);
      const bool a_fewer = g.a.size() <= g.b.size();
      const auto pairs = a_fewer ? align(g.a, g.b) : align(g.b, g.a);
      std::vector<bool> used_a(g.a.size()), used_b(g.b.size());
      for (auto [f, m] : pairs) {
        const std::size_t ia = a_fewer ? f : m, ib = a_fewer ? m : f;
        used_a[ia] = used_b[ib] = true;
        out.push_back({g.a[ia].index, g.b[ib].index});
      }
      for (std::size_t i = 0; i < g.a.size(); ++i)
        if (!used_a[i]) out.push_back({g.a[i].index, -1});
      for (std::size_t i = 0; i < g.b.size(); ++i)
        if (!used_b[i]) out.push_back({-1, g.b[i].index});
    }
  }
  return out;
}

}  // namespace gpuheap
