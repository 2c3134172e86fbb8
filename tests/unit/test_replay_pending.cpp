// gpuheap replay: the fence of a pooled free waits in the freed address's live-map entry
// until the trace's free_completed for that address (analyzer/replay/replay.cpp). These traces
// allocate the address again before its free_completed (only a racing or hostile program's
// trace does): the waiting fence must still complete on that free_completed, unless a newer
// free of the same address replaced it, as it always has.
#include <gtest/gtest.h>

#include "analyzer/replay/replay.h"
#include "tests/unit/test_analyzer_util.h"

using namespace gpuheap;
using gpuheap::test::TraceBuilder;

namespace {
constexpr std::uint64_t KiB = 1024, MiB = 1024 * 1024;
constexpr std::uint64_t kA = 0x7f0000000000, kB = 0x7f0010000000, kX = 0x7f0020000000;

ReplayDevice replay_one(const TraceBuilder& b, const std::string& name) {
  ReplayOptions o;
  o.policy = parse_policy("gpuheap");
  ReplayResult r = replay_trace(b.write(name), o);
  EXPECT_EQ(r.devices.size(), 1u);
  EXPECT_EQ(r.unmatched_frees, 0u);
  return r.devices.at(0);
}

// One 2 MiB small-pool segment: A [0, 1 MiB), B [1, 1.5), free [1.5, 2). A is freed, and its
// address allocated again (512 KiB: served at [1.5, 2), A's block still pending) before its
// free_completed arrives. B is freed and completed. Then 19.5 MiB takes a 20 MiB segment of
// its own (nothing of it left free): the new reserved peak, where the largest free block
// shows which fences completed.
TEST(ReplayPending, AFenceStillCompletesWhenItsAddressWasAllocatedAgain) {
  TraceBuilder b;
  b.alloc(kA, MiB, MiB);
  b.alloc(kB, 512 * KiB, 512 * KiB);
  b.free(kA);
  b.alloc(kA, 512 * KiB, 512 * KiB);
  b.completed(kA);  // the first free's
  b.free(kB);
  b.completed(kB);
  b.alloc(kX, 19 * MiB + 512 * KiB, 20 * MiB);
  b.end();
  ReplayDevice d = replay_one(b, "realloc.trace");
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>(22 * MiB));
  // A's first block and B's completed and coalesced: [0, 1.5 MiB) free beside the live 512 KiB.
  EXPECT_EQ(d.largest_free_at_peak, 1536 * KiB);
  EXPECT_EQ(d.non_releasable_at_peak, 1536 * KiB);
  EXPECT_EQ(d.segments_at_peak, 2u);
}

// As above, but the second block at A is freed too before the completion arrives: that
// completion is the second free's, and the first free's fence, older, never completes, so
// nothing in the small segment is reclaimed (fences complete oldest first). A is then
// allocated a third time (20 MiB: a segment of its own, no wait for the pending bytes) and a
// stray completion of A comes: it must not complete the replaced fence.
TEST(ReplayPending, ANewerFreeOfTheAddressReplacesTheWaitingFence) {
  TraceBuilder b;
  b.alloc(kA, MiB, MiB);
  b.alloc(kB, 512 * KiB, 512 * KiB);
  b.free(kA);
  b.alloc(kA, 512 * KiB, 512 * KiB);
  b.free(kA);
  b.completed(kA);  // the second free's
  b.alloc(kA, 20 * MiB, 20 * MiB);
  b.completed(kA);  // stray: A is live
  b.free(kB);
  b.completed(kB);
  b.alloc(kX, 19 * MiB + 512 * KiB, 20 * MiB);
  b.end();
  ReplayDevice d = replay_one(b, "refree.trace");
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>(42 * MiB));
  EXPECT_EQ(d.largest_free_at_peak, 0u);
  EXPECT_EQ(d.non_releasable_at_peak, 0u);
  EXPECT_EQ(d.segments_at_peak, 3u);
}

// The block at A's address the second time is a pass-through one (its cudaFree synchronized,
// no free_completed of its own): its free hands the waiting fence of the first free back,
// and the completion that follows completes it.
TEST(ReplayPending, APassThroughFreeLeavesTheWaitingFenceInPlace) {
  TraceBuilder b;
  b.alloc(kA, MiB, MiB);
  b.alloc(kB, 512 * KiB, 512 * KiB);
  b.free(kA);
  b.alloc(kA, 512 * KiB, 512 * KiB, 0, format::AllocKind::device_passthrough);
  b.free(kA, format::AllocKind::device_passthrough);
  b.completed(kA);  // the first free's
  b.free(kB);
  b.completed(kB);
  b.alloc(kX, 19 * MiB + 512 * KiB, 20 * MiB);
  b.end();
  ReplayDevice d = replay_one(b, "passthrough.trace");
  EXPECT_EQ(d.reserved.peak, static_cast<std::int64_t>(22 * MiB));
  EXPECT_EQ(d.largest_free_at_peak, 2 * MiB);  // every block of the small segment came back
}

// Completions of addresses that have no pending free (a torch or none replay, a damaged
// trace) are ignored, and a free of an address whose free is still pending is unmatched.
TEST(ReplayPending, StrayCompletionsAndFreesOfPendingAddressesChangeNothing) {
  TraceBuilder b;
  b.completed(kA);
  b.alloc(kA, MiB, MiB);
  b.completed(kA);  // live, not pending
  b.free(kA);
  b.free(kA);  // pending: unmatched
  b.completed(kA);
  b.completed(kA);
  b.alloc(kB, MiB, MiB);  // reuses A's completed block
  b.end();
  ReplayOptions o;
  o.policy = parse_policy("gpuheap");
  ReplayResult r = replay_trace(b.write("stray.trace"), o);
  EXPECT_EQ(r.unmatched_frees, 1u);
  EXPECT_EQ(r.devices.at(0).reserved.peak, static_cast<std::int64_t>(2 * MiB));
  EXPECT_EQ(r.devices.at(0).allocated.current, static_cast<std::int64_t>(MiB));
}

}  // namespace
