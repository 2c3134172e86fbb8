// Descriptors gpuheap keeps open in the user's process. They must never be 0, 1 or 2: a job
// started with stdio closed (`prog 0<&- 1>&- 2>&-`) would otherwise find gpuheap's file at
// its "stderr", so its own messages (and gpuheap's) would land inside the trace. And a
// descriptor number is the program's to close and reuse (closerange(3, ~0U) in daemon
// libraries): before using a descriptor kept open, gpuheap checks that it still refers to the
// file it opened (device and inode), never writing, truncating or closing the program's file.
// Async-signal-safe: fcntl, close and fstat are single system calls.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gpuheap {
namespace preload {

// Returns fd itself when it is above stdio, else a close-on-exec duplicate >= 3 (and fd is
// closed). -errno when no duplicate could be made (fd closed then too: a descriptor we
// cannot move must not stay where the program's stdio belongs).
inline int fd_above_stdio(int fd) noexcept {
  if (fd < 0 || fd > STDERR_FILENO) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  int err = errno;
  close(fd);
  return moved >= 0 ? moved : -err;
}

// The identity of an open file, to recognise it later behind a descriptor number.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool known = false;
};

inline FileId file_id(int fd) noexcept {
  struct stat st {};
  FileId id;
  if (fd >= 0 && fstat(fd, &st) == 0) id.dev = st.st_dev, id.ino = st.st_ino, id.known = true;
  return id;
}

// Whether fd is open on the file `id` (false for a closed descriptor or an unknown id).
inline bool fd_is(int fd, const FileId& id) noexcept {
  FileId now = file_id(fd);
  return id.known && now.known && now.dev == id.dev && now.ino == id.ino;
}

// Holds the stdio numbers that are closed (on /dev/null, read-only: a write there fails with
// EBADF as on a closed descriptor) for as long as it lives, so that descriptors opened in
// code that gpuheap cannot place itself (libunwind opens its memory-validation pipe when it
// initialises) are never 0..2. Given back at the end unless the number holds another file.
class StdioPlaceholders {
 public:
  StdioPlaceholders() noexcept {
    for (int fd = 0; fd <= STDERR_FILENO; ++fd) {
      if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF) continue;
      int p = open("/dev/null", O_RDONLY | O_NOCTTY | O_CLOEXEC);
      if (p >= 0 && p != fd) close(p);  // another thread took the number first
      if (p == fd) id_[fd] = file_id(fd);
    }
  }
  ~StdioPlaceholders() {
    for (int fd = 0; fd <= STDERR_FILENO; ++fd)
      if (fd_is(fd, id_[fd])) close(fd);
  }
  StdioPlaceholders(const StdioPlaceholders&) = delete;
  StdioPlaceholders& operator=(const StdioPlaceholders&) = delete;

 private:
  FileId id_[STDERR_FILENO + 1];
};

}  // namespace preload
}  // namespace gpuheap
