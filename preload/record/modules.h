// Loaded ELF objects, for offline symbolization: a `module` record per object (path, load
// bias, PT_LOAD address range, GNU build id read from its PT_NOTE in memory), and a
// `module_unload` when one disappears (dlclose).
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpuheap {
namespace preload {

struct ModuleInfo {
  std::uint64_t base = 0, lo = 0, hi = 0;
  char* path = nullptr;  // malloc'd
  unsigned char build_id[64] = {};
  std::size_t build_id_len = 0;
};

// Snapshot of the loaded objects (dl_iterate_phdr). The main program's path is resolved
// through /proc/self/exe. Returns the count; *out is malloc'd (free with modules_free).
std::size_t modules_scan(ModuleInfo** out) noexcept;
void modules_free(ModuleInfo* mods, std::size_t n) noexcept;

// Scans and appends records for objects not yet written to this file, and module_unload
// for written ones that are gone. Serialised internally.
void modules_sync() noexcept;
// modules_sync() only when objects were loaded or unloaded since the last sync (glibc's
// dlpi_adds/dlpi_subs counters; one dl_iterate_phdr step). Called before a new stack record is
// written: Python and other dlopen users load the libraries that allocate (libtorch, CuPy,
// XLA) long after the trace starts, and their frames need module records to be symbolized.
void modules_sync_if_changed() noexcept;
// glibc's count of objects loaded, as of the last modules_sync_if_changed (0 after a reset).
unsigned long long modules_seen_adds() noexcept;
// New file: every module must be written again.
void modules_reset() noexcept;

void modules_fork_prepare() noexcept;
void modules_fork_parent() noexcept;
void modules_fork_child() noexcept;

}  // namespace preload
}  // namespace gpuheap
