#include "analyzer/symbolize/labels.h"

#include <fmt/format.h>

#include "analyzer/base/text_safe.h"

namespace gpuheap {

namespace {

enum class Match {
  function_prefix,  // the qualified name (qualified_name()) starts with `text` and contains `also`
  function_part,    // the function name contains `text` anywhere (Cython's mangled C names)
  module_base,      // the module's file name starts with `text`
  module_part,      // the module's path contains `text`
  file_part,        // the source file's path contains `text` (Python frames)
};
struct AllocatorPattern {
  Match how;
  const char* text;
  const char* also = "";
};

// Every frame matching one of these is allocator-internal: the same functions in every
// stack of a job, above the frame that says which tensor it is.
const AllocatorPattern kAllocatorPatterns[] = {
    // PyTorch's CUDA caching allocator (CUDACachingAllocator::Native::NativeCachingAllocator::
    // malloc/allocate, DeviceCachingAllocator) and the c10::cuda helpers it calls.
    {Match::function_prefix, "c10::cuda::"},
    // c10's CUDA library is the allocator and those helpers: without symbol names (a trace
    // read away from its machine, frames as module+offset) its frames still count.
    {Match::module_base, "libc10_cuda"},
    // Every tensor's storage passes through c10::Allocator (DataPtr) and StorageImpl.
    {Match::function_prefix, "c10::Allocator::"},
    {Match::function_prefix, "c10::StorageImpl::"},
    // ATen's tensor factories: at::detail::empty_cuda / empty_generic / empty_strided_*,
    // their dispatcher entries (at::empty, at::empty_like, at::_ops::empty_*), the native
    // kernels behind them and the structured kernels' output allocation.
    {Match::function_prefix, "at::detail::empty"},
    {Match::function_prefix, "at::empty"},
    {Match::function_prefix, "at::_ops::empty"},
    {Match::function_prefix, "at::native::empty"},
    {Match::function_prefix, "at::cuda::empty"},
    {Match::function_prefix, "at::(anonymous namespace)::create_out"},
    {Match::function_prefix, "at::(anonymous namespace)::resize_out"},
    // CuPy's memory pool (cupy.cuda.memory: MemoryPool/SingleDeviceMemoryPool.malloc, Memory)
    // and its CUDA runtime wrappers (cupy_backends.cuda.api.runtime.malloc): Cython modules,
    // so by module path, by Cython's C names and by source file.
    {Match::module_part, "/cupy/cuda/memory"},
    {Match::module_part, "/cupy_backends/"},
    {Match::function_part, "4cupy_4cuda_6memory"},
    {Match::function_part, "cupy_backends"},
    {Match::function_part, "cupy.cuda.memory"},
    {Match::file_part, "cupy/cuda/memory"},
    {Match::file_part, "cupy_backends/"},
    // JAX/XLA: the BFC allocator (tsl::BFCAllocator, formerly tensorflow::) and XLA's and
    // StreamExecutor's device-memory allocators around it.
    {Match::function_prefix, "tsl::BFCAllocator"},
    {Match::function_prefix, "tensorflow::BFCAllocator"},
    {Match::function_prefix, "tsl::", "Allocat"},
    {Match::function_prefix, "xla::", "Allocat"},
    {Match::function_prefix, "stream_executor::", "Allocat"},
};

// Frames that pass a call on without deciding anything about memory (labels.h
// Passthrough): shown by summary --full, folded into a count otherwise.
struct PassthroughPattern {
  Passthrough kind;
  Match how;
  const char* text;
  const char* also = "";
};
const PassthroughPattern kPassthroughPatterns[] = {
    // torch.nn.Module.__call__ -> _wrapped_call_impl -> _call_impl -> forward: two frames
    // between every layer's forward and its caller's (Module.__call__ in older versions).
    {Passthrough::module_call, Match::file_part, "torch/nn/modules/module.py", "_call_impl"},
    {Passthrough::module_call, Match::file_part, "torch/nn/modules/module.py", "__call__"},
    // nn.Sequential.forward only calls each of its modules in turn.
    {Passthrough::module_call, Match::file_part, "torch/nn/modules/container.py", "Sequential.forward"},
    // @torch.no_grad() / @torch.inference_mode() decorators: the decorated function is next.
    {Passthrough::module_call, Match::file_part, "torch/utils/_contextlib.py", "decorate_context"},
    // The operator dispatcher between an op's Python binding and its kernel: boxing wrappers
    // (whose template names run to hundreds of characters), the op's entry points and the
    // autograd / ADInplaceOrView kernels, which record the graph and call the next kernel.
    {Passthrough::dispatch, Match::function_prefix, "c10::impl::wrap_kernel_functor_unboxed_"},
    {Passthrough::dispatch, Match::function_prefix, "c10::impl::make_boxed_from_unboxed_functor"},
    {Passthrough::dispatch, Match::function_prefix, "c10::impl::BoxedKernelWrapper"},
    {Passthrough::dispatch, Match::function_prefix, "c10::Dispatcher::"},
    {Passthrough::dispatch, Match::function_prefix, "c10::KernelFunction::"},
    {Passthrough::dispatch, Match::function_prefix, "c10::BoxedKernel::"},
    {Passthrough::dispatch, Match::function_prefix, "at::_ops::", "::call"},
    {Passthrough::dispatch, Match::function_prefix, "at::_ops::", "::redispatch"},
    {Passthrough::dispatch, Match::function_prefix, "torch::autograd::VariableType::"},
    {Passthrough::dispatch, Match::function_prefix, "torch::ADInplaceOrView::"},
};

bool matches(const AllocatorPattern& p, const Frame& f) {
  switch (p.how) {
    case Match::function_prefix: {
      auto q = qualified_name(f.function);
      return q.starts_with(p.text) && q.find(p.also) != std::string_view::npos;
    }
    case Match::function_part: return f.function.find(p.text) != std::string::npos;
    case Match::module_base: return f.module != "python" && base_name(f.module).starts_with(p.text);
    case Match::module_part: return f.module.find(p.text) != std::string::npos;
    case Match::file_part: return f.file.find(p.text) != std::string::npos;
  }
  return false;
}

// std::function invokers, smart-pointer deleters and the like between two allocator frames.
bool std_glue(const Frame& f) { return qualified_name(f.function).starts_with("std::"); }

bool is_python(const Frame& f) { return f.module == "python"; }

// Installed packages (the framework's own Python: torch.nn, cupy._creation) as opposed to the
// program's own files.
bool installed_package(const Frame& f) {
  return f.file.find("/site-packages/") != std::string::npos || f.file.find("/dist-packages/") != std::string::npos;
}

// A framework's own native code below the allocator: the operator dispatch between the
// allocator and the Python line that called the operator.
bool framework_native(const Frame& f) {
  if (is_python(f)) return false;
  const std::string lib = library_label({f});
  return lib == "PyTorch" || lib == "XLA" || lib == "CuPy" || lib == "Triton";
}

bool matches(const PassthroughPattern& p, const Frame& f) {
  if (p.how == Match::file_part)  // Python frames: the file, then the function's name
    return f.module == "python" && f.file.find(p.text) != std::string::npos &&
           f.function.find(p.also) != std::string::npos;
  return matches(AllocatorPattern{p.how, p.text, p.also}, f);
}

}  // namespace

Passthrough passthrough_kind(const Frame& f) {
  for (const auto& p : kPassthroughPatterns)
    if (matches(p, f)) return p.kind;
  return Passthrough::none;
}

std::string short_name(std::string_view q) {
  std::string out;
  out.reserve(q.size());
  int depth = 0;
  for (std::size_t i = 0; i < q.size(); ++i) {
    const char c = q[i];
    // operator<, operator<<, operator<=, operator<=> (and their templates, ignored): the
    // '<' characters are the name.
    if (depth == 0 && c == '<' && std::string_view(out).ends_with("operator")) {
      while (i < q.size() && (q[i] == '<' || q[i] == '=' || q[i] == '>')) out += q[i++];
      --i;
      continue;
    }
    if (c == '<') {
      if (depth++ == 0) out += "<...>";
    } else if (c == '>' && depth > 0) {
      --depth;
    } else if (depth == 0) {
      out += c;
    }
  }
  return out;
}

std::string_view qualified_name(std::string_view fn) {
  static constexpr std::string_view kAnon = "(anonymous namespace)";
  int depth = 0;
  std::size_t start = 0, end = fn.size();
  for (std::size_t i = 0; i < fn.size(); ++i) {
    char c = fn[i];
    if (c == '<' || c == '{' || c == '[') {
      ++depth;
    } else if ((c == '>' || c == '}' || c == ']') && depth > 0) {
      --depth;
    } else if (c == '(' && depth == 0) {
      if (fn.substr(i, kAnon.size()) == kAnon) {
        i += kAnon.size() - 1;
        continue;
      }
      end = i;
      break;
    } else if (c == ' ' && depth == 0) {
      start = i + 1;  // what came before is the return type ("void*", "at::Tensor")
    }
  }
  auto q = fn.substr(start, end - start);
  return q.empty() ? fn : q;
}

bool is_allocator_frame(const Frame& f) {
  for (const auto& p : kAllocatorPatterns)
    if (matches(p, f)) return true;
  return false;
}

LabelPos label_pos(const std::vector<Frame>& frames) {
  LabelPos pos;
  std::size_t n = 0;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    // Hidden frames (gpuheap's, the CUDA runtime's: kept by --all-frames) are below nothing.
    if (frames[i].hidden || is_allocator_frame(frames[i])) n = i + 1;
    else if (!std_glue(frames[i])) break;
  }
  while (n > 0 && n < frames.size() && std_glue(frames[n])) ++n;
  // A stack of allocator frames only (nothing recorded below them): its last frame.
  if (n == frames.size() && n > 0) n = frames.size() - 1;
  pos.allocator = n, pos.index = n, pos.python_from = n;
  if (n < frames.size() && framework_native(frames[n])) {
    std::size_t first_py = n;
    while (first_py < frames.size() && !is_python(frames[first_py])) ++first_py;
    if (first_py < frames.size()) {
      pos.python_from = first_py, pos.index = first_py;
      for (std::size_t i = first_py; i < frames.size(); ++i)
        if (is_python(frames[i]) && !installed_package(frames[i])) {
          pos.index = i;
          break;
        }
    }
  }
  return pos;
}

std::string site_label(const std::vector<Frame>& frames) {
  if (frames.empty()) return "<no stack>";
  const Frame& f = frames[label_pos(frames).index];
  if (!f.function.empty()) return std::string(qualified_name(f.function));
  return frame_name(f);
}

std::string site_label_text(const std::vector<Frame>& frames, bool short_names) {
  std::string label = site_label(frames);
  if (frames.empty()) return text_safe(label);
  const Frame& f = frames[label_pos(frames).index];
  label = text_safe(short_names && f.module != "python" && !f.function.empty() ? short_name(label) : label);
  if (f.function.empty() || f.file.empty()) return label;
  auto file = text_safe(base_name(f.file));
  return f.line > 0 ? fmt::format("{} ({}:{})", label, file, f.line) : fmt::format("{} ({})", label, file);
}

std::string library_label(const std::vector<Frame>& frames) {
  struct Known {
    const char* prefix;  // module basename prefix
    const char* label;
  };
  // Most specific first: a cuBLAS call made by libtorch is cuBLAS's allocation.
  static const Known known[] = {
      {"libnccl", "NCCL"},       {"libcublasLt", "cuBLAS"}, {"libcublas", "cuBLAS"},     {"libcudnn", "cuDNN"},
      {"libcufft", "cuFFT"},     {"libcurand", "cuRAND"},   {"libcusolver", "cuSOLVER"}, {"libcusparse", "cuSPARSE"},
      {"libnvshmem", "NVSHMEM"}, {"libtorch", "PyTorch"},   {"libc10", "PyTorch"},       {"xla_extension", "XLA"},
      {"libxla", "XLA"},         {"_jax", "XLA"},           {"libjax", "XLA"},           {"cupy", "CuPy"},
      {"libtriton", "Triton"},
  };
  // Python packages keep their extension modules in their own directory.
  static const Known dirs[] = {{"/cupy/", "CuPy"},
                               {"/cupy_backends/", "CuPy"},
                               {"/jaxlib/", "XLA"},
                               {"/torch/lib/", "PyTorch"}};
  const std::string* last = nullptr;  // the previous frame's module, which matched nothing
  for (const auto& f : frames) {
    // A library's frames come in runs: a frame in the module just tried matches nothing either.
    if (last != nullptr && f.module == *last) continue;
    last = &f.module;
    std::string_view b = base_name(f.module);
    for (const auto& k : known)
      if (b.starts_with(k.prefix)) return k.label;
    for (const auto& k : dirs)
      if (f.module.find(k.prefix) != std::string::npos) return k.label;
  }
  for (const auto& f : frames)
    if (!f.module.empty()) return std::string(base_name(f.module));
  return "unknown";
}

}  // namespace gpuheap
