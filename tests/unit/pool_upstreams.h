// Test doubles for gpuheap::pool::Upstream (host memory instead of a GPU).
//   HostUpstream      aligned_alloc segments; fences complete at once (auto) or only when
//                     the test says so (manual: fence_wait then counts as a forced wait);
//                     injectable clock; optional capacity (LimitingUpstream).
//   DelayingUpstream  simulates a GPU: one worker thread per simulated stream runs
//                     "kernels" in order, each after its delay; a fence captures the tail of
//                     every stream, like cudaEventRecord on each stream.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pool/pool.h"

namespace gpuheap::test {

inline std::uint64_t steady_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

class HostUpstream : public pool::Upstream {
 public:
  enum class Fences { auto_complete, manual };
  explicit HostUpstream(Fences mode = Fences::auto_complete, std::size_t capacity = 0)
      : mode_(mode), capacity_(capacity) {}
  ~HostUpstream() override {
    for (auto& [p, n] : live_) std::free(p);
  }

  void* allocate(std::size_t bytes) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    ++alloc_calls_;
    if (capacity_ && in_use_ + bytes > capacity_) return nullptr;
    void* p = std::aligned_alloc(512, bytes);
    if (!p) return nullptr;
    live_[p] = bytes;
    in_use_ += bytes;
    return p;
  }
  void deallocate(void* p, std::size_t bytes) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    auto it = live_.find(p);
    if (it == live_.end() || it->second != bytes) ++bad_frees_;
    if (it != live_.end()) {
      in_use_ -= it->second;
      live_.erase(it);
    }
    std::free(p);
  }
  Fence fence_record() noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    ++records_;
    return ++last_fence_;
  }
  bool fence_done(Fence f) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    return mode_ == Fences::auto_complete || f <= completed_;
  }
  void fence_wait(Fence f) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    if (mode_ == Fences::manual && f > completed_) {
      ++forced_waits_;
      completed_ = f;  // the "GPU" finishes everything up to f while the host waits
    }
  }
  void fence_release(Fence) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    ++released_;
  }
  std::uint64_t now_ns() noexcept override {
    std::uint64_t m = manual_now_.load(std::memory_order_relaxed);
    return m ? m : steady_ns();
  }

  // --- test controls / observations ---
  void complete_all() {
    std::lock_guard<std::mutex> g(mu_);
    completed_ = last_fence_;
  }
  void set_now(std::uint64_t ns) { manual_now_.store(ns); }  // 0 = real clock
  std::size_t in_use() {
    std::lock_guard<std::mutex> g(mu_);
    return in_use_;
  }
  std::size_t segments_live() {
    std::lock_guard<std::mutex> g(mu_);
    return live_.size();
  }
  // Fences recorded so far / completed so far (manual mode): a block freed when
  // last_fence() was L may be reported complete only once completed() > L.
  Fence last_fence() {
    std::lock_guard<std::mutex> g(mu_);
    return last_fence_;
  }
  Fence completed() {
    std::lock_guard<std::mutex> g(mu_);
    return completed_;
  }
  std::uint64_t records() {
    std::lock_guard<std::mutex> g(mu_);
    return records_;
  }
  std::uint64_t forced_waits() {
    std::lock_guard<std::mutex> g(mu_);
    return forced_waits_;
  }
  std::uint64_t released() {
    std::lock_guard<std::mutex> g(mu_);
    return released_;
  }
  std::uint64_t alloc_calls() {
    std::lock_guard<std::mutex> g(mu_);
    return alloc_calls_;
  }
  std::uint64_t bad_frees() {
    std::lock_guard<std::mutex> g(mu_);
    return bad_frees_;
  }

 private:
  std::mutex mu_;
  Fences mode_;
  std::size_t capacity_, in_use_ = 0;
  std::map<void*, std::size_t> live_;
  Fence last_fence_ = 0, completed_ = 0;
  std::uint64_t records_ = 0, forced_waits_ = 0, released_ = 0, alloc_calls_ = 0, bad_frees_ = 0;
  std::atomic<std::uint64_t> manual_now_{0};
};

// "Device memory" of `capacity` bytes: allocations beyond it fail like cudaMalloc's OOM.
class LimitingUpstream : public HostUpstream {
 public:
  explicit LimitingUpstream(std::size_t capacity) : HostUpstream(Fences::auto_complete, capacity) {}
};

class DelayingUpstream : public pool::Upstream {
 public:
  using Kernel = std::function<void()>;
  explicit DelayingUpstream(int streams) : streams_(static_cast<std::size_t>(streams)) {
    for (auto& s : streams_) s.worker = std::thread([this, &s] { run(s); });
  }
  ~DelayingUpstream() override {
    {
      std::lock_guard<std::mutex> g(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& s : streams_) s.worker.join();
    for (auto& [p, n] : live_) std::free(p);
  }

  // Enqueue a kernel on stream `s`: it starts after the previous kernel of s finished and
  // `delay` elapsed (a long-running kernel), then runs fn on the stream's worker.
  void launch(int s, std::chrono::milliseconds delay, Kernel fn) {
    {
      std::lock_guard<std::mutex> g(mu_);
      Stream& st = streams_[static_cast<std::size_t>(s)];
      st.queue.push_back({delay, std::move(fn)});
      ++st.enqueued;
    }
    cv_.notify_all();
  }
  // cudaDeviceSynchronize
  void synchronize() {
    std::unique_lock<std::mutex> g(mu_);
    cv_.wait(g, [&] {
      for (auto& s : streams_)
        if (s.completed != s.enqueued) return false;
      return true;
    });
  }

  void* allocate(std::size_t bytes) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    void* p = std::aligned_alloc(512, bytes);
    if (p) live_[p] = bytes;
    return p;
  }
  void deallocate(void* p, std::size_t) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    live_.erase(p);
    std::free(p);
  }
  Fence fence_record() noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<std::uint64_t> tails;
    for (auto& s : streams_) tails.push_back(s.enqueued);
    fences_[++last_fence_] = std::move(tails);
    return last_fence_;
  }
  bool fence_done(Fence f) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    return done_locked(f);
  }
  void fence_wait(Fence f) noexcept override {
    std::unique_lock<std::mutex> g(mu_);
    ++waits_;
    cv_.wait(g, [&] { return done_locked(f); });
  }
  void fence_release(Fence f) noexcept override {
    std::lock_guard<std::mutex> g(mu_);
    fences_.erase(f);
  }
  std::uint64_t now_ns() noexcept override { return steady_ns(); }
  std::uint64_t waits() {
    std::lock_guard<std::mutex> g(mu_);
    return waits_;
  }

 private:
  struct Item {
    std::chrono::milliseconds delay;
    Kernel fn;
  };
  struct Stream {
    std::deque<Item> queue;
    std::uint64_t enqueued = 0, completed = 0;
    std::thread worker;
  };
  bool done_locked(Fence f) {
    auto it = fences_.find(f);
    if (it == fences_.end()) return true;  // released fences are long done
    for (std::size_t i = 0; i < streams_.size(); ++i)
      if (streams_[i].completed < it->second[i]) return false;
    return true;
  }
  void run(Stream& s) {
    std::unique_lock<std::mutex> g(mu_);
    for (;;) {
      cv_.wait(g, [&] { return stop_ || !s.queue.empty(); });
      if (s.queue.empty()) return;  // stop_ and drained
      Item it = std::move(s.queue.front());
      g.unlock();
      std::this_thread::sleep_for(it.delay);
      it.fn();
      g.lock();
      s.queue.pop_front();
      ++s.completed;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Stream> streams_;
  bool stop_ = false;
  std::map<void*, std::size_t> live_;
  std::map<Fence, std::vector<std::uint64_t>> fences_;
  Fence last_fence_ = 0;
  std::uint64_t waits_ = 0;
};

// Records observer callbacks in order, and tracks segments for invariant checks.
class RecordingObserver : public pool::PoolObserver {
 public:
  struct Event {
    char kind;  // 'A' seg alloc, 'F' seg free, 'C' free completed, 'R' retry, 'E' empty cache
    std::uintptr_t ptr;
    std::size_t size;
    int extra;
  };
  void on_segment_alloc(void* p, std::size_t n, bool small) noexcept override {
    add({'A', reinterpret_cast<std::uintptr_t>(p), n, small});
    std::lock_guard<std::mutex> g(mu_);
    segments_[reinterpret_cast<std::uintptr_t>(p)] = n;
  }
  void on_segment_free(void* p, std::size_t n, bool small) noexcept override {
    add({'F', reinterpret_cast<std::uintptr_t>(p), n, small});
    std::lock_guard<std::mutex> g(mu_);
    segments_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  void on_free_completed(void* p, std::size_t n) noexcept override {
    add({'C', reinterpret_cast<std::uintptr_t>(p), n, 0});
  }
  void on_retry(std::size_t n) noexcept override { add({'R', 0, n, 0}); }
  void on_empty_cache(std::size_t n, format::EmptyCacheReason reason) noexcept override {
    add({'E', 0, n, static_cast<int>(reason)});
  }

  std::vector<Event> events() {
    std::lock_guard<std::mutex> g(mu_);
    return events_;
  }
  std::map<std::uintptr_t, std::size_t> segments() {
    std::lock_guard<std::mutex> g(mu_);
    return segments_;
  }
  std::string kinds() {
    std::lock_guard<std::mutex> g(mu_);
    std::string s;
    for (auto& e : events_) s += e.kind;
    return s;
  }
  void clear() {
    std::lock_guard<std::mutex> g(mu_);
    events_.clear();
  }

 private:
  void add(Event e) {
    std::lock_guard<std::mutex> g(mu_);
    events_.push_back(e);
  }
  std::mutex mu_;
  std::vector<Event> events_;
  std::map<std::uintptr_t, std::size_t> segments_;
};

}  // namespace gpuheap::test
