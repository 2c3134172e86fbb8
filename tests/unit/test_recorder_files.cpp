// The trace file's life: created at the first event, not at start (a session without
// events leaves no file and announces none), opening records first even when threads race
// to that event, and the path a start would have used. Links gpuheap_recorder_core.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "test_recorder_util.h"

using namespace rec_test;
namespace d = gpuheap::preload;

TEST(Recorder, StartCreatesNoFileBeforeTheFirstEvent) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  EXPECT_TRUE(d::recorder_active());
  EXPECT_STREQ(d::recorder_path(), "");
  d::note_modules_changed();  // loading a library is not an event
  d::recorder_flush();
  EXPECT_TRUE(dir.files().empty());
  d::recorder_stop(f::EndReason::stopped);
  EXPECT_FALSE(d::recorder_active());
  EXPECT_TRUE(dir.files().empty()) << "a session without events left a file";
  EXPECT_STREQ(d::recorder_path(), "");
}

TEST(Recorder, FirstEventWritesProcessAndModuleRecords) {
  TempDir dir;
  use_dir(dir);
  std::uint64_t before_start = d::now_ns();
  ASSERT_TRUE(start_recorder());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::uint64_t before_event = d::now_ns();
  d::record(alloc_rec(1));
  std::string path = d::recorder_path();
  EXPECT_EQ(path, dir.path + "/t." + std::to_string(getpid()) + ".trace");
  d::recorder_stop(f::EndReason::stopped);
  EXPECT_FALSE(d::recorder_active());
  Trace t = read_trace(path);
  ASSERT_EQ(t.header, f::HeaderStatus::ok);
  ASSERT_GE(t.records.size(), 5u);
  const auto& p = t.records[0];
  ASSERT_EQ(p.type, f::RecordType::process);
  EXPECT_EQ(p.process.pid, static_cast<std::uint32_t>(getpid()));
  EXPECT_EQ(p.process.ppid, static_cast<std::uint32_t>(getppid()));
  // The process record describes the start of tracing, not the first event.
  EXPECT_GE(p.process.mono_ns, before_start);
  EXPECT_LT(p.process.mono_ns, before_event);
  EXPECT_GT(p.process.wall_ns, 1'600'000'000ull * 1'000'000'000ull);
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe);
  ASSERT_GT(n, 0);
  EXPECT_EQ(p.process.exe, std::string_view(exe, n));
  EXPECT_NE(p.process.cmdline.find("test_recorder"), std::string_view::npos);
  EXPECT_NE(p.process.cmdline.back(), '\0');
  EXPECT_FALSE(p.process.version.empty());
  char host[256];
  gethostname(host, sizeof host);
  EXPECT_EQ(p.process.hostname, host);
  // Modules: the test program itself (resolved path, contains our code, has a build id)
  // and libc.
  bool main_seen = false, libc_seen = false;
  auto code = reinterpret_cast<std::uint64_t>(&capture_here);
  for (auto& r : t.records) {
    if (r.type != f::RecordType::module) continue;
    EXPECT_LT(r.module.lo, r.module.hi);
    if (r.module.path == std::string_view(exe, n)) {
      main_seen = true;
      EXPECT_TRUE(r.module.lo <= code && code < r.module.hi);
      EXPECT_GE(r.module.build_id.size(), 8u);
    }
    if (r.module.path.find("libc.so") != std::string_view::npos) libc_seen = true;
  }
  EXPECT_TRUE(main_seen);
  EXPECT_TRUE(libc_seen);
  // Opening records (process, modules), then the event's thread and the event itself.
  std::size_t first_other = 1;
  while (first_other < t.records.size() && t.records[first_other].type == f::RecordType::module) ++first_other;
  ASSERT_LT(first_other + 2, t.records.size());
  EXPECT_EQ(t.records[first_other].type, f::RecordType::thread);
  EXPECT_EQ(t.records[first_other + 1].type, f::RecordType::alloc);
  EXPECT_EQ(t.count(f::RecordType::alloc), 1u);
  auto& end = t.records.back();
  ASSERT_EQ(end.type, f::RecordType::end);
  EXPECT_EQ(end.end.reason, f::EndReason::stopped);
  EXPECT_EQ(end.end.records, t.records.size() - 1);
  EXPECT_EQ(t.tail_bytes, 0u);
  // Records after stop are dropped and counted.
  d::record(alloc_rec(1));
  EXPECT_EQ(d::recorder_counters().dropped, 1u);
}

TEST(Recorder, FileGoesWhereTheStartWouldHavePutIt) {
  // A relative GPUHEAP_OUTPUT is resolved against the working directory at start, even
  // when the program changes directory before its first event.
  TempDir dir, elsewhere;
  use_dir(dir);
  setenv("GPUHEAP_OUTPUT", "rel.%p.trace", 1);
  char old_cwd[4096];
  ASSERT_NE(getcwd(old_cwd, sizeof old_cwd), nullptr);
  ASSERT_EQ(chdir(dir.path.c_str()), 0);
  bool ok = start_recorder();
  int moved = chdir(elsewhere.path.c_str());
  d::record(alloc_rec(1));
  std::string path = d::recorder_path();
  d::recorder_stop(f::EndReason::stopped);
  ASSERT_EQ(chdir(old_cwd), 0);
  ASSERT_TRUE(ok);
  ASSERT_EQ(moved, 0);
  EXPECT_EQ(path, dir.path + "/rel." + std::to_string(getpid()) + ".trace");
  EXPECT_EQ(read_trace(path).count(f::RecordType::alloc), 1u);
  EXPECT_TRUE(elsewhere.files().empty());
}

TEST(Recorder, ThreadsRacingToTheFirstEventFindProcessFirst) {
  // Eight threads make the first event at once: one creates the file, the others wait, and
  // nothing of theirs comes before the opening records (process, then modules).
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  constexpr int kThreads = 8, kPerThread = 200;
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([t, &ready] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      for (int i = 0; i < kPerThread; ++i) d::record(alloc_rec((std::uint64_t(t) << 32) | i));
    });
  for (auto& th : ts) th.join();
  d::recorder_stop(f::EndReason::stopped);
  EXPECT_EQ(dir.files().size(), 1u);
  Trace t = read_trace(d::recorder_path());
  ASSERT_FALSE(t.records.empty());
  EXPECT_EQ(t.records[0].type, f::RecordType::process);
  EXPECT_EQ(t.count(f::RecordType::process), 1u);
  std::size_t i = 1;
  while (i < t.records.size() && t.records[i].type == f::RecordType::module) ++i;
  EXPECT_GT(i, 2u) << "no opening module records";
  for (; i < t.records.size(); ++i)
    EXPECT_NE(t.records[i].type, f::RecordType::module) << "module record " << i << " after an event";
  EXPECT_EQ(t.count(f::RecordType::alloc), std::size_t{kThreads} * kPerThread);
}

TEST(Recorder, AnnouncesPathOnStderrAndInThePathFile) {
  TempDir dir;
  use_dir(dir);
  unsetenv("GPUHEAP_QUIET");
  std::string list = dir.path + "/paths.txt";
  std::ofstream(list).flush();  // the recorder appends, never creates (outpath.h)
  setenv("GPUHEAP_PATH_FILE", list.c_str(), 1);
  CaptureStderr err(dir);
  ASSERT_TRUE(start_recorder());  // a session without events: no file, nothing announced
  d::recorder_stop(f::EndReason::stopped);
  ASSERT_TRUE(start_recorder());
  d::record(alloc_rec(1));
  std::string path = d::recorder_path();
  d::recorder_stop(f::EndReason::stopped);
  ASSERT_TRUE(start_recorder());  // a second file: the same name gets a suffix
  d::record(alloc_rec(1));
  std::string path2 = d::recorder_path();
  d::recorder_stop(f::EndReason::stopped);
  err.restore();
  unsetenv("GPUHEAP_PATH_FILE");
  EXPECT_EQ(path[0], '/');
  EXPECT_EQ(path2, dir.path + "/t." + std::to_string(getpid()) + ".1.trace");
  EXPECT_EQ(err.text(), "gpuheap: tracing to " + path + "\ngpuheap: tracing to " + path2 + "\n");
  std::ifstream in(list);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_EQ(ss.str(), path + "\n" + path2 + "\n");
}
