// Opening files whose names come from a trace or the command line (traces, baselines, ELF
// and debug files) so that no name can hang or surprise the analyzer: a FIFO would block
// open(2) until a writer comes, a tty or a device may have side effects, /proc files claim
// size 0. Every such open goes through open_regular().
#pragma once

#include <cstdint>
#include <string>

namespace gpuheap {

// stat()s `path` (anything but a regular file is refused unopened), opens it read-only with
// O_NONBLOCK | O_NOCTTY | O_CLOEXEC (should a FIFO or terminal be swapped in meanwhile, it
// cannot block the open nor become the controlling tty), then fstat()s the descriptor: only a
// regular file of at least `min_size` and at most `max_size` bytes is kept. Returns the fd
// (O_NONBLOCK is harmless on a regular file) and its size in *size, or -1 with *why set to
// a short reason ("a FIFO, not a regular file", strerror(errno), ...).
int open_regular(const std::string& path, std::uint64_t* size, std::string* why, std::uint64_t min_size = 0,
                 std::uint64_t max_size = UINT64_MAX);

// The whole of a regular file of at most max_bytes. Throws InputError naming the file.
std::string read_regular(const std::string& path, std::uint64_t max_bytes, const char* what);

}  // namespace gpuheap
