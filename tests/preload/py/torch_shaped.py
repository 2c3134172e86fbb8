"""A training job shaped like a PyTorch one, for the category tests on the simulated runtime
(docs/categories.md): the frames the rules read -- Module._apply (construction),
Module._call_impl (forward), Tensor.backward (backward), an optimizer in a file under
torch/optim/ (step) and Optimizer.zero_grad -- allocating device memory through ctypes. No
torch is imported: the frames have PyTorch's names, the memory its shapes.

  torch_shaped.py oom             4 parameters of 1 MiB, gradients, AdamW-like state (2 per
                                  parameter); forward saves 4 activations of 2 MiB; step 4's
                                  batch is 4x larger: under GPUHEAP_POOL=0 GPUHEAP_LIMIT=40MiB
                                  its forward runs out of memory at the 4th activation (12 MiB
                                  of parameters and state + 3 x 8 MiB live). Prints "OOM step 4",
                                  frees what the forward held (as unwinding does), exits 0.
  torch_shaped.py train N DELAY [GO]
                                  N steps of the same shapes, "step K" printed as each one ends,
                                  DELAY seconds between steps; the parameters and optimizer state
                                  stay live at the end (as a job that exits without freeing).
                                  With GO: then prints "held" and waits until the file GO exists
                                  (at most 30 s; exit 11 if it never does).
"""
import ctypes
import os
import shutil
import sys
import tempfile
import time

rt = ctypes.CDLL("libcudart.so.13")
MiB = 1 << 20
PARAMS, PARAM_BYTES, LAYERS, ACT_BYTES = 4, 1 * MiB, 4, 2 * MiB


def cuda_alloc(n):
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n))
    if rc != 0:
        raise MemoryError(f"cudaMalloc({n}) failed: {rc}")
    return p


def cuda_free(p):
    rt.cudaFree(p)


class Tensor:
    def __init__(self, saved, model):
        self.saved, self.model = saved, model

    def backward(self):
        seed = cuda_alloc(4)  # autograd's seed gradient: a temporary
        for i in range(len(self.model.params)):
            if i not in self.model.grads:
                self.model.grads[i] = cuda_alloc(PARAM_BYTES)  # AccumulateGrad's gradient
        while self.saved:
            cuda_free(self.saved.pop())  # each node frees what it saved
        cuda_free(seed)


class Module:
    def __init__(self):
        self.params, self.grads, self.held = [], {}, []
        self._apply()

    def _apply(self):  # Module.to / .cuda(): the parameters (their own line: their own site)
        for _ in range(PARAMS):
            p = ctypes.c_void_p()
            if rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(PARAM_BYTES)) != 0:
                raise MemoryError("parameter")
            self.params.append(p)

    def __call__(self, scale):
        return self._call_impl(scale)

    def _call_impl(self, scale):
        return self.forward(scale)

    def forward(self, scale):
        for _ in range(LAYERS):
            self.held.append(cuda_alloc(ACT_BYTES * scale))  # saved for backward
            cuda_free(cuda_alloc(MiB // 2))  # an intermediate freed at once
        saved, self.held = self.held, []
        return Tensor(saved, self)


OPTIM = '''
import ctypes


class Optimizer:
    def __init__(self, model, rt, alloc, free, nbytes):
        self.model, self.rt, self.alloc, self.free, self.nbytes, self.state = model, rt, alloc, free, nbytes, []

    def step(self):
        if not self.state:  # AdamW's exp_avg and exp_avg_sq, made on the first step
            for _ in range(2 * len(self.model.params)):
                p = ctypes.c_void_p()
                if self.rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(self.nbytes)) != 0:
                    raise MemoryError("optimizer state")
                self.state.append(p)
        self.free(self.alloc(self.nbytes))  # a temporary of the update

    def zero_grad(self):  # set_to_none=True
        for g in self.model.grads.values():
            self.free(g)
        self.model.grads.clear()
'''


def load_optimizer(where):
    """The optimizer from a file under torch/optim/, where the rules look for it."""
    path = os.path.join(where, "torch", "optim", "adamw.py")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(OPTIM)
    ns = {}
    exec(compile(OPTIM, path, "exec"), ns)
    return ns["Optimizer"]


def train(steps, delay, big_step=0):
    where = tempfile.mkdtemp(prefix="torch-shaped-")
    try:
        model = Module()
        opt = load_optimizer(where)(model, rt, cuda_alloc, cuda_free, PARAM_BYTES)
        for step in range(1, steps + 1):
            try:
                loss = model(4 if step == big_step else 1)
            except MemoryError:
                print(f"OOM step {step}", flush=True)
                for p in model.held:  # the exception unwinds: the forward's tensors go
                    cuda_free(p)
                return
            loss.backward()
            opt.step()
            opt.zero_grad()
            print(f"step {step}", flush=True)
            time.sleep(delay)
    finally:
        shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["oom"]:
        train(6, 0, big_step=4)
    elif sys.argv[1:2] == ["train"]:
        train(int(sys.argv[2]), float(sys.argv[3]))
        if len(sys.argv) > 4:
            print("held", flush=True)
            for _ in range(30000):
                if os.path.exists(sys.argv[4]):
                    break
                time.sleep(0.001)
            else:
                sys.exit(11)
    else:
        sys.exit(__doc__)
