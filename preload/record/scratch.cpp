#include "preload/record/scratch.h"

#include <pthread.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

// glibc's registration of a thread-exit destructor (what C++ thread_local destructors use):
// unlike pthread_key_create it takes none of the program's PTHREAD_KEYS_MAX keys.
extern "C" int __cxa_thread_atexit_impl(void (*dtor)(void*), void* obj, void* dso_symbol);
extern "C" void* __dso_handle;

#if defined(__x86_64__)
// gpuheap_call_on_stack(arg, fn, top): fn(arg, true) with the stack pointer at `top`, then
// back. The CFI describes the frame through %rbp, so unwinders (libunwind's fast trace, gdb)
// step from fn's frames on the scratch stack back onto the thread's own: a stack captured
// there still reaches the program's frames.
extern "C" void gpuheap_call_on_stack(void* arg, gpuheap::preload::DeepFn fn, void* top)
    __attribute__((visibility("hidden")));
asm(R"(
  .text
  .p2align 4
  .globl gpuheap_call_on_stack
  .hidden gpuheap_call_on_stack
  .type gpuheap_call_on_stack, @function
gpuheap_call_on_stack:
  .cfi_startproc
  pushq %rbp
  .cfi_def_cfa_offset 16
  .cfi_offset %rbp, -16
  movq %rsp, %rbp
  .cfi_def_cfa_register %rbp
  movq %rsi, %rax
  movq %rdx, %rsp
  movl $1, %esi
  callq *%rax
  movq %rbp, %rsp
  popq %rbp
  .cfi_def_cfa %rsp, 8
  retq
  .cfi_endproc
  .size gpuheap_call_on_stack, .-gpuheap_call_on_stack
)");
#define GPUHEAP_HAVE_SCRATCH 1
#endif

namespace gpuheap {
namespace preload {
namespace {

// Sanitizers keep their own picture of each thread's stack: never switch under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCanSwitch = false;
#elif defined(GPUHEAP_HAVE_SCRATCH)
constexpr bool kCanSwitch = true;
#else
constexpr bool kCanSwitch = false;
#endif

constexpr std::size_t kGuardBytes = 4096;  // PROT_NONE below the scratch: overflow faults

// The thread's stack bounds, looked up at its first deep call. t_hi == 0: not yet;
// t_lo == t_hi: unknown.
thread_local std::uintptr_t t_lo __attribute__((tls_model("initial-exec"))) = 0;
thread_local std::uintptr_t t_hi __attribute__((tls_model("initial-exec"))) = 0;
thread_local bool t_on_scratch __attribute__((tls_model("initial-exec"))) = false;

constinit std::atomic<std::size_t> g_refused{0};

std::uintptr_t page_size() {
  long p = sysconf(_SC_PAGESIZE);
  return p > 0 ? static_cast<std::uintptr_t>(p) : 4096;
}

// The main thread's stack grows on demand up to RLIMIT_STACK below its top, which lies just
// above the executable's name (AT_EXECFN: the kernel puts that string at the top of the initial
// stack). glibc's pthread_getattr_np finds the same bounds through /proc/self/maps, with
// fopen and malloc: not something to do inside a hook, nor with the program's last fd.
bool main_bounds(std::uintptr_t sp, std::uintptr_t* lo, std::uintptr_t* hi) {
  auto* name = reinterpret_cast<const char*>(getauxval(AT_EXECFN));
  rlimit rl{};
  if (!name || getrlimit(RLIMIT_STACK, &rl) != 0) return false;
  std::uintptr_t top = reinterpret_cast<std::uintptr_t>(name) + strlen(name) + 1;
  top = (top + page_size() - 1) & ~(page_size() - 1);
  std::uintptr_t bottom = rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= top ? 1 : top - rl.rlim_cur;
  if (sp <= bottom || sp > top) return false;  // not on the initial stack
  *lo = bottom, *hi = top;
  return true;
}

void find_bounds(std::uintptr_t sp) {
  std::uintptr_t lo = 0, hi = 0;
  if (!main_bounds(sp, &lo, &hi)) {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* addr = nullptr;
      std::size_t size = 0;
      if (pthread_attr_getstack(&attr, &addr, &size) == 0 && addr) {
        lo = reinterpret_cast<std::uintptr_t>(addr);
        hi = lo + size;
      }
      pthread_attr_destroy(&attr);
    }
  }
  if (hi == 0) lo = hi = 1;  // unknown
  t_lo = lo, t_hi = hi;
}

#if defined(GPUHEAP_HAVE_SCRATCH)
thread_local unsigned char* t_scratch __attribute__((tls_model("initial-exec"))) = nullptr;
// The thread's exit destructor ran (or could not be registered): a scratch mapped now is
// unmapped after use.
thread_local bool t_no_dtor __attribute__((tls_model("initial-exec"))) = false;

void release_scratch(void* p) {
  munmap(p, kGuardBytes + kScratchBytes);
  if (t_scratch == p) t_scratch = nullptr;
}

void thread_exit(void* p) {
  t_no_dtor = true;  // a later deep call on this thread (another destructor's) maps and unmaps
  release_scratch(p);
}

// The calling thread's scratch stack (its lowest address, the guard page), mapped now if need
// be; nullptr if it cannot be. MAP_NORESERVE: only the pages deep work touches count.
unsigned char* scratch() {
  if (t_scratch) return t_scratch;
  void* p = mmap(nullptr, kGuardBytes + kScratchBytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  if (mprotect(p, kGuardBytes, PROT_NONE) != 0) {
    munmap(p, kGuardBytes + kScratchBytes);
    return nullptr;
  }
  t_scratch = static_cast<unsigned char*>(p);
  if (!t_no_dtor && !release_at_thread_exit(thread_exit, p)) t_no_dtor = true;
  return t_scratch;
}
#endif

}  // namespace

bool release_at_thread_exit(void (*dtor)(void*), void* p) noexcept {
  return syscall(SYS_gettid) == getpid() || __cxa_thread_atexit_impl(dtor, p, &__dso_handle) == 0;
}

std::size_t stack_room() noexcept {
  auto sp = reinterpret_cast<std::uintptr_t>(__builtin_frame_address(0));
  if (t_hi == 0) find_bounds(sp);
  return sp > t_lo && sp <= t_hi ? sp - t_lo : 0;
}

bool stack_bounds(std::uintptr_t sp, std::uintptr_t* lo, std::uintptr_t* hi) noexcept {
  if (t_hi == 0) find_bounds(sp);
  if (!(sp > t_lo && sp < t_hi)) return false;
  *lo = t_lo, *hi = t_hi;
  return true;
}

__attribute__((noinline)) bool run_deep(DeepFn fn, void* arg) noexcept {
  if (t_on_scratch) {  // already there (a nested call): the scratch has room for both
    fn(arg, false);
    return true;
  }
#if defined(GPUHEAP_HAVE_SCRATCH)
  if (unsigned char* s = kCanSwitch ? scratch() : nullptr) {
    t_on_scratch = true;
    gpuheap_call_on_stack(arg, fn, s + kGuardBytes + kScratchBytes);
    t_on_scratch = false;
    if (t_no_dtor) release_scratch(s);
    return true;
  }
#endif
  if (stack_room() >= kDeepMinRoom) {
    fn(arg, false);
    return true;
  }
  g_refused.fetch_add(1, std::memory_order_relaxed);
  return false;
}

std::size_t deep_refused_count() noexcept { return g_refused.load(std::memory_order_relaxed); }

}  // namespace preload
}  // namespace gpuheap
