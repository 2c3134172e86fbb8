#include "preload/record/stackcache.h"

#define UNW_LOCAL_ONLY
#include <libunwind.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>

#include "preload/record/scratch.h"
#include "preload/record/stackstats.h"

namespace gpuheap {
namespace preload {
namespace {

#if defined(__x86_64__)
constexpr bool kSupported = true;
#else
constexpr bool kSupported = false;
#endif

// Ways a set, by key: the stacks that share a start (PyTorch allocates from one call site of
// its allocator, at a few depths, and many ops reach it at the same one) all stay, up to kWays
// of them; a wrong one fails after one load (still_valid), and only ways whose tag matches are
// looked at, so looking through them costs little beside the walk a hit saves.
constexpr int kSets = 16;
constexpr int kWays = 32;
constexpr int kMaxFrames = 80;                    // native frames kept per entry
constexpr int kMaxChecks = 192;                   // words read per walk (about two per frame)
constexpr int kSeenSets = 64, kSeenWays = 4;      // keys missed once: a key is cached at its second miss
constexpr std::uint64_t kNearStack = 1ull << 30;  // a key's rbp0 within this of sp0 is kept exactly
constexpr std::uint64_t kFarRbp = 0;              // the key's rbp0 for every value farther away

struct Entry {
  StackKey key;  // key.conf == 0: empty
  std::uint32_t gen, id;
  std::uint16_t nat, nchecks;
  std::uint16_t quiet;            // misses left before this key is filled again (kQuiet)
  std::uint32_t hits;             // since its fill (whether the fill paid: SetState)
  std::uint16_t bad;              // the check that failed last (still_valid)
  std::uint32_t off[kMaxChecks];  // address - sp0 of each word read
  std::uint64_t val[kMaxChecks];
  std::uint64_t ips[kMaxFrames];
  std::uint8_t is_rbp[kMaxChecks / 8];  // bit i: check i is a saved rbp (for stackstats' cache_stale)
};

// Whether a set's fills pay, judged by the entries they evict (way_to_fill).
struct SetState {
  std::uint8_t next;     // the way the set's next new key goes to
  bool thrashing;        // one fill in kBackoff misses until a window of evictions pays
  std::uint8_t evicted;  // in this window
  std::uint8_t wasted;   // of them, entries evicted before they earned kHitsPerFill hits
  std::uint16_t passed;  // misses not filled while thrashing
};

struct Cache {
  // Each way's key hash (tag_of), 0 while empty or being written: a lookup reads a set's tags
  // (four cache lines), not a line and a page of every entry.
  std::uint64_t tag[kSets][kWays];
  Entry e[kSets][kWays];
  SetState set[kSets];
  // Associative, so that keys sharing a slot do not erase each other's first miss on every
  // pass and never reach a second one (a training step's hundreds of stacks did).
  std::uint64_t seen[kSeenSets][kSeenWays];
  std::uint8_t seen_next[kSeenSets];
};

constinit std::atomic<std::uint32_t> g_gen{1};
constinit std::atomic<bool> g_on{true};
// Mapped at the thread's first fill (never through malloc: we may be inside its hook),
// unmapped when the thread exits; the initial thread keeps it to the end.
thread_local Cache* t_cache __attribute__((tls_model("initial-exec"))) = nullptr;
thread_local bool t_no_cache __attribute__((tls_model("initial-exec"))) = false;
thread_local std::uint64_t t_hits __attribute__((tls_model("initial-exec"))) = 0;
// A fill walks the stack again, an order of magnitude slower than the walk a hit saves, so
// fills are rationed where they do not pay. Code built without frame pointers may keep data in
// rbp across calls; the saved copy is a word the entry checks, so such a stack misses every time
// though its frames repeat. A key whose entry holds the very frames just walked is such a one:
// it is filled again only after kQuiet more misses (its entry still serves the calls whose words
// match). And a set whose last kWindow evictions threw away mostly entries that had not earned
// kHitsPerFill hits (more stacks at one start than ways, evicting each other) tries one fill in
// kBackoff misses until a window of evictions pays again. Judged by what an entry earned over
// its whole stay, not by the hits of a recent stretch: a training step's stacks recur once a
// step, so a window of fills made in its first step had earned little by the window's end and
// stopped the thread's fills for thousands of misses (prog_stackmix).
constexpr std::uint16_t kQuiet = 1024;
constexpr std::uint8_t kWindow = kWays;
constexpr std::uint32_t kHitsPerFill = 16;  // a fill costs about that many of the walks a hit saves
constexpr std::uint16_t kBackoff = 256;

void release(void* p) {
  t_no_cache = true;
  if (t_cache == p) t_cache = nullptr;
  munmap(p, sizeof(Cache));
}

Cache* cache() {
  if (t_cache || t_no_cache) return t_cache;
  void* p = mmap(nullptr, sizeof(Cache), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    t_no_cache = true;
    return nullptr;
  }
  if (!release_at_thread_exit(release, p)) {
    munmap(p, sizeof(Cache));
    t_no_cache = true;
    return nullptr;
  }
  t_cache = static_cast<Cache*>(p);
  return t_cache;
}

inline std::uint64_t key_hash(const StackKey& k) {
  std::uint64_t h = (k.ip0 ^ (k.sp0 * 0x9E3779B97F4A7C15ull) ^ (k.rbp0 * 0xFF51AFD7ED558CCDull)) + k.conf;
  return h ^ (h >> 29) ^ (h >> 41);
}

inline std::uint64_t tag_of(std::uint64_t h) { return h | 1; }

inline bool same_key(const StackKey& a, const StackKey& b) {
  return a.ip0 == b.ip0 && a.sp0 == b.sp0 && a.rbp0 == b.rbp0 && a.conf == b.conf;
}

// The words an entry was filled from, read again. Plain loads of the thread's own stack between
// sp0 (the live frame) and its top, checked at fill time; ASan would see return-address and
// register save slots of frames it did not instrument.
// The word that differed last time is read first: a key whose stack keeps changing one word
// (rbp holding data) then misses after one load, not after all of them.
__attribute__((no_sanitize("address"))) bool still_valid(Entry& e) {
  const auto base = static_cast<std::uintptr_t>(e.key.sp0);
  auto same = [&](int i) { return *reinterpret_cast<const volatile std::uint64_t*>(base + e.off[i]) == e.val[i]; };
  if (e.bad < e.nchecks && !same(e.bad)) return false;
  for (int i = 0; i < e.nchecks; ++i) {
    if (!same(i)) {
      e.bad = static_cast<std::uint16_t>(i);
      return false;
    }
  }
  return true;
}

// What became of a fill (counted in stackstats.h).
enum class Fill { off, waited, failed_size, failed_off_stack, failed_register, failed_walk, made };

#if defined(__x86_64__)
// rbp as data. Code built without frame pointers (PyTorch's libraries are) keeps values of its
// own in rbp across calls, often heap pointers that differ from call to call; checking their
// saved copies made such stacks miss every time. A walk depends on rbp only in a frame whose CFA
// rule is based on it, and such a frame reads its return address at rbp plus an offset no larger
// than the stack is long; a fill keeps only walks whose every read lies on the stack. So a value
// of rbp farther from the stack than the stack's own length was used by no frame of the walk,
// and would be used by none of a walk through the same return addresses (the rules are static
// per ip): it is not checked, and as the key's rbp0 any such value makes one key.
struct RbpSpan {
  std::uintptr_t lo, hi;  // the values that may matter: the stack, widened by its length
};
inline RbpSpan rbp_span(std::uintptr_t sp0, std::uintptr_t lo, std::uintptr_t hi) {
  const std::uintptr_t w = hi - lo + 64;
  return {sp0 > w ? sp0 - w : 0, hi + w};
}
inline bool rbp_may_matter(std::uint64_t v, const RbpSpan& s) { return v >= s.lo && v < s.hi; }

// One register's save location in the cursor's frame: its address, 0 when not in memory (kept
// in the frame's registers, or computed, as rsp is from the CFA); false for a kind not tracked.
bool save_addr(unw_cursor_t* cur, int reg, std::uintptr_t* addr) {
  unw_save_loc_t sl;
  if (unw_get_save_loc(cur, reg, &sl) != 0 || sl.type == UNW_SLT_REG) return false;
  *addr = sl.type == UNW_SLT_MEMORY ? static_cast<std::uintptr_t>(sl.u.addr) : 0;
  return true;
}

// Steps from the start frame down to raw[last], recording every word read whose save location
// is new in that frame; otherwise why the walk cannot be cached.
Fill record_walk(unw_cursor_t* cur, Entry* e, void* const* raw, int start, int last, bool ended, std::uintptr_t hi,
                 const RbpSpan& span) {
  constexpr int kRegs[3] = {UNW_X86_64_RIP, UNW_X86_64_RSP, UNW_X86_64_RBP};
  std::uintptr_t prev[3];
  for (int r = 0; r < 3; ++r)
    if (!save_addr(cur, kRegs[r], &prev[r])) return Fill::failed_register;
  const auto sp0 = static_cast<std::uintptr_t>(e->key.sp0);
  int n = 0;
  // One step past the last frame when the stack ended there: that step must end too, and the
  // word it read, if any (a zero return address), is checked like the others.
  for (int j = start + 1; j <= last + (ended ? 1 : 0); ++j) {
    unw_word_t ip = 0;
    int stepped = unw_step(cur);
    if (j > last) {
      if (stepped != 0) return Fill::failed_walk;
    } else if (stepped <= 0 || unw_get_reg(cur, UNW_REG_IP, &ip) != 0 || ip != reinterpret_cast<unw_word_t>(raw[j])) {
      return Fill::failed_walk;
    }
    // The last frame's ip is the last thing the result depends on: its rsp and rbp would only
    // be used by a step further down, which is not taken unless the stack ended there.
    const int regs = j == last && !ended ? 1 : 3;
    for (int r = 0; r < regs; ++r) {
      std::uintptr_t a = 0;
      if (!save_addr(cur, kRegs[r], &a)) return Fill::failed_register;
      if (a == prev[r]) continue;  // the same word as in the frame above: already checked
      prev[r] = a;
      if (a == 0) {
        // rsp is the CFA, from the rule and registers above; past the end nothing was read.
        if (kRegs[r] == UNW_X86_64_RSP || j > last) continue;
        return Fill::failed_register;  // an ip or rbp that is nowhere
      }
      if (a < sp0 || a + 8 > hi || a - sp0 > 0xFFFFFFF0u) return Fill::failed_off_stack;
      const std::uint64_t v = *reinterpret_cast<const std::uint64_t*>(a);
      if (kRegs[r] == UNW_X86_64_RBP && !rbp_may_matter(v, span)) continue;  // data, not a frame pointer
      if (n == kMaxChecks) return Fill::failed_size;
      e->off[n] = static_cast<std::uint32_t>(a - sp0);
      e->val[n] = v;
      const auto bit = static_cast<std::uint8_t>(1u << (n % 8));
      e->is_rbp[n / 8] = static_cast<std::uint8_t>(kRegs[r] == UNW_X86_64_RBP ? e->is_rbp[n / 8] | bit
                                                                              : e->is_rbp[n / 8] & ~bit);
      ++n;
    }
  }
  e->nchecks = static_cast<std::uint16_t>(n);
  return Fill::made;
}

void judge_eviction(SetState& st, const Entry& victim) {
  st.wasted = static_cast<std::uint8_t>(st.wasted + (victim.hits < kHitsPerFill ? 1 : 0));
  if (++st.evicted < kWindow) return;
  st.thrashing = st.wasted > kWindow / 2;
  st.evicted = st.wasted = 0;
}

// At a key's second miss, the slot that noted its first; at its first, nullptr, having
// noted it in place of the set's oldest.
std::uint64_t* second_miss(Cache* c, std::uint64_t h) {
  std::uint64_t* set = c->seen[h % kSeenSets];
  for (int w = 0; w < kSeenWays; ++w)
    if (set[w] == h) return &set[w];
  std::uint8_t& next = c->seen_next[h % kSeenSets];
  set[next] = h;
  next = static_cast<std::uint8_t>((next + 1) % kSeenWays);
  return nullptr;
}

// The entry a walked stack goes to (a way of set h % kSets, h the key's hash), or nullptr when
// it is not to be cached now (above).
Entry* way_to_fill(Cache* c, const StackKey& key, std::uint64_t h, const std::uint64_t* ips, int nat) {
  Entry* set = c->e[h % kSets];
  const std::uint64_t* tags = c->tag[h % kSets];
  for (int w = 0; w < kWays; ++w) {
    if (tags[w] != tag_of(h)) continue;
    Entry& old = set[w];
    // The very frames (all of them: stacks at one start may differ only a few frames deep,
    // where a sample of three would call them the same and starve the others of a way).
    if (!same_key(old.key, key) || old.nat != nat || nat == 0 ||
        memcmp(old.ips, ips, sizeof(std::uint64_t) * static_cast<std::size_t>(nat)) != 0)
      continue;
    if (old.quiet > 0) {
      --old.quiet;
      return nullptr;
    }
    old.quiet = kQuiet;  // kept by the fill below: the next misses wait
    return &old;
  }
  std::uint64_t* seen = second_miss(c, h);
  if (!seen) return nullptr;  // a stack seen once is not worth the slower walk below
  SetState& st = c->set[h % kSets];
  if (st.thrashing && ++st.passed % kBackoff != 0) return nullptr;
  *seen = 0;  // the next miss of this key waits for the one after
  // A key that misses again after its fill is another stack at the same start (two callers at
  // one depth): it takes the set's next way, the oldest filled.
  Entry* e = &set[st.next];
  st.next = static_cast<std::uint8_t>((st.next + 1) % kWays);
  if (e->key.conf) judge_eviction(st, *e);
  e->quiet = 0;
  return e;
}
#endif

}  // namespace

StackKey stackcache_key(std::uint64_t ip0, std::uint64_t sp0, std::uint64_t rbp0, int skip, int depth,
                        bool py) noexcept {
  // rbp0 far from sp0 is data (above rbp_span): one key for all such values. The fill checks
  // that it is also far from the real stack (a stack longer than this window is not cached).
  if (rbp0 - (sp0 - kNearStack) >= 2 * kNearStack) rbp0 = kFarRbp;
  StackKey k{ip0, sp0, rbp0, 0};
  if (kSupported)
    k.conf = 1u | static_cast<std::uint32_t>(py) << 1 | static_cast<std::uint32_t>(skip & 63) << 2 |
             static_cast<std::uint32_t>(depth & 0x3FF) << 8;
  return k;
}

bool stackcache_find(const StackKey& key, StackHit* hit) noexcept {
  if (!key.conf || !t_cache || !g_on.load(std::memory_order_relaxed)) return false;
  const std::uint64_t h = key_hash(key);
  Entry* set = t_cache->e[h % kSets];
  const std::uint64_t* tags = t_cache->tag[h % kSets];
  Entry* found = nullptr;
  bool stale = false;
  for (int w = 0; w < kWays && !found; ++w)
    if (tags[w] == tag_of(h) && same_key(set[w].key, key)) {
      Entry& e = set[w];
      if (still_valid(e)) found = &e;
      else stale |= (e.is_rbp[e.bad / 8] >> (e.bad % 8)) & 1;  // a frame pointer, not a caller, changed
    }
  if (!found) {
    if (stale) stackstats_add(StackCounter::cache_stale);
    return false;
  }
  Entry& e = *found;
  hit->ips = e.ips;
  hit->nat = e.nat;
  hit->id = e.gen == g_gen.load(std::memory_order_relaxed) ? e.id : 0;
  hit->entry = &e;
  ++t_hits;
  if (e.hits < UINT32_MAX) ++e.hits;
  return true;
}

void stackcache_set_id(void* entry, std::uint32_t id) noexcept {
  auto* e = static_cast<Entry*>(entry);
  e->gen = g_gen.load(std::memory_order_relaxed);
  e->id = id;
}

namespace {

// The fill itself (stackcache.h); what became of it is counted by the caller.
Fill fill(const StackKey& key, void* const* raw, int start, int last, bool ended, const std::uint64_t* ips, int nat,
          std::uint32_t id) {
#if defined(__x86_64__)
  if (!key.conf || !g_on.load(std::memory_order_relaxed)) return Fill::off;
  if (nat > kMaxFrames) return Fill::failed_size;
  if (last < start) return Fill::failed_walk;
  if (reinterpret_cast<std::uintptr_t>(raw[start]) != key.ip0) return Fill::failed_walk;
  std::uintptr_t lo = 0, hi = 0;
  if (!stack_bounds(static_cast<std::uintptr_t>(key.sp0), &lo, &hi)) return Fill::failed_off_stack;
  Cache* c = cache();
  if (!c) return Fill::failed_size;
  const std::uint64_t h = key_hash(key);
  Entry* at = way_to_fill(c, key, h, ips, nat);
  if (!at) return Fill::waited;
  Entry& e = *at;
  std::uint64_t& tag = c->tag[h % kSets][at - c->e[h % kSets]];
  tag = 0;
  e.key.conf = 0;  // empty while being written
  unw_context_t uc;
  unw_cursor_t cur;
  if (unw_getcontext(&uc) != 0 || unw_init_local(&cur, &uc) != 0) return Fill::failed_walk;
  // Down to the key's frame: through this function, the capture and the hook's own frames.
  unw_word_t ip = 0, sp = 0, bp = 0;
  for (int i = 0; i < 24; ++i) {
    if (unw_step(&cur) <= 0 || unw_get_reg(&cur, UNW_REG_IP, &ip) != 0 || unw_get_reg(&cur, UNW_REG_SP, &sp) != 0)
      return Fill::failed_walk;
    if (ip == key.ip0 && sp == key.sp0) break;
  }
  if (ip != key.ip0 || sp != key.sp0 || unw_get_reg(&cur, UNW_X86_64_RBP, &bp) != 0) return Fill::failed_walk;
  const RbpSpan span = rbp_span(static_cast<std::uintptr_t>(key.sp0), lo, hi);
  // A key made from a far rbp0 (stackcache_key) serves every far value: this one must be too.
  if (key.rbp0 == kFarRbp ? rbp_may_matter(bp, span) : bp != key.rbp0) return Fill::failed_register;
  e.key = key;
  e.key.conf = 0;
  if (const Fill f = record_walk(&cur, &e, raw, start, last, ended, hi, span); f != Fill::made) return f;
  memcpy(e.ips, ips, 8u * static_cast<std::size_t>(nat));
  e.nat = static_cast<std::uint16_t>(nat);
  e.bad = 0;
  e.hits = 0;
  e.gen = g_gen.load(std::memory_order_relaxed);
  e.id = id;
  e.key.conf = key.conf;  // complete
  tag = tag_of(h);
  return Fill::made;
#else
  (void)key, (void)raw, (void)start, (void)last, (void)ended, (void)ips, (void)nat, (void)id;
  return Fill::off;
#endif
}
}  // namespace

void stackcache_fill(const StackKey& key, void* const* raw, int start, int last, bool ended, const std::uint64_t* ips,
                     int nat, std::uint32_t id) noexcept {
  switch (fill(key, raw, start, last, ended, ips, nat, id)) {
    case Fill::off: break;
    case Fill::waited: stackstats_add(StackCounter::fill_waits); break;
    case Fill::failed_size: stackstats_add(StackCounter::fill_failed_size); break;
    case Fill::failed_off_stack: stackstats_add(StackCounter::fill_failed_off_stack); break;
    case Fill::failed_register: stackstats_add(StackCounter::fill_failed_register); break;
    case Fill::failed_walk: stackstats_add(StackCounter::fill_failed_walk); break;
    case Fill::made: stackstats_add(StackCounter::fills); break;
  }
}

void stackcache_new_generation() noexcept { g_gen.fetch_add(1, std::memory_order_relaxed); }
void stackcache_enable(bool on) noexcept { g_on.store(on); }
std::uint64_t stackcache_hits() noexcept { return t_hits; }

}  // namespace preload
}  // namespace gpuheap
