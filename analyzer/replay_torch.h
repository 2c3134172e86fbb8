// `gpuheap replay --policy torch`: a model of PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp) as documented and read, on the same simulated
// upstream and segment observer as the gpuheap policy (replay.cpp). What it models and what
// it does not is in docs/cli.md (replay, "Policy torch").
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "preload/pool/pool.h"

namespace gpuheap {

class Model;

// Which of a trace's cudaMallocs PyTorch's caching allocator makes: those whose caller, the
// first frame outside gpuheap and the CUDA runtime/driver, is in libc10_cuda (where
// CUDACachingAllocator lives; a NO_CACHING trace shows its cudaMalloc calls). The others
// (cuBLAS's workspaces from cublasCreate, cuDNN's, NCCL's buffers) call cudaMalloc
// themselves and never count in torch.cuda.max_memory_reserved(). Decided from the trace's
// module records (address ranges), not symbol names, which stripped libraries lack. Served
// as well (the model cannot tell, and keeps its old answer): every allocation of a trace
// that never loaded libc10_cuda (a program without PyTorch: "what if torch's allocator
// served every cudaMalloc"), one without a stack, and one whose first such frame is in no
// recorded module.
class TorchCallers {
 public:
  explicit TorchCallers(const Model& m) : m_(m) {}
  bool served(std::uint32_t stack);

 private:
  const Model& m_;
  std::size_t modules_seen_ = 0;
  bool torch_job_ = false;
  std::unordered_map<std::uint32_t, bool> by_stack_;  // decided once torch_job_
};

struct TorchConfig {
  std::uint64_t max_split_size = std::numeric_limits<std::uint64_t>::max();  // unlimited
  std::uint64_t roundup_power2_divisions = 0;                                 // 0/1: off
};

class TorchAllocator {
 public:
  static constexpr std::uint64_t kMinBlock = 512, kSmallSize = std::uint64_t{1} << 20,
                                 kSmallBuffer = std::uint64_t{2} << 20, kLargeBuffer = std::uint64_t{20} << 20,
                                 kMinLargeAlloc = std::uint64_t{10} << 20, kRoundLarge = std::uint64_t{2} << 20;

  TorchAllocator(detail::Upstream& up, const TorchConfig& cfg, detail::PoolObserver* obs)
      : up_(up), cfg_(cfg), obs_(obs) {}

  // The block that malloc(requested) on `stream` returns; false when even the release-and-
  // retry path cannot get a segment (torch's OutOfMemoryError).
  bool allocate(std::uint64_t requested, std::uint64_t stream, std::uint64_t* ptr, std::uint64_t* size);
  // Frees a block handed out (stream-ordered: reusable at once on its stream). Returns its
  // size, 0 for an address that is no live block.
  std::uint64_t deallocate(std::uint64_t ptr);
  // torch.cuda.empty_cache(): every cached segment with no live piece goes back.
  void empty_cache() { release_cached_blocks(); }
  std::uint64_t largest_free() const { return free_sizes_.empty() ? 0 : free_sizes_.rbegin()->first; }
  std::uint64_t retries() const { return retries_; }

  std::uint64_t round_size(std::uint64_t n) const;
  static std::uint64_t allocation_size(std::uint64_t rounded);

 private:
  using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;  // stream, size, address
  struct Block {
    std::uint64_t size = 0, stream = 0, seg = 0, seg_size = 0;
    bool small = false, allocated = false;
    // Where a free block sits in its pool's set: erasing by it skips a search by key
    // (meaningful only while the block is free).
    std::set<Key>::iterator pos{};
  };
  using Blocks = std::map<std::uint64_t, Block>;

  std::set<Key>& pool(bool small) { return small ? small_ : large_; }
  bool get_free_block(std::uint64_t size, std::uint64_t stream, bool small, std::uint64_t* addr);
  bool alloc_block(std::uint64_t alloc_size, std::uint64_t stream, bool small, std::uint64_t* addr);
  bool release_available_cached_blocks(std::uint64_t size, std::uint64_t stream, bool small);
  void release_cached_blocks();
  bool release_block(Blocks::iterator it);  // a free whole segment: back to the driver
  void insert_free(std::uint64_t addr, Block& b);
  void erase_free(const Block& b);
  bool whole_segment(std::uint64_t addr, const Block& b) const { return addr == b.seg && b.size == b.seg_size; }

  detail::Upstream& up_;
  TorchConfig cfg_;
  detail::PoolObserver* obs_;
  Blocks blocks_;  // every block, free or not, by address
  std::set<Key> small_, large_;
  // Free blocks per size (for largest_free): sizes repeat, so an insert seldom allocates.
  std::map<std::uint64_t, std::uint64_t> free_sizes_;
  std::uint64_t retries_ = 0;
};

}  // namespace gpuheap
