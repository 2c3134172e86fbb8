// Matching the sites of two runs by what survives an edit of the source: the function and
// file of every frame (the stack's shape), then the nearest lines. `diff` and `check
// --baseline` pair sites with it, so a line inserted above an allocation reads as the same
// site "moved", not as one site gone and a new one of the same size.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "analyzer/symbolize/symbolize.h"

namespace gpuheap {

// One frame whose line differs between the two sides of a pair (index into the frames).
struct LineMove {
  std::size_t frame = 0;
  int line_a = 0, line_b = 0;
};

// Pairs (index in a, index in b); one side is -1 for a site found only in the other run.
// The shape of a stack: function and file of each frame with a name or file, module+offset
// (or the address) of one without; equal shapes differ at most in their lines. Sites of one shape are paired in the order of their lines (outermost frame first), and
// when one side has more of them, the pairing that keeps that order and moves the lines
// least in total (sum of |line_b - line_a| over the frames) wins; ties go to the earlier
// site. Deterministic: the result depends only on the two lists' contents, not on their order.
struct SitePair {
  long a = -1, b = -1;
};
std::vector<SitePair> match_sites(const std::vector<const std::vector<Frame>*>& a,
                                  const std::vector<const std::vector<Frame>*>& b);

// The frames whose line changed from `a` to `b` (two stacks of one shape).
std::vector<LineMove> line_moves(const std::vector<Frame>& a, const std::vector<Frame>& b);

}  // namespace gpuheap
