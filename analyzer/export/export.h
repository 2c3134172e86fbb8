// Exports of a trace to other tools' formats (export_*.cpp) and the self-contained HTML
// report (report_html.cpp). Every name taken from a trace is escaped for its target (JSON
// string, CSV field, pickle unicode, HTML text): a function or file name is never markup.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "analyzer/base/flat_map.h"
#include "analyzer/model/analysis.h"
#include "analyzer/summary/report.h"
#include "format/trace.h"

namespace gpuheap {

struct ExportOptions {
  std::string format;           // chrome|folded|speedscope|torch-snapshot|csv|rmm-csv
  std::string metric = "peak";  // folded: peak|leaked|allocated|count
  std::string output;           // path; "-" = stdout
  int device = -1;              // -1: every device
  bool all_frames = false;
  bool progress = true;
  bool force = false;                // replace an existing output file
  std::size_t max_entries = 100000;  // torch-snapshot: trace entries kept per device (0: all)
  // Every trace given, those --rank/--host/--pid left out too: the output is never one of them.
  std::vector<std::string> inputs;
};
// Runs `gpuheap export`; returns the exit status. Throws UsageError / InputError.
int export_command(const std::vector<std::string>& traces, const ExportOptions& opt);

struct ReportOptions {
  std::string output;            // the HTML file; "-" = stdout
  std::size_t points = 4096;     // timeline points per series (bucket maxima: peaks stay exact)
  std::size_t max_nodes = 4000;  // flame graph nodes per graph before the smallest merge
  bool all_frames = false;
  bool progress = true;
  bool force = false;  // replace an existing output file
  // Every trace given, those --rank/--host/--pid left out too: the output is never one of them.
  std::vector<std::string> inputs;
};
int report_command(const std::vector<std::string>& traces, const ReportOptions& opt);

namespace exporter {

// Replays one trace record by record into a Model (the running totals come from the same
// replay as every report) and calls fn(record, model) after each record was fed.
void walk_trace(const std::string& path, bool progress,
                const std::function<void(const format::Record&, const Model&)>& fn);
struct LiveTotals {
  std::int64_t requested = 0, allocated = 0, active = 0, reserved = 0;
};
LiveTotals device_totals(const Model& m, int device);
// Exporters (export_events.cpp, export_stacks.cpp, export_torch.cpp).
class OutFile;
void export_csv(const std::vector<std::string>& traces, const ExportOptions& opt, OutFile& out);
void export_rmm_csv(const std::string& trace, const ExportOptions& opt, OutFile& out);
void export_chrome(const std::vector<std::string>& traces, const ExportOptions& opt, OutFile& out);
void export_torch(const std::string& trace, const ExportOptions& opt, OutFile& out);
void export_folded(const Analysis& a, const ExportOptions& opt, OutFile& out);
void export_speedscope(const Analysis& a, const ExportOptions& opt, OutFile& out);

// Valid UTF-8 of arbitrary trace bytes (invalid sequences become U+FFFD), for formats whose
// readers reject anything else (pickle unicode, JSON).
std::string utf8_clean(const std::string& s);

// A call-stack tree (root = outermost frame) weighted by one metric; the flame graphs and
// folded/speedscope exports all come from it. Node 0 is the root.
struct FlameNode {
  std::string name, file;  // display name ("function", "module+0x..", "0x.."), source file
  int line = 0;
  std::uint64_t value = 0;  // this node and everything below it
  std::uint32_t parent = 0;
  std::vector<std::uint32_t> children;
  // value by category (kNumCategories entries) when the samples had categories, else empty
  std::vector<std::uint64_t> by_category;
};
struct FlameTree {
  std::vector<FlameNode> nodes;
  std::uint64_t total() const { return nodes.empty() ? 0 : nodes[0].value; }
};
enum class FlameMetric { peak, leaked, allocated, count };
FlameMetric parse_metric(const std::string& s);  // throws UsageError
const char* metric_name(FlameMetric m);

// One weighted stack: frames root-first (names only used through the tree).
struct FlameSample {
  std::vector<const Frame*> frames;  // root-first
  std::vector<std::string> prefix;   // synthetic outermost frames ("pid 42", "cuda:1"), if any
  std::uint64_t weight = 0;
  // Where it comes from: a.traces index, stack id, Model::devices index (peak: the device
  // whose peak it is). The weight's category, when a caller split it by category, else -1.
  std::size_t trace = 0, device = 0;
  std::uint32_t stack = 0;
  int category = -1;
};
// Samples of one metric over every trace and device of `a` (one resolver per trace, kept
// alive in `resolvers` because samples point into their frame caches; reused when the
// vector already holds one per trace). Sorted by weight
// (largest first), then by stack text, so that the output is deterministic.
// `fold_passthrough`: PyTorch's module-call and dispatcher frames (labels.h Passthrough) left
// out, as the text summary folds them (the report's flame graphs).
std::vector<FlameSample> flame_samples(const Analysis& a, FlameMetric m, bool all_frames,
                                       std::vector<std::unique_ptr<StackResolver>>& resolvers,
                                       bool fold_passthrough = false);
// Frame labels (display name, file, line) interned for build_flame. One instance serves the
// trees built from the same resolvers (the report's three flame graphs): each frame's name is
// formatted and hashed once, not once per tree, and a tree's per-frame step is then a lookup
// keyed by integers.
class FlameLabels {
 public:
  struct Label {
    std::string name, file;
    int line = 0;
  };
  std::uint32_t intern(std::string name, const std::string& file, int line);
  std::uint32_t of(const Frame* f);  // f must outlive this (frames of a kept resolver)
  const Label& operator[](std::uint32_t id) const { return labels_[id]; }

 private:
  // The label whose name is key_'s first name_len characters: key_ completed to its
  // identity, looked up, added when new.
  std::uint32_t lookup(std::size_t name_len, const std::string& file, int line);
  std::vector<Label> labels_;
  std::unordered_map<std::string, std::uint32_t> ids_;  // "name\x1ffile\x1fline" -> id
  // frame (its address) -> id: an integer-keyed open-addressing map, as a node-based map
  // allocates per entry, which cost more than the rest of building a tree.
  base::FlatMap<std::uint32_t> of_frame_;
  std::string key_;  // one buffer for every lookup's key: no string made per frame
};
// The tree of the samples: node 0 "all", every node's children largest first (ties by name).
// With more than max_nodes nodes (2 at least) it keeps about max_nodes of them: the largest
// ones (a parent is never smaller than its child, so the kept set is a tree), copied
// breadth-first; under each parent the dropped children become one "[N smaller frames]" node
// of their summed value. Only the nodes kept are made (names, child lists): the whole tree is
// plain numbers. `uncapped`, when given, is set to the whole tree's node count.
FlameTree build_flame(const std::vector<FlameSample>& samples, FlameLabels& labels, std::size_t max_nodes = SIZE_MAX,
                      std::size_t* uncapped = nullptr);

}  // namespace exporter
}  // namespace gpuheap
