#include "preload/hooks/ends.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>

#include "preload/hooks/real.h"
#include "preload/record/recorder.h"

extern char** environ;

namespace gpuheap {
namespace preload {
namespace {

using exit_fn = void (*)(int);
using execve_fn = int (*)(const char*, char* const[], char* const[]);
using fexecve_fn = int (*)(int, char* const[], char* const[]);

// Resolved while the library loads, never on the _exit path: dlsym is not
// async-signal-safe, and _exit and execve may be called from a signal handler or a vfork
// child. Null only if a constructor that ran before ours already ends or execs; the
// fallbacks below are the system calls glibc makes.
constinit exit_fn g_exit = nullptr;
constinit execve_fn g_execve = nullptr;
constinit execve_fn g_execvpe = nullptr;
constinit fexecve_fn g_fexecve = nullptr;

template <class F>
F next_libc(const char* name) noexcept {
  auto dl = real_dlsym();
  return dl ? reinterpret_cast<F>(dl(RTLD_NEXT, name)) : nullptr;
}

__attribute__((constructor)) void resolve_libc_ends() {
  g_exit = next_libc<exit_fn>("_exit");
  g_execve = next_libc<execve_fn>("execve");
  g_execvpe = next_libc<execve_fn>("execvpe");
  g_fexecve = next_libc<fexecve_fn>("fexecve");
}

}  // namespace

void end_then_exit(int status) noexcept {
  recorder_end_at_exit();
  if (g_exit) g_exit(status);
  for (;;) syscall(SYS_exit_group, status);  // glibc's _exit, when ours ran before its lookup
}

ExecScope::ExecScope() noexcept : ended_(recorder_end_before_exec()) {}
ExecScope::~ExecScope() {
  if (!ended_) return;
  int saved = errno;  // the exec's
  recorder_resume_after_exec();
  errno = saved;
}

int libc_execve(const char* path, char* const argv[], char* const envp[]) noexcept {
  if (g_execve) return g_execve(path, argv, envp);
  return static_cast<int>(syscall(SYS_execve, path, argv, envp));
}

int libc_execvpe(const char* file, char* const argv[], char* const envp[]) noexcept {
  // Not async-signal-safe (POSIX): a lookup here is allowed where our constructor has not run.
  execve_fn f = g_execvpe ? g_execvpe : next_libc<execve_fn>("execvpe");
  if (f) return f(file, argv, envp);
  errno = ENOSYS;
  return -1;
}

int libc_fexecve(int fd, char* const argv[], char* const envp[]) noexcept {
  if (g_fexecve) return g_fexecve(fd, argv, envp);
  return static_cast<int>(syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH));
}

int exec_list(const char* path, bool search, bool with_env, const char* arg0, va_list ap) noexcept {
  va_list count;
  va_copy(count, ap);
  std::size_t n = 1;
  while (arg0 && va_arg(count, const char*)) ++n;
  va_end(count);
  char* argv[n + 1];  // NOLINT: the C library's execl builds the same array on its stack
  argv[0] = const_cast<char*>(arg0);
  for (std::size_t i = 1; i < n; ++i) argv[i] = va_arg(ap, char*);
  argv[n] = nullptr;
  if (arg0) (void)va_arg(ap, char*);  // the terminating NULL
  char* const* envp = with_env ? va_arg(ap, char* const*) : environ;
  return search ? libc_execvpe(path, argv, envp) : libc_execve(path, argv, envp);
}

}  // namespace preload
}  // namespace gpuheap
