#include "preload/record/outpath.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <initializer_list>

#include "preload/core/fds.h"

namespace gpuheap {
namespace preload {
void current_outpath_vars(common::OutpathVars* v, char* host, std::size_t host_cap, char* prog,
                          std::size_t prog_cap) noexcept {
  v->pid = static_cast<long>(getpid());
  host[0] = '\0';
  if (gethostname(host, host_cap) != 0) host[0] = '\0';
  host[host_cap - 1] = '\0';
  v->hostname = host;
  v->rank = getenv("RANK");
  prog[0] = '\0';
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = '\0';
  } else {
    // argv[0] is the first '\0'-terminated string of /proc/self/cmdline.
    int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
    n = fd >= 0 ? read(fd, exe, sizeof exe - 1) : -1;
    if (fd >= 0) close(fd);
    exe[n > 0 ? n : 0] = '\0';
  }
  const char* base = strrchr(exe, '/');
  base = base ? base + 1 : exe;
  snprintf(prog, prog_cap, "%s", base);
  v->program = prog;
}

const char* special_file_kind(const char* path) noexcept {
  struct stat st {};
  if (lstat(path, &st) != 0) return nullptr;
  switch (st.st_mode & S_IFMT) {
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFDIR: return "a directory";
    default: return nullptr;  // a regular file or a symlink: suffixed, never followed
  }
}

bool append_to_path_file(const char* path_file, const char* a, const char* b) noexcept {
  if (!path_file || !*path_file) return false;
  char line[4400];
  std::size_t n = 0;
  for (const char* part : {a, b}) {
    for (const char* c = part; *c; ++c) {
      bool esc = *c == '\\' || *c == '\n';
      if (n + (esc ? 2 : 1) + 1 > sizeof line) return false;  // a cut line would name another file
      if (esc) line[n++] = '\\';
      line[n++] = *c == '\n' ? 'n' : *c;
    }
  }
  line[n++] = '\n';
  int fd = open(path_file, O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 && st.st_uid == geteuid();
  // A write past RLIMIT_FSIZE would get the process SIGXFSZ (default: killed, by us). The
  // sink checks its windows the same way (sink.cpp). getrlimit is one system call.
  rlimit rl{};
  if (ok && getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      static_cast<std::uint64_t>(st.st_size) + n > rl.rlim_cur)
    ok = false;
  ok = ok && write(fd, line, n) == static_cast<ssize_t>(n);
  close(fd);
  return ok;
}

int create_trace_file(const char* path, char* final_path, std::size_t cap) noexcept {
  // Read-write: the sink maps the file (MAP_SHARED needs a readable descriptor).
  constexpr int kFlags = O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  if (snprintf(final_path, cap, "%s", path) >= static_cast<int>(cap)) return -ENAMETOOLONG;
  // Where the suffix goes: before the last '.' of the file name (not a leading dot).
  const char* slash = strrchr(path, '/');
  const char* name = slash ? slash + 1 : path;
  const char* dot = strrchr(name, '.');
  if (dot == name) dot = nullptr;
  std::size_t stem = dot ? static_cast<std::size_t>(dot - path) : strlen(path);
  const char* ext = dot ? dot : "";
  for (int i = 0; i < 10000; ++i) {
    if (i > 0 && snprintf(final_path, cap, "%.*s.%d%s", static_cast<int>(stem), path, i, ext) >= static_cast<int>(cap))
      return -ENAMETOOLONG;
    int fd = open(final_path, kFlags, 0600);
    if (fd >= 0) {
      // The umask may only remove bits; 0600 is what we want regardless of it.
      if (fchmod(fd, 0600) != 0) { /* best effort: created 0600 & ~umask already */
      }
      // Never at 0..2 (a job started with stdio closed): fds.h.
      fd = fd_above_stdio(fd);
      if (fd < 0) unlink(final_path);  // created empty, and ours: O_EXCL
      return fd;
    }
    if (errno != EEXIST) return -errno;
  }
  return -EEXIST;
}

}  // namespace preload
}  // namespace gpuheap
