// The trace sink: records are copied straight into the trace file's pages (MAP_SHARED
// windows from 64 KiB growing with the file to 4 MiB, disk space allocated with fallocate
// before a window is mapped),
// so an appended record is in the file the moment sink_append returns: no thread has to
// run (or get a CPU) for it to survive a SIGKILL, _exit or a crash. A background thread
// prepares the next window ahead of time and re-arms the fatal-signal handlers.
//
// Ordering: every record is appended under one short lock, so the file order equals the
// lock order, which respects happens-before: if thread A's append completes before thread
// B's starts (e.g. A's free, then the pool hands the same address to B), A's record is
// earlier in the file. The analyzer relies on this to replay address reuse.
//
// File end: while the process runs (and after a SIGKILL) the file ends with the allocated,
// not yet used part of the current window: zero bytes, which readers take for the end of
// the data (format/trace.h: a zero type byte). A clean close, a failure and the terminating
// signal path truncate the file to its last record.
//
// Memory and disk: at most two windows are mapped and allocated (128 KiB for a process with
// few events, 8 MiB at most, counted in RSS); nothing is buffered in the process. On an I/O
// error (disk full, RLIMIT_FSIZE, ...) the sink warns once and fails: later appends are
// dropped and counted.
//
// The descriptor: never 0..2 (outpath.h), and checked to be the trace file still (device and
// inode, core/fds.h) before each use. A program that closes it (closerange) keeps writing
// its records through the mapped windows; the next window reopens the file by its path, or,
// when the file is gone, tracing stops with one warning. The program's file at the old
// number is never written, truncated or closed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/trace.h"

namespace gpuheap {
namespace preload {

enum class SinkState : int {
  off = 0,      // never started, or tracing refused
  active = 1,   // accepting records
  pending = 2,  // tracing, but no file yet: it is created at the process's first event
                // (recorder.cpp), so processes that never record one leave no file
  stopped = 3,  // `end` written (or stop requested)
  failed = 4,   // I/O error: tracing given up
  opening = 5,  // file created, its opening records being written by the thread that
                // created it (sink_open); every other thread's append is refused
};

struct SinkCounters {
  std::uint64_t records = 0;         // records accepted into the current file
  std::uint64_t bytes = 0;           // bytes in the file (header included)
  std::uint64_t dropped = 0;         // records refused after stop/failure
  std::uint64_t producer_waits = 0;  // appends that had to map the next window themselves
  std::uint64_t writes = 0;          // file windows mapped
};

SinkState sink_state() noexcept;
void sink_set_state(SinkState s) noexcept;  // off/pending/failed transitions (recorder.cpp)

// Adopts `fd` (opened read-write, file header already written, `header_bytes` long) in state
// `opening`: only the calling thread may append (the `process` and `module` records) until
// it calls sink_publish(), so no other thread's event can come before `process`. On a
// failure to map the first window the state is `failed` (warned) and nothing was appended.
void sink_open(int fd, const char* path, std::uint64_t flush_ns, std::size_t header_bytes) noexcept;
// opening -> active: every thread may append from now on.
void sink_publish() noexcept;
const char* sink_path() noexcept;
// GPUHEAP_AGGREGATE: the events of one segment of a rolling window, in bytes (0: the whole
// trace in one file). Before sink_open; kept for later files (a forked child's).
void sink_set_aggregate(std::uint64_t budget) noexcept;

// Appends one framed record. `start_thread`: start the background thread if not running
// (metadata written at start passes false, so processes that never record an event get
// no thread). False = dropped.
bool sink_append(const void* rec, std::size_t n, bool start_thread = true) noexcept;

// Appends an alloc, free, free_completed or segment_* event as a compact record (format
// version 5), encoded under the lock against the records before it. False = dropped.
bool sink_append_event(const format::AllocRecord& r) noexcept;
bool sink_append_event(const format::FreeRecord& r) noexcept;
bool sink_append_event(const format::FreeCompletedRecord& r) noexcept;
bool sink_append_event(const format::SegmentRecord& r, bool is_free) noexcept;

void sink_flush() noexcept;  // waits for an append in progress; appended = in the file
// Appends `end`, stops the background thread, truncates the file to its end, closes it.
void sink_close(format::EndReason reason) noexcept;
// Signal-handler path: try-locks only (bounded wait), no allocation. With write_end,
// appends `end` (`reason`), stops accepting and truncates the file to its end; without,
// nothing is left to do (appended records are in the file already). Also the path of
// _exit/_Exit, which may be called from a signal handler or a vfork child. Does nothing in
// a process that did not open this file (a vfork child shares the parent's memory).
void sink_emergency_flush(bool write_end, format::EndReason reason = format::EndReason::signal) noexcept;
// Before an exec replaces the image: appends `end` (EndReason::stopped) and cuts the file
// after it, keeping the sink's lock (true; false: nothing done, not this process's file or
// not active). Whoever got true calls sink_resume_after_exec() if the exec returns (it
// failed): `end` is erased and tracing goes on in the same file, as if no exec was tried.
bool sink_end_before_exec() noexcept;
void sink_resume_after_exec() noexcept;

// Fork handlers (ForkRank::sink, fork.h: the innermost lock held across fork()).
void sink_fork_prepare() noexcept;
void sink_fork_parent() noexcept;
// Child: forget the parent's windows and fd; no background thread exists.
void sink_fork_child() noexcept;

SinkCounters sink_counters() noexcept;
void sink_count_dropped() noexcept;
// Tracing failed: prints "gpuheap: <msg>" on stderr and hands msg to the failure listener,
// at most once per tracing session. Every caller reports a failure that stops tracing
// (file not created, not writable, disk full...). Async-signal-safe, as the listener must be.
void sink_warn_once(const char* msg) noexcept;
using SinkFailureFn = void (*)(const char* msg) noexcept;
void sink_set_failure_listener(SinkFailureFn fn) noexcept;
void sink_reset_warning() noexcept;

}  // namespace preload
}  // namespace gpuheap
