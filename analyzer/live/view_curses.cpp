// The interactive view of `gpuheap top` (ncurses): per device current and peak with a
// sparkline of the refreshes, the step and phase now running, the live bytes by category, the
// top live sites. Keys: p pause, s sort (bytes, growth, count), d device, r process (rank), g
// group (line, function, category), q quit.
#include <curses.h>
#include <langinfo.h>

#include <algorithm>
#include <chrono>
#include <clocale>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "analyzer/base/units.h"
#include "analyzer/live/view.h"

namespace gpuheap::live {

namespace {

// The sparkline spans the last kSparkSeconds, one column per equal slice of it: a column is
// the largest requested figure sampled in its slice (a refresh), the last one carried over
// slices without a refresh, blank before the first.
constexpr double kSparkSeconds = 300;
constexpr std::size_t kHistory = 4096;  // samples kept per device (a 0.05 s interval fills 300 s with 6000)

struct Sample {
  double t = 0;  // the view's elapsed seconds
  std::int64_t v = 0;
};

struct ViewState {
  bool paused = false, utf8 = false;
  Sort sort = Sort::bytes;
  Group group = Group::line;
  std::size_t proc = 0, dev = 0;
  std::map<std::string, std::deque<Sample>> history;  // "trace#device" -> requested per refresh
};

std::string sparkline(const std::deque<Sample>& h, std::size_t width, double now, bool utf8) {
  static const char* const kBars[] = {"\u2581", "\u2582", "\u2583", "\u2584", "\u2585", "\u2586", "\u2587", "\u2588"};
  static const char kAscii[] = "_.-=+*#@";
  const double from = now - kSparkSeconds, slice = kSparkSeconds / static_cast<double>(width);
  std::vector<std::int64_t> col(width, -1);
  std::int64_t carry = -1, mx = 1;
  std::size_t i = 0;
  for (; i < h.size() && h[i].t < from; ++i) carry = h[i].v;
  for (std::size_t c = 0; c < width; ++c) {
    const double end = from + slice * static_cast<double>(c + 1);
    std::int64_t v = carry;
    for (bool first = true; i < h.size() && (h[i].t < end || c + 1 == width); ++i, first = false)
      v = first ? h[i].v : std::max(v, h[i].v);
    col[c] = v;
    if (i > 0) carry = h[i - 1].v;
    mx = std::max(mx, v);
  }
  std::string out;
  for (std::int64_t v : col) {
    if (v < 0) {
      out += ' ';
      continue;
    }
    const auto level = static_cast<std::size_t>(v * 7 / mx);
    if (utf8) out += kBars[level];
    else out += kAscii[level];
  }
  return out;
}

std::string signed_bytes(std::int64_t v) {
  return (v < 0 ? "-" : v > 0 ? "+" : " ") + human_bytes(static_cast<std::uint64_t>(v < 0 ? -v : v));
}

void put(int y, const std::string& s) {
  if (y >= LINES) return;
  mvaddnstr(y, 0, s.c_str(), COLS > 0 ? COLS : 0);
  clrtoeol();
}

void record(ViewState& v, const Snapshot& s) {
  for (const auto& p : s.processes)
    for (const auto& d : p.devices) {
      auto& h = v.history[fmt::format("{}#{}", p.trace, d.device)];
      h.push_back({s.elapsed_s, d.requested.current});
      while (h.size() > kHistory || (h.size() > 1 && h[1].t < s.elapsed_s - kSparkSeconds)) h.pop_front();
    }
}

int draw_device(ViewState& v, const ProcessNow& p, double now, int y) {
  if (p.devices.empty()) {
    put(y++, "  no GPU allocation yet");
    return y;
  }
  v.dev = std::min(v.dev, p.devices.size() - 1);
  const DeviceNow& d = p.devices[v.dev];
  put(y++, fmt::format("device {} ({}/{}) {}  total {}  OOMs {}  retries {}", d.device, v.dev + 1, p.devices.size(),
                       d.name, human_bytes(d.total_memory), d.ooms, d.retries));
  const auto& h = v.history[fmt::format("{}#{}", p.trace, d.device)];
  const std::size_t spark = COLS > 60 ? static_cast<std::size_t>(COLS - 52) : 8;
  const std::pair<const char*, const Stat*> rows[] = {{"requested", &d.requested},
                                                      {"allocated", &d.allocated},
                                                      {"reserved", &d.reserved}};
  for (const auto& [name, st] : rows) {
    std::string line = fmt::format("  {:<9} {:>11}  peak {:>11}", name, human_bytes(st->current),
                                   human_bytes(st->peak));
    if (st == &d.requested) line += "   " + sparkline(h, spark, now, v.utf8);
    if (st == &d.allocated) line += fmt::format("   {:^{}}", "^ requested, last 5 min", spark);
    put(y++, line);
  }
  const std::string cats = categories_line(d.categories);
  put(y++, fmt::format("  by category ({}): {}", p.categories_are, cats.empty() ? "-" : cats));
  return y;
}

void draw(ViewState& v, const Snapshot& s, const Job& job, const ViewOptions& opt) {
  erase();
  int y = 0;
  put(y++, fmt::format("gpuheap top  {}  refresh {}  {:.0f}s{}", job.describe(), s.refresh, s.elapsed_s,
                       v.paused  ? "  [paused]"
                       : s.ended ? "  process ended (q quits)"
                                 : ""));
  if (!opt.program_output.empty()) put(y++, "program output: " + opt.program_output);
  if (s.processes.empty()) {
    put(y++, s.waiting);
  } else {
    v.proc = std::min(v.proc, s.processes.size() - 1);
    const ProcessNow& p = s.processes[v.proc];
    put(y++, fmt::format("process {} ({}/{}) {}  {}  {}", p.pid, v.proc + 1, s.processes.size(), p.host, p.state,
                         p.command));
    put(y++, fmt::format("step {}  phase {}",
                         p.step_name.empty()
                             ? "-"
                             : fmt::format("{} ({})", p.step_known ? std::to_string(p.step) : "?", p.step_name),
                         p.phase.empty() ? "-" : p.phase));
    y = draw_device(v, p, s.elapsed_s, y);
    ++y;
    put(y++, fmt::format("{:>11} {:>7} {:>12}  SITE (by {}, sorted by {}; growth since {})", "BYTES", "COUNT", "GROWTH",
                         group_name(v.group), sort_name(v.sort), p.growth_since));
    const int rows = std::max(1, LINES - y - 2 - static_cast<int>(std::min<std::size_t>(s.notes.size(), 3)));
    for (const auto& x : group_sites(p.sites, v.group, v.sort, static_cast<std::size_t>(rows)))
      put(y++, fmt::format("{:>11} {:>7} {:>12}  {}", human_bytes(x.bytes), x.count, signed_bytes(x.growth),
                           v.group == Group::line       ? x.line
                           : v.group == Group::function ? x.function
                                                        : x.category));
  }
  for (std::size_t i = 0; i < s.notes.size() && i < 3; ++i) put(LINES - 2 - static_cast<int>(i), "note: " + s.notes[i]);
  put(LINES - 1, "p pause  s sort  d device  r process  g group  q quit");
  refresh();
}

// One key; false on quit.
bool on_key(ViewState& v, int ch, const Snapshot& s) {
  switch (ch) {
    case 'q':
    case 'Q': return false;
    case 'p': v.paused = !v.paused; break;
    case 's': v.sort = v.sort == Sort::bytes ? Sort::growth : v.sort == Sort::growth ? Sort::count : Sort::bytes; break;
    case 'g':
      v.group = v.group == Group::line ? Group::function : v.group == Group::function ? Group::category : Group::line;
      break;
    case 'r': v.proc = s.processes.empty() ? 0 : (v.proc + 1) % s.processes.size(), v.dev = 0; break;
    case 'd': {
      const std::size_t n = v.proc < s.processes.size() ? s.processes[v.proc].devices.size() : 0;
      v.dev = n ? (v.dev + 1) % n : 0;
      break;
    }
    default: break;
  }
  return true;
}

}  // namespace

int run_curses(Job& job, const ViewOptions& opt) {
  std::setlocale(LC_ALL, "");
  ViewState v;
  v.utf8 = std::strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
  initscr();
  cbreak();  // ^C still interrupts (and reaches the program of run --live, in our group)
  noecho();
  keypad(stdscr, TRUE);
  curs_set(0);
  timeout(50);
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(opt.interval));
  auto next = std::chrono::steady_clock::now();
  Snapshot s;
  bool have = false;
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (!have || (!v.paused && !s.ended && now >= next)) {
      if (opt.tick) opt.tick();
      job.refresh();
      s = job.snapshot();
      record(v, s);
      have = true;
      next = std::max(next + period, now);
      draw(v, s, job, opt);
    }
    const int ch = getch();
    if (ch == ERR) continue;
    if (!on_key(v, ch, s)) break;
    draw(v, s, job, opt);
  }
  endwin();
  return 0;
}

}  // namespace gpuheap::live
