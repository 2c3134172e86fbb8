// Call-stack capture (libunwind) and interning: each distinct stack gets an id (from 1)
// and its `stack` record is appended to the sink exactly once per file, before the id is
// published, so any event that carries the id is necessarily later in the file.
#pragma once

#include <cstdint>

namespace gpuheap {
namespace preload {

// Sets capture parameters (GPUHEAP_STACKS, GPUHEAP_STACK_DEPTH, GPUHEAP_PYTHON_STACKS) and
// libunwind's per-thread cache policy (once). max_depth bounds the native frames; Python
// frames (record/pystack.h) fill the rest of a stack, up to format::kMaxStackDepth in all.
void stacks_configure(bool enabled, int max_depth, bool python = true) noexcept;
bool stacks_enabled() noexcept;
// True while the calling thread is inside libunwind for a capture (or its initialisation):
// a pipe made then is libunwind's, and stacks_place_pipe moves it (unwind.cpp says why).
bool stacks_unwinding() noexcept;
void stacks_place_pipe(int fds[2]) noexcept;

// Unwinds the calling thread. `skip` frames above the caller's frame are dropped: with
// skip = 0 the innermost ip is the return address into the function that called
// stacks_capture. Returns the interned id, 0 if disabled or the sink refused the record.
std::uint32_t stacks_capture(int skip) noexcept;

// Interns ips[0..depth) (innermost first). Exposed for tests and benchmarks.
std::uint32_t stacks_intern(const std::uint64_t* ips, int depth) noexcept;

// The ips of an interned stack (innermost first); returns the depth, 0 if unknown. O(table):
// for rare paths only (the OOM report). The ips stay valid until stacks_reset().
int stacks_lookup(std::uint32_t id, const std::uint64_t** ips) noexcept;

// Forgets every interned stack (new trace file: each stack must be written again).
// Only when no other thread can be interning (fork child, or tests between sessions).
void stacks_reset() noexcept;
std::uint64_t stacks_count() noexcept;

void stacks_fork_prepare() noexcept;
void stacks_fork_parent() noexcept;
void stacks_fork_child() noexcept;  // also resets the table

}  // namespace preload
}  // namespace gpuheap
