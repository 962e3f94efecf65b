"""`matmul`: keras.ops.matmul, with the one backend detail that decides bfloat16 speed on JAX.

XLA:CPU multiplies bfloat16 matrices on the AMX / AVX512-BF16 units only when the dot is asked
for a float32 result (`preferred_element_type=float32`); a bfloat16 x bfloat16 -> bfloat16 dot,
which is what `keras.ops.matmul` asks for, runs about 5x slower (benchmarks/README.md: 200 vs
970 GFLOP/s on a (1576, 768) x (768, 3072) dot). So on JAX's CPU backend two bfloat16 operands
are multiplied into float32 and the product is rounded back to bfloat16 -- the same rounding a
bfloat16 dot ends with, after float32 accumulation. Every other case is `keras.ops.matmul`.

Their gradients on JAX's CPU backend: XLA:CPU's bfloat16 dot kernel (YNNPACK) takes a left
operand contracted on its last axis and a right one contracted on its first, and nothing else; a
dot that differs -- every gradient of a matmul is one, `upstream @ kernel^T` and `input^T @
upstream` -- is upcast to float32 with both operands converted, and ran at 150 GFLOP/s against
390 for the bfloat16 dot (a (1576, 3072) x (3072, 768) dot on a 2-core AMD EPYC with
AVX512-BF16). So a bfloat16 `matmul` of a 2-D kernel and a bfloat16 attention have their own
gradients there (`jax.custom_vjp`) whose products are bfloat16 dots against transposed copies of
the other operand, written out by XLA rather than folded into the dot. The matmul's gradients are
the same products JAX computes, each rounded once from a float32 sum; `matmul_add`'s bias
gradient is the column sums in float32 (JAX's ran as a padded XLA reduce-window tree, and at
bfloat16 precision); the attention's softmax gradient, float32, is rounded to bfloat16 for the two
products that take it, as a bfloat16 product's gradient is. The mixed_bfloat16 ViT-B/16 train
step at batch 8 ran 1.50x faster (best; 1.45x median) with the dots and 1.06x more with the bias
sums, one process, steps interleaved (benchmarks/README.md); inference is unchanged, bit for
bit. float32 keeps JAX's own gradients: the same form made the float32 attention gradient slower
(0.78x). `BFLOAT16_GRADIENT_DOTS = False` gives JAX's own gradients everywhere; it is
also what forward-mode differentiation (`jax.jvp`, `jax.jacfwd`) of a bfloat16 model on JAX's CPU
needs, since a `jax.custom_vjp` function has no forward-mode rule. It is read when a function is
traced.

The bfloat16 attention's gradient there keeps only the queries, keys and values of the forward
pass and recomputes the float32 softmax weights from them (the same ops, so the same numbers), as
flash attention does, instead of keeping a (batch * heads, tokens, tokens) float32 block per
layer: DINOv2-S/14 at 518 px, whose 1370-token attentions go through in query chunks, trained
1.07x (best) / 1.04x (median) faster in mixed_bfloat16, and ViT-B/16's step was unchanged
(1.00-1.01x), one process, steps interleaved (benchmarks/README.md). float32 keeps JAX's own
gradient, so that forward-mode differentiation works there (the same recomputing gradient in
float32 trained DINOv2 1.07x faster and ViT-B/16 1.00-1.02x). XLA:CPU runs one small batched dot
on one thread, so the gradient can also go through the (batch * heads) axis in
`ATTENTION_GRADIENT_GROUPS` independent slices, which its executor runs side by side: 8 groups
made ViT-B/16's bfloat16 attention gradient alone 2x faster on two cores (41 -> 20 ms) but not
the train step, whose other work already fills the second core (0.98-1.04x), and DINOv2's 0.90x;
the default is one group. 0 gives JAX's own gradient.

The same executor runs a batched dot that is alone in its fusion (YNNPACK's) on one thread --
(96, 197, 197) x (96, 197, 64) in bfloat16 at 87-128 GFLOP/s, cpu time / wall time 1.01, where a
(1576, 768) x (768, 768) dot reaches 358 on both cores -- and one whose result goes on to a
reduction over its rows on all threads (268 GFLOP/s, cpu/wall 1.94). So with SPLIT_BATCHED_DOTS
the attention's products that end in a head dimension (weights x values forward; the bfloat16
value, query and key gradients) come out as `y + 0 * max(row of y)` (no gradient through the
max), which is `y` for finite values: ViT-B/16's mixed_bfloat16 train step ran 1.01-1.04x faster
(best; 1.03-1.06x median) and its float32 inference 1.04-1.05x at batch 8, the rest within 1-2%,
one process, calls interleaved.
Attention in query chunks leaves it out: there the small products ran faster on one thread
(DINOv2-S/14 at 518 px, mixed_bfloat16 train step 0.94x with it).

`matmul_add` is `matmul(x, kernel) + bias`. On PyTorch it is one `torch.addmm` (the bias added
in oneDNN's matmul epilogue, as torch's own Linear does) instead of a matmul and a separate
add over the whole output: the add was 9% of the op time of a bfloat16 ViT-B/16 on the PyTorch
backend (benchmarks/README.md). TensorFlow's graph optimizer and XLA fuse the add by themselves.

On PyTorch's CPU backend a float32 `matmul` of a 2-D `x` and a 2-D kernel, and `matmul_add`, run
through oneDNN's float32 matmul (`torch.ops.mkldnn._linear_pointwise`) on AMD CPUs instead of MKL's
`addmm`: MKL runs its AVX2 code on CPUs not made by Intel, at half of what the CPU reaches. On a
2-core AMD EPYC (family 26) with AVX-512 MKL took ViT-B/16's (1576, 768) x (768, 3072) product at
213 GFLOP/s and oneDNN at 441, and the input and kernel gradients at 212-221 against 373-469; a
float32 ViT-B/16 under torch.compile ran 1.82x faster at batch 8 and its train step 1.74x, one
process, calls interleaved (benchmarks/README.md). The product is a `torch.library` custom op,
`keras_vit::onednn_matmul`, which torch.compile calls as it is (Inductor's own oneDNN lowering
takes only constant weights), inside an autograd.Function whose gradient products go through the op
too (differentiable again, for `torch.func.grad`), with a forward-mode derivative outside
torch.compile (`torch.func.jvp`) and a vmap rule. The products are the same sums in float32, added
in another order: within float32 rounding of MKL's. ONEDNN_FLOAT32_MATMUL chooses: "auto" (AMD
CPUs, where torch has oneDNN), True (every CPU) or False (MKL). A bfloat16 `matmul_add` (and 2-D
`matmul`) with no gradient to record goes through the same op where PyTorch's oneDNN has a
bfloat16 matmul for the CPU (ONEDNN_BFLOAT16_MATMUL): `torch.addmm` copies the bias into the whole
output first and accumulates the product onto it (73 such copies, 22 ms of a 500 ms
mixed_bfloat16 ViT-B/16 call at batch 8), where oneDNN adds it in the product's epilogue. The
(1576, 768) x (768, 3072) product with its bias took 8.9 against 9.9 ms, and mixed_bfloat16
inference ran 1.04x (best; 1.06x median) and 1.01x (1.03x) faster at batch 8 in two runs and
1.01-1.03x at batch 1, one process, calls interleaved, on a 2-core AMD EPYC (family 26). With a
gradient to record the products stay torch's: through the op and its oneDNN gradient products the
mixed_bfloat16 train step ran 0.98x.

`gelu` is `keras.ops.gelu` but for three cases. The tanh form being traced by torch.compile is
written as x * sigmoid(2z), z = sqrt(2/pi) * (x + 0.044715 x^3) -- the same function, since
(1 + tanh(z)) / 2 = sigmoid(2z) -- in float32, which the compiler turns into one fused loop,
3x faster than torch's tanh-GELU kernel (1.9 vs 5.9 ms on a (1576, 3072) bfloat16 input,
benchmarks/README.md). On JAX's CPU backend a bfloat16 GELU (either form) is computed in float32
and rounded once, as PyTorch's bfloat16 kernel does: XLA computes a bfloat16 GELU one rounded
bfloat16 op at a time, 2.6x slower than the float32 loop on a (1576, 3072) input (5.7 against
2.2 ms), and further from the exact values; the mixed_bfloat16 ViT-B/16 ran 1.05x faster at batch
8 (1.05x at batch 1) and its train step 1.04x, one process, calls interleaved. Eager PyTorch keeps
torch's kernel (the formula would be several passes there), JAX in float32 keeps ops.gelu (XLA
fuses it). TensorFlow without a gradient tape keeps ops.gelu too: its graph optimizer fuses the
tanh GELU into the preceding oneDNN matmul's epilogue. Under a recording tape that fusion cannot
happen (the gradient reads the GELU's intermediates) and TensorFlow runs GELU and its gradient as
some 18 separate element-wise ops over the (tokens, mlp_dim) block, each rounding to the compute
dtype. On TensorFlow's CPU (TENSORFLOW_GELU_BY_XLA) the GELU under a tape is therefore an
XLA-compiled function (`tf.function(jit_compile=True)`, inside the graph Keras runs without XLA):
one float32 loop rounded once, whose gradient, upstream x GELU'(x) computed from the input alone,
is a second one: 4.6 against 13.3 ms forward and backward on a (1576, 3072) bfloat16 input (2.7
against 13.2 in float32), closer to the exact values (the erf form written with erfc, without
1 + erf's cancellation). ViT-B/16's train step at batch 8 ran 1.10x faster (best; 1.11x median)
in mixed_bfloat16 and 1.06x (1.05x) in float32, one process, steps interleaved, on a 2-core AMD
EPYC (family 26). XLA compiles it once per input shape.

`dot_product_attention` is `keras.ops.dot_product_attention`, except on the CPU backends of JAX,
TensorFlow and (in half precision) PyTorch. On JAX it is the original ViT's attention: the queries
scaled before the logits, two products that accumulate in float32, a float32 softmax. The heads are
moved into the batch first, (batch * heads, tokens, head_dim), so that both products are 3-D dots with one leading batch dimension:
XLA:CPU ran the same products written as `bqhd,bkhd->bhqk` einsums (two batch dimensions, one of
them inside the operands) 2-4x slower, 18-24% of a float32 ViT-B/16's time at batch 8 for 3% of
its FLOPs; the head-major form made float32 inference 1.25x faster and left mixed_bfloat16
inference (1.11-1.36x best, 0.97-1.13x median) and the float32 train step (1.00x) where they
were, one process, calls interleaved (benchmarks/roofline.py, benchmarks/README.md).
`jax.nn.dot_product_attention`'s XLA path scales the (batch, heads, tokens, tokens) logits
instead, one more pass over the largest tensor of the block forward and backward: the gradient
program of a ViT-Ti/16 (batch 8, float32) ran at 0.88x the Flax original's with it and 0.96x
with the queries scaled (one process, interleaved, 16 calls each; scaling the logits by hand
gave 0.88x again). Past CHUNK_QUERIES_ABOVE (1024) query tokens the queries go through in
chunks of QUERY_CHUNK (128), one `lax.map` step each, the last partial chunk after, so that a
chunk's logits and weights (4.2 MB in float32 for DINOv2-S at 518 px) can stay in the CPU's caches
between the products and the softmax, where the whole (batch * heads, tokens, tokens) block (45 MB
there, 1370 tokens) cannot. Each query row sees the same keys and the same float32 softmax, so the numbers are
unchanged. At (1, 1370, 6, 64) the attention ran 1.5-1.8x faster in float32 and 1.85x in
bfloat16; DINOv2-S/14 at 518 px at batch 1 1.11-1.27x (best) / 1.15-1.20x (median) in float32 and
1.75x / 1.52x in mixed_bfloat16, one process, calls interleaved. At 197-785
tokens the chunks were 0.7-0.93x of the whole form and at 1025 even, hence the threshold
(benchmarks/README.md, "timm's zoo"). On TensorFlow's CPU (TENSORFLOW_HEAD_MAJOR_ATTENTION) it is
Keras' own ops -- logits in the inputs' dtype, scaled and softmaxed in float32 -- with the heads
moved before the tokens first, so that the two products are batched matmuls of (batch, heads)
stacks: Keras writes them as `BTNH,BSNH->BNTS` einsums, whose gradients TensorFlow forms as
einsums again, with transposes of the operands around each product. The numbers are the same,
bit for bit; forward and backward of ViT-B/16's attention at batch 8 took 11.4 against 15.2 ms in
bfloat16 and 14.3 against 21.7 in float32, and the train step ran 1.06x faster (best; 1.02x
median) in mixed_bfloat16 and 1.05x (1.04x) in float32, inference 1.01-1.05x, one process, calls
interleaved, on a 2-core AMD EPYC (family 26). On PyTorch's CPU (TORCH_HALF_ATTENTION_IN_FLOAT32)
a bfloat16 or float16 attention is Keras' attention of float32 copies of its inputs -- PyTorch's
float32 flash kernel -- with the output rounded once to the inputs' dtype: PyTorch's bfloat16 flash
kernel took 28.6 against 24.7 ms for forward and backward of ViT-B/16's attention at batch 8
under torch.compile (the forward alone 6.9 against 6.7), and its gradients were twice as far
from float64 (0.0038-0.0064 of the largest value against 0.0024-0.0027); the mixed_bfloat16 train
step ran 1.03x faster (best and median, two runs), inference 0.99-1.01x, one process, calls
interleaved, on a 2-core AMD EPYC (family 26). Elsewhere Keras' call picks the backend's fused or
flash kernels.

`seeded_dropout` is dropout whose mask is drawn from a given seed (a SeedGenerator's draw), so
that a block recomputed under remat draws the masks of its first forward pass: on JAX
`keras.random.dropout` takes the seed array as it is; on TensorFlow Keras' dropout takes only a
generator or an int, so the stateless TensorFlow op is called with the seed.

These are the layers' only backend-specific lines; they sit behind these five functions.
"""

import functools
import math

import keras
from keras import ops

from keras_vit.performance import _on_cpu


#: JAX's CPU attention over more than CHUNK_QUERIES_ABOVE query tokens runs QUERY_CHUNK queries
#: at a time (see the module docstring).
CHUNK_QUERIES_ABOVE = 1024
QUERY_CHUNK = 128

#: On JAX's CPU backend the gradients of bfloat16 `matmul`s and attentions are bfloat16 dots
#: against transposed copies (see the module docstring); False gives JAX's own gradients.
BFLOAT16_GRADIENT_DOTS = True

#: On JAX's CPU backend a bfloat16 `gelu` is computed in float32 and rounded once (see the module
#: docstring); False gives XLA's bfloat16 GELU.
BFLOAT16_GELU_IN_FLOAT32 = True

#: JAX's CPU bfloat16 attention gradient (with BFLOAT16_GRADIENT_DOTS) recomputes the softmax
#: weights instead of keeping them, going through (batch * heads) in this many independent groups
#: (see the module docstring); 0 gives JAX's own gradient of the attention.
ATTENTION_GRADIENT_GROUPS = 1

#: JAX's CPU attention over all queries at once puts a row reduction beside its batched products
#: that end in a head dimension, so that XLA:CPU runs them on all its threads (see the module
#: docstring).
SPLIT_BATCHED_DOTS = True

#: TensorFlow's CPU `gelu` under a recording gradient tape as an XLA-compiled loop with an
#: XLA-compiled gradient (see the module docstring); False gives ops.gelu's ops. Read when a
#: function is traced.
TENSORFLOW_GELU_BY_XLA = True

#: TensorFlow's CPU `dot_product_attention` with the heads moved before the tokens, its products
#: batched matmuls (see the module docstring); False gives keras.ops.dot_product_attention.
TENSORFLOW_HEAD_MAJOR_ATTENTION = True

#: PyTorch's CPU attention of bfloat16 or float16 queries, keys and values computed by the float32
#: flash kernel from upcast copies, its output cast back (see the module docstring); False gives
#: keras.ops.dot_product_attention in the inputs' dtype.
TORCH_HALF_ATTENTION_IN_FLOAT32 = True

#: PyTorch's CPU float32 `matmul` and `matmul_add` through oneDNN instead of MKL: "auto" on AMD
#: CPUs, True everywhere, False never (see the module docstring). Read when a function is traced.
ONEDNN_FLOAT32_MATMUL = "auto"

#: PyTorch's CPU bfloat16 `matmul_add` (and 2-D `matmul`) through the same oneDNN op, the bias
#: added in its epilogue, instead of `torch.addmm`: "auto" where PyTorch's oneDNN has a bfloat16
#: matmul for this CPU, True, False (see the module docstring). Read when a function is traced.
ONEDNN_BFLOAT16_MATMUL = "auto"


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

            if x1.ndim >= 2 and x2.ndim == 2 and BFLOAT16_GRADIENT_DOTS:
                y = _jax_bf16_matmul()(jnp.reshape(x1, (-1, x1.shape[-1])), x2)
                return jnp.reshape(y, (*x1.shape[:-1], x2.shape[-1]))
            return _bf16_product(x1, x2)
    if keras.backend.backend() == "torch":
        x1, x2 = ops.convert_to_tensor(x1), ops.convert_to_tensor(x2)
        if x1.ndim == x2.ndim == 2 and _torch_onednn(x1, x2):
            return _TORCH_ONEDNN_MATMUL(x1, x2, None)
    return ops.matmul(x1, x2)


def _written_transpose(t):
    """`t` with its last two axes swapped, written out row-major by XLA. A plain transpose is
    folded into the consuming dot's dimension numbers instead, and XLA:CPU's bfloat16 dot kernel
    (YNNPACK) takes neither a left operand contracted on its first axis nor a right one contracted
    on its last: the dot is then upcast to float32, operands converted, at 0.4x the bfloat16 rate."""
    import jax.numpy as jnp

    *lead, rows, cols = t.shape
    return jnp.swapaxes(jnp.reshape(t, (*lead, rows, cols, 1)), -3, -2).reshape(*lead, cols, rows)


def _bf16_product(a, b):
    import jax.numpy as jnp

    return jnp.matmul(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)


def _bf16_product_gradients(a, b, upstream):
    """The gradients of `_bf16_product(a, b)` for 2-D `a`, `b`: bfloat16 dots against written-out
    transposes (`_written_transpose`)."""
    import jax.numpy as jnp

    upstream = upstream.astype(jnp.bfloat16)  # the product's cotangent: bfloat16 already
    return _bf16_product(upstream, _written_transpose(b)), _bf16_product(_written_transpose(a), upstream)


@functools.cache
def _jax_bf16_matmul():
    """A 2-D bfloat16 `a @ b` (float32 accumulation, rounded to bfloat16) whose gradient dots
    are bfloat16 dots too, each against a transposed copy of the other operand."""
    import jax

    @jax.custom_vjp
    def bf16_matmul(a, b):
        return _bf16_product(a, b)

    def forward(a, b):
        return _bf16_product(a, b), (a, b)

    def backward(residuals, upstream):
        return _bf16_product_gradients(*residuals, upstream)

    bf16_matmul.defvjp(forward, backward)
    return bf16_matmul


def _cpu_vendor():
    """/proc/cpuinfo's vendor_id of the first CPU ("AuthenticAMD", "GenuineIntel"), or ""."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _register_torch_onednn_matmul():
    """`x @ kernel (+ bias)` of 2-D float32 tensors by the custom op `keras_vit::onednn_matmul`
    (oneDNN's matmul, which torch.compile calls as it is), through an autograd.Function whose
    gradient products are the op too; None where PyTorch has no oneDNN."""
    from typing import Optional

    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    linear = torch.ops.mkldnn._linear_pointwise

    def plain(t):  # row- or column-major as it is; anything else (a broadcast gradient) copied
        rows, cols = t.shape
        if t.stride() in ((cols, 1), (1, rows)):
            return t
        return t.contiguous()

    @torch.library.custom_op("keras_vit::onednn_matmul", mutates_args=())
    def onednn_matmul(x: torch.Tensor, kernel: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        return linear(plain(x), plain(kernel).t(), bias, "none", [], "")

    @onednn_matmul.register_fake
    def _(x, kernel, bias):
        return x.new_empty((x.shape[0], kernel.shape[1]))

    def batched(info, in_dims, x, kernel, bias):  # vmap: one product of the stacked rows if only x is batched
        x_dim, kernel_dim, bias_dim = in_dims
        if x_dim is not None and kernel_dim is None and bias_dim is None:
            x = x.movedim(x_dim, 0)
            y = onednn_matmul(x.reshape(-1, x.shape[-1]), kernel, bias)
            return y.reshape(*x.shape[:2], -1), 0

        def entry(t, dim, i):
            return t if dim is None else t.select(dim, i)

        return torch.stack([onednn_matmul(*(entry(t, d, i) for t, d in zip((x, kernel, bias), in_dims)))
                            for i in range(info.batch_size)]), 0

    onednn_matmul.register_vmap(batched)

    op = torch.ops.keras_vit.onednn_matmul.default  # what torch.compile's tracer takes inside a Function

    class WithGradient(torch.autograd.Function):
        """The op with its gradient, three oneDNN products: what torch.compile traces."""

        generate_vmap_rule = True

        @staticmethod
        def forward(x, kernel, bias):
            return op(x, kernel, bias)

        @staticmethod
        def setup_context(ctx, inputs, output):
            x, kernel, bias = inputs
            ctx.save_for_backward(x, kernel)
            ctx.with_bias = bias is not None

        @staticmethod
        def backward(ctx, upstream):
            x, kernel = ctx.saved_tensors
            # through the Function again, so that the gradient is differentiable (torch.func.grad)
            d_x = WithGradient.apply(upstream, kernel.t(), None) if ctx.needs_input_grad[0] else None
            d_kernel = WithGradient.apply(x.t(), upstream, None) if ctx.needs_input_grad[1] else None
            d_bias = upstream.sum(0) if ctx.with_bias and ctx.needs_input_grad[2] else None
            return d_x, d_kernel, d_bias

    class WithDerivatives(WithGradient):
        """The same with its forward-mode derivative too (torch.func.jvp, forward AD), outside
        torch.compile, whose tracer takes no autograd.Function that defines one."""

        @staticmethod
        def setup_context(ctx, inputs, output):
            WithGradient.setup_context(ctx, inputs, output)
            ctx.save_for_forward(*inputs[:2])

        @staticmethod
        def jvp(ctx, t_x, t_kernel, t_bias):
            x, kernel = ctx.saved_tensors
            terms = [op(t_x, kernel, None) if t_x is not None else None,
                     op(x, t_kernel, None) if t_kernel is not None else None,
                     t_bias.expand(x.shape[0], -1) if t_bias is not None else None]
            terms = [t for t in terms if t is not None]
            return functools.reduce(torch.add, terms) if terms else None

    def apply(x, kernel, bias):
        return (WithGradient if _torch_compiling() else WithDerivatives).apply(x, kernel, bias)

    return apply


# Registered when the module is imported (under 1 ms), not when a function is first traced:
# torch.compile's tracer cannot run the registration or read /proc/cpuinfo without breaking its graph.
_TORCH_ONEDNN_MATMUL, _AMD_CPU, _TORCH_FLOAT32, _TORCH_BFLOAT16, _ONEDNN_BF16 = None, False, None, None, False
if keras.backend.backend() == "torch":
    import torch as _torch_module

    _TORCH_ONEDNN_MATMUL = _register_torch_onednn_matmul()
    _AMD_CPU = _cpu_vendor() == "AuthenticAMD"
    _TORCH_FLOAT32, _TORCH_BFLOAT16 = _torch_module.float32, _torch_module.bfloat16
    try:
        _ONEDNN_BF16 = bool(_torch_module.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a PyTorch without the check
        _ONEDNN_BF16 = False


def _torch_onednn(*tensors):
    """Whether these torch tensors' product goes through `keras_vit::onednn_matmul`: float32 as
    ONEDNN_FLOAT32_MATMUL says, bfloat16 as ONEDNN_BFLOAT16_MATMUL says where no gradient is
    recorded, on the CPU."""
    if _TORCH_ONEDNN_MATMUL is None or not all(t.device.type == "cpu" for t in tensors):
        return False
    if all(t.dtype == _TORCH_FLOAT32 for t in tensors):
        choice, auto = ONEDNN_FLOAT32_MATMUL, _AMD_CPU
    elif all(t.dtype == _TORCH_BFLOAT16 for t in tensors):
        if _torch_module.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return False  # a bfloat16 product with a gradient: torch's `addmm` and `mm` (the step ran faster)
        choice, auto = ONEDNN_BFLOAT16_MATMUL, _ONEDNN_BF16
    else:
        return False
    return choice is True or (choice == "auto" and auto)


def matmul_add(x, kernel, bias):
    """`matmul(x, kernel) + bias` for a 2-D `x`, a 2-D `kernel` and a 1-D `bias`; on PyTorch one
    fused `torch.addmm` when the three share a dtype (oneDNN's `keras_vit::onednn_matmul` in
    float32 on an AMD CPU, and in bfloat16 with no gradient to record); on JAX's CPU in bfloat16
    with the matmul's bfloat16 gradient dots and the bias gradient summed in float32.

    Example:
        >>> from keras import ops
        >>> matmul_add(ops.ones((2, 3)), ops.ones((3, 4)), ops.ones((4,))).shape
        (2, 4)
    """
    if keras.backend.backend() == "torch":
        x, kernel, bias = ops.convert_to_tensor(x), ops.convert_to_tensor(kernel), ops.convert_to_tensor(bias)
        if x.ndim == 2 and kernel.ndim == 2 and bias.ndim == 1 and x.dtype == kernel.dtype == bias.dtype:
            if _torch_onednn(x, kernel, bias):
                return _TORCH_ONEDNN_MATMUL(x, kernel, bias)
            import torch

            return torch.addmm(bias, x, kernel)
    if keras.backend.backend() == "jax" and BFLOAT16_GRADIENT_DOTS:
        x, kernel, bias = ops.convert_to_tensor(x), ops.convert_to_tensor(kernel), ops.convert_to_tensor(bias)
        bf16 = x.dtype == kernel.dtype == bias.dtype == "bfloat16"
        if bf16 and x.ndim >= 2 and kernel.ndim == 2 and bias.ndim == 1 and _jax_on_cpu():
            import jax.numpy as jnp

            y = _jax_bf16_matmul_add()(jnp.reshape(x, (-1, x.shape[-1])), kernel, bias)
            return jnp.reshape(y, (*x.shape[:-1], kernel.shape[-1]))
    return ops.add(matmul(x, kernel), bias)


@functools.cache
def _jax_bf16_matmul_add():
    """`_bf16_product(a, b) + c` with `_bf16_product_gradients` and the bias gradient the
    upstream gradient's column sums in float32, rounded once (JAX's own gradient ran as a slower
    XLA reduction in the train step)."""
    import jax
    import jax.numpy as jnp

    @jax.custom_vjp
    def bf16_matmul_add(a, b, c):
        return _bf16_product(a, b) + c

    def forward(a, b, c):
        return _bf16_product(a, b) + c, (a, b)

    def backward(residuals, upstream):
        d_a, d_b = _bf16_product_gradients(*residuals, upstream)
        return d_a, d_b, jnp.sum(upstream, axis=0, dtype=jnp.float32).astype(jnp.bfloat16)

    bf16_matmul_add.defvjp(forward, backward)
    return bf16_matmul_add


def _torch_compiling():
    import torch

    return torch.compiler.is_compiling()


def gelu(x, approximate=True):
    """`keras.ops.gelu(x, approximate)`; the tanh form is written as x * sigmoid(2z) in float32
    while torch.compile traces it (one fused loop, 3x faster there), bfloat16 on JAX's CPU is
    computed in float32 and rounded once, and on TensorFlow's CPU under a recording gradient tape
    it is an XLA-compiled float32 loop with an XLA-compiled gradient.

    Example:
        >>> from keras import ops
        >>> float(gelu(ops.ones(()), approximate=False))  # doctest: +ELLIPSIS
        0.841...
    """
    if approximate and keras.backend.backend() == "torch" and _torch_compiling():
        y = ops.cast(x, "float32")
        z = (2.0 * math.sqrt(2.0 / math.pi)) * (y + 0.044715 * y * y * y)
        return ops.cast(y * ops.sigmoid(z), x.dtype)
    if keras.backend.backend() == "jax" and BFLOAT16_GELU_IN_FLOAT32:
        x = ops.convert_to_tensor(x)
        if x.dtype == "bfloat16" and _jax_on_cpu():
            return ops.cast(ops.gelu(ops.cast(x, "float32"), approximate=approximate), "bfloat16")
    if keras.backend.backend() == "tensorflow" and TENSORFLOW_GELU_BY_XLA:
        x = ops.convert_to_tensor(x)
        if x.dtype in ("float32", "bfloat16", "float16") and _tensorflow_cpu_tape_records():
            return _tensorflow_xla_gelu(bool(approximate))(x)
    return ops.gelu(x, approximate=approximate)


def _tensorflow_cpu_tape_records():
    """Whether a TensorFlow gradient tape may record the op about to be made, on a CPU-only setup
    (False where TensorFlow no longer has the module that says so: Keras' ops then)."""
    try:
        from tensorflow.python.eager import record
    except ImportError:
        return False
    return record.could_possibly_record() and _on_cpu("tensorflow")


@functools.cache
def _tensorflow_xla_gelu(approximate):
    """GELU (the tanh form if `approximate`, else the erf form) of a TensorFlow tensor as one
    XLA-compiled float32 loop, rounded once to the input's dtype, with a gradient that is one such
    loop too: upstream x GELU'(x), from the input alone."""
    import tensorflow as tf

    f32 = tf.float32
    c = math.sqrt(2.0 / math.pi)

    def value(x):
        if approximate:
            return 0.5 * x * (1.0 + tf.tanh(c * (x + 0.044715 * x * x * x)))
        return 0.5 * x * tf.math.erfc(x * -math.sqrt(0.5))  # 1 + erf(x / sqrt 2), without its cancellation

    def slope(x):
        if approximate:
            t = tf.tanh(c * (x + 0.044715 * x * x * x))
            return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * (c * (1.0 + 3 * 0.044715 * x * x))
        return 0.5 * tf.math.erfc(x * -math.sqrt(0.5)) + x * tf.exp(-0.5 * x * x) * (1.0 / math.sqrt(2 * math.pi))

    @tf.function(jit_compile=True, autograph=False)
    def forward(x):
        return tf.cast(value(tf.cast(x, f32)), x.dtype)

    @tf.function(jit_compile=True, autograph=False)
    def backward(x, upstream):
        return tf.cast(tf.cast(upstream, f32) * slope(tf.cast(x, f32)), x.dtype)

    @tf.custom_gradient
    def apply(x):
        return forward(x), lambda upstream: backward(x, upstream)

    return apply


def dot_product_attention(query, key, value, scale):
    """Softmax attention of (batch, tokens, heads, head_dim) `query`, `key`, `value`, scaled by
    `scale`; (batch, query tokens, heads, head_dim) out, `value`'s dtype. On JAX's CPU backend the
    queries are scaled (in float32) and both products accumulate in float32; on TensorFlow's CPU
    it is Keras' attention with its products as batched matmuls of head-major stacks; on PyTorch's
    CPU a bfloat16 or float16 attention is computed in float32 and rounded once.

    Example:
        >>> from keras import ops
        >>> dot_product_attention(ops.ones((1, 3, 2, 4)), ops.ones((1, 5, 2, 4)), ops.ones((1, 5, 2, 4)), 0.5).shape
        (1, 3, 2, 4)
    """
    if keras.backend.backend() == "jax" and _jax_on_cpu():
        import jax
        import jax.numpy as jnp

        query, key, value = (ops.convert_to_tensor(t) for t in (query, key, value))
        f32 = jnp.float32
        _, tokens, heads, head_dim = query.shape
        query = (query.astype(f32) * scale).astype(query.dtype)

        def by_head(t):  # (batch, tokens, heads, head_dim) -> (batch * heads, tokens, head_dim)
            return jnp.transpose(t, (0, 2, 1, 3)).reshape(-1, t.shape[1], head_dim)

        query, key, value = by_head(query), by_head(key), by_head(value)

        chunk = QUERY_CHUNK
        whole_queries = tokens <= CHUNK_QUERIES_ABOVE or tokens < 2 * chunk
        split = SPLIT_BATCHED_DOTS and whole_queries  # a chunk's small products: faster on one thread
        bf16 = query.dtype == key.dtype == value.dtype == jnp.bfloat16
        if bf16 and BFLOAT16_GRADIENT_DOTS and ATTENTION_GRADIENT_GROUPS:
            core = _jax_attention_core(ATTENTION_GRADIENT_GROUPS, split)
        else:
            core = functools.partial(_attention_forward, split=split)

        def attend(q):  # (batch * heads, some query tokens, head_dim) -> the same shape
            return core(q, key, value)

        if whole_queries:
            y = attend(query)
        else:  # one loop step per QUERY_CHUNK queries (their logits stay in cache), then the rest
            whole = tokens // chunk * chunk
            chunks = jnp.transpose(query[:, :whole].reshape(query.shape[0], -1, chunk, head_dim), (1, 0, 2, 3))
            y = jnp.transpose(jax.lax.map(attend, chunks), (1, 0, 2, 3)).reshape(query.shape[0], whole, head_dim)
            if whole < tokens:
                y = jnp.concatenate([y, attend(query[:, whole:])], axis=1)
        return jnp.transpose(y.reshape(-1, heads, tokens, head_dim), (0, 2, 1, 3))
    if keras.backend.backend() == "tensorflow" and TENSORFLOW_HEAD_MAJOR_ATTENTION and _on_cpu("tensorflow"):
        return _tensorflow_attention(query, key, value, scale)
    if keras.backend.backend() == "torch" and TORCH_HALF_ATTENTION_IN_FLOAT32:
        query, key, value = (ops.convert_to_tensor(t) for t in (query, key, value))
        half = query.dtype == key.dtype == value.dtype and keras.backend.standardize_dtype(query.dtype) in (
            "bfloat16", "float16")
        if half and query.device.type == "cpu":
            f32 = [ops.cast(t, "float32") for t in (query, key, value)]
            return ops.cast(ops.dot_product_attention(*f32, scale=scale), value.dtype)
    return ops.dot_product_attention(query, key, value, scale=scale)


def _tensorflow_attention(query, key, value, scale):
    """keras.ops.dot_product_attention's TensorFlow ops (logits in the inputs' dtype, scaled and
    softmaxed in float32, the weights cast back) with the heads moved in front of the tokens first,
    so that both products, and the four products of their gradient, are batched matmuls of
    (batch, heads) stacks with transposes as flags instead of einsums."""
    import tensorflow as tf

    query, key, value = (ops.convert_to_tensor(t) for t in (query, key, value))
    dtype = keras.backend.result_type(query.dtype, key.dtype, value.dtype)
    query, key, value = (tf.transpose(tf.cast(t, dtype), (0, 2, 1, 3)) for t in (query, key, value))
    logits = tf.cast(tf.matmul(query, key, transpose_b=True), keras.backend.result_type(dtype, "float32"))
    logits = tf.multiply(logits, tf.cast(scale, logits.dtype))
    weights = tf.cast(tf.nn.softmax(logits, -1), dtype)
    return tf.transpose(tf.matmul(weights, value), (0, 2, 1, 3))


def _attention_forward(q, k, v, with_weights=False, split=False):
    """Softmax attention of head-major (n, queries, d) `q` (scaled) over (n, keys, d) `k`, `v` on
    JAX: both products accumulate in float32, the softmax is float32, the output `v`'s dtype."""
    import jax
    import jax.numpy as jnp

    logits = jnp.einsum("nqd,nkd->nqk", q, k, preferred_element_type=jnp.float32)
    weights = jax.nn.softmax(logits, axis=-1)
    y = jnp.einsum("nqk,nkd->nqd", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
    y = _on_all_threads(y, split).astype(v.dtype)
    return (y, weights) if with_weights else y


def _on_all_threads(y, split):
    """`y`, the float32 result of a batched dot, with a reduction over its rows in the same XLA
    fusion when `split`: XLA:CPU runs a batched dot that is alone in its fusion on one thread, and
    one whose result goes on to a row reduction on all of them. `y + 0 * max(row)` is `y` exactly
    for finite values (a row holding +inf comes out NaN)."""
    import jax
    import jax.numpy as jnp

    return y + 0.0 * jax.lax.stop_gradient(jnp.max(y, axis=-1, keepdims=True)) if split else y


@functools.cache
def _jax_attention_core(groups, split):
    """`_attention_forward` of bfloat16 `q`, `k`, `v` with its own gradient. The forward pass keeps
    only `q`, `k`, `v`; the gradient recomputes the softmax weights (the same ops, so the same
    numbers) in `groups` independent slices of the leading axis, which XLA:CPU's executor runs side
    by side on its threads: one small batched dot runs on one thread. The four gradient products
    are bfloat16 dots with float32 accumulation against written-out transposes
    (`_written_transpose`), and the float32 softmax gradient is rounded to bfloat16 for the two
    products that take it, as the bfloat16 products of a mixed-precision attention take their
    gradients. `split`: the products that end in a head dimension go through `_on_all_threads`."""
    import jax
    import jax.numpy as jnp

    f32 = jnp.float32

    def bmm(a, b, dtype):
        return _on_all_threads(jnp.matmul(a, b, preferred_element_type=f32), split).astype(dtype)

    def gradients(q, k, v, upstream):
        dtype = v.dtype
        weights = _attention_forward(q, k, v, with_weights=True)[1]
        upstream = upstream.astype(dtype)
        rounded = weights.astype(dtype)
        d_rounded = jnp.matmul(upstream, _written_transpose(v), preferred_element_type=f32).astype(dtype).astype(f32)
        d_value = bmm(_written_transpose(rounded), upstream, dtype)
        d_logits = weights * (d_rounded - jnp.sum(weights * d_rounded, axis=-1, keepdims=True))
        d_logits = d_logits.astype(q.dtype)
        d_query = bmm(d_logits, k, q.dtype)
        d_key = bmm(_written_transpose(d_logits), q, k.dtype)
        return d_query, d_key, d_value

    @jax.custom_vjp
    def core(q, k, v):
        return _attention_forward(q, k, v, split=split)

    def forward(q, k, v):
        return _attention_forward(q, k, v, split=split), (q, k, v)

    def backward(residuals, upstream):
        n = upstream.shape[0]
        parts = max(1, min(groups, n))
        bounds = [i * n // parts for i in range(parts + 1)]
        pieces = [gradients(*(t[a:b] for t in (*residuals, upstream))) for a, b in zip(bounds, bounds[1:])]
        return tuple(jnp.concatenate(same, axis=0) for same in zip(*pieces))

    core.defvjp(forward, backward)
    return core


def seeded_dropout(x, rate, seed):
    """Inverted dropout of `x` at `rate` with the mask drawn from the seed tensor `seed` (what a
    SeedGenerator's `next()` returns): the same seed gives the same mask wherever it is computed
    again. The encoder blocks use it on JAX and TensorFlow (PyTorch's checkpoint replays its own
    random state); on PyTorch the seed's first word seeds the draw.

    Example:
        >>> import keras
        >>> from keras import ops
        >>> seed = keras.random.SeedGenerator(1).next()
        >>> a = seeded_dropout(ops.ones((4, 4)), 0.5, seed)
        >>> bool(ops.all(a == seeded_dropout(ops.ones((4, 4)), 0.5, seed)))
        True
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        seed = tf.convert_to_tensor(seed)
        if seed.dtype != tf.int32:  # the stateless ops take int32 seeds under XLA
            seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
        return tf.nn.experimental.stateless_dropout(x, rate=rate, seed=seed)
    if keras.backend.backend() == "torch":
        seed = int(ops.convert_to_numpy(seed).reshape(-1)[0])
    return keras.random.dropout(x, rate, seed=seed)
