#include "analyzer/symbolize/debuginfo.h"

#include <dlfcn.h>
#include <elfutils/libdwelf.h>
#include <gelf.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "analyzer/base/safe_file.h"

namespace gpuheap {

namespace {

bool g_debuginfod = false;
thread_local symbolize::DebugLookup* t_lookup = nullptr;
thread_local int t_depth = 0;  // find_debuginfo re-entered through dwfl_module_getdwarf

struct Reenter {
  Reenter() { ++t_depth; }
  ~Reenter() { --t_depth; }
};

std::string hex(const unsigned char* p, std::size_t n) {
  std::string o;
  for (std::size_t i = 0; i < n; ++i) o += fmt::format("{:02x}", p[i]);
  return o;
}

std::string build_id_path(const unsigned char* id, std::size_t n) {
  return fmt::format("/usr/lib/debug/.build-id/{}/{}.debug", hex(id, 1), hex(id + 1, n - 1));
}

std::string dir_of(const char* file) {
  const char* slash = file != nullptr ? std::strrchr(file, '/') : nullptr;
  return slash == nullptr ? std::string() : std::string(file, slash);
}

std::string base_of(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash == nullptr ? file : slash + 1;
}

// Whether the ELF file open at fd has this build-id (and, when need_dwarf, DWARF libdw can
// read: a dwz file libdwfl would then fail to begin would leave the alt unset).
bool matches_build_id(int fd, const unsigned char* id, std::size_t n, bool need_dwarf) {
  elf_version(EV_CURRENT);
  Elf* e = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (e == nullptr) return false;
  const void* got = nullptr;
  ssize_t len = dwelf_elf_gnu_build_id(e, &got);
  bool ok = len > 0 && static_cast<std::size_t>(len) == n && std::memcmp(got, id, n) == 0;
  if (ok && need_dwarf) {
    Dwarf* d = dwarf_begin_elf(e, DWARF_C_READ, nullptr);
    ok = d != nullptr;
    dwarf_end(d);
  }
  elf_end(e);
  return ok;
}

bool matches_crc(int fd, std::uint64_t size, GElf_Word want) {
  std::vector<unsigned char> buf(1 << 20);
  uLong crc = crc32(0L, Z_NULL, 0);
  for (std::uint64_t off = 0; off < size;) {
    ssize_t n = ::pread(fd, buf.data(), buf.size(), static_cast<off_t>(off));
    if (n <= 0) return false;
    crc = crc32(crc, buf.data(), static_cast<uInt>(n));
    off += static_cast<std::uint64_t>(n);
  }
  return static_cast<GElf_Word>(crc) == want;
}

// libdebuginfod, loaded only when the user opted in (as libdwfl itself does: dlopen, so
// that gpuheap runs where it is not installed).
struct Debuginfod {
  using Begin = void* (*)();
  using Find = int (*)(void*, const unsigned char*, int, char**);
  using End = void (*)(void*);
  Begin begin = nullptr;
  Find find = nullptr;
  End end = nullptr;
  static Debuginfod& get() {
    static Debuginfod d = [] {
      Debuginfod x;
      void* h = ::dlopen("libdebuginfod.so.1", RTLD_LAZY | RTLD_LOCAL);
      if (h == nullptr) {
        spdlog::warn("--debuginfod: libdebuginfod.so.1 is not installed; no server is asked");
        return x;
      }
      x.begin = reinterpret_cast<Begin>(::dlsym(h, "debuginfod_begin"));
      x.find = reinterpret_cast<Find>(::dlsym(h, "debuginfod_find_debuginfo"));
      x.end = reinterpret_cast<End>(::dlsym(h, "debuginfod_end"));
      if (!x.begin || !x.find || !x.end) x.find = nullptr;
      return x;
    }();
    return d;
  }
};

int from_debuginfod(const unsigned char* id, std::size_t n, char** out_name) {
  if (!g_debuginfod || n == 0) return -1;
  auto& d = Debuginfod::get();
  if (d.find == nullptr) return -1;
  void* c = d.begin();
  if (c == nullptr) return -1;
  char* path = nullptr;
  int fd = d.find(c, id, static_cast<int>(n), &path);
  d.end(c);
  if (fd < 0) {
    std::free(path);
    return -1;
  }
  // A file in the client's cache, but what a server sent: the same checks as a local one.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::uint64_t>(st.st_size) > symbolize::kMaxElfBytes || !matches_build_id(fd, id, n, false)) {
    ::close(fd);
    std::free(path);
    return -1;
  }
  *out_name = path;
  return fd;
}

// Opens path through the guard and keeps it when `valid` accepts it.
template <class Valid>
int try_candidate(const std::string& path, char** out_name, Valid valid) {
  std::uint64_t size = 0;
  std::string why;
  int fd = open_regular(path, &size, &why, symbolize::kMinElfBytes, symbolize::kMaxElfBytes);
  if (fd < 0) {
    if (why != std::strerror(ENOENT) && why != std::strerror(ENOTDIR))
      spdlog::debug("symbolize: debug file candidate '{}' skipped: {}", path, why);
    return -1;
  }
  if (!valid(fd, size)) {
    ::close(fd);
    return -1;
  }
  *out_name = ::strdup(path.c_str());
  return fd;
}

int find_alt(Dwarf* dw, const char* file_name, char** out_name) {
  const char* altname = nullptr;
  const void* idp = nullptr;
  ssize_t n = dwelf_dwarf_gnu_debugaltlink(dw, &altname, &idp);
  if (n <= 0 || altname == nullptr) return -1;
  const auto* id = static_cast<const unsigned char*>(idp);
  auto un = static_cast<std::size_t>(n);
  std::vector<std::string> cands{build_id_path(id, un)};
  std::string dir = dir_of(file_name);
  if (altname[0] == '/') cands.emplace_back(altname);
  else if (!dir.empty()) cands.push_back(dir + "/" + altname);
  if (!dir.empty()) cands.push_back(dir + "/.dwz/" + base_of(altname));
  cands.push_back("/usr/lib/debug/.dwz/" + base_of(altname));
  for (const auto& c : cands) {
    int fd = try_candidate(c, out_name, [&](int f, std::uint64_t) { return matches_build_id(f, id, un, true); });
    if (fd >= 0) return fd;
  }
  return from_debuginfod(id, un, out_name);
}

int find_debuginfo(Dwfl_Module* mod, void** /*userdata*/, const char* /*modname*/, Dwarf_Addr /*base*/,
                   const char* file_name, const char* debuglink, GElf_Word crc, char** out_name) {
  // *out_name must stay null on failure: libdwfl opens a name left there itself.
  if (t_depth > 0) return -1;
  Reenter reenter;
  if (debuglink != nullptr && crc == 0) {
    // libdwfl asks for the dwz alternate file with crc 0 once the module's Dwarf is open.
    Dwarf_Addr bias = 0;
    Dwarf* dw = dwfl_module_getdwarf(mod, &bias);
    const char* altname = nullptr;
    const void* id = nullptr;
    if (dw != nullptr && dwelf_dwarf_gnu_debugaltlink(dw, &altname, &id) > 0 && altname != nullptr &&
        std::strcmp(altname, debuglink) == 0) {
      int fd = find_alt(dw, file_name, out_name);
      if (fd >= 0 && t_lookup != nullptr) t_lookup->alt_found = true;
      return fd;
    }
  }
  const unsigned char* id = nullptr;
  GElf_Addr vaddr = 0;
  int n = dwfl_module_build_id(mod, &id, &vaddr);
  auto un = n > 0 ? static_cast<std::size_t>(n) : 0;
  std::vector<std::string> cands;
  if (un > 1) cands.push_back(build_id_path(id, un));
  std::string dir = dir_of(file_name);
  if (debuglink != nullptr && !dir.empty() && dir[0] == '/') {
    cands.push_back(dir + "/" + debuglink);
    cands.push_back(dir + "/.debug/" + debuglink);
    cands.push_back("/usr/lib/debug" + dir + "/" + debuglink);
  }
  for (const auto& c : cands) {
    int fd = try_candidate(c, out_name, [&](int f, std::uint64_t size) {
      if (un > 0) return matches_build_id(f, id, un, false);
      return crc == 0 || matches_crc(f, size, crc);
    });
    if (fd >= 0) return fd;
  }
  return from_debuginfod(id, un, out_name);
}

// The main file always comes with its descriptor (dwfl_report_elf); should libdwfl still
// ask, it gets the named file through the guard, never by a plain open of that name.
int find_elf(Dwfl_Module* /*mod*/, void** /*userdata*/, const char* /*modname*/, Dwarf_Addr /*base*/, char** file_name,
             Elf** /*elfp*/) {
  if (file_name == nullptr || *file_name == nullptr) return -1;
  std::uint64_t size = 0;
  std::string why;
  int fd = open_regular(*file_name, &size, &why, symbolize::kMinElfBytes, symbolize::kMaxElfBytes);
  if (fd < 0) {
    std::free(*file_name);
    *file_name = nullptr;
  }
  return fd;
}

char* g_no_path = nullptr;

}  // namespace

void configure_debuginfod(bool enabled, double timeout_s) {
  g_debuginfod = enabled;
  if (!enabled) {
    ::unsetenv("DEBUGINFOD_URLS");
    return;
  }
  auto t = fmt::format("{}", static_cast<long>(timeout_s < 1 ? 1 : timeout_s));
  ::setenv("DEBUGINFOD_TIMEOUT", t.c_str(), 1);
  ::setenv("DEBUGINFOD_MAXTIME", t.c_str(), 1);
}

namespace symbolize {

const Dwfl_Callbacks kGuardedCallbacks = {
    .find_elf = find_elf,
    .find_debuginfo = find_debuginfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = &g_no_path,
};

DebugLookupScope::DebugLookupScope(DebugLookup* l) : prev_(t_lookup) { t_lookup = l; }
DebugLookupScope::~DebugLookupScope() { t_lookup = prev_; }

bool needs_alt(Dwarf* dw) {
  const char* altname = nullptr;
  const void* id = nullptr;
  return dw != nullptr && dwelf_dwarf_gnu_debugaltlink(dw, &altname, &id) > 0;
}

}  // namespace symbolize
}  // namespace gpuheap
