// Builds `module` records for every object loaded in this process, the way the preload's
// recorder does (dl_iterate_phdr: load bias, PT_LOAD range, GNU build-id from PT_NOTE), so
// test_symbolize can symbolize its own stacks.
#pragma once

#include <elf.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "format/trace.h"

namespace symtest {

struct OwnedModule {
  std::string path, build_id;
  std::uint64_t base = 0, lo = 0, hi = 0;
  gpuheap::format::ModuleRecord record() const {
    gpuheap::format::ModuleRecord r;
    r.base = base, r.lo = lo, r.hi = hi, r.path = path, r.build_id = build_id;
    return r;
  }
};

inline std::string note_build_id(const unsigned char* p, std::size_t n) {
  auto align4 = [](std::size_t x) { return (x + 3) & ~std::size_t{3}; };
  std::size_t i = 0;
  while (i + sizeof(ElfW(Nhdr)) <= n) {
    ElfW(Nhdr) h;
    std::memcpy(&h, p + i, sizeof h);
    std::size_t name_at = i + sizeof h, desc_at = name_at + align4(h.n_namesz);
    if (desc_at + h.n_descsz > n) break;
    if (h.n_type == NT_GNU_BUILD_ID && h.n_namesz == 4 && std::memcmp(p + name_at, "GNU", 4) == 0)
      return std::string(reinterpret_cast<const char*>(p + desc_at), h.n_descsz);
    i = desc_at + align4(h.n_descsz);
  }
  return {};
}

inline std::vector<OwnedModule> loaded_modules() {
  std::vector<OwnedModule> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* arg) {
        auto& v = *static_cast<std::vector<OwnedModule>*>(arg);
        OwnedModule m;
        m.path = info->dlpi_name != nullptr ? info->dlpi_name : "";
        if (m.path.empty() && v.empty()) {  // the main program
          char buf[PATH_MAX];
          ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
          if (n > 0) m.path.assign(buf, static_cast<std::size_t>(n));
        }
        m.base = info->dlpi_addr;
        m.lo = UINT64_MAX;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          std::uint64_t start = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD) {
            m.lo = std::min<std::uint64_t>(m.lo, start);
            m.hi = std::max<std::uint64_t>(m.hi, start + ph.p_memsz);
          } else if (ph.p_type == PT_NOTE && m.build_id.empty()) {
            m.build_id = note_build_id(reinterpret_cast<const unsigned char*>(start), ph.p_memsz);
          }
        }
        if (m.lo < m.hi) v.push_back(std::move(m));
        return 0;
      },
      &out);
  return out;
}

inline const OwnedModule* module_named(const std::vector<OwnedModule>& mods, const std::string& suffix) {
  for (const auto& m : mods)
    if (m.path.size() >= suffix.size() && m.path.compare(m.path.size() - suffix.size(), suffix.size(), suffix) == 0)
      return &m;
  return nullptr;
}

inline const OwnedModule* module_containing(const std::vector<OwnedModule>& mods, std::uint64_t addr) {
  for (const auto& m : mods)
    if (addr >= m.lo && addr < m.hi) return &m;
  return nullptr;
}

}  // namespace symtest
