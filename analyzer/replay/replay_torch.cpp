// The PyTorch caching-allocator model of `gpuheap replay --policy torch` (replay_torch.h).
// Function names follow CUDACachingAllocator.cpp's, so the two can be read side by side.
#include "analyzer/replay/replay_torch.h"

#include <algorithm>
#include <bit>
#include <iterator>
#include <string_view>
#include <vector>

#include "analyzer/model/model.h"
#include "analyzer/symbolize/symbolize.h"  // base_name, hook_side_module

namespace gpuheap {
namespace {

// The module holding ip: the latest record wins where ranges overlap (dlclose + dlopen).
const OwnedModule* module_at(const std::vector<OwnedModule>& mods, std::uint64_t ip) {
  for (auto it = mods.rbegin(); it != mods.rend(); ++it)
    if (ip >= it->lo && ip < it->hi) return &*it;
  return nullptr;
}

}  // namespace

bool TorchCallers::served(std::uint32_t stack) {
  for (; modules_seen_ < m_.modules.size(); ++modules_seen_)
    torch_job_ |= base_name(m_.modules[modules_seen_].path).starts_with("libc10_cuda");
  if (!torch_job_ || stack == 0) return true;
  if (auto it = by_stack_.find(stack); it != by_stack_.end()) return it->second;
  auto st = m_.stacks.find(stack);
  if (st == m_.stacks.end()) return true;  // not recorded (yet): cannot tell
  bool served = true;
  for (std::uint64_t ip : st->second) {
    const OwnedModule* mod = module_at(m_.modules, ip);
    if (!mod) return true;  // in no module recorded so far: cannot tell (not kept: one may come)
    std::string_view base = base_name(mod->path);
    if (hook_side_module(base)) continue;  // gpuheap's hooks, the CUDA runtime/driver: not the caller
    served = base.starts_with("libc10_cuda");
    break;
  }
  by_stack_.emplace(stack, served);
  return served;
}

std::uint64_t TorchAllocator::round_size(std::uint64_t n) const {
  if (n < kMinBlock) return kMinBlock;
  std::uint64_t div = cfg_.roundup_power2_divisions;
  if (div > 1 && n > kMinBlock * div) {
    // roundup_power2_next_division: N equal steps between two powers of two.
    if (std::has_single_bit(n)) return n;
    std::uint64_t floor2 = std::bit_floor(n);
    std::uint64_t step = floor2 >> (63 - std::countl_zero(div));
    if (step == 0) return floor2 << 1;
    std::uint64_t down = n & ~(step - 1);
    return down == n ? n : down + step;
  }
  return (n + kMinBlock - 1) / kMinBlock * kMinBlock;
}

std::uint64_t TorchAllocator::allocation_size(std::uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

TorchAllocator::~TorchAllocator() {
  for (auto& [base, sg] : segments_) {
    for (Block* b = sg->first; b;) {
      Block* n = b->next;
      delete b;
      b = n;
    }
    delete sg;
  }
  while (Block* b = spare_) {
    spare_ = b->next;
    delete b;
  }
}

TorchAllocator::Pools& TorchAllocator::pools(std::uint64_t stream) {
  if (last_pools_ && last_stream_ == stream) return *last_pools_;
  std::unique_ptr<Pools>& p = pools_[stream];
  if (!p) p = std::make_unique<Pools>();
  last_stream_ = stream, last_pools_ = p.get();
  return *p;
}

TorchAllocator::Block* TorchAllocator::new_block() {
  if (Block* b = spare_) {
    spare_ = b->next;
    *b = Block{};
    return b;
  }
  return new Block{};
}
void TorchAllocator::recycle(Block* b) {
  b->next = spare_;
  spare_ = b;
}

std::uint64_t TorchAllocator::largest_free() const {
  std::uint64_t m = 0;
  for (const auto& [stream, p] : pools_)
    for (const Index* ix : {&p->small, &p->large})
      if (const Block* b = ix->last()) m = std::max<std::uint64_t>(m, b->size);
  return m;
}

TorchAllocator::Block* TorchAllocator::get_free_block(std::uint64_t size, std::uint64_t stream, bool small) {
  Index& ix = pools(stream).of(small);
  Block* b = ix.lower_bound(size);  // best fit within the stream's pool
  if (!b) return nullptr;
  // Oversize blocks are not cut for smaller requests, and serve oversize requests only
  // when they waste less than kLargeBuffer.
  if (size < cfg_.max_split_size && b->size >= cfg_.max_split_size) return nullptr;
  if (size >= cfg_.max_split_size && b->size >= size + kLargeBuffer) return nullptr;
  ix.erase(b);
  return b;
}

TorchAllocator::Block* TorchAllocator::alloc_block(std::uint64_t alloc_size, std::uint64_t stream, bool small) {
  void* p = up_.allocate(alloc_size);
  if (!p) return nullptr;
  auto* sg = new Segment{reinterpret_cast<std::uint64_t>(p), alloc_size, stream, small, nullptr};
  Block* b = new_block();
  b->addr = sg->base, b->size = alloc_size, b->seg = sg;
  sg->first = b;
  segments_.emplace(sg->base, sg);
  if (obs_) obs_->on_segment_alloc(p, alloc_size, small);
  return b;
}

bool TorchAllocator::release_block(Block* b) {
  if (b->allocated || !whole_segment(b)) return false;
  Segment* sg = b->seg;
  index_of(b).erase(b);
  recycle(b);
  segments_.erase(sg->base);
  if (obs_) obs_->on_segment_free(reinterpret_cast<void*>(sg->base), sg->size, sg->small);
  up_.deallocate(reinterpret_cast<void*>(sg->base), sg->size);
  delete sg;
  return true;
}

bool TorchAllocator::release_available_cached_blocks(std::uint64_t size, std::uint64_t stream, bool small) {
  if (cfg_.max_split_size == std::numeric_limits<std::uint64_t>::max()) return false;
  Index& ix = pools(stream).of(small);
  std::uint64_t want = size < cfg_.max_split_size ? cfg_.max_split_size : size;
  if (Block* b = ix.lower_bound(want)) return release_block(b);
  // No single block is large enough: free oversize blocks of the stream, largest (size,
  // address) first. The OOM path only: a walk over the stream's segments is fine.
  std::vector<Block*> oversize;
  for (auto& [base, sg] : segments_)
    if (sg->stream == stream && sg->small == small)
      for (Block* b = sg->first; b; b = b->next)
        if (!b->allocated && b->size >= cfg_.max_split_size) oversize.push_back(b);
  std::sort(oversize.begin(), oversize.end(),
            [](const Block* a, const Block* b) { return a->size != b->size ? a->size > b->size : a->addr > b->addr; });
  std::uint64_t released = 0;
  for (Block* b : oversize) {
    if (released >= want) break;
    std::uint64_t n = b->size;
    if (release_block(b)) released += n;
  }
  return released >= want;
}

void TorchAllocator::release_cached_blocks() {
  // After synchronizing every stream: free blocks that are a whole segment (not split).
  for (auto it = segments_.begin(); it != segments_.end();) {
    Block* b = (it++)->second->first;  // advanced first: release_block erases the entry
    if (!b->allocated && whole_segment(b)) release_block(b);
  }
}

bool TorchAllocator::allocate(std::uint64_t requested, std::uint64_t stream, std::uint64_t* ptr, std::uint64_t* size,
                              Handle* handle) {
  std::uint64_t n = round_size(requested);
  bool small = n <= kSmallSize;
  std::uint64_t alloc_size = allocation_size(n);
  Block* b = get_free_block(n, stream, small);
  if (!b) b = alloc_block(alloc_size, stream, small);
  if (!b && release_available_cached_blocks(n, stream, small)) b = alloc_block(alloc_size, stream, small);
  if (!b) {
    release_cached_blocks();
    ++retries_;
    if (obs_) obs_->on_retry(requested);
    b = alloc_block(alloc_size, stream, small);
  }
  if (!b) return false;
  std::uint64_t remaining = b->size - n;
  bool split = small ? remaining >= kMinBlock : (n < cfg_.max_split_size && remaining > kSmallSize);
  if (split) {  // the low part is handed out, the high part stays cached
    Block* rest = new_block();
    rest->addr = b->addr + n, rest->size = remaining, rest->seg = b->seg;
    rest->prev = b, rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = n;
    index_of(rest).insert(rest);
  }
  b->allocated = true;
  *ptr = b->addr, *size = b->size;
  if (handle) *handle = reinterpret_cast<Handle>(b);
  return true;
}

std::uint64_t TorchAllocator::deallocate(std::uint64_t ptr) {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return 0;
  for (Block* b = std::prev(it)->second->first; b && b->addr <= ptr; b = b->next)
    if (b->addr == ptr) return b->allocated ? deallocate_handle(reinterpret_cast<Handle>(b)) : 0;
  return 0;
}

std::uint64_t TorchAllocator::deallocate_handle(Handle h) {
  auto* b = reinterpret_cast<Block*>(h);
  if (!b->allocated) return 0;
  b->allocated = false;
  std::uint64_t freed = b->size;
  Index& ix = index_of(b);
  // Merge with free neighbours of the same segment (free_block / try_merge_blocks): the free
  // neighbour leaves the index, the right block of a pair is absorbed into the left one.
  auto absorb = [this](Block* left, Block* right) {
    left->size += right->size;
    left->next = right->next;
    if (right->next) right->next->prev = left;
    recycle(right);
    return left;
  };
  if (Block* nx = b->next; nx && !nx->allocated) {
    ix.erase(nx);
    absorb(b, nx);
  }
  if (Block* pv = b->prev; pv && !pv->allocated) {
    ix.erase(pv);
    b = absorb(pv, b);
  }
  ix.insert(b);
  return freed;
}

}  // namespace gpuheap
