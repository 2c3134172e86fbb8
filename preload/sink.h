// The trace sink: one global, ordered in-memory buffer (chain of 1 MiB chunks) plus a
// background writer thread that write(2)s it to the trace file.
//
// Ordering: every record is appended under one short lock, so the file order equals the
// lock order, which respects happens-before: if thread A's append completes before thread
// B's starts (e.g. A's free, then the pool hands the same address to B), A's record is
// earlier in the file. The analyzer relies on this to replay address reuse.
//
// Back-pressure: chunks are allocated up to a bound (GPUHEAP_BUFFER_MB, default 256 MiB);
// beyond it producers wait for the writer (counted as producer_waits). Nothing is dropped
// while the file is healthy. On an I/O error the sink warns once and fails: later appends
// are dropped and counted.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/trace.h"

namespace gpuheap {
namespace detail {

enum class SinkState : int {
  off = 0,            // never started, or tracing refused
  active = 1,         // accepting records
  pending_child = 2,  // forked child that will open its own file on first use
  stopped = 3,        // `end` written (or stop requested)
  failed = 4,         // I/O error: tracing given up
};

struct SinkCounters {
  std::uint64_t records = 0;         // records accepted into the current file
  std::uint64_t bytes = 0;           // bytes written to the file (header included)
  std::uint64_t dropped = 0;         // records refused after stop/failure
  std::uint64_t producer_waits = 0;  // appends that waited for buffer space
  std::uint64_t writes = 0;          // write(2) calls that wrote data
};

SinkState sink_state() noexcept;
void sink_set_state(SinkState s) noexcept;  // off/pending_child transitions (recorder.cpp)

// Adopts `fd` (file header already written, `header_bytes` long) and starts accepting.
void sink_open(int fd, const char* path, std::uint64_t flush_ns, std::size_t max_bytes,
               std::size_t header_bytes) noexcept;
const char* sink_path() noexcept;

// Appends one framed record. `start_writer`: start the writer thread if not running
// (metadata written at start passes false, so processes that never record an event get
// no thread; their records are written by the atexit flush). False = dropped.
bool sink_append(const void* rec, std::size_t n, bool start_writer = true) noexcept;

void sink_flush() noexcept;  // everything appended so far is write(2)n when this returns
// Appends `end`, flushes, stops the writer thread, closes the file.
void sink_close(format::EndReason reason) noexcept;
// Signal-handler flush: try-locks only (bounded wait), write(2) only, no allocation.
// With write_end, appends `end` (EndReason::signal) and stops accepting.
void sink_emergency_flush(bool write_end) noexcept;

// pthread_atfork pieces (called by recorder.cpp in lock order).
void sink_fork_prepare() noexcept;
void sink_fork_parent() noexcept;
// Child: forget the parent's unwritten buffers and fd; no writer thread exists.
void sink_fork_child() noexcept;

SinkCounters sink_counters() noexcept;
void sink_count_dropped() noexcept;
// Prints "gpuheap: <msg>" on stderr, at most once per tracing session.
void sink_warn_once(const char* msg) noexcept;
void sink_reset_warning() noexcept;

}  // namespace detail
}  // namespace gpuheap
