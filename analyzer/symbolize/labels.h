// Site labels: the frame a person reads first for an allocation site. The innermost frames
// of most GPU allocations are an allocator's own (PyTorch's caching allocator, CuPy's memory
// pool, XLA's BFC allocator): the same few functions for every tensor of a job, so they say
// nothing about *which* tensor. A site is labelled by the first frame below them; the
// allocator frames stay in the stack (summary --full / --depth show them).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "analyzer/symbolize/symbolize.h"

namespace gpuheap {

// True for a frame inside an allocator (the table in labels.cpp says which and why).
bool is_allocator_frame(const Frame& f);

// Where a stack's label is. `allocator`: how many innermost frames are the allocator's
// (with std:: glue between them); `index`: the label's frame (== frames.size() only for an
// empty stack). For a stack through Python whose first frame below the allocator is a
// framework's own native code (PyTorch/XLA/CuPy operator dispatch), the label is the first
// Python frame outside site-packages/dist-packages (the program's own line), else the first
// Python frame; `python_from` is then the first Python frame (else == index).
struct LabelPos {
  std::size_t allocator = 0, index = 0, python_from = 0;
};
LabelPos label_pos(const std::vector<Frame>& frames);

// The label: the function's qualified name without return type and parameters
// ("user_model_forward", "Block.forward"), "module+0xoff" without a name, "<no stack>".
std::string site_label(const std::vector<Frame>& frames);
// The label with where it is: "Block.forward (torch_job.py:43)" (the file's base name), for
// text output; escaped (text_safe.h). `short_names`: a native label's template arguments
// elided (short_name()), for one-line views a person reads (summary's default, check).
std::string site_label_text(const std::vector<Frame>& frames, bool short_names = false);

// "void* ns::f<int>(unsigned long) const" -> "ns::f<int>".
std::string_view qualified_name(std::string_view function);
// A qualified name with every template argument list elided:
// "at::native::gpu_reduce_kernel<float, 4, ...>" -> "at::native::gpu_reduce_kernel<...>",
// "c10::impl::wrap_kernel_functor_unboxed_<...>::call". `operator<`-style names keep their
// '<'. For C++ names only (Python's "<module>" is a name, not a template).
std::string short_name(std::string_view qualified);

// Frames that only pass a call on: PyTorch's nn.Module call machinery in Python
// (Module._call_impl, Module._wrapped_call_impl: two per layer) and the C++ operator
// dispatcher's wrappers (c10::impl::wrap_kernel_functor_unboxed_<...>::call, at::_ops::X::call
// and ::redispatch, autograd's VariableType::X). The table is in labels.cpp. The text
// summary folds them into a count by default (summary --full shows them).
enum class Passthrough { none, module_call, dispatch };
Passthrough passthrough_kind(const Frame& f);

// Which library made an allocation: the innermost visible frame in a known GPU library
// (NCCL, cuBLAS, cuDNN, ... PyTorch, XLA, CuPy), else the innermost frame's module name.
// Lets a report label NCCL's or cuBLAS's own buffers apart from the program's tensors.
std::string library_label(const std::vector<Frame>& frames);

}  // namespace gpuheap
