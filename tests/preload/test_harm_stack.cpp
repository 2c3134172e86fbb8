// "Never break the job" (issue 33, round 3): a hook takes little of the calling thread's
// stack, and gpuheap takes no descriptor below the program's RLIMIT_NOFILE for its unwinder.
// Programs (prog_stack.cpp) run with and without LD_PRELOAD=libgpuheap.so on the simulated
// runtime; figures are printed as "[figure] ..." lines (docs/reliability.md).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "format/trace.h"
#include "tests/preload/run_prog.h"
#include "tests/trace_walk.h"

namespace fmt_ = gpuheap::format;
using gpuheap::test::ProgRun;
using gpuheap::test::run;

namespace {

// The number after `key ` in a program's stdout; -1 when absent.
long value_of(const std::string& out, const std::string& key) {
  auto at = out.find(key + " ");
  return at == std::string::npos ? -1 : std::strtol(out.c_str() + at + key.size() + 1, nullptr, 0);
}

struct TraceSummary {
  bool readable = false;
  int allocs = 0, frees = 0, stacks = 0, ends = 0;
  int alloc_depth = 0;  // frames of the allocation's stack
};

TraceSummary summarize(const std::string& path) {
  TraceSummary s;
  std::uint32_t alloc_stack = 0;
  std::vector<std::pair<std::uint32_t, int>> stacks;
  const auto w = gpuheap::test::walk_file(path, [&](const fmt_::Record& r) {
    switch (r.type) {
      case fmt_::RecordType::alloc: ++s.allocs, alloc_stack = r.alloc.stack; break;
      case fmt_::RecordType::free: ++s.frees; break;
      case fmt_::RecordType::stack: ++s.stacks, stacks.emplace_back(r.stack.id, r.stack.depth); break;
      case fmt_::RecordType::end: ++s.ends; break;
      default: break;
    }
  });
  s.readable = w.opened && w.header_ok && !w.corrupt && w.tail_bytes == 0;
  for (auto& [id, depth] : stacks)
    if (alloc_stack && id == alloc_stack) s.alloc_depth = depth;
  return s;
}

// The first event of the process, on a thread with a PTHREAD_STACK_MIN (16 KiB) stack, with
// native stacks (and Python stacks, the default) on: the program ends as it does natively and
// its trace holds the allocation with a stack.
void small_stack_case(const char* api) {
  ProgRun native = run("prog_stack", {"small", api}, {}, /*preload=*/false);
  ASSERT_EQ(native.status, 0) << native.err;
  ProgRun r = run("prog_stack", {"small", api}, {"GPUHEAP_STACKS=1"});
  ASSERT_EQ(r.status, 0) << "status " << r.status << "\n" << r.err;
  EXPECT_EQ(r.out, native.out);
  ASSERT_EQ(r.traces.size(), 1u);
  TraceSummary s = summarize(r.traces[0]);
  EXPECT_TRUE(s.readable);
  EXPECT_EQ(s.allocs, 1);
  EXPECT_EQ(s.frees, 1);
  EXPECT_EQ(s.ends, 1);
  EXPECT_GE(s.alloc_depth, 1) << "the allocation keeps a stack on a 16 KiB thread";
}

}  // namespace

TEST(ReliabilityStack, SmallThreadStackFirstEventRuntime) { small_stack_case("runtime"); }
TEST(ReliabilityStack, SmallThreadStackFirstEventDriver) { small_stack_case("driver"); }

// Stack bytes below the calling thread's entry frame written during one allocation and its
// free, natively and under the preload: the first event of the process (which creates the
// trace), a later one (the thread's first) and the thread's second.
TEST(ReliabilityStack, StackUsedPerEvent) {
  for (const char* api : {"runtime", "driver"}) {
    for (const char* when : {"first", "later", "steady"}) {
      ProgRun native = run("prog_stack", {"measure", api, when}, {}, false);
      ProgRun traced = run("prog_stack", {"measure", api, when}, {"GPUHEAP_STACKS=1"});
      ASSERT_EQ(native.status, 0) << native.err;
      ASSERT_EQ(traced.status, 0) << traced.err;
      long n = value_of(native.out, "stack_used"), t = value_of(traced.out, "stack_used");
      ASSERT_GT(n, 0);
      ASSERT_GT(t, 0);
      std::printf("[figure] stack used by %s alloc+free (%s event): native %ld B, traced %ld B (+%ld)\n", api, when, n,
                  t, t - n);
      // The hooks' own frames (and the loader's, resolving a CUDA function at its first use):
      // unwinding and the trace's creation run on a stack of their own (record/scratch.h).
      EXPECT_LE(t - n, std::string(when) == "steady" ? 1024 : 3072) << api << " " << when;
    }
  }
}

// RLIMIT_NOFILE set by the program to what it needs: gpuheap may take the trace's descriptor
// (the sink's), never one for the unwinder: libunwind's validation pipe sits at the top of the
// table, above the limit the program set, close-on-exec.
TEST(ReliabilityFds, LowNofileLeavesTheProgramItsDescriptors) {
  const std::string n = "40";
  ProgRun native = run("prog_stack", {"fds", n}, {}, false);
  ProgRun traced = run("prog_stack", {"fds", n}, {"GPUHEAP_STACKS=1"});
  ASSERT_EQ(native.status, 0) << native.err;
  ASSERT_EQ(traced.status, 0) << traced.err;
  long a = value_of(native.out, "opened"), b = value_of(traced.out, "opened");
  ASSERT_GT(a, 0);
  std::printf("[figure] RLIMIT_NOFILE %s: the program opened %ld files natively, %ld traced (gpuheap kept %ld)\n",
              n.c_str(), a, b, a - b);
  EXPECT_GE(b, a - 1) << "at most the trace's own descriptor";
  // gpuheap's pipes: those the native run (the same inherited descriptors) does not have.
  for (std::size_t at = traced.out.find("pipe "); at != std::string::npos; at = traced.out.find("pipe ", at + 1)) {
    std::string line = traced.out.substr(at, traced.out.find('\n', at) - at);
    if (native.out.find(line) != std::string::npos) continue;
    long fd = std::strtol(line.c_str() + 5, nullptr, 10);
    EXPECT_GE(fd, std::atol(n.c_str())) << line;
    EXPECT_NE(line.find("cloexec"), std::string::npos) << line;
  }
  ASSERT_EQ(traced.traces.size(), 1u);
  TraceSummary s = summarize(traced.traces[0]);
  EXPECT_TRUE(s.readable);
  EXPECT_EQ(s.allocs, 2);
  EXPECT_GE(s.alloc_depth, 1);
}
