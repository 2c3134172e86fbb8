// Memory by category (analyzer/model/categories.h, docs/categories.md): each rule of the table
// on crafted stacks, the lifetime rules on crafted training steps (including `unknown`), and
// a synthetic trace through SiteLists and the summary (peak by category, the leak list
// without library memory, JSON).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "analyzer/model/categories.h"
#include "analyzer/summary/check.h"
#include "analyzer/summary/report.h"
#include "test_analyzer_util.h"

using namespace gpuheap;
using namespace gpuheap::test;

namespace {

constexpr std::uint64_t MiB = 1u << 20;

FrameRef native(std::string_view fn, std::string_view module = "/usr/lib/libtorch_cuda.so") {
  return {fn, "", module, 0, false};
}
FrameRef py(std::string_view fn, std::string_view file, int line = 1) { return {fn, file, "python", line, true}; }

// The allocator frames every PyTorch allocation has, innermost first.
const FrameRef kMalloc = native("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)");
const FrameRef kEmpty = native("at::detail::empty_cuda(long)");
const FrameRef kMain = py("main", "/job/train.py", 160);
const FrameRef kModule = py("<module>", "/job/train.py", 200);
const FrameRef kCallImpl = py("Module._call_impl", "/venv/torch/nn/modules/module.py", 1750);
const FrameRef kLinear = py("Linear.forward", "/venv/torch/nn/modules/linear.py", 134);

StackTraits traits(std::vector<FrameRef> f) { return stack_traits(f); }

}  // namespace

TEST(CategoryRules, LibraryByModuleFunctionAndFrameworkWorkspace) {
  // A stripped cuBLAS: only its module names it.
  auto t = traits({native("", "/venv/nvidia/cu13/lib/libcublas.so.13"), kCallImpl, kMain});
  EXPECT_EQ(t.library, "cuBLAS");
  EXPECT_EQ(traits({native("", "/x/libcublasLt.so.13"), kMain}).library, "cuBLASLt");
  EXPECT_EQ(traits({kMalloc, native("cudnnCreate", "/x/libcudnn_graph.so.9"), kMain}).library, "cuDNN");
  // PyTorch's own workspace for cuBLASLt, made through its caching allocator: whoever triggered it.
  t = traits({kMalloc, native("at::cuda::getCUDABlasLtWorkspace()"), native("at::cuda::blas::gemm<float>(...)"),
              kLinear, kCallImpl, kMain});
  EXPECT_EQ(t.library, "cuBLASLt");
  EXPECT_EQ(traits({kMalloc, native("at::cuda::setWorkspaceForHandle(cublasContext*, c10::cuda::CUDAStream)"),
                    native("at::cuda::getCurrentCUDABlasHandle()"), kLinear, kCallImpl, kMain})
                .library,
            "cuBLAS");
  EXPECT_EQ(traits({kMalloc,
                    native("at::cuda::(anonymous namespace)::setWorkspaceForHandle(cublasContext*, "
                           "c10::cuda::CUDAStream)"),
                    kMain})
                .library,
            "cuBLAS");
  EXPECT_EQ(traits({native("ncclCommInitRank"), kMain}).library, "NCCL");
  EXPECT_EQ(traits({native("", "/x/libcufft.so.12"), kMain}).library, "cuFFT");
  EXPECT_EQ(traits({py("_FFTPlan.__init__", "/venv/cupy/cuda/cufft.pyx"), kMain}).library, "cuFFT");
  // An operator that merely calls a library allocates the user's tensor: not library.
  EXPECT_EQ(traits({kMalloc, kEmpty, native("at::native::cudnn_convolution(...)"), kCallImpl, kMain}).library, "");
}

TEST(CategoryRules, PhasesFromFrames) {
  EXPECT_EQ(traits({kMalloc, kEmpty, kLinear, kCallImpl, kMain, kModule}).phase, TrainPhase::forward);
  auto b = traits({kMalloc, py("_make_grads", "/venv/torch/autograd/__init__.py"),
                   py("backward", "/venv/torch/autograd/__init__.py"), py("Tensor.backward", "/venv/torch/_tensor.py"),
                   py("main", "/job/train.py", 166), kModule});
  EXPECT_EQ(b.phase, TrainPhase::backward);
  EXPECT_TRUE(b.backward_call);
  EXPECT_EQ(b.backward_caller, "main (train.py:166)");
  EXPECT_EQ(traits({kMalloc, py("_multi_tensor_adamw", "/venv/torch/optim/adamw.py"),
                    py("Optimizer.step", "/venv/torch/optim/optimizer.py"), kMain})
                .phase,
            TrainPhase::optimizer);
  EXPECT_EQ(traits({kMalloc, py("LRScheduler.step", "/venv/torch/optim/lr_scheduler.py"), kMain}).phase,
            TrainPhase::none);
  EXPECT_EQ(traits({kMalloc, py("Optimizer.zero_grad", "/venv/torch/optim/optimizer.py"), kMain}).phase,
            TrainPhase::zero_grad);
  // A forward re-run inside backward (activation checkpointing) is backward.
  EXPECT_EQ(traits({kMalloc, kLinear, kCallImpl, py("CheckpointFunction.backward", "/venv/torch/utils/checkpoint.py"),
                    native("torch::autograd::PyNode::apply(std::vector<at::Tensor>&&)")})
                .phase,
            TrainPhase::backward);
  auto c = traits({kMalloc, kEmpty, py("Module._apply", "/venv/torch/nn/modules/module.py"),
                   py("Module.to", "/venv/torch/nn/modules/module.py"), kMain});
  EXPECT_TRUE(c.construction);
  EXPECT_EQ(c.phase, TrainPhase::none);
  EXPECT_FALSE(traits({kMalloc, kEmpty, kMain}).construction);
}

TEST(CategoryRules, AutogradNodesAndAccumulateGrad) {
  auto mm = traits({kMalloc, kEmpty, native("at::native::mm(...)"),
                    native("torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)"),
                    native("torch::autograd::Node::operator()(std::vector<at::Tensor>&&)"),
                    native("torch::autograd::Engine::evaluate_function(...)")});
  EXPECT_EQ(mm.node, "MmBackward0");
  EXPECT_EQ(mm.phase, TrainPhase::backward);
  EXPECT_FALSE(mm.accumulate_grad);
  EXPECT_FALSE(mm.backward_call);  // an autograd thread's stack has no backward() caller
  auto acc = traits({kMalloc, kEmpty, native("torch::autograd::AccumulateGrad::accumulateGrad<...>(...)"),
                     native("torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)")});
  EXPECT_TRUE(acc.accumulate_grad);
  EXPECT_EQ(acc.node, "AccumulateGrad");
  EXPECT_TRUE(traits({native("tsl::BFCAllocator::Extend(unsigned long, unsigned long)")}).framework_cache);
  EXPECT_TRUE(is_autograd_thread("pt_autograd_0"));
  EXPECT_FALSE(is_autograd_thread("python3"));
}

TEST(CategoryRules, NamesParseBack) {
  for (std::size_t i = 0; i < kNumCategories; ++i) {
    Category c{};
    ASSERT_TRUE(parse_category(category_name(static_cast<Category>(i)), c));
    EXPECT_EQ(static_cast<std::size_t>(c), i);
  }
  Category c{};
  EXPECT_FALSE(parse_category("weights", c));
}

namespace {

// Drives a Classifier through crafted allocations; finals collects every final category.
struct Drive {
  Classifier cls;
  std::map<std::uint64_t, Category> finals, moved;
  std::vector<StackTraits> keep;  // stable addresses: reserve() below
  std::uint64_t next = 1;
  Drive() {
    keep.reserve(256);
    cls.decided = [this](std::uint64_t id, Category c) { finals[id] = c; };
    cls.moved = [this](std::uint64_t id, Category c) { moved[id] = c; };
  }
  std::uint64_t alloc(std::vector<FrameRef> frames, bool autograd_thread = false) {
    keep.push_back(stack_traits(frames));
    const auto id = next++;
    cls.on_alloc({id, id, autograd_thread, &keep.back()});
    return id;
  }
  void free(std::uint64_t id) { finals[id] = cls.on_free(id); }
};

const std::vector<FrameRef> kForward = {kMalloc, kEmpty, kLinear, kCallImpl, kMain};
const std::vector<FrameRef> kBackwardNode =
    {kMalloc, kEmpty, native("torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)")};
const std::vector<FrameRef> kSeed = {kMalloc, py("_make_grads", "/venv/torch/autograd/__init__.py"),
                                     py("Tensor.backward", "/venv/torch/_tensor.py"), kMain};
const std::vector<FrameRef> kStep = {kMalloc, py("_multi_tensor_adamw", "/venv/torch/optim/adamw.py"),
                                     py("Optimizer.step", "/venv/torch/optim/optimizer.py"), kMain};
const std::vector<FrameRef> kBuild = {kMalloc, kEmpty, py("Module._apply", "/venv/torch/nn/modules/module.py"), kMain};
const std::vector<FrameRef> kPlain = {kMalloc, kEmpty, kMain};
const std::vector<FrameRef> kWorkspace = {kMalloc, native("at::cuda::getCUDABlasLtWorkspace()"), kLinear, kCallImpl,
                                          kMain};

}  // namespace

// One training step of each shape the rules name, then a second step: every category.
TEST(CategoryClassifier, TrainingStepLifetimes) {
  Drive d;
  const auto param = d.alloc(kBuild);
  EXPECT_EQ(d.cls.category(param), Category::parameter);  // provisional: what it is if it lives on
  const auto batch = d.alloc(kPlain);
  EXPECT_EQ(d.cls.category(batch), Category::unknown);  // no training seen yet
  const auto built_tmp = d.alloc(kBuild);
  d.free(built_tmp);
  EXPECT_EQ(d.finals[built_tmp], Category::temporary);

  const auto saved = d.alloc(kForward);  // step 1 forward
  EXPECT_EQ(d.cls.step(), 1u);
  EXPECT_EQ(d.finals[param], Category::parameter);  // decided when training started
  EXPECT_EQ(d.finals[batch], Category::other);
  const auto fwd_tmp = d.alloc(kForward);
  d.free(fwd_tmp);
  EXPECT_EQ(d.finals[fwd_tmp], Category::temporary);
  const auto ws = d.alloc(kWorkspace);
  EXPECT_EQ(d.cls.category(ws), Category::library);
  EXPECT_EQ(d.cls.phase(), TrainPhase::forward);
  const auto kept_out = d.alloc(kForward);  // an output the program keeps past backward
  const auto loss = d.alloc(kPlain);        // computed outside any module while forward runs

  const auto seed = d.alloc(kSeed);  // backward: the seed gradient on the main thread
  EXPECT_EQ(d.cls.phase(), TrainPhase::backward);
  EXPECT_EQ(d.cls.backward_caller(), "main (train.py:160)");
  EXPECT_EQ(d.cls.category(saved), Category::activation);
  const auto grad = d.alloc(kBackwardNode, true);
  const auto bwd_tmp = d.alloc(kBackwardNode, true);
  const auto plain_on_autograd = d.alloc(kPlain, true);  // no frames of its own: the thread decides
  EXPECT_EQ(d.cls.phase(), TrainPhase::backward);
  d.free(bwd_tmp), d.free(plain_on_autograd), d.free(seed), d.free(saved), d.free(loss);
  EXPECT_EQ(d.finals[bwd_tmp], Category::temporary);
  EXPECT_EQ(d.finals[seed], Category::temporary);
  EXPECT_EQ(d.finals[saved], Category::activation);  // freed inside the backward it was saved for
  EXPECT_EQ(d.finals[loss], Category::activation);

  const auto state = d.alloc(kStep);
  EXPECT_EQ(d.finals.count(grad), 0u);
  EXPECT_EQ(d.cls.category(grad), Category::gradient);  // outlived its backward: provisional
  EXPECT_EQ(d.moved.at(grad), Category::gradient);      // and said so (a streaming view recounts it)
  EXPECT_EQ(d.moved.at(kept_out), Category::other);
  const auto step_tmp = d.alloc(kStep);
  d.free(step_tmp);
  EXPECT_EQ(d.finals[step_tmp], Category::temporary);
  d.free(grad);  // zero_grad(set_to_none=True)
  EXPECT_EQ(d.finals[grad], Category::gradient);
  d.free(kept_out);
  EXPECT_EQ(d.finals[kept_out], Category::other);  // outlived the backward: not (only) saved

  const auto saved2 = d.alloc(kForward);  // step 2
  EXPECT_EQ(d.cls.step(), 2u);
  EXPECT_EQ(d.finals[state], Category::optimizer_state);
  d.free(saved2);
  EXPECT_EQ(d.finals[saved2], Category::temporary);
  d.cls.finish();
  EXPECT_EQ(d.finals[param], Category::parameter);
  d.free(ws);  // decided by its stack at the allocation: final from the start
  EXPECT_EQ(d.finals[ws], Category::library);
  EXPECT_TRUE(d.cls.saw_training());
}

// `unknown`: the rules do not guess.
TEST(CategoryClassifier, UnknownWhenTheRulesCannotDecide) {
  {
    Drive d;  // no training phase anywhere (a CUDA C program)
    const auto a = d.alloc({native("cudaMalloc"), native("main", "/bin/app")});
    d.cls.finish();
    EXPECT_EQ(d.finals[a], Category::unknown);
    EXPECT_FALSE(d.cls.saw_training());
  }
  {
    Drive d;  // a forward allocation never freed (a cache, an output or a workspace without symbols)
    const auto out = d.alloc(kForward);
    const auto tmp = d.alloc(kForward);
    d.free(tmp);
    d.cls.finish();
    EXPECT_EQ(d.finals[out], Category::unknown);
    EXPECT_EQ(d.finals[tmp], Category::temporary);
  }
  {
    Drive d;  // forward then backward, the saved one never freed: the trace ended inside backward
    const auto s = d.alloc(kForward);
    d.alloc(kSeed);
    d.cls.finish();
    EXPECT_EQ(d.finals[s], Category::activation);
  }
  Drive d;
  EXPECT_EQ(d.cls.on_free(12345), Category::unknown);  // never seen
  EXPECT_EQ(d.cls.category(12345), Category::unknown);
}

// A forward no backward follows (evaluation): what it left alive is other, not activation.
TEST(CategoryClassifier, ForwardWithoutBackwardIsNotActivation) {
  Drive d;
  const auto out = d.alloc(kForward);
  const auto next = d.alloc(kPlain);  // made after the forward... still inside it (no phase change)
  EXPECT_EQ(d.cls.phase(), TrainPhase::forward);
  const auto st = d.alloc(kStep);  // an optimizer step with no backward between
  EXPECT_EQ(d.finals[out], Category::other);
  EXPECT_EQ(d.finals[next], Category::other);
  d.free(st);
  EXPECT_EQ(d.finals[st], Category::temporary);
}

namespace {

// A trace of one training step, with the frames the rules read stored in it: Python code
// objects and symbolized native frames (as `gpuheap symbolize` writes them). `activation`:
// the bytes the forward saves for backward (at most 16 MiB).
TraceBuilder training_trace(std::uint64_t activation = 8 * MiB, std::uint64_t wall_ns = 1'700'000'000'000'000'000ull,
                            std::uint32_t pid = 100) {
  TraceBuilder b(wall_ns, pid);
  b.put(format::ThreadRecord{1, "python3"});
  b.put(format::ThreadRecord{2, "pt_autograd_0"});
  const char* names[] = {"",
                         "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int)",
                         "at::detail::empty_cuda(long)",
                         "at::cuda::getCUDABlasLtWorkspace()",
                         "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
                         "alloc.cpp"};
  for (std::uint32_t id = 1; id < 6; ++id) b.put(format::SymbolStringRecord{id, names[id]});
  auto frames = [&](std::uint64_t ip, std::uint32_t fn) {
    format::SymbolFrameEntry e{fn, 5, 10, 0};
    unsigned char buf[256];
    auto n = format::encode_symbol_frames(buf, sizeof buf, ip, &e, 1);
    b.data.insert(b.data.end(), buf, buf + n);
  };
  frames(0x401000, 1), frames(0x402000, 2), frames(0x403000, 3), frames(0x404000, 4);
  struct Code {
    const char *file, *name;
    int line;
  };
  const Code codes[] = {{"/job/train.py", "main", 160},
                        {"/venv/torch/nn/modules/module.py", "Module._call_impl", 1750},
                        {"/venv/torch/nn/modules/module.py", "Module._apply", 900},
                        {"/venv/torch/_tensor.py", "Tensor.backward", 570},
                        {"/venv/torch/optim/adamw.py", "_multi_tensor_adamw", 480}};
  for (std::uint32_t i = 0; i < 5; ++i)
    b.put(format::PyCodeRecord{i + 1, 3, 12, codes[i].line, codes[i].file, codes[i].name, ""});
  auto pyf = [](std::uint32_t code) { return format::py_frame(code, format::kPyNoLasti); };
  b.stack(1, {0x401000, 0x402000, pyf(3), pyf(1)});  // model construction
  b.stack(2, {0x401000, 0x402000, pyf(2), pyf(1)});  // forward
  b.stack(3, {0x401000, 0x403000, pyf(2), pyf(1)});  // cuBLASLt workspace, triggered in forward
  b.stack(4, {0x401000, pyf(4), pyf(1)});            // backward's seed gradient (main thread)
  b.stack(5, {0x401000, 0x402000, 0x404000});        // an autograd node (autograd thread)
  b.stack(6, {0x401000, pyf(5), pyf(1)});            // optimizer step
  const std::uint64_t base = 0x7f0000000000ull;
  b.segment(base, 64 * MiB, false);
  b.alloc(base, 4 * MiB, 4 * MiB, 1);                                             // parameter
  b.alloc(base + 32 * MiB, activation, activation, 2);                            // activation
  b.alloc(base + 12 * MiB, 1 * MiB, 1 * MiB, 3);                                  // library
  b.alloc(base + 13 * MiB, 4, 512, 4);                                            // temporary (seed)
  b.alloc(base + 14 * MiB, 4 * MiB, 4 * MiB, 5, AllocKind::device_pooled, 0, 2);  // gradient
  b.alloc(base + 18 * MiB, 2 * MiB, 2 * MiB, 5, AllocKind::device_pooled, 0, 2);  // temporary: the peak
  b.free(base + 18 * MiB, AllocKind::device_pooled, 2);
  b.free(base + 32 * MiB, AllocKind::device_pooled, 2);
  b.free(base + 13 * MiB);
  b.alloc(base + 20 * MiB, 8 * MiB, 8 * MiB, 6);  // optimizer state
  b.end();
  return b;
}

}  // namespace

TEST(CategorySummary, PeakByCategoryAndLeaksWithoutLibraries) {
  auto a = analyze_one(training_trace(), "categories.gh");
  SiteLists sites(a, false);
  const auto& rep = sites.categories(0);
  ASSERT_EQ(rep.peaks.size(), 1u);
  const auto& pk = rep.peaks[0];
  ASSERT_TRUE(pk.valid);
  EXPECT_EQ(pk.totals.total(), 19 * MiB + 4);  // the Model's peak, requested bytes
  EXPECT_EQ(pk.totals.of(Category::parameter), 4 * MiB);
  EXPECT_EQ(pk.totals.of(Category::activation), 8 * MiB);
  EXPECT_EQ(pk.totals.of(Category::library), 1 * MiB);
  EXPECT_EQ(pk.totals.of(Category::gradient), 4 * MiB);
  EXPECT_EQ(pk.totals.of(Category::temporary), 2 * MiB + 4);
  EXPECT_EQ(pk.libraries.at("cuBLASLt"), 1 * MiB);
  EXPECT_EQ(rep.leaked.of(Category::optimizer_state), 8 * MiB);
  EXPECT_EQ(rep.leaked.of(Category::library), 1 * MiB);
  EXPECT_EQ(rep.steps, 1u);
  EXPECT_EQ(rep.backward_caller.at(5), "main (train.py:160)");
  EXPECT_EQ(sites.site_category(0, 3), Category::library);
  EXPECT_EQ(sites.site_category(0, 6), Category::optimizer_state);

  SummaryOptions opt;
  const auto text = summary_text(a, opt, sites);
  EXPECT_NE(text.find("Memory by category at the peak, device 0: 19.0 MiB requested, in the backward of step 1 of 1\n"
                      "  parameter 4.00 MiB (21.1%), gradient 4.00 MiB (21.1%), activation 8.00 MiB (42.1%),"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("library 1.00 MiB (5.3%: cuBLASLt 1.00 MiB)"), std::string::npos) << text;
  EXPECT_EQ(text.find("[autograd MmBackward0]"), std::string::npos) << text;  // sites: --full
  SummaryOptions full;
  full.full = true;
  SiteLists fs(a, false);
  const auto ftext = summary_text(a, full, fs);
  EXPECT_NE(ftext.find("  library            1.00 MiB   5.3%      1 alloc   cuBLASLt 1.00 MiB\n"
                       "        1.00 MiB in    1 [cuBLASLt] at::cuda::getCUDABlasLtWorkspace (alloc.cpp:10)\n"),
            std::string::npos)
      << ftext;
  EXPECT_NE(ftext.find("  gradient           4.00 MiB  21.1%      1 alloc\n        4.00 MiB in    1 "
                       "torch::autograd::generated::MmBackward0::apply (alloc.cpp:10) [autograd MmBackward0] "
                       "(backward() from main (train.py:160))\n"),
            std::string::npos)
      << ftext;
  // The leak list is the program's memory: 4 + 4 + 8 MiB; the workspace is the library's.
  EXPECT_NE(text.find("Leaks (live at the end of the trace): 16.0 MiB requested (16.0 MiB allocated) in 3 "
                      "allocations; libraries hold 1.00 MiB more (--include-library lists them)"),
            std::string::npos)
      << text;
  opt.include_library = true;
  SiteLists all(a, false);
  const auto with_lib = summary_text(a, opt, all);
  EXPECT_NE(with_lib.find("Leaks (live at the end of the trace): 17.0 MiB requested (17.0 MiB allocated) in 4 "
                          "allocations\n"),
            std::string::npos)
      << with_lib;

  // --group-by category: the peak's sites summed by their category (21.1% = 4 of 19 MiB).
  SummaryOptions by_cat;
  by_cat.group_by = "category";
  SiteLists gs(a, false);
  const auto grouped = summary_text(a, by_cat, gs);
  EXPECT_NE(grouped.find("  by category:\n"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("(42.1% of peak) in 1 allocation from 1 site activation\n"), std::string::npos) << grouped;
  EXPECT_NE(grouped.find("from 1 site library\n"), std::string::npos) << grouped;

  opt.include_library = false;
  SiteLists js(a, false);
  const auto doc = summary_json(a, opt, js);
  EXPECT_EQ(doc["schema"], "gpuheap.summary/2");
  EXPECT_EQ(doc["categories"]["at_peak"][0]["totals"]["activation"]["bytes"], 8 * MiB);
  // The optimizer step runs with the gradient alive: counted as one there, not a temporary.
  bool saw_step = false;
  for (const auto& p : doc["categories"]["phases_found"]) {
    if (p["phase"] != "optimizer_step") continue;
    saw_step = true;
    EXPECT_EQ(p["peak_by_category"]["gradient"], 4 * MiB) << p.dump();
    EXPECT_FALSE(p["peak_by_category"].contains("temporary")) << p.dump();
  }
  EXPECT_TRUE(saw_step);
  ASSERT_EQ(doc["leaks"].size(), 4u);  // JSON keeps every site; `category` tells the library's apart
  int library = 0;
  for (const auto& s : doc["leaks"]) library += s["category"] == "library";
  EXPECT_EQ(library, 1);
  EXPECT_EQ(doc["peak_consumers"].is_null(), false);
}

// The report's timeline by category (CategoryReport::timelines): at every point of the
// device's timeline the categories add up to its requested bytes, each allocation in its final
// category (the gradient made on the autograd thread reads gradient from the start, not the
// temporary a streaming reader would call it until its phase ends), and the point of the
// peak reads what the peak's categories read.
// With 4 buckets for the 12 records, a bucket's point is the moment of its maximum, not its
// last record.
class CategoryTimeline : public ::testing::TestWithParam<std::size_t> {};
INSTANTIATE_TEST_SUITE_P(Buckets, CategoryTimeline, ::testing::Values(std::size_t{2048}, std::size_t{4}));

TEST_P(CategoryTimeline, SumsToRequestedInFinalCategories) {
  auto a = analyze_one(training_trace(), "categories-timeline.gh", GetParam());
  SiteLists sites(a, false);
  const auto& rep = sites.categories(0, true);
  const Model& m = *a.traces[0];
  ASSERT_EQ(rep.timelines.size(), m.devices.size());
  const auto pts = m.devices[0].timeline.points();
  const auto& tl = rep.timelines[0];
  ASSERT_EQ(tl.size(), pts.size());
  ASSERT_GE(pts.size(), GetParam() > 100 ? 8u : 2u);
  auto of = [](const CategoryReport::Live& x, Category c) { return x[static_cast<std::size_t>(c)]; };
  std::size_t peak = pts.size();
  for (std::size_t i = 0; i < pts.size(); ++i) {
    std::uint64_t sum = 0;
    for (auto v : tl[i]) sum += v;
    EXPECT_EQ(sum, static_cast<std::uint64_t>(pts[i].requested)) << "point " << i;
    if (pts[i].requested == static_cast<std::int64_t>(19 * MiB + 4)) peak = i;
  }
  ASSERT_LT(peak, pts.size());
  for (std::size_t c = 0; c < kNumCategories; ++c)
    EXPECT_EQ(tl[peak][c], rep.peaks[0].totals.bytes[c]) << category_name(static_cast<Category>(c));
  EXPECT_EQ(of(tl[peak], Category::gradient), 4 * MiB);
  EXPECT_EQ(of(tl[peak], Category::activation), 8 * MiB);
  EXPECT_EQ(of(tl[peak], Category::temporary), 2 * MiB + 4);
  const auto& last = tl.back();
  EXPECT_EQ(of(last, Category::parameter), 4 * MiB);
  EXPECT_EQ(of(last, Category::optimizer_state), 8 * MiB);
  EXPECT_EQ(of(last, Category::library), 1 * MiB);
  EXPECT_EQ(of(last, Category::activation), 0u);
  // The activation is one from its first point on, before backward decided it.
  for (std::size_t i = 0; i < pts.size(); ++i)
    if (pts[i].requested == static_cast<std::int64_t>(12 * MiB)) EXPECT_EQ(of(tl[i], Category::activation), 8 * MiB);

  // Without a phase or a stack rule deciding anything there is nothing to draw: no timelines
  // (and no third read of the trace).
  TraceBuilder b;
  b.stack(1, {0x401000});
  b.segment(0x7f0000000000ull, 8 * MiB, false);
  b.alloc(0x7f0000000000ull, 1 * MiB, 1 * MiB, 1);
  b.end();
  auto plain = analyze_one(b, "categories-none.gh");
  SiteLists ps(plain, false);
  EXPECT_FALSE(ps.categories(0, true).decided_anything());
  EXPECT_TRUE(ps.categories(0, true).timelines.empty());
}

// The merged timeline of a GPU shared by processes (Analysis::merged) by category: two
// training processes, the second 500 ns behind the first (their events interleave), and a
// process that decided nothing (its 3 MiB: unknown) alive across both. At every point the
// categories add up to the merged requested line; at its peak (both processes at theirs) they
// are the processes' own peaks by category plus the unknown 3 MiB; each process's own timeline
// is the one a report of that trace alone draws.
TEST_P(CategoryTimeline, MergedProcessesSumToTheMergedLine) {
  const std::uint64_t wall = 1'700'000'000'000'000'000ull;
  TraceBuilder plain(wall - 10'000, 102);
  plain.stack(1, {0x401000});
  plain.segment(0x7e0000000000ull, 8 * MiB, false);
  plain.alloc(0x7e0000000000ull, 3 * MiB, 3 * MiB, 1);
  plain.tick(100'000);
  plain.end();
  const std::vector<TraceBuilder> procs = {training_trace(8 * MiB, wall, 100),
                                           training_trace(12 * MiB, wall + 500, 101), plain};
  std::vector<std::string> paths;
  for (std::size_t i = 0; i < procs.size(); ++i) paths.push_back(procs[i].write(fmt::format("merged-cat-{}.gh", i)));
  AnalyzeOptions o;
  o.timeline_buckets = GetParam(), o.progress = false, o.warn_truncated = false;
  const auto a = analyze(paths, o);
  ASSERT_EQ(a.merged.size(), 1u);
  SiteLists sites(a, false);
  const auto& merged = sites.merged_categories();
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].undecided, 1u);
  EXPECT_TRUE(merged[0].saw_training);
  const auto pts = a.merged[0].timeline.points();
  const auto& tl = merged[0].at;
  ASSERT_EQ(tl.size(), pts.size());
  std::size_t peak = 0;
  for (std::size_t i = 0; i < pts.size(); ++i) {
    std::uint64_t sum = 0;
    for (auto v : tl[i]) sum += v;
    EXPECT_EQ(sum, static_cast<std::uint64_t>(pts[i].requested)) << "point " << i;
    if (pts[i].requested > pts[peak].requested) peak = i;
  }
  ASSERT_EQ(pts[peak].requested, static_cast<std::int64_t>(19 * MiB + 4 + 23 * MiB + 4 + 3 * MiB));
  const auto& r0 = sites.categories(0, true);
  const auto& r1 = sites.categories(1, true);
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    const std::uint64_t unknown = c == static_cast<std::size_t>(Category::unknown) ? 3 * MiB : 0;
    EXPECT_EQ(tl[peak][c], r0.peaks[0].totals.bytes[c] + r1.peaks[0].totals.bytes[c] + unknown)
        << category_name(static_cast<Category>(c));
  }
  EXPECT_EQ(tl[peak][static_cast<std::size_t>(Category::activation)], 20 * MiB);
  // Each process's own timeline, from the same read: as that trace's alone.
  for (std::size_t i = 0; i < 2; ++i) {
    auto one = analyze_one(procs[i], fmt::format("merged-cat-alone-{}.gh", i), GetParam());
    SiteLists alone(one, false);
    EXPECT_EQ(sites.categories(i, true).timelines, alone.categories(0, true).timelines) << "trace " << i;
  }
  EXPECT_TRUE(sites.categories(2, true).timelines.empty());  // decided nothing: none of its own

  // No process decided anything: nothing to draw.
  const auto none = analyze({paths[2], plain.write("merged-cat-plain-2.gh")}, o);
  SiteLists ns(none, false);
  ASSERT_EQ(ns.merged_categories().size(), 1u);
  EXPECT_TRUE(ns.merged_categories()[0].at.empty());
  EXPECT_EQ(ns.merged_categories()[0].undecided, 2u);
}

// A trace that changed after analyze() read it (replaced by another job's): the categories
// no longer add up to the merged line, so none are drawn rather than wrong ones.
TEST(CategoryTimeline, MergedTraceChangedSinceReadShowsNone) {
  const std::uint64_t wall = 1'700'000'000'000'000'000ull;
  const std::string a_path = training_trace(8 * MiB, wall, 100).write("merged-changed-0.gh");
  const std::string b_path = training_trace(8 * MiB, wall + 500, 101).write("merged-changed-1.gh");
  AnalyzeOptions o;
  o.progress = false, o.warn_truncated = false;
  const auto a = analyze({a_path, b_path}, o);
  training_trace(12 * MiB, wall + 500, 101).write("merged-changed-1.gh");
  SiteLists sites(a, false);
  ASSERT_EQ(sites.merged_categories().size(), 1u);
  EXPECT_TRUE(sites.merged_categories()[0].at.empty());
}

// Gradients: freed by the zero_grad after the step that used them, over accumulating
// backwards; one alive across a second step is not told apart from a lazily made workspace.
TEST(CategoryClassifier, GradientsLiveUntilTheStepAfterTheirBackward) {
  Drive d;
  d.alloc(kForward);
  d.alloc(kSeed);
  const auto g1 = d.alloc(kBackwardNode, true);  // micro-batch 1
  d.alloc(kForward);
  d.alloc(kSeed);
  const auto g2 = d.alloc(kBackwardNode, true);  // micro-batch 2
  const auto ws = d.alloc(kBackwardNode, true);  // e.g. a workspace made on first use, no symbols
  d.alloc(kStep);
  d.free(g1), d.free(g2);  // zero_grad(set_to_none=True)
  EXPECT_EQ(d.finals[g1], Category::gradient);
  EXPECT_EQ(d.finals[g2], Category::gradient);
  EXPECT_EQ(d.cls.category(ws), Category::gradient);  // provisional: one step so far
  d.alloc(kForward);
  d.alloc(kSeed);
  const auto g3 = d.alloc(kBackwardNode, true);
  d.alloc(kStep);  // a second step began with ws alive: kept across steps
  EXPECT_EQ(d.finals[ws], Category::unknown);
  d.cls.finish();
  EXPECT_EQ(d.finals[g3], Category::gradient);  // the last step's, alive at the end
}

// A trace with no training phase (a CUDA C program): the lifetime rules do not apply, every
// allocation is unknown unless its stack decides, and the text summary has no category section.
TEST(CategorySummary, NoPhaseFoundMeansUnknown) {
  TraceBuilder b;
  b.stack(1, {0x401000});
  b.alloc(0x1000000, MiB, MiB, 1, AllocKind::device_passthrough);
  b.alloc(0x2000000, 2 * MiB, 2 * MiB, 1, AllocKind::device_passthrough);
  b.free(0x2000000, AllocKind::device_passthrough);
  b.end();
  auto a = analyze_one(b, "categories_nophase.gh");
  SiteLists sites(a, false);
  const auto& rep = sites.categories(0);
  EXPECT_FALSE(rep.saw_training);
  EXPECT_EQ(rep.peaks[0].totals.of(Category::unknown), 3 * MiB);
  EXPECT_EQ(rep.peaks[0].totals.of(Category::temporary), 0u);
  EXPECT_EQ(rep.by_stack.at(1).of(Category::unknown), 3 * MiB);
  EXPECT_EQ(rep.leaked.of(Category::unknown), MiB);
  EXPECT_EQ(summary_text(a, SummaryOptions{}, sites).find("Memory by category"), std::string::npos);
}

// An optimizer step that allocates nothing (SGD after its first step) shows no phase: a
// backward's allocation alive at the end is a gradient only if the last backward made it.
TEST(CategoryClassifier, KeptAcrossBackwardsWithoutStepsIsUnknownAtTheEnd) {
  Drive d;
  d.alloc(kForward);
  d.alloc(kSeed);
  const auto ws = d.alloc(kBackwardNode, true);
  const auto g1 = d.alloc(kBackwardNode, true);
  d.alloc(kStep);  // step 1 allocates its state
  d.free(g1);
  d.alloc(kForward);  // step 2: the optimizer allocates nothing
  d.alloc(kSeed);
  const auto g2 = d.alloc(kBackwardNode, true);
  d.cls.finish();
  EXPECT_EQ(d.finals[g1], Category::gradient);
  EXPECT_EQ(d.finals[g2], Category::gradient);
  EXPECT_EQ(d.finals[ws], Category::unknown);
}

// The leak header's totals stay the trace's (address space left out) when no site is a
// library's: only library sites are subtracted, never recounted from the site list.
TEST(CategorySummary, LeakHeaderKeepsTheTotalsWithoutLibraries) {
  TraceBuilder b;
  b.stack(1, {0x401000});
  b.alloc(0x1000000, 2 * MiB, 2 * MiB, 1, AllocKind::device_passthrough);
  b.alloc(0x7000000000ull, 10 * MiB, 10 * MiB, 1, AllocKind::va_reserve);
  b.end();
  auto a = analyze_one(b, "categories_va.gh");
  SiteLists sites(a, false);
  const auto text = summary_text(a, SummaryOptions{}, sites);
  EXPECT_NE(text.find("Leaks (live at the end of the trace): 2.00 MiB requested (2.00 MiB allocated) in 2 "
                      "allocations\n"),
            std::string::npos)
      << text;
}

// check --max-category: a category's bytes at each device's peak against a limit.
TEST(CategoryCheck, MaxCategoryAtThePeak) {
  auto a = analyze_one(training_trace(), "categories_check.gh");
  CheckOptions o;
  o.max_category = {{Category::activation, 8 * MiB}, {Category::parameter, 4 * MiB - 1}};
  auto r = run_check(a, o);
  ASSERT_EQ(r.violations.size(), 1u);
  EXPECT_NE(r.violations[0].find("parameter at the peak of device 0: 4.00 MiB (4194304 B) exceeds --max-category "
                                 "parameter=4.00 MiB; top site: 4.00 MiB in 1 allocations at Module._apply"),
            std::string::npos)
      << r.violations[0];
  ASSERT_EQ(r.passed.size(), 1u);
  EXPECT_NE(r.passed[0].find("activation at the peak of device 0: 8.00 MiB (8388608 B) within"), std::string::npos)
      << r.passed[0];
  const auto cli = run(std::string(GPUHEAP_CLI) + " check -q --max-category weights=1GiB " + TraceBuilder::dir() +
                       "/categories_check.gh");
  EXPECT_EQ(cli.code, 2) << cli.out;
  EXPECT_NE(cli.out.find("--max-category takes NAME=SIZE"), std::string::npos) << cli.out;
  const auto ok = run(std::string(GPUHEAP_CLI) + " check -q --max-category library=1MiB " + TraceBuilder::dir() +
                      "/categories_check.gh");
  EXPECT_EQ(ok.code, 0) << ok.out;
}

// diff by category: bytes of each category at each device's peak, A -> B, in the text and in
// --json, equal to what `summary --json` says of each trace.
TEST(CategoryDiff, ByCategoryAtEachDevicesPeak) {
  const auto a = training_trace(8 * MiB).write("categories_diff_a.gh");
  const auto b = training_trace(12 * MiB).write("categories_diff_b.gh");
  const std::string cli = std::string(GPUHEAP_CLI);
  const auto text = run(cli + " diff -q " + a + " " + b);
  ASSERT_EQ(text.code, 0) << text.out;
  const auto section = text.out.find("By category at each device's peak (requested bytes live then");
  ASSERT_NE(section, std::string::npos) << text.out;
  EXPECT_LT(text.out.find("gpuheap diff totals"), section);
  EXPECT_LT(section, text.out.find("Per-site change"));
  EXPECT_NE(text.out.find("    activation            8.00 MiB      12.0 MiB     +4.00 MiB    +50.0%\n", section),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("    parameter             4.00 MiB      4.00 MiB           0 B     +0.0%\n", section),
            std::string::npos)
      << text.out;
  EXPECT_EQ(text.out.find("    framework_cache", section), std::string::npos) << text.out;  // 0 in both: no row

  const auto js = run(cli + " diff -q --json " + a + " " + b + " 2>/dev/null");
  ASSERT_EQ(js.code, 0) << js.out;
  const auto doc = nlohmann::json::parse(js.out);
  EXPECT_EQ(doc["schema"], "gpuheap.diff/1");
  ASSERT_EQ(doc["categories"].size(), 1u) << doc["categories"].dump();
  const auto& dev = doc["categories"][0];
  EXPECT_EQ(dev["device"], 0);
  EXPECT_TRUE(dev["in_a"].get<bool>() && dev["in_b"].get<bool>());
  const auto sa = nlohmann::json::parse(run(cli + " summary -q --json " + a + " 2>/dev/null").out);
  const auto sb = nlohmann::json::parse(run(cli + " summary -q --json " + b + " 2>/dev/null").out);
  for (std::size_t c = 0; c < kNumCategories; ++c) {
    const char* name = category_name(static_cast<Category>(c));
    const auto& row = dev["at_peak"][name];
    EXPECT_EQ(row["a"], sa["categories"]["at_peak"][0]["totals"][name]["bytes"]) << name;
    EXPECT_EQ(row["b"], sb["categories"]["at_peak"][0]["totals"][name]["bytes"]) << name;
    EXPECT_EQ(row["delta"].get<std::int64_t>(), row["b"].get<std::int64_t>() - row["a"].get<std::int64_t>()) << name;
  }
  EXPECT_EQ(dev["at_peak"]["activation"]["delta"], 4 * MiB);
  EXPECT_DOUBLE_EQ(dev["at_peak"]["activation"]["change_pct"].get<double>(), 50.0);
  EXPECT_TRUE(dev["at_peak"]["framework_cache"]["change_pct"] == 0.0);
}

// check --baseline: a failing gate names the category that grew most over the baseline's.
TEST(CategoryCheck, BaselineNamesTheCategoryThatGrew) {
  const auto base = training_trace(8 * MiB).write("categories_base.gh");
  const std::string doc = TraceBuilder::dir() + "/categories_base.json";
  const auto js = run(std::string(GPUHEAP_CLI) + " summary -q --json " + base + " 2>/dev/null > " + doc);
  ASSERT_EQ(js.code, 0) << js.out;
  auto a = analyze_one(training_trace(12 * MiB), "categories_grown.gh");
  CheckOptions o;
  o.baseline = doc;
  auto r = run_check(a, o);
  ASSERT_FALSE(r.violations.empty());
  EXPECT_NE(r.violations[0].find("peak requested bytes"), std::string::npos) << r.violations[0];
  EXPECT_NE(r.violations[0].find("; category grew most: activation +4.00 MiB (8.00 MiB -> 12.0 MiB) at the peak"),
            std::string::npos)
      << r.violations[0];
}

// A phase that never ends (no training found, followed live for hours) keeps only what is
// live: the classifier's memory does not grow with the allocations made.
TEST(CategoryClassifier, StaysBoundedInAPhaseThatNeverEnds) {
  Drive d;
  const auto kept = d.alloc(kPlain);
  for (int i = 0; i < 100000; ++i) d.free(d.alloc(kPlain));
  EXPECT_LT(d.cls.tracked(), 10000u);
  EXPECT_EQ(d.cls.category(kept), Category::unknown);
  d.alloc(kForward);  // training starts: the one still live is decided as before
  EXPECT_EQ(d.finals[kept], Category::other);
}

// Issue 34's truth, kept for every build: the shipped H100 GPT trace (recorded through
// `gpuheap run`, symbols stored in it) classifies on any machine as it did on the GPU, against
// torch's own numbers from a native run of the same job (gpu-test's torch_categories case:
// parameters and buffers, AdamW's state tensors, every p.grad, the storages autograd saved).
TEST(CategoryTruth, ShippedGptTraceMatchesTorchsOwnNumbers) {
  const std::string src = GPUHEAP_SOURCE_DIR;
  std::ifstream f(src + "/bench/results/gpu-test-2026-12-07-b337fb7-h100.json");
  ASSERT_TRUE(f.good());
  const auto truth = nlohmann::json::parse(f)["cases"]["torch_categories"]["details"]["gpt"]["truth"];
  const std::string trace = src + "/examples/traces/h100-gpt-train.trace.zst";
  const auto js = run(std::string(GPUHEAP_CLI) + " summary -q --json " + trace + " 2>/dev/null");
  ASSERT_EQ(js.code, 0) << js.out;
  // run() merges stderr: the warning that the trace's modules are not on this machine follows.
  const auto end = js.out.rfind("\n}");
  ASSERT_NE(end, std::string::npos) << js.out;
  const auto doc = nlohmann::json::parse(js.out.substr(0, end + 2));
  const auto& cats = doc["categories"];
  ASSERT_EQ(cats["at_peak"].size(), 1u) << cats.dump();
  const auto& peak = cats["at_peak"][0];
  const auto& tot = peak["totals"];
  EXPECT_EQ(tot["parameter"]["bytes"], truth["parameter"]);
  EXPECT_EQ(tot["parameter"]["count"], truth["parameter_tensors"]);
  EXPECT_EQ(tot["optimizer_state"]["bytes"], truth["optimizer_state"]);
  EXPECT_EQ(tot["optimizer_state"]["count"], truth["optimizer_state_tensors"]);
  EXPECT_EQ(tot["unknown"]["bytes"], 0) << tot.dump();
  std::uint64_t libraries = 0;
  for (const auto& [name, bytes] : peak["libraries"].items()) libraries += bytes.get<std::uint64_t>();
  EXPECT_GT(libraries, 0u);
  EXPECT_EQ(tot["library"]["bytes"], libraries) << peak.dump();
  // The peak falls inside backward: activation is what autograd saved, less what it freed.
  const double act = tot["activation"]["bytes"], saved = truth["saved_activations"];
  EXPECT_NEAR(act / saved, 1.0, 0.01);

  const auto& cmd = doc["trace"]["command"];
  const auto steps_arg = std::find(cmd.begin(), cmd.end(), "--steps");
  ASSERT_NE(steps_arg, cmd.end()) << cmd.dump();
  EXPECT_EQ(cats["steps_found"], std::stoi((steps_arg + 1)->get<std::string>()));
  const nlohmann::json* last_step = nullptr;  // the last optimizer step found from frames
  for (const auto& p : cats["phases_found"])
    if (p["phase"] == "optimizer_step" && (!last_step || p["step"] > (*last_step)["step"])) last_step = &p;
  ASSERT_NE(last_step, nullptr) << cats.dump();
  EXPECT_EQ((*last_step)["peak_by_category"]["gradient"], truth["gradient"]);

  // The backward pass attributed: the autograd node and the line that called backward().
  const auto full = run(std::string(GPUHEAP_CLI) + " summary -q --full " + trace + " 2>/dev/null");
  ASSERT_EQ(full.code, 0);
  EXPECT_NE(full.out.find("[autograd MmBackward0] (backward() from main (torch_job.py:"), std::string::npos);
}
