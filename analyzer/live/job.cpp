// The traces of one job, followed (job.h): where they are found, when they end, what a
// refresh shows of each.
#include "analyzer/live/job.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/live/discover.h"
#include "analyzer/live/follow.h"
#include "analyzer/live/live_categories.h"
#include "analyzer/summary/report.h"
#include "analyzer/symbolize/labels.h"

namespace gpuheap::live {

namespace {
// A path list still there while every trace it named has ended for this long: its run was
// killed before it could remove the list (SIGKILL), or it is finishing traces. Either way
// nothing more will come from the processes that ended.
constexpr double kListGraceS = 5.0;
}  // namespace

const char* group_name(Group g) { return g == Group::line ? "line" : g == Group::function ? "function" : "category"; }
const char* sort_name(Sort s) { return s == Sort::bytes ? "bytes" : s == Sort::growth ? "growth" : "count"; }

std::vector<SiteNow> group_sites(const std::vector<SiteNow>& sites, Group g, Sort s, std::size_t top) {
  std::map<std::string, SiteNow> by;
  std::map<std::string, std::map<std::string, std::uint64_t>> cats;  // key -> category -> live bytes
  for (const auto& x : sites) {
    const std::string& key = g == Group::line ? x.line : g == Group::function ? x.function : x.category;
    cats[key][x.category] += x.bytes;
    auto [it, fresh] = by.try_emplace(key, x);
    if (fresh) continue;
    it->second.bytes += x.bytes, it->second.count += x.count, it->second.growth += x.growth;
  }
  std::vector<SiteNow> out;
  for (auto& [k, v] : by) {
    if (v.bytes == 0 && v.growth == 0) continue;
    // The merged row's category: that of most of its live bytes (ties: the first by name).
    std::uint64_t most = 0;
    for (const auto& [c, b] : cats[k])
      if (b > most) most = b, v.category = c;
    out.push_back(std::move(v));
  }
  auto value = [s](const SiteNow& x) -> std::int64_t {
    return s == Sort::bytes    ? static_cast<std::int64_t>(x.bytes)
           : s == Sort::growth ? x.growth
                               : static_cast<std::int64_t>(x.count);
  };
  std::stable_sort(out.begin(), out.end(), [&](const SiteNow& a, const SiteNow& b) { return value(a) > value(b); });
  if (top && out.size() > top) out.resize(top);
  return out;
}

// One followed trace: its follower once its header is there, its labels, the live bytes per
// site at the base moment (the start of the current step, else the last refresh).
struct Followed {
  std::string path;
  std::unique_ptr<TraceFollower> f;
  std::string error;  // could not be read: a note, and it counts as ended
  std::unique_ptr<StackResolver> res;
  std::size_t res_modules = 0;
  std::unordered_map<std::uint32_t, std::pair<std::string, std::string>> labels;
  std::unordered_map<std::uint32_t, StackTraits> traits;  // kept across resolvers: a stack's frames stay
  std::unique_ptr<LiveCategories> cats;
  // Once ended: the summary's categories of the finished trace (a second read, with the
  // symbols the finishing step stored at its end, which the live read saw too late).
  std::unique_ptr<CategoryReport> final_cats;
  std::vector<std::int64_t> base;
  bool step_based = false;
  struct StepStart {
    std::uint64_t index = 0;
    std::vector<std::pair<int, std::int64_t>> requested;  // device -> requested bytes
  };
  std::deque<StepStart> step_starts;

  bool ended() const { return !error.empty() || (f && f->ended()); }
  void on_step_start();
  void finish_categories();
  StackResolver& resolver();
  const std::pair<std::string, std::string>& label(std::uint32_t stack);
  const StackTraits& traits_of(std::uint32_t stack);
  ProcessNow now();
};

void Followed::on_step_start() {
  const auto& m = f->model();
  const auto [name, index] = f->steps().step();
  if (name != f->steps().last_started) return;  // another top-level range
  step_based = true;
  base.assign(m.sites.size(), 0);
  for (std::size_t i = 0; i < m.sites.size(); ++i) base[i] = m.sites[i].live_bytes;
  StepStart s{index, {}};
  for (const auto& d : m.devices)
    if (d.device >= 0) s.requested.emplace_back(d.device, d.stat[kRequestedBytes][kAllPools].current);
  step_starts.push_back(std::move(s));
  if (step_starts.size() > Job::kSteps) step_starts.pop_front();
}

StackResolver& Followed::resolver() {
  const Model& m = f->model();
  // Modules loaded since (dlopen) are symbolized only by a resolver that knows them.
  if (!res || res_modules != m.modules.size()) {
    res = std::make_unique<StackResolver>(m, false);
    res_modules = m.modules.size();
    labels.clear();
  }
  return *res;
}

const std::pair<std::string, std::string>& Followed::label(std::uint32_t stack) {
  StackResolver& r = resolver();
  auto it = labels.find(stack);
  if (it != labels.end()) return it->second;
  const auto& frames = r.frames(stack);
  return labels.emplace(stack, std::make_pair(site_label_text(frames, true), site_label(frames))).first->second;
}

// The category rules' view of one stack, as SiteLists::traits gives it to the summary.
const StackTraits& Followed::traits_of(std::uint32_t stack) {
  auto it = traits.find(stack);
  if (it != traits.end()) return it->second;
  const auto& frames = resolver().frames(stack);
  std::vector<FrameRef> refs;
  refs.reserve(frames.size());
  for (const auto& fr : frames) refs.push_back({fr.function, fr.file, fr.module, fr.line, fr.module == "python"});
  return traits.emplace(stack, stack_traits(refs)).first->second;
}

void Followed::finish_categories() {
  cats->finish();
  const Model& m = f->model();
  // Without frames stored in the trace the live read named every stack as a second read
  // would (a stack's modules and Python code come before it): nothing to redo. A rolling
  // window's file holds only its last segment's events, which a second read would classify
  // without what was live before it: the live classification stands.
  if (m.symbols.frames.empty() || m.info.window || f->rolls()) return;
  StackResolver fresh(m, false);
  std::unordered_map<std::uint32_t, StackTraits> tr;
  try {
    final_cats = std::make_unique<CategoryReport>(categorize(m, [&](std::uint32_t stack) -> const StackTraits& {
      auto it = tr.find(stack);
      if (it != tr.end()) return it->second;
      std::vector<FrameRef> refs;
      for (const auto& fr : fresh.frames(stack))
        refs.push_back({fr.function, fr.file, fr.module, fr.line, fr.module == "python"});
      return tr.emplace(stack, stack_traits(refs)).first->second;
    }));
  } catch (const std::exception&) {
    // The file moved on meanwhile (`gpuheap run` compresses it to TRACE.zst): the live
    // classification, finished, stands.
  }
}

namespace {
// The category of most of a stack's bytes live at the end (unknown when none).
Category leaked_category(const CategoryReport& r, std::uint32_t stack) {
  auto it = r.leaked_by_stack.find(stack);
  if (it == r.leaked_by_stack.end()) return Category::unknown;
  std::size_t best = static_cast<std::size_t>(Category::unknown);
  for (std::size_t i = 0; i < kNumCategories; ++i)
    if (it->second.bytes[i] > it->second.bytes[best] || (it->second.count[i] && !it->second.count[best])) best = i;
  return static_cast<Category>(best);
}
}  // namespace

ProcessNow Followed::now() {
  ProcessNow p;
  p.trace = path;
  const Model& m = f->model();
  p.pid = m.info.pid, p.host = m.info.hostname;
  for (const auto& w : m.info.command) p.command += (p.command.empty() ? "" : " ") + w;
  p.state = f->has_end() ? "ended" : f->gone() ? "gone" : "running";
  p.phase = f->steps().now;
  std::tie(p.step_name, p.step) = f->steps().step();
  p.step_known = f->segments_missed() == 0;
  p.growth_since = step_based ? "step" : "refresh";
  p.categories_are = f->finished() ? "final" : "provisional";
  p.training_found = final_cats ? final_cats->saw_training : cats && cats->saw_training();
  for (const auto& d : m.devices) {
    if (d.device < 0) continue;  // pinned host memory (summary's "host")
    DeviceNow x;
    x.device = d.device, x.name = d.name, x.total_memory = d.total_memory;
    x.requested = d.stat[kRequestedBytes][kAllPools], x.allocated = d.stat[kAllocatedBytes][kAllPools];
    x.reserved = d.stat[kReservedBytes][kAllPools];
    x.ooms = d.num_ooms, x.retries = d.num_alloc_retries;
    x.peak_held = d.peak_held, x.peak_held_allocated = d.peak_held_allocated;
    if (final_cats) {
      auto c = final_cats->leaked_by_device.find(d.device);
      if (c != final_cats->leaked_by_device.end()) x.categories = c->second;
    } else if (cats) {
      auto c = cats->devices().find(d.device);
      if (c != cats->devices().end()) x.categories = c->second;
    }
    // A device missing from a step's start was not seen yet then: nothing allocated on it.
    for (const auto& s : step_starts) {
      auto it = std::find_if(s.requested.begin(), s.requested.end(),
                             [&](const auto& r) { return r.first == d.device; });
      x.step_starts.emplace_back(s.index, it == s.requested.end() ? 0 : it->second);
    }
    p.devices.push_back(std::move(x));
  }
  if (base.size() < m.sites.size()) base.resize(m.sites.size(), 0);
  for (std::size_t i = 0; i < m.sites.size(); ++i) {
    const auto& s = m.sites[i];
    const std::int64_t growth = s.live_bytes - base[i];
    if (s.live_count <= 0 && growth == 0) continue;
    const auto& [line, function] = label(static_cast<std::uint32_t>(i));
    const auto id = static_cast<std::uint32_t>(i);
    const Category cat = final_cats ? leaked_category(*final_cats, id)
                         : cats     ? cats->site_category(id)
                                    : Category::unknown;
    p.sites.push_back({static_cast<std::uint32_t>(i), line, function,
                       static_cast<std::uint64_t>(std::max<std::int64_t>(s.live_bytes, 0)),
                       static_cast<std::uint64_t>(std::max<std::int64_t>(s.live_count, 0)), growth,
                       category_name(cat)});
  }
  if (!step_based)
    for (std::size_t i = 0; i < m.sites.size(); ++i) base[i] = m.sites[i].live_bytes;
  p.records = f->records(), p.bytes_read = f->bytes_read();
  return p;
}

struct Job::Impl {
  Sources src;
  std::vector<std::unique_ptr<Followed>> traces;
  std::set<std::string> known;
  std::vector<std::string> notes;
  std::set<std::string> noted;
  std::set<std::string> missed_noted;  // traces noted for a missed segment
  bool program_done = false;
  std::string host = this_host();
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point all_ended_since{};
  bool all_ended_before = false;
  std::uint64_t refreshes = 0;

  void note(const std::string& s) {
    if (noted.insert(s).second) notes.push_back(s);
  }
  void add(const std::string& path);
  void discover();
  void poll(Followed& t);
  bool sources_done();
};

void Job::Impl::add(const std::string& path) {
  if (!known.insert(path).second) return;
  auto t = std::make_unique<Followed>();
  t->path = path;
  traces.push_back(std::move(t));
}

void Job::Impl::discover() {
  std::vector<std::string> found;
  for (const auto& failure : list_entries(src, found)) note(failure);
  for (const auto& p : found) add(p);
}

void Job::Impl::poll(Followed& t) {
  if (t.ended()) return;
  try {
    if (!t.f) {
      // `gpuheap run` compresses a finished trace to TRACE.zst and removes TRACE.
      struct stat st {};
      if (::stat(t.path.c_str(), &st) != 0 && ::stat((t.path + ".zst").c_str(), &st) == 0) t.path += ".zst";
      try {
        t.f = std::make_unique<TraceFollower>(t.path);
      } catch (const EmptyTraceError&) {
        return;  // created, header not written yet: next refresh
      }
      Followed* self = &t;
      t.f->on_step_start([self] { self->on_step_start(); });
      t.cats = std::make_unique<LiveCategories>(
          [self](std::uint32_t stack) -> const StackTraits& { return self->traits_of(stack); });
      t.f->on_record([self](const format::Record& r) { self->cats->feed(r); });
      t.f->on_new_model([self] {
        // The resolver reads the Model it was made from; the steps' bytes went on unseen.
        self->res.reset();
        self->labels.clear();
        self->step_starts.clear();
      });
    }
    // The pid is looked at before the read: a process gone by then wrote all it will, and
    // this read takes it; one that dies after it is caught by the next refresh.
    const auto& info = t.f->model().info;
    const bool gone = info.have_process && info.hostname == host && process_gone(info.pid);
    t.f->poll();
    if (t.f->path() != t.path) known.insert(t.path = t.f->path());  // moved on to TRACE.zst
    if (t.f->segments_missed() && missed_noted.insert(t.path).second)
      note(
          fmt::format("{}: a segment of the rolling window was replaced before it could be read; the figures "
                      "go on from the next segment's snapshot (exact for the peak held, the live set and the "
                      "per-site totals), the steps of the segment missed are not counted (step number unknown)",
                      t.path));
    if (gone && !t.f->ended()) {
      t.f->mark_gone();
      note(
          fmt::format("process {} is gone without an end record (killed?): {} is incomplete, read to its last "
                      "whole record",
                      info.pid, t.path));
    }
    if (t.f->ended()) {
      t.f->finish();
      t.finish_categories();
    }
  } catch (const std::exception& e) {
    t.error = e.what();
    note(fmt::format("{} (not followed further)", e.what()));
  }
}

bool Job::Impl::sources_done() {
  if (program_done) return true;
  return sources_complete(src);
}

Job::Job(const std::vector<std::string>& targets) : impl_(std::make_unique<Impl>()) {
  impl_->src = resolve_targets(targets);
  for (const auto& f : impl_->src.files) impl_->add(f);
}

Job::Job(std::string path_list, pid_t program) : impl_(std::make_unique<Impl>()) {
  impl_->src.path_list = std::move(path_list);
  impl_->src.root = program;
}

Job::~Job() = default;

void Job::program_exited() { impl_->program_done = true; }

void Job::refresh() {
  auto& I = *impl_;
  I.discover();
  for (auto& t : I.traces) I.poll(*t);
  ++I.refreshes;
  const bool all = !I.traces.empty() &&
                   std::all_of(I.traces.begin(), I.traces.end(), [](const auto& t) { return t->ended(); });
  if (all && !I.all_ended_before) I.all_ended_since = std::chrono::steady_clock::now();
  I.all_ended_before = all;
}

bool Job::ended() const {
  auto& I = *impl_;
  const bool all = std::all_of(I.traces.begin(), I.traces.end(), [](const auto& t) { return t->ended(); });
  if (!all) return false;
  // A directory with no trace yet: its job has not started (or writes elsewhere).
  if (I.traces.empty() && !I.src.dirs.empty() && I.src.path_list.empty() && I.src.root == 0) return false;
  if (I.sources_done()) return true;
  // Every trace of a path list ended, the list still there: see kListGraceS.
  if (!I.src.path_list.empty() && I.all_ended_before) {
    std::chrono::duration<double> d = std::chrono::steady_clock::now() - I.all_ended_since;
    return d.count() >= kListGraceS;
  }
  return false;
}

Snapshot Job::snapshot() {
  auto& I = *impl_;
  Snapshot s;
  s.refresh = I.refreshes;
  s.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - I.start).count();
  for (auto& t : I.traces)
    if (t->f && t->error.empty()) s.processes.push_back(t->now());
  s.notes = I.notes;
  s.ended = ended();
  if (s.processes.empty()) s.waiting = fmt::format("waiting for a trace ({})", describe());
  return s;
}

std::string Job::describe() const { return describe_sources(impl_->src); }

}  // namespace gpuheap::live
