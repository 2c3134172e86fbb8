// Symbolizer tests on this process's own stacks. This file is compiled with -O0 -g, so the
// call sites below have exact line numbers; module records come from dl_iterate_phdr
// exactly as the preload's recorder builds them.
#define UNW_LOCAL_ONLY
#include <gtest/gtest.h>
#include <libunwind.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "analyzer/symbolize/symbolize.h"
#include "self_modules.h"
#include "symtest_libs.h"

using gpuheap::Frame;
using gpuheap::Symbolizer;
using symtest::OwnedModule;

namespace symtest_exe {

int g_capture_line = 0;

__attribute__((noinline)) std::vector<std::uint64_t> capture_stack() {
  void* buf[64];
  g_capture_line = __LINE__ + 1;
  int n = unw_backtrace(buf, 64);  // buf[0]: return address into capture_stack itself
  std::vector<std::uint64_t> ips;
  for (int i = 0; i < n; ++i) ips.push_back(reinterpret_cast<std::uint64_t>(buf[i]));
  return ips;
}

__attribute__((noinline)) std::vector<std::uint64_t> noinline_alloc_site(int* line) {
  *line = __LINE__ + 1;
  std::vector<std::uint64_t> ips = capture_stack();
  return ips;
}

struct Capture {
  std::vector<std::uint64_t> ips;
};
__attribute__((noinline)) void capture_cb(void* arg) { static_cast<Capture*>(arg)->ips = capture_stack(); }

}  // namespace symtest_exe

// Static cudart code inside a user binary: hidden by name.
namespace cudart {
__attribute__((noinline)) std::vector<std::uint64_t> fake_runtime_call() { return symtest_exe::capture_stack(); }
}  // namespace cudart
extern "C" __attribute__((noinline)) std::vector<std::uint64_t> __cudartFakeEntry() {
  return cudart::fake_runtime_call();
}
// CUDA 13's static cudart (symtest_static_cudart.cpp, no debug info): internals named
// libcudart_static_<sha1>, the API entry a plain C symbol (cudaFakeMalloc).
extern "C" std::vector<std::uint64_t> cudaFakeMalloc();
// Functions of the program named like the API's, both shown: a C one built with -g (a
// source line), a C++ one (a parameter list).
extern "C" __attribute__((noinline)) std::vector<std::uint64_t> cudaUserHelper() { return cudaFakeMalloc(); }
__attribute__((noinline)) std::vector<std::uint64_t> cudaMallocChecked(int) { return cudaUserHelper(); }

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

class SymbolizeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mods_ = symtest::loaded_modules();
    exe_ = &mods_.front();
  }
  void add_all(Symbolizer& s, const std::vector<OwnedModule>& mods) {
    for (const auto& m : mods) s.add_module(m.record());
  }
  const Frame* find_fn(const std::vector<Frame>& fs, const std::string& needle) {
    for (const auto& f : fs)
      if (f.function.find(needle) != std::string::npos) return &f;
    return nullptr;
  }
  // Frames up to and including main: what the default (not --all-frames) view keeps.
  static std::size_t frames_to_main(const std::vector<Frame>& fs) {
    for (std::size_t i = 0; i < fs.size(); ++i)
      if (fs[i].function == "main" && !fs[i].inlined) return i + 1;
    return fs.size();
  }
  std::vector<OwnedModule> mods_;
  const OwnedModule* exe_ = nullptr;
};

TEST_F(SymbolizeTest, CallSiteHasExactFunctionFileAndLine) {
  int line = 0;
  auto ips = symtest_exe::noinline_alloc_site(&line);
  ASSERT_GE(ips.size(), 3u);
  Symbolizer s;
  add_all(s, mods_);
  auto frames = s.symbolize(ips, true);
  ASSERT_GE(frames.size(), 3u);
  // Innermost: a return address too (into capture_stack), so it names the unw_backtrace call.
  EXPECT_EQ(frames[0].function, "symtest_exe::capture_stack()");
  EXPECT_EQ(frames[0].ip, ips[0] - 1);
  EXPECT_TRUE(ends_with(frames[0].file, "test_symbolize.cpp")) << frames[0].file;
  EXPECT_EQ(frames[0].line, symtest_exe::g_capture_line);
  // Caller: adjusted by one byte, names the call line exactly.
  EXPECT_EQ(frames[1].function, "symtest_exe::noinline_alloc_site(int*)");
  EXPECT_EQ(frames[1].ip, ips[1] - 1);
  EXPECT_TRUE(ends_with(frames[1].file, "tests/unit/test_symbolize.cpp")) << frames[1].file;
  EXPECT_EQ(frames[1].line, line);
  EXPECT_EQ(frames[1].module, exe_->path);
  EXPECT_EQ(frames[1].offset, ips[1] - 1 - exe_->base);
  EXPECT_FALSE(frames[1].inlined);
  EXPECT_FALSE(frames[1].hidden);
  EXPECT_EQ(Symbolizer::format_frame(frames[1]),
            fmt::format("symtest_exe::noinline_alloc_site(int*) ({}:{})", frames[1].file, line));
  // The test body that called it is next.
  EXPECT_NE(frames[2].function.find("CallSiteHasExactFunctionFileAndLine"), std::string::npos) << frames[2].function;
}

TEST_F(SymbolizeTest, InlinedFrameNamesInlinedFunctionAndCallerLine) {
  symtest_exe::Capture c;
  symtest_inline_entry(&symtest_exe::capture_cb, &c);
  Symbolizer s;
  add_all(s, mods_);
  auto frames = s.symbolize(c.ips, true);
  std::size_t i = 0;
  while (i < frames.size() && frames[i].function.find("inlined_leaf") == std::string::npos) ++i;
  ASSERT_LT(i + 1, frames.size()) << "no inlined_leaf frame";
  const Frame& leaf = frames[i];
  const Frame& entry = frames[i + 1];
  EXPECT_EQ(leaf.function, "symtest::inlined_leaf(void (*)(void*), void*)");
  EXPECT_TRUE(leaf.inlined);
  EXPECT_TRUE(ends_with(leaf.file, "symbolize_data/inline_lib.cpp")) << leaf.file;
  EXPECT_EQ(leaf.line, symtest_leaf_call_line);
  EXPECT_EQ(entry.function, "symtest_inline_entry");
  EXPECT_FALSE(entry.inlined);
  EXPECT_TRUE(ends_with(entry.file, "symbolize_data/inline_lib.cpp")) << entry.file;
  EXPECT_EQ(entry.line, symtest_entry_call_line);
  EXPECT_EQ(leaf.ip, entry.ip);  // both expanded from one address
  EXPECT_EQ(Symbolizer::format_frame(leaf),
            fmt::format("[inlined] symtest::inlined_leaf(void (*)(void*), void*) ({}:{})", leaf.file,
                        symtest_leaf_call_line));
  // The frame above the inline expansion is the callback, in this executable.
  ASSERT_GE(i, 1u);
  EXPECT_EQ(frames[i - 1].function, "symtest_exe::capture_cb(void*)");
}

TEST_F(SymbolizeTest, FramesInGpuheapNamedModuleAreHidden) {
  symtest_exe::Capture c;
  symtest_inline_entry(&symtest_exe::capture_cb, &c);
  // The same library under gpuheap's name: same bytes, same build-id, different basename.
  auto mods = mods_;
  OwnedModule* lib = nullptr;
  for (auto& m : mods)
    if (ends_with(m.path, "/libsymtest_inline.so")) lib = &m;
  ASSERT_NE(lib, nullptr);
  lib->path = SYMTEST_HIDDEN_COPY;
  Symbolizer s;
  add_all(s, mods);

  auto all = s.symbolize(c.ips, true);
  const Frame* entry = find_fn(all, "symtest_inline_entry");
  ASSERT_NE(entry, nullptr);  // the copy is read: same build-id as recorded
  EXPECT_TRUE(entry->hidden);
  EXPECT_EQ(entry->module, SYMTEST_HIDDEN_COPY);
  const Frame* leaf = find_fn(all, "inlined_leaf");
  ASSERT_NE(leaf, nullptr);
  EXPECT_TRUE(leaf->hidden);

  auto visible = s.symbolize(c.ips, false);
  EXPECT_EQ(find_fn(visible, "symtest_inline_entry"), nullptr);
  EXPECT_EQ(find_fn(visible, "inlined_leaf"), nullptr);
  EXPECT_NE(find_fn(visible, "capture_cb"), nullptr);
  EXPECT_EQ(visible.size(), frames_to_main(all) - 2);
  for (const auto& f : visible) EXPECT_FALSE(f.hidden) << f.function;

  // A stack made only of hidden frames keeps them rather than becoming empty.
  std::vector<std::uint64_t> only_lib;
  for (std::uint64_t ip : c.ips)
    if (ip - 1 >= lib->lo && ip - 1 < lib->hi) only_lib.push_back(ip);
  ASSERT_EQ(only_lib.size(), 1u);
  auto kept = s.symbolize(only_lib, false);
  ASSERT_EQ(kept.size(), 2u);  // inlined_leaf + symtest_inline_entry
  EXPECT_TRUE(kept[0].hidden && kept[1].hidden);
}

TEST_F(SymbolizeTest, StaticCudartFunctionsAreHidden) {
  auto ips = __cudartFakeEntry();
  Symbolizer s;
  add_all(s, mods_);
  auto all = s.symbolize(ips, true);
  const Frame* ns = find_fn(all, "cudart::fake_runtime_call");
  const Frame* prefixed = find_fn(all, "__cudartFakeEntry");
  ASSERT_NE(ns, nullptr);
  ASSERT_NE(prefixed, nullptr);
  EXPECT_TRUE(ns->hidden);
  EXPECT_TRUE(prefixed->hidden);
  EXPECT_FALSE(all[0].hidden);  // capture_stack, the innermost
  auto visible = s.symbolize(ips, false);
  EXPECT_EQ(find_fn(visible, "cudart::"), nullptr);
  EXPECT_EQ(find_fn(visible, "__cudart"), nullptr);
  EXPECT_EQ(visible.size(), frames_to_main(all) - 2);
  EXPECT_NE(find_fn(visible, "StaticCudartFunctionsAreHidden"), nullptr);
}

// The GPU machine's static cudart (CUDA 13): frames named libcudart_static_<hash> and the
// cudaMalloc entry itself sat above the program's call site and took the short stack's
// place in the OOM section (tests/gpu oom case).
TEST_F(SymbolizeTest, StaticCudartHashNamesAndApiEntryAreHidden) {
  auto ips = cudaMallocChecked(0);
  Symbolizer s;
  add_all(s, mods_);
  auto all = s.symbolize(ips, true);
  const Frame* hashed = find_fn(all, "libcudart_static_");
  const Frame* api = find_fn(all, "cudaFakeMalloc");
  const Frame* wrapper = find_fn(all, "cudaMallocChecked");
  const Frame* helper = find_fn(all, "cudaUserHelper");
  ASSERT_NE(hashed, nullptr);
  ASSERT_NE(api, nullptr);
  ASSERT_NE(wrapper, nullptr);
  ASSERT_NE(helper, nullptr);
  EXPECT_TRUE(api->file.empty());  // built as NVIDIA ships it
  EXPECT_FALSE(helper->file.empty());
  EXPECT_TRUE(hashed->hidden);
  EXPECT_TRUE(api->hidden);
  EXPECT_FALSE(wrapper->hidden);
  EXPECT_FALSE(helper->hidden);
  auto visible = s.symbolize(ips, false);
  EXPECT_EQ(find_fn(visible, "libcudart_static_"), nullptr);
  EXPECT_EQ(find_fn(visible, "cudaFakeMalloc"), nullptr);
  ASSERT_GE(visible.size(), 3u);
  EXPECT_EQ(visible.size(), frames_to_main(all) - 4);  // the four runtime frames
  EXPECT_EQ(visible[1].function, "cudaUserHelper");    // right after capture_stack
  EXPECT_NE(visible[2].function.find("cudaMallocChecked"), std::string::npos);
}

// The C runtime's startup frames (_start, __libc_start_main, __libc_start_call_main) are
// the same in every stack: the visible stack stops at main; --all-frames keeps them.
TEST_F(SymbolizeTest, StacksStopAtMain) {
  auto ips = __cudartFakeEntry();
  Symbolizer s;
  add_all(s, mods_);
  auto all = s.symbolize(ips, true);
  const std::size_t to_main = frames_to_main(all);
  ASSERT_LT(to_main, all.size()) << "no frames recorded beyond main";
  auto visible = s.symbolize(ips, false);
  ASSERT_FALSE(visible.empty());
  EXPECT_EQ(visible.back().function, "main");
  for (const char* fn : {"_start", "__libc_start_main", "__libc_start_call_main"})
    EXPECT_EQ(find_fn(visible, fn), nullptr) << fn;
  bool startup_in_all = false;
  for (std::size_t i = to_main; i < all.size(); ++i)
    startup_in_all |= all[i].function == "_start" || all[i].function.starts_with("__libc_start");
  EXPECT_TRUE(startup_in_all) << "expected libc startup frames outside main with --all-frames";
}

TEST_F(SymbolizeTest, BuildIdMismatchFallsBackToModuleOffsetAndWarnsOnce) {
  int line = 0;
  auto ips = symtest_exe::noinline_alloc_site(&line);
  auto mods = mods_;
  ASSERT_FALSE(mods.front().build_id.empty()) << "test binary has no build-id";
  mods.front().build_id[0] = static_cast<char>(mods.front().build_id[0] ^ 0x5a);

  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("symtest", sink));
  Symbolizer s;
  add_all(s, mods);
  auto frames = s.symbolize(ips, true);
  auto again = s.symbolize(symtest_exe::capture_stack(), true);
  gpuheap::report_missing_modules(true);  // missing modules are reported once per command, here
  spdlog::set_default_logger(previous);

  ASSERT_GE(frames.size(), 2u);
  EXPECT_EQ(frames[1].function, "");
  EXPECT_EQ(frames[1].file, "");
  EXPECT_EQ(frames[1].line, 0);
  EXPECT_EQ(frames[1].module, exe_->path);
  EXPECT_EQ(frames[1].offset, ips[1] - 1 - exe_->base);
  EXPECT_EQ(Symbolizer::format_frame(frames[1]),
            fmt::format("{:#x} ({}+{:#x})", ips[1] - 1, exe_->path, ips[1] - 1 - exe_->base));
  int warnings = 0;
  for (const auto& msg : sink->last_formatted())
    if (msg.find("build-id") != std::string::npos && msg.find(exe_->path) != std::string::npos) ++warnings;
  EXPECT_EQ(warnings, 1);
  // Other modules (libc, with the right build-id) still symbolize.
  const Frame* libc_main = find_fn(again, "__libc_start");
  EXPECT_NE(libc_main, nullptr);
}

TEST_F(SymbolizeTest, UnusableFilesFallBackToModuleOffsetWithoutBlocking) {
  int line = 0;
  auto ips = symtest_exe::noinline_alloc_site(&line);
  auto dir = std::filesystem::temp_directory_path() / fmt::format("symtest-{}", getpid());
  std::filesystem::create_directories(dir);
  auto fifo = (dir / "fifo.so").string();
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto text = (dir / "text.so").string();
  std::ofstream(text) << "not an ELF file\n";
  std::vector<std::string> paths =
      {"/nonexistent/dir/libmissing.so", "relative/libx.so", fifo, text, "/dev/zero", dir.string(), ""};
  for (const auto& p : paths) {
    auto mods = mods_;
    mods.front().path = p;
    Symbolizer s;
    add_all(s, mods);
    auto frames = s.symbolize(ips, true);
    ASSERT_GE(frames.size(), 2u) << p;
    EXPECT_EQ(frames[1].function, "") << p;
    EXPECT_EQ(frames[1].file, "") << p;
    EXPECT_EQ(frames[1].module, p);
    EXPECT_EQ(frames[1].offset, ips[1] - 1 - exe_->base) << p;
  }
  std::filesystem::remove_all(dir);
}

TEST_F(SymbolizeTest, NoDebugInfoUsesSymbolTable) {
  symtest_exe::Capture c;
  symtest_nodebug_entry(&symtest_exe::capture_cb, &c);
  Symbolizer s;
  add_all(s, mods_);
  auto frames = s.symbolize(c.ips, true);
  const Frame* local = find_fn(frames, "nodebug_local");
  const Frame* entry = find_fn(frames, "symtest_nodebug_entry");
  ASSERT_NE(local, nullptr);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(local->function, "nodebug_local(void (*)(void*), void*)");  // .symtab only (file-local)
  EXPECT_EQ(local->file, "");
  EXPECT_EQ(local->line, 0);
  const OwnedModule* lib = symtest::module_named(mods_, "/libsymtest_nodebug.so");
  ASSERT_NE(lib, nullptr);
  EXPECT_EQ(entry->module, lib->path);
  EXPECT_EQ(entry->offset, entry->ip - lib->base);
  EXPECT_EQ(Symbolizer::format_frame(*entry),
            fmt::format("symtest_nodebug_entry ({}+{:#x})", lib->path, entry->offset));
}

TEST_F(SymbolizeTest, LaterOverlappingModuleWinsAndUnknownAddressesStayRaw) {
  int line = 0;
  auto ips = symtest_exe::noinline_alloc_site(&line);
  Symbolizer s;
  add_all(s, mods_);
  EXPECT_EQ(s.symbolize(ips, true)[1].line, line);
  // A later module over part of the executable's range (dlclose + dlopen at that address).
  OwnedModule later = *exe_;
  later.path = "/nonexistent/replacement.so";
  later.lo = exe_->lo + 1;
  later.hi = exe_->lo + 2;
  s.add_module(later.record());
  auto frames = s.symbolize(ips, true);
  EXPECT_EQ(frames[1].module, "");  // the executable's record was evicted
  EXPECT_EQ(frames[1].function, "");
  EXPECT_EQ(Symbolizer::format_frame(frames[1]), fmt::format("{:#x}", ips[1] - 1));
  auto in_later = s.symbolize({later.lo + 1}, true);  // return address: looked up at lo
  ASSERT_EQ(in_later.size(), 1u);
  EXPECT_EQ(in_later[0].module, later.path);
  EXPECT_EQ(in_later[0].offset, later.lo - later.base);
  // Modules elsewhere are untouched.
  EXPECT_NE(find_fn(frames, "__libc_start"), nullptr);
  // A zero ip (a cut unwind) stays zero rather than wrapping around.
  auto zero = s.symbolize({0}, true);
  ASSERT_EQ(zero.size(), 1u);
  EXPECT_EQ(zero[0].ip, 0u);
  EXPECT_EQ(zero[0].module, "");
}

// Frames are looked up once per address and then copied from the Symbolizer's one array of
// frames: stacks sharing addresses, asked again, with and without hidden frames, in any order,
// get exactly what a fresh Symbolizer gives (inline expansions are several frames per address).
TEST_F(SymbolizeTest, CachedFramesAreTheFirstLookupsInAnyOrder) {
  symtest_exe::Capture c;
  symtest_inline_entry(&symtest_exe::capture_cb, &c);
  const std::vector<std::vector<std::uint64_t>> stacks = {c.ips, __cudartFakeEntry(), c.ips,
                                                          std::vector<std::uint64_t>(c.ips.begin() + 1, c.ips.end())};
  auto same = [](const std::vector<Frame>& a, const std::vector<Frame>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i)
      if (a[i].ip != b[i].ip || a[i].function != b[i].function || a[i].file != b[i].file || a[i].line != b[i].line ||
          a[i].module != b[i].module || a[i].offset != b[i].offset || a[i].inlined != b[i].inlined ||
          a[i].hidden != b[i].hidden)
        return false;
    return true;
  };
  Symbolizer shared;
  add_all(shared, mods_);
  std::size_t inlined = 0;
  for (int round = 0; round < 2; ++round)
    for (std::size_t i = 0; i < stacks.size(); ++i)
      for (bool all : {round == 0, round != 0}) {
        Symbolizer fresh;
        add_all(fresh, mods_);
        const auto want = fresh.symbolize(stacks[i], all);
        EXPECT_TRUE(same(shared.symbolize(stacks[i], all), want)) << "stack " << i << " all " << all;
        for (const auto& f : want) inlined += f.inlined;
      }
  EXPECT_GT(inlined, 0u);
}

TEST(SymbolizeFormat, FrameFormats) {
  Frame f;
  f.ip = 0x7f0000001234;
  EXPECT_EQ(Symbolizer::format_frame(f), "0x7f0000001234");
  f.module = "/usr/lib/libfoo.so";
  f.offset = 0x1a2b;
  EXPECT_EQ(Symbolizer::format_frame(f), "0x7f0000001234 (/usr/lib/libfoo.so+0x1a2b)");
  f.function = "foo(int)";
  EXPECT_EQ(Symbolizer::format_frame(f), "foo(int) (/usr/lib/libfoo.so+0x1a2b)");
  f.file = "/src/foo.cpp";
  f.line = 42;
  EXPECT_EQ(Symbolizer::format_frame(f), "foo(int) (/src/foo.cpp:42)");
  f.inlined = true;
  EXPECT_EQ(Symbolizer::format_frame(f), "[inlined] foo(int) (/src/foo.cpp:42)");
  f.line = 0;
  EXPECT_EQ(Symbolizer::format_frame(f), "[inlined] foo(int) (/src/foo.cpp)");
  Frame g;
  g.ip = 0x10;
  g.function = "bar";
  EXPECT_EQ(Symbolizer::format_frame(g), "bar (0x10)");
}

}  // namespace

int main(int argc, char** argv) {
  // libdw would otherwise query debuginfod servers named in the environment (network).
  unsetenv("DEBUGINFOD_URLS");
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
