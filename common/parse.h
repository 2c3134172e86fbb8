// Scalar parsing rules both halves share: the preload reads its GPUHEAP_* settings with
// them (preload/core/options.h states the rules for users) and `gpuheap run` reads the same
// variables (analyzer/cli/run.cpp), so that both agree on what "on" or "512MiB" means.
// No exceptions, no allocation, no locale-dependent state beyond strtod: the preload calls
// these in its library constructor, before main.
#pragma once

#include <cstdint>

namespace gpuheap {
namespace common {

// The single-value parsers (false: invalid, *out untouched).
bool parse_bool(const char* text, bool* out) noexcept;
bool parse_uint(const char* text, std::uint64_t* out) noexcept;    // decimal digits only
bool parse_size(const char* text, std::uint64_t* bytes) noexcept;  // unit required unless 0
bool parse_duration(const char* text, std::uint64_t unit_ns, std::uint64_t* ns) noexcept;

// The pieces of a size (GPUHEAP_LIMIT's values use them too): the factor of a unit suffix
// (b, k/kib, m/mib, g/gib, t/tib binary; kb, mb, gb, tb decimal; "" is 1; any case), and
// a number with its unit suffix split off.
bool unit_factor(const char* u, double* f) noexcept;
bool split_number(const char* s, double* v, const char** unit) noexcept;

}  // namespace common
}  // namespace gpuheap
