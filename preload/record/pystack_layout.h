// Byte offsets into CPython's (non-free-threaded, 64-bit) structures, per minor version: the
// only version-specific knowledge pystack.cpp has. From CPython's headers of each release
// (Include/cpython/pystate.h, Include/internal/pycore_frame.h, Include/cpython/code.h,
// Include/cpython/unicodeobject.h); 3.11's were checked with offsetof against the installed
// python3.11-dev headers, 3.12's on the GPU machine's interpreter (tests/gpu).
//
//   3.10  PyThreadState.frame -> PyFrameObject {f_back, f_code, int f_lasti}
//   3.11  PyThreadState.cframe -> _PyCFrame.current_frame -> _PyInterpreterFrame
//         {f_code, previous, _Py_CODEUNIT* prev_instr}
//   3.12  as 3.11, other offsets; frames owned by the C stack (shims) are skipped
//   3.13  PyThreadState.current_frame -> _PyInterpreterFrame {f_executable, previous,
//         instr_ptr}; shims skipped
// lasti, the code unit being executed, is (instr - co_code_adaptive) / 2 from 3.11 on, and
// f_lasti itself in 3.10 (already in code units there).
#pragma once

#include <cstdint>

namespace gpuheap {
namespace preload {

struct PyLayout {
  int minor;
  // thread state -> innermost frame: ts_frame directly, or through ts_cframe->cframe_current
  int ts_frame, ts_cframe, cframe_current;
  // frame
  int fr_code, fr_previous, fr_instr;
  bool fr_lasti_is_int;  // 3.10: fr_instr is an int f_lasti, not an instruction pointer
  int fr_owner;          // offset of the owner byte; -1: none to check
  // code object
  int co_firstlineno, co_filename, co_name, co_qualname /* -1: none (use co_name) */, co_linetable;
  int co_code;  // co_code_adaptive (the instructions inside the object); -1 in 3.10
  // str objects: where a compact ASCII / compact non-ASCII string's characters start
  int str_ascii_data, str_compact_data;
  bool str_needs_ready;  // <= 3.11: the `ready` state bit must be set
};

inline constexpr int kOwnedByCStack = 3;  // FRAME_OWNED_BY_CSTACK (3.12, 3.13)

inline constexpr PyLayout kPyLayouts[] = {
    // minor ts_frame ts_cframe cf_cur | code prev instr int owner | firstl file name qual ltab code | str
    {10, 24, -1, -1, 32, 24, 96, true, -1, 40, 104, 112, -1, 120, -1, 48, 72, true},
    {11, -1, 56, 8, 32, 48, 56, false, -1, 72, 112, 120, 128, 136, 184, 48, 72, true},
    {12, -1, 56, 0, 0, 8, 56, false, 70, 68, 112, 120, 128, 136, 192, 40, 56, false},
    {13, 72, -1, -1, 0, 8, 56, false, 70, 68, 112, 120, 128, 136, 200, 40, 56, false},
};

inline const PyLayout* py_layout(int major, int minor) {
  if (major != 3) return nullptr;
  for (const auto& l : kPyLayouts)
    if (l.minor == minor) return &l;
  return nullptr;
}

// Common to every version: PyObject {refcnt, type}, PyVarObject.ob_size, PyBytesObject.ob_sval,
// PyASCIIObject.length and .state (interned:2, kind:3, compact:1, ascii:1, ...).
inline constexpr int kObType = 8, kVarSize = 16, kBytesData = 32, kStrLength = 16, kStrState = 32;

}  // namespace preload
}  // namespace gpuheap
