// `gpuheap replay --policy torch`: a model of PyTorch's CUDA caching allocator
// (c10/cuda/CUDACachingAllocator.cpp) as documented and read, on the same simulated
// upstream and segment observer as the gpuheap policy (replay.cpp). What it models and what
// it does not is in docs/cli.md (replay, "Policy torch").
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <unordered_map>

#include "pool/pool.h"
#include "pool/pool_free_index.h"

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
  std::uint64_t roundup_power2_divisions = 0;                                // 0/1: off
};

// Free blocks are found as in CUDACachingAllocator (best fit by (stream, size, address)),
// but through gpuheap's pool index (pool/pool_free_index.h: size bins with a bitmap,
// each bin an intrusive treap): one index per stream and pool kind, so a query is two word
// scans and a short tree walk instead of a std::set search, and the blocks' links live in
// the blocks (no node allocation). Blocks are recycled nodes, listed per segment by address
// for merging; the replay frees a block through its handle, not its address. The
// choices are the std::set model's, block for block (the index orders by (size, address)).
class TorchAllocator {
 public:
  static constexpr std::uint64_t kMinBlock = 512, kSmallSize = std::uint64_t{1} << 20,
                                 kSmallBuffer = std::uint64_t{2} << 20, kLargeBuffer = std::uint64_t{20} << 20,
                                 kMinLargeAlloc = std::uint64_t{10} << 20, kRoundLarge = std::uint64_t{2} << 20;

  TorchAllocator(pool::Upstream& up, const TorchConfig& cfg, pool::PoolObserver* obs) : up_(up), cfg_(cfg), obs_(obs) {}
  ~TorchAllocator();
  TorchAllocator(const TorchAllocator&) = delete;
  TorchAllocator& operator=(const TorchAllocator&) = delete;

  // An allocated block, for deallocate_handle: the replay keeps it in place of the address
  // (no address lookup on the free path; that lookup was a cache miss per free).
  using Handle = std::uint64_t;
  // The block that malloc(requested) on `stream` returns; false when even the release-and-
  // retry path cannot get a segment (torch's OutOfMemoryError).
  bool allocate(std::uint64_t requested, std::uint64_t stream, std::uint64_t* ptr, std::uint64_t* size,
                Handle* handle = nullptr);
  // Frees a block handed out (stream-ordered: reusable at once on its stream). Returns its
  // size, 0 for an address that is no live block (found through its segment: O(blocks there)).
  std::uint64_t deallocate(std::uint64_t ptr);
  // The same for the block allocate() gave `h` for (still allocated).
  std::uint64_t deallocate_handle(Handle h);
  // torch.cuda.empty_cache(): every cached segment with no live piece goes back.
  void empty_cache() { release_cached_blocks(); }
  std::uint64_t largest_free() const;
  std::uint64_t retries() const { return retries_; }

  std::uint64_t round_size(std::uint64_t n) const;
  static std::uint64_t allocation_size(std::uint64_t rounded);

 private:
  struct Segment;
  struct Block {
    std::uintptr_t addr = 0;  // addr, size, fl, fr, fp: what FreeIndex uses
    std::size_t size = 0;
    Block* fl = nullptr;  // free index links (meaningful only while free)
    Block* fr = nullptr;
    Block* fp = nullptr;
    Block* prev = nullptr;  // address neighbours inside the segment
    Block* next = nullptr;
    Segment* seg = nullptr;
    bool allocated = false;
    std::uint16_t fbin = 0;  // FreeIndex's bin while free
  };
  struct Segment {
    std::uint64_t base = 0, size = 0, stream = 0;
    bool small = false;
    Block* first = nullptr;
  };
  using Index = pool::FreeIndex<Block>;
  struct Pools {
    Index small, large;
    Index& of(bool is_small) { return is_small ? small : large; }
  };

  Pools& pools(std::uint64_t stream);
  Index& index_of(const Block* b) { return pools(b->seg->stream).of(b->seg->small); }
  Block* new_block();
  void recycle(Block* b);
  Block* get_free_block(std::uint64_t size, std::uint64_t stream, bool small);
  Block* alloc_block(std::uint64_t alloc_size, std::uint64_t stream, bool small);
  bool release_available_cached_blocks(std::uint64_t size, std::uint64_t stream, bool small);
  void release_cached_blocks();
  bool release_block(Block* b);  // a free whole segment: back to the driver
  static bool whole_segment(const Block* b) { return b->addr == b->seg->base && b->size == b->seg->size; }

  pool::Upstream& up_;
  TorchConfig cfg_;
  pool::PoolObserver* obs_;
  // Per stream; the last one asked for is remembered (a trace's allocations mostly come
  // from one stream at a time).
  std::unordered_map<std::uint64_t, std::unique_ptr<Pools>> pools_;
  std::uint64_t last_stream_ = 0;
  Pools* last_pools_ = nullptr;
  std::map<std::uint64_t, Segment*> segments_;  // by base: release in address order
  Block* spare_ = nullptr;                      // recycled nodes, linked through next
  std::uint64_t retries_ = 0;
};

}  // namespace gpuheap
