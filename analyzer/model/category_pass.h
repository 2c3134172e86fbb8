// Categories of one trace's allocations (categories.h), at the moments the summary reports:
// each device's peak (the same moment as Model's peak consumers), each OOM, the end, and per
// training step and phase found from frames. A second read of the trace: the categories need
// every stack's frames (symbolized by the caller, through `traits`), which the replay does
// not have. Memory: the live allocations and one record per site and category.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "analyzer/model/analysis.h"
#include "analyzer/model/categories.h"
#include "analyzer/model/model.h"

namespace gpuheap {

struct CategoryBytes {
  std::array<std::uint64_t, kNumCategories> bytes{}, count{};  // requested bytes, allocations
  void add(Category c, std::uint64_t b) {
    bytes[static_cast<std::size_t>(c)] += b, count[static_cast<std::size_t>(c)]++;
  }
  std::uint64_t of(Category c) const { return bytes[static_cast<std::size_t>(c)]; }
  std::uint64_t total() const;
  // The category of most of these bytes (of most allocations among zero-byte ones).
  Category dominant() const;
};

// Live bytes by category at one moment, with the sites behind each (largest first within a
// category) and the library labels behind `library`.
struct CategoryMoment {
  bool valid = false;
  int device = 0;
  std::uint64_t ts = 0;                 // trace clock
  TrainPhase phase = TrainPhase::none;  // the phase found from frames at that moment
  std::uint32_t step = 0;               // and its step (0: before the first)
  CategoryBytes totals;
  struct Site {
    std::uint32_t stack = 0;
    Category cat = Category::unknown;
    std::uint64_t bytes = 0, count = 0;
  };
  std::vector<Site> sites;                         // by category, then bytes descending, then stack
  std::map<std::string, std::uint64_t> libraries;  // library label -> bytes
};

// One phase instance found from frames: its step (1-based), phase, and the peak of live
// bytes by category inside it (device memory, all devices).
struct FoundPhase {
  std::uint32_t step = 0;
  TrainPhase phase = TrainPhase::none;
  std::uint64_t start = 0, end = 0;
  std::uint64_t peak = 0;  // live requested bytes at the instance's highest point
  CategoryBytes at_peak;   // those bytes by category (provisional at that moment: see docs)
};

struct CategoryReport {
  std::vector<CategoryMoment> peaks;  // index-aligned with Model::devices
  // index-aligned with Model::ooms: the categories as known at the OOM (final for what was
  // decided by then, else provisional: forward -> activation, ...; docs/categories.md), and
  // the same on that device just before the OOM's step began (`oom_since`, no sites): the
  // end of the previous step; before step 1 for an OOM in step 1; the start of the trace
  // (nothing live) for an OOM before any step.
  std::vector<CategoryMoment> ooms, oom_since;
  CategoryBytes leaked;                                              // live at the end (device memory)
  std::map<int, CategoryBytes> leaked_by_device;                     // the same per device
  std::unordered_map<std::uint32_t, CategoryBytes> by_stack;         // every allocation, whole trace
  std::unordered_map<std::uint32_t, CategoryBytes> leaked_by_stack;  // live at the end
  std::unordered_map<std::uint32_t, std::string>
      backward_caller;             // autograd-thread stacks: the line that called backward()
  std::vector<FoundPhase> phases;  // in order
  std::uint32_t steps = 0;
  bool saw_training = false;
  // Live requested bytes by category over time, index-aligned with Model::devices, each with
  // one entry per point of that device's timeline (Model's Timeline: the same buckets), taken
  // at the moment the bucket's requested maximum was reached and counting every allocation
  // in its final category: the entries of a point sum to its `requested`. Empty unless
  // categorize() was asked for them (a third read of the trace: category_timeline.cpp).
  using Live = std::array<std::uint64_t, kNumCategories>;
  std::vector<std::vector<Live>> timelines;
  // Every allocation's final category, by alloc record number from 0: kept where
  // categorize() was asked for CategoryTimelines::finals and decided_anything() (the input of
  // the merged timelines, category_timelines(Analysis...)).
  std::vector<Category> finals;
  // The category of most of a site's requested bytes (unknown for a stack never seen).
  Category site_category(std::uint32_t stack) const;
  // Whether anything was decided: a phase found from frames, or a stack rule that named an
  // allocation's category. Else every allocation is unknown, and views show no categories.
  bool decided_anything() const;
};

// Frames of one stack id -> its traits (kept by the caller for as long as the call runs).
using TraitsFn = std::function<const StackTraits&(std::uint32_t stack)>;
// What categorize() makes beyond the moments, where decided_anything(): CategoryReport::
// timelines (`read`: once more through the trace), or CategoryReport::finals, from which
// category_timelines(Analysis...) makes the timelines of several traces in one read.
enum class CategoryTimelines : std::uint8_t { none, read, finals };
// Reads m.info.path again (and once more for CategoryTimelines::read). Throws as TraceReader
// does on an unreadable trace.
CategoryReport categorize(const Model& m, const TraitsFn& traits,
                          CategoryTimelines timelines = CategoryTimelines::none);
// rep.timelines from the final category of every allocation (`finals`, by alloc record
// number from 0): category_timeline.cpp.
void category_timelines(const Model& m, const std::vector<Category>& finals, CategoryReport& rep);

// A GPU's live requested bytes by category across the processes on it (Analysis::merged):
// one entry per point of its timeline, at the moment of the bucket's requested maximum as the
// merge reached it, each process's allocations in their final categories and those of a
// process that decided nothing as `unknown`: the entries of a point sum to its `requested`.
struct MergedCategoryTimeline {
  std::vector<CategoryReport::Live> at;  // empty: none (no process on it decided anything)
  std::size_t undecided = 0;             // processes on it that decided nothing (their bytes: unknown)
  bool saw_training = false;             // a process on it found phases from frames
};
// Several traces: every trace's rep.timelines (reps[i], from categorize(CategoryTimelines::
// finals); those with timelines already or without decided_anything() are left as they are)
// and the merged GPUs' (index-aligned with a.merged), in one read of the traces in the
// order of the merge (merge_order.h). Throws as TraceReader does on an unreadable trace.
std::vector<MergedCategoryTimeline> category_timelines(const Analysis& a, const std::vector<CategoryReport*>& reps);

}  // namespace gpuheap
