#include "preload/record/signals.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>

#include <array>
#include <atomic>
#include <utility>

#include "preload/core/fork.h"

namespace gpuheap {
namespace preload {
namespace {

// Every signal whose default action terminates the process (signal(7): "Term" or "Core"),
// except SIGKILL (cannot be caught) and the real-time signals (below). Two classes:
//  - chained (the crash signals and SIGTERM): installed at start; a program's handler is
//    chained to and ours re-armed in front of it (signals.h);
//  - default-only (all others): installed when the trace file is created, and only while
//    the disposition is SIG_DFL; a program's own handler replaces ours and is left alone.
// Real-time signals (SIGRTMIN..SIGRTMAX) are left out: they have no meaning but the
// program's, and libraries pick a free one by finding its disposition at SIG_DFL.
struct SignalSpec {
  int sig;
  bool chained;
};
constexpr SignalSpec kSignals[] = {
    {SIGSEGV, true},    {SIGABRT, true},    {SIGBUS, true},   {SIGTERM, true},  {SIGILL, true},
    {SIGFPE, true},     {SIGHUP, false},    {SIGINT, false},  {SIGQUIT, false}, {SIGTRAP, false},
    {SIGUSR1, false},   {SIGUSR2, false},   {SIGPIPE, false}, {SIGALRM, false}, {SIGXCPU, false},
    {SIGXFSZ, false},   {SIGVTALRM, false}, {SIGPROF, false}, {SIGIO, false},   {SIGSYS, false},
#ifdef SIGSTKFLT
    {SIGSTKFLT, false},
#endif
#ifdef SIGPWR
    {SIGPWR, false},
#endif
};
constexpr int kN = sizeof kSignals / sizeof kSignals[0];
// Each installation of ours uses the next of kSlots handler functions, each with its own
// chain target. A program that saved the disposition it found (ours), installed its own
// and later restores the saved copy thereby restores the chain target that belonged to
// that copy; and a handler running on one thread never reads a slot that a re-arm on
// another thread is writing (the slot in use is kSlots installations old).
constexpr int kSlots = 8;

// Zero-initialized static storage (no dynamic initializer runs; clang rejects constinit here
// because of the union inside struct sigaction). Written under g_mu before the handler
// that reads the slot is installed.
struct sigaction g_chain[kN][kSlots];
constinit std::atomic<bool> g_reset[kN][kSlots];  // SA_RESETHAND target already delivered
constinit int g_slot[kN] = {};                    // slot of the last installation (g_mu)
constinit std::atomic<FatalSignalFn> g_fn{nullptr};
constinit std::atomic<bool> g_installed{false};
constinit std::atomic<bool> g_managed[kN];                   // installed for this signal (re-armed from then on)
constinit pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;  // install / re-arm

int index_of(int sig) {
  for (int i = 0; i < kN; ++i)
    if (kSignals[i].sig == sig) return i;
  return -1;
}

bool is_dfl(const struct sigaction& a) { return !(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_DFL; }
bool is_ign(const struct sigaction& a) { return !(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_IGN; }
bool has_fn(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) ? a.sa_sigaction != nullptr : !is_dfl(a) && !is_ign(a);
}

void restore_default_and_raise(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  // The signal is blocked while we run (unless SA_NODEFER), so it is delivered, and kills
  // the process with the original signal, as soon as we return. A fault recurs on return.
  raise(sig);
}

void handle(int slot, int sig, siginfo_t* info, void* uc) {
  int saved_errno = errno;
  int i = index_of(sig);
  if (i < 0) return;
  const struct sigaction chain = g_chain[i][slot];  // async-signal-safe: a plain copy
  FatalSignalFn fn = g_fn.load();
  bool reset = g_reset[i][slot].load(std::memory_order_acquire);
  if (!has_fn(chain) || reset) {
    if (fn) fn(sig, true);
    restore_default_and_raise(sig);
  } else {
    if (fn) fn(sig, false);
    // SA_RESETHAND: the kernel would have reset to SIG_DFL on this first delivery.
    if (chain.sa_flags & SA_RESETHAND) g_reset[i][slot].store(true, std::memory_order_release);
    if (chain.sa_flags & SA_SIGINFO) chain.sa_sigaction(sig, info, uc);
    else chain.sa_handler(sig);
    // The program's handler returned. If it re-raised the signal after restoring SIG_DFL
    // (the usual "clean up, then die as before"), the process dies when we return: the
    // trace gets its `end` record first.
    sigset_t pending;
    struct sigaction now {};
    if (fn && sigpending(&pending) == 0 && sigismember(&pending, sig) == 1 && sigaction(sig, nullptr, &now) == 0 &&
        is_dfl(now))
      fn(sig, true);
  }
  errno = saved_errno;
}

template <int K>
void on_signal(int sig, siginfo_t* info, void* uc) {
  handle(K, sig, info, uc);
}
template <int... K>
constexpr auto make_handlers(std::integer_sequence<int, K...>) {
  return std::array<void (*)(int, siginfo_t*, void*), sizeof...(K)>{&on_signal<K>...};
}
constexpr auto kHandlers = make_handlers(std::make_integer_sequence<int, kSlots>{});

bool is_ours(const struct sigaction& a) {
  if (!(a.sa_flags & SA_SIGINFO)) return false;
  for (auto h : kHandlers)
    if (a.sa_sigaction == h) return true;
  return false;
}

bool same(const struct sigaction& a, const struct sigaction& b) {
  bool fa = a.sa_flags & SA_SIGINFO, fb = b.sa_flags & SA_SIGINFO;
  if (fa != fb || a.sa_flags != b.sa_flags) return false;
  if (fa ? a.sa_sigaction != b.sa_sigaction : a.sa_handler != b.sa_handler) return false;
  return memcmp(&a.sa_mask, &b.sa_mask, sizeof a.sa_mask) == 0;
}

// Installs ours (next slot) in front of `target`. g_mu held. The previous disposition comes
// back from the same sigaction call, so a handler the program installed after our read is
// chained to as well, never dropped.
void install_in_front(int i, const struct sigaction& target, struct sigaction* prev) {
  int k = (g_slot[i] + 1) % kSlots;
  g_chain[i][k] = target;
  g_reset[i][k].store(false, std::memory_order_release);
  g_slot[i] = k;
  struct sigaction sa {};
  sa.sa_sigaction = kHandlers[k];
  if (has_fn(target)) {  // the program's handler runs with its own mask and flags
    sa.sa_mask = target.sa_mask;
    sa.sa_flags = SA_SIGINFO | (target.sa_flags & (SA_RESTART | SA_NODEFER | SA_ONSTACK));
  } else {
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  }
  if (sigaction(kSignals[i].sig, &sa, prev) != 0) *prev = target;
}

// What we never replace: ours, SIG_IGN, and for a default-only signal any handler of the
// program's (its handler wins: it decides what the signal means).
bool leave_alone(int i, const struct sigaction& a) {
  return is_ours(a) || is_ign(a) || (!kSignals[i].chained && !is_dfl(a));
}

// Puts ours in front of `cur` unless leave_alone(). Returns whether it did. g_mu held.
bool arm(int i, struct sigaction cur) {
  if (leave_alone(i, cur)) return false;
  struct sigaction prev {};
  install_in_front(i, cur, &prev);
  if (same(prev, cur)) return true;
  // Changed between our read and our install: chain to what was really replaced.
  if (leave_alone(i, prev)) {
    sigaction(kSignals[i].sig, &prev, nullptr);  // keep the program's (or its restored) choice
    return false;
  }
  install_in_front(i, prev, &cur);
  return true;
}

// Takes over the signals of one class (those not managed yet). g_mu held.
void manage(bool chained) {
  for (int i = 0; i < kN; ++i) {
    if (kSignals[i].chained != chained || g_managed[i].load(std::memory_order_relaxed)) continue;
    g_managed[i].store(true, std::memory_order_relaxed);
    struct sigaction cur {};
    if (sigaction(kSignals[i].sig, nullptr, &cur) == 0) arm(i, cur);
  }
}

}  // namespace

void signals_install(FatalSignalFn fn) noexcept {
  g_fn.store(fn);
  if (g_installed.exchange(true)) return;
  // A fork child gets a fresh lock: the parent's background thread may have held it.
  fork_set(ForkRank::signals, {nullptr, nullptr, []() noexcept { pthread_mutex_init(&g_mu, nullptr); }});
  pthread_mutex_lock(&g_mu);
  manage(/*chained=*/true);
  pthread_mutex_unlock(&g_mu);
}

void signals_install_default_only() noexcept {
  if (!g_installed.load()) return;
  pthread_mutex_lock(&g_mu);
  manage(/*chained=*/false);
  pthread_mutex_unlock(&g_mu);
}

int signals_rearm() noexcept {
  if (!g_installed.load()) return 0;
  int n = 0;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < kN; ++i) {
    struct sigaction cur {};
    if (g_managed[i].load(std::memory_order_relaxed) && sigaction(kSignals[i].sig, nullptr, &cur) == 0)
      n += arm(i, cur);
  }
  pthread_mutex_unlock(&g_mu);
  return n;
}

}  // namespace preload
}  // namespace gpuheap
