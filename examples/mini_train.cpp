// A toy training loop's GPU-memory behaviour through the plain CUDA runtime API: weights and
// optimizer state that live for the whole run, activations kept from forward to backward,
// short-lived workspaces, a side stream, and a slow leak. It runs on a real GPU or on the
// simulated CUDA runtime (build/simcuda), and is what `scripts/demo.sh` profiles.
//   mini_train [steps] [layers] [width]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    std::fprintf(stderr, "mini_train: %s failed: %s\n", what, cudaGetErrorString(rc));
    std::exit(1);
  }
}

float* device_buffer(std::size_t floats, const char* what) {
  void* p = nullptr;
  check(cudaMalloc(&p, floats * sizeof(float)), what);
  return static_cast<float*>(p);
}

struct Layer {
  float* weight;
  float* grad;
  float* adam_m;
  float* adam_v;
};

__attribute__((noinline)) Layer make_layer(std::size_t width) {
  Layer l{};
  l.weight = device_buffer(width * width, "weight");
  l.grad = device_buffer(width * width, "grad");
  l.adam_m = device_buffer(width * width, "adam_m");
  l.adam_v = device_buffer(width * width, "adam_v");
  check(cudaMemset(l.weight, 0, width * width * sizeof(float)), "init");
  return l;
}

__attribute__((noinline)) float* forward_activation(std::size_t batch, std::size_t width) {
  return device_buffer(batch * width, "activation");
}

__attribute__((noinline)) void matmul_workspace(std::size_t bytes, cudaStream_t s) {
  void* ws = nullptr;
  check(cudaMalloc(&ws, bytes), "workspace");
  check(cudaMemsetAsync(ws, 0, bytes, s), "workspace use");
  check(cudaFree(ws), "workspace free");
}

__attribute__((noinline)) void remember_step_stats(std::vector<void*>& history) {
  // The bug this demo is about: per-step statistics kept on the GPU and never freed.
  void* p = nullptr;
  check(cudaMalloc(&p, 256 * 1024), "stats");
  history.push_back(p);
}

}  // namespace

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  int layers = argc > 2 ? std::atoi(argv[2]) : 8;
  std::size_t width = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 1024;
  const std::size_t batch = 64;

  cudaStream_t side;
  check(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "stream");
  std::vector<Layer> model;
  for (int i = 0; i < layers; ++i) model.push_back(make_layer(width));

  std::vector<void*> leaked;
  for (int step = 0; step < steps; ++step) {
    std::vector<float*> acts;
    for (int i = 0; i < layers; ++i) {
      acts.push_back(forward_activation(batch, width));
      matmul_workspace((1u << 20) + 512u * static_cast<unsigned>(i), side);
    }
    for (int i = layers - 1; i >= 0; --i) {  // backward frees activations in reverse
      matmul_workspace(2u << 20, nullptr);
      check(cudaFree(acts[static_cast<std::size_t>(i)]), "activation free");
    }
    if (step % 5 == 4) remember_step_stats(leaked);
  }
  check(cudaStreamSynchronize(side), "sync");
  std::size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "meminfo");
  std::printf("mini_train: %d steps, %d layers of %zux%zu; device free %.1f MiB of %.1f MiB; %zu leaked buffers\n",
              steps, layers, width, width, free_b / 1048576.0, total_b / 1048576.0, leaked.size());
  for (auto& l : model) {
    for (float* p : {l.weight, l.grad, l.adam_m, l.adam_v}) check(cudaFree(p), "free");
  }
  check(cudaStreamDestroy(side), "stream destroy");
  return 0;
}
