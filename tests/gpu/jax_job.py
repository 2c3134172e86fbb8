"""A small JAX training loop printing one JSON line (the allocator is chosen by
XLA_PYTHON_CLIENT_ALLOCATOR / XLA_PYTHON_CLIENT_PREALLOCATE in the environment).
XLA calls the CUDA driver API (cuMemAlloc_v2 found through cuGetProcAddress) itself."""
import json
import os

import jax
import jax.numpy as jnp

key = jax.random.PRNGKey(0)
k1, k2, k3 = jax.random.split(key, 3)
w1 = jax.random.normal(k1, (512, 512)) * 0.05
w2 = jax.random.normal(k2, (512, 10)) * 0.05
x = jax.random.normal(k3, (256, 512))
y = jnp.arange(256) % 10


def loss(params, x, y):
    w1, w2 = params
    logits = jnp.tanh(x @ w1) @ w2
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(y.shape[0]), y])


@jax.jit
def step(params, x, y):
    l, g = jax.value_and_grad(loss)(params, x, y)
    return [p - 0.1 * gp for p, gp in zip(params, g)], l


params = [w1, w2]
losses = []
for i in range(20):
    params, l = step(params, x, y)
    losses.append(float(l))
print(json.dumps({"allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"),
                  "losses": [float(v).hex() for v in losses], "jax": jax.__version__,
                  "devices": [str(d) for d in jax.devices()]}), flush=True)
