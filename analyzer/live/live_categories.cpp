// Live bytes by category (live_categories.h): the same classification as the summary's
// (analyzer/model/category_pass.cpp), counted as the records come.
#include "analyzer/live/live_categories.h"

#include <vector>

#include "format/rules.h"

namespace gpuheap::live {

LiveCategories::LiveCategories(TraitsFn traits) : traits_(std::move(traits)) {
  cls_.decided = [this](std::uint64_t id, Category c) { recount(id, c); };
  cls_.moved = [this](std::uint64_t id, Category c) { recount(id, c); };
}

void LiveCategories::count(const Entry& e, bool add) {
  const auto i = static_cast<std::size_t>(e.cat);
  auto apply = [&](CategoryBytes& b) {
    if (add) b.bytes[i] += e.bytes, b.count[i]++;
    else b.bytes[i] -= e.bytes, b.count[i]--;
  };
  if (e.device) apply(by_device_[e.dev]);
  apply(by_stack_[e.stack]);
}

void LiveCategories::recount(std::uint64_t id, Category c) {
  auto it = live_.find(id);
  if (it == live_.end() || it->second.cat == c) return;
  count(it->second, false);
  it->second.cat = c;
  count(it->second, true);
}

void LiveCategories::release(std::uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  cls_.on_free(id);
  count(it->second, false);
  live_.erase(it);
}

void LiveCategories::feed(const format::Record& r) {
  if (finished_) return;
  switch (r.type) {
    case format::RecordType::alloc: {
      const auto& a = r.alloc;
      const std::uint64_t k = format::space_key(a.ptr, a.kind);
      release(k);  // a lost free: retire the old one first (as Model and the summary do)
      auto ag = autograd_.find(a.tid);
      const Classifier::Alloc ca{k, a.ts, ag != autograd_.end() && ag->second, &traits_(a.stack)};
      Entry e{a.stack, a.requested, a.device, cls_.on_alloc(ca), format::holds_device_memory(a.kind)};
      live_[k] = e;
      count(e, true);
      break;
    }
    case format::RecordType::free:
      // A failed call freed nothing (Model::on_free).
      if (!(r.free.flags & format::kFlagFailed)) release(format::space_key(r.free.ptr, r.free.kind));
      break;
    case format::RecordType::thread: autograd_[r.thread.tid] = is_autograd_thread(r.thread.name); break;
    case format::RecordType::snapshot: on_snapshot(r.snapshot); break;
    default: break;
  }
}

// A rolling window's segment read from its start (top opened it, or a segment was replaced
// before it could be read): its snapshot holds what is live now, exactly (model_seed.cpp).
void LiveCategories::on_snapshot(const format::SnapshotRecord& r) {
  using P = format::SnapshotPart;
  if (r.part == P::begin) snap_.clear();
  if (r.part == P::live)
    for (std::uint32_t i = 0; i < r.count; ++i) {
      const format::SnapLive e = r.live(i);
      // Freed by the program, its block not yet reusable: no longer live memory.
      if (!(e.flags & format::kSnapPending)) snap_[format::space_key(e.ptr, e.kind)] = e;
    }
  if (r.part == P::end) reconcile();
}

// The live set becomes the snapshot's: an allocation known here keeps its category, one freed
// meanwhile goes, and one made in events never read counts as unknown (its phase is not known).
void LiveCategories::reconcile() {
  std::vector<std::uint64_t> gone;
  for (const auto& [k, e] : live_) {
    auto it = snap_.find(k);
    if (it == snap_.end() || it->second.stack != e.stack || it->second.requested != e.bytes) gone.push_back(k);
  }
  for (auto k : gone) release(k);
  for (const auto& [k, s] : snap_) {
    if (live_.count(k)) continue;
    const Entry e{s.stack, s.requested, s.device, Category::unknown, format::holds_device_memory(s.kind)};
    live_[k] = e;
    count(e, true);
  }
  snap_.clear();
}

void LiveCategories::finish() {
  if (finished_) return;
  finished_ = true;
  cls_.finish();
  if (cls_.saw_training()) return;
  // No phase found: what the lifetime rules would call temporary or other is unknown
  // (category_pass.cpp, without_phases).
  for (auto& [k, e] : live_)
    if (e.cat == Category::temporary || e.cat == Category::other) recount(k, Category::unknown);
}

Category LiveCategories::site_category(std::uint32_t stack) const {
  auto it = by_stack_.find(stack);
  return it == by_stack_.end() ? Category::unknown : it->second.dominant();
}

}  // namespace gpuheap::live
