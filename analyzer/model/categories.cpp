// The category rules (docs/categories.md is the same table in words; keep them together).
#include "analyzer/model/categories.h"

#include <algorithm>

namespace gpuheap {

namespace {

constexpr std::array<const char*, kNumCategories> kCategoryNames = {
    "parameter", "gradient",        "optimizer_state", "activation", "temporary",
    "library",   "framework_cache", "other",           "unknown",
};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}
bool contains(std::string_view s, std::string_view p) { return s.find(p) != std::string_view::npos; }
std::string_view file_base(std::string_view path) {
  auto k = path.rfind('/');
  return k == std::string_view::npos ? path : path.substr(k + 1);
}

// A library's own memory: the innermost frame that is in one of these libraries' modules
// (their handles and internal buffers: cublasCreate's workspace, cudnnCreate, NCCL's
// buffers), or in the framework function that allocates a workspace for one. Module names
// decide where a trace has no symbols (the libraries ship stripped); the C entry points
// (cublas*, cudnn*, ...) where it does. Names of operators that merely call a library
// (at::native::cudnn_convolution allocates the convolution's output tensor) are not here.
struct LibraryRule {
  enum class Kind { module_prefix, function_prefix, function_contains, python_file } kind;
  std::string_view pattern, library;
};
constexpr LibraryRule kLibraryRules[] = {
    {LibraryRule::Kind::module_prefix, "libcublasLt", "cuBLASLt"},
    {LibraryRule::Kind::module_prefix, "libcublas", "cuBLAS"},
    {LibraryRule::Kind::module_prefix, "libcudnn", "cuDNN"},
    {LibraryRule::Kind::module_prefix, "libcufft", "cuFFT"},
    {LibraryRule::Kind::module_prefix, "libnccl", "NCCL"},
    {LibraryRule::Kind::module_prefix, "libcusparse", "cuSPARSE"},
    {LibraryRule::Kind::module_prefix, "libcusolver", "cuSOLVER"},
    {LibraryRule::Kind::module_prefix, "libcurand", "cuRAND"},
    {LibraryRule::Kind::function_prefix, "cublasLt", "cuBLASLt"},
    {LibraryRule::Kind::function_prefix, "cublas", "cuBLAS"},
    {LibraryRule::Kind::function_prefix, "cudnn", "cuDNN"},
    {LibraryRule::Kind::function_prefix, "cufft", "cuFFT"},
    {LibraryRule::Kind::function_prefix, "nccl", "NCCL"},
    // PyTorch hands cuBLAS and cuBLASLt a workspace of its own per handle and stream
    // (aten/src/ATen/cuda/CublasHandlePool.cpp), allocated through its caching allocator.
    // Matched after "::" so that a release that moves them into an anonymous namespace
    // (at::cuda::(anonymous namespace)::...) still matches.
    {LibraryRule::Kind::function_contains, "::getCUDABlasLtWorkspace(", "cuBLASLt"},
    {LibraryRule::Kind::function_contains, "::setWorkspaceForHandle(", "cuBLAS"},
    {LibraryRule::Kind::function_contains, "at::cuda::getCurrentCUDABlasLtHandle(", "cuBLASLt"},
    // cuDNN's convolution workspace (aten/src/ATen/native/cudnn/Conv_v8.cpp run_conv_plan).
    {LibraryRule::Kind::function_contains, "::run_conv_plan(", "cuDNN"},
    // cuFFT plans and their workspace (aten/src/ATen/native/cuda/CuFFTPlanCache.h).
    {LibraryRule::Kind::function_contains, "at::native::detail::CuFFTConfig::", "cuFFT"},
    {LibraryRule::Kind::function_contains, "c10d::ProcessGroupNCCL::", "NCCL"},
    // CuPy's cuFFT plans allocate their work area from Python-visible code.
    {LibraryRule::Kind::python_file, "cupy/fft/", "cuFFT"},
    {LibraryRule::Kind::python_file, "cupy/cuda/cufft", "cuFFT"},
};

std::string_view library_of(const FrameRef& f) {
  for (const auto& r : kLibraryRules) {
    bool hit = false;
    switch (r.kind) {
      case LibraryRule::Kind::module_prefix: hit = !f.python && starts_with(file_base(f.module), r.pattern); break;
      case LibraryRule::Kind::function_prefix: hit = !f.python && starts_with(f.function, r.pattern); break;
      case LibraryRule::Kind::function_contains: hit = !f.python && contains(f.function, r.pattern); break;
      case LibraryRule::Kind::python_file: hit = f.python && contains(f.file, r.pattern); break;
    }
    if (hit) return r.library;
  }
  return {};
}

// The torch.nn.Module call machinery (torch/nn/modules/module.py): every module's forward
// runs below one of these.
bool is_module_call(std::string_view fn) {
  return fn == "Module._call_impl" || fn == "Module._wrapped_call_impl" || fn == "Module.__call__";
}
// Tensor.backward (torch/_tensor.py), torch.autograd.backward/grad (torch/autograd/__init__.py),
// _engine_run_backward (torch/autograd/graph.py).
bool is_backward_call(const FrameRef& f) {
  if (f.function == "Tensor.backward" || f.function == "_engine_run_backward") return true;
  return (f.function == "backward" || f.function == "grad") && contains(f.file, "torch/autograd/");
}
// Model construction, moving and loading: the tensors they leave are the parameters and buffers.
bool is_construction(const FrameRef& f) {
  static constexpr std::string_view kNames[] = {
      "Module._apply",
      "Module.to",
      "Module.cuda",
      "Module.to_empty",
      "Module.load_state_dict",
      "Module._load_from_state_dict",
      "Module.register_parameter",
      "Module.register_buffer",
  };
  if (std::find(std::begin(kNames), std::end(kNames), f.function) != std::end(kNames)) return true;
  return ends_with(f.function, ".__init__") || ends_with(f.function, ".reset_parameters") ||
         contains(f.function, "from_pretrained") || contains(f.file, "torch/nn/init.py");
}

// The autograd node a native frame runs: "torch::autograd::generated::MmBackward0::apply(...)"
// -> "MmBackward0", AccumulateGrad, PyNode (a Python autograd.Function), CppNode<T>.
std::string_view node_of(std::string_view fn) {
  static constexpr std::string_view kGenerated = "torch::autograd::generated::";
  auto k = fn.find(kGenerated);
  if (k != std::string_view::npos) {
    auto rest = fn.substr(k + kGenerated.size());
    auto e = rest.find("::apply");
    if (e != std::string_view::npos) return rest.substr(0, e);
    e = rest.find("_apply_functional");
    if (e != std::string_view::npos) return rest.substr(0, e);
    return {};
  }
  if (contains(fn, "torch::autograd::AccumulateGrad::")) return "AccumulateGrad";
  if (contains(fn, "torch::autograd::PyNode::apply")) return "PyNode";
  if (contains(fn, "torch::autograd::CppNode<")) return "CppNode";
  return {};
}

struct PhaseFlags {
  bool forward = false, backward = false, optimizer = false, zero_grad = false;
};

void python_traits(const FrameRef& f, PhaseFlags& ph, StackTraits& t) {
  if (is_module_call(f.function)) ph.forward = true;
  if (is_backward_call(f)) ph.backward = true;
  if (f.function == "Optimizer.zero_grad" || f.function == "Module.zero_grad") ph.zero_grad = true;
  if (contains(f.file, "torch/optim/") && !contains(f.file, "lr_scheduler")) ph.optimizer = true;
  if (is_construction(f)) t.construction = true;
}

void native_traits(const FrameRef& f, PhaseFlags& ph, StackTraits& t) {
  auto node = node_of(f.function);
  if (!node.empty()) {
    ph.backward = true;
    if (t.node.empty()) t.node = std::string(node);
    if (node == "AccumulateGrad") t.accumulate_grad = true;
  }
  if (contains(f.function, "torch::autograd::Engine::")) ph.backward = true;
  // XLA's best-fit-with-coalescing arena (JAX): the region it grows is the framework's cache.
  if (contains(f.function, "BFCAllocator::Extend") || contains(f.function, "BFCAllocator::AllocateRawInternal"))
    t.framework_cache = true;
}

// The frame that called backward(): the first Python frame outside the call (outer side).
std::string backward_caller(const std::vector<FrameRef>& frames) {
  std::size_t last = frames.size();
  for (std::size_t i = 0; i < frames.size(); ++i)
    if (frames[i].python && is_backward_call(frames[i])) last = i;
  for (std::size_t j = last + 1; j < frames.size(); ++j) {
    const auto& f = frames[j];
    if (!f.python || is_backward_call(f)) continue;
    std::string s(f.function);
    s += " (";
    s += file_base(f.file);
    s += ':';
    s += std::to_string(f.line);
    s += ')';
    return s;
  }
  return {};
}

}  // namespace

const char* category_name(Category c) {
  auto i = static_cast<std::size_t>(c);
  return i < kNumCategories ? kCategoryNames[i] : "unknown";
}

bool parse_category(std::string_view name, Category& out) {
  for (std::size_t i = 0; i < kNumCategories; ++i) {
    if (name == kCategoryNames[i]) {
      out = static_cast<Category>(i);
      return true;
    }
  }
  return false;
}

const char* train_phase_name(TrainPhase p) {
  switch (p) {
    case TrainPhase::forward: return "forward";
    case TrainPhase::backward: return "backward";
    case TrainPhase::optimizer: return "optimizer_step";
    case TrainPhase::zero_grad: return "zero_grad";
    case TrainPhase::none: break;
  }
  return "none";
}

bool is_autograd_thread(std::string_view thread_name) { return starts_with(thread_name, "pt_autograd_"); }

StackTraits stack_traits(const std::vector<FrameRef>& frames) {
  StackTraits t;
  PhaseFlags ph;
  for (const auto& f : frames) {
    if (t.library.empty()) t.library = std::string(library_of(f));
    if (f.python) {
      python_traits(f, ph, t);
    } else {
      native_traits(f, ph, t);
    }
  }
  if (ph.backward) {
    t.phase = TrainPhase::backward;
    t.backward_caller = backward_caller(frames);
    t.backward_call = !t.backward_caller.empty();
  } else if (ph.zero_grad) {
    t.phase = TrainPhase::zero_grad;
  } else if (ph.optimizer) {
    t.phase = TrainPhase::optimizer;
  } else if (ph.forward) {
    t.phase = TrainPhase::forward;
  }
  return t;
}

}  // namespace gpuheap
