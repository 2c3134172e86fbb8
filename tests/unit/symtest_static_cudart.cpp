// Stand-ins for a statically linked CUDA 13 runtime inside the user's binary, built without
// debug info as NVIDIA ships it (tests/unit/symbolize.cmake: -O0 -g0, so the frames stay
// and carry no source line): internals named libcudart_static_<sha1>, the API entry a plain
// C symbol. test_symbolize.cpp calls cudaFakeMalloc and checks both are hidden.
#include <cstdint>
#include <vector>

extern "C" std::vector<std::uint64_t> __cudartFakeEntry();  // test_symbolize.cpp

extern "C" __attribute__((noinline)) std::vector<std::uint64_t>
libcudart_static_5382377d5c772c9d197c0cda9fd9742ee6ad893c() {
  return __cudartFakeEntry();
}
extern "C" __attribute__((noinline)) std::vector<std::uint64_t> cudaFakeMalloc() {
  return libcudart_static_5382377d5c772c9d197c0cda9fd9742ee6ad893c();
}
