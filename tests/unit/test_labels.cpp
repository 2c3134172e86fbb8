// Site labels (analyzer/symbolize/labels.h): the first frame below an allocator's own frames.
#include <gtest/gtest.h>

#include "analyzer/symbolize/labels.h"

using gpuheap::Frame;
using gpuheap::label_pos;
using gpuheap::site_label;
using gpuheap::site_label_text;

namespace {

Frame fn(const char* function, const char* module = "/x/libfoo.so", const char* file = "", int line = 0) {
  Frame f;
  f.function = function, f.module = module, f.file = file, f.line = line;
  return f;
}
Frame py(const char* function, const char* file, int line) { return fn(function, "python", file, line); }
Frame anon(const char* module, std::uint64_t offset) {
  Frame f;
  f.module = module, f.offset = offset;
  return f;
}

}  // namespace

TEST(Labels, QualifiedNameDropsReturnTypeAndParameters) {
  EXPECT_EQ(gpuheap::qualified_name("user_model_forward(unsigned long)"), "user_model_forward");
  EXPECT_EQ(gpuheap::qualified_name("void* c10::cuda::CUDACachingAllocator::allocate(unsigned long)"),
            "c10::cuda::CUDACachingAllocator::allocate");
  EXPECT_EQ(gpuheap::qualified_name("void at::native::foo<std::pair<int, float> >(at::Tensor const&)"),
            "at::native::foo<std::pair<int, float> >");
  EXPECT_EQ(gpuheap::qualified_name("at::(anonymous namespace)::create_out(c10::ArrayRef<long>)"),
            "at::(anonymous namespace)::create_out");
  EXPECT_EQ(gpuheap::qualified_name("Block.forward"), "Block.forward");
  EXPECT_EQ(gpuheap::qualified_name("<module>"), "<module>");
}

TEST(Labels, PyTorchAllocatorFramesAreSkipped) {
  std::vector<Frame> st = {
      fn("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, signed char, unsigned long)"),
      fn("std::_Function_handler<void (void*), void (*)(void*)>::_M_invoke(std::_Any_data const&, void*&&)"),
      fn("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
      fn("at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*)"),
      fn("at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType)"),
      fn("at::empty(c10::ArrayRef<long>, c10::TensorOptions)"),
      fn("my_extension::fused_op(at::Tensor const&)", "/x/my_ext.so", "/src/fused.cu", 42),
      fn("main", "/x/prog"),
  };
  auto pos = label_pos(st);
  EXPECT_EQ(pos.allocator, 6u);
  EXPECT_EQ(pos.index, 6u);
  EXPECT_EQ(site_label(st), "my_extension::fused_op");
  EXPECT_EQ(site_label_text(st), "my_extension::fused_op (fused.cu:42)");
  // Without the allocator frames on top, the first frame is the label.
  std::vector<Frame> plain(st.begin() + 6, st.end());
  EXPECT_EQ(label_pos(plain).allocator, 0u);
  EXPECT_EQ(site_label(plain), "my_extension::fused_op");
}

TEST(Labels, CuPyAndXlaAllocatorFrames) {
  EXPECT_EQ(site_label({fn("__pyx_f_4cupy_4cuda_6memory_10MemoryPool_malloc", "/x/site-packages/cupy/cuda/memory.so"),
                        fn("__pyx_f_14cupy_backends_4cuda_3api_7runtime_malloc", "/x/site-packages/cupy_backends/a.so"),
                        fn("user_kernel_launch", "/x/prog")}),
            "user_kernel_launch");
  EXPECT_EQ(site_label({fn("tsl::BFCAllocator::AllocateRaw(unsigned long, unsigned long)", "/x/xla_extension.so"),
                        fn("xla::MultiDeviceAdapter::Allocate(int, unsigned long)", "/x/xla_extension.so"),
                        fn("stream_executor::StreamExecutorMemoryAllocator::Allocate(int)", "/x/xla_extension.so"),
                        fn("train_step", "/x/prog")}),
            "train_step");
  // A frame that merely passes a c10::cuda type is not the allocator's.
  EXPECT_FALSE(gpuheap::is_allocator_frame(fn("at::native::copy_(c10::cuda::CUDAStream)")));
  EXPECT_TRUE(gpuheap::is_allocator_frame(anon("/x/torch/lib/libc10_cuda.so", 0x44beb)));
}

TEST(Labels, TorchOperatorPlumbingLabelsTheProgramsPythonLine) {
  // As in the shipped H200 trace read away from its machine: c10_cuda and libtorch_cuda
  // without names, then the Python frames of torch.nn and of the program.
  std::vector<Frame> st = {anon("/v/site-packages/torch/lib/libc10_cuda.so", 0x44beb),
                           anon("/v/site-packages/torch/lib/libc10_cuda.so", 0x45000),
                           anon("/v/site-packages/torch/lib/libtorch_cuda.so", 0x1000),
                           anon("/v/site-packages/torch/lib/libtorch_cpu.so", 0x2000),
                           py("Linear.forward", "/v/site-packages/torch/nn/modules/linear.py", 134),
                           py("Module._call_impl", "/v/site-packages/torch/nn/modules/module.py", 1790),
                           py("Block.forward", "/work/torch_job.py", 43),
                           py("<module>", "/work/torch_job.py", 90)};
  auto pos = label_pos(st);
  EXPECT_EQ(pos.allocator, 2u);
  EXPECT_EQ(pos.python_from, 4u);
  EXPECT_EQ(pos.index, 6u);
  EXPECT_EQ(site_label(st), "Block.forward");
  EXPECT_EQ(site_label_text(st), "Block.forward (torch_job.py:43)");
  // Only installed packages' Python: the first Python frame.
  std::vector<Frame> lib_only(st.begin(), st.begin() + 6);
  EXPECT_EQ(site_label(lib_only), "Linear.forward");
  // A program's own native code below the allocator is its label, Python or not.
  std::vector<Frame> ext = {anon("/v/torch/lib/libc10_cuda.so", 0x10), anon("/x/my_ext.so", 0x99),
                            py("Block.forward", "/work/torch_job.py", 43)};
  EXPECT_EQ(site_label(ext), "my_ext.so+0x99");
}

TEST(Labels, HiddenFramesAreBelowNothing) {
  // --all-frames keeps the CUDA runtime's frames: the label is still the caller's.
  Frame rt = fn("cudaMalloc", "/usr/lib/libcudart.so.12");
  rt.hidden = true;
  std::vector<Frame> st = {rt, fn("c10::cuda::CUDACachingAllocator::allocate(unsigned long)"),
                           fn("user_model_forward(unsigned long)", "/x/prog")};
  EXPECT_EQ(label_pos(st).allocator, 2u);
  EXPECT_EQ(site_label(st), "user_model_forward");
}

TEST(Labels, EdgeCases) {
  EXPECT_EQ(site_label({}), "<no stack>");
  // Nothing below the allocator (a cut stack): its last frame.
  std::vector<Frame> only = {fn("c10::cuda::CUDACachingAllocator::raw_alloc(unsigned long)")};
  EXPECT_EQ(site_label(only), "c10::cuda::CUDACachingAllocator::raw_alloc");
  Frame none;
  none.ip = 0x1234;
  EXPECT_EQ(site_label({none}), "0x1234");
}

TEST(Labels, ShortNameElidesTemplateArguments) {
  using gpuheap::short_name;
  EXPECT_EQ(short_name("at::native::gpu_reduce_kernel<float, float, 4, 4, at::native::func_wrapper_t<float, "
                       "__nv_hdl_wrapper_t<false, true, false, __nv_dl_tag<void (at::native::sum_functor<float, "
                       "float, float>::*)(at::TensorIterator&), &at::native::sum_functor<float, float, "
                       "float>::operator(), 1u>, float (float, float)> >, double>"),
            "at::native::gpu_reduce_kernel<...>");
  EXPECT_EQ(short_name(
                "c10::impl::wrap_kernel_functor_unboxed_<c10::impl::detail::WrapFunctionIntoFunctor_<int> >::call"),
            "c10::impl::wrap_kernel_functor_unboxed_<...>::call");
  EXPECT_EQ(short_name("user_model_forward"), "user_model_forward");
  EXPECT_EQ(short_name("at::(anonymous namespace)::create_out"), "at::(anonymous namespace)::create_out");
  // The '<' of an operator's name is the name.
  EXPECT_EQ(short_name("std::operator<< <char, std::char_traits<char> >"), "std::operator<< <...>");
  EXPECT_EQ(short_name("Foo::operator<"), "Foo::operator<");
  EXPECT_EQ(short_name("Foo::operator<=>"), "Foo::operator<=>");
  EXPECT_EQ(short_name("Foo<int>::operator->"), "Foo<...>::operator->");

  // site_label_text elides on request (summary's default view, check), native labels only.
  std::vector<Frame> st = {fn("c10::cuda::CUDACachingAllocator::allocate(unsigned long)"),
                           fn("void at::native::gpu_reduce_kernel<float, 4>(at::TensorIterator&)",
                              "/x/libtorch_cuda.so")};
  EXPECT_EQ(site_label_text(st), "at::native::gpu_reduce_kernel<float, 4>");
  EXPECT_EQ(site_label_text(st, true), "at::native::gpu_reduce_kernel<...>");
  std::vector<Frame> py_st = {anon("/v/torch/lib/libc10_cuda.so", 0x10), anon("/v/torch/lib/libtorch_cuda.so", 0x20),
                              py("<module>", "/work/job.py", 7)};
  EXPECT_EQ(site_label_text(py_st, true), "<module> (job.py:7)");
}

TEST(Labels, PassthroughFrames) {
  using gpuheap::Passthrough;
  using gpuheap::passthrough_kind;
  const char* mod = "/v/site-packages/torch/nn/modules/module.py";
  EXPECT_EQ(passthrough_kind(py("Module._call_impl", mod, 1790)), Passthrough::module_call);
  EXPECT_EQ(passthrough_kind(py("Module._wrapped_call_impl", mod, 1779)), Passthrough::module_call);
  EXPECT_EQ(passthrough_kind(py("Sequential.forward", "/v/site-packages/torch/nn/modules/container.py", 253)),
            Passthrough::module_call);
  // A layer's own forward, or the program's function of the same name, is not plumbing.
  EXPECT_EQ(passthrough_kind(py("Linear.forward", "/v/site-packages/torch/nn/modules/linear.py", 134)),
            Passthrough::none);
  EXPECT_EQ(passthrough_kind(py("Model._call_impl", "/work/job.py", 3)), Passthrough::none);
  EXPECT_EQ(passthrough_kind(fn("at::_ops::addmm::call(at::Tensor const&)", "/v/libtorch_cpu.so")),
            Passthrough::dispatch);
  EXPECT_EQ(passthrough_kind(fn("at::_ops::mm::redispatch(c10::DispatchKeySet)", "/v/libtorch_cpu.so")),
            Passthrough::dispatch);
  EXPECT_EQ(passthrough_kind(fn("c10::impl::wrap_kernel_functor_unboxed_<X>::call(c10::OperatorKernel*)")),
            Passthrough::dispatch);
  EXPECT_EQ(passthrough_kind(fn("torch::autograd::VariableType::(anonymous namespace)::mm(c10::DispatchKeySet)")),
            Passthrough::dispatch);
  EXPECT_EQ(passthrough_kind(fn("at::native::linear(at::Tensor const&)")), Passthrough::none);
  EXPECT_EQ(passthrough_kind(anon("/v/torch/lib/libtorch_cpu.so", 0x2000)), Passthrough::none);
}
