#include "analyzer/symbolize/symbolize_trace.h"

#include <algorithm>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "analyzer/base/error.h"
#include "analyzer/symbolize/symbolize.h"
#include "analyzer/trace/reader.h"
#include "analyzer/trace/trace_files.h"

namespace gpuheap {

namespace {

// The symbol records of one run: strings interned (those of an earlier run reused), frames
// per ip, encoded in the order they must appear (strings before the frames naming them).
struct SymbolTable {
  std::unordered_map<std::string, std::uint32_t> ids;
  std::uint32_t next_id = 1;
  std::vector<std::pair<std::uint32_t, std::string>> new_strings;
  std::vector<std::pair<std::uint64_t, std::vector<format::SymbolFrameEntry>>> frames;

  void seed(const StoredSymbols& s) {
    for (const auto& [id, text] : s.strings) {
      ids.emplace(text, id);
      next_id = std::max(next_id, id + 1);
    }
  }
  std::uint32_t intern(std::string_view text) {
    if (text.empty()) return 0;
    std::string t(text.substr(0, format::kMaxSymbolString));
    auto it = ids.find(t);
    if (it != ids.end()) return it->second;
    std::uint32_t id = next_id++;
    ids.emplace(t, id);
    new_strings.emplace_back(id, std::move(t));
    return id;
  }
  // Records appended, or 0 when nothing was resolved.
  std::uint64_t add(std::uint64_t ip, const std::vector<Frame>& fr) {
    bool named = std::any_of(fr.begin(), fr.end(),
                             [](const Frame& f) { return !f.function.empty() || !f.file.empty(); });
    if (!named) return 0;
    // An inline chain longer than a record holds keeps its innermost frames and the concrete
    // function (the last one).
    std::vector<const Frame*> keep;
    for (std::size_t i = 0; i < fr.size(); ++i)
      if (keep.size() + 1 < format::kMaxSymbolFrames || i + 1 == fr.size()) keep.push_back(&fr[i]);
    std::vector<format::SymbolFrameEntry> e;
    for (const Frame* f : keep) {
      format::SymbolFrameEntry x;
      x.function = intern(f->function);
      x.file = intern(f->file);
      x.line = f->line > 0 ? static_cast<std::uint32_t>(f->line) : 0;
      x.flags = f->inlined ? format::kSymbolInlined : 0;
      e.push_back(x);
    }
    frames.emplace_back(ip, std::move(e));
    return 1;
  }
};

void write_frame(TraceOutput& out, const unsigned char* p, std::size_t n) { out.write(p, n); }

}  // namespace

SymbolizeTraceResult symbolize_trace(const std::string& path, const SymbolizeTraceOptions& opt) {
  SymbolizeTraceResult res;
  // Pass 1: modules, the ips of every stack, frames stored by an earlier run.
  std::vector<format::ModuleRecord> mods;
  std::set<std::uint64_t> ips;
  StoredSymbols stored;
  bool compressed = false;
  {
    TraceReader rd(path);
    compressed = rd.compressed();
    format::Record r;
    std::vector<std::pair<std::string, std::string>> owned;
    while (rd.next(r)) {
      using T = format::RecordType;
      if (r.type == T::module) {
        owned.emplace_back(std::string(r.module.path), std::string(r.module.build_id));
        format::ModuleRecord m = r.module;
        mods.push_back(m);
      } else if (r.type == T::stack) {
        for (std::size_t i = 0; i < r.stack.depth; ++i) {
          std::uint64_t e = r.stack.ip(i);
          if (e != 0 && !format::is_py_frame(e)) ips.insert(e);
        }
      } else if (r.type == T::symbol_string) {
        stored.add(r.symbol_string);
      } else if (r.type == T::symbol_frames) {
        stored.add(r.symbol_frames);
      }
    }
    if (rd.truncated() && !opt.allow_truncated)
      throw InputError(fmt::format("{}: {}: not symbolized (--allow-truncated stores the frames of what it holds)",
                                   path,
                                   rd.cut_mid_record() ? "the file is cut mid-record"
                                                       : "no end record (the process died or is still running)"));
    // Views into `owned`, which no longer reallocates.
    for (std::size_t i = 0; i < mods.size(); ++i) mods[i].path = owned[i].first, mods[i].build_id = owned[i].second;
    Symbolizer sym;
    for (const auto& m : mods) sym.add_module(m);
    SymbolTable table;
    table.seed(stored);
    res.ips = ips.size();
    for (std::uint64_t ip : ips) {
      if (stored.frames.count(ip) != 0) {
        ++res.already;
        continue;
      }
      if (table.add(ip, sym.symbolize({ip}, true)) != 0) ++res.added;
      else ++res.unresolved;
    }
    res.strings = table.new_strings.size();
    if (res.added == 0) return res;  // idempotent: nothing new, the file is left alone

    // Pass 2: every record copied as it is, the new symbol records before the end record
    // (after the last whole record when there is none), the end record's count updated.
    TraceReader in(path);
    TraceOutput out(path, compressed, path);
    unsigned char head[format::kFileHeaderSize];
    format::encode_file_header(head);  // the current version: every older record reads the same in it
    out.write(head, sizeof head);
    std::vector<unsigned char> buf(format::symbol_frames_record_size(format::kMaxSymbolFrames) +
                                   format::kMaxSymbolString + 64);
    std::uint64_t added_records = 0;
    auto emit_symbols = [&] {
      for (const auto& [id, text] : table.new_strings) {
        format::SymbolStringRecord s{id, text};
        write_frame(out, buf.data(), format::encode(buf.data(), buf.size(), s));
        ++added_records;
      }
      for (const auto& [ip, e] : table.frames) {
        write_frame(out, buf.data(),
                    format::encode_symbol_frames(buf.data(), buf.size(), ip, e.data(),
                                                 static_cast<std::uint16_t>(e.size())));
        ++added_records;
      }
    };
    bool ended = false;
    while (in.next(r)) {
      if (r.type == format::RecordType::end) {
        emit_symbols();
        format::EndRecord e = r.end;
        e.records += added_records;
        write_frame(out, buf.data(), format::encode(buf.data(), buf.size(), e));
        ended = true;
        break;
      }
      write_frame(out, in.last_frame(), in.last_frame_size());
    }
    if (!ended) emit_symbols();
    out.commit();
    res.rewritten = true;
  }
  return res;
}

}  // namespace gpuheap
