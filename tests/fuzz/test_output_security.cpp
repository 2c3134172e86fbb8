// What a trace names is data, never code: module paths pointing at a script, a FIFO, a
// device or a shared library with a constructor must not be executed, loaded or block the
// analyzer; and every string from a trace comes out of `summary --json` as valid JSON.
#include <fcntl.h>
#include <sys/stat.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/fuzz/hostile.h"

namespace gpuheap::test {
namespace {

constexpr std::uint64_t kLo = 0x7f0000000000ull;

// A trace whose allocations (one live per module, so every module shows up in the peak
// and leak stacks, which the reports symbolize) have their innermost frame inside a module
// at each of `paths`.
RawTrace trace_with_modules(const std::vector<std::string>& paths, std::string_view cmdline = "prog") {
  RawTrace t;
  t.process(cmdline);
  std::uint64_t ts = 2'000'000'000;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    std::uint64_t lo = kLo + (i << 24);
    t.put(format::ModuleRecord{lo, lo, lo + 0x100000, paths[i], ""});
    t.stack(static_cast<std::uint32_t>(i + 1), {lo + 0x1234, lo + 0x5678});
    format::AllocRecord a;
    a.ts = ts += 100, a.tid = 1, a.kind = format::AllocKind::device_passthrough;
    a.ptr = 0x100000 * (i + 1), a.requested = a.size = 4096 * (i + 1), a.stack = static_cast<std::uint32_t>(i + 1);
    t.put(a);
  }
  t.put(format::EndRecord{ts + 1, format::EndReason::exit, 0});
  return t;
}

TEST(OutputSecurity, ModulePathsAreNeverExecutedLoadedOrBlockedOn) {
  std::string dir = RawTrace::dir() + "/sec";
  ::mkdir(dir.c_str(), 0755);
  std::string marker = dir + "/MARKER";
  std::string script = dir + "/evil.sh";
  {
    std::ofstream s(script);
    s << "#!/bin/sh\ntouch '" << marker << "'\n";
  }
  ::chmod(script.c_str(), 0755);
  std::string fifo = dir + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::string lib = GPUHEAP_MARKER_LIB;
  // A path that symlinks to the library, and the library itself under a libcuda-like name.
  std::string link = dir + "/libcuda.so.1";
  ASSERT_EQ(::symlink(lib.c_str(), link.c_str()), 0);
  std::vector<std::string> paths = {script, fifo, "/dev/zero", "/dev/tty", "/dev/stdin", "/proc/self/mem",
                                    lib, link, dir, "relative/evil.so", "/nonexistent/evil.so"};
  auto path = trace_with_modules(paths).write("sec.trace");
  ::setenv("GPUHEAP_TEST_MARKER", marker.c_str(), 1);
  for (const char* cmd : {"summary", "summary --json", "summary --all-frames", "check --max-leaked 0", "dump"}) {
    auto r = run_cli(std::string(GPUHEAP_CLI) + " " + cmd + " " + path + " </dev/null", 60);
    EXPECT_NE(r.status, -1) << cmd << " hung";
    EXPECT_TRUE(r.status == 0 || r.status == 1) << cmd << ": " << r.status << " " << r.err;
    EXPECT_NE(::access(marker.c_str(), F_OK), 0) << cmd << " executed or loaded a module from the trace";
  }
  auto diff = run_cli(std::string(GPUHEAP_CLI) + " diff " + path + " " + path + " </dev/null", 60);
  EXPECT_EQ(diff.status, 0) << diff.err;
  EXPECT_NE(::access(marker.c_str(), F_OK), 0);
  // Positive control: the library does create the marker when it is loaded.
  auto ctl = run_cli("env LD_PRELOAD=" + lib + " /bin/true");
  EXPECT_EQ(ctl.status, 0) << ctl.err;
  EXPECT_EQ(::access(marker.c_str(), F_OK), 0) << "the marker library does not work; the test proves nothing";
  ::unsetenv("GPUHEAP_TEST_MARKER");
}

TEST(OutputSecurity, JsonEscapesEveryTraceString) {
  // Quotes, backslashes, control characters, an escape sequence, invalid UTF-8 (a lone
  // continuation byte, a truncated sequence, an overlong encoding, 0xFF), a valid non-ASCII.
  const std::string nasty = std::string("a\"b\\c\x01\x1f\t\n\r\x7f\x1b[31m") + "\x80" + "\xe2\x82" + "\xc0\xaf" +
                            "\xff" + "\xc3\xa9</script><b>";
  std::string cmdline = nasty + std::string(1, '\0') + "arg2\"";
  format::DeviceRecord dev{0, 1ull << 34, nasty};
  RawTrace u = trace_with_modules({"/nonexistent/" + nasty + ".so", nasty}, cmdline);
  u.bytes.resize(u.bytes.size() - (format::kFrameHeaderSize + 17));  // drop the end record: it stays last
  u.put(format::ThreadRecord{1, nasty}).put(dev);
  u.put(format::EndRecord{9'000'000'000, format::EndReason::exit, 0});
  auto path = u.write("nasty.trace");
  auto r = run_cli(std::string(GPUHEAP_CLI) + " summary --json --all-frames " + path);
  ASSERT_EQ(r.status, 0) << r.err;
  nlohmann::json doc;
  ASSERT_NO_THROW(doc = nlohmann::json::parse(r.out)) << r.out.substr(0, 2000);
  // Everything that is valid survives; control characters are escaped, not dropped.
  std::string dumped = doc.dump();
  EXPECT_NE(dumped.find("a\\\"b\\\\c\\u0001\\u001f\\t\\n\\r"), std::string::npos) << dumped.substr(0, 2000);
  EXPECT_NE(dumped.find("\xc3\xa9</script>"), std::string::npos);
  EXPECT_NE(dumped.find("arg2\\\""), std::string::npos);
  // The raw output has no control bytes at all (a terminal or log viewer sees only text).
  for (unsigned char c : r.out) EXPECT_TRUE(c >= 0x20 || c == '\n') << "raw control byte " << int(c);
  // Text output must not fail either.
  auto text = run_cli(std::string(GPUHEAP_CLI) + " summary " + path);
  EXPECT_EQ(text.status, 0) << text.err;
}

}  // namespace
}  // namespace gpuheap::test
