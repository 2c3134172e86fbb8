// Reports over an Analysis: text summary (torch.cuda.memory_summary()-shaped tables),
// JSON summary (schema gpuheap.summary/2, docs/summary-json.md), diff.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "analyzer/model/analysis.h"
#include "analyzer/model/category_pass.h"
#include "analyzer/summary/site_match.h"
#include "analyzer/symbolize/labels.h"  // library_label
#include "analyzer/symbolize/symbolize.h"

namespace gpuheap {

struct SummaryOptions {
  int device = -1;      // -1: every device
  std::size_t top = 5;  // entries per list (the CLI's default; the HTML report uses it too)
  bool all_frames = false;
  // Frames shown per site in text, counted from the first frame below the allocator's own
  // (labels.h: those are summarised as "... N allocator frames"); pass-through frames
  // (labels.h Passthrough) are folded into a count, not shown, and count for nothing here.
  std::size_t depth = 3;
  bool depth_given = false;  // --depth: JSON stacks are cut the same way (else they are whole)
  bool full = false;         // --full: every frame of every stack, every entry of every list
  bool pools = false;        // --pools (or --full): the torch table's large/small pool rows
  std::string library;       // --library: only sites with this library_label (case-insensitive)
  std::string window;        // what restricts the figures (--phase/--time/--after), "" = whole trace
  std::string growth_phase;  // --growth-phase ("" = the most repeated top-level range)
  std::string group_by;      // --group-by line|function|file|module: peak consumers summed ("" = by stack)
  // --include-library: the leak list shows library memory (workspaces, handles) too.
  bool include_library = false;
};

// Symbolized stacks of one trace, cached per stack id.
class StackResolver {
 public:
  StackResolver(const Model& m, bool all_frames);
  const std::vector<Frame>& frames(std::uint32_t stack);
  // Identity of a site independent of load addresses: function+file+line per visible frame
  // (module+offset when there is no debug info).
  const std::string& key(std::uint32_t stack);
  // library_label(frames(stack)): every site list, the per-library rows and --library ask it.
  const std::string& library(std::uint32_t stack);
  bool all_frames() const { return all_frames_; }

 private:
  const Model& m_;
  bool all_frames_;
  Symbolizer sym_;
  std::unordered_map<std::uint32_t, std::vector<Frame>> frames_;
  std::unordered_map<std::uint32_t, std::string> keys_;
  std::unordered_map<std::uint32_t, std::string> libraries_;
};

// A site after merging stack ids that symbolize to the same frames. bytes: requested (what
// the program asked for); allocated: the pool's block bytes for the same allocations.
struct SiteRow {
  std::uint32_t stack = 0;  // representative stack id
  std::uint64_t bytes = 0, count = 0, allocated = 0;
};
std::vector<SiteRow> merge_sites(const std::vector<SiteRow>& rows, StackResolver& res, bool by_count = false);
// The merged rows a summary list shows: those of opt.library only, the first opt.top of
// them (all with opt.full).
std::vector<SiteRow> shown_sites(const std::vector<SiteRow>& merged, StackResolver& res, const SummaryOptions& opt);

// --group-by (report_groups.cpp): the peak's sites of one device summed by opt.group_by
// (line, function, file, module, category), largest first; the first opt.top (all with opt.full).
struct PeakGroup {
  std::string key;
  std::uint64_t bytes = 0, allocated = 0, count = 0, sites = 0;
};
class SiteLists;
std::vector<PeakGroup> peak_groups(SiteLists& sites, std::size_t ti, std::size_t di, const SummaryOptions& opt);

// What the summary says about one OOM: format/rules.h's diagnosis, the same rule and words as
// the in-process stderr report (preload/core/oom.cpp).
struct OomAdvice {
  std::uint64_t held = 0;                   // device bytes the process held: reserved + async/managed/VMM physical
  std::uint64_t reserved_unused = 0;        // the pool's cache: reserved - allocated (as recorded)
  bool fits_without_fragmentation = false;  // reserved_unused >= request > largest free block
  const char* cause = "";                   // "fragmentation", "limit" or "live_allocations"
  std::string fit;                          // "without fragmentation the request would (not) have fit (...)"
  std::string suggestion;
};
OomAdvice oom_advice(const OomInfo& o);

struct LibraryRow {
  std::string library;
  std::uint64_t bytes = 0, count = 0;
};
// Peak consumers grouped by library_label, largest first.
std::vector<LibraryRow> peak_by_library(const std::vector<SiteRow>& sites, StackResolver& res);

// A frame that only passes a call on (labels.h Passthrough: Module._call_impl, the
// dispatcher's wrappers), which the text folds into a count; the report's flame graphs too.
bool passes_through(const Frame& f);

// The merged site lists (merge_sites) of every trace of one Analysis, each computed on first
// use and then shared: the report page holds the JSON summary, the text summary and three
// flame graphs of the same traces, and merging keys every stack (symbolizing it). One
// resolver per trace, in the form flame_samples() takes (export.h). `a` must outlive it.
class SiteLists {
 public:
  SiteLists(const Analysis& a, bool all_frames);
  ~SiteLists();
  SiteLists(const SiteLists&) = delete;
  SiteLists& operator=(const SiteLists&) = delete;
  const Analysis& analysis() const { return a_; }
  bool all_frames() const { return all_frames_; }
  StackResolver& res(std::size_t trace) { return *res_[trace]; }
  std::vector<std::unique_ptr<StackResolver>>& resolvers() { return res_; }
  // Trace `trace`'s merged rows. `device` and `oom` index the Model's devices and ooms.
  const std::vector<SiteRow>& peak(std::size_t trace, std::size_t device);               // its peak_consumers
  const std::vector<LibraryRow>& peak_libraries(std::size_t trace, std::size_t device);  // of peak()
  const std::vector<SiteRow>& most_allocations(std::size_t trace);  // sites with allocations, by count
  const std::vector<SiteRow>& temporary(std::size_t trace);         // sites with temporaries, by count
  const std::vector<SiteRow>& leaks(std::size_t trace);
  const std::vector<SiteRow>& oom_live(std::size_t trace, std::size_t oom);  // its top_live
  // Memory in the user's terms (analyzer/model/categories.h): the categories of trace
  // `trace`, computed on first use (a second read of the trace, every stack symbolized);
  // with `timelines`, CategoryReport::timelines too (computed again if they were not).
  const CategoryReport& categories(std::size_t trace, bool timelines = false);
  // Several traces: every trace's categories with their timelines (categories(trace, true))
  // and the merged GPUs' (index-aligned with Analysis::merged), the timelines of all from
  // one read of the traces (category_timelines(Analysis...)); computed on first use.
  const std::vector<MergedCategoryTimeline>& merged_categories();
  // The category rules' view of one stack (its frames as this resolver symbolizes them).
  const StackTraits& traits(std::size_t trace, std::uint32_t stack);
  // The category of most of a site's bytes: what a per-site view (group-by, top) shows.
  Category site_category(std::size_t trace, std::uint32_t stack) { return categories(trace).site_category(stack); }
  // The leaks a summary lists: user memory only (no library's), or all with include_library.
  std::vector<SiteRow> shown_leaks(std::size_t trace, bool include_library);

 private:
  struct Lists;
  Lists& lists(std::size_t trace);
  const Analysis& a_;
  bool all_frames_;
  std::vector<std::unique_ptr<StackResolver>> res_;
  std::vector<std::unique_ptr<Lists>> lists_;
  std::optional<std::vector<MergedCategoryTimeline>> merged_categories_;
};

std::string summary_text(const Analysis& a, const SummaryOptions& opt);
// With the lists another view of `a` already merged (sites.analysis() must be `a`, and
// sites.all_frames() opt.all_frames; else std::invalid_argument). The same text.
std::string summary_text(const Analysis& a, const SummaryOptions& opt, SiteLists& sites);
// The "By phase" table and growth (report_phases.cpp); JSON `phases`, `growth`, `window`.
void phases_text(std::string& out, const Model& m, const SummaryOptions& opt);
void phases_json(nlohmann::json& doc, const Model& m, const SummaryOptions& opt);
nlohmann::json summary_json(const Analysis& a, const SummaryOptions& opt);
nlohmann::json summary_json(const Analysis& a, const SummaryOptions& opt, SiteLists& sites);  // as summary_text's
nlohmann::json stack_json(const std::vector<Frame>& frames);
// "Memory by category" (report_categories.cpp): the text section, and the JSON `categories`
// object (totals at each device's peak and of the leaks, by category).
void categories_text(std::string& out, SiteLists& sites, std::size_t trace, const SummaryOptions& opt);
nlohmann::json categories_json(SiteLists& sites, std::size_t trace);
nlohmann::json category_totals_json(const CategoryBytes& b);
// At OOM `oi` of trace `ti` (report_text's and report_json's OOM entries): the live bytes by
// category as known then and the categories that grew since its step began (CategoryReport::
// oom_since). Nothing / null when the categories do not cover it (a window, nothing decided).
void oom_categories_text(std::string& out, SiteLists& sites, std::size_t ti, std::size_t oi);
nlohmann::json oom_categories_json(SiteLists& sites, std::size_t ti, std::size_t oi);

// Per-site differences between two traces (first trace of each analysis). Sites are paired
// by site_match.h: a site whose lines moved is one row.
struct DiffRow {
  std::string key;              // A's key (B's for a site only in B)
  std::vector<Frame> frames;    // A's frames (B's for a site only in B)
  std::string key_b;            // B's key when the site is in both runs
  std::vector<LineMove> moved;  // frames whose line differs in B (empty: not moved)
  std::int64_t peak_a = 0, peak_b = 0, total_a = 0, total_b = 0;
  std::int64_t count_a = 0, count_b = 0;  // allocations made
  std::int64_t d_peak() const { return peak_b - peak_a; }
  std::int64_t d_count() const { return count_b - count_a; }
  std::int64_t d_total() const { return total_b - total_a; }
  bool changed() const { return d_peak() != 0 || d_total() != 0 || d_count() != 0; }
};
// Rows whose bytes or counts changed, largest change first, then the sites that only moved
// (changed() false), which the text and JSON count but do not list.
std::vector<DiffRow> diff_sites(const Model& a, const Model& b, bool all_frames);
// The same with the callers' resolvers (of a and b), whose symbolized stacks other views
// of the two traces share (diff's categories).
std::vector<DiffRow> diff_sites(const Model& a, const Model& b, StackResolver& ra, StackResolver& rb);
std::string diff_text(const std::vector<DiffRow>& rows, std::size_t top, const Model& a, const Model& b);

}  // namespace gpuheap
