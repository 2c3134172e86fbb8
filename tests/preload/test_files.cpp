// When trace files are created: a process gets one at its first recorded event, so processes
// that never touch CUDA (compiler subprocesses, DataLoader workers, wrappers that only exec)
// leave no file, no "tracing to" line and no "trace written to" line (prog_files.cpp).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using namespace gpuheap::test;
using gpuheap::format::AllocKind;

namespace {

// `gpuheap run --simulate` of prog_files MODE... with its traces in dir.
CmdRun gpuheap_run(const std::string& dir, const std::string& args) {
  return run_cmd(kBuild + "/gpuheap run --simulate -o '" + dir + "/t.%p.trace' -- " + kProgs + "/prog_files " + args +
                 " 2>&1");  // stdout and stderr together
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string value(const std::string& out, const std::string& key) {
  std::size_t p = out.find(key + "=");
  if (p == std::string::npos) return "(missing)";
  p += key.size() + 1;
  return out.substr(p, out.find('\n', p) - p);
}

}  // namespace

TEST(TraceFiles, ProcessWithoutCudaCallsLeavesNoFile) {
  for (const char* mode : {"none", "exec"}) {
    ProgRun r = run("prog_files", {mode}, {"GPUHEAP_QUIET=0"});
    ASSERT_EQ(r.status, 0) << mode << ": " << r.err;
    EXPECT_NE(r.out.find("none pid="), std::string::npos) << mode;
    EXPECT_TRUE(r.traces.empty()) << mode << ": " << r.traces.size() << " file(s), first " << r.traces.at(0);
    EXPECT_EQ(count(r.err, "tracing to"), 0) << mode << ": " << r.err;
  }
}

TEST(TraceFiles, ForkExecChildrenWithoutCudaLeaveNoFile) {
  std::string list = make_dir() + "/paths.txt";
  ProgRun r = run("prog_files", {"spawn", "4"}, {"GPUHEAP_QUIET=0", "GPUHEAP_PATH_FILE=" + list});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(count(r.out, "none pid="), 4) << r.out;
  EXPECT_TRUE(r.traces.empty()) << r.traces.size() << " file(s) left by processes that never touched CUDA";
  EXPECT_EQ(count(r.err, "tracing to"), 0) << r.err;
  EXPECT_EQ(read_all(list), "") << "the path list names files of processes without events";
}

TEST(TraceFiles, GpuheapRunPrintsNoTraceLineForProcessesWithoutCuda) {
  std::string dir = make_dir();
  CmdRun r = gpuheap_run(dir, "spawn 3");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.out, "none pid="), 3) << r.out;
  EXPECT_EQ(count(r.out, "trace written to"), 0) << r.out;
  EXPECT_EQ(count(r.out, "tracing to"), 0) << r.out;
  EXPECT_TRUE(traces_in(dir).empty());
  // Control: the same run with a parent that allocates names exactly its one file.
  std::string dir2 = make_dir();
  CmdRun c = gpuheap_run(dir2, "parent_cuda");
  ASSERT_EQ(c.status, 0) << c.out;
  auto files = traces_in(dir2);
  ASSERT_EQ(files.size(), 1u) << c.out;
  EXPECT_EQ(count(c.out, "trace written to"), 1) << c.out;
  EXPECT_NE(c.out.find("gpuheap: trace written to " + files[0] + "\n"), std::string::npos) << c.out;
  EXPECT_EQ(count(c.out, "tracing to " + files[0] + "\n"), 1) << c.out;
}

TEST(TraceFiles, GpuheapRunNamesOnlyListedFilesThatHoldEvents) {
  std::string dir = make_dir();
  CmdRun r = gpuheap_run(dir, "bad_list " + dir);
  ASSERT_EQ(r.status, 0) << r.out;
  std::string mine = dir + "/t.";
  EXPECT_EQ(count(r.out, "trace written to"), 1) << r.out;
  EXPECT_NE(r.out.find("gpuheap: trace written to " + mine), std::string::npos) << r.out;
  EXPECT_EQ(count(r.out, "gone.trace"), 0) << r.out;
  EXPECT_EQ(count(r.out, "empty.trace"), 0) << r.out;
}

TEST(TraceFiles, CudaParentWithChildrenWithoutCudaLeavesExactlyOneFile) {
  std::string list = make_dir() + "/paths.txt";
  ProgRun r = run("prog_files", {"parent_cuda"}, {"GPUHEAP_PATH_FILE=" + list});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(count(r.out, "none pid="), 1) << r.out;
  ASSERT_EQ(r.traces.size(), 1u) << "children that never touched CUDA left files";
  TraceFile t = load_trace(r.traces[0]);
  EXPECT_TRUE(t.ok && t.process_first && t.has_end && !t.truncated && !t.corrupt);
  EXPECT_EQ(t.allocs.size(), 1u);
  EXPECT_EQ(t.frees.size(), 1u);
  EXPECT_NE(value(r.out, "none pid"), std::to_string(t.process.pid)) << "the file is the child's";
  EXPECT_EQ(read_all(list), r.traces[0] + "\n");
}

TEST(TraceFiles, LateFirstEventAfterForkAndThreadsGivesACompleteTrace) {
  std::string dir = make_dir();
  ProgRun r = run("prog_files", {"late", dir}, {"GPUHEAP_OUTPUT=" + dir + "/t.%p.trace"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  auto files = traces_in(dir);
  ASSERT_EQ(files.size(), 1u) << "only the process that allocated may leave a file";
  EXPECT_EQ(value(r.out, "file_before"), "0") << "the file existed before the first event";
  EXPECT_EQ(value(r.out, "path_before"), "") << "gpuheap_trace_path() named a file before the first event";
  EXPECT_EQ(value(r.out, "path_after"), files[0]);
  TraceFile t = load_trace(files[0]);
  EXPECT_TRUE(t.ok && t.process_first && t.has_end && !t.truncated && !t.corrupt);
  EXPECT_TRUE(t.stack_before_use && t.device_before_use);
  EXPECT_GT(t.modules, 0u);
  EXPECT_EQ(t.count_allocs(AllocKind::device_pooled), 4u * 50 + 1);
  EXPECT_EQ(t.count_frees(AllocKind::device_pooled), 4u * 50);
  EXPECT_EQ(files[0], dir + "/t." + std::to_string(t.process.pid) + ".trace");
  // The process record still describes the start of the process, not its first event.
  EXPECT_LE(t.process.mono_ns, std::stoull(value(r.out, "start_ns")));
  EXPECT_NE(t.cmdline.find("late"), std::string::npos);
  CmdRun s = run_cmd(kBuild + "/gpuheap summary " + files[0] + " 2>&1");
  ASSERT_EQ(s.status, 0) << s.out;
  EXPECT_NE(s.out.find("  events:    "), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("  truncated: no\n"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("late"), std::string::npos) << s.out;
}
