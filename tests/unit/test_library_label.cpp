// library_label: which library an allocation site belongs to (NCCL's and cuBLAS's own
// buffers told apart from the program's tensors).
#include <gtest/gtest.h>

#include "analyzer/summary/report.h"

using gpuheap::Frame;
using gpuheap::library_label;

namespace {
Frame frame(const char* module) {
  Frame f;
  f.module = module;
  return f;
}
}  // namespace

TEST(LibraryLabel, InnermostKnownLibraryWins) {
  // cuBLAS creating its workspace, called from libtorch: cuBLAS's allocation.
  EXPECT_EQ(library_label({frame("/x/nvidia/cu13/lib/libcublas.so.13"), frame("/x/torch/lib/libtorch_cuda.so")}),
            "cuBLAS");
  EXPECT_EQ(library_label({frame("/x/libc10_cuda.so"), frame("/x/libtorch_cpu.so")}), "PyTorch");
  EXPECT_EQ(library_label({frame("/usr/lib/libnccl.so.2"), frame("/x/libtorch_cuda.so")}), "NCCL");
  EXPECT_EQ(library_label({frame("/x/jaxlib/xla_extension.so")}), "XLA");
  EXPECT_EQ(library_label({frame("/x/cupy/_core/core.cpython-312-x86_64-linux-gnu.so")}), "CuPy");
}

TEST(LibraryLabel, UnknownModulesFallBackToTheInnermostModuleName) {
  EXPECT_EQ(library_label({frame("/work/build/examples/mini_train"), frame("/lib/libc.so.6")}), "mini_train");
  EXPECT_EQ(library_label({frame(""), frame("/lib/libfoo.so")}), "libfoo.so");
  EXPECT_EQ(library_label({}), "unknown");
}
