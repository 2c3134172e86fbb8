// Call-stack trees for the flame graphs and the folded/speedscope exports, built from the
// replay's per-site figures (peak consumers, leaks, per-site totals): nothing re-derived.
#include <algorithm>
#include <deque>
#include <iterator>
#include <unordered_map>

#include <fmt/compile.h>
#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/export/export.h"

namespace gpuheap::exporter {

std::string utf8_clean(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  std::size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    std::size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    bool ok = len != 0 && i + len <= n;
    for (std::size_t k = 1; ok && k < len; ++k) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len > 1) {
      // Overlong forms, surrogates and code points past U+10FFFF are invalid too.
      std::uint32_t cp = c & (0x7F >> len);
      for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
      static const std::uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= min_cp[len] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    }
    if (ok) {
      o.append(s, i, len);
      i += len;
    } else {
      o += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return o;
}

FlameMetric parse_metric(const std::string& s) {
  if (s == "peak") return FlameMetric::peak;
  if (s == "leaked") return FlameMetric::leaked;
  if (s == "allocated") return FlameMetric::allocated;
  if (s == "count") return FlameMetric::count;
  throw UsageError(fmt::format("unknown metric '{}' (peak, leaked, allocated or count)", s));
}
const char* metric_name(FlameMetric m) {
  switch (m) {
    case FlameMetric::peak: return "peak";
    case FlameMetric::leaked: return "leaked";
    case FlameMetric::allocated: return "allocated";
    case FlameMetric::count: return "count";
  }
  return "?";
}

namespace {
const Frame& no_stack_frame() {
  static const Frame f = [] {
    Frame x;
    x.function = "[no stack]";
    return x;
  }();
  return f;
}
}  // namespace

std::vector<FlameSample> flame_samples(const Analysis& a, FlameMetric metric, bool all_frames,
                                       std::vector<std::unique_ptr<StackResolver>>& resolvers, bool fold_passthrough) {
  std::vector<FlameSample> out;
  // Parallel to out: the stack's identity, for the sort. Without a prefix (one trace, one
  // device: the usual case) it is the resolver's cached key itself, not a copy of it.
  std::vector<const std::string*> keys;
  std::deque<std::string> prefixed;  // stable storage of the keys with a prefix
  // Resolvers given by an earlier call are reused (symbolizing once, warning once) when there
  // is one per trace and they show the same frames (the caller keeps them with `a`).
  if (resolvers.size() != a.traces.size() || (!resolvers.empty() && resolvers[0]->all_frames() != all_frames)) {
    resolvers.clear();
    for (const auto& mp : a.traces) resolvers.push_back(std::make_unique<StackResolver>(*mp, all_frames));
  }
  for (std::size_t ti = 0; ti < a.traces.size(); ++ti) {
    const Model& m = *a.traces[ti];
    StackResolver& res = *resolvers[ti];
    std::vector<std::string> pre;
    if (a.traces.size() > 1) pre.push_back(fmt::format("pid {}", m.info.pid));
    auto add = [&](std::uint32_t stack, std::uint64_t w, std::vector<std::string> prefix, std::size_t dev = 0) {
      if (w == 0) return;
      FlameSample s;
      s.prefix = std::move(prefix);
      s.weight = w;
      s.trace = ti, s.device = dev, s.stack = stack;
      const auto& fr = res.frames(stack);
      if (fr.empty()) s.frames.push_back(&no_stack_frame());
      for (auto it = fr.rbegin(); it != fr.rend(); ++it)
        if (!fold_passthrough || !passes_through(*it)) s.frames.push_back(&*it);
      if (s.frames.empty()) s.frames.push_back(&fr.front());  // only pass-through frames: keep the innermost
      if (s.prefix.empty()) {
        keys.push_back(&res.key(stack));
      } else {
        std::string k;
        for (const auto& p : s.prefix) k += p + ";";
        keys.push_back(&prefixed.emplace_back(k + res.key(stack)));
      }
      out.push_back(std::move(s));
    };
    switch (metric) {
      case FlameMetric::peak: {
        // Each device's consumers at its own peak; with several devices a device frame on top
        // (pinned host memory, device -1, has no peak consumers and does not count).
        std::size_t with_peak = 0;
        for (const auto& d : m.devices) with_peak += !d.peak_consumers.empty();
        for (std::size_t di = 0; di < m.devices.size(); ++di) {
          const auto& d = m.devices[di];
          auto p = pre;
          if (with_peak > 1) p.push_back(d.device < 0 ? std::string("host") : fmt::format("cuda:{}", d.device));
          for (const auto& s : d.peak_consumers) add(s.stack, s.bytes, p, di);
        }
        break;
      }
      case FlameMetric::leaked:
        for (const auto& l : m.leaks) add(l.stack, l.bytes, pre);
        break;
      case FlameMetric::allocated:
      case FlameMetric::count:
        for (std::uint32_t id = 0; id < m.sites.size(); ++id) {
          const auto& s = m.sites[id];
          add(id, metric == FlameMetric::count ? s.allocs : s.alloc_bytes, pre);
        }
        break;
    }
  }
  std::vector<std::size_t> order(out.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
    if (out[x].weight != out[y].weight) return out[x].weight > out[y].weight;
    return *keys[x] < *keys[y];
  });
  std::vector<FlameSample> sorted;
  sorted.reserve(out.size());
  for (auto i : order) sorted.push_back(std::move(out[i]));
  return sorted;
}

std::uint32_t FlameLabels::intern(std::string name, const std::string& file, int line) {
  key_ = std::move(name);
  return lookup(key_.size(), file, line);
}

std::uint32_t FlameLabels::lookup(std::size_t name_len, const std::string& file, int line) {
  // The same separators the tree's node identity always had: (name, file, line) as text.
  key_ += '\x1f';
  key_ += file;
  key_ += '\x1f';
  fmt::format_to(std::back_inserter(key_), FMT_COMPILE("{}"), line);
  auto it = ids_.find(key_);
  if (it != ids_.end()) return it->second;
  const auto id = static_cast<std::uint32_t>(labels_.size());
  ids_.emplace(key_, id);
  labels_.push_back({key_.substr(0, name_len), file, line});
  return id;
}

std::uint32_t FlameLabels::of(const Frame* f) {
  bool fresh = false;
  std::uint32_t& id = of_frame_.get(reinterpret_cast<std::uintptr_t>(f), &fresh);
  if (fresh) {  // lookup() leaves of_frame_ alone: id still refers to the slot
    key_.clear();
    append_frame_name(key_, *f);
    id = lookup(key_.size(), f->file, f->line);
  }
  return id;
}

namespace {

// The whole tree as numbers: a node's label (kRoot: "all"), parent and value, in the order
// nodes are first reached; children of node i: kids[first[i] .. first[i + 1]).
struct RawTree {
  static constexpr std::uint32_t kRoot = ~0u;
  std::vector<std::uint32_t> label{kRoot}, parent{0};
  std::vector<std::uint64_t> value{0};
  std::vector<std::uint32_t> first, kids;
  // Values by category (FlameSample::category), when the samples have one: a node of one
  // category only (nearly all) keeps its category in cat, one of several kMixed and its values
  // in `mixed`.
  static constexpr std::uint8_t kNoCat = 0xFF, kMixed = 0xFE;
  bool has_categories = false;
  std::vector<std::uint8_t> cat{kNoCat};
  std::unordered_map<std::uint32_t, std::vector<std::uint64_t>> mixed;

  // Before value[i] += w.
  void add_category(std::uint32_t i, std::uint8_t c, std::uint64_t w) {
    auto& k = cat[i];
    if (k == kNoCat) {
      k = c;
    } else if (k == kMixed) {
      mixed[i][c] += w;
    } else if (k != c) {
      auto& v = mixed[i];
      v.assign(kNumCategories, 0);
      v[k] = value[i], v[c] = w;
      k = kMixed;
    }
  }
  std::vector<std::uint64_t> by_category(std::uint32_t i) const {
    if (!has_categories) return {};
    if (cat[i] == kMixed) return mixed.at(i);
    std::vector<std::uint64_t> v(kNumCategories, 0);
    if (cat[i] != kNoCat) v[cat[i]] = value[i];
    return v;
  }

  auto kids_of(std::uint32_t i) const {
    return std::pair{kids.begin() + static_cast<std::ptrdiff_t>(first[i]),
                     kids.begin() + static_cast<std::ptrdiff_t>(first[i + 1])};
  }
  FlameNode make(const FlameLabels& labels, std::uint32_t i, std::uint32_t parent_now) const {
    FlameNode x;
    if (label[i] == kRoot) {
      x.name = "all";
    } else {
      const auto& l = labels[label[i]];
      x.name = l.name, x.file = l.file, x.line = l.line;
    }
    x.value = value[i];
    x.parent = parent_now;
    x.by_category = by_category(i);
    return x;
  }
};

// Merges the samples' paths into label/parent/value.
void merge_paths(RawTree& t, const std::vector<FlameSample>& samples, FlameLabels& labels) {
  // (parent, label) -> child: one integer-keyed lookup per frame. Sized for a tree of distinct
  // paths (no shared frames), up to a million nodes: growing it step by step cost more than
  // filling it.
  base::FlatMap<std::uint32_t> child;
  std::size_t steps = 0;
  for (const auto& s : samples) steps += s.prefix.size() + s.frames.size(), t.has_categories |= s.category >= 0;
  std::uint8_t cat = 0;  // the sample's category (one without: unknown)
  child.reserve_more(std::min<std::size_t>(steps, std::size_t{1} << 20));
  auto step = [&](std::uint32_t p, std::uint32_t l, std::uint64_t w) {
    bool fresh = false;
    std::uint32_t& at = child.get(std::uint64_t{p} << 32 | l, &fresh);
    if (fresh) at = static_cast<std::uint32_t>(t.label.size());
    const std::uint32_t node = at;
    if (fresh) {
      t.label.push_back(l);
      t.parent.push_back(p);
      t.value.push_back(0);
      if (t.has_categories) t.cat.push_back(RawTree::kNoCat);
    }
    if (t.has_categories) t.add_category(node, cat, w);
    t.value[node] += w;
    return node;
  };
  for (const auto& s : samples) {
    cat = static_cast<std::uint8_t>(s.category >= 0 ? s.category : static_cast<int>(Category::unknown));
    if (t.has_categories) t.add_category(0, cat, s.weight);
    t.value[0] += s.weight;
    std::uint32_t at = 0;
    for (const auto& p : s.prefix) at = step(at, labels.intern(p, "", 0), s.weight);
    for (const Frame* f : s.frames) at = step(at, labels.of(f), s.weight);
  }
}

// Children of node i: kids[first[i] .. first[i + 1]), listed in the order they were reached,
// then sorted largest first (ties by name).
void index_children(RawTree& t, const FlameLabels& labels) {
  const std::size_t n = t.label.size();
  t.first.assign(n + 1, 0);
  t.kids.assign(n - 1, 0);
  for (std::size_t i = 1; i < n; ++i) ++t.first[t.parent[i] + 1];
  for (std::size_t i = 0; i < n; ++i) t.first[i + 1] += t.first[i];
  {
    std::vector<std::uint32_t> next(t.first.begin(), t.first.end() - 1);
    for (std::uint32_t i = 1; i < n; ++i) t.kids[next[t.parent[i]]++] = i;
  }
  for (std::uint32_t i = 0; i < n; ++i) {
    auto b = t.kids.begin() + static_cast<std::ptrdiff_t>(t.first[i]);
    auto e = t.kids.begin() + static_cast<std::ptrdiff_t>(t.first[i + 1]);
    std::sort(b, e, [&](std::uint32_t x, std::uint32_t y) {
      if (t.value[x] != t.value[y]) return t.value[x] > t.value[y];
      return labels[t.label[x]].name < labels[t.label[y]].name;
    });
  }
}

// The nodes kept under the cap, as a mask. Rank by value (ties: lower index = nearer the root
// or earlier, so parents precede children); keep the first k. A child never outranks its
// parent: its value is at most the parent's and its index is larger. Merged nodes added below
// count against the cap. Only the first max_nodes ranks are ever read: those are selected,
// then sorted (the order is total, so they are the same nodes in the same order as a whole
// sort's).
std::vector<char> kept_nodes(const RawTree& t, std::size_t max_nodes) {
  const std::size_t n = t.label.size();
  const auto& value = t.value;
  std::vector<std::uint32_t> order(n);
  for (std::uint32_t i = 0; i < n; ++i) order[i] = i;
  auto by_rank = [&](std::uint32_t x, std::uint32_t y) { return value[x] != value[y] ? value[x] > value[y] : x < y; };
  const auto ranked = order.begin() + static_cast<std::ptrdiff_t>(max_nodes);
  std::nth_element(order.begin(), ranked, order.end(), by_rank);
  std::sort(order.begin(), ranked, by_rank);
  // Keeping the first k nodes adds one merged node per kept parent that loses children;
  // the largest k whose total fits the cap is found by bisection. total[k] for every k up to
  // the cap comes from one pass in rank order: node v kept adds a merged node if it has
  // children (none kept yet) and removes its parent's once the parent's last child is kept.
  std::vector<std::size_t> total(max_nodes + 1, 0);
  std::vector<char> keep(n, 0);
  {
    std::vector<std::uint32_t> unkept(n);
    for (std::size_t i = 0; i < n; ++i) unkept[i] = t.first[i + 1] - t.first[i];
    std::size_t merged = 0;
    for (std::size_t k = 1; k <= max_nodes; ++k) {
      const std::uint32_t v = order[k - 1];
      keep[v] = 1;
      if (unkept[v] > 0) ++merged;
      if (v != 0 && --unkept[t.parent[v]] == 0 && keep[t.parent[v]]) --merged;
      total[k] = k + merged;
    }
  }
  std::size_t lo = 1, hi = max_nodes;  // total[1] = 2 <= max_nodes
  while (lo < hi) {
    std::size_t mid = (lo + hi + 1) / 2;
    if (total[mid] <= max_nodes) lo = mid;
    else hi = mid - 1;
  }
  std::fill(keep.begin(), keep.end(), 0);
  for (std::size_t i = 0; i < lo; ++i) keep[order[i]] = 1;
  return keep;
}

// Breadth-first copy of the kept nodes, so that parents come before their children; a kept
// node's dropped children become one "[N smaller frames]" node.
FlameTree copy_kept(const RawTree& t, const FlameLabels& labels, const std::vector<char>& keep) {
  FlameTree out;
  std::vector<std::uint32_t> remap(t.label.size(), ~0u);
  std::vector<std::uint32_t> queue{0};
  out.nodes.push_back(t.make(labels, 0, 0));
  remap[0] = 0;
  for (std::size_t qi = 0; qi < queue.size(); ++qi) {
    std::uint32_t old = queue[qi], now = remap[old];
    std::uint64_t dropped = 0, dropped_n = 0;
    std::vector<std::uint64_t> dropped_by(t.has_categories ? kNumCategories : 0, 0);
    auto [b, e] = t.kids_of(old);
    for (auto it = b; it != e; ++it) {
      const std::uint32_t c = *it;
      if (!keep[c]) {
        dropped += t.value[c];
        ++dropped_n;
        if (t.has_categories) {
          const auto v = t.by_category(c);
          for (std::size_t k = 0; k < v.size(); ++k) dropped_by[k] += v[k];
        }
        continue;
      }
      remap[c] = static_cast<std::uint32_t>(out.nodes.size());
      out.nodes[now].children.push_back(remap[c]);
      out.nodes.push_back(t.make(labels, c, now));
      queue.push_back(c);
    }
    if (dropped_n) {
      FlameNode x;
      x.name = fmt::format("[{} smaller frame{}]", dropped_n, dropped_n == 1 ? "" : "s");
      x.value = dropped;
      x.parent = now;
      x.by_category = std::move(dropped_by);
      out.nodes[now].children.push_back(static_cast<std::uint32_t>(out.nodes.size()));
      out.nodes.push_back(std::move(x));
    }
  }
  return out;
}

}  // namespace

FlameTree build_flame(const std::vector<FlameSample>& samples, FlameLabels& labels, std::size_t max_nodes,
                      std::size_t* uncapped) {
  RawTree t;
  merge_paths(t, samples, labels);
  const std::size_t n = t.label.size();
  if (uncapped != nullptr) *uncapped = n;
  index_children(t, labels);
  if (max_nodes < 2) max_nodes = 2;
  if (n > max_nodes) return copy_kept(t, labels, kept_nodes(t, max_nodes));
  FlameTree out;  // the whole tree, in the order its nodes were reached
  out.nodes.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) {
    out.nodes.push_back(t.make(labels, i, t.parent[i]));
    auto [b, e] = t.kids_of(i);
    out.nodes.back().children.assign(b, e);
  }
  return out;
}

}  // namespace gpuheap::exporter
