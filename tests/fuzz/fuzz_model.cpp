// libFuzzer target for the trace reader and the model (the replay of events): arbitrary
// bytes as a trace file through analyze(), without the reports, so it runs at thousands of
// inputs per second (the long runs counted in docs/dev/reliability-history.md use this target).
// Findings: anything but an InputError escaping, a sanitizer report, a hang (-timeout) or
// memory beyond -rss_limit_mb.
#include <cstdint>

#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/model_probe.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static gpuheap::test::FuzzInput input;
  gpuheap::test::probe_model(input.set(data, size));
  return 0;
}
