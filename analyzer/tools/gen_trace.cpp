// Synthetic trace generator for benchmarks and large-input tests: a pooled workload with a
// realistic shape (segments reused, ~half the blocks live, several threads and stacks).
// --training: the stacks end in PyTorch's Python frames and time runs as training steps
// (model construction, then forward, backward and optimizer step in turn), so that the
// categories (docs/categories.md) find phases: a large input for the report's category views.
//   gpuheap_gen_trace OUT EVENTS [--zstd] [--no-end] [--seed N] [--training]
#include <zstd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "format/trace.h"

using namespace gpuheap::format;

namespace {

struct Out {
  std::FILE* f = nullptr;
  ZSTD_CCtx* z = nullptr;
  std::vector<unsigned char> buf, zbuf;
  void put(const unsigned char* p, std::size_t n) {
    buf.insert(buf.end(), p, p + n);
    if (buf.size() > (1u << 20)) flush(false);
  }
  void flush(bool end) {
    if (!z) {
      std::fwrite(buf.data(), 1, buf.size(), f);
    } else {
      ZSTD_inBuffer in{buf.data(), buf.size(), 0};
      zbuf.resize(ZSTD_CStreamOutSize());
      for (;;) {
        ZSTD_outBuffer o{zbuf.data(), zbuf.size(), 0};
        std::size_t rem = ZSTD_compressStream2(z, &o, &in, end ? ZSTD_e_end : ZSTD_e_continue);
        std::fwrite(zbuf.data(), 1, o.pos, f);
        if (ZSTD_isError(rem)) std::exit(3);
        if (end ? rem == 0 : in.pos == in.size) break;
      }
    }
    buf.clear();
  }
};

// The stacks, 16 native frames each. --training: each ends in PyTorch's Python frames, the
// phase they say (construction, forward, backward, optimizer step) picked by id % 4.
void put_stacks(Out& out, std::uint64_t& records, std::uint32_t count, bool training) {
  unsigned char b[4096];
  auto emit = [&](std::size_t n) { out.put(b, n), ++records; };
  struct Code {
    const char *file, *name;
  };
  const Code codes[] = {{"/venv/torch/nn/modules/module.py", "Module._apply"},
                        {"/venv/torch/nn/modules/module.py", "Module._call_impl"},
                        {"/venv/torch/_tensor.py", "Tensor.backward"},
                        {"/venv/torch/optim/adamw.py", "_multi_tensor_adamw"},
                        {"/job/train.py", "main"}};
  if (training)
    for (std::uint32_t c = 0; c < 5; ++c)
      emit(encode(b, sizeof b, PyCodeRecord{c + 1, 3, 12, 100, codes[c].file, codes[c].name, ""}));
  for (std::uint32_t id = 1; id <= count; ++id) {
    std::uint64_t ips[18];
    for (int d = 0; d < 16; ++d) ips[d] = 0x400000 + ((id * 7919 + d * 104729) % 0x3FFFFF);
    if (training) ips[16] = py_frame(1 + id % 4, kPyNoLasti), ips[17] = py_frame(5, kPyNoLasti);
    emit(encode_stack(b, sizeof b, id, ips, training ? 18 : 16));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s OUT EVENTS [--zstd] [--no-end] [--seed N] [--training]\n", argv[0]);
    return 2;
  }
  std::uint64_t events = std::strtoull(argv[2], nullptr, 10);
  bool zstd = false, no_end = false, training = false;
  unsigned seed = 1;
  for (int i = 3; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--zstd")) zstd = true;
    else if (!std::strcmp(argv[i], "--no-end")) no_end = true;
    else if (!std::strcmp(argv[i], "--training")) training = true;
    else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) seed = static_cast<unsigned>(std::atoi(argv[++i]));
  }
  Out out;
  out.f = std::fopen(argv[1], "wb");
  if (!out.f) return 1;
  if (zstd) out.z = ZSTD_createCCtx();
  unsigned char b[4096];
  encode_file_header(b);
  out.put(b, kFileHeaderSize);
  std::uint64_t mono = 1000000000, ts = mono, records = 0;
  auto emit = [&](std::size_t n) { out.put(b, n), ++records; };
  emit(encode(b, sizeof b,
              ProcessRecord{4242, 1, 1700000000000000000ull, mono, "genhost", std::string_view("gen\0trace", 9),
                            "0.1.0", "/usr/bin/gen"}));
  emit(encode(b, sizeof b, DeviceRecord{0, 80ull << 30, "Synthetic GPU"}));
  emit(encode(b, sizeof b, ModuleRecord{0x400000, 0x400000, 0x800000, "/usr/bin/gen", ""}));
  constexpr std::uint32_t kStacks = 2000, kThreads = 4;
  std::mt19937_64 rng(seed);
  put_stacks(out, records, kStacks, training);
  // --training: construction for the first 1% of the events, then steps of 20000 events:
  // 45% forward, 45% backward, 10% optimizer step.
  auto pick_stack = [&](std::uint64_t at) {
    if (!training) return 1 + static_cast<std::uint32_t>(rng() % kStacks);
    const std::uint64_t pos = at % 20000;
    const std::uint32_t phase = at < events / 100 ? 0 : pos < 9000 ? 1 : pos < 18000 ? 2 : 3;
    return static_cast<std::uint32_t>(rng() % (kStacks / 4)) * 4 + (phase == 0 ? 4 : phase);  // id % 4 == phase
  };
  for (std::uint32_t t = 0; t < kThreads; ++t) emit(encode(b, sizeof b, ThreadRecord{100 + t, "worker"}));

  // 1024 small-pool segments of 2 MiB, 64 slots of 32 KiB each.
  constexpr std::uint64_t kSegBase = 0x7f0000000000ull, kSeg = 2u << 20, kSlot = 32u << 10;
  constexpr std::uint32_t kSegs = 1024, kSlotsPer = 64, kSlots = kSegs * kSlotsPer;
  std::vector<std::uint32_t> free_slots, live;
  std::vector<std::uint32_t> live_pos(kSlots, ~0u);
  std::vector<bool> seg_made(kSegs, false);
  for (std::uint32_t s = kSlots; s-- > 0;) free_slots.push_back(s);
  std::uint64_t n = records;
  while (n < events) {
    ts += 50 + rng() % 100;
    bool do_alloc = live.empty() || (!free_slots.empty() && (rng() % 100) < (live.size() < kSlots / 2 ? 60 : 40));
    std::uint32_t tid = 100 + static_cast<std::uint32_t>(rng() % kThreads);
    if (do_alloc) {
      // Pick among the lowest free slots (like best-fit reuse) so segments fill in order.
      std::size_t pick = free_slots.size() - 1 - rng() % std::min<std::size_t>(free_slots.size(), 64);
      std::uint32_t slot = free_slots[pick];
      free_slots[pick] = free_slots.back();
      free_slots.pop_back();
      std::uint32_t seg = slot / kSlotsPer;
      if (!seg_made[seg]) {
        seg_made[seg] = true;
        emit(encode(b, sizeof b, SegmentRecord{ts, 0, kFlagSmallPool, kSegBase + seg * kSeg, kSeg}, false));
        ++n;
      }
      std::uint64_t req = 1 + rng() % kSlot;
      std::uint64_t size = (req + 511) / 512 * 512;
      AllocRecord a;
      a.ts = ts, a.tid = tid, a.device = 0, a.kind = AllocKind::device_pooled, a.flags = kFlagSmallPool;
      a.ptr = kSegBase + seg * kSeg + (slot % kSlotsPer) * kSlot, a.requested = req, a.size = size;
      a.stream = 0, a.stack = pick_stack(n);
      emit(encode(b, sizeof b, a));
      live_pos[slot] = static_cast<std::uint32_t>(live.size());
      live.push_back(slot);
      ++n;
    } else {
      std::size_t i = rng() % live.size();
      std::uint32_t slot = live[i];
      live[i] = live.back();
      live_pos[live[i]] = static_cast<std::uint32_t>(i);
      live.pop_back();
      std::uint32_t seg = slot / kSlotsPer;
      std::uint64_t ptr = kSegBase + seg * kSeg + (slot % kSlotsPer) * kSlot;
      FreeRecord f;
      f.ts = ts, f.tid = tid, f.device = 0, f.kind = AllocKind::device_pooled, f.flags = kFlagSmallPool;
      f.ptr = ptr, f.size = 0, f.stack = 1 + static_cast<std::uint32_t>(rng() % kStacks);
      emit(encode(b, sizeof b, f));
      ts += 20;
      emit(encode(b, sizeof b, FreeCompletedRecord{ts, 0, ptr, 0}));
      free_slots.push_back(slot);
      n += 2;
    }
  }
  if (!no_end) emit(encode(b, sizeof b, EndRecord{ts + 1, EndReason::exit, records}));
  out.flush(true);
  std::fclose(out.f);
  if (out.z) ZSTD_freeCCtx(out.z);
  std::fprintf(stderr, "wrote %llu records to %s\n", static_cast<unsigned long long>(records), argv[1]);
  return 0;
}
