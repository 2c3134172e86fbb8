// The state a rolling-window trace (GPUHEAP_AGGREGATE, `gpuheap run --aggregate`) carries from
// one segment to the next: the allocations live now, per-site totals of every allocation, and
// per device the peak of held requested bytes with what was live then. The sink feeds it every
// event in file order (under its lock) and writes it as the next segment's snapshot records
// (format/trace.h, SnapshotPart) when the current segment reaches the budget (sink.cpp).
//
// The rules are the analyzer's (analyzer/model/model_events.cpp: on_alloc, release, complete),
// so that a segment's reader, seeded from the snapshot, comes to the same peaks, live set at
// the peak, leaks and by-site totals as a reader of the full trace. The live set at the peak
// is not copied at each new peak: per device, the allocations freed since the peak that were
// live at it are logged (the log cleared at each new peak), so the live set at the peak = the
// live allocations born by the peak + that log (bounded by the live set at the peak).
//
// Memory: anonymous mappings grown by doubling (never malloc: the sink's lock is held), sized
// by the live allocations, the distinct stacks, the table records' extents and the peak's log. Where a mapping cannot be
// had the state is marked broken: the sink stops rolling and the trace stays whole (one
// warning), never a snapshot that is wrong.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/trace.h"

namespace gpuheap {
namespace preload {

// All under the sink's lock (or its only thread: fork child, tests).
void agg_on_alloc(const format::AllocRecord& r) noexcept;
void agg_on_free(const format::FreeRecord& r) noexcept;
void agg_on_free_completed(const format::FreeCompletedRecord& r) noexcept;
void agg_on_segment(std::uint64_t ts) noexcept;  // counted as an event, nothing kept
bool agg_ok() noexcept;                          // false: a mapping failed or too many devices; no snapshot
std::uint64_t agg_events() noexcept;

// Writes the snapshot records through out(frame, len) (false: stop, returns false). `ts` is
// the moment of the roll, `segment` the rolls so far (from 1).
using AggOut = bool (*)(void* ctx, const unsigned char* frame, std::size_t len);
bool agg_write_snapshot(std::uint64_t ts, std::uint32_t segment, AggOut out, void* ctx) noexcept;

// A record the sink appended other than an event (sink_append), whole frame f at file offset
// `at`: a table record's extent is kept (merged with the one before when adjacent), so that a
// roll copies the tables without reading the segment's events; an oom, retry or empty_cache
// record is counted into its device for the next snapshot.
void agg_on_record(const unsigned char* f, std::size_t len, std::uint64_t at) noexcept;

// Copies the records of the trace's tables (process, identity, devices, modules, stacks,
// threads, Python code objects) from the file at old_fd, the extents agg_on_record kept,
// through out: the next segment names the same ids. *records: how many. False: a read failed
// or the file is not as written.
bool agg_copy_tables(int old_fd, AggOut out, void* ctx, std::uint64_t* records) noexcept;
// The roll is published: the tables are the next segment's head, [kFileHeaderSize, end).
void agg_tables_moved(std::uint64_t end, std::uint64_t records) noexcept;

// Forgets everything (a new trace file that is not a segment: new session, fork child).
void agg_reset() noexcept;

}  // namespace preload
}  // namespace gpuheap
