// What `gpuheap top` and `gpuheap run --live` show of a Job (job.h): one JSON line per
// refresh (--json), plain text lines when stdout is not a terminal, else the interactive
// ncurses view.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "analyzer/live/job.h"

namespace gpuheap::live {

struct ViewOptions {
  double interval = 1.0;       // seconds between refreshes
  bool once = false;           // one refresh, then exit
  bool json = false;           // one JSON line per refresh (schema gpuheap.top/1, docs/cli.md)
  std::size_t top = 10;        // sites per process in JSON and text lines
  std::string program_output;  // run --live: where the program's output goes (shown in the view)
  // run --live: called before each refresh (waits for the program without blocking).
  std::function<void()> tick;
};

// The JSON line of one refresh; `final_line`: the last one, with "message": "process ended".
nlohmann::json snapshot_json(const Snapshot& s, std::size_t top, bool final_line);
// The text lines of one refresh (no terminal, or --once without --json).
std::string snapshot_text(const Snapshot& s, std::size_t top);
// "parameter 4.00 MiB, activation 8.00 MiB" (the categories with live allocations).
std::string categories_line(const CategoryBytes& c);

// Runs the view until the job ends (JSON and text: a last refresh, then "process ended" on
// stderr) or, interactively, until `q`. The exit status.
int run_view(Job& job, const ViewOptions& opt);
// The interactive view (view_curses.cpp); returns when the user quits.
int run_curses(Job& job, const ViewOptions& opt);

}  // namespace gpuheap::live
