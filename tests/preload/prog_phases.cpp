// Phases and live counters through the public C API (preload/gpuheap.h, found with dlsym as
// a program that also runs without gpuheap would) and NVTX ranges through NVTX's own v3
// header-only loader (CUDA's nvtx3/). Exits non-zero with a message when a counter is wrong;
// test_phases.cpp checks the phase records in the trace.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "preload/gpuheap.h"
#include "tests/preload/prog_expect.h"

template <class F>
F* api(const char* name) {
  return reinterpret_cast<F*>(dlsym(RTLD_DEFAULT, name));
}

// One call site, allocating n times (the stack cache serves it after its first misses).
__attribute__((noinline)) int churn(int n) {
  for (int i = 0; i < n; ++i) {
    void* p = nullptr;
    EXPECT(cudaMalloc(&p, 512) == cudaSuccess && cudaFree(p) == cudaSuccess);
  }
  return 0;
}

// gpuheap_stack_stats: what the stacks cost is in its counters, over every thread. "stacks_off":
// run with GPUHEAP_STACKS=0, every counter stays 0.
int stack_stats(bool on) {
  auto* stack_stats = api<int(gpuheap_stack_stats_t*)>("gpuheap_stack_stats");
  EXPECT(stack_stats != nullptr);
  EXPECT(stack_stats(nullptr) == -1);
  gpuheap_stack_stats_t st{};
  st.size = sizeof st.size;
  EXPECT(stack_stats(&st) == -1);
  int rc = 0;
  std::thread t([&rc] { rc = churn(100); });
  t.join();
  EXPECT(rc == 0 && churn(200) == 0);
  st.size = sizeof st;
  EXPECT(stack_stats(&st) == 0);
  const unsigned long long failures = st.fill_failed_size + st.fill_failed_off_stack + st.fill_failed_register +
                                      st.fill_failed_walk;
  std::printf("captures %llu hits %llu walks %llu fills %llu waits %llu failures %llu stale %llu frames %llu\n",
              (unsigned long long)st.captures, (unsigned long long)st.cache_hits, (unsigned long long)st.walks,
              (unsigned long long)st.fills, (unsigned long long)st.fill_waits, failures,
              (unsigned long long)st.cache_stale, (unsigned long long)st.native_frames);
  if (!on) {
    EXPECT(st.captures == 0 && st.cache_hits == 0 && st.walks == 0 && st.native_frames == 0);
    return 0;
  }
  EXPECT(st.captures >= 300 && st.captures < 320);  // 300 allocations, and what start-up took
  EXPECT(st.cache_hits + st.walks - st.rewalks == st.captures);
  EXPECT(st.cache_hits >= 290);  // each thread: walked twice, filled, then served
  EXPECT(st.fills >= 2 && st.fill_waits >= 2 && st.fills + st.fill_waits + failures <= st.walks);
  EXPECT(st.native_frames >= st.walks && st.python_frames == 0);
  // An older caller's shorter struct: only its fields are written.
  struct {
    gpuheap_stack_stats_t head;
    unsigned char canary[8];
  } old{};
  old.head.size = offsetof(gpuheap_stack_stats_t, walks);
  old.head.walks = 77;
  EXPECT(stack_stats(&old.head) == 0 && old.head.cache_hits >= 290 && old.head.walks == 77);
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]).rfind("stacks", 0) == 0) return stack_stats(std::string(argv[1]) == "stacks");
  auto* push = api<void(const char*)>("gpuheap_push");
  auto* pop = api<void()>("gpuheap_pop");
  auto* mark = api<void(const char*)>("gpuheap_mark");
  auto* stats = api<int(int, gpuheap_stats_t*)>("gpuheap_stats");
  auto* reset_peak = api<void(int)>("gpuheap_reset_peak");
  auto* version = api<int()>("gpuheap_api_version");
  if (argc > 1 && std::string(argv[1]) == "absent") {  // run without the preload
    EXPECT(!push && !pop && !stats);
    nvtxRangePushA("ignored");
    nvtxRangePop();
    return 0;
  }
  EXPECT(push && pop && mark && stats && reset_peak && version);
  EXPECT(version() == GPUHEAP_API_VERSION);

  gpuheap_stats_t s{};
  s.size = sizeof s;
  EXPECT(stats(0, &s) == 0 && s.device == 0 && s.allocated_bytes == 0);
  EXPECT(stats(64, &s) == -1 && stats(0, nullptr) == -1);
  gpuheap_stats_t tiny{};
  tiny.size = 1;
  EXPECT(stats(0, &tiny) == -1);

  mark("start");
  push("load");
  void* a = nullptr;
  void* b = nullptr;
  EXPECT(cudaMalloc(&a, 1000) == cudaSuccess);  // pooled: a 1024-byte block
  EXPECT(cudaMalloc(&b, 3 << 20) == cudaSuccess);
  pop();
  s.size = sizeof s;
  EXPECT(stats(0, &s) == 0);
  EXPECT(s.requested_bytes == 1000 + (3u << 20));
  EXPECT(s.allocated_bytes == 1024 + (3u << 20));
  EXPECT(s.reserved_bytes >= s.allocated_bytes);
  EXPECT(s.alloc_count == 2);
  EXPECT(cudaFree(b) == cudaSuccess);
  EXPECT(stats(0, &s) == 0);
  EXPECT(s.requested_bytes == 1000 && s.allocated_bytes == 1024);
  EXPECT(s.requested_peak_bytes == 1000 + (3u << 20) && s.allocated_peak_bytes == 1024 + (3u << 20));
  reset_peak(0);
  EXPECT(stats(0, &s) == 0 && s.allocated_peak_bytes == 1024 && s.requested_peak_bytes == 1000);
  // An older caller's shorter struct: only its fields are written.
  struct {
    gpuheap_stats_t head;
    unsigned char canary[8];
  } old{};
  old.head.size = offsetof(gpuheap_stats_t, allocated_bytes);
  old.head.allocated_bytes = 77;
  EXPECT(stats(0, &old.head) == 0 && old.head.requested_bytes == 1000 && old.head.allocated_bytes == 77);

  // A name longer than the format's limit is cut, not refused.
  push(std::string(1000, 'x').c_str());
  pop();
  push(nullptr);
  pop();

  // NVTX: recorded only when NVTX_INJECTION64_PATH names libgpuheap.so.
  nvtxMarkA("nvtx-mark");
  const char* inj = std::getenv("NVTX_INJECTION64_PATH");
  EXPECT(nvtxRangePushA("forward") == 0 || !inj || !std::strstr(inj, "libgpuheap"));  // level 0
  void* c = nullptr;
  EXPECT(cudaMalloc(&c, 4096) == cudaSuccess);
  nvtxRangePushW(L"inner\u00e9");
  nvtxRangePop();
  nvtxRangePop();
  nvtxEventAttributes_t attr{};
  attr.version = NVTX_VERSION;
  attr.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
  attr.messageType = NVTX_MESSAGE_TYPE_ASCII;
  attr.message.ascii = "backward";
  nvtxDomainHandle_t dom = nvtxDomainCreateA("gpuheap-test");
  nvtxDomainRangePushEx(dom, &attr);
  attr.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
  attr.message.registered = nvtxDomainRegisterStringA(dom, "registered");
  nvtxDomainRangePushEx(dom, &attr);
  nvtxDomainRangePop(dom);
  nvtxDomainRangePop(dom);
  EXPECT(cudaFree(c) == cudaSuccess);

  // Threads: each range nests on its own thread.
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([&, i] {
      std::string name = "thread-" + std::to_string(i);
      for (int k = 0; k < 100; ++k) {
        push(name.c_str());
        pop();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT(cudaFree(a) == cudaSuccess);
  EXPECT(stats(0, &s) == 0 && s.allocated_bytes == 0 && s.requested_bytes == 0);
  return 0;
}
