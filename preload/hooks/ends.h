// The ends of a process image that are not exit(): _exit/_Exit and the exec family. The C
// library's own functions behind our interposers (interpose.cpp), and the trace's `end`
// around them (record/recorder.h): a process that ends in _exit (a forked worker, Python's
// os._exit, many launchers) or execs another program after CUDA work leaves a finished
// trace, as one that calls exit() does.
#pragma once

#include <stdarg.h>

namespace gpuheap {
namespace preload {

// Writes `end` (async-signal-safe), then ends the process through the C library's _exit.
[[noreturn]] void end_then_exit(int status) noexcept;

// `end` before an exec, erased again if the exec returns (it failed): errno is the exec's.
class ExecScope {
 public:
  ExecScope() noexcept;
  ~ExecScope();
  ExecScope(const ExecScope&) = delete;
  ExecScope& operator=(const ExecScope&) = delete;

 private:
  bool ended_;
};

// The C library's execve, execvpe and fexecve (found at load, RTLD_NEXT).
int libc_execve(const char* path, char* const argv[], char* const envp[]) noexcept;
int libc_execvpe(const char* file, char* const argv[], char* const envp[]) noexcept;
int libc_fexecve(int fd, char* const argv[], char* const envp[]) noexcept;

// execl, execlp and execle: the list from `arg0` on (up to its NULL; for execle the
// environment follows) made an argv on the stack, as the C library does, then execve
// (search = false) or execvpe (true). Call inside an ExecScope.
int exec_list(const char* path, bool search, bool with_env, const char* arg0, va_list ap) noexcept;

}  // namespace preload
}  // namespace gpuheap
