// The Classifier: categories from lifetimes and the phases found from frames (categories.h).
#include "analyzer/model/categories.h"

namespace gpuheap {

// The phase an allocation belongs to. A stack without phase frames made while a forward is
// running belongs to it (the loss, computed outside any Module, is saved for backward like
// the rest); made after a backward or a step, it ends that phase (the main thread runs no
// code of its own inside backward or step: their allocations all show their frames).
TrainPhase Classifier::effective_phase(const Alloc& a) const {
  TrainPhase p = a.traits ? a.traits->phase : TrainPhase::none;
  if (p == TrainPhase::none && a.autograd_thread) p = TrainPhase::backward;
  if (p == TrainPhase::zero_grad) p = TrainPhase::none;  // zero_grad allocates only with set_to_none=False
  if (p == TrainPhase::none && phase_ == TrainPhase::forward) p = TrainPhase::forward;
  return p;
}

Category Classifier::provisional(const Live& l) const {
  if (l.state == State::decided) return l.cat;
  if (l.state == State::saved) return Category::activation;
  if (l.state == State::kept) return Category::other;
  if (l.state == State::grad) return Category::gradient;
  switch (l.phase) {
    case TrainPhase::forward: return Category::activation;
    case TrainPhase::backward: return Category::temporary;
    case TrainPhase::optimizer: return Category::optimizer_state;
    default: break;
  }
  if (l.construction) return Category::parameter;
  return saw_training_ ? Category::other : Category::unknown;
}

void Classifier::decide(std::uint64_t id, Live& l, Category c) {
  l.state = State::decided, l.cat = c;
  if (decided) decided(id, c);
}

Category Classifier::on_alloc(const Alloc& a) {
  const StackTraits* t = a.traits;
  Live l;
  if (t && (!t->library.empty() || t->framework_cache || t->accumulate_grad)) {
    // Decided by the stack alone; no phase is entered (a workspace made on first use says
    // nothing about which phase the program is in).
    l.state = State::decided;
    l.cat = !t->library.empty()  ? Category::library
            : t->framework_cache ? Category::framework_cache
                                 : Category::gradient;
    live_[a.id] = l;
    return l.cat;
  }
  if (t && t->backward_call) backward_caller_ = t->backward_caller;
  const TrainPhase p = effective_phase(a);
  if (p != phase_) enter(p);
  l.epoch = epoch_, l.phase = p, l.construction = t && t->construction;
  auto [it, inserted] = live_.insert_or_assign(a.id, l);
  (void)inserted;
  epoch_ids_.push_back(a.id);
  if (epoch_ids_.size() > 2 * live_.size() + 4096) compact_epoch();
  return provisional(it->second);
}

// A phase that never ends (a program with no training phase, followed live by `gpuheap top`
// for hours) must not keep every id it ever allocated: drop those no longer live in this
// epoch, which close_epoch() would skip anyway. Amortized: each id is dropped at most once
// and a compaction runs only after the list doubled past the live allocations.
void Classifier::compact_epoch() {
  std::size_t keep = 0;
  for (auto id : epoch_ids_) {
    auto it = live_.find(id);
    if (it != live_.end() && it->second.epoch == epoch_ && it->second.state == State::pending) epoch_ids_[keep++] = id;
  }
  epoch_ids_.resize(keep);
}

// The current phase ends: what its allocations left alive is decided by where it goes next.
void Classifier::close_epoch(TrainPhase next) {
  for (auto id : epoch_ids_) {
    auto it = live_.find(id);
    if (it == live_.end()) continue;
    auto& l = it->second;
    if (l.state != State::pending || l.epoch != epoch_) continue;
    switch (l.phase) {
      case TrainPhase::forward:
        if (next == TrainPhase::backward) {
          l.state = State::saved;  // final when freed: inside this backward, an activation
          saved_ids_.push_back(id);
        } else {
          decide(id, l, Category::other);  // outlived a forward no backward followed
        }
        break;
      case TrainPhase::backward:
        l.state = State::grad, l.steps_seen = opt_steps_, l.backward_no = backwards_;  // final when freed
        grad_ids_.push_back(id);
        if (moved) moved(id, Category::gradient);
        break;
      case TrainPhase::optimizer: decide(id, l, Category::optimizer_state); break;
      default: decide(id, l, l.construction ? Category::parameter : Category::other); break;
    }
  }
  epoch_ids_.clear();
  if (phase_ == TrainPhase::backward) {
    // Autograd frees what a node saved when the node has run: a forward allocation that
    // outlives the backward was not (only) saved for it (an output the program keeps).
    for (auto id : saved_ids_) {
      auto it = live_.find(id);
      if (it == live_.end() || it->second.state != State::saved) continue;
      it->second.state = State::kept;
      if (moved) moved(id, Category::other);
    }
    saved_ids_.clear();
  }
}

// A parameter's gradient lives from its backward until the zero_grad after the optimizer
// step that used it (set_to_none=True, PyTorch's default since 2.0), over any number of
// accumulating backwards. One still alive when a second step begins is kept across steps:
// gradients zeroed in place (set_to_none=False) or a workspace made lazily in backward by a
// framework whose frames have no symbols; the lifetime cannot tell them apart: unknown.
void Classifier::retire_grads() {
  std::size_t keep = 0;
  for (auto id : grad_ids_) {
    auto it = live_.find(id);
    if (it == live_.end() || it->second.state != State::grad) continue;
    if (it->second.steps_seen < opt_steps_) {
      decide(id, it->second, Category::unknown);
    } else {
      grad_ids_[keep++] = id;
    }
  }
  grad_ids_.resize(keep);
}

void Classifier::enter(TrainPhase p) {
  close_epoch(p);
  if (p == TrainPhase::optimizer) {
    retire_grads();  // before counting this step: a grad of the last step's backward stays
    ++opt_steps_;
  }
  if (p == TrainPhase::backward) ++backwards_;
  ++epoch_;
  if (p == TrainPhase::forward && stepped_since_forward_) ++step_, stepped_since_forward_ = false;
  if (p == TrainPhase::backward || p == TrainPhase::optimizer) stepped_since_forward_ = true;
  if (p != TrainPhase::none) saw_training_ = true;
  phase_ = p;
}

Category Classifier::on_free(std::uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return Category::unknown;
  Category c = Category::unknown;
  switch (it->second.state) {
    case State::decided: c = it->second.cat; break;
    case State::pending: c = Category::temporary; break;  // freed inside the phase that made it
    case State::saved: c = Category::activation; break;
    case State::kept: c = Category::other; break;
    case State::grad: c = Category::gradient; break;
  }
  live_.erase(it);
  return c;
}

Category Classifier::category(std::uint64_t id) const {
  auto it = live_.find(id);
  return it == live_.end() ? Category::unknown : provisional(it->second);
}

// Live at the end: what the last phase left is decided as at a phase change, but a forward
// allocation never freed (kept past its backward, or with no backward) is unknown: a cache,
// a workspace without symbols, or an output, the lifetime cannot tell.
void Classifier::finish() {
  for (auto& [id, l] : live_) {
    if (l.state == State::decided) continue;
    Category c = Category::unknown;
    if (l.state == State::saved) {
      c = Category::activation;  // the trace ended inside the backward
    } else if (l.state == State::grad) {
      // The last backward's gradients; one an earlier backward left is kept across steps
      // (retire_grads says why that is unknown; an optimizer step that allocates nothing,
      // as SGD's after its first, shows no phase to retire it at).
      c = l.backward_no == backwards_ ? Category::gradient : Category::unknown;
    } else if (l.state == State::pending && saw_training_) {
      if (l.phase == TrainPhase::backward) c = Category::gradient;
      if (l.phase == TrainPhase::optimizer) c = Category::optimizer_state;
      if (l.phase == TrainPhase::none && l.construction) c = Category::parameter;
      if (l.phase == TrainPhase::none && !l.construction && l.epoch != epoch_) c = Category::other;
    }
    decide(id, l, c);
  }
}

}  // namespace gpuheap
