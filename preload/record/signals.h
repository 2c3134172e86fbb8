// Fatal-signal handlers: close the trace, then let the program die (or go on) exactly as it
// would have without gpuheap. Every signal whose default action terminates the process
// (signal(7) "Term"/"Core") is covered except SIGKILL and the real-time signals, in two
// classes (signals.cpp has the list; docs/reliability.md "Signals" the reasons):
//
//  - chained: SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT, SIGTERM. Installed at start
//    (signals_install); a program's own handler is chained to and ours kept in front of it:
//  - default-only: SIGHUP, SIGINT, SIGQUIT, SIGTRAP, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM,
//    SIGXCPU, SIGXFSZ, SIGVTALRM, SIGPROF, SIGIO, SIGSYS, SIGSTKFLT, SIGPWR. Installed when
//    the trace file is created (signals_install_default_only): before that there is nothing
//    to close, and a program's start-up sees the dispositions it would see without gpuheap
//    (CPython installs its KeyboardInterrupt handler only if SIGINT is SIG_DFL then). Only a
//    signal at SIG_DFL is taken over; a program's handler, installed before or after ours,
//    is never chained or re-armed over: it decides what the signal means.
//
//  - Disposition before ours SIG_DFL (terminate): on_fatal(sig, true) writes `end`
//    (EndReason::signal); the default action is restored and the signal re-raised, so the
//    exit status (killed by SIG) and core dump behaviour are unchanged.
//  - SIG_IGN: we do not install anything for that signal.
//  - A handler (chained class only): on_fatal(sig, false) (nothing to flush: records are in
//    the file when appended, sink.h), then the handler is called with the same arguments
//    (sa_sigaction or sa_handler as registered; SA_RESETHAND emulated: the next delivery
//    takes the SIG_DFL path). If it returns with the signal pending and the disposition
//    SIG_DFL (it re-raised to die), on_fatal(sig, true) writes `end` first.
//
// A program that installs its own handler after us replaces ours. signals_rearm(), called
// by the sink's background thread every flush interval, notices that and, for a chained
// signal, puts ours back in front, with the program's handler as the one to chain to; ours is
// installed with the program's sa_mask and SA_NODEFER/SA_RESTART/SA_ONSTACK, so the program's
// handler runs with the mask and restart behaviour it asked for. A program that sets SIG_IGN
// is left alone; one that sets SIG_DFL gets the terminating path (for both classes). Until
// the next tick (or while the program's own handler is installed without us in front) a
// crash still loses no record, only the `end` record. Interposing sigaction/signal would
// chain without the delay but would export symbols the preload must not
// (preload/exports.map).
#pragma once

namespace gpuheap {
namespace preload {

using FatalSignalFn = void (*)(int sig, bool terminating) noexcept;
// Installs the chained class once per process (later calls only update the callback).
void signals_install(FatalSignalFn fn) noexcept;
// Installs the default-only class (once; after signals_install). Called when the trace
// file has been created. Not async-signal-safe.
void signals_install_default_only() noexcept;
// Re-installs ours in front of any handler installed after it (see above). Not
// async-signal-safe; called from the sink's background thread. Returns how many were re-armed.
int signals_rearm() noexcept;

}  // namespace preload
}  // namespace gpuheap
