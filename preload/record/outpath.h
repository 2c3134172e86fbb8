// Trace output path: pattern expansion and exclusive, never-clobbering file creation.
//
// The pattern (GPUHEAP_OUTPUT, default "./gpuheap.%n.%p.trace": %p pid, %h host, %r $RANK,
// %n program name) is the rule both halves share: common/outpath_pattern.h.
//
// Existing files are never clobbered: if PATH exists (as anything, including a dangling
// symlink), the number N = 1, 2, ... 9999 is inserted before the last extension of the
// file name ("gpuheap.x.7.trace" -> "gpuheap.x.7.1.trace"); a name without an extension
// gets ".N" appended. Files are opened O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC with
// mode 0600 (traces hold command lines and addresses: private to the user).
#pragma once

#include <cstddef>

#include "common/outpath_pattern.h"  // the pattern rule, shared with `gpuheap run`

namespace gpuheap {
namespace preload {

// Fills `vars` for the calling process; strings point into the caller's buffers.
void current_outpath_vars(common::OutpathVars* vars, char* host, std::size_t host_cap, char* prog,
                          std::size_t prog_cap) noexcept;

// What an existing `path` is when it is neither a regular file nor a symlink ("a character
// device", "a FIFO", "a directory", ...), else nullptr (absent, a file, a link). Such a
// target gets no trace and no suffixed sibling (GPUHEAP_OUTPUT=/dev/null must not create
// /dev/null.1): the sink maps and allocates its file, which a device or FIFO cannot be, so
// the recorder warns once and traces nothing (the program and the pool carry on).
const char* special_file_kind(const char* path) noexcept;

// Appends the line "<a><b>\n" to GPUHEAP_PATH_FILE (`gpuheap run`'s list of trace paths and
// tracing failures, analyzer/cli/run.cpp) in one O_APPEND write, so concurrent processes' lines
// stay whole. A newline in a or b is written `\n` and a backslash `\\` (a program whose name
// holds a newline names its trace so, through %n): a line is one entry whatever the path
// holds, and a path without either reads as before. The list is never created here and never followed through a symlink: opened
// O_WRONLY|O_APPEND|O_NOFOLLOW|O_NONBLOCK (a FIFO planted there cannot block us) without
// O_CREAT, and written only if it is a regular file with one link owned by our effective
// uid. `gpuheap run` creates it in a private 0700 directory and removes both when its
// command exits: a process that outlives the run finds no list and writes nothing, and one
// planted in its place (a symlink, a FIFO, another user's file, a hard link) is not
// written. False when nothing was written. Async-signal-safe (open, fstat, write, close).
bool append_to_path_file(const char* path_file, const char* a, const char* b) noexcept;

// Creates `path` exclusively (see above for the suffix rule). Returns the fd (close-on-exec,
// never 0..2: core/fds.h) and writes
// the path actually created into final_path; on failure returns -errno (final_path holds
// the last name tried).
int create_trace_file(const char* path, char* final_path, std::size_t cap) noexcept;

}  // namespace preload
}  // namespace gpuheap
