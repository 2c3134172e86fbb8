// The calling thread's stack is the program's: a hook must not need much of it. A program may
// call CUDA from a thread with a PTHREAD_STACK_MIN (16 KiB) stack, where libunwind's DWARF
// parsing, the first event's trace creation or the OOM report would overflow it. Such deep work
// runs through run_deep(), on a stack of gpuheap's own per thread (mapped at the thread's first
// event, released at its exit), so a hook takes the same small part of any thread's stack.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpuheap {
namespace preload {

// fn(arg, on_scratch): on_scratch says whether it runs on the scratch stack (one more frame,
// the switch, between it and run_deep's caller: stack capture counts frames).
using DeepFn = void (*)(void* arg, bool on_scratch);

// Runs fn(arg) where it cannot overflow the thread's stack: on the scratch stack; where there
// is none (it could not be mapped; sanitizer builds; not x86-64), in place if the thread has
// enough room left below the caller's frame (stack_room). When neither is possible, fn is not
// called and false is returned: the caller records less, never crashes.
bool run_deep(DeepFn fn, void* arg) noexcept;

// Bytes left on the calling thread's stack below the caller's frame, found from the thread's
// bounds (pthread_getattr_np once per thread; the main thread's from RLIMIT_STACK, as the kernel
// grows it). 0 when unknown (the stack pointer is outside the bounds: a fiber or coroutine
// stack): unknown counts as too little.
std::size_t stack_room() noexcept;

// The calling thread's stack bounds [lo, hi) when `sp` lies on it (found as stack_room does);
// false when they are unknown or sp is elsewhere (a fiber, an alternate signal stack).
bool stack_bounds(std::uintptr_t sp, std::uintptr_t* lo, std::uintptr_t* hi) noexcept;

// Room run_deep wants before it runs work in place: the deepest such path (the first event's
// trace creation, libunwind's DWARF parsing of a cold cache, the OOM report) with a margin.
inline constexpr std::size_t kDeepMinRoom = 48u << 10;
inline constexpr std::size_t kScratchBytes = 96u << 10;  // the scratch stack's usable size

// Has dtor(p) run when the calling thread exits, for memory of gpuheap's own that a thread maps
// at its first need (its scratch stack, stack cache, Python code memo). The process's initial
// thread is left alone: exit runs thread-exit destructors before the atexit handlers and static
// destructors, which may still allocate. False when it could not be registered.
bool release_at_thread_exit(void (*dtor)(void*), void* p) noexcept;

// How many times run_deep refused (tests and counters).
std::size_t deep_refused_count() noexcept;

}  // namespace preload
}  // namespace gpuheap
