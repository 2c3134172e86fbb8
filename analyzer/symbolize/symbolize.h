// Offline symbolization of trace stacks: module map (from `module` records) + libdw.
// Never executes or dlopens anything named in a trace: it only reads ELF/DWARF files
// (regular files, opened read-only through safe_file.h) at the recorded paths, checking the
// build-id when the trace recorded one (a mismatch falls back to module+offset); separate
// debug files and dwz files are looked for through the same guard (debuginfo.h).
//
// Frames stored in the trace (symbol_string / symbol_frames records, written by `gpuheap
// symbolize` where the modules were) are used first; the modules on this machine only for
// the ips the trace has no stored frames for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "analyzer/trace/tables.h"  // StoredSymbols (use_stored)
#include "format/trace.h"

namespace gpuheap {

struct Frame {
  std::uint64_t ip = 0;      // absolute address looked up: return address - 1 (inside the call)
  std::string function;      // demangled; empty when unknown
  std::string file;          // source file; empty when no debug info
  int line = 0;              // 0 when unknown
  std::string module;        // module path ("" when the ip is in no known module)
  std::uint64_t offset = 0;  // ip - module base (for "module+0x1234" display)
  bool inlined = false;      // an inlined frame (expanded from the frame below it)
  bool hidden = false;       // inside gpuheap or the CUDA libraries (hidden by default)
};

// The file name of a path ("libc.so.6" of "/lib/x86_64-linux-gnu/libc.so.6").
std::string_view base_name(std::string_view path);
// gpuheap's own library and the CUDA runtime/driver (libgpuheap*, libcudart*, libcuda.so*):
// the frames between a program's call and every recorded allocation.
bool hook_side_module(std::string_view path);
// A frame's display name: its function, else module+0xOFFSET, else the raw address.
std::string frame_name(const Frame& f);
void append_frame_name(std::string& out, const Frame& f);  // frame_name(f) appended to out

// A module the trace names whose frames could not be symbolized here (not on this machine,
// not a usable ELF file, or another build), with why. Collected over the whole command so
// that it says so once (report_missing_modules), not once per module and report.
struct MissingModule {
  std::string path, why;
};
std::vector<MissingModule> missing_modules();
// One stderr line ("N modules of the trace are not on this machine: ..."), or with verbose
// one line per module; nothing when none is missing. Clears the list.
void report_missing_modules(bool verbose);

class Symbolizer {
 public:
  Symbolizer();
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // Strings are copied. Later modules at an overlapping range win (dlclose + dlopen).
  void add_module(const format::ModuleRecord& m);
  // Frames stored in the trace, used before any module is opened. Not copied: `s` must
  // outlive the Symbolizer (it is the Model's).
  void use_stored(const StoredSymbols* s);

  // Symbolizes one stack (innermost first, as recorded: return addresses). Every ip is moved
  // back by one byte so that file:line names the call, not the instruction after it: the
  // preload records return addresses only (its own frames are skipped, no interrupted PC
  // is ever recorded), the innermost included. Inlined frames are expanded (innermost
  // first). Results are cached per ip.
  // Frames in gpuheap's own library, libcudart*, libcuda.so*, and static cudart code
  // (functions in the `cudart::` namespace or named __cudart*) are marked hidden; with
  // all_frames=false they are dropped from the result, and so are the C runtime's startup
  // frames (_start, __libc_start_main, __libc_start_call_main, start_thread, clone): the
  // stack stops at `main`. A stack that would become empty keeps its frames.
  std::vector<Frame> symbolize(const std::vector<std::uint64_t>& ips, bool all_frames = false);

  // "function (file:line)" / "function (module+0xoff)" / "0xip" — one frame, for text reports.
  static std::string format_frame(const Frame& f);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gpuheap
