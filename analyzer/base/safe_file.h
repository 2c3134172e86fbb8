// Opening files whose names come from a trace or the command line (traces, baselines, ELF
// and debug files) so that no name can hang or surprise the analyzer: a FIFO would block
// open(2) until a writer comes, a tty or a device may have side effects, /proc files claim
// size 0. Every such open goes through open_regular().
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

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

// Output files (export, report, compress, symbolize): written under a temporary name beside
// the final one and renamed into place, so that a failed write never leaves a half file.

// Creates DIR/.NAME.gpuheap-tmp.XXXXXX beside `final_path` with O_CREAT | O_EXCL |
// O_NOFOLLOW and a random suffix (retried on a collision): a name planted in a shared
// directory (a symlink to the user's file, a file of another user) is never opened, where a
// predictable name + fopen("w") followed the link and truncated its target. `mode` is
// reduced by the umask as open(2) does. Returns the fd (O_CLOEXEC) and the name in *tmp;
// throws InputError naming `final_path`.
int create_beside(const std::string& final_path, mode_t mode, std::string* tmp);

// The permission bits for a new file made from `inputs`: rw for the owner, and for group
// and others what every input grants them (a 0600 trace gives a 0600 export, a 0644 one
// 0644). create_beside() then removes what the umask removes.
mode_t derived_mode(const std::vector<std::string>& inputs);

// Whether `path` names a device, FIFO or socket (following links): written directly, never
// through a temporary file (a rename cannot replace it, and its writes cannot be taken back).
bool is_special_output(const std::string& path);

// Refuses (UsageError, exit 2) to write `output` when it is one of `inputs` (the same file:
// same device and inode, through links or another spelling of the path), with or without
// `force`; and when it exists (as anything but a device, FIFO or socket) unless `force`.
// `cmd` prefixes the message ("export: OUT exists; --force replaces it").
void check_output_path(const std::string& output, const std::vector<std::string>& inputs, bool force, const char* cmd);

}  // namespace gpuheap
