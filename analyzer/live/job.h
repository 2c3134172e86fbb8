// The traces of one job, followed live (`gpuheap top`, `gpuheap run --live`), and what one
// refresh shows of them.
//
// Finding the traces: a `gpuheap run`'s path list (each traced process appends its trace's
// path when it creates it: analyzer/cli/run.cpp), found through a PID (the process's
// GPUHEAP_PATH_FILE, or a descendant's when the PID is the `gpuheap run` itself; a process
// traced without run: the traces among its open files), a directory (every trace in it,
// new ones included), trace files, or, with no target, the newest path list of this user's
// running `gpuheap run`. The list is read again at every refresh: processes started later
// join the view.
//
// Ending: a trace ends at its `end` record, or when its process is gone (checked by pid on
// this host: a killed process writes no end record; what it wrote is read once more, then
// the trace is finished as `gpuheap summary` finishes it). The job ends when every trace has
// ended and no more can come: the path list removed (its run finished), the PID given gone,
// the program of `run --live` exited, or only files were named.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "analyzer/model/category_pass.h"
#include "analyzer/model/stats.h"

namespace gpuheap::live {

// A live site: one stack's allocations live now. `line`, `function` and `category` are the
// group keys (labels.h: "Block.forward (model.py:43)", "Block.forward"; the category of most
// of its live bytes as known now: live_categories.h).
struct SiteNow {
  std::uint32_t stack = 0;
  std::string line, function;
  std::uint64_t bytes = 0, count = 0;  // requested bytes live now, allocations live now
  std::int64_t growth = 0;             // bytes now - bytes at the start of the step (or last refresh)
  std::string category;
};

enum class Group { line, function, category };
enum class Sort { bytes, growth, count };
const char* group_name(Group g);
const char* sort_name(Sort s);
// Sites merged by the group key (bytes, counts and growth summed), sorted, the first `top`
// (0: all). Ties: by key, so equal rows list in a stable order.
std::vector<SiteNow> group_sites(const std::vector<SiteNow>& sites, Group g, Sort s, std::size_t top);

struct DeviceNow {
  int device = 0;
  std::string name;
  std::uint64_t total_memory = 0;
  Stat requested, allocated, reserved;  // current and peak (torch.cuda.memory_stats() terms)
  // The peak of held device memory (summary's peak_held: requested and block bytes), exact for
  // the whole run across a rolling window's segments.
  std::int64_t peak_held = 0, peak_held_allocated = 0;
  std::uint64_t ooms = 0, retries = 0;
  // Requested bytes at the start of each of the last kSteps steps (oldest first), with the
  // step's number: a completed step's growth is the next start's bytes minus its own.
  std::vector<std::pair<std::uint64_t, std::int64_t>> step_starts;
  CategoryBytes categories;  // requested bytes live now by category (live_categories.h)
};

struct ProcessNow {
  std::string trace, host, command;
  std::uint32_t pid = 0;
  // "running", "ended" (its end record) or "gone" (the process is gone without one).
  std::string state = "running";
  std::string phase;               // ranges open on the thread of the last phase record ("" none)
  std::string step_name;           // the most repeated top-level range or mark ("" none yet)
  std::uint64_t step = 0;          // its instances started so far
  bool step_known = true;          // false once a rolling window's segment went unread: steps missed
  std::string growth_since;        // "step" (the start of the current step) or "refresh"
  std::vector<DeviceNow> devices;  // GPUs, in the order first seen (by index once ended)
  std::vector<SiteNow> sites;      // every site with live bytes or growth, unsorted
  // The categories: "provisional" while the trace is written (a category becomes final when
  // its allocation is freed or its phase ends), "final" once it ended; training_found: a
  // forward, backward or optimizer step was found (else only the stack rules decide).
  std::string categories_are = "provisional";
  bool training_found = false;
  std::uint64_t records = 0, bytes_read = 0;
};

struct Snapshot {
  std::uint64_t refresh = 0;
  double elapsed_s = 0;  // since the view started
  bool ended = false;    // every traced process ended and no more can come
  std::vector<ProcessNow> processes;
  std::vector<std::string> notes;  // e.g. a process whose tracing failed, a trace that could not be read
  std::string waiting;             // while no trace is followed: what is waited for
};

class Job {
 public:
  // Resolves the targets (docs/cli.md `top`); throws UsageError when none names a job.
  explicit Job(const std::vector<std::string>& targets);
  // `run --live`: the path list of the run being started, the program's pid.
  Job(std::string path_list, pid_t program);
  ~Job();
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  void refresh();                // finds new traces, reads what was appended to each
  Snapshot snapshot();           // after refresh()
  void program_exited();         // run --live: the program was waited for; the list is complete
  bool ended() const;            // every trace ended and no more can come
  std::string describe() const;  // what is followed, for the view's title

  static constexpr std::size_t kSteps = 32;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuheap::live
