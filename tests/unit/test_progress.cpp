// The progress line: its text, when it is drawn (terminal, delay, rate limit, --quiet), and
// that it is erased at the end. Time is passed in, so nothing here sleeps.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "analyzer/base/progress.h"

using namespace gpuheap;

namespace {
// A FILE* whose contents can be read back (open_memstream).
struct Capture {
  char* buf = nullptr;
  std::size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  ~Capture() {
    if (f) std::fclose(f);
    std::free(buf);
  }
  std::string text() {
    std::fflush(f);
    return std::string(buf, len);
  }
};
constexpr std::uint64_t GiB = 1ull << 30, MiB = 1ull << 20;
}  // namespace

TEST(Progress, Bytes) {
  EXPECT_EQ(progress_bytes(0), "0 B");
  EXPECT_EQ(progress_bytes(1023), "1023 B");
  EXPECT_EQ(progress_bytes(1024), "1.0 KiB");
  EXPECT_EQ(progress_bytes(340 * MiB), "340.0 MiB");
  EXPECT_EQ(progress_bytes(1024 * MiB - 1), "1.0 GiB");  // never "1024.0 MiB"
  EXPECT_EQ(progress_bytes(GiB + GiB / 5), "1.2 GiB");
  EXPECT_EQ(progress_bytes(~0ull), "16.0 EiB");
}

TEST(Progress, Rate) {
  EXPECT_EQ(progress_rate(0), "0");
  EXPECT_EQ(progress_rate(-1), "0");
  EXPECT_EQ(progress_rate(12.4), "12");
  EXPECT_EQ(progress_rate(850200), "850.2 k");
  EXPECT_EQ(progress_rate(21.34e6), "21.3 M");
  EXPECT_EQ(progress_rate(999999), "1.0 M");
}

TEST(Progress, Line) {
  EXPECT_EQ(progress_line("run.trace", GiB + GiB / 5, 3 * GiB + 2 * GiB / 5, 21.3e6),
            "gpuheap: reading run.trace: 1.2 GiB / 3.4 GiB (35%), 21.3 M events/s");
  EXPECT_EQ(progress_line("2 traces", 0, 100, 0), "gpuheap: reading 2 traces: 0 B / 100 B (0%), 0 events/s");
  EXPECT_EQ(progress_line("t", 200, 100, 5), "gpuheap: reading t: 100 B / 100 B (100%), 5 events/s");  // clamped
  EXPECT_EQ(progress_line("t", 5 * MiB, 0, 1e6), "gpuheap: reading t: 5.0 MiB, 1.0 M events/s");       // size unknown
}

TEST(Progress, WhenDue) {
  // Off with --quiet, off when stderr is not a terminal, whatever the time.
  EXPECT_FALSE(progress_due(false, true, 10, -1));
  EXPECT_FALSE(progress_due(true, false, 10, -1));
  // Nothing in the first second.
  EXPECT_FALSE(progress_due(true, true, 0.0, -1));
  EXPECT_FALSE(progress_due(true, true, 0.99, -1));
  EXPECT_TRUE(progress_due(true, true, 1.0, -1));
  // At most 4 times a second after that.
  EXPECT_FALSE(progress_due(true, true, 1.2, 1.0));
  EXPECT_TRUE(progress_due(true, true, 1.25, 1.0));
  ProgressPolicy p{0.0, 1.0};
  EXPECT_TRUE(progress_due(true, true, 0.0, -1, p));
  EXPECT_FALSE(progress_due(true, true, 0.5, 0.0, p));
}

TEST(Progress, DrawsInPlaceAndErases) {
  Capture c;
  std::size_t first_width = 0;
  {
    Progress p("x.trace", 100 * MiB, true, c.f, /*tty=*/1);
    EXPECT_TRUE(p.active());
    p.update_at(10 * MiB, 1000000, 0.5);  // too early
    EXPECT_EQ(c.text(), "");
    p.update_at(25 * MiB, 2000000, 1.0);
    EXPECT_TRUE(p.shown());
    std::string first = "gpuheap: reading x.trace: 25.0 MiB / 100.0 MiB (25%), 2.0 M events/s";
    EXPECT_EQ(c.text(), "\r" + first);
    first_width = first.size();
    p.update_at(30 * MiB, 2100000, 1.1);  // within 250 ms of the last draw
    EXPECT_EQ(c.text(), "\r" + first);
    p.update_at(50 * MiB, 24, 2.0);  // a shorter line is padded over the longer one
    std::string second = "gpuheap: reading x.trace: 50.0 MiB / 100.0 MiB (50%), 12 events/s";
    ASSERT_LT(second.size(), first.size());
    EXPECT_EQ(c.text(), "\r" + first + "\r" + second + std::string(first.size() - second.size(), ' '));
  }  // the destructor erases the line: spaces over its full width, cursor back at column 0
  std::string t = c.text();
  std::string tail = "\r" + std::string(first_width, ' ') + "\r";
  ASSERT_GE(t.size(), tail.size());
  EXPECT_EQ(t.substr(t.size() - tail.size()), tail);
}

TEST(Progress, SilentWhenNotATerminalOrQuiet) {
  for (int variant = 0; variant < 2; ++variant) {
    Capture c;
    {
      Progress p("x", 100, /*enabled=*/variant == 0, c.f, /*tty=*/variant == 0 ? 0 : 1);
      EXPECT_FALSE(p.active());
      p.update(50, 10);
      p.update_at(50, 10, 5.0);
      EXPECT_FALSE(p.shown());
    }
    EXPECT_EQ(c.text(), "");
  }
  // A memstream is not a terminal: the default decision (isatty) says no.
  Capture c;
  Progress p("x", 100, true, c.f);
  EXPECT_FALSE(p.active());
}

TEST(Progress, NoEraseWithoutDraw) {
  Capture c;
  {
    Progress p("x", 100, true, c.f, 1);
    p.update_at(50, 10, 0.2);
    p.finish();
  }
  EXPECT_EQ(c.text(), "");
}
