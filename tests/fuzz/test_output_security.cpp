// What a trace names is data, never code: module paths pointing at a script, a FIFO, a
// device or a shared library with a constructor must not be executed, loaded or block the
// analyzer; and every string from a trace comes out of `summary --json` as valid JSON.
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>

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
  std::vector<std::string> paths =
      {script, fifo, "/dev/zero", "/dev/tty",         "/dev/stdin",          "/proc/self/mem",
       lib,    link, dir,         "relative/evil.so", "/nonexistent/evil.so"};
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

// Output files (export, report): the temporary file is made with O_CREAT | O_EXCL |
// O_NOFOLLOW under a random name, never fopen("w") of OUT.tmp<pid>: a symlink planted at the
// predictable name (in a shared directory) made gpuheap truncate and overwrite its target.
// `sh -c '...; exec gpuheap'` keeps the shell's pid, so $$ is the pid the old name used.
TEST(OutputSecurity, PlantedTemporaryNamesAreNeverFollowed) {
  std::string dir = RawTrace::dir() + "/plant";
  ::mkdir(dir.c_str(), 0755);
  auto trace = trace_with_modules({"/nonexistent/a.so"}).write("plant.trace");
  std::string victim = dir + "/victim.txt";
  for (const char* cmd : {"export -q --format csv", "report -q"}) {
    {
      std::ofstream v(victim, std::ios::trunc);
      v << "the user's file\n";
    }
    std::string out = dir + "/out";
    ::unlink(out.c_str());
    auto r = run_cli("sh -c 'ln -s " + victim + " " + out + ".tmp$$ && ln -s " + victim + " " + dir +
                     "/.out.gpuheap-tmp.$$ && exec " + std::string(GPUHEAP_CLI) + " " + cmd + " -o " + out + " " +
                     trace + "'");
    EXPECT_EQ(r.status, 0) << cmd << ": " << r.err;
    EXPECT_EQ(slurp(victim), "the user's file\n") << cmd << " wrote through a planted link";
    struct stat st {};
    ASSERT_EQ(::lstat(out.c_str(), &st), 0) << cmd;
    EXPECT_TRUE(S_ISREG(st.st_mode)) << cmd << ": the output is not a new regular file";
    EXPECT_GT(st.st_size, 100) << cmd;
    // The victim, the output and the two planted links: no temporary file is left.
    auto ls = run_cli("ls -A " + dir);
    EXPECT_EQ(std::count(ls.out.begin(), ls.out.end(), '\n'), 4) << cmd << ": " << ls.out;
    run_cli("find " + dir + " -type l -delete");
  }
}

// An export or report is no more readable than the traces it comes from: a 0600 trace (what
// the preload writes) gives a 0600 file, whatever the umask lets through; the umask still
// removes bits.
TEST(OutputSecurity, OutputsAreNoMoreReadableThanTheTrace) {
  std::string dir = RawTrace::dir() + "/modes";
  ::mkdir(dir.c_str(), 0755);
  auto trace = trace_with_modules({"/nonexistent/a.so"}).write("modes.trace");
  struct Case {
    mode_t trace_mode;
    const char* umask;
    mode_t want;
  } cases[] = {{0600, "022", 0600}, {0640, "022", 0640}, {0644, "022", 0644}, {0666, "002", 0664}, {0644, "077", 0600}};
  int n = 0;
  for (const auto& c : cases) {
    ASSERT_EQ(::chmod(trace.c_str(), c.trace_mode), 0);
    for (const char* cmd : {"export -q --format csv", "export -q --format torch-snapshot", "report -q"}) {
      std::string out = dir + "/out" + std::to_string(n++);
      auto r = run_cli(std::string("sh -c 'umask ") + c.umask + " && exec " + GPUHEAP_CLI + " " + cmd + " -o " + out +
                       " " + trace + "'");
      ASSERT_EQ(r.status, 0) << cmd << ": " << r.err;
      struct stat st {};
      ASSERT_EQ(::stat(out.c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 07777, c.want)
          << cmd << " of a " << std::oct << c.trace_mode << " trace, umask " << c.umask;
    }
  }
  ::chmod(trace.c_str(), 0644);
}

// `export --format csv T -o T` replaced the trace with its CSV (exit 0). An output that is one
// of the inputs (the same file under any name: a relative path, a symlink, a hard link) is
// refused with or without --force, and the trace is left as it was.
TEST(OutputSecurity, OutputNeverReplacesAnInput) {
  std::string dir = RawTrace::dir() + "/same";
  ::mkdir(dir.c_str(), 0755);
  auto raw = trace_with_modules({"/nonexistent/a.so"});
  auto trace = raw.write("same/t.trace");
  std::string cli = GPUHEAP_CLI;
  ASSERT_EQ(run_cli(cli + " compress -k " + trace).status, 0);
  std::string zst = trace + ".zst";
  auto zbytes = slurp(zst);
  ASSERT_EQ(::symlink(trace.c_str(), (dir + "/link.trace").c_str()), 0);
  ASSERT_EQ(::link(trace.c_str(), (dir + "/hard.trace").c_str()), 0);
  struct Case {
    std::string cmd, input, output;
  } cases[] = {
      {"export -q --format csv", zst, zst},
      {"export -q --format csv --force", zst, zst},
      {"export -q --format chrome --force", trace, "./same/../same/t.trace"},
      {"export -q --format torch-snapshot --force", trace, dir + "/link.trace"},
      {"export -q --format csv --force", trace + " " + zst, dir + "/hard.trace"},
      {"report -q --force", zst, zst},
      {"report -q", trace, dir + "/link.trace"},
  };
  for (const auto& c : cases) {
    auto r = run_cli("sh -c 'cd " + RawTrace::dir() + " && exec " + cli + " " + c.cmd + " -o " + c.output + " " +
                     c.input + "'");
    EXPECT_EQ(r.status, 2) << c.cmd << " -o " << c.output << ": " << r.err;
    EXPECT_NE(r.err.find("is the input"), std::string::npos) << c.cmd << ": " << r.err;
    EXPECT_EQ(slurp(zst), zbytes) << c.cmd << " -o " << c.output;
    EXPECT_EQ(read_file(trace), raw.bytes) << c.cmd << " -o " << c.output;
  }
  auto ls = run_cli("ls -A " + dir);
  EXPECT_EQ(ls.out, "hard.trace\nlink.trace\nt.trace\nt.trace.zst\n") << "a refused export left a file";
}

// An existing output is replaced only with --force (as `run -o` and `compress` do); without
// it: exit 2, the file untouched, and no work done.
TEST(OutputSecurity, ExistingOutputNeedsForce) {
  std::string dir = RawTrace::dir() + "/exists";
  ::mkdir(dir.c_str(), 0755);
  auto trace = trace_with_modules({"/nonexistent/a.so"}).write("exists.trace");
  std::string cli = GPUHEAP_CLI;
  for (const char* cmd : {"export -q --format csv", "export -q --format folded", "report -q"}) {
    std::string out = dir + "/out";
    {
      std::ofstream f(out, std::ios::trunc);
      f << "keep me\n";
    }
    auto r = run_cli(cli + " " + cmd + " -o " + out + " " + trace);
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find(out + " exists; --force replaces it"), std::string::npos) << r.err;
    EXPECT_EQ(slurp(out), "keep me\n") << cmd;
    // A dangling symlink is something there too.
    std::string link = dir + "/dangling";
    ::unlink(link.c_str());
    ASSERT_EQ(::symlink((dir + "/nowhere").c_str(), link.c_str()), 0);
    EXPECT_EQ(run_cli(cli + " " + cmd + " -o " + link + " " + trace).status, 2) << cmd;
    EXPECT_NE(::access((dir + "/nowhere").c_str(), F_OK), 0) << cmd << " created the link's target";
    auto f = run_cli(cli + " " + cmd + " --force -o " + out + " " + trace);
    EXPECT_EQ(f.status, 0) << cmd << ": " << f.err;
    EXPECT_NE(slurp(out), "keep me\n") << cmd;
    // Devices are written, not replaced: no --force needed.
    EXPECT_EQ(run_cli(cli + " " + cmd + " -o /dev/null " + trace).status, 0) << cmd;
  }
}

}  // namespace
}  // namespace gpuheap::test
