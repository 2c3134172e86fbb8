// Memory in the user's terms (docs/categories.md has the rule table): every allocation gets a
// category (parameter, gradient, optimizer_state, activation, temporary, library,
// framework_cache, other, or unknown when the rules cannot decide), derived offline from its
// stack's frames, its thread, its lifetime and the phase it was made in. The phases of a
// PyTorch job (forward, backward, optimizer step) are found from the job's own frames, with
// no NVTX range or gpuheap mark needed.
//
// Two layers, both usable from a streaming reader (gpuheap top):
//   stack_traits(): what one stack says (its phase, the library it belongs to, whether it
//                   builds or loads a model, the autograd node that made it), from frame
//                   names only: computed once per stack id.
//   Classifier:     the allocations in trace order: on_alloc() gives the category known at
//                   that moment (provisional for lifetime-decided ones), on_free() the final
//                   one; a phase change decides the allocations that outlived their phase
//                   (reported through the `decided` callback), finish() the rest.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace gpuheap {

enum class Category : std::uint8_t {
  parameter,
  gradient,
  optimizer_state,
  activation,
  temporary,
  library,
  framework_cache,
  other,
  unknown,
};
inline constexpr std::size_t kNumCategories = 9;
const char* category_name(Category c);
// "activation" -> Category::activation; false for a name that is none.
bool parse_category(std::string_view name, Category& out);

// The training phase a stack or a moment belongs to (found from frames, not markers).
enum class TrainPhase : std::uint8_t { none, forward, backward, optimizer, zero_grad };
const char* train_phase_name(TrainPhase p);

// One frame as the rules read it (a view of a symbolized Frame; python: a Python frame).
struct FrameRef {
  std::string_view function, file, module;
  int line = 0;
  bool python = false;
};

struct StackTraits {
  TrainPhase phase = TrainPhase::none;
  std::string library;           // "cuBLAS", "cuBLASLt", "cuDNN", ...: a library's own memory
  bool framework_cache = false;  // a framework's arena (XLA's BFC allocator)
  bool construction = false;     // builds, moves or loads a model (Module._apply, load_state_dict, ...)
  bool accumulate_grad = false;  // autograd's AccumulateGrad: a parameter's gradient
  bool backward_call = false;    // a main-thread stack inside Tensor.backward / autograd.backward
  std::string node;              // the autograd node that made it ("MmBackward0"), "" if none
  std::string backward_caller;   // backward_call: the frame that called backward() ("main (job.py:166)")
};

// The traits of one stack, frames innermost first (as symbolize() gives them).
StackTraits stack_traits(const std::vector<FrameRef>& frames);
// PyTorch names its autograd worker threads "pt_autograd_N" (torch/csrc/autograd/engine.cpp).
bool is_autograd_thread(std::string_view thread_name);

class Classifier {
 public:
  struct Alloc {
    std::uint64_t id = 0;  // unique among live allocations (the trace's space key)
    std::uint64_t ts = 0;
    bool autograd_thread = false;
    const StackTraits* traits = nullptr;  // must outlive the allocation's stay in the classifier
  };
  // A live allocation's category became final before its free (an activation at the end of
  // backward, a parameter when training starts, ...).
  std::function<void(std::uint64_t id, Category c)> decided;
  // A live allocation's provisional category changed, not yet final (a backward's
  // allocation alive when its backward ended: gradient until freed or retired; a saved one
  // that outlived its backward: other).
  std::function<void(std::uint64_t id, Category c)> moved;

  // The category known now: final for stack-decided ones (library, gradient through
  // AccumulateGrad, framework_cache), else provisional (what it is if it lives on).
  Category on_alloc(const Alloc& a);
  // The final category of a freed allocation (unknown for an id never seen).
  Category on_free(std::uint64_t id);
  // The current best category of a live allocation (unknown when not live).
  Category category(std::uint64_t id) const;
  // End of the trace: every allocation still live gets its final category through `decided`.
  void finish();

  TrainPhase phase() const { return phase_; }
  std::uint32_t step() const { return step_; }                             // 0 before the first forward, then 1, 2, ...
  bool saw_training() const { return saw_training_; }                      // a forward, backward or step was found
  const std::string& backward_caller() const { return backward_caller_; }  // of the current/last backward
  // Allocation ids the classifier holds (live ones and those its phase lists still name):
  // bounded by the live allocations, however long a phase runs.
  std::size_t tracked() const { return live_.size() + epoch_ids_.size(); }

 private:
  // pending: in the phase that made it; saved: a forward's, live when backward began; kept:
  // a saved one that outlived that backward; grad: a backward's, live when it ended.
  enum class State : std::uint8_t { pending, saved, kept, grad, decided };
  struct Live {
    std::uint64_t epoch = 0;
    std::uint32_t steps_seen = 0;   // grad: optimizer steps begun when its backward ended
    std::uint32_t backward_no = 0;  // grad: which backward made it (1, 2, ...)
    TrainPhase phase = TrainPhase::none;
    State state = State::pending;
    Category cat = Category::unknown;  // decided: final; else the provisional one
    bool construction = false;
  };
  TrainPhase effective_phase(const Alloc& a) const;
  void enter(TrainPhase p);
  void close_epoch(TrainPhase next);
  void retire_grads();
  void compact_epoch();
  void decide(std::uint64_t id, Live& l, Category c);
  Category provisional(const Live& l) const;

  std::unordered_map<std::uint64_t, Live> live_;
  std::vector<std::uint64_t> epoch_ids_;  // allocations of the current epoch (some freed since)
  std::vector<std::uint64_t> saved_ids_;  // forward allocations live when backward began
  std::vector<std::uint64_t> grad_ids_;   // backward allocations live when their backward ended
  std::uint32_t opt_steps_ = 0;           // optimizer phases begun
  std::uint32_t backwards_ = 0;           // backward phases begun
  TrainPhase phase_ = TrainPhase::none;
  std::uint64_t epoch_ = 0;
  std::uint32_t step_ = 0;
  bool saw_training_ = false, stepped_since_forward_ = true;
  std::string backward_caller_;
};

}  // namespace gpuheap
