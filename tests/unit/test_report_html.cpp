// `gpuheap report`: the page in a real browser (headless Chromium): it loads without script
// errors (report.js writes data-status="ok" only after drawing everything, and an error
// handler writes "error"), the timeline and flame graphs render, click-zoom, search, zoom and
// hover work (report.html#selftest), names from the trace stay text, and a screenshot is taken
// (GPUHEAP_TEST_OUT; the README's docs/report.png is that of the shipped H100 trace). Chromium missing is a failure, not a skip: setup.sh installs it.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tests/category_areas.h"

#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {

constexpr std::uint64_t MiB = 1u << 20;
// Each would set data-pwned="1" on the body if it ever became markup or script.
const char* kHostileModule = "/tmp/<img src=x onerror=document.body.setAttribute('data-pwned','1')>.so";
const char* kHostilePhase = "<svg onload=document.body.setAttribute('data-pwned','1')>";
const char* kHostileCmd = "</script><script>document.body.setAttribute('data-pwned','1')</script>";

std::string out_dir() {
  std::string d = GPUHEAP_TEST_OUT;
  ::mkdir(d.c_str(), 0755);
  return d;
}

std::string chromium() {
  for (const char* c : {"chromium", "chromium-browser", "google-chrome"}) {
    auto r = run(std::string("command -v ") + c);
    if (r.code == 0) return r.out.substr(0, r.out.find('\n'));
  }
  return "";
}

// Runs headless Chromium on the page with a fresh profile; `what` is "--dump-dom" or
// "--screenshot=PATH".
Result browse(const std::string& html, const std::string& what, const char* window = "1400,2200") {
  std::string exe = chromium();
  if (exe.empty()) return {127, "no chromium in PATH (scripts/setup.sh installs Debian's chromium package)"};
  char tmpl[] = "/tmp/gpuheap-chromium-XXXXXX";
  std::string profile = ::mkdtemp(tmpl);
  auto r = run("timeout 120 " + exe +
               " --headless --no-sandbox --disable-gpu --disable-background-networking --disable-component-update"
               " --disable-sync --disable-dev-shm-usage --no-first-run --hide-scrollbars --window-size=" +
               window + " --virtual-time-budget=15000 --user-data-dir=" + profile + " " + what + " file://" + html +
               " 2>/dev/null");
  run("rm -rf " + profile);
  return r;
}

// The data the page embeds (JSON inside <script type="application/json">).
nlohmann::json page_data(const std::string& page) {
  auto a = page.find("id=\"gpuheap-data\">");
  auto b = page.find("</script>", a);
  EXPECT_NE(a, std::string::npos);
  a += std::string("id=\"gpuheap-data\">").size();
  return nlohmann::json::parse(page.substr(a, b - a));
}

void expect_rendered(const std::string& dom) {
  EXPECT_NE(dom.find("data-status=\"ok\""), std::string::npos) << dom.substr(0, 3000);
  EXPECT_EQ(dom.find("<title>gpuheap report: ok</title>") == std::string::npos, false);
  // What was drawn is an attribute for tests, not text in the page's header (issue 35).
  EXPECT_EQ(dom.find(">ok: "), std::string::npos) << dom.substr(0, 3000);
  EXPECT_NE(dom.find("id=\"status\" hidden"), std::string::npos) << dom.substr(0, 3000);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom, m,
                                std::regex("data-drawn=\"(\\d+) timelines, (\\d+) series, (\\d+) markers, (\\d+) "
                                           "flame graphs, (\\d+) frames drawn")))
      << dom.substr(0, 3000);
  EXPECT_GE(std::stoi(m[1]), 1);
  EXPECT_GE(std::stoi(m[2]), 4);  // requested, allocated, active, reserved
  EXPECT_GE(std::stoi(m[3]), 1);  // the peak at least
  EXPECT_EQ(std::stoi(m[4]), 3);
  EXPECT_GE(std::stoi(m[5]), 3);
  // The byte axis ticks at round binary steps ("64 MiB", not "95.37 MiB").
  std::smatch ticks;
  ASSERT_TRUE(std::regex_search(dom, ticks, std::regex("data-yticks=\"([^\"]*)\""))) << dom.substr(0, 3000);
  const std::string t = ticks[1];
  EXPECT_TRUE(std::regex_match(t, std::regex("(\\d+ (B|KiB|MiB|GiB|TiB)\\|?)+"))) << t;
  EXPECT_NE(dom.find("class=\"uplot"), std::string::npos);  // uPlot built its chart
  EXPECT_NE(dom.find("<canvas"), std::string::npos);
}

TEST(ReportHtml, ChromiumIsInstalled) {
  EXPECT_FALSE(chromium().empty()) << "install Debian's chromium package (scripts/setup.sh does)";
}

TEST(ReportHtml, HostileNamesStayText) {
  TraceBuilder b;
  b.data.resize(format::kFileHeaderSize);  // a process record of its own: the hostile command line
  format::ProcessRecord p;
  p.pid = 7, p.ppid = 1, p.wall_ns = 1'700'000'000'000'000'000ull, p.mono_ns = TraceBuilder::kMono;
  p.hostname = "<b>host</b>", p.cmdline = kHostileCmd, p.version = "0.1.0", p.exe = "/bin/x";
  b.put(p);
  b.put(format::DeviceRecord{0, 16ull << 30, "<i>GPU</i>"});
  b.module(0x600000, 0x700000, kHostileModule);
  b.stack(1, {0x601000});
  b.segment(0x7f0000000000ull, 20 * MiB, false);
  b.alloc(0x7f0000000000ull, 3 * MiB, 3 * MiB, 1);
  // Phase names are trace strings too: a range (shaded span) around the second allocation and
  // a mark (line), both named markup.
  b.put(format::PhaseRecord{b.tick(), 1, format::PhaseOp::push, format::PhaseSource::nvtx, kHostilePhase});
  b.alloc(0x7f0000000000ull + 3 * MiB, 2 * MiB, 2 * MiB, 1);
  b.put(format::PhaseRecord{b.tick(), 1, format::PhaseOp::pop, format::PhaseSource::nvtx, ""});
  b.put(format::PhaseRecord{b.tick(), 1, format::PhaseOp::mark, format::PhaseSource::api, "<u>mark</u>"});
  b.free(0x7f0000000000ull);
  b.completed(0x7f0000000000ull);
  format::OomRecord o;
  o.ts = b.tick(), o.device = 0, o.requested = 30 * MiB, o.stack = 1;
  b.put(o);
  b.end();
  auto trace = b.write("hostile.gh");
  std::string html = out_dir() + "/report-hostile.html";
  auto r = run(std::string(GPUHEAP_CLI) + " report -q --force -o " + html + " " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  auto page = slurp(html);
  // In the source, the names exist only escaped inside the JSON.
  EXPECT_EQ(page.find("<img"), std::string::npos);
  EXPECT_EQ(page.find("<b>host"), std::string::npos);
  EXPECT_EQ(page.find(kHostileCmd), std::string::npos);
  auto data = page_data(page);
  EXPECT_EQ(data["traces"][0]["command"], kHostileCmd);  // ... and decode to the original
  auto dom = browse(html, "--dump-dom");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 2000);
  expect_rendered(dom.out);
  EXPECT_EQ(dom.out.find("data-pwned=\"1\""), std::string::npos) << "the hostile script ran";
  EXPECT_EQ(dom.out.find("<img"), std::string::npos) << "a name became markup";
  EXPECT_NE(dom.out.find("&lt;/script&gt;&lt;script&gt;"), std::string::npos) << "the command line is shown as text";
  EXPECT_NE(dom.out.find("&lt;img src=x"), std::string::npos) << "the module name is shown as text";
  EXPECT_EQ(dom.out.find("<svg onload"), std::string::npos) << "a phase name became markup";
  EXPECT_NE(dom.out.find("Phases (shaded ranges, blue lines for marks): &lt;svg onload="), std::string::npos)
      << "the phase names are listed as text";
  EXPECT_NE(dom.out.find("1 phase spans"), std::string::npos) << dom.out.substr(0, 3000);
  EXPECT_EQ(data["timelines"][0]["spans"][0]["label"], kHostilePhase);
  // No phase found and no stack rule decided anything: no categories drawn (docs/categories.md),
  // not one area of unknown.
  EXPECT_FALSE(data["timelines"][0].contains("categories"));
  EXPECT_FALSE(data.contains("category_names"));
  EXPECT_EQ(data["flames"][0]["by_category"], false);
  EXPECT_EQ(dom.out.find("<select class=\"flame-category\""), std::string::npos);
  EXPECT_NE(dom.out.find(", 0 category areas"), std::string::npos);
  bool mark = false;
  for (const auto& m : data["timelines"][0]["markers"])
    mark = mark || (m["kind"] == "phase" && m["label"] == "<u>mark</u>");
  EXPECT_TRUE(mark) << data["timelines"][0]["markers"].dump();
}

TEST(ReportHtml, ShippedTraceRendersAndScreenshots) {
  std::string trace = GPUHEAP_SOURCE_DIR "/examples/traces/h100-gpt-train.trace.zst";
  std::string html = out_dir() + "/report-h100.html", png = out_dir() + "/report-h100.png";
  auto r = run(std::string(GPUHEAP_CLI) + " report -q --force -o " + html + " " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  auto dom = browse(html, "--dump-dom");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 2000);
  expect_rendered(dom.out);
  // Memory by category (docs/categories.md): the peak's table and each phase's highest point.
  EXPECT_NE(dom.out.find("Memory by category at the peak, cuda:0 (328.80 MiB; 30 training steps found from frames)"),
            std::string::npos);
  EXPECT_NE(dom.out.find("<td class=\"l\">activation</td><td>152.20 MiB</td>"), std::string::npos);
  EXPECT_NE(dom.out.find("Highest point of each phase found from frames, by category"), std::string::npos);
  // The summary's leak list is 4 B; what is live at the end is mostly cuBLAS workspaces.
  EXPECT_NE(dom.out.find("Live at the end: leaks and library workspaces"), std::string::npos);
  // Interaction: report.js's #selftest clicks a flame frame (zoom in, out), searches, zooms
  // and hovers the timeline, and says whether each did what it should.
  auto self = browse(html + "#selftest", "--dump-dom");
  ASSERT_EQ(self.code, 0) << self.out.substr(0, 2000);
  std::smatch st;
  ASSERT_TRUE(std::regex_search(self.out, st, std::regex("data-selftest=\"([^\"]*)\""))) << self.out.substr(0, 2000);
  EXPECT_EQ(st[1], "ok");
  std::remove(png.c_str());
  auto shot = browse(html, "--screenshot=" + png, "1280,1500");
  EXPECT_EQ(shot.code, 0) << shot.out;
  auto img = slurp(png);
  ASSERT_GT(img.size(), 20000u) << "no (or an empty) screenshot at " << png;
  EXPECT_EQ(img.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
}

// The timeline stacked by category and the flame graphs' category filter (docs/categories.md)
// on the shipped H100 GPT trace: at every point the categories add up to the requested line,
// and at the peak (the first point of the highest requested value: the same moment) each
// reads what `summary --json` says at the peak; so does the peak flame graph's root.
TEST(ReportHtml, TimelineAndFlameGraphByCategory) {
  std::string trace = GPUHEAP_SOURCE_DIR "/tests/gpu/traces/h100-gpt-train-v3.trace.zst";
  std::string html = out_dir() + "/report-h100-categories.html";
  auto r = run(std::string(GPUHEAP_CLI) + " report -q --force -o " + html + " " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  auto s = run(std::string("{ ") + GPUHEAP_CLI + " summary -q --json " + trace + " 2>/dev/null; }");
  ASSERT_EQ(s.code, 0) << s.out.substr(0, 2000);
  const auto at_peak = nlohmann::json::parse(s.out)["categories"]["at_peak"][0]["totals"];
  auto data = page_data(slurp(html));
  const auto& tl = data["timelines"][0];
  ASSERT_TRUE(tl.contains("categories")) << tl.dump().substr(0, 2000);
  const auto& names = tl["categories"]["names"];
  const auto& series = tl["categories"]["bytes"];
  ASSERT_EQ(names.size(), series.size());
  for (const char* c : {"parameter", "gradient", "optimizer_state", "activation", "library"})
    EXPECT_NE(std::find(names.begin(), names.end(), c), names.end()) << c << " in " << names.dump();
  const auto& req = tl["requested"];
  const std::size_t peak = gpuheap::test::areas_sum_to_requested(tl["categories"], req);
  if (::testing::Test::HasFailure()) return;
  std::uint64_t peak_total = 0;
  for (const auto& [name, v] : at_peak.items()) {
    peak_total += v["bytes"].get<std::uint64_t>();
    auto it = std::find(names.begin(), names.end(), name);
    const std::uint64_t drawn = it == names.end() ? 0 : series[it - names.begin()][peak].get<std::uint64_t>();
    EXPECT_EQ(drawn, v["bytes"].get<std::uint64_t>()) << name;
  }
  EXPECT_EQ(peak_total, req[peak].get<std::uint64_t>());
  EXPECT_GT(at_peak["parameter"]["bytes"].get<std::uint64_t>(), 0u);
  // The peak flame graph by category: each frame's own bytes (its value less its children's),
  // of the category it names (an index of category_names) or as [category, bytes, ...],
  // summed over the graph.
  const auto& cat_names = data["category_names"];
  const auto& flame = data["flames"][0];
  ASSERT_EQ(flame["id"], "peak");
  ASSERT_EQ(flame["by_category"], true);
  const auto& nodes = flame["nodes"];
  std::vector<std::uint64_t> own(nodes.size()), by_cat(cat_names.size(), 0);
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    own[i] += nodes[i][3].get<std::uint64_t>();
    if (i) own[nodes[i][4].get<std::size_t>()] -= nodes[i][3].get<std::uint64_t>();
  }
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    if (nodes[i].size() < 6) continue;
    const auto& c = nodes[i][5];
    if (c.is_number()) {
      by_cat.at(c.get<std::size_t>()) += own[i];
      continue;
    }
    std::uint64_t sum = 0;
    for (std::size_t q = 0; q + 1 < c.size(); q += 2)
      by_cat.at(c[q].get<std::size_t>()) += c[q + 1].get<std::uint64_t>(), sum += c[q + 1].get<std::uint64_t>();
    EXPECT_EQ(sum, own[i]) << nodes[i].dump();
  }
  for (std::size_t k = 0; k < cat_names.size(); ++k)
    EXPECT_EQ(by_cat[k], at_peak[cat_names[k].get<std::string>()]["bytes"].get<std::uint64_t>()) << cat_names[k];
  // The page: a legend entry per area, a filter on each flame graph, and (#selftest) the filter
  // narrows the graph to one category and "all categories" restores it.
  auto dom = browse(html, "--dump-dom");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 2000);
  expect_rendered(dom.out);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom.out, m, std::regex("(\\d+) category areas"))) << dom.out.substr(0, 3000);
  EXPECT_EQ(std::stoul(m[1]), names.size());
  EXPECT_NE(dom.out.find("<select class=\"flame-category\">"), std::string::npos);
  EXPECT_NE(dom.out.find(">parameter ("), std::string::npos);
  auto self = browse(html + "#selftest", "--dump-dom");
  ASSERT_EQ(self.code, 0) << self.out.substr(0, 2000);
  std::smatch st;
  ASSERT_TRUE(std::regex_search(self.out, st, std::regex("data-selftest=\"([^\"]*)\""))) << self.out.substr(0, 2000);
  EXPECT_EQ(st[1], "ok");
}

// Several processes: the merged timeline of their GPU is stacked by category as each
// process's is. Two copies of the GPT job's trace (the same clocks: together they hold twice
// its bytes at each moment) and a process that decided nothing holding 64 MiB throughout: at
// every point the merged chart's areas add up to its requested line, and at its peak they are
// twice the trace's own categories at its peak, and 64 MiB more unknown.
TEST(ReportHtml, MergedTimelineByCategory) {
  const std::string src = GPUHEAP_SOURCE_DIR "/tests/gpu/traces/h100-gpt-train-v3.trace.zst";
  const std::string dir = out_dir();
  ASSERT_EQ(run("cp " + src + " " + dir + "/rank-a.trace.zst && cp " + src + " " + dir + "/rank-b.trace.zst").code, 0);
  auto s = run(std::string("{ ") + GPUHEAP_CLI + " summary -q --json " + src + " 2>/dev/null; }");
  ASSERT_EQ(s.code, 0) << s.out.substr(0, 2000);
  const auto doc = nlohmann::json::parse(s.out);
  const auto at_peak = doc["categories"]["at_peak"][0]["totals"];
  // On the GPT job's host and GPU, from its start to after its end.
  const std::uint64_t wall = doc["trace"]["start_wall_ns"].get<std::uint64_t>();
  TraceBuilder b(wall, 7);
  b.data.resize(format::kFileHeaderSize);
  format::ProcessRecord p;
  const std::string host = doc["trace"]["host"].get<std::string>();  // p's fields are views
  p.pid = 7, p.ppid = 1, p.wall_ns = wall, p.mono_ns = TraceBuilder::kMono;
  p.hostname = host, p.cmdline = "hold", p.version = "0.1.0", p.exe = "/bin/hold";
  b.put(p);
  b.put(format::DeviceRecord{0, 80ull << 30, "Test GPU"});
  b.stack(1, {0x401000});
  b.segment(0x7e0000000000ull, 64 * MiB, false);
  b.alloc(0x7e0000000000ull, 64 * MiB, 64 * MiB, 1);
  b.tick(8'000'000'000);
  b.end();
  const std::string plain = b.write("merged-hold.gh");
  const std::string html = dir + "/report-merged-categories.html";
  auto r = run(std::string(GPUHEAP_CLI) + " report -q --force -o " + html + " " + dir + "/rank-a.trace.zst " + dir +
               "/rank-b.trace.zst " + plain);
  ASSERT_EQ(r.code, 0) << r.out;
  auto data = page_data(slurp(html));
  const auto& tls = data["timelines"];
  ASSERT_EQ(tls.size(), 4u);  // each process's device 0, then the GPU they share
  const auto& tl = tls[3];
  ASSERT_NE(tl["label"].get<std::string>().find("all 3 processes on it together"), std::string::npos) << tl["label"];
  ASSERT_TRUE(tl.contains("categories")) << tl.dump().substr(0, 2000);
  EXPECT_EQ(tl["categories"]["undecided"], 1);
  EXPECT_FALSE(tls[2].contains("categories"));  // the process that decided nothing has none of its own
  const auto& names = tl["categories"]["names"];
  const auto& series = tl["categories"]["bytes"];
  ASSERT_EQ(names.size(), series.size());
  const auto& req = tl["requested"];
  const std::size_t peak = gpuheap::test::areas_sum_to_requested(tl["categories"], req);
  if (::testing::Test::HasFailure()) return;
  std::uint64_t total = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const std::string name = names[k];
    const std::uint64_t want = (at_peak.contains(name) ? 2 * at_peak[name]["bytes"].get<std::uint64_t>() : 0) +
                               (name == "unknown" ? 64 * MiB : 0);
    EXPECT_EQ(series[k][peak].get<std::uint64_t>(), want) << name;
    total += want;
  }
  EXPECT_EQ(total, req[peak].get<std::uint64_t>());
  EXPECT_GE(names.size(), 5u) << names.dump();
  // Each process's chart is the one a report of its trace alone draws (the merged read makes
  // them too).
  const std::string alone = dir + "/report-merged-categories-alone.html";
  ASSERT_EQ(run(std::string(GPUHEAP_CLI) + " report -q --force -o " + alone + " " + src).code, 0);
  const auto one = page_data(slurp(alone))["timelines"][0]["categories"];
  for (std::size_t k = 0; k < 2; ++k) EXPECT_EQ(tls[k]["categories"], one) << k;
  std::size_t areas = 0;
  for (const auto& t : tls)
    if (t.contains("categories")) areas += t["categories"]["names"].size();
  auto dom = browse(html, "--dump-dom");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 2000);
  expect_rendered(dom.out);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dom.out, m, std::regex("(\\d+) category areas"))) << dom.out.substr(0, 3000);
  EXPECT_EQ(std::stoul(m[1]), areas);
  EXPECT_NE(dom.out.find("1 process on this GPU decided no category: what it holds is unknown."), std::string::npos);
  auto self = browse(html + "#selftest", "--dump-dom");
  ASSERT_EQ(self.code, 0) << self.out.substr(0, 2000);
  std::smatch st;
  ASSERT_TRUE(std::regex_search(self.out, st, std::regex("data-selftest=\"([^\"]*)\""))) << self.out.substr(0, 2000);
  EXPECT_EQ(st[1], "ok");
}

// The site column names a C++ site as summary's default view does (template arguments
// elided), the whole name in the cell's tooltip: the H100 trace has its frames' names.
TEST(ReportHtml, SiteColumnElidesTemplateArguments) {
  std::string trace = GPUHEAP_SOURCE_DIR "/tests/gpu/traces/h100-gpt-train-v3.trace.zst";
  std::string html = out_dir() + "/report-h100.html";
  auto r = run(std::string(GPUHEAP_CLI) + " report -q --force -o " + html + " " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  auto dom = browse(html, "--dump-dom");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 2000);
  expect_rendered(dom.out);
  auto cell = dom.out.find(">at::native::gpu_reduce_kernel&lt;...&gt;</span>");
  ASSERT_NE(cell, std::string::npos) << dom.out.substr(dom.out.find("Most allocations"), 4000);
  auto span = dom.out.rfind("<span title=\"at::native::gpu_reduce_kernel", cell);
  ASSERT_NE(span, std::string::npos);
  EXPECT_NE(dom.out.substr(span, cell - span).find("4, 4, at::native::func_wrapper_t"), std::string::npos);
  // A Python label is left as it is, with its line as the text has it (issue 35).
  EXPECT_NE(dom.out.find("<td class=\"l\">Block.forward (torch_job.py:49)</td>"), std::string::npos);
  EXPECT_EQ(dom.out.find("<td class=\"l\">Block.forward</td>"), std::string::npos);
  // The flame graphs fold pass-through frames as the text does (issue 35).
  const nlohmann::json data = page_data(slurp(html));
  ASSERT_FALSE(data["flames"].empty());
  for (const auto& f : data["flames"])
    for (const auto& n : f["names"]) {
      const std::string name = n.get<std::string>();
      EXPECT_EQ(name.find("Module._call_impl"), std::string::npos) << name;
      EXPECT_EQ(name.find("Module._wrapped_call_impl"), std::string::npos) << name;
    }
}

// Large traces: the page's data stays bounded (timeline points and flame nodes), the
// timeline's maxima are the replay's exact peaks, and the page still renders.
TEST(ReportHtml, LargeTraceIsDownsampledWithExactPeaks) {
  const char* scale = std::getenv("GPUHEAP_TEST_SCALE");
  std::string events = scale && std::string(scale) == "small" ? "200000" : "2000000";
  std::string trace = TraceBuilder::dir() + "/large.trace";
  auto g = run(std::string(GPUHEAP_GEN_TRACE) + " " + trace + " " + events);
  ASSERT_EQ(g.code, 0) << g.out;
  std::string html = out_dir() + "/report-large.html";
  auto r = run(std::string(GPUHEAP_CLI) + " report -q --force --points 1000 --max-nodes 50 -o " + html + " " + trace);
  ASSERT_EQ(r.code, 0) << r.out;
  auto data = page_data(slurp(html));
  AnalyzeOptions o;
  o.progress = false;
  auto a = analyze({trace}, o);
  ASSERT_FALSE(data["timelines"].empty());
  for (const auto& t : data["timelines"]) {
    EXPECT_LE(t["t"].size(), 1000u);
    EXPECT_GE(t["t"].size(), 100u);
    std::int64_t peak_alloc = 0, peak_res = 0;
    for (const auto& v : t["allocated"]) peak_alloc = std::max(peak_alloc, v.get<std::int64_t>());
    for (const auto& v : t["reserved"]) peak_res = std::max(peak_res, v.get<std::int64_t>());
    bool found = false;
    for (const auto& d : a.traces[0]->devices)
      if (t["label"].get<std::string>().rfind(fmt::format("cuda:{} ", d.device), 0) == 0) {
        found = true;
        EXPECT_EQ(peak_alloc, d.stat[kAllocatedBytes][0].peak);
        EXPECT_EQ(peak_res, d.stat[kReservedBytes][0].peak);
      }
    EXPECT_TRUE(found) << t["label"];
  }
  for (const auto& f : data["flames"]) {
    const auto& nodes = f["nodes"];  // [name, file, line, value, parent], parents first
    EXPECT_LE(nodes.size(), 50u) << f["id"];
    ASSERT_FALSE(nodes.empty());
    EXPECT_EQ(nodes[0][3], f["total"]);  // merging keeps every byte
    std::vector<std::uint64_t> below(nodes.size(), 0);
    bool merged = false;
    for (std::size_t i = 1; i < nodes.size(); ++i) {
      std::size_t parent = nodes[i][4];
      ASSERT_LT(parent, i);
      below[parent] += nodes[i][3].get<std::uint64_t>();
      merged |= f["names"][nodes[i][0].get<std::size_t>()].get<std::string>().find("smaller frame") !=
                std::string::npos;
    }
    for (std::size_t i = 0; i < nodes.size(); ++i) EXPECT_LE(below[i], nodes[i][3].get<std::uint64_t>()) << i;
    if (f["id"] == "allocated") EXPECT_TRUE(merged) << "the cap merged nothing: the test proves nothing";
  }
  auto dom = browse(html, "--dump-dom");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 2000);
  EXPECT_NE(dom.out.find("data-status=\"ok\""), std::string::npos);
}

}  // namespace

// Several ranks on several hosts (issue 35): the page opens its tables with the processes'
// rows and their spread, draws every chart on one time axis, and each GPU's merged chart
// (its peak marked) stands alone: device 0 of node-a and of node-b are two GPUs.
TEST(ReportHtml, RanksOnTwoHostsRender) {
  auto proc = [](const char* host, std::int32_t rank, std::uint32_t pid, std::uint64_t bytes, std::uint64_t start_ms) {
    const std::uint64_t wall = 1'700'000'000'000'000'000ull + start_ms * 1'000'000;
    TraceBuilder b(wall, pid);
    b.data.resize(format::kFileHeaderSize);
    format::ProcessRecord p;
    p.pid = pid, p.ppid = 1, p.wall_ns = wall, p.mono_ns = TraceBuilder::kMono;
    p.hostname = host, p.cmdline = "train.py", p.version = "0.1.0", p.exe = "/usr/bin/python3";
    b.put(p);
    b.put(format::IdentityRecord{rank, 0, 2, format::RankSource::torchrun});
    b.put(format::DeviceRecord{0, 16ull << 30, "Test GPU"});
    b.module(0x600000, 0x700000, "/opt/train");
    b.stack(1, {0x601000});
    b.segment(0x7f0000000000ull, bytes, false);
    b.alloc(0x7f0000000000ull, bytes, bytes, 1);
    b.tick(200'000'000);
    b.free(0x7f0000000000ull);
    b.completed(0x7f0000000000ull);
    b.end();
    return b.write(fmt::format("rank{}.gh", rank));
  };
  const std::string traces = proc("node-a", 0, 900, 20 * MiB, 0) + " " + proc("node-b", 1, 901, 50 * MiB, 100);
  std::string html = out_dir() + "/report-ranks.html";
  auto r = run(std::string(GPUHEAP_CLI) + " report -q --force -o " + html + " " + traces);
  ASSERT_EQ(r.code, 0) << r.out;
  auto data = page_data(slurp(html));
  EXPECT_NEAR(data["time_axis"]["max"].get<double>(), 0.3, 0.001);
  for (const auto& t : data["timelines"]) EXPECT_FALSE(t.contains("categories")) << t["label"];  // none decided
  auto dom = browse(html, "--dump-dom");
  ASSERT_EQ(dom.code, 0) << dom.out.substr(0, 2000);
  expect_rendered(dom.out);
  const auto table = dom.out.find("Processes (times since the earliest start)");
  ASSERT_NE(table, std::string::npos) << dom.out.substr(0, 3000);
  EXPECT_NE(dom.out.find("<td class=\"l\">node-b</td>", table), std::string::npos) << dom.out.substr(table, 3000);
  EXPECT_NE(dom.out.find("peak requested: max 50.00 MiB at rank 1, min 20.00 MiB at rank 0, max/min 2.50", table),
            std::string::npos)
      << dom.out.substr(table, 3000);
  EXPECT_NE(dom.out.find("rank 1, pid 901 on node-b: train.py  ("), std::string::npos);        // the traces' list
  EXPECT_NE(dom.out.find("<h3>rank 1, pid 901 on node-b: train.py</h3>"), std::string::npos);  // its tables
  EXPECT_NE(dom.out.find("device 0 of host node-a (rank 0): its one process"), std::string::npos);
  EXPECT_NE(dom.out.find("device 0 of host node-b (rank 1): its one process"), std::string::npos);
}
