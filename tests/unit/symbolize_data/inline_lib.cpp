// Helper library for test_symbolize, built with -O2 -g: symtest::inlined_leaf is
// always_inline, so the callback's return address lies inside an inlined_subroutine of
// symtest_inline_entry. It is also linked at a non-zero p_vaddr (-Ttext-segment) so the
// test covers a load bias that differs from the mapping start. The __LINE__ offsets below
// count lines, so clang-format is kept off over them.
#include "symtest_libs.h"

// clang-format off
extern "C" const int symtest_leaf_call_line = __LINE__ + 5;   // the cb(arg) line below
extern "C" const int symtest_entry_call_line = __LINE__ + 11;  // the inlined_leaf call below

namespace symtest {
__attribute__((always_inline)) inline void inlined_leaf(symtest_cb cb, void* arg) {
  cb(arg);
  // Keeps the call above from becoming a tail call (its frame would vanish).
  asm volatile("" ::: "memory");
}
}  // namespace symtest

extern "C" __attribute__((noinline)) void symtest_inline_entry(symtest_cb cb, void* arg) {
  symtest::inlined_leaf(cb, arg);
  asm volatile("" ::: "memory");
}
// clang-format on
