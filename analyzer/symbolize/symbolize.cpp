// Offline symbolization with libdwfl (elfutils). Each module from the trace gets its own
// Dwfl session, opened lazily on the first address that falls into it: modules can overlap
// across a trace's lifetime (dlclose + dlopen at the same address), which a single Dwfl
// address space cannot represent, and most modules of a big process never appear in a
// stack at all.
#include "analyzer/symbolize/symbolize.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>

#include <fmt/compile.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "analyzer/base/safe_file.h"
#include "analyzer/base/text_safe.h"
#include "analyzer/symbolize/debuginfo.h"
#include "analyzer/symbolize/symbolize_dwarf.h"

namespace gpuheap {

std::string_view base_name(std::string_view path) {
  auto slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// gpuheap's own library and the CUDA runtime/driver are implementation detail of every
// allocation: hiding them makes the first visible frame the user's call site.
bool hook_side_module(std::string_view path) {
  auto b = base_name(path);
  return b.starts_with("libgpuheap") || b.starts_with("libcudart") || b.starts_with("libcuda.so");
}

std::string frame_name(const Frame& f) {
  if (!f.function.empty()) return f.function;
  std::string s;
  append_frame_name(s, f);
  return s;
}

void append_frame_name(std::string& out, const Frame& f) {
  if (!f.function.empty()) out += f.function;
  else if (!f.module.empty())
    fmt::format_to(std::back_inserter(out), FMT_COMPILE("{}+{:#x}"), base_name(f.module), f.offset);
  else fmt::format_to(std::back_inserter(out), FMT_COMPILE("{:#x}"), f.ip);
}

namespace symbolize {
namespace {

// A C symbol of the CUDA runtime API (cudaMalloc, cudaMallocAsync, ...): a bare name, no
// namespace, template arguments or parameter list (a C++ wrapper of the user's shows its
// parameters, and cuda_runtime.h's cudaMalloc<T> its template arguments: both stay).
// hidden_frame() also asks for no source line: NVIDIA ships cudart without line tables, so a
// C helper of the program's own named like the API (cudaCheck) stays visible wherever it
// was built with -g.
bool runtime_api_name(std::string_view fn) {
  if (fn.size() < 5 || !fn.starts_with("cuda") || fn[4] < 'A' || fn[4] > 'Z') return false;
  for (char c : fn)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

// Statically linked cudart (the nvcc default, -cudart=static) lives inside the user's
// binary: its functions are in namespace cudart, carry a __cudart prefix, or (CUDA 12/13,
// measured on the GPU machine: `libcudart_static_<40 hex digits>`) a libcudart_static_
// prefix, and its API entry points are the C symbols cudaMalloc etc. Hidden like the shared
// library's frames, so the first visible frame is the program's call site.
bool hidden_frame(const Frame& f) {
  const std::string_view fn = f.function;
  return fn.starts_with("cudart::") || fn.starts_with("__cudart") || fn.starts_with("libcudart_static_") ||
         (f.file.empty() && runtime_api_name(fn));
}

// The C runtime's frames outside main (and a thread's start routine's callers): the same
// in every stack, so they say nothing about the allocation (heaptrack hides them too).
bool startup_function(std::string_view fn) {
  return fn == "_start" || fn == "__libc_start_main" || fn == "__libc_start_call_main" ||
         fn == "__libc_start_main_impl" || fn == "start_thread" || fn == "clone" || fn == "clone3";
}

}  // namespace
}  // namespace symbolize

namespace {
std::vector<MissingModule>& missing_list() {
  static std::vector<MissingModule> list;
  return list;
}
}  // namespace

std::vector<MissingModule> missing_modules() { return missing_list(); }

void report_missing_modules(bool verbose) {
  auto& list = missing_list();
  if (list.empty()) return;
  if (verbose) {
    for (const auto& m : list)
      spdlog::warn("module not usable on this machine: '{}' ({}); its frames show as module+offset", m.path, m.why);
  } else {
    bool one = list.size() == 1;
    spdlog::warn(
        "{} module{} of the trace {} not on this machine: {} frames show as module+offset; --verbose "
        "lists {}",
        list.size(), one ? "" : "s", one ? "is" : "are", one ? "its" : "their", one ? "it" : "them");
  }
  list.clear();
}

struct Symbolizer::Impl {
  struct Module {
    std::string path, build_id;
    std::uint64_t base = 0, lo = 0, hi = 0;
    bool hidden = false;
    bool tried = false;      // open attempted (successfully or not)
    bool use_dwarf = false;  // DWARF is read (not when its dwz file could not be opened safely)
    Dwfl* dwfl = nullptr;
    Dwfl_Module* mod = nullptr;
    symbolize::SymbolIndex syms;
    std::unordered_map<Dwarf_Off, std::unique_ptr<symbolize::CuIndex>> cus;  // by CU DIE offset
    ~Module() {
      cus.clear();
      if (dwfl != nullptr) dwfl_end(dwfl);
    }
  };

  // Non-overlapping address ranges keyed by lo; a newer module evicts what it overlaps.
  std::map<std::uint64_t, std::unique_ptr<Module>> modules;
  // Frames per looked-up address: cache[addr] = {first, count} in `frames`, one array for all
  // (an address's own vector was an allocation per address, and one more to free).
  std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::uint32_t>> cache;
  std::vector<Frame> frames;
  std::set<std::string> warned;  // module paths already warned about
  const StoredSymbols* stored = nullptr;

  Module* find(std::uint64_t addr) {
    auto it = modules.upper_bound(addr);
    if (it == modules.begin()) return nullptr;
    --it;
    return addr < it->second->hi ? it->second.get() : nullptr;
  }

  // Noted for report_missing_modules (once per path over the whole command), not printed.
  void warn_once(const Module& m, const std::string& why) {
    if (!warned.insert(m.path).second) return;
    auto& list = missing_list();
    for (const auto& x : list)
      if (x.path == m.path) return;
    list.push_back({m.path, why});
  }

  void open(Module& m);
  void lookup(std::uint64_t addr, std::uint64_t ip, std::vector<Frame>& out);  // appends addr's frames
  void dwarf_frames(Module& m, std::uint64_t addr, const Frame& proto, std::vector<Frame>& out);
};

// Opens the module's file for reading symbols and DWARF. The path comes from the trace and
// is untrusted: it must be absolute and name a regular file (not a FIFO that would block,
// not a device whose open has side effects); it is only ever opened O_RDONLY and parsed
// by libelf/libdw, never mapped executable or dlopen'ed.
void Symbolizer::Impl::open(Module& m) {
  m.tried = true;
  const std::string& p = m.path;
  bool sane = !p.empty() && p[0] == '/' && p.find('\0') == std::string::npos && p.find('\n') == std::string::npos;
  if (!sane) {  // e.g. "linux-vdso.so.1", which has no file
    spdlog::debug("symbolize: '{}' is not an absolute path; its frames are shown as module+offset", p);
    return;
  }
  std::uint64_t size = 0;
  std::string why;
  int fd = open_regular(p, &size, &why, symbolize::kMinElfBytes, symbolize::kMaxElfBytes);
  if (fd < 0) {
    warn_once(m, why);
    return;
  }
  Dwfl* dwfl = dwfl_begin(&symbolize::kGuardedCallbacks);
  if (dwfl == nullptr) {
    ::close(fd);
    return;
  }
  dwfl_report_begin(dwfl);
  // base is the load bias (l_addr): for ET_DYN, add_p_vaddr=true places the file at
  // base + p_vaddr, i.e. bias = base, which is also right for prelinked objects whose
  // first PT_LOAD has a non-zero p_vaddr. ET_EXEC ignores base (absolute addresses).
  Dwfl_Module* mod = dwfl_report_elf(dwfl, p.c_str(), p.c_str(), fd, m.base, true);
  if (mod == nullptr) {
    ::close(fd);  // only consumed on success
    warn_once(m, fmt::format("not a usable ELF file: {}", dwfl_errmsg(-1)));
    dwfl_end(dwfl);
    return;
  }
  dwfl_report_end(dwfl, nullptr, nullptr);
  if (!m.build_id.empty()) {
    const unsigned char* bits = nullptr;
    GElf_Addr vaddr = 0;
    int n = dwfl_module_build_id(mod, &bits, &vaddr);
    if (n <= 0 || static_cast<std::size_t>(n) != m.build_id.size() ||
        std::memcmp(bits, m.build_id.data(), m.build_id.size()) != 0) {
      // Symbols of a different build would name the wrong functions: worse than none.
      warn_once(m, "the file here is not the build the trace recorded: build-id differs");
      dwfl_end(dwfl);
      return;
    }
  }
  m.dwfl = dwfl;
  m.mod = mod;
  // Every file libdwfl looks for (separate debug info, the dwz alternate file) is looked
  // for now, through the guarded callbacks (debuginfo.h). Should the DWARF name a dwz file
  // that was not found that way, libdw would search for it itself on first use, with a
  // plain open(2) of names the file chooses: the module's DWARF is then left unread.
  symbolize::DebugLookup look;
  symbolize::DebugLookupScope scope(&look);
  m.syms.build(mod);
  Dwarf_Addr bias = 0;
  Dwarf* dw = dwfl_module_getdwarf(mod, &bias);
  m.use_dwarf = dw != nullptr && (!symbolize::needs_alt(dw) || look.alt_found);
  if (dw != nullptr && !m.use_dwarf)
    spdlog::debug(
        "symbolize: the debug info of '{}' needs a dwz file that was not found; its frames are named "
        "from the symbol table only",
        p);
}

// Appends the DWARF frames for addr: every inline instance containing it (innermost first),
// then the concrete function. The position inside a frame is the line table's for the
// innermost one and the DW_AT_call_file/call_line of the next-inner inline instance for
// every outer one. Appends nothing without debug info for addr.
void Symbolizer::Impl::dwarf_frames(Module& m, std::uint64_t addr, const Frame& proto, std::vector<Frame>& out) {
  Dwarf_Addr bias = 0;
  Dwarf_Die* cudie = dwfl_module_addrdie(m.mod, addr, &bias);
  if (cudie == nullptr) return;
  Dwarf_Addr pc = addr - bias;
  auto& idx = m.cus[dwarf_dieoffset(cudie)];
  if (!idx) {
    idx = std::make_unique<symbolize::CuIndex>();
    idx->build(cudie);
  }
  std::vector<Dwarf_Die> chain;  // function scopes, innermost first, ending in the concrete one
  if (const Dwarf_Die* fn = idx->find(pc)) {
    chain = symbolize::inline_chain(*fn, pc);
    chain.push_back(*fn);
  } else if (idx->fns.empty()) {
    // A unit whose functions the walk cannot see (e.g. a split-DWARF skeleton): ask libdw,
    // which walks the unit for this address; dwarf_getscopes_die gives the concrete chain.
    Dwarf_Die* scopes = nullptr;
    int n = dwarf_getscopes(cudie, pc, &scopes);
    for (int i = 0; i < n; ++i) {
      if (!symbolize::is_function_scope(&scopes[i])) continue;
      Dwarf_Die* concrete = nullptr;
      int k = dwarf_getscopes_die(&scopes[i], &concrete);
      for (int j = 0; j < k; ++j) {
        if (!symbolize::is_function_scope(&concrete[j])) continue;
        chain.push_back(concrete[j]);
        if (dwarf_tag(&concrete[j]) == DW_TAG_subprogram) break;
      }
      std::free(concrete);
      break;
    }
    std::free(scopes);
  }

  std::string file;
  int line = 0;
  if (Dwfl_Line* l = dwfl_module_getsrc(m.mod, addr)) {
    int col = 0;
    Dwarf_Addr a = 0;
    if (const char* f = dwfl_lineinfo(l, &a, &line, &col, nullptr, nullptr)) file = f;
  }
  for (auto& die : chain) {
    Frame f = proto;
    f.function = symbolize::die_function_name(&die, idx.get());
    f.file = file;
    f.line = line;
    f.inlined = dwarf_tag(&die) == DW_TAG_inlined_subroutine;
    out.push_back(std::move(f));
    if (!out.back().inlined) break;
    // The caller's position: where this instance was inlined. call_file indexes the line
    // table of the unit holding the DIE (an imported partial unit in dwz-compressed debug
    // info may differ from cudie).
    file.clear();
    line = 0;
    Dwarf_Attribute attr;
    Dwarf_Word w = 0;
    Dwarf_Die unit;
    Dwarf_Files* files = nullptr;
    std::size_t nfiles = 0;
    if (dwarf_formudata(dwarf_attr(&die, DW_AT_call_file, &attr), &w) == 0 &&
        dwarf_diecu(&die, &unit, nullptr, nullptr) != nullptr && dwarf_getsrcfiles(&unit, &files, &nfiles) == 0 &&
        w < nfiles)
      if (const char* cf = dwarf_filesrc(files, w, nullptr, nullptr)) file = cf;
    if (dwarf_formudata(dwarf_attr(&die, DW_AT_call_line, &attr), &w) == 0) line = static_cast<int>(w);
  }
  // No function DIE (e.g. assembly with only a line table): the location alone.
  if (chain.empty() && !file.empty()) {
    Frame f = proto;
    f.file = file;
    f.line = line;
    out.push_back(std::move(f));
  }
}

void Symbolizer::Impl::lookup(std::uint64_t addr, std::uint64_t ip, std::vector<Frame>& out) {
  Frame proto;
  proto.ip = addr;
  Module* m = find(addr);
  if (m != nullptr) {
    proto.module = m->path;
    proto.offset = addr - m->base;
    proto.hidden = m->hidden;
  }
  if (stored != nullptr && ip != 0) {
    auto it = stored->frames.find(ip);
    if (it != stored->frames.end() && !it->second.empty()) {
      for (const auto& s : it->second) {
        Frame f = proto;
        f.function = stored->str(s.function);
        f.file = stored->str(s.file);
        f.line = static_cast<int>(std::min<std::uint32_t>(s.line, INT32_MAX));
        f.inlined = s.inlined;
        f.hidden = proto.hidden || symbolize::hidden_frame(f);
        out.push_back(std::move(f));
      }
      return;
    }
  }
  if (m != nullptr && !m->tried) open(*m);
  if (m == nullptr || m->mod == nullptr) {
    out.push_back(proto);
    return;
  }

  const std::size_t first = out.size();
  if (m->use_dwarf) dwarf_frames(*m, addr, proto, out);
  if (out.size() == first) out.push_back(proto);
  // The concrete function's name: the symbol table's (qualified, with parameter types,
  // also read from separate debug info) is preferred over DWARF's, unless it is only the
  // nearest sizeless symbol.
  bool exact = false;
  const char* name = m->syms.find(addr, &exact);
  if (name != nullptr && (exact || out.back().function.empty())) out.back().function = symbolize::demangle(name);
  for (std::size_t i = first; i < out.size(); ++i) out[i].hidden = m->hidden || symbolize::hidden_frame(out[i]);
}

Symbolizer::Symbolizer() : impl_(std::make_unique<Impl>()) {}
Symbolizer::~Symbolizer() = default;

void Symbolizer::add_module(const format::ModuleRecord& r) {
  if (r.hi <= r.lo) {
    spdlog::debug("symbolize: ignoring module '{}' with empty range", r.path);
    return;
  }
  auto& mods = impl_->modules;
  // Evict every module overlapping [lo, hi): ranges are disjoint and sorted, so the
  // overlapping ones are contiguous just below lower_bound(hi).
  auto it = mods.lower_bound(r.hi);
  while (it != mods.begin()) {
    auto prev = std::prev(it);
    if (prev->second->hi <= r.lo) break;
    mods.erase(prev);
  }
  auto m = std::make_unique<Impl::Module>();
  m->path = std::string(r.path);
  m->build_id = std::string(r.build_id);
  m->base = r.base, m->lo = r.lo, m->hi = r.hi;
  m->hidden = hook_side_module(m->path);
  mods.emplace(r.lo, std::move(m));
  impl_->cache.clear();  // cached frames may name an evicted module
  impl_->frames.clear();
}

void Symbolizer::use_stored(const StoredSymbols* s) {
  impl_->stored = s;
  impl_->cache.clear();
  impl_->frames.clear();
}

std::vector<Frame> Symbolizer::symbolize(const std::vector<std::uint64_t>& ips, bool all_frames) {
  Impl& im = *impl_;
  // Each ip's frames: looked up once per Symbolizer, then a range of im.frames.
  std::vector<std::pair<std::uint32_t, std::uint32_t>> ranges;
  ranges.reserve(ips.size());
  std::size_t total = 0;
  for (const std::uint64_t ip : ips) {
    // A return address points after the call; its last byte before it is inside the call
    // instruction, so file:line (and the inline chain) name the call site. This holds for
    // the innermost ip too: the recorder captures from inside gpuheap's hooks and skips
    // their frames, so it never records an interrupted instruction.
    const std::uint64_t addr = ip == 0 ? 0 : ip - 1;
    auto [it, fresh] = im.cache.try_emplace(addr);
    if (fresh) {
      const std::size_t first = im.frames.size();
      im.lookup(addr, ip, im.frames);
      it->second = {static_cast<std::uint32_t>(first), static_cast<std::uint32_t>(im.frames.size() - first)};
    }
    ranges.push_back(it->second);
    total += it->second.second;
  }
  std::vector<Frame> out;
  if (!all_frames) {
    out.reserve(total);
    bool at_main = false;
    for (const auto& [first, n] : ranges) {
      for (std::uint32_t k = first; k < first + n && !at_main; ++k) {
        const Frame& f = im.frames[k];
        if (f.hidden || symbolize::startup_function(f.function)) continue;
        out.push_back(f);
        // The stack stops at main: what called it is the C runtime's startup.
        at_main = f.function == "main" && !f.inlined;
      }
      if (at_main) break;
    }
    if (!out.empty()) return out;  // else: every frame, hidden ones included
  }
  out.reserve(total);
  for (const auto& [first, n] : ranges) out.insert(out.end(), im.frames.begin() + first, im.frames.begin() + first + n);
  return out;
}

std::string Symbolizer::format_frame(const Frame& f) {
  // Names come from the trace and from DWARF on this machine: both escaped (text_safe.h).
  std::string fn = f.function.empty() ? fmt::format("{:#x}", f.ip) : text_safe(f.function);
  if (f.inlined) fn = "[inlined] " + fn;
  if (!f.file.empty()) {
    auto file = text_safe(f.file);
    return f.line > 0 ? fmt::format("{} ({}:{})", fn, file, f.line) : fmt::format("{} ({})", fn, file);
  }
  if (!f.module.empty()) return fmt::format("{} ({}+{:#x})", fn, text_safe(f.module), f.offset);
  if (!f.function.empty()) return fmt::format("{} ({:#x})", fn, f.ip);
  return fn;
}

}  // namespace gpuheap
