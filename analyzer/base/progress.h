// The progress line on stderr while traces are read:
//   gpuheap: reading TRACE: 1.2 GiB / 3.4 GiB (35%), 21.3 M events/s
// rewritten in place (\r) at most 4 times a second, only when stderr is a terminal, only
// once reading has taken a second, and erased when reading ends. `--quiet` turns it off.
// The replay asks for an update every kCheckEvery records, so the per-record cost is one
// counter test; the clock is read only then.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace gpuheap {

// "1.2 GiB", "340.0 MiB", "512 B": one decimal, binary units (the progress line's sizes).
std::string progress_bytes(std::uint64_t b);
// "21.3 M", "850.2 k", "12": records per second.
std::string progress_rate(double per_s);
// The line itself, without \r. `total` 0 (size unknown) leaves out "/ total (pct)".
std::string progress_line(const std::string& what, std::uint64_t done, std::uint64_t total, double records_per_s);

struct ProgressPolicy {
  double delay_s = 1.0;      // nothing before reading has taken this long
  double interval_s = 0.25;  // at most this often after that
};
// Whether to (re)draw now: enabled (no --quiet) and stderr a terminal, reading for at least
// delay_s, and interval_s since the last draw (`last_draw_s` < 0: never drawn).
bool progress_due(bool enabled, bool tty, double elapsed_s, double last_draw_s, const ProgressPolicy& p = {});

class Progress {
 public:
  static constexpr std::uint64_t kCheckEvery = 1u << 16;  // records between clock reads (power of two)

  // `what`: the trace path (or "N traces"); `total`: bytes to read. `tty` defaults to
  // isatty(fileno(out)).
  Progress(std::string what, std::uint64_t total, bool enabled, std::FILE* out = stderr, int tty = -1);
  ~Progress() { finish(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool active() const { return enabled_; }
  // `done`: bytes of the file(s) read so far; `records`: records decoded so far.
  void update(std::uint64_t done, std::uint64_t records) {
    if (enabled_) update_at(done, records, seconds());
  }
  // The same at a given time since construction (tests).
  void update_at(std::uint64_t done, std::uint64_t records, double elapsed_s);
  // Erases the line if one was drawn (also done by the destructor).
  void finish();
  bool shown() const { return width_ > 0; }

 private:
  double seconds() const { return std::chrono::duration<double>(clock::now() - t0_).count(); }
  using clock = std::chrono::steady_clock;
  std::string what_;
  std::uint64_t total_;
  bool enabled_;
  std::FILE* out_;
  std::size_t width_ = 0;  // length of the line on screen (0: none)
  double last_draw_ = -1;
  clock::time_point t0_;
};

}  // namespace gpuheap
