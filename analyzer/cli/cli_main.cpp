// gpuheap CLI: run, dump, summary, check, diff, export, report. Exit 2 on bad input or usage.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "analyzer/model/analysis.h"
#include "analyzer/summary/check.h"
#include "analyzer/cli/commands.h"
#include "analyzer/symbolize/debuginfo.h"
#include "analyzer/summary/diff.h"
#include "analyzer/base/error.h"
#include "analyzer/export/export.h"
#include "analyzer/model/phases.h"
#include "analyzer/trace/reader.h"
#include "analyzer/replay/replay.h"
#include "analyzer/summary/report.h"
#include "analyzer/symbolize/symbolize.h"
#include "analyzer/symbolize/symbolize_trace.h"
#include "analyzer/trace/trace_files.h"
#include "analyzer/base/text_safe.h"
#include "analyzer/base/units.h"

using namespace gpuheap;

namespace {

std::optional<std::uint64_t> size_opt(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return parse_size(s);
}

// Every number option is a finite, non-negative number: CLI11's NonNegativeNumber lets
// "nan" and "inf" through (nan > limit is false, so --tolerance nan passed every check).
const CLI::Validator kFiniteNonNegative(
    [](std::string& v) -> std::string {
      errno = 0;
      char* end = nullptr;
      double d = std::strtod(v.c_str(), &end);
      if (v.empty() || end == v.c_str() || *end != '\0' || errno == ERANGE || !std::isfinite(d) || d < 0)
        return "a finite number >= 0 is needed, not '" + v + "'";
      return {};
    },
    "FINITE>=0", "finite non-negative number");

// Log lines name files and modules from traces: each message is escaped once, here.
class EscapedPayload : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&, spdlog::memory_buf_t& dest) override {
    auto s = text_safe(std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(s.data(), s.data() + s.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<EscapedPayload>(); }
};

// A report is only as good as its last byte: a full disk or a closed pipe must not leave a
// silently cut baseline behind with exit 0.
void flush_or_throw() {
  std::cout.flush();
  bool bad = !std::cout.good();
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) bad = true;
  if (bad) throw InputError(fmt::format("cannot write the output: {}", std::strerror(errno ? errno : EIO)));
}

// --debuginfod on the commands that symbolize.
struct DebuginfodOpt {
  bool on = false;
  double timeout_s = 10;
};
void add_debuginfod(CLI::App* cmd, DebuginfodOpt& o) {
  cmd->add_flag("--debuginfod", o.on, "Ask the debuginfod servers in DEBUGINFOD_URLS for missing debug info");
  cmd->add_option("--debuginfod-timeout", o.timeout_s, "Seconds per download with --debuginfod (default 10)")
      ->check(kFiniteNonNegative);
}

// -v/--verbose on the commands that symbolize: list the trace's modules not found here
// (without it, one line says how many).
bool g_verbose = false;
void add_verbose(CLI::App* cmd) {
  cmd->add_flag("-v,--verbose", g_verbose, "List the trace's modules that are not on this machine");
}

// summary --pid: the traces (of those given) whose process record names PID; each file's
// first record only is read. None: exit 2, naming the pids there are.
std::vector<std::string> traces_of_pid(const std::vector<std::string>& paths, std::uint64_t pid) {
  std::vector<std::string> keep;
  std::string seen;
  for (const auto& p : paths) {
    TraceReader reader(p);
    format::Record r;
    if (!reader.next(r) || r.type != format::RecordType::process) throw NotATraceError(p + ": not a gpuheap trace");
    if (r.process.pid == pid) keep.push_back(p);
    seen += fmt::format("{}{}", seen.empty() ? "" : ", ", r.process.pid);
  }
  if (keep.empty()) throw InputError(fmt::format("--pid {}: no trace of that process (the traces are of pid {})", pid, seen));
  return keep;
}

// summary --device N where no trace has device N is a mistake (a typo, the wrong trace), not
// an empty report: exit 2, naming the devices there are.
void require_device(const Analysis& a, int device) {
  std::string seen;
  for (const auto& t : a.traces)
    for (const auto& d : t->devices) {
      if (d.device == device) return;
      if (d.device >= 0) seen += fmt::format("{}{}", seen.empty() ? "" : ", ", d.device);
    }
  throw InputError(fmt::format("--device {}: no such device in the trace{} ({})", device, a.traces.size() > 1 ? "s" : "",
                               seen.empty() ? "it has no device" : "devices: " + seen));
}

// `run`'s usage line names the program it takes (prefix_command: no positional option).
class RunUsage : public CLI::Formatter {
 public:
  std::string make_usage(const CLI::App* app, std::string name) const override {
    std::string u = CLI::Formatter::make_usage(app, std::move(name));
    if (!u.empty() && u.back() == '\n') u.pop_back();
    return u + " [--] PROGRAM [ARGS...]\n";
  }
};

// The TRACE... positional of the commands that read several traces.
constexpr const char* kTracesHelp = "One or more traces (raw or .zst)";

int real_main(int argc, char** argv) {
  CLI::App app{"gpuheap: GPU memory profiler (trace with `run`, analyze with summary/check/diff)"};
  app.set_version_flag("--version", std::string(GPUHEAP_VERSION));
  app.require_subcommand(1);

  RunOptions run_opt;
  std::string framework_pools = "off";
  auto* run = app.add_subcommand("run", "Run a program with gpuheap preloaded (run's options stop at the program)");
  run->add_option("-o,--output", run_opt.output,
                 "Trace path or pattern (GPUHEAP_OUTPUT: %p pid, %n program); a fixed name that exists needs --force");
  run->add_flag("--no-stacks", run_opt.no_stacks, "Do not record call stacks (GPUHEAP_STACKS=0)");
  run->add_flag("--no-pool", run_opt.no_pool, "Pass allocations through to the driver (GPUHEAP_POOL=0)");
  run->add_flag("--simulate", run_opt.simulate, "Use the simulated CUDA runtime next to gpuheap (simcuda/)");
  run->add_option("--framework-pools", framework_pools,
                 "off (default): turn the PyTorch and JAX caching allocators off; keep: leave them on")
      ->check(CLI::IsMember({"off", "keep"}));
  run->add_option("--limit", run_opt.limit, "Per-device memory cap (GPUHEAP_LIMIT), e.g. 8GiB");
  run->add_flag("--allow-no-trace", run_opt.allow_no_trace,
                "Exit with the command's status even if a trace could not be written (else 3)");
  bool no_symbolize = false, no_compress = false;
  run->add_flag("--no-symbolize", no_symbolize, "Do not store symbolized frames in the trace after the program exits");
  run->add_flag("--no-compress", no_compress, "Leave the trace uncompressed (else TRACE.zst after the program exits)");
  run->add_flag("--force", run_opt.force, "Let -o NAME replace an existing NAME or NAME.zst (else exit 2)");
  run->add_flag("-q,--quiet", run_opt.quiet, "Print nothing but warnings and errors (as GPUHEAP_QUIET=1)");
  add_verbose(run);
  // Options stop at the program (nsys, memray, heaptrack): `gpuheap run --simulate prog -o x`
  // gives `-o x` to prog. prefix_command() sends the first positional and everything after
  // it to run->remaining(); the command is taken from there after parsing (below).
  run->prefix_command();
  run->formatter(std::make_shared<RunUsage>());

  std::string dump_path;
  auto* dump = app.add_subcommand("dump", "Print every record of a trace as text");
  dump->add_option("trace", dump_path, "The trace (raw or .zst)")->required();
  bool quiet = false;
  const char* quiet_help = "No progress line on stderr (it is shown only on a terminal, after 1 s)";
  dump->add_flag("-q,--quiet", quiet, quiet_help);

  std::vector<std::string> traces;
  bool json = false;
  SummaryOptions sopt;
  int top = 5;
  auto* summary = app.add_subcommand("summary", "Memory summary of one or more traces");
  summary->add_flag("--json", json, "One JSON document (schema gpuheap.summary/2)");
  summary->add_option("--device", sopt.device, "Only this device (exit 2 when no trace has it)");
  summary->add_option("--top", top, "Entries per list (default 5)")->check(CLI::PositiveNumber);
  int depth = static_cast<int>(sopt.depth);
  auto* depth_opt = summary->add_option("--depth", depth, "Frames per site below the allocator's own (default 3)")
                        ->check(CLI::PositiveNumber);
  summary->add_flag("--full", sopt.full, "Everything: every frame of every stack, every entry of every list");
  summary->add_flag("--pools", sopt.pools, "Add the large/small pool rows to the memory table (--full has them too)");
  summary->add_option("--library", sopt.library, "Only sites of this library (NCCL, cuBLAS, PyTorch, ...; any case)");
  std::int64_t only_pid = -1;
  summary->add_option("--pid", only_pid, "Only the trace of this process (of several given)")
      ->check(CLI::NonNegativeNumber);
  summary->add_flag("--all-frames", sopt.all_frames, "Keep gpuheap/CUDA-internal frames");
  summary->add_option("traces", traces, kTracesHelp)->required();
  summary->add_flag("-q,--quiet", quiet, quiet_help);
  DebuginfodOpt dopt;
  add_debuginfod(summary, dopt);
  // Windows (analyzer/model/phases.h, docs/cli.md "Phases and windows"), on summary and check.
  WindowSpec wspec;
  auto add_window = [&](CLI::App* cmd, std::string& growth_phase) {
    cmd->add_option("--phase", wspec.phase, "Only the time inside this phase's instances (NAME)");
    cmd->add_option("--time", wspec.time, "Only FROM:TO (seconds from the start, or phase/mark names; either optional)");
    cmd->add_option("--after", wspec.after, "Only after TIME (seconds) or the end of phase/mark NAME's first instance");
    cmd->add_option("--growth-phase", growth_phase, "Phase whose instances measure growth (default: most repeated)");
  };
  add_window(summary, sopt.growth_phase);

  CheckOptions copt;
  std::string max_req, max_alloc, max_res, max_leak;
  auto* check = app.add_subcommand("check", "Fail (exit 1) when memory limits are exceeded");
  check->add_option("traces", traces, kTracesHelp)->required();
  check->add_option("--max-requested", max_req, "Limit on peak requested bytes (SIZE)");
  check->add_option("--max-allocated", max_alloc, "Limit on peak allocated bytes (SIZE)");
  check->add_option("--max-reserved", max_res, "Limit on peak reserved bytes (SIZE)");
  check->add_option("--max-leaked", max_leak, "Limit on bytes live at the end (SIZE)");
  std::string max_growth;
  check->add_option("--max-growth", max_growth, "Limit on live bytes' growth from the 2nd to the last step (SIZE)");
  check->add_option("--baseline", copt.baseline, "An earlier run's summary --json file (the reference)");
  check->add_option("--tolerance", copt.tolerance_pct, "Allowed growth over the baseline in % (default 5)")
      ->check(kFiniteNonNegative);
  check->add_flag("--all-frames", copt.all_frames, "Keep gpuheap/CUDA-internal frames in site names");
  check->add_flag("--allow-truncated", copt.allow_truncated,
                  "Check a trace without an end record (killed or still running) instead of failing");
  check->add_flag("-q,--quiet", quiet, quiet_help);
  add_debuginfod(check, dopt);
  add_window(check, copt.growth_phase);

  std::string diff_a, diff_b;
  bool diff_all = false;
  int diff_top = 20;
  auto* diff = app.add_subcommand("diff", "Per-device totals and per-site differences between two traces (--fail-on: a CI gate)");
  diff->add_option("A", diff_a, "The trace to compare from")->required();
  diff->add_option("B", diff_b, "The trace to compare with A")->required();
  diff->add_option("--top", diff_top, "Rows shown (default 20)")->check(CLI::PositiveNumber);
  diff->add_flag("--all-frames", diff_all, "Keep gpuheap/CUDA-internal frames");
  diff->add_flag("-q,--quiet", quiet, quiet_help);
  add_debuginfod(diff, dopt);
  // The CI gate (analyzer/summary/diff.h): metric names as check's --max-* limits, plus count.
  bool diff_json_out = false;
  std::vector<std::string> diff_fail_on;
  std::string diff_tol_bytes;
  DiffGate dgate;
  diff->add_flag("--json", diff_json_out, "One JSON document (schema gpuheap.diff/1)");
  diff->add_option("--fail-on", diff_fail_on,
                   "Exit 1 when one of these metrics (comma-separated) grows from A to B beyond the tolerance on any device")
      ->delimiter(',')
      ->check(CLI::IsMember({"requested", "allocated", "reserved", "leaked", "count"}));
  diff->add_option("--tolerance", dgate.tolerance_pct, "Growth allowed with --fail-on, in % of A (default 5)")
      ->check(kFiniteNonNegative);
  diff->add_option("--tolerance-bytes", diff_tol_bytes, "Growth up to SIZE never fails with --fail-on (default 0)")
      ->type_name("SIZE");
  diff->add_flag("--allow-truncated", dgate.allow_truncated,
                 "With --fail-on, compare a trace without an end record instead of failing");

  // report / export (analyzer/export/: report_html.cpp, export_*.cpp; docs/cli.md)
  ExportOptions xopt;
  auto* xport = app.add_subcommand("export", "Convert traces for other tools (Perfetto, speedscope, memory_viz, RMM)");
  xport->add_option("--format", xopt.format, "Output format: chrome, folded, speedscope, torch-snapshot, csv or rmm-csv")
      ->required()->check(CLI::IsMember({"chrome", "folded", "speedscope", "torch-snapshot", "csv", "rmm-csv"}));
  xport->add_option("--metric", xopt.metric, "What folded stacks weigh: peak (default), leaked, allocated or count")
      ->check(CLI::IsMember({"peak", "leaked", "allocated", "count"}));
  xport->add_option("--device", xopt.device, "Only this device (event formats)");
  xport->add_option("-o,--output", xopt.output, "Output file (- = stdout); an existing one needs --force")->required();
  xport->add_flag("--force", xopt.force, "Replace an existing output file (never one of the traces)");
  xport->add_option("--max-entries", xopt.max_entries,
                    "torch-snapshot: trace entries kept per device, the last ones (default 100000, as memory_viz "
                    "suggests; 0: all)");
  xport->add_flag("--all-frames", xopt.all_frames, "Keep gpuheap/CUDA-internal frames");
  xport->add_option("traces", traces, kTracesHelp)->required();
  xport->add_flag("-q,--quiet", quiet, quiet_help);
  ReportOptions ropt;
  auto* report = app.add_subcommand("report", "Self-contained HTML report: timeline, flame graphs, tables");
  report->add_option("-o,--output", ropt.output, "The HTML file (- = stdout); an existing one needs --force")->required();
  report->add_flag("--force", ropt.force, "Replace an existing output file (never one of the traces)");
  report->add_option("--points", ropt.points, "Timeline points per series (default 4096; peaks stay exact)")
      ->check(CLI::Range(16, 1 << 20));
  report->add_option("--max-nodes", ropt.max_nodes, "Flame graph nodes per graph; smaller ones merge (default 4000)")
      ->check(CLI::Range(16, 1 << 22));
  report->add_flag("--all-frames", ropt.all_frames, "Keep gpuheap/CUDA-internal frames");
  report->add_option("traces", traces, kTracesHelp)->required();
  report->add_flag("-q,--quiet", quiet, quiet_help);
  add_debuginfod(xport, dopt);
  add_debuginfod(report, dopt);

  // symbolize / compress (analyzer/symbolize/symbolize_trace.cpp, analyzer/trace/trace_files.cpp)
  SymbolizeTraceOptions syopt;
  auto* symbolize = app.add_subcommand("symbolize", "Store symbolized frames in traces (run where the modules are)");
  symbolize->add_option("traces", traces, kTracesHelp)->required();
  symbolize->add_flag("--allow-truncated", syopt.allow_truncated,
                      "Symbolize a trace without an end record (killed or still running) instead of failing");
  add_verbose(symbolize);
  add_debuginfod(symbolize, dopt);
  CompressOptions zopt;
  auto* compress = app.add_subcommand("compress", "Compress traces with zstd into TRACE.zst (verified, then the "
                                                  "original is removed)");
  compress->add_option("traces", traces, kTracesHelp)->required();
  compress->add_flag("-k,--keep", zopt.keep, "Keep the original trace");
  compress->add_flag("-f,--force", zopt.force, "Replace an existing TRACE.zst");
  for (auto* c : {summary, check, diff, xport, report}) add_verbose(c);

  // replay (analyzer/replay/): the trace through gpuheap's pool under other policies/limits.
  ReplayCli rp;
  auto* replay = app.add_subcommand("replay", "What-if: replay a trace through a pool policy and memory limit");
  replay->add_option("trace", rp.trace, "The trace (raw or .zst)")->required();
  replay->add_option("--policy", rp.policy,
                    "Pool policy: gpuheap (default), gpuheap:KEY=SIZE,..., torch[:KEY=VALUE,...] (PyTorch's "
                    "caching allocator) or none");
  replay->add_option("--limit", rp.limit, "Per-device memory limit (SIZE): exit 1 if the job would run out");
  replay->add_flag("--json", rp.json, "One JSON document (schema gpuheap.replay/1)");
  replay->add_option("--sweep", rp.sweep, "Policies separated by ';' (or all = gpuheap;torch;none): one table row per policy x limit");
  replay->add_option("--limits", rp.limits, "Limits separated by ',' for the --sweep table");
  replay->add_flag("--find-min-limit", rp.find_min_limit, "Bisect the smallest per-device limit that fits");
  replay->add_flag("-q,--quiet", rp.quiet, "No events/s line on stderr");
  add_debuginfod(replay, dopt);

  // After `run --`, CLI11 2.1 hands the rest of the line back to the app (run has no
  // positional left to fill): prefix_command() here keeps it whole, in order, as
  // app.remaining(). Set after the subcommands were added, so they do not inherit it; any
  // leftover outside `run` is refused below.
  app.prefix_command();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }

  if (!*run && !app.remaining().empty())
    throw UsageError(fmt::format("unexpected argument(s): {}", fmt::join(app.remaining(), " ")));
  if (*run) {
    run_opt.command = run->remaining();
    if (run_opt.command.empty()) {
      run_opt.command = app.remaining();  // after `--`: taken as it is
    } else if (run_opt.command[0].size() > 1 && run_opt.command[0][0] == '-') {
      throw UsageError(fmt::format("run: unknown option {} (run's options come before the program; `gpuheap run "
                                   "[OPTIONS] [--] PROGRAM [ARGS...]`)", run_opt.command[0]));
    }
    run_opt.finish.symbolize = !no_symbolize, run_opt.finish.compress = !no_compress;
    run_opt.finish.verbose = g_verbose;
    run_opt.finish.force = run_opt.force;
    run_opt.keep_framework_pools = framework_pools == "keep";
    return run_traced(run_opt);
  }
  configure_debuginfod(dopt.on, dopt.timeout_s);
  AnalyzeOptions aopt;
  aopt.progress = !quiet;
  if (*dump) {
    int rc = dump_trace(dump_path, stdout, !quiet);
    flush_or_throw();
    return rc;
  }
  if (*xport) return xopt.progress = !quiet, export_command(traces, xopt);
  if (*report) return ropt.progress = !quiet, report_command(traces, ropt);
  if (*summary) {
    sopt.top = static_cast<std::size_t>(top);
    sopt.depth = static_cast<std::size_t>(depth);
    sopt.depth_given = depth_opt->count() > 0;
    sopt.window = wspec.describe();
    if (only_pid >= 0) traces = traces_of_pid(traces, static_cast<std::uint64_t>(only_pid));
    auto a = analyze_window(traces, aopt, wspec);
    if (sopt.device >= 0) require_device(a, sopt.device);
    if (json) {
      // Trace strings (paths, command lines, names) are arbitrary bytes: invalid UTF-8 is
      // replaced by U+FFFD rather than making dump() throw; everything else is escaped.
      std::cout << summary_json(a, sopt).dump(1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      std::cout << summary_text(a, sopt);
    }
    flush_or_throw();
    return 0;
  }
  if (*check) {
    copt.max_requested = size_opt(max_req);
    copt.max_allocated = size_opt(max_alloc);
    copt.max_reserved = size_opt(max_res);
    copt.max_leaked = size_opt(max_leak);
    copt.max_growth = size_opt(max_growth);
    if (!copt.max_requested && !copt.max_allocated && !copt.max_reserved && !copt.max_leaked && !copt.max_growth &&
        copt.baseline.empty())
      throw UsageError("check: give at least one --max-* limit or --baseline");
    auto a = analyze_window(traces, aopt, wspec);
    if (wspec.any()) std::printf("gpuheap check: note: figures restricted to %s\n", wspec.describe().c_str());
    auto r = run_check(a, copt);
    for (const auto& n : r.notes) std::printf("gpuheap check: note: %s\n", n.c_str());
    for (const auto& p : r.passed) std::printf("gpuheap check: ok: %s\n", p.c_str());
    for (const auto& v : r.violations) std::printf("gpuheap check: FAIL: %s\n", v.c_str());
    flush_or_throw();
    return r.violations.empty() ? 0 : 1;
  }
  if (*replay) return replay_command(rp);
  if (*symbolize) {
    for (const auto& t : traces) {
      auto r = symbolize_trace(t, syopt);
      if (r.rewritten)
        std::printf("gpuheap symbolize: %s: stored the frames of %llu ips (%llu already stored, %llu not found here)\n",
                    t.c_str(), static_cast<unsigned long long>(r.added), static_cast<unsigned long long>(r.already),
                    static_cast<unsigned long long>(r.unresolved));
      else
        std::printf("gpuheap symbolize: %s: unchanged: %llu ips, %llu already stored, %llu not found here\n", t.c_str(),
                    static_cast<unsigned long long>(r.ips), static_cast<unsigned long long>(r.already),
                    static_cast<unsigned long long>(r.unresolved));
    }
    flush_or_throw();
    return 0;
  }
  if (*compress) {
    for (const auto& t : traces) {
      auto r = compress_trace(t, zopt);
      std::printf("gpuheap compress: %s -> %s: %llu -> %llu bytes (%.1fx)\n", t.c_str(), r.output.c_str(),
                  static_cast<unsigned long long>(r.bytes_before), static_cast<unsigned long long>(r.bytes_after),
                  r.bytes_after ? static_cast<double>(r.bytes_before) / static_cast<double>(r.bytes_after) : 0.0);
    }
    flush_or_throw();
    return 0;
  }
  if (*diff) {
    auto a = analyze({diff_a}, aopt);
    auto b = analyze({diff_b}, aopt);
    const Model& ma = *a.traces[0];
    const Model& mb = *b.traces[0];
    for (const auto& name : diff_fail_on) {
      auto m = diff_metric_from(name);
      if (m && std::find(dgate.fail_on.begin(), dgate.fail_on.end(), *m) == dgate.fail_on.end())
        dgate.fail_on.push_back(*m);
    }
    if (auto slack = size_opt(diff_tol_bytes)) dgate.tolerance_bytes = *slack;
    auto rows = diff_sites(ma, mb, diff_all);
    auto devs = diff_devices(ma, mb);
    auto verdict = diff_verdict(ma, mb, devs, dgate);
    auto lines = verdict_lines(verdict, dgate);
    if (diff_json_out) {
      std::cout << diff_json(devs, rows, static_cast<std::size_t>(diff_top), ma, mb, verdict, dgate)
                       .dump(1, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
      // stdout holds only the document; the gate's lines go to the CI log.
      for (const auto& l : lines) std::fprintf(stderr, "gpuheap diff: %s\n", l.c_str());
    } else {
      std::cout << diff_totals_text(devs, ma, mb);
      std::cout << diff_text(rows, static_cast<std::size_t>(diff_top), ma, mb);
      for (const auto& l : lines) std::cout << "gpuheap diff: " << l << "\n";
    }
    flush_or_throw();
    return verdict.failed() ? 1 : 0;
  }
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  auto logger = spdlog::stderr_color_st("gpuheap");
  auto fmt = std::make_unique<spdlog::pattern_formatter>();
  fmt->add_flag<EscapedPayload>('*').set_pattern("gpuheap: %^%l%$: %*");
  logger->set_formatter(std::move(fmt));
  spdlog::set_default_logger(logger);
  try {
    int rc = real_main(argc, argv);
    report_missing_modules(g_verbose);  // once for the whole command
    return rc;
  } catch (const InputError& e) {
    report_missing_modules(g_verbose);
    spdlog::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("internal error: {}", e.what());
    return 2;
  }
}
