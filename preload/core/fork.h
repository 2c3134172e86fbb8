// Fork handling for every module, in one order: the one pthread_atfork registration of the
// process, and the ranks that say who goes first. Modules hand in their handlers here;
// none calls pthread_atfork itself.
#pragma once

#include <atomic>

namespace gpuheap {
namespace preload {

// Lock order, outermost first: prepare runs top to bottom (each module takes its locks while
// the ones it may wait for from inside them are still free), parent and child bottom to top
// (a module is set up again only once everything it calls into is).
//   runtime   the context table, the pass-through and stream registries (runtime.cpp);
//             their locks are taken by the CUDA hooks before any recording, never under
//             a recorder lock. Child only: it rebuilds them and turns the pool off.
//   recorder  start/stop and device announcement (recorder.cpp g_ctl_mu, g_dev_mu); both are
//             held around calls into stacks, modules and the sink. Its child decides the
//             child's tracing from the sink's state, so it runs after the sink's.
//   stacks    the stack intern table (unwind.cpp).
//   modules   the loaded-module list (modules.cpp).
//   sink      the trace file (sink.cpp): the innermost lock, taken under all of the above.
//   signals   the handler-install lock (signals.cpp), a leaf around sigaction only, taken
//             under recorder's (signals_install) and never with another lock held inside.
//             Child only: it is rebuilt.
// A module without a lock of its own to hold across fork() leaves prepare/parent null; its
// child handler must not lock anything the parent's other threads may have held.
enum class ForkRank : int { runtime, recorder, stacks, modules, sink, signals, count };

using ForkFn = void (*)() noexcept;
struct ForkHandlers {
  ForkFn prepare = nullptr;
  ForkFn parent = nullptr;
  ForkFn child = nullptr;
};

// The handlers of each rank and their order; one instance is the process's (fork_set), the
// unit tests drive their own. No allocation, no locks: safe inside fork handlers.
class ForkOrder {
 public:
  void set(ForkRank rank, ForkHandlers h) noexcept;
  void run_prepare() const noexcept;
  void run_parent() const noexcept;
  void run_child() const noexcept;

 private:
  static constexpr int kN = static_cast<int>(ForkRank::count);
  // Atomic: a module may hand its handlers in (recorder_start) while another thread forks;
  // taken_ is what the fork in progress runs (fork.cpp: parent/child only after their prepare).
  struct Slot {
    std::atomic<ForkFn> prepare{nullptr}, parent{nullptr}, child{nullptr};
  };
  Slot slots_[kN];
  mutable ForkHandlers taken_[kN]{};
};

// Installs the handlers of `rank` in the process's order (replacing earlier ones of that
// rank); the first call registers the one pthread_atfork. Call at start-up, not from a
// fork handler.
void fork_set(ForkRank rank, ForkHandlers h) noexcept;

}  // namespace preload
}  // namespace gpuheap
