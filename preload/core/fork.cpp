// The one pthread_atfork registration of the process and the order it runs modules in
// (fork.h says why the order is what it is).
#include "preload/core/fork.h"

#include <pthread.h>

namespace gpuheap {
namespace preload {

void ForkOrder::set(ForkRank rank, ForkHandlers h) noexcept {
  int i = static_cast<int>(rank);
  if (i < 0 || i >= kN) return;
  // prepare last: whoever sees it (run_prepare, acquire) sees this rank's parent and child too.
  slots_[i].parent.store(h.parent, std::memory_order_release);
  slots_[i].child.store(h.child, std::memory_order_release);
  slots_[i].prepare.store(h.prepare, std::memory_order_release);
}

// The handlers are taken once, at prepare, and parent/child run what prepare took: a rank
// handed in while another thread forks (start-up) must not get its parent handler (an unlock)
// without its prepare (the lock). glibc runs one fork's handlers at a time (its atfork lock
// is held from the prepare handlers to the end of the parent ones), so one copy suffices.
void ForkOrder::run_prepare() const noexcept {
  for (int i = 0; i < kN; ++i) {
    ForkFn p = slots_[i].prepare.load(std::memory_order_acquire);
    taken_[i] = {p, slots_[i].parent.load(std::memory_order_acquire), slots_[i].child.load(std::memory_order_acquire)};
  }
  for (int i = 0; i < kN; ++i)
    if (taken_[i].prepare) taken_[i].prepare();
}

void ForkOrder::run_parent() const noexcept {
  for (int i = kN - 1; i >= 0; --i)
    if (taken_[i].parent) taken_[i].parent();
}

void ForkOrder::run_child() const noexcept {
  for (int i = kN - 1; i >= 0; --i)
    if (taken_[i].child) taken_[i].child();
}

namespace {

constinit ForkOrder g_order;  // constant-initialized: no constructor order to depend on
constinit pthread_once_t g_once = PTHREAD_ONCE_INIT;

void on_prepare() { g_order.run_prepare(); }
void on_parent() { g_order.run_parent(); }
void on_child() { g_order.run_child(); }
// Registered once for every module: the modules' order is then ours (ForkRank), not the
// order in which they happened to start. A child inherits the registration.
void register_once() { pthread_atfork(on_prepare, on_parent, on_child); }

}  // namespace

void fork_set(ForkRank rank, ForkHandlers h) noexcept {
  g_order.set(rank, h);
  pthread_once(&g_once, register_once);
}

}  // namespace preload
}  // namespace gpuheap
