// Programs built against the CUDA toolkit's libcudart, run on the simulated CUDA runtime with
// libgpuheap.so preloaded; the traces they leave are decoded and checked event by event.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using gpuheap::format::AllocKind;
using gpuheap::test::load_trace;
using gpuheap::test::TraceFile;

using namespace gpuheap::test;

namespace {

void expect_well_formed(const TraceFile& t) {
  EXPECT_TRUE(t.ok);
  EXPECT_FALSE(t.corrupt);
  EXPECT_TRUE(t.process_first);
  EXPECT_TRUE(t.stack_before_use) << "an event used a stack id before its stack record";
  EXPECT_TRUE(t.device_before_use) << "an event named a device before its device record";
  EXPECT_GT(t.modules, 0u);
}

std::size_t count_failed_frees(const TraceFile& t, AllocKind k) {
  std::size_t n = 0;
  for (auto& f : t.frees) n += f.kind == k && (f.flags & gpuheap::format::kFlagFailed);
  return n;
}

}  // namespace

TEST(Preload, ProgramsBehaveTheSameWithoutIt) {
  EXPECT_EQ(run("prog_api", {}, {}, false).status, 0);
  EXPECT_EQ(run("prog_driver", {}, {}, false).status, 0);
}

TEST(Preload, RuntimeApiBySymbol) {
  // Cached after the frees: the 2 MiB small segment (1000 B block) and the 20 MiB large one.
  ProgRun r = run("prog_api", {}, {"PROG_API_EXPECT_CACHED=" + std::to_string(22u << 20)});
  ASSERT_EQ(r.status, 0) << r.out;
  ASSERT_EQ(r.traces.size(), 1u);
  TraceFile t = load_trace(r.traces[0]);
  expect_well_formed(t);
  EXPECT_TRUE(t.has_end);
  EXPECT_FALSE(t.truncated);
  ASSERT_EQ(t.count_allocs(AllocKind::device_pooled), 3u);
  EXPECT_EQ(t.allocs[0].requested, 1000u);
  EXPECT_EQ(t.allocs[0].size, 1024u);
  EXPECT_TRUE(t.allocs[0].flags & gpuheap::format::kFlagSmallPool);
  EXPECT_EQ(t.allocs[1].requested, 3u << 20);
  EXPECT_NE(t.allocs[0].stack, 0u);
  EXPECT_EQ(t.count_frees(AllocKind::device_pooled), 4u);  // 3 + the double free
  EXPECT_EQ(count_failed_frees(t, AllocKind::device_pooled), 1u);
  EXPECT_EQ(count_failed_frees(t, AllocKind::device_passthrough), 1u);  // the host address
  EXPECT_EQ(t.count_allocs(AllocKind::async), 2u);
  EXPECT_EQ(t.count_frees(AllocKind::async), 2u);
  EXPECT_EQ(t.count_allocs(AllocKind::managed), 1u);
  EXPECT_EQ(t.count_frees(AllocKind::managed), 1u);
  EXPECT_EQ(t.count_allocs(AllocKind::host_pinned), 2u);
  EXPECT_EQ(t.count_frees(AllocKind::host_pinned), 2u);
  EXPECT_EQ(t.count_allocs(AllocKind::pitch), 2u);
  EXPECT_EQ(t.count_frees(AllocKind::pitch), 2u);
  EXPECT_EQ(t.count_allocs(AllocKind::device_passthrough), 0u);
  // Async records carry their stream; sizes are the requests.
  for (auto& a : t.allocs)
    if (a.kind == AllocKind::async) EXPECT_NE(a.stream, 0u);
  // Segments: the small 2 MiB, the 20 MiB large one (3 MiB and 2 MiB requests share it).
  ASSERT_EQ(t.segments.size(), 2u);
  EXPECT_EQ(t.segments[0].size, 2u << 20);
  EXPECT_EQ(t.segments[1].size, 20u << 20);
  EXPECT_TRUE(t.devices.count(0));
}

TEST(Preload, PoolOffPassesEverythingThrough) {
  ProgRun r = run("prog_api", {}, {"GPUHEAP_POOL=0"});
  ASSERT_EQ(r.status, 0) << r.out;
  TraceFile t = load_trace(r.traces.at(0));
  expect_well_formed(t);
  EXPECT_EQ(t.count_allocs(AllocKind::device_pooled), 0u);
  EXPECT_EQ(t.count_allocs(AllocKind::device_passthrough), 3u);
  EXPECT_TRUE(t.segments.empty());
  for (auto& a : t.allocs)
    if (a.kind == AllocKind::device_passthrough) EXPECT_GE(a.size, a.requested);
}

TEST(Preload, DriverApiThroughDlsymAndGetProcAddress) {
  ProgRun r = run("prog_driver");
  ASSERT_EQ(r.status, 0) << r.out;
  TraceFile t = load_trace(r.traces.at(0));
  expect_well_formed(t);
  EXPECT_EQ(t.count_allocs(AllocKind::device_pooled), 2u);
  EXPECT_EQ(t.count_frees(AllocKind::device_pooled), 2u);
  EXPECT_EQ(t.count_allocs(AllocKind::async), 2u);
  EXPECT_EQ(t.count_frees(AllocKind::async), 2u);
  EXPECT_EQ(t.count_allocs(AllocKind::managed), 1u);
  EXPECT_EQ(t.count_frees(AllocKind::managed), 1u);
  EXPECT_EQ(t.count_allocs(AllocKind::pitch), 1u);
  EXPECT_EQ(t.count_frees(AllocKind::pitch), 1u);
  EXPECT_EQ(t.count_allocs(AllocKind::host_pinned), 2u);
  EXPECT_EQ(t.count_frees(AllocKind::host_pinned), 2u);
  // 1 handle mapped and unmapped alone, then 2 handles released while mapped and unmapped by
  // one cuMemUnmap spanning both mappings: every mapping and handle is freed.
  EXPECT_EQ(t.count_allocs(AllocKind::vmm_physical), 3u);
  EXPECT_EQ(t.count_frees(AllocKind::vmm_physical), 3u);
  EXPECT_EQ(t.count_allocs(AllocKind::vmm_map), 3u);
  EXPECT_EQ(t.count_frees(AllocKind::vmm_map), 4u);  // + the refused partial unmap
  EXPECT_EQ(t.count_allocs(AllocKind::va_reserve), 2u);
  EXPECT_EQ(t.count_frees(AllocKind::va_reserve), 2u);
  std::vector<const gpuheap::format::FreeRecord*> failed;
  for (auto& f : t.frees)
    if (f.flags & gpuheap::format::kFlagFailed) failed.push_back(&f);
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_EQ(failed[0]->kind, AllocKind::vmm_map);
  // The spanning unmap's frees: both mappings (address order), each handle right after its
  // last mapping goes, with the sizes that were mapped and created.
  std::vector<std::pair<AllocKind, std::uint64_t>> vmm;
  for (auto& f : t.frees)
    if ((f.kind == AllocKind::vmm_map || f.kind == AllocKind::vmm_physical) &&
        !(f.flags & gpuheap::format::kFlagFailed))
      vmm.emplace_back(f.kind, f.size);
  ASSERT_EQ(vmm.size(), 6u);
  const std::uint64_t gran = vmm[0].second;
  EXPECT_EQ(vmm[2], std::make_pair(AllocKind::vmm_map, gran));
  EXPECT_EQ(vmm[3], std::make_pair(AllocKind::vmm_physical, gran));
  EXPECT_EQ(vmm[4], std::make_pair(AllocKind::vmm_map, 2 * gran));
  EXPECT_EQ(vmm[5], std::make_pair(AllocKind::vmm_physical, 2 * gran));
}

TEST(Preload, SixteenThreadsExactEventCounts) {
  const long iters = small_scale() ? 10000 : 100000;
  ProgRun r = run("prog_threads", {"16", std::to_string(iters)});
  ASSERT_EQ(r.status, 0) << r.out;
  TraceFile t = load_trace(r.traces.at(0));
  expect_well_formed(t);
  EXPECT_TRUE(t.has_end);
  EXPECT_EQ(t.count_allocs(AllocKind::device_pooled), static_cast<std::size_t>(16 * iters));
  EXPECT_EQ(t.count_frees(AllocKind::device_pooled), static_cast<std::size_t>(16 * iters));
  // Replay: no address is allocated twice without a free in between.
  std::unordered_map<std::uint64_t, int> live;
  std::size_t bad = 0;
  walk_records(t.bytes.data(), t.bytes.size(), gpuheap::format::kFileHeaderSize,
               [&](const gpuheap::format::Record& rec) {
                 if (rec.type == gpuheap::format::RecordType::alloc) bad += live[rec.alloc.ptr]++ != 0;
                 if (rec.type == gpuheap::format::RecordType::free) bad += live[rec.free.ptr]-- != 1;
               });
  EXPECT_EQ(bad, 0u) << "trace order is not a valid replay order";
}

TEST(Preload, NoEarlyReuseAndTheTestCanTell) {
  EXPECT_EQ(run("prog_reuse", {"4"}).status, 0) << "pooled block reused before the GPU finished with it";
  EXPECT_EQ(run("prog_reuse", {"4"}, {"GPUHEAP_UNSAFE_REUSE=1"}).status, 3)
      << "unsafe reuse was not detected: the early-reuse test cannot fail";
  EXPECT_EQ(run("prog_reuse", {"2"}, {"GPUHEAP_POOL=0"}).status, 0);
}

// cudaStreamDestroy right after cudaFree: the free still waits for the work queued on the
// destroyed stream before the destroy. A long seal interval leaves the free unfenced at
// the destroy (the case that reused the block early); the first iteration seals at once.
TEST(Preload, StreamDestroyedAfterFreeStillFencesTheBlock) {
  EXPECT_EQ(run("prog_reuse", {"4", "destroy"}, {"GPUHEAP_SEAL_US=5000000"}).status, 0)
      << "pooled block reused before the destroyed stream finished with it";
  EXPECT_EQ(run("prog_reuse", {"2", "destroy"}, {"GPUHEAP_SEAL_US=5000000", "GPUHEAP_UNSAFE_REUSE=1"}).status, 3)
      << "unsafe reuse was not detected: the test cannot fail";
}

TEST(Preload, ExitWithLiveAllocations) {
  ProgRun r = run("prog_lifecycle", {"live"});
  ASSERT_EQ(r.status, 0);
  TraceFile t = load_trace(r.traces.at(0));
  expect_well_formed(t);
  EXPECT_TRUE(t.has_end);
  EXPECT_EQ(t.allocs.size(), 3u);
  EXPECT_EQ(t.frees.size(), 0u);
}

TEST(Preload, ForkedChildNeverWritesIntoParentsTrace) {
  ProgRun r = run("prog_lifecycle", {"fork"});
  ASSERT_EQ(r.status, 0);
  ASSERT_EQ(r.traces.size(), 1u) << "the child never touched CUDA: it has no file";
  std::uint32_t parent_pid = 0;
  for (auto& path : r.traces) {
    TraceFile t = load_trace(path);
    expect_well_formed(t);
    if (t.allocs.size() == 3u) {
      parent_pid = t.process.pid;
      EXPECT_EQ(t.frees.size(), 3u);
    } else {
      EXPECT_EQ(t.allocs.size(), 0u) << "child trace " << path << " holds the parent's events";
    }
  }
  EXPECT_NE(parent_pid, 0u);
  // Exactly one file holds the parent's process record.
  int parents = 0;
  for (auto& path : r.traces) parents += load_trace(path).process.pid == parent_pid;
  EXPECT_EQ(parents, 1);
}

TEST(Preload, SigkillLeavesAReadableTrace) {
  ProgRun r = run_with("prog_lifecycle", {"busy"}, {}, true, [](pid_t pid, int fd) {
    char c;
    std::string line;
    while (read(fd, &c, 1) == 1 && c != '\n') line += c;
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    kill(pid, SIGKILL);
  });
  EXPECT_EQ(r.status, 128 + SIGKILL);
  ASSERT_EQ(r.traces.size(), 1u);
  TraceFile t = load_trace(r.traces[0]);
  expect_well_formed(t);
  EXPECT_FALSE(t.has_end);
  // "ready" came after 1000 pairs and at least 300 ms (> the 100 ms flush bound) passed.
  EXPECT_GE(t.count_allocs(AllocKind::device_pooled), 1000u);
}

TEST(Preload, OutputPatternAndDisable) {
  ProgRun r = run("prog_lifecycle", {"live"}, {});
  ASSERT_EQ(r.traces.size(), 1u);
  std::string dir = make_dir();
  ProgRun named = run("prog_lifecycle", {"live"}, {"GPUHEAP_OUTPUT=" + dir + "/%n-%p.trace"});
  auto files = traces_in(dir);
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(files[0].find("prog_lifecycle-"), std::string::npos);
  std::string dir2 = make_dir();
  run("prog_lifecycle", {"live"}, {"GPUHEAP_DISABLE=1", "GPUHEAP_OUTPUT=" + dir2 + "/x.trace"});
  EXPECT_TRUE(traces_in(dir2).empty());
}
