// GPUHEAP_* values as the preloaded library reads them at load (preload/core/options.h): the
// spellings every boolean accepts, and one warning for an invalid value.
#include <gtest/gtest.h>

#include <string>

#include "tests/preload/run_prog.h"
#include "tests/preload/trace_file.h"

using namespace gpuheap::test;

namespace {

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST(PreloadOptions, StacksOffRecordsNoStacks) {
  for (const char* off : {"GPUHEAP_STACKS=off", "GPUHEAP_STACKS=FALSE", "GPUHEAP_STACKS=no"}) {
    ProgRun r = run("prog_api", {}, {off});
    ASSERT_EQ(r.status, 0) << off << r.out;
    ASSERT_EQ(r.traces.size(), 1u) << off;
    TraceFile t = load_trace(r.traces[0]);
    EXPECT_TRUE(t.ok);
    EXPECT_FALSE(t.allocs.empty());
    EXPECT_TRUE(t.stack_ids.empty()) << off;
    for (auto& a : t.allocs) EXPECT_EQ(a.stack, 0u) << off;
    EXPECT_EQ(r.err.find("gpuheap: GPUHEAP_"), std::string::npos) << r.err;
  }
}

TEST(PreloadOptions, InvalidValueWarnsOnceAndUsesTheDefault) {
  ProgRun r = run("prog_api", {}, {"GPUHEAP_STACKS=maybe"});
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(count(r.err, "gpuheap: "), 1u) << r.err;
  EXPECT_EQ(count(r.err, "GPUHEAP_STACKS=\"maybe\""), 1u) << r.err;
  EXPECT_EQ(count(r.err, "using the default 1"), 1u) << r.err;
  ASSERT_EQ(r.traces.size(), 1u);
  TraceFile t = load_trace(r.traces[0]);
  EXPECT_FALSE(t.stack_ids.empty());  // the default: stacks on
}

TEST(PreloadOptions, QuietAcceptsEveryBooleanSpelling) {
  ProgRun loud = run("prog_api", {}, {"GPUHEAP_QUIET=off"});
  ASSERT_EQ(loud.status, 0);
  EXPECT_EQ(count(loud.err, "tracing to"), 1u) << loud.err;
  ProgRun quiet = run("prog_api", {}, {"GPUHEAP_QUIET=yes"});
  ASSERT_EQ(quiet.status, 0);
  EXPECT_EQ(quiet.err.find("tracing to"), std::string::npos) << quiet.err;
}
