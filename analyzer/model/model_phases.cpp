// Model: phases from phase records (gpuheap_mark/push/pop, NVTX ranges). Ranges nest per
// thread; a pop closes the innermost open range of its thread (a pop with none open is
// counted and ignored); ranges still open at the end close there. Phase records are rare,
// so the per-event cost is two maxima in sample(): the requested/allocated maxima since the
// last phase record, which each phase record folds into every open instance.
#include <algorithm>

#include "analyzer/model/model.h"

namespace gpuheap {

void Model::fold_phase_peaks() {
  for (auto i : open_phases_) {
    auto& ph = phases[i];
    if (ph.devices.size() < devices.size()) ph.devices.resize(devices.size());
    for (std::size_t d = 0; d < devices.size(); ++d) {
      ph.devices[d].peak_requested = std::max(ph.devices[d].peak_requested, devices[d].phase_peak_requested);
      ph.devices[d].peak_allocated = std::max(ph.devices[d].peak_allocated, devices[d].phase_peak_allocated);
    }
  }
  for (auto& d : devices) {
    d.phase_peak_requested = d.stat[kRequestedBytes][0].current;
    d.phase_peak_allocated = d.stat[kAllocatedBytes][0].current;
  }
}

namespace {

// Closes an instance at `ts`: live bytes at its end and the allocations made inside it.
void close_instance(PhaseInstance& ph, const std::vector<DeviceState>& devices, std::uint64_t ts) {
  ph.end = std::max(ts, ph.start);
  if (ph.devices.size() < devices.size()) ph.devices.resize(devices.size());
  for (std::size_t d = 0; d < devices.size(); ++d) {
    auto& x = ph.devices[d];
    const auto& st = devices[d].stat;
    x.end_requested = st[kRequestedBytes][0].current, x.end_allocated = st[kAllocatedBytes][0].current;
    // Stat::allocated of the allocation count is the number of allocations made so far;
    // a device first seen inside the instance has a base of 0.
    x.allocs = static_cast<std::uint64_t>(st[kAllocations][0].allocated) - x.allocs_base;
  }
}

}  // namespace

void Model::on_phase(const format::PhaseRecord& p) {
  fold_phase_peaks();
  auto& open = phase_stack_[p.tid];
  if (p.op == format::PhaseOp::pop) {
    if (open.empty()) {
      ++unmatched_pops;
      return;
    }
    const auto i = open.back();
    open.pop_back();
    if (i == kUntracked) return;
    close_instance(phases[i], devices, p.ts);
    open_phases_.erase(std::find(open_phases_.begin(), open_phases_.end(), i));  // at most kMaxOpenPhases
    return;
  }
  if (p.op == format::PhaseOp::push && open_phases_.size() >= kMaxOpenPhases) {
    ++untracked_ranges;
    open.push_back(kUntracked);
    return;
  }
  PhaseInstance ph;
  ph.name = std::string(p.name);
  ph.tid = p.tid;
  ph.depth = static_cast<int>(open.size());
  ph.mark = p.op == format::PhaseOp::mark;
  ph.source = p.source;
  ph.start = ph.end = p.ts;
  ph.devices.resize(devices.size());
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const auto& st = devices[d].stat;
    auto& x = ph.devices[d];
    x.peak_requested = x.end_requested = st[kRequestedBytes][0].current;
    x.peak_allocated = x.end_allocated = st[kAllocatedBytes][0].current;
    x.allocs_base = static_cast<std::uint64_t>(st[kAllocations][0].allocated);
  }
  phases.push_back(std::move(ph));
  if (p.op == format::PhaseOp::push) open.push_back(phases.size() - 1), open_phases_.push_back(phases.size() - 1);
}

// At finish, before the devices are sorted: close what is open at the end of the trace and
// name each per-device entry by its ordinal, in device order.
void Model::finish_phases() {
  fold_phase_peaks();
  const std::uint64_t end = info.has_end ? std::max(info.end_ts, info.last_ts) : info.last_ts;
  for (auto& [tid, open] : phase_stack_) {
    for (auto i : open) {
      if (i == kUntracked) continue;
      close_instance(phases[i], devices, end);
      phases[i].open_at_end = true;
    }
    open.clear();
  }
  open_phases_.clear();
  for (auto& ph : phases) {
    if (ph.devices.size() < devices.size()) ph.devices.resize(devices.size());
    for (std::size_t d = 0; d < devices.size(); ++d) ph.devices[d].device = dev_ids_[d];
    std::sort(ph.devices.begin(), ph.devices.end(),
              [](const PhaseDevice& a, const PhaseDevice& b) { return a.device < b.device; });
  }
  // Threads' records interleave slightly out of order: present by start (stable).
  std::stable_sort(phases.begin(), phases.end(),
                   [](const PhaseInstance& a, const PhaseInstance& b) { return a.start < b.start; });
}

}  // namespace gpuheap
