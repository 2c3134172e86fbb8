// The PyTorch caching-allocator model of `gpuheap replay --policy torch` (replay_torch.h).
// Function names follow CUDACachingAllocator.cpp's, so the two can be read side by side.
#include "analyzer/replay_torch.h"

#include <bit>
#include <iterator>
#include <string_view>

#include "analyzer/model.h"

namespace gpuheap {
namespace {

std::string_view base_name(std::string_view path) {
  std::size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// The module holding ip: the latest record wins where ranges overlap (dlclose + dlopen).
const OwnedModule* module_at(const std::vector<OwnedModule>& mods, std::uint64_t ip) {
  for (auto it = mods.rbegin(); it != mods.rend(); ++it)
    if (ip >= it->lo && ip < it->hi) return &*it;
  return nullptr;
}

// Frames between the program's call and the recorded allocation that are not the caller:
// gpuheap's hooks, and the CUDA runtime/driver a cudaMalloc may pass through to reach them.
bool hook_side(std::string_view base) {
  return base.starts_with("libgpuheap") || base.starts_with("libcudart") || base.starts_with("libcuda.");
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
    if (hook_side(base)) continue;
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

void TorchAllocator::insert_free(std::uint64_t addr, Block& b) {
  b.pos = pool(b.small).emplace(b.stream, b.size, addr).first;
  ++free_sizes_[b.size];
}
void TorchAllocator::erase_free(const Block& b) {
  pool(b.small).erase(b.pos);
  auto it = free_sizes_.find(b.size);
  if (--it->second == 0) free_sizes_.erase(it);
}

bool TorchAllocator::get_free_block(std::uint64_t size, std::uint64_t stream, bool small, std::uint64_t* addr) {
  std::set<Key>& p = pool(small);
  auto it = p.lower_bound(Key{stream, size, 0});  // best fit within the stream's pool
  if (it == p.end() || std::get<0>(*it) != stream) return false;
  std::uint64_t found = std::get<1>(*it);
  // Oversize blocks are not cut for smaller requests, and serve oversize requests only
  // when they waste less than kLargeBuffer.
  if (size < cfg_.max_split_size && found >= cfg_.max_split_size) return false;
  if (size >= cfg_.max_split_size && found >= size + kLargeBuffer) return false;
  *addr = std::get<2>(*it);
  erase_free(blocks_.at(*addr));
  return true;
}

bool TorchAllocator::alloc_block(std::uint64_t alloc_size, std::uint64_t stream, bool small, std::uint64_t* addr) {
  void* p = up_.allocate(alloc_size);
  if (!p) return false;
  *addr = reinterpret_cast<std::uint64_t>(p);
  blocks_[*addr] = Block{alloc_size, stream, *addr, alloc_size, small, false};
  if (obs_) obs_->on_segment_alloc(p, alloc_size, small);
  return true;
}

bool TorchAllocator::release_block(Blocks::iterator it) {
  Block b = it->second;
  if (b.allocated || !whole_segment(it->first, b)) return false;
  erase_free(b);
  blocks_.erase(it);
  if (obs_) obs_->on_segment_free(reinterpret_cast<void*>(b.seg), b.seg_size, b.small);
  up_.deallocate(reinterpret_cast<void*>(b.seg), b.seg_size);
  return true;
}

bool TorchAllocator::release_available_cached_blocks(std::uint64_t size, std::uint64_t stream, bool small) {
  if (cfg_.max_split_size == std::numeric_limits<std::uint64_t>::max()) return false;
  std::set<Key>& p = pool(small);
  std::uint64_t want = size < cfg_.max_split_size ? cfg_.max_split_size : size;
  auto it = p.lower_bound(Key{stream, want, 0});
  if (it != p.end() && std::get<0>(*it) == stream) return release_block(blocks_.find(std::get<2>(*it)));
  // No single block is large enough: free oversize blocks of the stream, largest first.
  if (it == p.begin()) return false;
  --it;
  std::uint64_t released = 0;
  while (released < want && std::get<1>(*it) >= cfg_.max_split_size && std::get<0>(*it) == stream) {
    auto cur = it;
    bool first = cur == p.begin();
    if (!first) --it;
    std::uint64_t n = std::get<1>(*cur);
    if (release_block(blocks_.find(std::get<2>(*cur)))) released += n;
    if (first) break;
  }
  return released >= want;
}

void TorchAllocator::release_cached_blocks() {
  // After synchronizing every stream: free blocks that are a whole segment (not split).
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    auto cur = it++;
    if (!cur->second.allocated && whole_segment(cur->first, cur->second)) release_block(cur);
  }
}

bool TorchAllocator::allocate(std::uint64_t requested, std::uint64_t stream, std::uint64_t* ptr,
                              std::uint64_t* size) {
  std::uint64_t n = round_size(requested);
  bool small = n <= kSmallSize;
  std::uint64_t alloc_size = allocation_size(n);
  std::uint64_t addr = 0;
  bool found = get_free_block(n, stream, small, &addr) || alloc_block(alloc_size, stream, small, &addr) ||
               (release_available_cached_blocks(n, stream, small) && alloc_block(alloc_size, stream, small, &addr));
  if (!found) {
    release_cached_blocks();
    ++retries_;
    if (obs_) obs_->on_retry(requested);
    found = alloc_block(alloc_size, stream, small, &addr);
  }
  if (!found) return false;
  Block& b = blocks_.at(addr);
  std::uint64_t remaining = b.size - n;
  bool split = small ? remaining >= kMinBlock : (n < cfg_.max_split_size && remaining > kSmallSize);
  if (split) {
    Block rest = b;
    rest.size = remaining;
    b.size = n;
    Block& high = blocks_[addr + n] = rest;  // the low part is handed out, the high part stays cached
    insert_free(addr + n, high);
  }
  Block& got = blocks_.at(addr);
  got.allocated = true;
  *ptr = addr, *size = got.size;
  return true;
}

std::uint64_t TorchAllocator::deallocate(std::uint64_t ptr) {
  auto it = blocks_.find(ptr);
  if (it == blocks_.end() || !it->second.allocated) return 0;
  Block& b = it->second;
  b.allocated = false;
  std::uint64_t freed = b.size;
  // Merge with free neighbours of the same segment (free_block / try_merge_blocks).
  if (auto nx = std::next(it); nx != blocks_.end() && nx->second.seg == b.seg && !nx->second.allocated) {
    erase_free(nx->second);
    b.size += nx->second.size;
    blocks_.erase(nx);
  }
  if (it != blocks_.begin()) {
    auto pv = std::prev(it);
    if (pv->second.seg == b.seg && !pv->second.allocated) {
      erase_free(pv->second);
      pv->second.size += b.size;
      blocks_.erase(it);
      it = pv;
    }
  }
  insert_free(it->first, it->second);
  return freed;
}

}  // namespace gpuheap
