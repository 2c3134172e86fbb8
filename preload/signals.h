// Fatal-signal handlers (SIGSEGV, SIGABRT, SIGBUS, SIGTERM): flush the trace, then let the
// program die exactly as it would have without gpuheap.
//
//  - Previous disposition SIG_DFL (terminate): on_fatal(sig, true) writes `end`
//    (EndReason::signal); the default action is restored and the signal re-raised, so the
//    exit status (killed by SIG) and core dump behaviour are unchanged.
//  - Previous disposition SIG_IGN: we do not install anything for that signal.
//  - Previous disposition a handler: on_fatal(sig, false) only flushes (the program may
//    survive its own handler, so tracing continues), then the old handler is called with
//    the same arguments (sa_sigaction or sa_handler as it was registered).
// If the program installs its own handler later, it replaces ours; that is fine.
#pragma once

namespace gpuheap {
namespace detail {

using FatalSignalFn = void (*)(int sig, bool terminating) noexcept;
// Installs once per process (later calls only update the callback).
void signals_install(FatalSignalFn fn) noexcept;

}  // namespace detail
}  // namespace gpuheap
