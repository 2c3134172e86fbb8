// The recorder: turns events into trace records and gets them to disk without blocking the
// user's threads on I/O. Runs inside the user's process: never throws, never aborts, warns
// once and disables itself on trouble (missing directory, disk full).
//
// Contract used by runtime.cpp (hooks) and pool observers:
//  - record_*() append one framed record under a short lock, copying it straight into the
//    trace file's mapped pages (sink.h): once record_*() returns, the record is in the file.
//  - capture_stack() unwinds the calling thread (libunwind), interns the stack (each
//    distinct stack written once, before first use) and returns its id (0 = none/disabled).
//  - The file is created at the process's first event (the first capture_stack,
//    ensure_device or record_*() while tracing), not at start: a process that records none
//    (it only forks, execs or computes on the CPU) leaves no file and announces none. Its
//    first records are `process` (pid, clocks and command line as at start) and the
//    modules loaded by then; devices are announced with ensure_device() before the first
//    event naming them; modules loaded later are written before the first stack using them.
//  - At exit (atexit), at _exit/_Exit, before an exec, on fatal signals (every signal whose
//    default action terminates the process, signals.h) and on stop, an `end` record closes
//    the file.
//  - After fork, the child either opens its own file at its own first event (pattern
//    re-expanded with the new pid) or stops tracing; it never writes into the parent's file.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/trace.h"
#include "preload/core/options.h"

namespace gpuheap {
namespace preload {

// What the recorder keeps of the settings (options.h) given to recorder_start().
struct RecorderConfig {
  bool stacks = true;                   // GPUHEAP_STACKS
  int max_depth = 64;                   // GPUHEAP_STACK_DEPTH (1..256)
  std::uint64_t flush_ns = 20'000'000;  // GPUHEAP_FLUSH_MS: background thread's tick
  const char* output = nullptr;         // GPUHEAP_OUTPUT pattern (%p %h %r %n), default ./gpuheap.%n.%p.trace
  bool quiet = false;                   // GPUHEAP_QUIET: no "tracing to" line when the file is created
  bool follow_fork = true;              // GPUHEAP_FOLLOW_FORK: forked children traced
  char path_file[4096] = {};            // GPUHEAP_PATH_FILE: append the trace path here when created
  bool have_identity = false;           // the launcher named a rank (Settings::identity)
  format::IdentityRecord identity;
};

std::uint64_t now_ns() noexcept;       // CLOCK_MONOTONIC
std::uint32_t current_tid() noexcept;  // gettid(), cached per thread

// Starts the recorder (idempotent, thread-safe) with `settings` (runtime.cpp passes those
// read at load; a new session after a stop uses the ones it is given); the file waits for
// the first event.
// Returns false if tracing is off (setuid). A file that cannot be created is warned about
// (once) at the first event, which then turns tracing off.
bool recorder_start(const Settings& settings) noexcept;
bool recorder_active() noexcept;  // tracing, whether or not the file exists yet
// Flush and write `end`; further records are dropped. Called from the atexit handler.
void recorder_stop(format::EndReason reason) noexcept;
// _exit/_Exit (hooks/interpose.cpp): `end` (reason exit) written and the file cut after it,
// as a fatal signal's handler does. Async-signal-safe (bounded try-lock, no allocation):
// _exit may be called from a signal handler. Nothing in a vfork child, whose memory is its
// parent's, nor in a forked child that has not opened its own file.
void recorder_end_at_exit() noexcept;
// exec*: `end` (reason stopped) written before the image is replaced; true when it was
// (then the sink's lock stays held until the exec returns). A failed exec calls
// recorder_resume_after_exec(), which erases that `end` so tracing goes on in the same
// file. Nothing in a vfork child.
bool recorder_end_before_exec() noexcept;
void recorder_resume_after_exec() noexcept;
// Returns when everything recorded so far is in the file (tests, gpuheap_flush): an append
// in progress on another thread is waited for.
void recorder_flush() noexcept;
// Path of the current trace file ("" if none, e.g. before the first event).
const char* recorder_path() noexcept;

// `skip` frames of gpuheap itself are dropped from the top: with skip = 0 the innermost ip
// is the return address into the function that called capture_stack; skip = 1 drops that
// function too, and so on. Returns 0 if stacks are off (GPUHEAP_STACKS=0) or not tracing.
std::uint32_t capture_stack(int skip) noexcept;

void ensure_device(int device) noexcept;  // writes a `device` record once per device
void note_modules_changed() noexcept;     // after dlopen/dlclose: rescan and write new modules

void record(const format::AllocRecord& r) noexcept;
void record(const format::FreeRecord& r) noexcept;
void record(const format::FreeCompletedRecord& r) noexcept;
void record(const format::SegmentRecord& r, bool is_free) noexcept;
void record(const format::OomRecord& r) noexcept;
void record(const format::RetryRecord& r) noexcept;
void record(const format::EmptyCacheRecord& r) noexcept;
// A phase marker (gpuheap_mark/push/pop, NVTX ranges) on the calling thread, stamped now.
// `name` (may be null: empty) ends at its NUL or after max_len bytes, and is cut to
// format::kMaxPhaseName bytes.
void record_phase(format::PhaseOp op, format::PhaseSource source, const char* name,
                  std::size_t max_len = format::kMaxPhaseName) noexcept;

// How ensure_device learns a device's name and total memory without calling hooked
// entry points: runtime.cpp installs this (real driver calls, recursion-guarded).
using DeviceInfoFn = bool (*)(int device, char* name, std::size_t name_cap, std::uint64_t* total);
void set_device_info_fn(DeviceInfoFn fn) noexcept;

// Counters for tests (recorder_counters()): records written, bytes written, dropped.
struct RecorderCounters {
  std::uint64_t records = 0, bytes = 0, dropped = 0, stacks = 0;
  std::uint64_t producer_waits = 0;  // record() calls that mapped the next file window themselves
  std::uint64_t writes = 0;          // file windows mapped
};
RecorderCounters recorder_counters() noexcept;

}  // namespace preload
}  // namespace gpuheap
