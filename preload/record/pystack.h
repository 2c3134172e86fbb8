// Python frames of the calling thread, read straight from the interpreter's own structures
// (CPython 3.10 to 3.13; the layouts are in pystack_layout.h), so that a stack through
// libpython names the script's functions and lines instead of _PyEval_EvalFrameDefault.
//
// Found at run time, never linked: the interpreter is whatever libpython (or statically linked
// python executable) the process has, located by dlsym once, and again after objects are
// loaded if it was absent. What it may and may not do, and why (docs/coverage.md repeats it):
//  - it never calls into Python code, never takes a lock the interpreter owns, never creates
//    a Python object and never touches a reference count: it only calls PyGILState_GetThisThreadState
//    (a thread-specific-data read) and Py_IsInitialized, then follows pointers;
//  - it reads only the calling thread's own frames. A thread that called into C from Python
//    (ctypes releases the GIL; so do PyTorch's operators) cannot change them while it is in
//    that call, and the frames hold references to their code objects, so the GIL is not
//    needed; a thread without a Python thread state (PyTorch's autograd workers, native
//    threads) simply has no Python frames and keeps its native stack;
//  - every code object pointer is checked to be a PyCode_Type object before it is read.
// Each distinct code object is written once per file as a py_code record (filename, name,
// first line, raw line table) before any stack names it; lines are computed offline.
#pragma once

#include <cstdint>

namespace gpuheap {
namespace preload {

// GPUHEAP_PYTHON_STACKS. Looks for the interpreter (cheap when absent).
void pystack_configure(bool enabled) noexcept;
bool pystack_available() noexcept;  // an interpreter of a known version was found
// GPUHEAP_STACK_CACHE: each thread keeps the code ids it found last (pystack.cpp's memo).
void pystack_cache_enable(bool on) noexcept;

// Objects were loaded since the last look (modules.h): look for an interpreter again if none
// was found. Called on the rare path that writes a new stack record.
void pystack_reprobe() noexcept;

// Writes up to `cap` Python frame entries (format::py_frame), innermost first, for the calling
// thread. Returns how many; 0 without an interpreter, a thread state or frames.
int pystack_capture(std::uint64_t* out, int cap) noexcept;

// True for a return address inside the interpreter's evaluation loop: where a native stack
// enters Python frames (the unwinder stops there when Python frames were captured).
bool pystack_is_eval_ip(std::uint64_t ip) noexcept;

// New trace file (each code record must be written again); fork handlers.
void pystack_reset() noexcept;
void pystack_fork_prepare() noexcept;
void pystack_fork_parent() noexcept;
void pystack_fork_child() noexcept;

}  // namespace preload
}  // namespace gpuheap
