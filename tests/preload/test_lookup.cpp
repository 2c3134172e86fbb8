// How the preload finds functions: a wheel's renamed libcudart (preload/hooks/real.cpp,
// loaded_library) and dlsym(RTLD_NEXT, ...) relative to the caller (lookup_for_caller).
#include <elf.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using gpuheap::format::AllocKind;
using namespace gpuheap::test;

namespace {

// Copies the simulated libcudart.so.13 to `dest` with its DT_SONAME string rewritten in place
// to `soname` (no longer than the original), as auditwheel-style repairs rename it. Without
// that, the loader would still find the copy as "libcudart.so.13" by its soname.
bool copy_with_soname(const std::string& dest, const std::string& soname) {
  std::ifstream in(kBuild + "/simcuda/libcudart.so.13", std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (b.size() < sizeof(Elf64_Ehdr)) return false;
  Elf64_Ehdr eh;
  std::memcpy(&eh, b.data(), sizeof eh);
  std::vector<Elf64_Phdr> ph(eh.e_phnum);
  std::memcpy(ph.data(), b.data() + eh.e_phoff, eh.e_phnum * sizeof(Elf64_Phdr));
  auto file_offset = [&](Elf64_Addr va) -> std::uint64_t {
    for (auto& p : ph)
      if (p.p_type == PT_LOAD && va >= p.p_vaddr && va < p.p_vaddr + p.p_filesz) return va - p.p_vaddr + p.p_offset;
    return 0;
  };
  Elf64_Addr strtab = 0;
  std::uint64_t name = 0;
  bool has_name = false;
  for (auto& p : ph) {
    if (p.p_type != PT_DYNAMIC) continue;
    for (std::uint64_t off = p.p_offset; off + sizeof(Elf64_Dyn) <= p.p_offset + p.p_filesz; off += sizeof(Elf64_Dyn)) {
      Elf64_Dyn d;
      std::memcpy(&d, b.data() + off, sizeof d);
      if (d.d_tag == DT_STRTAB) strtab = d.d_un.d_ptr;
      if (d.d_tag == DT_SONAME) name = d.d_un.d_val, has_name = true;
    }
  }
  std::uint64_t at = file_offset(strtab);
  if (!strtab || !has_name || !at) return false;
  char* s = b.data() + at + name;
  if (std::strcmp(s, "libcudart.so.13") != 0 || soname.size() > std::strlen(s)) return false;
  std::memset(s, 0, std::strlen(s));
  std::memcpy(s, soname.data(), soname.size());
  std::ofstream out(dest, std::ios::binary);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
  return static_cast<bool>(out);
}

// Runs prog_wheel on the copy: the allocations made through the preload's global-scope
// interposers (they must find the real cudaMalloc in the copy) and through dlsym(handle)
// are all in the trace.
void expect_wheel_copy_traced(const std::string& file) {
  std::string dir = make_dir();
  std::string lib = dir + "/" + file;
  ASSERT_TRUE(copy_with_soname(lib, "libcudart-3f.so"));
  ProgRun base = run("prog_wheel", {lib}, {}, false);
  ASSERT_EQ(base.status, 0) << base.out << base.err;
  EXPECT_NE(base.out.find("handle failures=0"), std::string::npos) << base.out;
  for (const char* pool : {"1", "0"}) {
    ProgRun r = run("prog_wheel", {lib}, {std::string("GPUHEAP_POOL=") + pool});
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("bound failures=0"), std::string::npos) << r.out << r.err;
    EXPECT_NE(r.out.find("handle failures=0"), std::string::npos) << r.out << r.err;
    ASSERT_EQ(r.traces.size(), 1u);
    TraceFile t = load_trace(r.traces[0]);
    std::multiset<std::uint64_t> sizes, want{3001, 3002, 3003, 3004, 5001, 5002, 5003, 5004};
    for (auto& a : t.allocs) sizes.insert(a.requested);
    EXPECT_EQ(sizes, want) << "GPUHEAP_POOL=" << pool;
    AllocKind kind = *pool == '1' ? AllocKind::device_pooled : AllocKind::device_passthrough;
    EXPECT_EQ(t.count_allocs(kind), 8u);
    EXPECT_EQ(t.count_frees(kind), 8u);
  }
}

}  // namespace

// File and soname both renamed: found by the tolerant file-name match.
TEST(Lookup, WheelRenamedLibcudartFoundByFileName) { expect_wheel_copy_traced("libcudart-3f2a9c1e.so.13"); }

// A file name that says nothing (a vendored copy): found by its DT_SONAME.
TEST(Lookup, WheelRenamedLibcudartFoundBySoname) { expect_wheel_copy_traced("_vendored_rt.so"); }

// dlsym(RTLD_NEXT) from libnext_a finds libnext_b's next_probe, as without the preload.
TEST(Lookup, RtldNextIsRelativeToTheCaller) {
  ProgRun base = run("prog_next", {"order"}, {}, false);
  ProgRun r = run("prog_next", {"order"});
  ASSERT_EQ(base.status, 0) << base.out << base.err;
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out, base.out);
  EXPECT_NE(r.out.find("first=1\nnext=2\nmissing=null\n"), std::string::npos) << r.out;
}

// The RTLD_NEXT walk over the loaded objects while another thread loads and unloads a
// library: no crash, no deadlock with the loader's locks, always the right answer.
TEST(Lookup, RtldNextWhileLibrariesComeAndGo) {
  ProgRun r = run("prog_next", {"churn", kProgs + "/libnext_c.so"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("churn ok"), std::string::npos) << r.out;
}
