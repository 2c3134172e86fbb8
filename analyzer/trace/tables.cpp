#include "analyzer/trace/tables.h"

namespace gpuheap {

void StoredSymbols::add(const format::SymbolFramesRecord& r) {
  auto& v = frames[r.ip];
  v.clear();
  for (std::size_t i = 0; i < r.count; ++i) {
    auto e = r.entry(i);
    v.push_back({e.function, e.file, e.line, (e.flags & format::kSymbolInlined) != 0});
  }
}

const std::string& StoredSymbols::str(std::uint32_t id) const {
  static const std::string kNone;
  auto it = strings.find(id);
  return it == strings.end() ? kNone : it->second;
}

}  // namespace gpuheap
