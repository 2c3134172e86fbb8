#include "preload/signals.h"

#include <errno.h>
#include <signal.h>

#include <atomic>

namespace gpuheap {
namespace detail {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGABRT, SIGBUS, SIGTERM};
constexpr int kN = sizeof kSignals / sizeof kSignals[0];
// Zero-initialized static storage (no dynamic initializer runs; clang rejects constinit here
// because of the union inside struct sigaction).
struct sigaction g_old[kN];
constinit std::atomic<FatalSignalFn> g_fn{nullptr};
constinit std::atomic<bool> g_installed{false};

int index_of(int sig) {
  for (int i = 0; i < kN; ++i)
    if (kSignals[i] == sig) return i;
  return -1;
}

void on_signal(int sig, siginfo_t* info, void* uc) {
  int saved_errno = errno;
  int i = index_of(sig);
  if (i < 0) return;
  const struct sigaction& old = g_old[i];
  bool has_fn = (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != nullptr
                                            : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
  if (FatalSignalFn fn = g_fn.load()) fn(sig, !has_fn);
  if (!has_fn) {
    // Restore the default and re-raise: the signal is blocked while we run, so it is
    // delivered (and kills the process with the original signal) as soon as we return.
    // A fault (SIGSEGV/SIGBUS) would also simply recur on return.
    sigaction(sig, &old, nullptr);
    raise(sig);
  } else {
    struct sigaction prev = old;
    // SA_RESETHAND: the kernel would have reset to SIG_DFL on this first delivery.
    if (prev.sa_flags & SA_RESETHAND) {
      g_old[i].sa_flags &= ~SA_SIGINFO;
      g_old[i].sa_handler = SIG_DFL;
    }
    if (prev.sa_flags & SA_SIGINFO) prev.sa_sigaction(sig, info, uc);
    else prev.sa_handler(sig);
  }
  errno = saved_errno;
}

}  // namespace

void signals_install(FatalSignalFn fn) noexcept {
  g_fn.store(fn);
  if (g_installed.exchange(true)) return;
  for (int i = 0; i < kN; ++i) {
    struct sigaction old {};
    if (sigaction(kSignals[i], nullptr, &old) != 0) continue;
    if (!(old.sa_flags & SA_SIGINFO) && old.sa_handler == SIG_IGN) continue;  // keep ignoring
    g_old[i] = old;
    struct sigaction sa {};
    sa.sa_sigaction = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
    sigaction(kSignals[i], &sa, nullptr);
  }
}

}  // namespace detail
}  // namespace gpuheap
