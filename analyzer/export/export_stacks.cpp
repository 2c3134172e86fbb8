// Stack exports: folded ("frame;frame;frame value", flamegraph.pl / speedscope / inferno)
// and speedscope's own JSON file format, both from flame_samples() (the replay's per-site
// figures); and `gpuheap export`'s dispatcher.
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/export/export.h"
#include "analyzer/export/export_out.h"

namespace gpuheap {
namespace exporter {

namespace {
// A folded line is split on ';' between frames and on its last space before the value: a
// frame name keeps its spaces ("operator new(unsigned long)") but loses ';' and line breaks.
std::string folded_frame(const std::string& name) {
  std::string o = utf8_clean(name);
  for (auto& c : o)
    if (c == ';') c = ':';
    else if (c == '\n' || c == '\r' || c == '\t') c = ' ';
  return o;
}
}  // namespace

void export_folded(const Analysis& a, const ExportOptions& opt, OutFile& out) {
  std::vector<std::unique_ptr<StackResolver>> res;
  auto samples = flame_samples(a, parse_metric(opt.metric), opt.all_frames, res);
  // Stack ids that symbolize to the same names make one line.
  std::map<std::string, std::uint64_t> lines;
  for (const auto& s : samples) {
    std::string k;
    for (const auto& p : s.prefix) k += folded_frame(p) + ";";
    for (const Frame* f : s.frames) k += folded_frame(frame_name(*f)) + ";";
    k.pop_back();
    lines[k] += s.weight;
  }
  for (const auto& [k, v] : lines) {
    out.put(k);
    fmt::format_to(std::back_inserter(out.buf()), " {}\n", v);
    out.maybe_flush();
  }
}

// https://www.speedscope.app/file-format-schema.json: shared frames, one "sampled" profile per
// metric (each sample a root-first list of frame indices, weighted by bytes or count).
void export_speedscope(const Analysis& a, const ExportOptions& opt, OutFile& out) {
  std::vector<std::unique_ptr<StackResolver>> res;
  struct Fr {
    std::string name, file;
    int line;
  };
  std::vector<Fr> frames;
  std::unordered_map<std::string, std::size_t> index;
  auto frame_id = [&](const std::string& name, const std::string& file, int line) {
    auto [it, fresh] = index.emplace(fmt::format("{}\x1f{}\x1f{}", name, file, line), frames.size());
    if (fresh) frames.push_back({name, file, line});
    return it->second;
  };
  fmt::memory_buffer profiles;
  bool first_profile = true;
  for (auto m : {FlameMetric::peak, FlameMetric::leaked, FlameMetric::allocated, FlameMetric::count}) {
    auto samples = flame_samples(a, m, opt.all_frames, res);
    auto it = std::back_inserter(profiles);
    std::uint64_t total = 0;
    for (const auto& s : samples) total += s.weight;
    if (!first_profile) profiles.push_back(',');
    first_profile = false;
    static const char* titles[] = {"bytes live at the peak", "bytes leaked (live at the end)",
                                   "bytes allocated in total", "allocations"};
    fmt::format_to(it,
                   "{{\"type\":\"sampled\",\"name\":\"{}\",\"unit\":\"{}\",\"startValue\":0,\"endValue\":{},"
                   "\"samples\":[",
                   titles[static_cast<int>(m)], m == FlameMetric::count ? "none" : "bytes", total);
    for (std::size_t i = 0; i < samples.size(); ++i) {
      if (i) profiles.push_back(',');
      profiles.push_back('[');
      bool first = true;
      auto add = [&](std::size_t id) {
        if (!first) profiles.push_back(',');
        first = false;
        fmt::format_to(it, "{}", id);
      };
      for (const auto& p : samples[i].prefix) add(frame_id(p, "", 0));
      for (const Frame* f : samples[i].frames) add(frame_id(frame_name(*f), f->file, f->line));
      profiles.push_back(']');
    }
    profiles.append(std::string_view("],\"weights\":["));
    for (std::size_t i = 0; i < samples.size(); ++i) fmt::format_to(it, "{}{}", i ? "," : "", samples[i].weight);
    profiles.append(std::string_view("]}"));
  }
  auto& b = out.buf();
  out.put("{\"$schema\":\"https://www.speedscope.app/file-format-schema.json\",\"exporter\":\"gpuheap " GPUHEAP_VERSION
          "\",\"name\":");
  json_str(b, a.traces.size() == 1 ? a.traces[0]->info.path : fmt::format("{} traces", a.traces.size()));
  out.put(",\"activeProfileIndex\":0,\"shared\":{\"frames\":[");
  for (std::size_t i = 0; i < frames.size(); ++i) {
    if (i) b.push_back(',');
    b.append(std::string_view("{\"name\":"));
    json_str(b, frames[i].name);
    if (!frames[i].file.empty()) {
      b.append(std::string_view(",\"file\":"));
      json_str(b, frames[i].file);
      if (frames[i].line > 0) fmt::format_to(std::back_inserter(b), ",\"line\":{}", frames[i].line);
    }
    b.push_back('}');
    out.maybe_flush();
  }
  out.put("]},\"profiles\":[");
  out.put(std::string_view(profiles.data(), profiles.size()));
  out.put("]}\n");
}

}  // namespace exporter

int export_command(const std::vector<std::string>& traces, const ExportOptions& opt) {
  const auto& f = opt.format;
  bool one_trace = f == "torch-snapshot" || f == "rmm-csv";
  if (one_trace && traces.size() != 1)
    throw UsageError(fmt::format("export --format {} takes one trace (it describes one process)", f));
  if (f != "folded" && opt.metric != "peak") throw UsageError("--metric applies to --format folded only");
  exporter::parse_metric(opt.metric);  // a bad metric fails before any work
  exporter::OutFile out(opt.output, opt.inputs.empty() ? traces : opt.inputs, opt.force, "export");
  if (f == "csv") {
    exporter::export_csv(traces, opt, out);
  } else if (f == "rmm-csv") {
    exporter::export_rmm_csv(traces[0], opt, out);
  } else if (f == "chrome") {
    exporter::export_chrome(traces, opt, out);
  } else if (f == "torch-snapshot") {
    exporter::export_torch(traces[0], opt, out);
  } else if (f == "folded" || f == "speedscope") {
    if (opt.device >= 0) throw UsageError("--device does not apply to folded or speedscope exports");
    AnalyzeOptions aopt;
    aopt.progress = opt.progress;
    aopt.timeline_buckets = 2;
    Analysis a = analyze(traces, aopt);
    if (f == "folded") exporter::export_folded(a, opt, out);
    else exporter::export_speedscope(a, opt, out);
  } else {
    throw UsageError(fmt::format("unknown export format '{}'", f));
  }
  out.close();
  return 0;
}

}  // namespace gpuheap
