// A per-thread cache of native stacks (unwind.cpp), so that a stack seen before costs a few
// dozen loads instead of a libunwind walk and an interning lookup.
//
// Why it is exact: an unwind on x86-64 is a function of the registers at its start and of the
// words it reads on the way: each frame's return address, and the saved rbp (or rsp, in a
// signal frame) where a frame restores one. The CFA of a frame follows from its ip and its rsp
// or rbp (the rules are static per ip). An entry is keyed on the start (the return address into
// the hook's caller chain, the stack pointer there and rbp) and holds the address and value of
// every word the walk read from that start down to its last used frame; a hit re-reads them
// all, so a stack that differs anywhere it was read (another caller deeper, another depth, the
// same frames at other places) misses and is walked in full. The save locations come from
// libunwind's own walk (unw_get_save_loc), checked against unw_backtrace's ips.
// rbp values far from the stack are data (code without frame pointers keeps its own in rbp):
// they cannot be the base of any frame's CFA, so they are neither checked nor keyed exactly
// (stackcache.cpp, rbp_span).
// Not covered: a CFA rule that is a DWARF expression reading memory that is no saved register
// (stack realignment in some main()s, hand-written assembly). An entry is only made for a walk
// whose every read word lies on the thread's own stack, between the start and its top.
#pragma once

#include <cstdint>

namespace gpuheap {
namespace preload {

struct StackKey {
  std::uint64_t ip0 = 0, sp0 = 0, rbp0 = 0;  // the hook's caller frame, as the unwinder sees it
  std::uint32_t conf = 0;                    // skip, depth and Python mode: all change the result
};

struct StackHit {
  const std::uint64_t* ips;  // the native frames kept (innermost first)
  int nat;
  std::uint32_t id;  // interned id of exactly these frames in this trace; 0 = not known
  void* entry;       // for stackcache_set_id
};

// The key of a capture started from the frame (ip0, sp0, rbp0) that stacks_capture returns to
// (unwind.cpp reads them there). conf 0 off x86-64: a key with conf 0 is never cached.
StackKey stackcache_key(std::uint64_t ip0, std::uint64_t sp0, std::uint64_t rbp0, int skip, int depth,
                        bool py) noexcept;

// A validated entry for the key, false if none (or the cache is off).
bool stackcache_find(const StackKey& key, StackHit* hit) noexcept;
void stackcache_set_id(void* entry, std::uint32_t id) noexcept;

// Called after a full walk (raw = unw_backtrace's ips, raw[start] the key's frame, raw[last] the
// deepest frame the result depends on, `ended` when the stack ended there; ips[0..nat) the
// frames kept; id their interned id, 0 when the stack had Python frames): on a key's second miss,
// walks again with libunwind's stepping API to learn where each word was read, and stores an
// entry. Must run inside the caller's libunwind guard (unwind.cpp's t_unwinding).
void stackcache_fill(const StackKey& key, void* const* raw, int start, int last, bool ended, const std::uint64_t* ips,
                     int nat, std::uint32_t id) noexcept;

// Every interned id goes stale (a new trace file): entries keep their frames, forget their ids.
void stackcache_new_generation() noexcept;

// Tests and benchmarks: turn the cache off/on (process-wide), count its hits.
void stackcache_enable(bool on) noexcept;
std::uint64_t stackcache_hits() noexcept;

}  // namespace preload
}  // namespace gpuheap
