// Crash and exit-path scenarios for the reliability tests. Every mode first makes N (=100)
// cudaMalloc/cudaFree pairs plus one live 4 KiB block, prints "pairs=N", then ends:
//   segv | abort | throw        page fault / abort() / uncaught C++ exception
//   segv_handler | abort_handler  the same with the program's own handler installed (after
//                               gpuheap's): it prints "handler ran", restores SIG_DFL and
//                               re-raises, so the status must still be the signal's
//   segv_exit_handler           own SIGSEGV handler that prints and _exit(42)s
//   segv_handler_rearm          the live block is allocated first, then signal(SIGSEGV, ...)
//                               replaces gpuheap's handler; once gpuheap has put its own back
//                               in front (re-armed by its background thread), the N pairs
//                               are made and the program crashes at once: the handler
//                               prints "handler ran", restores SIG_DFL and re-raises
//   segv_siginfo_resethand_rearm  the same with sigaction(SA_SIGINFO | SA_RESETHAND |
//                               SA_NODEFER), System V style: the handler prints the fault
//                               address it was given and re-raises (reaching SIG_DFL)
//   thread_exit                 exit(7) from a non-main thread while 4 others allocate
//   quick_exit                  quick_exit(5)
//   underscore_exit             _exit(6)
//   static_dtor                 return 0; a static object's destructor cudaFree's after main
//   static_dtor_global          the same from a global constructed before CUDA initialised
//   nofree                      return 0 with the 100 blocks never freed (no cudaFree at all)
//   raise=N                     raise(N) (any signal number): a terminating one kills the
//                               program with signal N, whatever gpuheap does first
//   usr1_handler                after the pairs, installs its own SIGUSR1 handler, waits
//                               120 ms (several re-arm ticks), prints "handler kept" if the
//                               disposition is still its handler ("handler replaced" if not),
//                               then raise(SIGUSR1): the handler prints "handler ran" and the
//                               program returns 0
//   hup_ignored                 signal(SIGHUP, SIG_IGN) before any CUDA call; after the pairs,
//                               waits 60 ms, raise(SIGHUP) (ignored), returns 0
//   sigint_seen_at_start        prints SIGINT's disposition before any CUDA call
//                               ("sigint at start: default"/"handled"/"ignored", what a
//                               CPython start-up looks at), then raise(SIGINT) after the pairs
// SLEEP_MS (optional 2nd argument) sleeps before the ending, so the test can tell "events
// older than the flush interval" from "events of the last few ms".
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

namespace {

struct StaticHolder {
  void* p = nullptr;
  bool own_thread = false;
  ~StaticHolder() {
    // After main: gpuheap must record this free (or at least not crash on it). exit()
    // destroys the main thread's thread_locals before static objects, which simcuda's
    // context stack does not survive (a crash with or without gpuheap); own_thread makes
    // the call from a fresh thread so the after-main path of gpuheap itself is exercised.
    if (!p) return;
    int rc = -1;
    if (own_thread) std::thread([&] { rc = cudaFree(p); }).join();
    else rc = cudaFree(p);
    if (rc == cudaSuccess) std::fputs("static dtor freed\n", stdout);
    std::fflush(stdout);
  }
};
StaticHolder g_holder;

void say(const char* s) {
  if (write(STDOUT_FILENO, s, std::strlen(s)) < 0) {
  }
}

void handler_reraise(int sig) {
  say("handler ran\n");
  signal(sig, SIG_DFL);
  raise(sig);
}
void handler_info(int sig, siginfo_t* info, void*) {
  char line[96];
  int n = std::snprintf(line, sizeof line, "handler ran sig=%d si_signo=%d si_addr=%p\n", sig, info->si_signo,
                        info->si_addr);
  if (n > 0 && write(STDOUT_FILENO, line, static_cast<std::size_t>(n)) < 0) {
  }
  raise(sig);  // SA_RESETHAND: the disposition is SIG_DFL by now
}
void handler_note(int) { say("handler ran\n"); }
bool disposition_is(int sig, void (*h)(int)) {
  struct sigaction cur {};
  sigaction(sig, nullptr, &cur);
  return !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == h;
}
void handler_exit(int) {
  say("handler ran\n");
  _exit(42);
}

int make_pairs(int n) {
  for (int i = 0; i < n; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, 1024u * static_cast<unsigned>(1 + i % 8)) != cudaSuccess) return 1;
    if (cudaFree(p) != cudaSuccess) return 1;
  }
  return 0;
}

}  // namespace

// Under gpuheap, waits (silently, up to 5 s) until SIGSEGV's handler is no longer `ours`:
// gpuheap's background thread has put its own in front again. Without gpuheap: returns.
void wait_for_rearm(void* ours) {
  if (!dlsym(RTLD_DEFAULT, "gpuheap_active")) return;
  for (int i = 0; i < 5000; ++i) {
    struct sigaction cur {};
    sigaction(SIGSEGV, nullptr, &cur);
    void* h = (cur.sa_flags & SA_SIGINFO) ? reinterpret_cast<void*>(cur.sa_sigaction)
                                          : reinterpret_cast<void*>(cur.sa_handler);
    if (h != ours) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "segv";
  int sleep_ms = argc > 2 ? std::atoi(argv[2]) : 0;
  const int n = 100;
  bool nofree = std::strcmp(mode, "nofree") == 0;
  bool rearm = std::strstr(mode, "_rearm") != nullptr;
  void* live = nullptr;
  if (std::strcmp(mode, "hup_ignored") == 0) signal(SIGHUP, SIG_IGN);
  if (std::strcmp(mode, "sigint_seen_at_start") == 0) {
    bool dfl = disposition_is(SIGINT, SIG_DFL), ign = disposition_is(SIGINT, SIG_IGN);
    std::printf("sigint at start: %s\n", dfl ? "default" : ign ? "ignored" : "handled");
  }
  if (rearm) {
    if (cudaMalloc(&live, 4096) != cudaSuccess) return 11;
    if (std::strcmp(mode, "segv_handler_rearm") == 0) {
      signal(SIGSEGV, handler_reraise);
      wait_for_rearm(reinterpret_cast<void*>(handler_reraise));
    } else {
      struct sigaction sa {};
      sa.sa_sigaction = handler_info;
      sigemptyset(&sa.sa_mask);
      sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_NODEFER;
      sigaction(SIGSEGV, &sa, nullptr);
      wait_for_rearm(reinterpret_cast<void*>(handler_info));
    }
  }
  if (nofree) {
    for (int i = 0; i < n; ++i) {
      void* p = nullptr;
      if (cudaMalloc(&p, 4096) != cudaSuccess) return 10;
    }
  } else if (make_pairs(n) != 0) {
    return 10;
  }
  if (!live && cudaMalloc(&live, 4096) != cudaSuccess) return 11;
  std::printf("pairs=%d\n", n);
  std::fflush(stdout);
  if (std::strcmp(mode, "segv_handler") == 0) signal(SIGSEGV, handler_reraise);
  if (std::strcmp(mode, "abort_handler") == 0) signal(SIGABRT, handler_reraise);
  if (std::strcmp(mode, "segv_exit_handler") == 0) signal(SIGSEGV, handler_exit);
  if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));

  if (std::strncmp(mode, "raise=", 6) == 0) {
    raise(std::atoi(mode + 6));
    return 22;
  }
  if (std::strcmp(mode, "usr1_handler") == 0) {
    signal(SIGUSR1, handler_note);
    std::this_thread::sleep_for(std::chrono::milliseconds(120));
    say(disposition_is(SIGUSR1, handler_note) ? "handler kept\n" : "handler replaced\n");
    raise(SIGUSR1);
    return 0;
  }
  if (std::strcmp(mode, "hup_ignored") == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(60));
    raise(SIGHUP);
    return 0;
  }
  if (std::strcmp(mode, "sigint_seen_at_start") == 0) {
    raise(SIGINT);
    return 22;
  }
  if (std::strncmp(mode, "segv", 4) == 0) {
    volatile int* bad = reinterpret_cast<volatile int*>(16);
    *bad = 1;
    return 20;
  }
  if (std::strncmp(mode, "abort", 5) == 0) std::abort();
  if (std::strcmp(mode, "throw") == 0) throw std::runtime_error("uncaught by design");
  if (std::strcmp(mode, "quick_exit") == 0) std::quick_exit(5);
  if (std::strcmp(mode, "underscore_exit") == 0) _exit(6);
  if (std::strcmp(mode, "static_dtor") == 0) {
    // Constructed after CUDA initialised: destroyed after main, before the runtime's own
    // teardown (atexit order), the well-defined case.
    static StaticHolder late;
    late.p = live;
    late.own_thread = true;
    return 0;
  }
  if (std::strcmp(mode, "static_dtor_global") == 0) {
    // Constructed before CUDA initialised: destroyed after the runtime's teardown (CUDA
    // documents this as undefined; the real runtime answers cudaErrorCudartUnloading).
    g_holder.p = live;
    return 0;
  }
  if (nofree) return 0;
  if (std::strcmp(mode, "thread_exit") == 0) {
    std::atomic<bool> go{true};
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t)
      ts.emplace_back([&] {
        while (go.load(std::memory_order_relaxed)) {
          void* p = nullptr;
          if (cudaMalloc(&p, 8192) == cudaSuccess) cudaFree(p);
        }
      });
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::exit(7);
    }).join();
    go = false;  // not reached
    for (auto& t : ts) t.join();
    return 21;
  }
  return 2;
}
