#include "analyzer/symbolize/symbolize_dwarf.h"

#include <cxxabi.h>

#include <cstdlib>
#include <cstring>

namespace gpuheap::symbolize {

std::string demangle(const char* name) {
  if (name == nullptr) return {};
  // Versioned symbol-table names ("memcpy@@GLIBC_2.14"): the version is noise in a report.
  if (const char* at = std::strchr(name, '@'); at != nullptr && at != name)
    return demangle(std::string(name, at).c_str());
  // Only Itanium-mangled names: __cxa_demangle would otherwise "demangle" plain C names
  // that happen to look like type encodings (e.g. "f" -> "float").
  if (name[0] == '_' && name[1] == 'Z') {
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (status == 0 && d != nullptr) {
      std::string out(d);
      std::free(d);
      return out;
    }
    std::free(d);
  }
  return name;
}

bool is_function_scope(Dwarf_Die* die) {
  int tag = dwarf_tag(die);
  return tag == DW_TAG_subprogram || tag == DW_TAG_inlined_subroutine;
}

// Name of a subprogram / inlined_subroutine DIE. dwarf_attr_integrate follows
// DW_AT_abstract_origin and DW_AT_specification, so an inlined instance or an out-of-line
// member definition yields its declaration's name. The demangled linkage name is
// qualified and carries parameter types, like ELF symbol names; without one (e.g. members
// of classes in anonymous namespaces) the scope prefix comes from the unit's index.
std::string die_function_name(Dwarf_Die* die, const CuIndex* idx) {
  Dwarf_Attribute attr;
  const char* linkage = nullptr;
  if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) != nullptr ||
      dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr) != nullptr)
    linkage = dwarf_formstring(&attr);
  if (linkage != nullptr) return demangle(linkage);
  const char* name = dwarf_diename(die);
  if (name == nullptr) return {};
  // Find the scope prefix of the DIE at the end of the origin/specification chain.
  Dwarf_Die cur = *die, next;
  for (int hops = 0; idx != nullptr && hops < 8; ++hops) {
    auto it = idx->prefix.find(dwarf_dieoffset(&cur));
    if (it != idx->prefix.end()) return it->second + name;
    if (dwarf_attr(&cur, DW_AT_abstract_origin, &attr) == nullptr &&
        dwarf_attr(&cur, DW_AT_specification, &attr) == nullptr)
      break;
    if (dwarf_formref_die(&attr, &next) == nullptr) break;
    cur = next;
  }
  return name;
}

// Chain of inlined_subroutine DIEs containing pc inside a concrete function, innermost
// first: descends through lexical blocks and inline instances whose ranges hold pc.
std::vector<Dwarf_Die> inline_chain(Dwarf_Die fn, Dwarf_Addr pc) {
  std::vector<Dwarf_Die> chain;
  Dwarf_Die scope = fn, child;
  for (int depth = 0; depth < 256 && dwarf_child(&scope, &child) == 0; ++depth) {
    bool found = false;
    do {
      int tag = dwarf_tag(&child);
      if ((tag == DW_TAG_inlined_subroutine || tag == DW_TAG_lexical_block || tag == DW_TAG_try_block ||
           tag == DW_TAG_catch_block) &&
          dwarf_haspc(&child, pc) > 0) {
        if (tag == DW_TAG_inlined_subroutine) chain.push_back(child);
        scope = child;
        found = true;
        break;
      }
    } while (dwarf_siblingof(&child, &child) == 0);
    if (!found) break;
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

}  // namespace gpuheap::symbolize
