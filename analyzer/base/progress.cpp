#include "analyzer/base/progress.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "analyzer/base/text_safe.h"

namespace gpuheap {

std::string progress_bytes(std::uint64_t b) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (b < 1024) return fmt::format("{} B", b);
  double v = static_cast<double>(b) / 1024;
  int u = 0;
  // Step up while the value would print as 1024.0 or more in this unit.
  while (v >= 1023.95 && u < 5) v /= 1024, ++u;
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

std::string progress_rate(double per_s) {
  if (!(per_s > 0)) return "0";
  if (per_s >= 999.95e3) return fmt::format("{:.1f} M", per_s / 1e6);
  if (per_s >= 999.5) return fmt::format("{:.1f} k", per_s / 1e3);
  return fmt::format("{:.0f}", per_s);
}

std::string progress_line(const std::string& what, std::uint64_t done, std::uint64_t total, double records_per_s) {
  if (total > 0 && done > total) done = total;  // the size grew while reading (a live trace)
  std::string s = fmt::format("gpuheap: reading {}: {}", text_safe(what), progress_bytes(done));
  if (total > 0) {
    int pct = static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total));
    s += fmt::format(" / {} ({}%)", progress_bytes(total), pct);
  }
  s += fmt::format(", {} events/s", progress_rate(records_per_s));
  return s;
}

bool progress_due(bool enabled, bool tty, double elapsed_s, double last_draw_s, const ProgressPolicy& p) {
  if (!enabled || !tty || elapsed_s < p.delay_s) return false;
  return last_draw_s < 0 || elapsed_s - last_draw_s >= p.interval_s;
}

Progress::Progress(std::string what, std::uint64_t total, bool enabled, std::FILE* out, int tty)
    : what_(std::move(what)), total_(total), out_(out), t0_(clock::now()) {
  if (tty < 0) tty = out && ::isatty(::fileno(out)) ? 1 : 0;
  enabled_ = enabled && tty == 1;
}

void Progress::update_at(std::uint64_t done, std::uint64_t records, double elapsed_s) {
  if (!progress_due(enabled_, true, elapsed_s, last_draw_)) return;
  last_draw_ = elapsed_s;
  std::string line = progress_line(what_, done, total_, elapsed_s > 0 ? static_cast<double>(records) / elapsed_s : 0);
  // Pad over a longer previous line (the rate can get shorter).
  std::size_t w = line.size();
  if (w < width_) line.append(width_ - w, ' ');
  std::fprintf(out_, "\r%s", line.c_str());
  std::fflush(out_);
  width_ = std::max(width_, w);
}

void Progress::finish() {
  if (width_ == 0) return;
  std::fprintf(out_, "\r%*s\r", static_cast<int>(width_), "");
  std::fflush(out_);
  width_ = 0;
}

}  // namespace gpuheap
