// DWARF and symbol-table lookups of the symbolizer (symbolize.cpp): sorted ELF symbols, a
// per-unit index of functions and scope prefixes, names of function DIEs and the chain of
// inline instances at an address. Built on libdw; nothing here opens a file.
#pragma once

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace gpuheap::symbolize {

// A C++ symbol demangled (Itanium names only), without an ELF version suffix.
std::string demangle(const char* name);
bool is_function_scope(Dwarf_Die* die);

// Symbols of one module's ELF symbol table, sorted for binary search. libdwfl's own
// dwfl_module_addrinfo scans every symbol on each call, which is far too slow for the
// hundred thousand distinct addresses of a long trace.
class SymbolIndex {
 public:
  void build(Dwfl_Module* mod) {
    int n = dwfl_module_getsymtab(mod);
    for (int i = 1; i < n; ++i) {
      GElf_Sym sym;
      GElf_Addr addr = 0;
      GElf_Word shndx = 0;
      const char* name = dwfl_module_getsym_info(mod, i, &sym, &addr, &shndx, nullptr, nullptr);
      int type = GELF_ST_TYPE(sym.st_info);
      if (name == nullptr || *name == '\0' || shndx == SHN_UNDEF || (type != STT_FUNC && type != STT_GNU_IFUNC))
        continue;
      int bind = GELF_ST_BIND(sym.st_info);
      int rank = bind == STB_GLOBAL ? 0 : bind == STB_WEAK ? 1 : 2;
      syms_.push_back({addr, sym.st_size, name, rank});
    }
    // Aliases at one address: keep the global, then weak, then local name.
    std::sort(syms_.begin(), syms_.end(),
              [](const Sym& a, const Sym& b) { return a.addr != b.addr ? a.addr < b.addr : a.rank < b.rank; });
    syms_.erase(std::unique(syms_.begin(), syms_.end(), [](const Sym& a, const Sym& b) { return a.addr == b.addr; }),
                syms_.end());
  }

  // *exact: the symbol's size covers pc (not just the nearest sizeless one before it).
  const char* find(std::uint64_t pc, bool* exact) const {
    *exact = false;
    auto it = std::upper_bound(syms_.begin(), syms_.end(), pc,
                               [](std::uint64_t v, const Sym& s) { return v < s.addr; });
    if (it == syms_.begin()) return nullptr;
    --it;
    if (it->size == 0) return it->name;  // assembly without .size: nearest preceding
    // A sized symbol not covering pc may sit inside a bigger one (nested labels).
    for (int back = 0; back < 8; ++back, --it) {
      if (pc < it->addr + it->size) {
        *exact = true;
        return it->name;
      }
      if (it == syms_.begin()) break;
    }
    return nullptr;
  }

 private:
  struct Sym {
    std::uint64_t addr, size;
    const char* name;  // in the ELF string table, alive as long as the Dwfl
    int rank;
  };
  std::vector<Sym> syms_;
};

// Per compilation unit: the concrete functions with their address ranges, and the
// namespace/class prefix of every subprogram DIE. Built in one walk of the unit on its first
// use; dwarf_getscopes would walk the unit again for every address.
struct CuIndex {
  struct Fn {
    Dwarf_Addr lo, hi;
    Dwarf_Die die;
  };
  std::vector<Fn> fns;  // sorted by lo
  std::unordered_map<Dwarf_Off, std::string> prefix;

  void build(Dwarf_Die* cudie) {
    std::string scope;
    walk(cudie, scope, 0);
    std::sort(fns.begin(), fns.end(), [](const Fn& a, const Fn& b) { return a.lo < b.lo; });
  }

  const Dwarf_Die* find(Dwarf_Addr pc) const {
    auto it = std::upper_bound(fns.begin(), fns.end(), pc, [](Dwarf_Addr v, const Fn& f) { return v < f.lo; });
    if (it == fns.begin()) return nullptr;
    --it;
    return pc < it->hi ? &it->die : nullptr;
  }

 private:
  // Visits every DIE once (functions nested in functions, e.g. members of local classes,
  // included) and follows DW_TAG_imported_unit into partial units (dwz-compressed debug
  // info), so that an address inside any function is found without a fallback scan.
  void walk(Dwarf_Die* parent, std::string& scope, int depth) {
    Dwarf_Die child;
    if (depth > 64 || dwarf_child(parent, &child) != 0) return;
    do {
      int tag = dwarf_tag(&child);
      if (tag == DW_TAG_subprogram) {
        if (!scope.empty()) prefix.emplace(dwarf_dieoffset(&child), scope);
        Dwarf_Addr base = 0, lo = 0, hi = 0;
        ptrdiff_t off = 0;
        while ((off = dwarf_ranges(&child, off, &base, &lo, &hi)) > 0)
          if (lo < hi) fns.push_back({lo, hi, child});
        if (dwarf_haschildren(&child) > 0) walk(&child, scope, depth + 1);
      } else if (tag == DW_TAG_namespace || tag == DW_TAG_class_type || tag == DW_TAG_structure_type ||
                 tag == DW_TAG_union_type) {
        const char* name = dwarf_diename(&child);
        auto saved = scope.size();
        scope += name != nullptr ? name : tag == DW_TAG_namespace ? "(anonymous namespace)" : "{anonymous}";
        scope += "::";
        walk(&child, scope, depth + 1);
        scope.resize(saved);
      } else if (tag == DW_TAG_imported_unit) {
        Dwarf_Attribute attr;
        Dwarf_Die unit;
        if (dwarf_formref_die(dwarf_attr(&child, DW_AT_import, &attr), &unit) != nullptr &&
            imported.insert(dwarf_dieoffset(&unit)).second)
          walk(&unit, scope, depth + 1);
      } else if (dwarf_haschildren(&child) > 0) {
        walk(&child, scope, depth + 1);  // lexical blocks, inline instances, ...
      }
    } while (dwarf_siblingof(&child, &child) == 0);
  }
  std::set<Dwarf_Off> imported;
};

// Name of a subprogram / inlined_subroutine DIE (see symbolize_dwarf.cpp).
std::string die_function_name(Dwarf_Die* die, const CuIndex* idx);
// Chain of inlined_subroutine DIEs containing pc inside a concrete function, innermost first.
std::vector<Dwarf_Die> inline_chain(Dwarf_Die fn, Dwarf_Addr pc);

}  // namespace gpuheap::symbolize
