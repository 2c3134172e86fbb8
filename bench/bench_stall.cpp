// Tail latency of cudaMalloc+cudaFree pairs: THREADS threads issue pairs for SECONDS and time
// every one. Run by scripts/bench-stall.sh under libgpuheap.so on the simulated runtime, with
// and without a process dirtying the page cache beside it, to measure whether the trace
// sink's stores into its shared file mapping stall the program under writeback
// (docs/reliability.md, "Known limits"). Prints one JSON object.
//   bench_stall [THREADS=4] [SECONDS=10] [BYTES=4096] [RATE=0]
// RATE > 0: each thread issues at most RATE pairs per second (paced on an absolute clock, so a
// stall is followed by a catch-up burst, as in a training loop that fell behind); 0: flat out.
#include <cuda_runtime_api.h>
#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<std::uint64_t>(ts.tv_nsec);
}

// 16 buckets per power of two (~4.4 % wide) from 1 ns to 2^40 ns.
constexpr int kSub = 16;
constexpr int kBuckets = 40 * kSub;

int bucket_of(std::uint64_t ns) {
  if (ns < 1) ns = 1;
  int b = static_cast<int>(std::log2(static_cast<double>(ns)) * kSub);
  return std::min(b, kBuckets - 1);
}

double bucket_upper_ns(int b) { return std::exp2(static_cast<double>(b + 1) / kSub); }

struct Result {
  std::array<std::uint64_t, kBuckets> hist{};
  std::uint64_t pairs = 0, max_ns = 0, over_1ms = 0, over_10ms = 0, failed = 0;
};

void worker(std::size_t bytes, std::uint64_t until, double rate, Result* r) {
  const std::uint64_t start = now_ns();
  const int batch = rate > 0 ? 1 : 256;
  while (now_ns() < until) {
    if (rate > 0) {  // pair number r->pairs is due at start + pairs / rate
      auto due = start + static_cast<std::uint64_t>(static_cast<double>(r->pairs) * 1e9 / rate);
      timespec ts{static_cast<time_t>(due / 1'000'000'000u), static_cast<long>(due % 1'000'000'000u)};
      if (due > now_ns()) clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
    }
    for (int i = 0; i < batch; ++i) {
      std::uint64_t t0 = now_ns();
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess || cudaFree(p) != cudaSuccess) ++r->failed;
      std::uint64_t d = now_ns() - t0;
      ++r->hist[static_cast<std::size_t>(bucket_of(d))];
      ++r->pairs;
      r->max_ns = std::max(r->max_ns, d);
      r->over_1ms += d > 1'000'000;
      r->over_10ms += d > 10'000'000;
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 4;
  double seconds = argc > 2 ? std::atof(argv[2]) : 10.0;
  std::size_t bytes = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 4096;
  double rate = argc > 4 ? std::atof(argv[4]) : 0.0;
  if (threads < 1 || seconds <= 0 || bytes == 0 || rate < 0) {
    std::fprintf(stderr, "usage: bench_stall [THREADS] [SECONDS] [BYTES] [RATE]\n");
    return 2;
  }
  if (cudaFree(nullptr) != cudaSuccess) {
    std::fprintf(stderr, "bench_stall: no CUDA device\n");
    return 1;
  }
  std::uint64_t until = now_ns() + static_cast<std::uint64_t>(seconds * 1e9);
  std::vector<Result> res(static_cast<std::size_t>(threads));
  std::vector<std::thread> ts;
  for (auto& r : res) ts.emplace_back(worker, bytes, until, rate, &r);
  for (auto& t : ts) t.join();

  Result all;
  for (const auto& r : res) {
    for (int b = 0; b < kBuckets; ++b) all.hist[static_cast<std::size_t>(b)] += r.hist[static_cast<std::size_t>(b)];
    all.pairs += r.pairs, all.failed += r.failed, all.over_1ms += r.over_1ms, all.over_10ms += r.over_10ms;
    all.max_ns = std::max(all.max_ns, r.max_ns);
  }
  auto pct = [&](double q) {
    auto target = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(all.pairs)));
    std::uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
      seen += all.hist[static_cast<std::size_t>(b)];
      if (seen >= target && target > 0) return bucket_upper_ns(b);
    }
    return static_cast<double>(all.max_ns);
  };
  std::printf(
      "{\"threads\": %d, \"seconds\": %.1f, \"bytes\": %zu, \"rate\": %.0f, \"pairs\": %llu, \"failed\": %llu, "
      "\"p50_ns\": %.0f, \"p99_ns\": %.0f, \"p999_ns\": %.0f, \"p9999_ns\": %.0f, \"max_ns\": %llu, "
      "\"over_1ms\": %llu, \"over_10ms\": %llu}\n",
      threads, seconds, bytes, rate, static_cast<unsigned long long>(all.pairs),
      static_cast<unsigned long long>(all.failed), pct(0.5), pct(0.99), pct(0.999), pct(0.9999),
      static_cast<unsigned long long>(all.max_ns), static_cast<unsigned long long>(all.over_1ms),
      static_cast<unsigned long long>(all.over_10ms));
  return all.failed ? 1 : 0;
}
