// Live bytes by category while a trace is written (`gpuheap top`): the Classifier of
// analyzer/model/categories.h fed the trace's records in order, as they are read. A category
// shown live is the one known at that moment: final for what a stack rule decided (library,
// gradient through AccumulateGrad, framework_cache) or a phase change settled, else
// provisional -- what the allocation becomes if it lives on (forward: activation, backward:
// temporary, optimizer step: optimizer_state, construction: parameter; docs/categories.md).
// Once the trace ended, finish() gives the final categories of what is still live: those of
// `summary --json`'s `categories.leaked` for the same file.
#pragma once

#include <cstdint>
#include <map>
#include <unordered_map>

#include "analyzer/model/category_pass.h"
#include "format/trace.h"

namespace gpuheap::live {

class LiveCategories {
 public:
  // `traits`: the rules' view of a stack already in the trace's Model (kept while it runs).
  explicit LiveCategories(TraitsFn traits);
  // One record, in trace order, before the Model is fed it (allocs, frees, thread names; a
  // rolling window's snapshot, whose live set replaces this one's: see reconcile).
  void feed(const format::Record& r);
  // The trace ended: every live allocation gets its final category. Idempotent.
  void finish();

  // Requested bytes of device memory live now, and their allocations, by category, per device.
  const std::map<int, CategoryBytes>& devices() const { return by_device_; }
  // The category of most of a stack's live bytes now (unknown when it holds none).
  Category site_category(std::uint32_t stack) const;
  bool saw_training() const { return cls_.saw_training(); }

 private:
  struct Entry {
    std::uint32_t stack = 0;
    std::uint64_t bytes = 0;
    int dev = 0;
    Category cat = Category::unknown;
    bool device = false;  // holds device memory (format::holds_device_memory)
  };
  void count(const Entry& e, bool add);
  void recount(std::uint64_t id, Category c);
  void release(std::uint64_t id);
  void on_snapshot(const format::SnapshotRecord& r);
  void reconcile();

  TraitsFn traits_;
  Classifier cls_;
  std::unordered_map<std::uint64_t, Entry> live_;
  std::unordered_map<std::uint32_t, bool> autograd_;  // thread id -> an autograd thread
  std::map<int, CategoryBytes> by_device_;
  std::unordered_map<std::uint32_t, CategoryBytes> by_stack_;
  std::unordered_map<std::uint64_t, format::SnapLive> snap_;  // a snapshot's live set, being read
  bool finished_ = false;
};

}  // namespace gpuheap::live
