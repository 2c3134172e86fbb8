// The one pthread_atfork registration of the process and the order it runs modules in
// (fork.h says why the order is what it is).
#include "preload/core/fork.h"

#include <pthread.h>

namespace gpuheap {
namespace detail {

void ForkOrder::set(ForkRank rank, ForkHandlers h) noexcept {
  int i = static_cast<int>(rank);
  if (i < 0 || i >= kN) return;
  slots_[i].prepare.store(h.prepare, std::memory_order_release);
  slots_[i].parent.store(h.parent, std::memory_order_release);
  slots_[i].child.store(h.child, std::memory_order_release);
}

void ForkOrder::run_prepare() const noexcept {
  for (int i = 0; i < kN; ++i)
    if (ForkFn f = slots_[i].prepare.load(std::memory_order_acquire)) f();
}

void ForkOrder::run_parent() const noexcept {
  for (int i = kN - 1; i >= 0; --i)
    if (ForkFn f = slots_[i].parent.load(std::memory_order_acquire)) f();
}

void ForkOrder::run_child() const noexcept {
  for (int i = kN - 1; i >= 0; --i)
    if (ForkFn f = slots_[i].child.load(std::memory_order_acquire)) f();
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

}  // namespace detail
}  // namespace gpuheap
