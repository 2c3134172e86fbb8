// libFuzzer target: arbitrary bytes as a trace file through the path `gpuheap summary`
// takes (reader -> model -> text/JSON reports), plus check, diff and dump. Slow per input
// (the reports dominate); fuzz_model covers the reader and the model alone, much faster.
// An InputError is the analyzer's clean "bad input" answer (exit 2), anything else that
// escapes is a finding.
#include <cstdio>
#include <cstdlib>

#include "analyzer/base/error.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/pipeline.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static gpuheap::test::FuzzInput input;
  static std::FILE* sink = std::fopen("/dev/null", "w");
  if (sink == nullptr) std::abort();
  try {
    (void)gpuheap::test::run_pipeline(input.set(data, size), sink);
  } catch (const gpuheap::InputError&) {
    // clean rejection
  }
  return 0;
}
