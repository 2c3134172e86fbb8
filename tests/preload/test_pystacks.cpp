// Python frames in stacks (preload/record/pystack.h): a script allocating through ctypes gets
// its functions, files and lines in the summary, in place of the interpreter's frames.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "tests/preload/run_prog.h"

namespace gpuheap::test {
namespace {

const std::string kScript = std::string(PY_SCRIPT_DIR) + "/nested_alloc.py";

struct PyRun {
  ProgRun run;
  nlohmann::json summary;
  std::string text;
  // "LINE where caller_line malloc_line" lines the script printed, by `where`
  std::map<std::string, std::pair<int, int>> lines;
};

PyRun run_py(const std::vector<std::string>& args, std::vector<std::string> env = {}) {
  PyRun p;
  std::vector<std::string> argv{kScript};
  argv.insert(argv.end(), args.begin(), args.end());
  p.run = run(PYTHON3_EXE, argv, std::move(env));
  std::istringstream in(p.run.out);
  std::string tag, where;
  int caller = 0, at = 0;
  while (in >> tag >> where >> caller >> at)
    if (tag == "LINE") p.lines[where] = {caller, at};
  if (p.run.traces.size() != 1) return p;
  auto js = run_cmd(kBuild + "/gpuheap summary --json " + p.run.traces[0]);
  if (js.status == 0) p.summary = nlohmann::json::parse(js.out, nullptr, false);
  p.text = run_cmd(kBuild + "/gpuheap summary " + p.run.traces[0] + " 2>&1").out;
  return p;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// The one leak site of `bytes` requested bytes; null json when there is none.
nlohmann::json leak_of(const PyRun& p, std::uint64_t bytes) {
  for (const auto& l : p.summary["leaks"])
    if (l["bytes"] == bytes) return l;
  return {};
}

void expect_py_frame(const nlohmann::json& f, const std::string& function, int line) {
  EXPECT_EQ(f["module"], "python") << f.dump();
  EXPECT_EQ(f["function"], function) << f.dump();
  EXPECT_TRUE(ends_with(f["file"].get<std::string>(), "/nested_alloc.py")) << f.dump();
  EXPECT_EQ(f["line"], line) << f.dump();
  EXPECT_FALSE(f.contains("ip")) << "a Python frame has no address: " << f.dump();
}

constexpr std::uint64_t kMiB = 1 << 20;

TEST(PyStacks, NestedFunctionsNameTheirFileAndLine) {
  PyRun p = run_py({"nested"});
  ASSERT_EQ(p.run.status, 0) << p.run.err;
  ASSERT_TRUE(p.summary.is_object()) << p.run.err;
  ASSERT_EQ(p.lines.count("inner"), 1u) << p.run.out;
  const int malloc_line = p.lines["inner"].second;
  auto leak = leak_of(p, 3 * kMiB);
  ASSERT_TRUE(leak.is_object()) << p.summary["leaks"].dump();
  const auto& st = leak["stack"];
  ASSERT_GE(st.size(), 6u) << st.dump();
  // ctypes, libffi and the interpreter's own frames are gone: the script's frames come first.
  expect_py_frame(st[0], "malloc", malloc_line);
  expect_py_frame(st[1], "inner", p.lines["inner"].first);
  expect_py_frame(st[2], "middle", p.lines["inner"].first + 7);  // `return inner()`
  expect_py_frame(st[3], "outer", p.lines["inner"].first + 11);  // `return middle()`
  EXPECT_EQ(st[4]["function"], "main");
  EXPECT_EQ(st[5]["function"], "<module>");
  // Peak consumers: the 3 MiB leak and the 1 MiB temporary, each at its own line of inner().
  const auto& peak = p.summary["peak_consumers"];
  ASSERT_GE(peak.size(), 2u) << peak.dump();
  EXPECT_EQ(peak[0]["bytes"], 3 * kMiB);
  expect_py_frame(peak[1]["stack"][1], "inner", p.lines["inner_tmp"].first);
  // Text: "at inner (/…/nested_alloc.py:LINE)", and no interpreter frame anywhere.
  EXPECT_NE(p.text.find("at inner (" + kScript + ":" + std::to_string(p.lines["inner"].first) + ")"), std::string::npos)
      << p.text;
  EXPECT_EQ(p.text.find("_PyEval_EvalFrameDefault"), std::string::npos) << p.text;
  EXPECT_EQ(p.text.find("ffi_call"), std::string::npos) << p.text;
  // Each code object is written once: 6 distinct functions on the two stacks.
  auto dump = run_cmd(kBuild + "/gpuheap dump " + p.run.traces[0]);
  std::size_t codes = 0;
  for (std::size_t at = 0; (at = dump.out.find("\npy_code id=", at)) != std::string::npos; ++at) ++codes;
  EXPECT_EQ(codes, 6u) << dump.out;
}

TEST(PyStacks, PythonThreadInACallThatReleasedTheGil) {
  // ctypes drops the GIL around the foreign call: the thread's own frames are still read.
  PyRun p = run_py({"thread"});
  ASSERT_EQ(p.run.status, 0) << p.run.err;
  auto leak = leak_of(p, 5 * kMiB);
  ASSERT_TRUE(leak.is_object()) << p.summary.dump();
  const auto& st = leak["stack"];
  ASSERT_GE(st.size(), 3u) << st.dump();
  expect_py_frame(st[0], "malloc", p.lines["in_thread"].second);
  expect_py_frame(st[1], "in_thread", p.lines["in_thread"].first);
  EXPECT_EQ(st[2]["function"], "Thread.run") << st.dump();  // threading.py, by qualified name
  EXPECT_TRUE(ends_with(st[2]["file"].get<std::string>(), "threading.py")) << st.dump();
}

TEST(PyStacks, ThreadWithoutPythonStateKeepsItsNativeStack) {
  PyRun p = run_py({"native", kProgs + "/libpy_native.so"});
  ASSERT_EQ(p.run.status, 0) << p.run.err;
  auto leak = leak_of(p, 9 * kMiB);
  ASSERT_TRUE(leak.is_object()) << p.summary.dump();
  bool worker = false;
  for (const auto& f : leak["stack"]) {
    EXPECT_NE(f["module"], "python") << leak.dump();
    worker = worker || f["function"].get<std::string>().find("native_worker") != std::string::npos;
  }
  EXPECT_TRUE(worker) << leak.dump();
}

TEST(PyStacks, Recursion500DeepKeepsTheInnermostFrames) {
  PyRun p = run_py({"recursion"});
  ASSERT_EQ(p.run.status, 0) << p.run.err;
  auto leak = leak_of(p, 7 * kMiB);
  ASSERT_TRUE(leak.is_object()) << p.summary.dump();
  const auto& st = leak["stack"];
  ASSERT_LE(st.size(), 256u);  // format::kMaxStackDepth
  expect_py_frame(st[0], "malloc", p.lines["recurse"].second);
  expect_py_frame(st[1], "recurse", p.lines["recurse"].first);
  std::size_t deeper = 0;
  for (std::size_t i = 2; i < st.size(); ++i) {
    expect_py_frame(st[i], "recurse", p.lines["recurse"].first + 1);  // `return recurse(n - 1)`
    ++deeper;
  }
  EXPECT_GE(deeper, 200u) << "the stack is filled with Python frames up to the limit";
}

TEST(PyStacks, OffGivesTheNativeStack) {
  PyRun p = run_py({"nested"}, {"GPUHEAP_PYTHON_STACKS=0"});
  ASSERT_EQ(p.run.status, 0) << p.run.err;
  auto leak = leak_of(p, 3 * kMiB);
  ASSERT_TRUE(leak.is_object()) << p.summary.dump();
  bool eval = false;
  for (const auto& f : leak["stack"]) {
    EXPECT_NE(f["module"], "python") << leak.dump();
    eval = eval || f["function"] == "_PyEval_EvalFrameDefault";
  }
  EXPECT_TRUE(eval) << "the interpreter's frames, as before: " << leak.dump();
  EXPECT_EQ(run_cmd(kBuild + "/gpuheap dump " + p.run.traces[0] + " | grep -c '^py_code'").out, "0\n");
}

// The stacks and the events that use them, as dumped, less what differs between two runs (times,
// thread ids, addresses of blocks).
std::string stacks_of(const ProgRun& r) {
  if (r.status != 0 || r.traces.size() != 1) return "run failed: " + r.err;
  return run_cmd(kBuild + "/gpuheap dump -q " + r.traces[0] +
                 " | grep -E '^(stack|py_code|alloc) ' | sed -E 's/ (ts|tid|ptr|stream)=[^ ]+//g'")
      .out;
}

// The per-thread stack cache (record/stackcache.h) serves the stacks a full walk finds: the same
// program run twice without address randomisation, cache on and off, writes the same stacks and
// gives every allocation the same one, with Python frames and without.
TEST(PyStacks, StackCacheChangesNoStack) {
  if (run_cmd("setarch -R true 2>&1").status != 0) GTEST_SKIP() << "setarch -R is not permitted here";
  for (const char* py : {"GPUHEAP_PYTHON_STACKS=1", "GPUHEAP_PYTHON_STACKS=0"}) {
    std::string out[2];
    for (int cache = 0; cache < 2; ++cache) {
      ProgRun r = run("/usr/bin/setarch", {"-R", PYTHON3_EXE, kScript, "churn"},
                      {py, std::string("GPUHEAP_STACK_CACHE=") + (cache ? "1" : "0")});
      out[cache] = stacks_of(r);
    }
    EXPECT_GE(std::count(out[0].begin(), out[0].end(), '\n'), 400) << py << "\n" << out[0];
    EXPECT_EQ(out[0].find("stack=0"), std::string::npos) << py << ": every allocation has its stack";
    EXPECT_EQ(out[1], out[0]) << py;
  }
}

// Each thread keeps the code ids it found last (record/pystack.cpp's memo): one serves a frame
// only while the code object's identifying fields are unchanged. Here every function is freed
// before the next one is compiled, which usually takes the freed one's address: each must still
// get its own py_code record and its own name and line, not those of the code object before.
TEST(PyStacks, CodeAtAFreedCodesAddressGetsItsOwnRecord) {
  constexpr int kFunctions = 40;
  ProgRun r = run(PYTHON3_EXE, {kScript, "redefine", std::to_string(kFunctions)}, {});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(r.traces.size(), 1u) << r.err;
  std::map<std::string, int> line_of;
  std::map<std::string, int> at_address;  // functions whose code object had this address
  std::istringstream in(r.out);
  std::string tag, name, address;
  int line = 0;
  while (in >> tag >> name >> line >> address)
    if (tag == "CODE") line_of[name] = line, ++at_address[address];
  ASSERT_EQ(line_of.size(), std::size_t{kFunctions}) << r.out;
  int reused = 0;
  for (const auto& [a, n] : at_address) reused += n - 1;
  ASSERT_GT(reused, 0) << "no code object took a freed one's address: nothing tested\n" << r.out;
  auto js = run_cmd(kBuild + "/gpuheap summary --json --top 100 " + r.traces[0]);
  ASSERT_EQ(js.status, 0) << js.out;
  auto summary = nlohmann::json::parse(js.out, nullptr, false);
  ASSERT_EQ(summary["leaks"].size(), std::size_t{kFunctions}) << summary["leaks"].dump();
  for (int i = 0; i < kFunctions; ++i) {
    char fn[16];
    snprintf(fn, sizeof fn, "f_%03d", i);
    nlohmann::json leak;
    for (const auto& l : summary["leaks"])
      if (l["bytes"] == std::uint64_t(i + 1) * 4096) leak = l;
    ASSERT_TRUE(leak.is_object()) << fn << ": " << summary["leaks"].dump();
    const auto& f = leak["stack"][0];
    EXPECT_EQ(f["function"], fn) << f.dump();
    EXPECT_EQ(f["file"], "<redefine>") << f.dump();
    EXPECT_EQ(f["line"], line_of[fn]) << f.dump();
  }
  auto dump = run_cmd(kBuild + "/gpuheap dump " + r.traces[0] + " | grep -c '^py_code .*name=\"f_'");
  EXPECT_EQ(dump.out, std::to_string(kFunctions) + "\n") << "one record per code object";
}

// Code ids restart in each trace file: a forked child writes its own file, and the ids its
// thread kept from the parent's must not name frames there. In each file, every Python frame
// of every stack names a py_code record of that file, and the leaf is named.
TEST(PyStacks, ForkedChildWritesItsOwnCodeRecords) {
  ProgRun r = run(PYTHON3_EXE, {kScript, "fork"}, {});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_EQ(r.traces.size(), 2u) << r.err;
  for (const auto& t : r.traces) {
    auto dump = run_cmd(kBuild + "/gpuheap dump -q " + t);
    ASSERT_EQ(dump.status, 0) << dump.out;
    std::set<std::string> defined, used;
    std::istringstream in(dump.out);
    for (std::string l; std::getline(in, l);) {
      if (l.rfind("py_code id=", 0) == 0) defined.insert(l.substr(11, l.find(' ', 11) - 11));
      if (l.rfind("stack ", 0) != 0) continue;
      for (std::size_t at = 0; (at = l.find("py:", at)) != std::string::npos; at += 3)
        used.insert(l.substr(at + 3, l.find('@', at) - at - 3));
    }
    EXPECT_GE(defined.size(), 12u) << t << "\n" << dump.out;
    for (const auto& id : used) EXPECT_EQ(defined.count(id), 1u) << t << ": py:" << id << " has no py_code record";
    auto text = run_cmd(kBuild + "/gpuheap summary " + t + " 2>&1").out;
    EXPECT_NE(text.find("[python] level_8 (<chain>:"), std::string::npos) << t << "\n" << text;
  }
}

// Deep stacks (40 Python frames, as a transformer's forward and backward have) come out the same
// with the per-thread caches (the native stack cache and the code-id memo) as without.
TEST(PyStacks, DeepChainSameWithoutStackCaches) {
  if (run_cmd("setarch -R true 2>&1").status != 0) GTEST_SKIP() << "setarch -R is not permitted here";
  std::string out[2];
  for (int cache = 0; cache < 2; ++cache) {
    ProgRun r = run("/usr/bin/setarch", {"-R", PYTHON3_EXE, kScript, "chain", "300", "40"},
                    {std::string("GPUHEAP_STACK_CACHE=") + (cache ? "1" : "0")});
    out[cache] = stacks_of(r);
  }
  EXPECT_EQ(std::count(out[1].begin(), out[1].end(), '\n'), 300 + 16 + 40) << out[1];
  EXPECT_EQ(out[1].find("stack=0"), std::string::npos) << "every allocation has its stack";
  EXPECT_EQ(out[1], out[0]);
}

}  // namespace
}  // namespace gpuheap::test
