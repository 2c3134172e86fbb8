// Follows one trace while its process writes it: each poll() reads only the bytes appended
// since the last one and feeds the whole records among them to a Model, so a refresh costs
// what was appended, not the file's size.
//
// What a trace being written looks like (preload/record/sink.h): records are copied into
// preallocated, zero-filled windows of the file, each frame's type byte stored last. The
// file's size therefore runs ahead of its data: past the last record come zeros, and a
// frame being copied reads as a zero type byte with bytes after it. A zero type byte is
// where the written data ends *for now*: the reader stops there, keeps its offset, and
// looks again at the next poll (never taking the zeros for records). An incomplete frame
// (the file cut at a window end) is likewise waited for. The `end` record closes the trace.
// A zstd-compressed trace (`gpuheap run` compresses a finished one) is read whole, once, by
// the first poll() (after the callbacks are set).
//
// A rolling window (`gpuheap run --aggregate`, preload/record/sink.cpp roll_locked): the
// preload writes the next segment whole beside the trace and renames it over the path, so
// the path names a new file while the open descriptor keeps the old one, which gets nothing
// more. Each poll() checks the path: when it names another file, the old one is read to its
// end and the new one's head (tables, then the snapshot) is read. Its snapshot counts the
// events before it (events_before): when this follower has fed exactly as many, the new
// segment goes on where the old one stopped (the head skipped, the same Model continued);
// otherwise a segment was replaced before it could be read (two rolls between polls), and a
// new Model is seeded from the snapshot, which is exact for the peak held, the live set and
// the per-site totals (model_seed.cpp). A file at the path that no snapshot heads is not a
// segment and is left alone; TRACE.roll, not yet renamed, is never opened. A path gone with
// TRACE.zst there (`gpuheap run` finished the trace after a roll not followed yet) is followed
// as a roll to that finished segment.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "analyzer/model/model.h"
#include "format/compact.h"
#include "format/trace.h"

namespace gpuheap::live {

// Step boundaries as the follower sees them in phase records (the Model keeps the phases
// themselves): a step is the top-level range or mark that repeats most often.
struct StepTracker {
  std::vector<std::pair<std::string, std::uint64_t>> counts;  // top-level name -> instances started
  std::vector<std::vector<std::string>> open;                 // per thread slot: open range names
  std::vector<std::uint32_t> tids;                            // thread of each slot
  std::string last_started;                                   // name of the last top-level start
  std::string now;                                            // innermost range open on the last phase's thread
  // The step: the most repeated top-level name ("" while none repeats), its instances.
  std::pair<std::string, std::uint64_t> step() const;
  // Folds one phase record in; true when it starts a top-level range or mark.
  bool on_phase(const format::PhaseRecord& p);
};

class TraceFollower {
 public:
  // Opens the trace; throws InputError when it is not a trace (NotATraceError), unreadable,
  // or of a newer version. A file that holds only part of its header yet is waited for:
  // construct() again later (Job does).
  explicit TraceFollower(const std::string& path);
  ~TraceFollower();
  TraceFollower(const TraceFollower&) = delete;
  TraceFollower& operator=(const TraceFollower&) = delete;

  // Reads what was appended and feeds it. Returns the bytes consumed. Throws
  // CorruptTraceError on a damaged record.
  std::uint64_t poll();
  // The process is gone without an end record (killed): what it wrote is all there is.
  void mark_gone();
  // Finishes the Model once the trace has ended (end record or process gone): the figures
  // are then those `gpuheap summary` reports for the same file. Idempotent.
  void finish();

  const std::string& path() const { return path_; }
  bool ended() const { return has_end_ || gone_; }
  bool has_end() const { return has_end_; }
  bool gone() const { return gone_; }
  bool finished() const { return finished_; }
  std::uint64_t offset() const { return off_; }       // file bytes consumed (whole records)
  std::uint64_t bytes_read() const { return read_; }  // file bytes read, all polls together
  std::uint64_t records() const { return records_; }  // whole records fed
  Model& model() { return *model_; }
  const Model& model() const { return *model_; }
  const StepTracker& steps() const { return steps_; }
  std::uint32_t rolls() const { return rolls_; }  // segments moved to
  // Events (alloc, free, free_completed, segment) of the run before the ones not yet fed:
  // counted from the start, or from the snapshot of the first segment read.
  std::uint64_t events() const { return events_; }
  // Segments replaced before they could be read (their events never fed): the steps and phases
  // counted miss theirs.
  std::uint32_t segments_missed() const { return missed_; }
  // Called with each phase record that starts a top-level range or mark, before it is fed
  // (Job: the live bytes per site at the start of a step).
  void on_step_start(std::function<void()> f) { step_cb_ = std::move(f); }
  // Called with every record, before it is fed (Job: the live categories).
  void on_record(std::function<void(const format::Record&)> f) { record_cb_ = std::move(f); }
  // Called when a new Model replaces the one model() returned (a segment missed, above),
  // before it is fed: references into the old one are stale.
  void on_new_model(std::function<void()> f) { new_model_cb_ = std::move(f); }

 private:
  std::size_t decode(const unsigned char* p, std::size_t n);  // whole frames fed; bytes used
  void read_compressed(bool skip_head);
  std::uint64_t read_appended();                               // poll()'s read of the open file
  bool follow_roll(std::uint64_t& consumed);                   // the path names the next segment: moved to it
  void reseed(int fd, bool compact, std::uint64_t& consumed);  // a segment missed: a new Model
  bool follow_finished(std::uint64_t& consumed);               // the path gone: TRACE.zst read
  bool is_this_process(const format::ProcessRecord& p) const;  // the process record read before
  std::unique_ptr<Model> new_model();                          // a segment missed: returns the old one
  void keep_peaks(const Model& prev);                          // the peaks the old Model saw

  std::string path_;
  int fd_ = -1;
  bool compressed_ = false, has_end_ = false, gone_ = false, finished_ = false;
  bool at_zeros_ = false;  // the last poll stopped at a zero type byte (the data's end for now)
  std::uint64_t off_ = 0, read_ = 0, records_ = 0, events_ = 0;
  std::uint32_t rolls_ = 0, missed_ = 0;
  std::pair<dev_t, ino_t> not_segment_{};  // a file at the path that is no segment: not read again
  format::CompactState compact_;           // the compact records' state (version 5 and later)
  std::vector<unsigned char> buf_;
  std::unique_ptr<Model> model_;
  StepTracker steps_;
  std::function<void()> step_cb_;
  std::function<void(const format::Record&)> record_cb_;
  std::function<void()> new_model_cb_;
};

}  // namespace gpuheap::live
