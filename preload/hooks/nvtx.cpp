// NVTX ranges as gpuheap phases, through NVTX's injection interface: a program's first NVTX
// call loads the library named by NVTX_INJECTION64_PATH (`gpuheap run` points it at this
// preload, already loaded, so the dlopen finds the same object) and calls its exported
// InitializeInjectionNvtx2 with NVTX's export-table getter; we fill the slots of the calls we
// record in the CORE and CORE2 function tables (NVTX v3, nvtxDetail/nvtxInit.h and
// nvtxTypes.h). The entry point itself is in interpose.cpp (exports.map), over nvtx_attach.
// The types below mirror NVTX's public ABI (nvToolsExt.h, nvtxTypes.h): the preload does not
// include NVTX's header-only implementation.
#include <wchar.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "preload/hooks/nvtx.h"
#include "preload/record/recorder.h"

namespace {

using gpuheap::format::PhaseOp;
using gpuheap::format::PhaseSource;

// ---- NVTX ABI (values from nvtxTypes.h / nvToolsExt.h) ----
using NvtxFunctionPointer = void (*)();
using NvtxFunctionTable = NvtxFunctionPointer**;  // table[id] points at the slot of call id
struct NvtxExportTableCallbacks {
  std::size_t struct_size;
  int (*GetModuleFunctionTable)(int module, NvtxFunctionTable* out_table, unsigned* out_size);
};
using NvtxGetExportTableFunc = const void* (*)(std::uint32_t export_table_id);
constexpr std::uint32_t kEtidCallbacks = 1;  // NVTX_ETID_CALLBACKS
constexpr int kModuleCore = 1;               // NVTX_CB_MODULE_CORE
constexpr int kModuleCore2 = 5;              // NVTX_CB_MODULE_CORE2
// NVTX_CBID_CORE_*
constexpr unsigned kMarkEx = 1, kMarkA = 2, kMarkW = 3, kRangePushEx = 8, kRangePushA = 9, kRangePushW = 10,
                   kRangePop = 11;
// NVTX_CBID_CORE2_*
constexpr unsigned kDomainMarkEx = 1, kDomainRangePushEx = 4, kDomainRangePop = 5, kDomainRegisterStringA = 10,
                   kDomainRegisterStringW = 11;

// nvtxEventAttributes_v2: only the message is read.
struct EventAttributes {
  std::uint16_t version, size;
  std::uint32_t category;
  std::int32_t color_type;
  std::uint32_t color;
  std::int32_t payload_type, reserved0;
  std::uint64_t payload;
  std::int32_t message_type;  // 1 ascii, 2 unicode, 3 registered
  const void* message;
};
constexpr std::int32_t kMessageAscii = 1, kMessageUnicode = 2, kMessageRegistered = 3;

// ---- names ----
// A wide name as ASCII (other characters become '?'): names are for reading in reports.
struct WideName {
  char buf[gpuheap::format::kMaxPhaseName + 1] = {};
  explicit WideName(const wchar_t* w) noexcept {
    std::size_t i = 0;
    for (; w && w[i] && i < gpuheap::format::kMaxPhaseName; ++i)
      buf[i] = w[i] > 0 && w[i] < 0x80 ? static_cast<char>(w[i]) : '?';
    buf[i] = '\0';
  }
};

// Registered strings (nvtxDomainRegisterString*): copied into a fixed arena that lives as
// long as the process (NVTX handles never expire); the handle is the copy's address. A full
// arena hands out null handles, whose ranges are recorded unnamed.
constexpr std::size_t kArenaBytes = 64 * 1024;
char g_arena[kArenaBytes];
std::size_t g_arena_used = 0;
std::mutex g_arena_mu;

const char* intern(const char* s, std::size_t n) noexcept {
  if (n > gpuheap::format::kMaxPhaseName) n = gpuheap::format::kMaxPhaseName;
  std::lock_guard<std::mutex> lock(g_arena_mu);
  if (kArenaBytes - g_arena_used < n + 1) return nullptr;
  char* p = g_arena + g_arena_used;
  std::memcpy(p, s, n);
  p[n] = '\0';
  g_arena_used += n + 1;
  return p;
}

void phase(PhaseOp op, const EventAttributes* a) noexcept {
  // Older attribute structs may end before the message: read it only when present.
  constexpr std::size_t kNeed = offsetof(EventAttributes, message) + sizeof(void*);
  if (!a || a->size < kNeed) return gpuheap::preload::record_phase(op, PhaseSource::nvtx, nullptr);
  switch (a->message_type) {
    case kMessageAscii:
    case kMessageRegistered:  // our handle is the interned string
      return gpuheap::preload::record_phase(op, PhaseSource::nvtx, static_cast<const char*>(a->message));
    case kMessageUnicode:
      return gpuheap::preload::record_phase(op, PhaseSource::nvtx,
                                            WideName(static_cast<const wchar_t*>(a->message)).buf);
    default: return gpuheap::preload::record_phase(op, PhaseSource::nvtx, nullptr);
  }
}

// nvtxRangePush* answers the level of the range it opened, nvtxRangePop the level it closed
// (negative: none open), per thread.
thread_local int t_depth = 0;
int pushed() noexcept { return t_depth++; }
int popped() noexcept {
  gpuheap::preload::record_phase(PhaseOp::pop, PhaseSource::nvtx, nullptr);
  return t_depth > 0 ? --t_depth : -1;
}

void mark_ex(const EventAttributes* a) { phase(PhaseOp::mark, a); }
void mark_a(const char* m) { gpuheap::preload::record_phase(PhaseOp::mark, PhaseSource::nvtx, m); }
void mark_w(const wchar_t* m) { gpuheap::preload::record_phase(PhaseOp::mark, PhaseSource::nvtx, WideName(m).buf); }
int push_ex(const EventAttributes* a) {
  phase(PhaseOp::push, a);
  return pushed();
}
int push_a(const char* m) {
  gpuheap::preload::record_phase(PhaseOp::push, PhaseSource::nvtx, m);
  return pushed();
}
int push_w(const wchar_t* m) {
  gpuheap::preload::record_phase(PhaseOp::push, PhaseSource::nvtx, WideName(m).buf);
  return pushed();
}
int pop() { return popped(); }
void domain_mark_ex(const void*, const EventAttributes* a) { phase(PhaseOp::mark, a); }
int domain_push_ex(const void*, const EventAttributes* a) { return push_ex(a); }
int domain_pop(const void*) { return popped(); }
const void* register_a(const void*, const char* s) { return s ? intern(s, std::strlen(s)) : nullptr; }
const void* register_w(const void*, const wchar_t* s) {
  if (!s) return nullptr;
  WideName n(s);
  return intern(n.buf, std::strlen(n.buf));
}

template <class F>
void install(NvtxFunctionTable table, unsigned size, unsigned id, F* fn) noexcept {
  if (table && id < size && table[id]) *table[id] = reinterpret_cast<NvtxFunctionPointer>(fn);
}

}  // namespace

namespace gpuheap {
namespace preload {

int nvtx_attach(const void* (*get_export_table)(std::uint32_t)) noexcept {
  NvtxGetExportTableFunc get_table = get_export_table;
  if (!recorder_active() || !get_table) return 0;
  auto* cb = static_cast<const NvtxExportTableCallbacks*>(get_table(kEtidCallbacks));
  if (!cb || cb->struct_size < sizeof(NvtxExportTableCallbacks) || !cb->GetModuleFunctionTable) return 0;
  NvtxFunctionTable core = nullptr, core2 = nullptr;
  unsigned core_size = 0, core2_size = 0;
  if (!cb->GetModuleFunctionTable(kModuleCore, &core, &core_size) || !core) return 0;
  install(core, core_size, kMarkEx, mark_ex);
  install(core, core_size, kMarkA, mark_a);
  install(core, core_size, kMarkW, mark_w);
  install(core, core_size, kRangePushEx, push_ex);
  install(core, core_size, kRangePushA, push_a);
  install(core, core_size, kRangePushW, push_w);
  install(core, core_size, kRangePop, pop);
  if (cb->GetModuleFunctionTable(kModuleCore2, &core2, &core2_size) && core2) {
    install(core2, core2_size, kDomainMarkEx, domain_mark_ex);
    install(core2, core2_size, kDomainRangePushEx, domain_push_ex);
    install(core2, core2_size, kDomainRangePop, domain_pop);
    install(core2, core2_size, kDomainRegisterStringA, register_a);
    install(core2, core2_size, kDomainRegisterStringW, register_w);
  }
  return 1;
}

}  // namespace preload
}  // namespace gpuheap
