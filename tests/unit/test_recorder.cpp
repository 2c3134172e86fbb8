// In-process recorder: completeness and order under concurrency, stacks, devices,
// modules, flush latency, I/O failure, fork and signals. Links the recorder sources
// directly (gpuheap_recorder_core); every test writes into its own temporary directory.
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "format/decode.h"
#include "preload/record/aggregate.h"
#include "preload/record/scratch.h"
#include "preload/record/sink.h"
#include "test_recorder_util.h"

using namespace rec_test;
namespace d = gpuheap::preload;

namespace {

#ifdef __SANITIZE_THREAD__
// Under TSan, libunwind's per-thread cache destructor (pthread TSD, uninstrumented) crashes
// TSan's runtime at thread exit; threads that unwound cannot exit. Not a recorder issue.
constexpr bool kThreadStacks = false;
#else
constexpr bool kThreadStacks = true;
#endif

__attribute__((noinline)) std::uint32_t capture_skip1() {
  std::uint32_t id = d::capture_stack(1);
  asm volatile("" ::: "memory");
  return id;
}
__attribute__((noinline)) std::uint32_t outer_of_skip1() {
  std::uint32_t id = capture_skip1();
  asm volatile("" ::: "memory");
  return id;
}
__attribute__((noinline)) std::uint32_t stack_at_depth(int n) {
  std::uint32_t id = n <= 0 ? d::capture_stack(0) : stack_at_depth(n - 1);
  asm volatile("" ::: "memory");
  return id;
}

const f::Record* find_stack(const Trace& t, std::uint32_t id) {
  for (auto& r : t.records)
    if (r.type == f::RecordType::stack && r.stack.id == id) return &r;
  return nullptr;
}

bool inside(std::uint64_t ip, const void* fn) {
  auto a = reinterpret_cast<std::uint64_t>(fn);
  return ip > a && ip < a + 512;
}

int count_lines_with(const std::string& text, const std::string& what) {
  int n = 0;
  for (std::size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + 1)) ++n;
  return n;
}

void expect_stack_ids_defined_before_use(const Trace& t) {
  std::set<std::uint32_t> defined;
  std::uint32_t next = 1;
  for (auto& r : t.records) {
    std::uint32_t used = 0;
    if (r.type == f::RecordType::stack) {
      EXPECT_EQ(r.stack.id, next++) << "stack ids are dense, from 1, each written once";
      defined.insert(r.stack.id);
    } else if (r.type == f::RecordType::alloc) {
      used = r.alloc.stack;
    } else if (r.type == f::RecordType::free) {
      used = r.free.stack;
    }
    if (used) ASSERT_TRUE(defined.count(used)) << "stack " << used << " used before its record";
  }
}

}  // namespace

TEST(Recorder, SixteenThreadsCompleteAndInPerThreadOrder) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  constexpr int kThreads = 16, kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < kPerThread; ++i) {
        // Every 50th event carries a stack; threads race to intern the same stacks.
        std::uint32_t st = kThreadStacks && i % 50 == 0 ? stack_at_depth(t % 4 + i % 3) : 0;
        std::uint64_t ptr = (static_cast<std::uint64_t>(t + 1) << 32) | static_cast<std::uint64_t>(i);
        if (i % 2 == 0) d::record(alloc_rec(ptr, st));
        else d::record(free_rec(ptr, st));
      }
    });
  }
  for (auto& th : threads) th.join();
  d::recorder_stop(f::EndReason::stopped);
  Trace t = read_trace(d::recorder_path());
  ASSERT_EQ(t.header, f::HeaderStatus::ok);
  EXPECT_EQ(t.last, f::FrameStatus::need_more);
  EXPECT_EQ(t.tail_bytes, 0u);
  std::vector<int> next(kThreads, 0);
  std::map<std::uint32_t, int> tid_thread;
  std::set<std::uint32_t> announced;
  std::size_t allocs = 0, frees = 0;
  for (auto& r : t.records) {
    if (r.type == f::RecordType::thread) announced.insert(r.thread.tid);
    if (r.type != f::RecordType::alloc && r.type != f::RecordType::free) continue;
    bool is_alloc = r.type == f::RecordType::alloc;
    std::uint64_t ptr = is_alloc ? r.alloc.ptr : r.free.ptr;
    std::uint32_t tid = is_alloc ? r.alloc.tid : r.free.tid;
    int th = static_cast<int>(ptr >> 32) - 1;
    int i = static_cast<int>(ptr & 0xffffffff);
    ASSERT_TRUE(th >= 0 && th < kThreads);
    ASSERT_EQ(i, next[th]) << "thread " << th << " out of order";
    ASSERT_EQ(is_alloc, i % 2 == 0);
    auto [it, fresh] = tid_thread.emplace(tid, th);
    ASSERT_EQ(it->second, th) << "one tid per thread";
    ASSERT_TRUE(announced.count(tid)) << "thread record precedes the thread's first event";
    ++next[th];
    (is_alloc ? allocs : frees) += 1;
  }
  for (int th = 0; th < kThreads; ++th) EXPECT_EQ(next[th], kPerThread) << th;
  EXPECT_EQ(allocs, kThreads * kPerThread / 2u);
  EXPECT_EQ(frees, kThreads * kPerThread / 2u);
  EXPECT_EQ(tid_thread.size(), static_cast<std::size_t>(kThreads));
  expect_stack_ids_defined_before_use(t);
  // 4 start depths x 3 offsets = depths 0..5 from the same call site: 6 distinct stacks.
  const std::size_t kStacks = kThreadStacks ? 6 : 0;
  EXPECT_EQ(t.count(f::RecordType::stack), kStacks);
  auto c = d::recorder_counters();
  EXPECT_EQ(c.records, t.records.size());
  EXPECT_EQ(c.bytes, t.data.size());
  EXPECT_EQ(c.dropped, 0u);
  EXPECT_EQ(c.stacks, kStacks);
}

TEST(Recorder, FreeOnOneThreadPrecedesReuseOnAnother) {
  // The analyzer replays address reuse: a free that happens-before another thread's alloc
  // of the same address must come first in the file.
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  constexpr int kRounds = 20000;
  std::atomic<int> freed{-1}, taken{-1};
  std::thread a([&] {
    for (int i = 0; i < kRounds; ++i) {
      while (taken.load(std::memory_order_acquire) != i - 1) std::this_thread::yield();
      d::record(free_rec(0x1000 + (i % 4)));
      freed.store(i, std::memory_order_release);  // "the pool hands the block over"
    }
  });
  std::thread b([&] {
    for (int i = 0; i < kRounds; ++i) {
      while (freed.load(std::memory_order_acquire) != i) std::this_thread::yield();
      d::record(alloc_rec(0x1000 + (i % 4)));
      taken.store(i, std::memory_order_release);
    }
  });
  a.join(), b.join();
  d::recorder_stop(f::EndReason::stopped);
  Trace t = read_trace(d::recorder_path());
  int frees = 0, allocs = 0;
  for (auto& r : t.records) {
    if (r.type == f::RecordType::free) ++frees;
    if (r.type == f::RecordType::alloc) {
      ++allocs;
      ASSERT_LE(allocs, frees) << "alloc of a reused address before the free that released it";
      ASSERT_EQ(r.alloc.ptr, 0x1000u + ((allocs - 1) % 4));
    }
  }
  EXPECT_EQ(allocs, kRounds);
}

TEST(Recorder, RecordsReachTheFileWithinTheFlushInterval) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  for (int i = 0; i < 10; ++i) d::record(alloc_rec(0x5000 + i));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  Trace t = read_trace(d::recorder_path());  // no stop, no flush: appends write the file
  EXPECT_EQ(t.count(f::RecordType::alloc), 10u);
  EXPECT_EQ(t.count(f::RecordType::end), 0u);
  // While tracing, the file ends with the unused part of its preallocated window: zeros only.
  EXPECT_EQ(t.last, f::FrameStatus::need_more);
  EXPECT_EQ(t.data.find_first_not_of('\0', t.data.size() - t.tail_bytes), std::string::npos);
  d::recorder_stop(f::EndReason::stopped);
}

TEST(Recorder, FlushWritesEverythingRecordedSoFar) {
  TempDir dir;
  use_dir(dir);
  setenv("GPUHEAP_FLUSH_MS", "60000", 1);  // the background thread ticks once a minute
  ASSERT_TRUE(start_recorder());
  for (int i = 0; i < 1000; ++i) d::record(alloc_rec(i));
  d::recorder_flush();
  Trace t = read_trace(d::recorder_path());
  EXPECT_EQ(t.count(f::RecordType::alloc), 1000u);
  d::recorder_stop(f::EndReason::stopped);
}

TEST(Recorder, StackStartsAtTheCallerAndIsInternedOnce) {
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  std::uint32_t ids[2];
  volatile int reps = 2;  // unknown trip count: one call site, not unrolled into two
  for (int k = 0; k < reps; ++k) ids[k] = capture_here();
  std::uint32_t a1 = ids[0], a2 = ids[1];
  std::uint32_t b = outer_of_skip1();
  ASSERT_NE(a1, 0u);
  EXPECT_EQ(a1, a2);
  EXPECT_NE(a1, b);
  d::record(alloc_rec(1, a1));
  d::recorder_stop(f::EndReason::stopped);
  Trace t = read_trace(d::recorder_path());
  EXPECT_EQ(t.count(f::RecordType::stack), 2u);
  const f::Record* sa = find_stack(t, a1);
  const f::Record* sb = find_stack(t, b);
  ASSERT_TRUE(sa && sb);
  ASSERT_GE(sa->stack.depth, 3);
  EXPECT_TRUE(inside(sa->stack.ip(0), reinterpret_cast<void*>(&capture_here)));
  // skip = 1 dropped capture_skip1: the innermost frame is its caller.
  EXPECT_TRUE(inside(sb->stack.ip(0), reinterpret_cast<void*>(&outer_of_skip1)));
  EXPECT_EQ(d::recorder_counters().stacks, 2u);
}

TEST(Recorder, StackDepthIsCapped) {
  TempDir dir;
  use_dir(dir);
  setenv("GPUHEAP_STACK_DEPTH", "5", 1);
  ASSERT_TRUE(start_recorder());
  std::uint32_t id = stack_at_depth(20);
  d::recorder_stop(f::EndReason::stopped);
  unsetenv("GPUHEAP_STACK_DEPTH");
  Trace t = read_trace(d::recorder_path());
  const f::Record* s = find_stack(t, id);
  ASSERT_TRUE(s);
  EXPECT_EQ(s->stack.depth, 5);
}

TEST(Recorder, StacksOffMeansNoStacks) {
  TempDir dir;
  use_dir(dir);
  setenv("GPUHEAP_STACKS", "0", 1);
  ASSERT_TRUE(start_recorder());
  EXPECT_EQ(capture_here(), 0u);
  d::record(alloc_rec(7, capture_here()));
  d::recorder_stop(f::EndReason::stopped);
  unsetenv("GPUHEAP_STACKS");
  Trace t = read_trace(d::recorder_path());
  EXPECT_EQ(t.count(f::RecordType::stack), 0u);
  ASSERT_EQ(t.count(f::RecordType::alloc), 1u);
  for (auto& r : t.records)
    if (r.type == f::RecordType::alloc) EXPECT_EQ(r.alloc.stack, 0u);
}

namespace {
bool fake_device_info(int device, char* name, std::size_t cap, std::uint64_t* total) {
  if (device == 3) return false;
  snprintf(name, cap, "Fake GPU %d", device);
  *total = static_cast<std::uint64_t>(device + 1) << 30;
  return true;
}
}  // namespace

TEST(Recorder, DeviceAnnouncedOncePerDevicePerFile) {
  TempDir dir;
  use_dir(dir);
  d::set_device_info_fn(fake_device_info);
  for (int session = 0; session < 2; ++session) {
    ASSERT_TRUE(start_recorder());
    std::vector<std::thread> ts;
    for (int k = 0; k < 4; ++k)
      ts.emplace_back([] {
        for (int dev : {0, 1, 0, 3, 1}) {
          d::ensure_device(dev);
          auto a = alloc_rec(dev);
          a.device = static_cast<std::int16_t>(dev);
          d::record(a);
        }
      });
    for (auto& th : ts) th.join();
    d::recorder_stop(f::EndReason::stopped);
    Trace t = read_trace(d::recorder_path());
    std::map<int, const f::DeviceRecord*> devs;
    for (auto& r : t.records) {
      if (r.type == f::RecordType::device) {
        EXPECT_FALSE(devs.count(r.device.device)) << "device " << r.device.device << " twice";
        devs[r.device.device] = &r.device;
      }
      if (r.type == f::RecordType::alloc) ASSERT_TRUE(devs.count(r.alloc.device)) << "event before its device";
    }
    ASSERT_EQ(devs.size(), 3u) << "session " << session;
    EXPECT_EQ(devs[1]->name, "Fake GPU 1");
    EXPECT_EQ(devs[1]->total_memory, 2ull << 30);
    EXPECT_EQ(devs[3]->name, "unknown");
    EXPECT_EQ(devs[3]->total_memory, 0u);
  }
  d::set_device_info_fn(nullptr);
}

TEST(Recorder, ModulesLoadedAndUnloadedLater) {
  TempDir dir;
  use_dir(dir);
  const char* lib = "libzstd.so.1";
  if (dlopen(lib, RTLD_NOW | RTLD_NOLOAD)) GTEST_SKIP() << lib << " already loaded";
  ASSERT_TRUE(start_recorder());
  d::record(alloc_rec(1));  // the first event creates the file (without lib)
  void* h = dlopen(lib, RTLD_NOW);
  if (!h) {
    d::recorder_stop(f::EndReason::stopped);
    GTEST_SKIP() << lib << " not installed";
  }
  d::note_modules_changed();
  d::note_modules_changed();  // nothing new: no duplicate records
  dlclose(h);
  d::note_modules_changed();
  d::recorder_stop(f::EndReason::stopped);
  Trace t = read_trace(d::recorder_path());
  int loaded = 0, unloaded = 0;
  std::uint64_t base = 0;
  for (auto& r : t.records) {
    if (r.type == f::RecordType::module && r.module.path.find("libzstd") != std::string_view::npos) {
      ++loaded, base = r.module.base;
      EXPECT_FALSE(r.module.build_id.empty());
    }
    if (r.type == f::RecordType::module_unload) {
      ++unloaded;
      EXPECT_EQ(r.module_unload.base, base);
    }
  }
  EXPECT_EQ(loaded, 1);
  EXPECT_EQ(unloaded, 1);
  // Loaded after the start but before the first event: among the opening modules.
  ASSERT_TRUE(start_recorder());
  h = dlopen(lib, RTLD_NOW);
  ASSERT_NE(h, nullptr);
  d::note_modules_changed();  // no file yet: nothing to write into
  d::record(alloc_rec(1));
  d::recorder_stop(f::EndReason::stopped);
  dlclose(h);
  Trace t2 = read_trace(d::recorder_path());
  loaded = 0;
  bool before_event = true;
  for (auto& r : t2.records) {
    if (r.type == f::RecordType::alloc) before_event = false;
    if (r.type == f::RecordType::module && r.module.path.find("libzstd") != std::string_view::npos)
      loaded += before_event ? 1 : 100;
  }
  EXPECT_EQ(loaded, 1) << "module loaded before the first event not among the opening records";
}

TEST(Recorder, UnwritableDirectoryWarnsOnceAndTheProgramContinues) {
  TempDir dir;
  use_dir(dir);
  setenv("GPUHEAP_OUTPUT", "/nonexistent-gpuheap-dir/x.%p.trace", 1);
  CaptureStderr err(dir);
  EXPECT_TRUE(start_recorder());  // the file is only created at the first event
  d::record(alloc_rec(0));
  EXPECT_FALSE(d::recorder_active());
  for (int i = 0; i < 100; ++i) d::record(alloc_rec(i, capture_here()));
  d::ensure_device(0);
  d::recorder_flush();
  d::recorder_stop(f::EndReason::stopped);
  err.restore();
  std::string text = err.text();
  EXPECT_EQ(count_lines_with(text, "gpuheap: "), 1) << text;
  EXPECT_NE(text.find("cannot create trace file /nonexistent-gpuheap-dir/x."), std::string::npos) << text;
  EXPECT_NE(text.find("No such file or directory"), std::string::npos) << text;
}

TEST(Recorder, FourThreadsThroughManyFileWindowsLoseNothing) {
  TempDir dir;
  use_dir(dir);
  setenv("GPUHEAP_BUFFER_MB", "2", 1);     // ignored since the sink maps the file
  setenv("GPUHEAP_FLUSH_MS", "60000", 1);  // only used-up windows wake the background thread
  ASSERT_TRUE(start_recorder());
  constexpr int kThreads = 4, kPerThread = 60000;  // ~14 MB: several 4 MiB windows
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([t] {
      for (int i = 0; i < kPerThread; ++i) d::record(alloc_rec((std::uint64_t(t) << 32) | i));
    });
  for (auto& th : ts) th.join();
  auto c = d::recorder_counters();
  d::recorder_stop(f::EndReason::stopped);
  Trace t = read_trace(d::recorder_path());
  EXPECT_EQ(t.count(f::RecordType::alloc), std::size_t{kThreads} * kPerThread);
  EXPECT_EQ(c.dropped, 0u);
  std::printf("[          ] windows mapped by appenders themselves: %llu, windows: %llu\n",
              static_cast<unsigned long long>(c.producer_waits), static_cast<unsigned long long>(c.writes));
}

TEST(Recorder, RecordsLongerThanTheSmallFirstWindowsFit) {
  // The first windows are 64 KiB (sink.cpp, window_len); a record of up to kMaxPayload must
  // still go in whole, wherever it starts, with small records before and after it.
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  d::record(alloc_rec(1));
  std::string cmd(900u << 10, 'x');
  std::vector<unsigned char> buf(cmd.size() + 256);
  f::ProcessRecord big{1, 1, 0, 0, "host", cmd, "v", "/exe"};
  std::size_t n = f::encode(buf.data(), buf.size(), big);
  ASSERT_GT(n, cmd.size());
  constexpr int kBig = 6;
  for (int i = 0; i < kBig; ++i) {
    for (int k = 0; k < 100 * i; ++k) d::record(alloc_rec(2 + k));  // moves where the next one starts
    EXPECT_TRUE(d::sink_append(buf.data(), n)) << i;
  }
  auto c = d::recorder_counters();
  d::recorder_stop(f::EndReason::stopped);
  Trace t = read_trace(d::recorder_path());
  EXPECT_EQ(t.last, f::FrameStatus::need_more);
  EXPECT_EQ(t.tail_bytes, 0u);
  EXPECT_EQ(t.count(f::RecordType::process), std::size_t{kBig} + 1);  // + the opening one
  EXPECT_EQ(t.count(f::RecordType::alloc), std::size_t{1 + 100 * (0 + 1 + 2 + 3 + 4 + 5)});
  EXPECT_EQ(t.count(f::RecordType::end), 1u);
  EXPECT_EQ(c.dropped, 0u);
}

namespace {
struct SmallThreadResult {
  std::uint32_t id = 0;
  bool recorded = false;
};
__attribute__((noinline)) void* small_thread_main(void* arg) {
  auto* r = static_cast<SmallThreadResult*>(arg);
  r->id = capture_here();  // the file's first event: its creation and a cold unwinder
  d::record(alloc_rec(42, r->id));
  r->recorded = true;
  asm volatile("" ::: "memory");
  return nullptr;
}
}  // namespace

// A thread with a PTHREAD_STACK_MIN (16 KiB) stack makes the file's first event: creating the
// trace and unwinding run on the thread's scratch stack (record/scratch.h), and the stack
// still reaches the thread's own frames through the switch.
TEST(Recorder, SmallThreadStackFirstEventKeepsItsStack) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "no stack switching under sanitizers: deep work needs room on the thread";
#endif
  TempDir dir;
  use_dir(dir);
  ASSERT_TRUE(start_recorder());
  SmallThreadResult r;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, PTHREAD_STACK_MIN), 0);
  pthread_t th;
  ASSERT_EQ(pthread_create(&th, &attr, small_thread_main, &r), 0);
  ASSERT_EQ(pthread_join(th, nullptr), 0);
  pthread_attr_destroy(&attr);
  d::recorder_stop(f::EndReason::stopped);
  ASSERT_TRUE(r.recorded);
  ASSERT_NE(r.id, 0u);
  Trace t = read_trace(d::recorder_path());
  EXPECT_EQ(t.count(f::RecordType::alloc), 1u);
  const f::Record* s = find_stack(t, r.id);
  ASSERT_TRUE(s);
  ASSERT_GE(s->stack.depth, 2);
  EXPECT_TRUE(inside(s->stack.ip(0), reinterpret_cast<void*>(&capture_here)));
  EXPECT_TRUE(inside(s->stack.ip(1), reinterpret_cast<void*>(&small_thread_main)));
  EXPECT_EQ(d::deep_refused_count(), 0u);
}

// The room left on a thread's stack (the fallback's test when there is no scratch stack):
// the main thread's from RLIMIT_STACK, another thread's from its bounds, less than its size.
TEST(Recorder, StackRoomKnowsTheThreadsBounds) {
  EXPECT_GE(d::stack_room(), d::kDeepMinRoom) << "the main thread (8 MiB unless limited)";
  // The thread's real stack size, read inside it: ThreadSanitizer enlarges the size asked for
  // (and keeps part of the stack for itself).
  struct Seen {
    std::size_t room = 0, size = 0;
  } seen;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 64u << 10), 0);
  pthread_t th;
  auto body = [](void* p) -> void* {
    auto* s = static_cast<Seen*>(p);
    s->room = d::stack_room();
    pthread_attr_t own;
    if (pthread_getattr_np(pthread_self(), &own) == 0) {
      pthread_attr_getstacksize(&own, &s->size);
      pthread_attr_destroy(&own);
    }
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&th, &attr, body, &seen), 0);
  ASSERT_EQ(pthread_join(th, nullptr), 0);
  pthread_attr_destroy(&attr);
  ASSERT_GE(seen.size, 64u << 10);
  EXPECT_GT(seen.room, 32u << 10);  // the frames above it take a few KiB at most
  EXPECT_LT(seen.room, seen.size);
}

// A roll copies the segment's tables from the extents the sink noted as it appended them
// (aggregate.h agg_on_record), never reading the events between them: a large segment rolls
// in the time of its tables, not of its events. Between the tables here lie bytes that are no
// records at all (zeros, where a pass over the segment would stop and fail): the copy is the
// table records, whole and in order, and an oom record is counted for the next snapshot.
TEST(RecorderAggregate, RollCopiesTheTableExtentsOnly) {
  namespace format = gpuheap::format;
  TempDir dir;
  const std::string path = dir.path + "/segment";
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  d::agg_reset();
  std::vector<unsigned char> file(format::kFileHeaderSize, 0), want;
  auto put = [&](const unsigned char* f, std::size_t n, bool table) {
    const std::uint64_t at = file.size();
    file.insert(file.end(), f, f + n);
    if (table) want.insert(want.end(), f, f + n);
    d::agg_on_record(f, n, at);
  };
  unsigned char buf[512];
  for (std::uint32_t tid : {7u, 8u})  // two adjacent: one extent
    put(buf, format::encode(buf, sizeof buf, format::ThreadRecord{tid, "worker"}), true);
  file.resize(file.size() + (1u << 20), 0);  // "events": nothing a reader could parse
  format::OomRecord oom;
  oom.device = 3;
  put(buf, format::encode(buf, sizeof buf, oom), false);
  file.resize(file.size() + 4096, 0);
  put(buf, format::encode(buf, sizeof buf, format::ThreadRecord{9, "late"}), true);
  ASSERT_EQ(pwrite(fd, file.data(), file.size(), 0), static_cast<ssize_t>(file.size()));

  struct Sink {
    std::vector<unsigned char> bytes;
    static bool put(void* ctx, const unsigned char* f, std::size_t n) {
      auto* s = static_cast<Sink*>(ctx);
      s->bytes.insert(s->bytes.end(), f, f + n);
      return true;
    }
  } out, snap;
  std::uint64_t records = 0;
  ASSERT_TRUE(d::agg_copy_tables(fd, Sink::put, &out, &records));
  EXPECT_EQ(records, 3u);
  EXPECT_EQ(out.bytes, want);

  // The snapshot carries the oom record's count on its device.
  ASSERT_TRUE(d::agg_write_snapshot(1, 1, Sink::put, &snap));
  std::uint64_t ooms = 0;
  format::Record r;
  for (std::size_t at = 0, used = 0; at < snap.bytes.size(); at += used) {
    ASSERT_EQ(format::decode_frame(snap.bytes.data() + at, snap.bytes.size() - at, r, &used, nullptr),
              format::FrameStatus::ok);
    if (r.type == format::RecordType::snapshot && r.snapshot.part == format::SnapshotPart::device &&
        r.snapshot.device == 3)
      ooms = r.snapshot.ooms;
  }
  EXPECT_EQ(ooms, 1u);

  // Published: the next segment's tables are its head, one extent from the file header on.
  d::agg_tables_moved(format::kFileHeaderSize + want.size(), records);
  std::vector<unsigned char> next(format::kFileHeaderSize, 0);
  next.insert(next.end(), want.begin(), want.end());
  ASSERT_EQ(pwrite(fd, next.data(), next.size(), 0), static_cast<ssize_t>(next.size()));
  Sink again;
  ASSERT_TRUE(d::agg_copy_tables(fd, Sink::put, &again, &records));
  EXPECT_EQ(records, 3u);
  EXPECT_EQ(again.bytes, want);
  close(fd);
  d::agg_reset();
}
