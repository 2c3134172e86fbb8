// TEMPORARY fallback used only while analyzer/symbolize.cpp (the libdw symbolizer) does not
// exist: maps each ip to "module+offset" using the trace's module records. CMake drops this
// file as soon as symbolize.cpp is present.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "analyzer/symbolize.h"

namespace gpuheap {

struct Symbolizer::Impl {
  struct Mod {
    std::uint64_t base, lo, hi;
    std::string path;
  };
  std::vector<Mod> mods;
};

Symbolizer::Symbolizer() : impl_(std::make_unique<Impl>()) {}
Symbolizer::~Symbolizer() = default;

void Symbolizer::add_module(const format::ModuleRecord& m) {
  impl_->mods.push_back({m.base, m.lo, m.hi, std::string(m.path)});
}

std::vector<Frame> Symbolizer::symbolize(const std::vector<std::uint64_t>& ips, bool all_frames) {
  std::vector<Frame> out, visible;
  for (std::size_t i = 0; i < ips.size(); ++i) {
    Frame f;
    f.ip = i == 0 ? ips[i] : ips[i] - 1;
    for (auto it = impl_->mods.rbegin(); it != impl_->mods.rend(); ++it) {
      if (f.ip >= it->lo && f.ip < it->hi) {
        f.module = it->path;
        f.offset = f.ip - it->base;
        break;
      }
    }
    auto base = f.module.substr(f.module.rfind('/') + 1);
    f.hidden = base.rfind("libgpuheap", 0) == 0 || base.rfind("libcudart", 0) == 0 ||
               base.rfind("libcuda.so", 0) == 0;
    out.push_back(f);
    if (!f.hidden) visible.push_back(f);
  }
  if (all_frames || visible.empty()) return out;
  return visible;
}

std::string Symbolizer::format_frame(const Frame& f) {
  std::string fn = f.function.empty() ? "??" : f.function;
  if (!f.file.empty()) return fmt::format("{} ({}:{})", fn, f.file, f.line);
  if (!f.module.empty()) return fmt::format("{} ({}+{:#x})", fn, f.module, f.offset);
  return fmt::format("{:#x}", f.ip);
}

}  // namespace gpuheap
