"""`matmul`: keras.ops.matmul, with the one backend detail that decides bfloat16 speed on JAX.

XLA:CPU multiplies bfloat16 matrices on the AMX / AVX512-BF16 units only when the dot is asked
for a float32 result (`preferred_element_type=float32`); a bfloat16 x bfloat16 -> bfloat16 dot,
which is what `keras.ops.matmul` asks for, runs about 5x slower (benchmarks/README.md: 200 vs
970 GFLOP/s on a (1576, 768) x (768, 3072) dot). So on JAX's CPU backend two bfloat16 operands
are multiplied into float32 and the product is rounded back to bfloat16 -- the same rounding a
bfloat16 dot ends with, after float32 accumulation. Every other case is `keras.ops.matmul`.

`matmul_add` is `matmul(x, kernel) + bias`. On PyTorch it is one `torch.addmm` (the bias added
in oneDNN's matmul epilogue, as torch's own Linear does) instead of a matmul and a separate
add over the whole output: the add was 9% of the op time of a bfloat16 ViT-B/16 on the PyTorch
backend (benchmarks/README.md). TensorFlow's graph optimizer and XLA fuse the add by themselves.

`gelu` is `keras.ops.gelu`, except for the tanh form being traced by torch.compile: there it is
written as x * sigmoid(2z), z = sqrt(2/pi) * (x + 0.044715 x^3) -- the same function, since
(1 + tanh(z)) / 2 = sigmoid(2z) -- in float32, which the compiler turns into one fused loop,
3x faster than torch's tanh-GELU kernel (1.9 vs 5.9 ms on a (1576, 3072) bfloat16 input,
benchmarks/README.md). Eager PyTorch keeps torch's kernel (the formula would be several passes
there), JAX and TensorFlow keep ops.gelu (XLA fuses it; TensorFlow's graph optimizer fuses the
tanh GELU into the preceding oneDNN matmul).

These are the layers' only backend-specific lines; they sit behind these three functions.
"""

import functools
import math

import keras
from keras import ops


@functools.cache
def _jax_on_cpu():
    import jax

    return jax.default_backend() == "cpu"


def matmul(x1, x2):
    """`keras.ops.matmul(x1, x2)`; bfloat16 x bfloat16 on JAX's CPU accumulates into float32
    explicitly (5x faster there) and returns bfloat16 like keras.ops.matmul.

    Example:
        >>> from keras import ops
        >>> matmul(ops.ones((2, 3)), ops.ones((3, 4))).shape
        (2, 4)
    """
    if keras.backend.backend() == "jax":
        x1, x2 = ops.convert_to_tensor(x1), ops.convert_to_tensor(x2)
        if x1.dtype == x2.dtype == "bfloat16" and _jax_on_cpu():
            import jax.numpy as jnp

            return jnp.matmul(x1, x2, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
    return ops.matmul(x1, x2)


def matmul_add(x, kernel, bias):
    """`matmul(x, kernel) + bias` for a 2-D `x`, a 2-D `kernel` and a 1-D `bias`; on PyTorch one
    fused `torch.addmm` when the three share a dtype.

    Example:
        >>> from keras import ops
        >>> matmul_add(ops.ones((2, 3)), ops.ones((3, 4)), ops.ones((4,))).shape
        (2, 4)
    """
    if keras.backend.backend() == "torch":
        x, kernel, bias = ops.convert_to_tensor(x), ops.convert_to_tensor(kernel), ops.convert_to_tensor(bias)
        if x.ndim == 2 and kernel.ndim == 2 and bias.ndim == 1 and x.dtype == kernel.dtype == bias.dtype:
            import torch

            return torch.addmm(bias, x, kernel)
    return ops.add(matmul(x, kernel), bias)


def _torch_compiling():
    import torch

    return torch.compiler.is_compiling()


def gelu(x, approximate=True):
    """`keras.ops.gelu(x, approximate)`; the tanh form is written as x * sigmoid(2z) in float32
    while torch.compile traces it (one fused loop, 3x faster there).

    Example:
        >>> from keras import ops
        >>> float(gelu(ops.ones(()), approximate=False))  # doctest: +ELLIPSIS
        0.841...
    """
    if approximate and keras.backend.backend() == "torch" and _torch_compiling():
        y = ops.cast(x, "float32")
        z = (2.0 * math.sqrt(2.0 / math.pi)) * (y + 0.044715 * y * y * y)
        return ops.cast(y * ops.sigmoid(z), x.dtype)
    return ops.gelu(x, approximate=approximate)
