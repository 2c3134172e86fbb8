// Python frames in recorded stacks (format/trace.h: kPyFrameTag entries and py_code records):
// the line a frame was executing, decoded from the code object's own line table, and the
// merge of a stack's native and Python frames that every report shows.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analyzer/symbolize/symbolize.h"
#include "analyzer/trace/tables.h"

namespace gpuheap {

// The source line of code unit `lasti` of a code object, from its co_linetable: 3.10's
// (address delta, line delta) byte pairs, or the location table of 3.11 and later
// (CPython's Objects/locations.md). `firstlineno` when lasti is kPyNoLasti (a frame not
// started yet); 0 when the table has no line there. Never reads outside `table`.
int py_line(int minor, int firstlineno, std::string_view table, std::uint32_t lasti);

// The frame a Python stack entry names; function "<unknown Python code N>" for an id without
// a record (a cut or damaged trace).
Frame py_frame_of(const std::unordered_map<std::uint32_t, PyCode>& codes, std::uint64_t entry);

// True for a native frame of the interpreter's call machinery (libpython, the python
// executable, ctypes, libffi): in a stack with Python frames, the Python frames say it better.
bool is_interpreter_frame(const Frame& f);

}  // namespace gpuheap
