// libFuzzer target: fuzz_model's probe with every input wrapped in a zstd stream, the way
// compressed traces (.zst) reach the analyzer. The fuzzer mutates the trace bytes (so it
// keeps finding records), the reader decompresses them; the input's length picks how many
// of the compressed stream's last bytes are cut (none for 1 input in 8), so streams that
// stop inside a frame or a block are read too.
#include <zstd.h>

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/model_probe.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static gpuheap::test::FuzzInput input;
  static std::vector<std::uint8_t> z;
  z.resize(ZSTD_compressBound(size));
  std::size_t n = ZSTD_compress(z.data(), z.size(), data, size, 1);
  if (ZSTD_isError(n)) std::abort();
  std::size_t cut = size % 8;
  gpuheap::test::probe_model(input.set(z.data(), n > cut ? n - cut : n));
  return 0;
}
