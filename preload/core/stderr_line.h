// gpuheap's own lines on stderr (warnings, "tracing to", the OOM report) must never end the
// program. When stderr is a pipe whose reader has gone (`job 2>&1 | head -1`, a closed log
// collector), write(2) raises SIGPIPE, whose default action kills the process: the job
// died of gpuheap's warning where it would have run on without gpuheap (found for issue 18).
// SIGPIPE is blocked around the write, and one it raised is consumed before the mask is
// restored, unless one was already pending (then it is the program's, and stays). EPIPE is
// then just a failed write, which the callers ignore.
//
// Async-signal-safe in practice (a crash handler may print a warning): sigpending,
// pthread_sigmask, write and sigtimedwait are single system calls on Linux.
#pragma once

#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstddef>

namespace gpuheap {
namespace detail {

inline void write_stderr(const void* buf, std::size_t n) noexcept {
  int saved = errno;
  sigset_t pipe_set, old, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  ssize_t r = write(STDERR_FILENO, buf, n);
  if (r < 0 && errno == EPIPE && !was_pending) {
    timespec zero{0, 0};
    sigtimedwait(&pipe_set, nullptr, &zero);  // the SIGPIPE this write raised (thread-directed)
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
}

}  // namespace detail
}  // namespace gpuheap
