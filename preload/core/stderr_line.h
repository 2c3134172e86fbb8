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
//
// Only to a real stderr: the one the process started with (remembered at load, before any
// descriptor of ours exists). A job started with fd 2 closed (`prog 2>&-`) later finds its
// own files, or gpuheap's trace, at number 2; gpuheap's lines must not land in them. fd 2
// closed at load, or no longer the same file: gpuheap stays silent.
#pragma once

#include <errno.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>

#include "preload/core/fds.h"

namespace gpuheap {
namespace preload {

// unknown: never remembered (the recorder linked into a unit test): written as before.
enum class StderrAtLoad : int { unknown = 0, closed = 1, file = 2 };
inline constinit std::atomic<int> g_stderr_at_load{0};
inline constinit FileId g_stderr_id;

// At load (runtime.cpp's constructor), before gpuheap opens anything.
inline void stderr_remember() noexcept {
  g_stderr_id = file_id(STDERR_FILENO);
  g_stderr_at_load.store(static_cast<int>(g_stderr_id.known ? StderrAtLoad::file : StderrAtLoad::closed),
                         std::memory_order_release);
}

inline bool stderr_is_real() noexcept {
  switch (static_cast<StderrAtLoad>(g_stderr_at_load.load(std::memory_order_acquire))) {
    case StderrAtLoad::unknown: return true;
    case StderrAtLoad::closed: return false;
    case StderrAtLoad::file: break;
  }
  return fd_is(STDERR_FILENO, g_stderr_id);
}

inline void write_stderr(const void* buf, std::size_t n) noexcept {
  int saved = errno;
  if (!stderr_is_real()) {  // fstat may have set errno
    errno = saved;
    return;
  }
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

// Copies `s` into buf from `at` on as text that stays one line: backslash as `\\`, newline,
// tab and carriage return as `\n` `\t` `\r`, the other control bytes and DEL as `\xHH` (the
// analyzer's text_safe() writes them alike), so that a path holding a newline cannot start
// a line of its own on stderr. Stops before an escape that would not fit whole; buf is
// NUL-terminated. Returns the new end. Async-signal-safe (a crash handler's warning).
inline std::size_t append_escaped(char* buf, std::size_t cap, std::size_t at, const char* s) noexcept {
  static const char kHex[] = "0123456789abcdef";
  for (; *s; ++s) {
    unsigned char c = static_cast<unsigned char>(*s);
    char esc[4];
    std::size_t n = 0;
    if (c == '\\') esc[0] = '\\', esc[1] = '\\', n = 2;
    else if (c == '\n') esc[0] = '\\', esc[1] = 'n', n = 2;
    else if (c == '\t') esc[0] = '\\', esc[1] = 't', n = 2;
    else if (c == '\r') esc[0] = '\\', esc[1] = 'r', n = 2;
    else if (c < 0x20 || c == 0x7f) esc[0] = '\\', esc[1] = 'x', esc[2] = kHex[c >> 4], esc[3] = kHex[c & 15], n = 4;
    else esc[0] = static_cast<char>(c), n = 1;
    if (at + n + 1 > cap) break;
    for (std::size_t i = 0; i < n; ++i) buf[at++] = esc[i];
  }
  if (at < cap) buf[at] = '\0';
  return at;
}

}  // namespace preload
}  // namespace gpuheap
