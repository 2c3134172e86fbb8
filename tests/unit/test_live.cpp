// analyzer/live: the follower reads a trace while it is written (the preload's windows:
// data, then zeros up to the window's end; a frame's type byte stored last), never takes the
// zeros or a half-written frame for records, never calls an unfinished trace ended, and once
// the trace ends reports what `gpuheap summary` reports for the same file.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "analyzer/live/follow.h"
#include "analyzer/live/job.h"
#include "analyzer/model/analysis.h"
#include "tests/unit/test_analyzer_util.h"

using namespace gpuheap;
using gpuheap::test::TraceBuilder;

namespace {

// The file as the preload leaves it mid-write: `bytes` of data, then zeros to `size`.
void write_window(const std::string& path, const std::vector<unsigned char>& data, std::size_t bytes,
                  std::size_t size) {
  std::vector<unsigned char> w(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(bytes));
  w.resize(std::max(size, bytes), 0);
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, w.data(), w.size(), 0), static_cast<ssize_t>(w.size()));
  ::close(fd);
}

TraceBuilder growing_trace(std::vector<std::size_t>* marks) {
  TraceBuilder b;
  b.segment(0x10000000, 64 << 20, false);
  for (std::uint64_t i = 1; i <= 4; ++i) {
    marks->push_back(b.data.size());  // before step i
    b.put(format::PhaseRecord{b.tick(), 1, format::PhaseOp::push, format::PhaseSource::api, "step"});
    b.alloc(0x10000000 + ((i - 1) << 22), i << 20, i << 20);
    b.put(format::PhaseRecord{b.tick(), 1, format::PhaseOp::pop, format::PhaseSource::api, "step"});
  }
  marks->push_back(b.data.size());  // before the end record
  b.end();
  return b;
}

}  // namespace

TEST(LiveFollow, PartialFramesAndZeroTailAreWaitedFor) {
  std::vector<std::size_t> marks;
  TraceBuilder b = growing_trace(&marks);
  const std::string path = TraceBuilder::dir() + "/live_partial.trace";
  ::unlink(path.c_str());
  // Two steps written, the file cut 3 bytes into the third's first frame (a window's end).
  write_window(path, b.data, marks[2] + 3, marks[2] + 3);
  live::TraceFollower f(path);
  f.poll();
  EXPECT_FALSE(f.ended());
  EXPECT_EQ(f.offset(), marks[2]);
  ASSERT_EQ(f.model().devices.size(), 1u);
  EXPECT_EQ(f.model().devices[0].stat[kRequestedBytes][kAllPools].current, (1 + 2) << 20);
  EXPECT_EQ(f.steps().step().second, 2u);
  // The third step's frames copied but the first one's type byte not yet stored (the
  // preload stores it last), zeros after: still waiting at the same offset.
  std::vector<unsigned char> copying = b.data;
  copying[marks[2]] = 0;
  write_window(path, copying, marks[3], marks[3] + 4096);
  f.poll();
  EXPECT_EQ(f.offset(), marks[2]);
  EXPECT_FALSE(f.ended());
  EXPECT_EQ(f.model().devices[0].stat[kRequestedBytes][kAllPools].current, (1 + 2) << 20);
  // Everything but the end record: still not ended.
  write_window(path, b.data, marks[4], marks[4] + 100);
  f.poll();
  EXPECT_FALSE(f.ended());
  EXPECT_EQ(f.model().devices[0].stat[kRequestedBytes][kAllPools].current, (1 + 2 + 3 + 4) << 20);
  EXPECT_EQ(f.steps().step().second, 4u);
  // The end record: ended, and the figures are those of the whole file read at once.
  write_window(path, b.data, b.data.size(), b.data.size());
  f.poll();
  ASSERT_TRUE(f.has_end());
  f.finish();
  AnalyzeOptions o;
  o.progress = false;
  Analysis a = analyze({path}, o);
  const auto& want = a.traces[0]->devices[0].stat[kRequestedBytes][kAllPools];
  const auto& got = f.model().devices[0].stat[kRequestedBytes][kAllPools];
  EXPECT_EQ(got.current, want.current);
  EXPECT_EQ(got.peak, want.peak);
  EXPECT_EQ(f.model().leaked_bytes, a.traces[0]->leaked_bytes);
}

// Another file renamed over the path that no snapshot heads (a trace rewritten under its name,
// another job's trace) is no rolling window's next segment: the follower stays on the file it
// has open, which goes on to its end, and never counts a record twice.
TEST(LiveFollow, AFileRenamedOverThePathThatIsNoSegmentIsNotFollowed) {
  std::vector<std::size_t> marks;
  TraceBuilder b = growing_trace(&marks);
  const std::string path = TraceBuilder::dir() + "/live_renamed.trace", other = path + ".other";
  ::unlink(path.c_str());
  write_window(path, b.data, marks[2], marks[2] + 4096);
  const int held = ::open(path.c_str(), O_WRONLY);  // the writer's descriptor: the file lives on
  ASSERT_GE(held, 0);
  live::TraceFollower f(path);
  f.poll();
  EXPECT_EQ(f.model().devices[0].stat[kRequestedBytes][kAllPools].current, (1 + 2) << 20);
  ::unlink(other.c_str());
  write_window(other, b.data, b.data.size(), b.data.size());  // a whole trace, but no segment
  ASSERT_EQ(::rename(other.c_str(), path.c_str()), 0);
  f.poll();
  EXPECT_EQ(f.rolls(), 0u);
  EXPECT_FALSE(f.ended());
  EXPECT_EQ(f.model().devices[0].stat[kRequestedBytes][kAllPools].current, (1 + 2) << 20);
  // The rest written to the file the follower has open: read from there, once.
  ASSERT_EQ(::pwrite(held, b.data.data() + marks[2], b.data.size() - marks[2], static_cast<off_t>(marks[2])),
            static_cast<ssize_t>(b.data.size() - marks[2]));
  ::close(held);
  f.poll();
  ASSERT_TRUE(f.has_end());
  EXPECT_EQ(f.rolls(), 0u);
  EXPECT_EQ(f.model().devices[0].stat[kRequestedBytes][kAllPools].current, (1 + 2 + 3 + 4) << 20);
  EXPECT_EQ(f.steps().step().second, 4u);
  write_window(other, b.data, b.data.size(), b.data.size());
  live::TraceFollower whole(other);
  whole.poll();
  EXPECT_EQ(f.records(), whole.records());
  ::unlink(other.c_str());
}

// A process gone without an end record: what it wrote is all there is; the follower finishes
// it as an incomplete trace and never reports an end record.
TEST(LiveFollow, GoneWithoutEndIsNotAnEnd) {
  std::vector<std::size_t> marks;
  TraceBuilder b = growing_trace(&marks);
  const std::string path = TraceBuilder::dir() + "/live_gone.trace";
  ::unlink(path.c_str());
  std::vector<unsigned char> killed = b.data;  // killed while copying the fourth step's first frame
  killed[marks[3]] = 0;
  write_window(path, killed, marks[3] + 5, marks[3] + 64);
  live::TraceFollower f(path);
  f.poll();
  EXPECT_FALSE(f.ended());
  f.mark_gone();
  f.finish();
  EXPECT_TRUE(f.ended());
  EXPECT_FALSE(f.has_end());
  EXPECT_TRUE(f.gone());
  EXPECT_EQ(f.model().devices[0].stat[kRequestedBytes][kAllPools].current, (1 + 2 + 3) << 20);
}

// A refresh reads only what was appended: a second poll of an unchanged file reads nothing
// again, and an idle poll of a file with a zero tail reads one page of it.
TEST(LiveFollow, PollReadsOnlyWhatWasAppended) {
  std::vector<std::size_t> marks;
  TraceBuilder b = growing_trace(&marks);
  const std::string path = TraceBuilder::dir() + "/live_cost.trace";
  ::unlink(path.c_str());
  write_window(path, b.data, marks[4], marks[4]);
  live::TraceFollower f(path);
  f.poll();
  const std::uint64_t first = f.bytes_read();
  EXPECT_EQ(first, marks[4]);
  f.poll();
  EXPECT_EQ(f.bytes_read(), first);
  // With the preload's zeroed space after the data (up to 4 MiB): the poll that finds the
  // zeros reads at most a chunk of them, an idle poll after it one page.
  const std::string windowed = TraceBuilder::dir() + "/live_cost_window.trace";
  ::unlink(windowed.c_str());
  write_window(windowed, b.data, marks[4], marks[4] + (4u << 20));
  live::TraceFollower g(windowed);
  g.poll();
  const std::uint64_t busy = g.bytes_read();
  EXPECT_LE(busy, marks[4] + (64u << 10));
  for (int i = 0; i < 10; ++i) g.poll();
  EXPECT_LE(g.bytes_read() - busy, 10u * 4096);
  EXPECT_EQ(g.offset(), marks[4]);
  // Data appended after idle polls is read whole by the next poll (the page, then chunks).
  write_window(windowed, b.data, b.data.size(), marks[4] + (4u << 20));
  g.poll();
  EXPECT_TRUE(g.has_end());
}

// A finished trace longer than one read is read whole by one poll, wherever the reads'
// boundaries fall in its frames (a boundary inside a frame's 5-byte header once stopped the
// poll there: `top --once` and the last refresh after a process ended showed part of it).
TEST(LiveFollow, OnePollReadsAFinishedTraceWhateverTheAlignment) {
  for (std::size_t shift = 0; shift < 48; ++shift) {
    TraceBuilder b;
    b.put(
        format::PhaseRecord{b.tick(), 1, format::PhaseOp::mark, format::PhaseSource::api, std::string(shift + 1, 'x')});
    b.segment(0x10000000, 64 << 20, false);
    std::uint64_t n = 0;
    for (; b.data.size() < (200u << 10); ++n) {
      b.alloc(0x10000000 + (n % 64) * 4096, 100, 512);
      b.free(0x10000000 + (n % 64) * 4096);
      b.completed(0x10000000 + (n % 64) * 4096);
    }
    b.end();
    const std::string path = b.write("live_align.trace");
    live::TraceFollower f(path);
    f.poll();
    ASSERT_TRUE(f.has_end()) << "shift " << shift << ": stopped at " << f.offset() << " of " << b.data.size();
    EXPECT_EQ(f.offset(), b.data.size());
    EXPECT_EQ(f.records(), 3 * n + 5) << "header records: process, device, mark, segment; end";
  }
}

TEST(LiveGroup, SitesMergeByKeyAndSort) {
  std::vector<live::SiteNow> s = {{1, "f (a.py:1)", "f", 100, 1, 100},
                                  {2, "f (a.py:1)", "f", 50, 2, -10},
                                  {3, "g (a.py:9)", "g", 120, 1, 0},
                                  {4, "f (a.py:2)", "f", 0, 0, 0}};
  auto by_bytes = live::group_sites(s, live::Group::line, live::Sort::bytes, 0);
  ASSERT_EQ(by_bytes.size(), 2u);  // the site with nothing live and no growth is left out
  EXPECT_EQ(by_bytes[0].line, "f (a.py:1)");
  EXPECT_EQ(by_bytes[0].bytes, 150u);
  EXPECT_EQ(by_bytes[0].count, 3u);
  EXPECT_EQ(by_bytes[0].growth, 90);
  auto by_count = live::group_sites(s, live::Group::function, live::Sort::growth, 1);
  ASSERT_EQ(by_count.size(), 1u);
  EXPECT_EQ(by_count[0].function, "f");
}
