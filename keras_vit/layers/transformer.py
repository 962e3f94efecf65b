"""The Vision Transformer's layers, written once against keras.ops.

Layer and variable names are the module names of the original Flax code
(google-research/vision_transformer), so that a weight's place in the canonical tree
(`Transformer/encoderblock_3/MultiHeadDotProductAttention_1/query/kernel`) is its place in the
model. Every layer lists its variables under those names in `weight_tree_variables()`, with the
original shapes, which is all the checkpoint code needs.
"""


import keras
import numpy as np
from keras import ops

from keras_vit.choices import MLP_ACTIVATIONS, NORMS
from keras_vit.layers.init_scope import SplitFanXavierUniform  # noqa: F401  (re-exported)
from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.matmul import dot_product_attention, gelu, matmul, matmul_add, seeded_dropout
from keras_vit.layers.position import PositionEmbedding  # noqa: F401  (re-exported)
from keras_vit.layers.position import (
    relative_position_entries,
    relative_position_index,
    rotary_embedding_tables,
    rotary_embedding_tensors,
    rotary_positions,
    rotary_positions_tensor,
)
from keras_vit.layers.quantized import Dense, Int8AttentionMixin
from keras_vit.layers.resize import resize_patch_embedding, resize_relative_position_bias

register = keras.saving.register_keras_serializable(package="keras_vit")


# === Embeddings ===


@register
class PatchEmbedding(keras.layers.Layer):
    """Cuts an image into non-overlapping patches and projects each to `hidden_size`.

    The original "embedding" conv: kernel = stride = patch, VALID, with bias (`use_bias=False`:
    without, as timm's pre-norm models, CLIP's among them). Output tokens are row-major over the
    patch grid: (batch, rows * cols, hidden_size).
    """

    def __init__(self, hidden_size, patch_size, kernel_initializer="lecun_normal", use_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.hidden_size = int(hidden_size)
        self.patch_size = int(patch_size)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)

    def build(self, input_shape):
        channels = input_shape[-1]
        p = self.patch_size
        self.kernel = self.add_weight(
            name="kernel", shape=(p, p, channels, self.hidden_size), initializer=_init(self.kernel_initializer)
        )
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.hidden_size,), initializer="zeros")

    def call(self, images):
        p = self.patch_size
        for axis, size in zip(("height", "width"), images.shape[1:3]):
            # Known here whenever the graph is traced for a concrete size (eager, jit on JAX and
            # TensorFlow); a VALID convolution would otherwise drop the last pixels silently.
            if size is not None and size % p:
                raise ValueError(
                    f"{self.name}: input {axis} {size} is not divisible by the patch size {p}. Resize the images "
                    "to a multiple of the model's stride (`model.stride`: the patch size, times the ResNet's "
                    f"stride in a hybrid), e.g. {max(size // p, 1) * p} or {(size // p + 1) * p} for a plain ViT."
                )
        if p == 1:
            x = ops.einsum("bhwc,cd->bhwd", images, self.kernel[0, 0])
        else:
            x = ops.conv(images, self.kernel, strides=p, padding="valid", data_format="channels_last")
        if self.bias is not None:
            x = x + self.bias
        shape = ops.shape(x)
        return ops.reshape(x, (shape[0], shape[1] * shape[2], self.hidden_size))

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        p = self.patch_size
        return (b, None if h is None or w is None else (h // p) * (w // p), self.hidden_size)

    def weight_tree_variables(self):
        return {"kernel": self.kernel, **({"bias": self.bias} if self.bias is not None else {})}

    def resized_weight(self, key, value, source_grid=None, rule=None):
        """A checkpoint `kernel` of another patch size, PI-resized to this layer's with `rule`
        (one of `resize.PATCH_RESIZE_RULES`); without a rule a mismatch is an error that says how
        to ask for the resize (set_weight_tree passes the rule only when a load asked for it)."""
        value = np.asarray(value)
        target = tuple(self.kernel.shape)
        if key != "kernel" or value.ndim != 4 or value.shape[2:] != target[2:]:
            raise ValueError(f"shape mismatch for embedding/{key}: checkpoint {tuple(value.shape)} vs model {target}")
        if rule is None:
            raise ValueError(
                f"the checkpoint's patch embedding is {value.shape[0]}x{value.shape[1]} and the model's "
                f"{target[0]}x{target[1]}: to run the weights at another patch size, load them with "
                f"patch_size={target[0]} (keras_vit.load_checkpoint or the constructors' weights=), which "
                "resizes the kernel with FlexiViT's PI-resize"
            )
        return resize_patch_embedding(value, target[:2], rule=rule)

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_size=self.hidden_size,
            patch_size=self.patch_size,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
        )
        if not self.use_bias:
            config.update(use_bias=False)
        return config


@register
class ClassToken(keras.layers.Layer):
    """Prepends the learned class token `cls` (1, 1, hidden), zero-initialised."""

    def build(self, input_shape):
        self.cls = self.add_weight(name="cls", shape=(1, 1, input_shape[-1]), initializer="zeros")

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        cls = ops.cast(ops.broadcast_to(self.cls, (batch, 1, ops.shape(tokens)[-1])), tokens.dtype)
        return ops.concatenate([cls, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + 1, d)

    def weight_tree_variables(self):
        # The original stores the class token at the top of the tree as `cls`.
        return {"": self.cls}


@register
class PatchDropout(keras.layers.Layer):
    """Patch dropout (timm's `PatchDropout`, `patch_drop_rate`; Liu et al. 2022, FLIP): in
    training, each image keeps a random subset of its patch tokens, max(1, int(patches * (1 -
    rate))) of them in random order; the `num_prefix_tokens` tokens in front (class, distillation
    and register tokens) are always kept, in front. At inference the tokens pass unchanged.

    The token count after the layer is known only in training, so its output shape leaves it
    None when `rate` > 0.

    With `return_indices=True` the layer also returns which patches each image kept, (batch,
    kept) int32 indices into the patch grid (in training the random order, at inference every
    patch in order), as timm's `PatchDropoutWithIndices`: a rotary position embedding follows
    the kept patches with them (EVA-02, RoPE-Mixed).

    Example:
        >>> import numpy as np
        >>> layer = PatchDropout(0.5, num_prefix_tokens=1, seed=0)
        >>> tokens = np.zeros((2, 1 + 16, 8), "float32")
        >>> tuple(layer(tokens, training=True).shape), tuple(layer(tokens).shape)
        ((2, 9, 8), (2, 17, 8))
    """

    def __init__(self, rate, num_prefix_tokens=1, seed=None, return_indices=False, **kwargs):
        super().__init__(**kwargs)
        self.return_indices = bool(return_indices)
        rate = float(rate)
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"PatchDropout rate must be in [0, 1) (the fraction of patch tokens dropped); got {rate!r}.")
        self.rate = rate
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)

    def kept(self, patches):
        """How many of `patches` patch tokens an image keeps in training (timm's count)."""
        return max(1, int(patches * (1.0 - self.rate)))

    def call(self, tokens, training=None):
        if not training or not self.rate:
            if not self.return_indices:
                return tokens
            batch, length = ops.shape(tokens)[:2]
            patches = length - self.num_prefix_tokens
            return tokens, ops.broadcast_to(ops.arange(patches, dtype="int32")[None], (batch, patches))
        n = self.num_prefix_tokens
        prefix, patches = tokens[:, :n], tokens[:, n:]
        count = patches.shape[1]
        shape = ops.shape(patches)
        if count is None:  # a grid known only at run time (dynamic_image_size on TensorFlow)
            keep = ops.maximum(1, ops.cast(ops.floor(ops.cast(shape[1], "float64") * (1.0 - self.rate)), "int32"))
            noise = keras.random.uniform((shape[0], shape[1]), seed=self.seed_generator)
        else:
            keep = self.kept(count)
            noise = keras.random.uniform((shape[0], count), seed=self.seed_generator)
        order = ops.cast(ops.argsort(noise, axis=-1)[:, :keep], "int32")
        kept = ops.take_along_axis(patches, ops.expand_dims(order, -1), axis=1)
        out = ops.concatenate([prefix, ops.cast(kept, prefix.dtype)], axis=1) if n else kept
        return (out, order) if self.return_indices else out

    def compute_output_shape(self, input_shape):
        shape = (input_shape[0], None if self.rate else input_shape[1], *input_shape[2:])
        if not self.return_indices:
            return shape
        patches = None if shape[1] is None else shape[1] - self.num_prefix_tokens
        return shape, (input_shape[0], patches)

    def compute_output_spec(self, tokens, training=None):
        shape = self.compute_output_shape(tokens.shape)
        if not self.return_indices:
            return keras.KerasTensor(shape, dtype=tokens.dtype)
        return keras.KerasTensor(shape[0], dtype=tokens.dtype), keras.KerasTensor(shape[1], dtype="int32")

    def get_config(self):
        config = super().get_config()
        config.update(rate=self.rate, num_prefix_tokens=self.num_prefix_tokens, seed=self.seed)
        if self.return_indices:
            config.update(return_indices=True)
        return config


@register
class RegisterTokens(keras.layers.Layer):
    """Prepends `count` learned register tokens `tokens` (1, count, hidden) (Darcet et al. 2024,
    timm's `reg_token`): extra prefix tokens that no head reads."""

    def __init__(self, count, **kwargs):
        super().__init__(**kwargs)
        self.count = int(count)

    def build(self, input_shape):
        self.tokens = self.add_weight(
            name="tokens", shape=(1, self.count, input_shape[-1]),
            initializer=_init(keras.initializers.RandomNormal(stddev=1e-6)),
        )

    def call(self, tokens):
        batch = ops.shape(tokens)[0]
        registers = ops.cast(ops.broadcast_to(self.tokens, (batch, self.count, ops.shape(tokens)[-1])), tokens.dtype)
        return ops.concatenate([registers, tokens], axis=1)

    def compute_output_shape(self, input_shape):
        b, n, d = input_shape
        return (b, None if n is None else n + self.count, d)

    def weight_tree_variables(self):
        return {"": self.tokens}

    def get_config(self):
        config = super().get_config()
        config.update(count=self.count)
        return config


# === Norms, activations and layer scale ===


@register
class RMSNorm(keras.layers.Layer):
    """Root-mean-square norm with a learned `scale` and no bias: x / sqrt(mean(x^2) + eps) * scale
    (timm's RmsNorm, AIMv2's norm)."""

    def __init__(self, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = float(epsilon)

    def build(self, input_shape):
        self.gamma = self.add_weight(name="gamma", shape=(input_shape[-1],), initializer="ones")

    def call(self, x):
        y = ops.cast(x, "float32") if x.dtype in ("float16", "bfloat16") else x
        y = y * ops.rsqrt(ops.mean(ops.square(y), axis=-1, keepdims=True) + self.epsilon)
        return ops.cast(y, x.dtype) * ops.cast(self.gamma, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon)
        return config


def make_norm(kind, epsilon, dtype, name):
    """A LayerNormalization or RMSNorm layer (`kind` one of NORMS) with `epsilon`.

    Under a half-precision policy whose variables are half precision too ("bfloat16",
    "float16") the norm takes the mixed policy of the same compute dtype instead: float32 scale
    and bias, statistics in float32 (keras.ops.layer_normalization's rule), the output in the
    compute dtype. A "bfloat16" model then normalises as a "mixed_bfloat16" one does; the
    parameters that matter for speed, the matmul kernels, stay bfloat16
    (`keras_vit.performance.bfloat16_inference`).

    Example:
        >>> make_norm("layer_norm", 1e-6, "bfloat16", "norm").dtype_policy.name
        'mixed_bfloat16'
    """
    policy = keras.dtype_policies.get(dtype)
    if policy.quantization_mode is None and policy.variable_dtype in ("bfloat16", "float16"):
        dtype = f"mixed_{policy.compute_dtype}"
    if kind == "rms_norm":
        return RMSNorm(epsilon, dtype=dtype, name=name)
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)



def mlp_activation(x, activation, gelu_approximate=True):
    """`activation` (one of MLP_ACTIVATIONS) applied to `x`."""
    if activation is None:
        return gelu(x, approximate=gelu_approximate)
    if activation in ("gelu", "gelu_tanh"):
        return gelu(x, approximate=activation == "gelu_tanh")
    if activation == "quick_gelu":
        return x * ops.sigmoid(ops.cast(1.702, x.dtype) * x)
    if activation == "silu":
        return ops.silu(x)
    raise ValueError(f"Unknown MLP activation {activation!r}; use one of {MLP_ACTIVATIONS[1:]}.")


@register
class LayerScale(keras.layers.Layer):
    """A learned per-channel `scale` (hidden,) multiplying a residual branch (Touvron et al. 2021,
    CaiT; timm's `ls1`/`ls2`), initialised to `init_value`."""

    def __init__(self, init_value=1e-5, **kwargs):
        super().__init__(**kwargs)
        self.init_value = float(init_value)

    def build(self, input_shape):
        self.scale = self.add_weight(
            name="scale", shape=(input_shape[-1],), initializer=keras.initializers.Constant(self.init_value)
        )

    def call(self, x):
        return x * ops.cast(self.scale, x.dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(init_value=self.init_value)
        return config


def _dropout(dropout, y, training, seed=None):
    """`dropout(y, training=training)`, without the layer call when it is the identity (rate 0
    or not training): eager PyTorch pays ~0.3 ms of Keras Python per layer call. With `seed` (a
    seed tensor the encoder block drew), the mask is drawn from it (`seeded_dropout`)."""
    if not (training and dropout.rate > 0):
        return y
    if seed is not None:
        return seeded_dropout(y, dropout.rate, seed)
    return dropout(y, training=training)


# === Attention ===


def _output_spec(x, num_heads, dtype, return_attention_weights):
    """Symbolic outputs of an attention layer or block: the tokens, and with
    `return_attention_weights` the (batch, heads, tokens, tokens) weights too (Keras passes call
    keyword arguments to compute_output_spec, not to compute_output_shape)."""
    out = keras.KerasTensor(x.shape, dtype=dtype)
    if not return_attention_weights:
        return out
    batch, tokens = x.shape[0], x.shape[1]
    return out, keras.KerasTensor((batch, num_heads, tokens, tokens), dtype=dtype)


@register
class MultiHeadDotProductAttention(Int8AttentionMixin, keras.layers.Layer):
    """Multi-head self-attention with the original's per-head kernels.

    query/key/value kernels are (hidden, heads, head_dim) with biases (heads, head_dim); the out
    kernel is (heads, head_dim, hidden). The fast path goes through
    `layers.matmul.dot_product_attention` (Keras' fused or flash kernels where the backend has
    them, the original's form on JAX's CPU backend); the
    explicit path is used when attention weights are asked for or attention dropout is active.

    `relative_positions=N` (a sequence of N tokens) adds the paper's 1-D relative attention
    (Appendix D.4): a learned `relative_embedding` (2N - 1, heads, head_dim), one vector per
    query-key offset q - k, acts as the key for the content query; its scaled logits
    q . r[q - k] / sqrt(head_dim) are added to the attention logits before the softmax.

    `relative_position_bias=(rows, cols)` adds BEiT's 2-D relative position bias (Bao et al. 2022):
    a learned `relative_position_bias_table` ((2 rows - 1) (2 cols - 1) + 3, heads), one scalar per
    head for each 2-D offset between two patches and three for the class token (see
    `layers.position.relative_position_index`), added to the logits before the softmax. The
    sequence is then one class token followed by the rows x cols patches.

    `rotary={"grid": (rows, cols), "prefix_tokens": n, "temperature": t, "reference_grid": (r, c) or
    None, "offset": o, "indexing": "ij" or "xy", "coordinates": "index" or "centered", "rotate_half":
    bool, "learned": bool}` rotates the queries and keys of the patch tokens (those after the n prefix tokens) by
    EVA-02's 2-D rotary position embedding (`layers.position.rotary_embedding_tables`) before the
    logits. With "learned" (Heo et al. 2024, RoPE-Mixed; timm's RotaryEmbeddingMixed) the layer
    learns its own `rope_frequencies` (2, heads, head_dim / 2): each head's angles are
    first-axis position x frequencies[0] + second-axis position x frequencies[1].
    `output_norm=True` normalises the heads' concatenated output before the out projection
    (EVA-02 CLIP's sub-LN, timm's `scale_attn_inner`), with `norm` and `norm_epsilon`.
    `differential=lambda_init` makes it differential attention (Ye et al. 2024, timm's
    DiffAttention): each head's query and key split into two halves, each half-pair gives a
    softmax map (scaled by 1/sqrt(head_dim / 2)), the head attends with map1 - lambda * map2,
    lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init, and its output
    is RMS-normalised (`sub_norm`, eps 1e-5) and scaled by 1 - lambda_init. The returned attention
    weights are the signed difference.
    `qk_norm=True` normalises each head's query and key (`query_norm`, `key_norm`, over head_dim,
    with `norm` and `norm_epsilon`) before any rotation (timm's qk_norm). `num_kv_heads` (a
    divisor of num_heads; None: num_heads) is grouped-query attention: key and value have
    num_kv_heads heads, query head h reads key/value head h // (num_heads / num_kv_heads).
    int8 quantization lives in `layers.quantized.Int8AttentionMixin`.
    """

    def __init__(self, num_heads, attention_dropout_rate=0.0, relative_positions=None, use_bias=True, out_bias=True,
                 relative_position_bias=None, rotary=None, output_norm=False, norm="layer_norm", norm_epsilon=1e-6,
                 differential=None, qk_norm=False, num_kv_heads=None, key_bias=True, **kwargs):
        super().__init__(**kwargs)
        self.qk_norm = bool(qk_norm)
        self.num_kv_heads = int(num_heads if num_kv_heads is None else num_kv_heads)
        if self.num_kv_heads < 1 or int(num_heads) % self.num_kv_heads:
            raise ValueError(f"num_kv_heads must divide num_heads ({num_heads}); got {num_kv_heads!r}.")
        self.query_norm = make_norm(norm, float(norm_epsilon), self.dtype_policy, "query_norm") if qk_norm else None
        self.key_norm = make_norm(norm, float(norm_epsilon), self.dtype_policy, "key_norm") if qk_norm else None
        self.differential = None if differential is None else float(differential)
        self.sub_norm = None if differential is None else make_norm("rms_norm", 1e-5, self.dtype_policy, "sub_norm")
        self.rotary = None if rotary is None else _rotary_config(rotary)
        self.output_norm_enabled = bool(output_norm)
        self.norm = norm
        self.norm_epsilon = float(norm_epsilon)
        self.output_norm = make_norm(norm, self.norm_epsilon, self.dtype_policy, "norm") if output_norm else None
        self.relative_position_bias = (
            None if relative_position_bias is None else tuple(int(g) for g in relative_position_bias)
        )
        self.use_bias = bool(use_bias)  # query/key/value biases (timm's qkv_bias)
        # False: query and value biases only (BEiT's and EVA's; the softmax cancels a key bias)
        self.key_bias_enabled = bool(key_bias)
        self.out_bias_enabled = bool(out_bias)  # the out projection's bias (timm's proj_bias)
        self.num_heads = int(num_heads)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.relative_positions = None if relative_positions is None else int(relative_positions)
        self.dropout = keras.layers.Dropout(self.attention_dropout_rate, dtype=self.dtype_policy, name="dropout")

    def build(self, input_shape):
        hidden = input_shape[-1]
        if hidden % self.num_heads:
            raise ValueError(
                f"hidden_size {hidden} is not divisible by num_heads {self.num_heads}; choose a head "
                "count that divides the hidden size."
            )
        head_dim = hidden // self.num_heads
        self.head_dim = head_dim
        # Built with an int8 policy (a quantized layer restored from its config): the int8
        # variables directly, in the order `quantize` leaves them (biases, then int8 kernels).
        quantized = self.quantization_mode == "int8"
        if quantized and self.num_kv_heads != self.num_heads:
            raise NotImplementedError(f"{self.name}: int8 attention with grouped-query attention is not built.")
        for name in ("query", "key", "value"):
            heads = self.num_heads if name == "query" else self.num_kv_heads
            if not quantized:
                kernel = self.add_weight(
                    name=f"{name}_kernel",
                    shape=(hidden, heads, head_dim),
                    initializer=_init(SplitFanXavierUniform(in_axes=1)),
                )
                setattr(self, f"{name}_kernel", kernel)
            bias = None
            if self.use_bias and (name != "key" or self.key_bias_enabled):
                bias = self.add_weight(name=f"{name}_bias", shape=(heads, head_dim), initializer="zeros")
            setattr(self, f"{name}_bias", bias)
        for norm in (self.query_norm, self.key_norm):
            if norm is not None:
                norm.build((None, head_dim))
        if not quantized:
            self.out_kernel = self.add_weight(
                name="out_kernel", shape=(self.num_heads, head_dim, hidden), initializer=_init(SplitFanXavierUniform(in_axes=2))
            )
        self.out_bias = None
        if self.out_bias_enabled:
            self.out_bias = self.add_weight(name="out_bias", shape=(hidden,), initializer="zeros")
        self.relative_embedding = None
        if self.relative_positions is not None:
            if input_shape[1] is not None and input_shape[1] != self.relative_positions:
                raise ValueError(
                    f"Relative attention laid out for {self.relative_positions} tokens received "
                    f"{input_shape[1]} tokens."
                )
            self.relative_embedding = self.add_weight(
                name="relative_embedding",
                shape=(2 * self.relative_positions - 1, self.num_heads, head_dim),
                initializer=_init(keras.initializers.RandomNormal(stddev=0.02)),
            )
        self.relative_position_bias_table = None
        if self.relative_position_bias is not None:
            rows, cols = self.relative_position_bias
            if input_shape[1] is not None and input_shape[1] != rows * cols + 1:
                raise ValueError(
                    f"Relative position bias laid out for a class token and a {rows}x{cols} grid "
                    f"({rows * cols + 1} tokens) received {input_shape[1]} tokens."
                )
            self.relative_position_bias_table = self.add_weight(
                name="relative_position_bias_table",
                shape=(relative_position_entries(self.relative_position_bias), self.num_heads),
                initializer="zeros",
            )
            self._relative_position_index = relative_position_index(self.relative_position_bias).reshape(-1)
        if self.rotary is not None:
            if head_dim % 4:
                raise ValueError(f"Rotary position embeddings need a head size divisible by 4; got {head_dim}.")
            self.rope_frequencies = None
            if self.rotary["learned"]:
                self._rotary_positions = rotary_positions(self.rotary["grid"], self.rotary["indexing"])
                self.rope_frequencies = self.add_weight(
                    name="rope_frequencies", shape=(2, self.num_heads, head_dim // 2), initializer="zeros")
            else:
                self._rotary_tables = rotary_embedding_tables(
                    self.rotary["grid"], head_dim, self.rotary["temperature"], self.rotary["reference_grid"],
                    self.rotary["offset"], self.rotary["indexing"], self.rotary["coordinates"],
                    self.rotary["rotate_half"])
        if self.output_norm is not None:
            self.output_norm.build((None, self.num_heads * head_dim))
        if self.differential is not None:
            if head_dim % 2 or self.rotary is not None or self.relative_positions or self.relative_position_bias:
                raise ValueError(f"Differential attention splits each head's query and key in two: it needs an even "
                                 f"head size (got {head_dim}) and no rotary or relative position terms.")
            init = _init(keras.initializers.RandomNormal(stddev=0.1))
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                setattr(self, name, self.add_weight(name=name, shape=(head_dim // 2,), initializer=init))
            self.sub_norm.build((None, head_dim))
        if quantized:
            self._int8_build(hidden, self.num_heads * head_dim, getattr(self, "quantization_config", None))
            self._is_quantized = True

    def _project(self, x2d, name):
        # (batch * tokens, hidden) @ (hidden, heads * head_dim): one plain 2-D matmul on every
        # backend (an einsum with a 3-D kernel becomes a batched matmul plus copies on torch, and
        # a BatchMatMul instead of oneDNN's fused MatMul on TensorFlow). The reshapes are views.
        kernel = getattr(self, f"{name}_kernel")
        bias = getattr(self, f"{name}_bias")
        width = (self.num_heads if name in ("query", "out") else self.num_kv_heads) * self.head_dim
        if bias is None:
            return matmul(x2d, ops.reshape(kernel, (-1, width)))
        return matmul_add(x2d, ops.reshape(kernel, (-1, width)), ops.reshape(bias, (width,)))

    def _out(self, y2d, hidden):
        kernel = ops.reshape(self.out_kernel, (-1, hidden))
        return matmul(y2d, kernel) if self.out_bias is None else matmul_add(y2d, kernel, self.out_bias)

    def call(self, x, training=None, return_attention_weights=False, dropout_seed=None, grid=None, keep=None):
        shape = ops.shape(x)
        batch, tokens, hidden = shape[0], shape[1], x.shape[-1]
        heads_shape = (batch, tokens, self.num_heads, self.head_dim)
        kv_shape = (batch, tokens, self.num_kv_heads, self.head_dim)
        x2d = ops.reshape(x, (-1, hidden))
        q = ops.reshape(self._project(x2d, "query"), heads_shape)
        k, v = (ops.reshape(self._project(x2d, n), kv_shape) for n in ("key", "value"))
        y, weights = self._attend(q, k, v, training, return_attention_weights, dropout_seed, grid, keep)
        out = ops.reshape(self._out(y, hidden), (batch, tokens, hidden))
        return (out, weights) if return_attention_weights else out

    def cross_attend(self, queries, tokens, training=None):
        """Attention of `queries` (batch, m, hidden) over `tokens` (batch, n, hidden) with this
        layer's projections (float weights only): the MAP head's probe attending over a sequence."""
        if self.quantization_mode is not None:
            raise NotImplementedError(f"{self.name}: cross attention runs on float weights only.")
        hidden = tokens.shape[-1]
        q_shape, t_shape = ops.shape(queries), ops.shape(tokens)
        q = ops.reshape(self._project(ops.reshape(queries, (-1, hidden)), "query"), (q_shape[0], q_shape[1], self.num_heads, self.head_dim))
        k, v = (
            ops.reshape(self._project(ops.reshape(tokens, (-1, hidden)), n), (t_shape[0], t_shape[1], self.num_heads, self.head_dim))
            for n in ("key", "value")
        )
        y, _ = self._attend(q, k, v, training, False)
        return ops.reshape(self._out(y, hidden), (q_shape[0], q_shape[1], hidden))

    def _attend(self, q, k, v, training, return_attention_weights, dropout_seed=None, grid=None, keep=None):
        """Scaled dot-product attention of (batch, tokens, heads, head_dim) q/k/v; returns the
        heads concatenated as (batch * tokens, heads * head_dim) and the weights (or None). The
        attention-weight dropout draws its mask from `dropout_seed` when one is given; `grid` is
        the run-time patch grid the rotary embedding follows (None: the layer's own), and `keep`
        the (batch, kept) patches left by patch dropout, whose positions it rotates (None: all)."""
        if self.query_norm is not None:
            q, k = self.query_norm(q), self.key_norm(k)
        if self.num_kv_heads != self.num_heads:  # grouped-query attention: each key/value head serves a group
            k, v = (ops.repeat(t, self.num_heads // self.num_kv_heads, axis=2) for t in (k, v))
        if self.differential is not None:
            return self._differential_attend(q, k, v, training, dropout_seed)
        if self.rotary is not None:
            sin, cos = self._rotary_sin_cos(grid, keep)
            q, k = self._rotate(q, sin, cos), self._rotate(k, sin, cos)
        scale = 1.0 / float(self.head_dim) ** 0.5
        use_dropout = training and self.attention_dropout_rate > 0
        # float16: the explicit path keeps the softmax in float32 (and JAX's fused CPU kernel
        # rejects float16 inputs with float32 accumulation under jit).
        relative = self.relative_embedding is not None or self.relative_position_bias_table is not None
        if return_attention_weights or use_dropout or q.dtype == "float16" or relative:
            q = q * ops.cast(scale, q.dtype)
            logits = ops.einsum("bqhk,bthk->bhqt", q, k)
            if self.relative_embedding is not None:
                logits = logits + self._relative_logits(q)
            logits = ops.cast(logits, "float32")
            if self.relative_position_bias_table is not None:
                logits = logits + self._relative_position_bias()
            weights = ops.softmax(logits, axis=-1)
            weights = ops.cast(weights, v.dtype)
            dropped = _dropout(self.dropout, weights, training, dropout_seed)
            y = ops.einsum("bhqt,bthk->bqhk", dropped, v)
        else:
            weights = None
            y = dot_product_attention(q, k, v, scale)
        return self._concat_heads(y), weights

    def _differential_attend(self, q, k, v, training, dropout_seed=None):
        """Differential attention (see the class docstring) of (batch, tokens, heads, head_dim)
        q/k/v: heads concatenated as (batch * tokens, heads * head_dim), and the signed weights."""
        shape = ops.shape(q)
        half = self.head_dim // 2
        split = (shape[0], shape[1], self.num_heads, 2, half)  # timm's sub-heads 2h and 2h + 1
        q = ops.reshape(q, split) * ops.cast(1.0 / float(half) ** 0.5, q.dtype)
        logits = ops.cast(ops.einsum("bqhsk,bthsk->bhsqt", q, ops.reshape(k, split)), "float32")
        weights = _dropout(self.dropout, ops.softmax(logits, axis=-1), training, dropout_seed)
        lambda_ = ops.exp(ops.sum(ops.cast(self.lambda_q1, "float32") * ops.cast(self.lambda_k1, "float32")))
        lambda_ = lambda_ - ops.exp(ops.sum(ops.cast(self.lambda_q2, "float32") * ops.cast(self.lambda_k2, "float32")))
        weights = weights[:, :, 0] - (lambda_ + self.differential) * weights[:, :, 1]
        weights = ops.cast(weights, v.dtype)
        y = self.sub_norm(ops.einsum("bhqt,bthk->bqhk", weights, v)) * ops.cast(1.0 - self.differential, v.dtype)
        return self._concat_heads(y), weights

    def _concat_heads(self, y):
        """(batch, tokens, heads, head_dim) -> (batch * tokens, heads * head_dim), normalised when
        `output_norm` is set."""
        y = ops.reshape(y, (-1, self.num_heads * self.head_dim))
        return y if self.output_norm is None else self.output_norm(y)

    def _rotary_sin_cos(self, grid=None, keep=None):
        """The float32 sines and cosines that rotate the patch tokens' queries and keys, (1 or
        batch, patches, heads or 1, head_dim): for the (rows, cols) `grid` of the batch when given
        (dynamic_image_size), else the layer's grid; `keep` (batch, kept): the grid positions of
        the patch tokens that patch dropout left, in their order (timm's `apply_keep_indices_nlc`);
        None: every patch of the grid, in order."""
        r = self.rotary
        if r["learned"]:
            # (tokens, heads, head_dim / 2) angles of each head's own frequencies, channel pairs interleaved.
            positions = (ops.convert_to_tensor(self._rotary_positions) if grid is None
                         else rotary_positions_tensor(grid, r["indexing"]))
            frequencies = ops.cast(self.rope_frequencies, "float32")
            angles = (positions[:, 0, None, None] * frequencies[0][None] + positions[:, 1, None, None]
                      * frequencies[1][None])
            angles = ops.repeat(angles, 2, axis=-1)[None]
            sin, cos = ops.sin(angles), ops.cos(angles)
        elif grid is None:
            sin, cos = (ops.convert_to_tensor(t[None, :, None, :]) for t in self._rotary_tables)
        else:
            sin, cos = (t[None, :, None, :] for t in rotary_embedding_tensors(
                grid, self.head_dim, r["temperature"], r["reference_grid"], r["offset"], r["indexing"],
                r["coordinates"], r["rotate_half"]))
        if keep is not None:  # each image's kept positions: (batch, kept, heads or 1, head_dim)
            sin, cos = (ops.take(t[0], keep, axis=0) for t in (sin, cos))
        return sin, cos

    def _rotate(self, x, sin, cos):
        """The (batch, tokens, heads, head_dim) queries or keys with the patch tokens rotated by
        their rotary position embedding (`_rotary_sin_cos`; in float32, as timm), the prefix
        tokens unchanged."""
        n = self.rotary["prefix_tokens"]
        patches = ops.cast(x[:, n:], "float32")
        shape = ops.shape(patches)
        if self.rotary["rotate_half"]:  # channel j pairs with j + head_dim / 2: (x1, x2) -> (-x2, x1)
            half = self.head_dim // 2
            turned = ops.concatenate([-patches[..., half:], patches[..., :half]], axis=-1)
        else:
            pairs = ops.reshape(patches, (shape[0], shape[1], shape[2], self.head_dim // 2, 2))
            # Each channel pair (x0, x1) -> (-x1, x0): the quarter turn the sines multiply.
            turned = ops.reshape(ops.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), shape)
        patches = ops.cast(patches * cos + turned * sin, x.dtype)
        return ops.concatenate([x[:, :n], patches], axis=1) if n else patches

    def _relative_position_bias(self):
        """(1, heads, tokens, tokens) float32 bias: the table's entry for each query-key pair."""
        tokens = self.relative_position_bias[0] * self.relative_position_bias[1] + 1
        bias = ops.take(ops.cast(self.relative_position_bias_table, "float32"), self._relative_position_index, axis=0)
        return ops.expand_dims(ops.transpose(ops.reshape(bias, (tokens, tokens, self.num_heads)), (2, 0, 1)), 0)

    def _relative_logits(self, q):
        """(batch, heads, N, N) logits of the scaled query `q` against the embedding of each
        offset: out[b, h, i, j] = q[b, i, h] . relative_embedding[i - j + N - 1, h]."""
        n = self.relative_positions
        by_offset = ops.einsum("bqhk,rhk->bhqr", q, ops.cast(self.relative_embedding, q.dtype))
        index = (ops.arange(n)[:, None] - ops.arange(n)[None, :]) + (n - 1)
        shape = ops.shape(by_offset)
        index = ops.broadcast_to(index[None, None], (shape[0], shape[1], n, n))
        return ops.take_along_axis(by_offset, index, axis=-1)

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, x, training=None, return_attention_weights=False, dropout_seed=None, grid=None,
                            keep=None):
        return _output_spec(x, self.num_heads, self.compute_dtype, return_attention_weights)

    def weight_tree_variables(self):
        tree = {}
        for name in ("query", "key", "value", "out"):
            tree[f"{name}/kernel"] = getattr(self, f"{name}_kernel")
            if getattr(self, f"{name}_bias") is not None:
                tree[f"{name}/bias"] = getattr(self, f"{name}_bias")
        if self.relative_embedding is not None:
            tree["relative_embedding"] = self.relative_embedding
        if self.relative_position_bias_table is not None:
            tree["relative_position_bias_table"] = self.relative_position_bias_table
        if self.output_norm is not None:
            tree.update({f"norm/{k}": v for k, v in layer_norm_variables(self.output_norm).items()})
        if getattr(self, "rope_frequencies", None) is not None:
            tree["rope_frequencies"] = self.rope_frequencies
        for name, norm in (("query_norm", self.query_norm), ("key_norm", self.key_norm)):
            if norm is not None:
                tree.update({f"{name}/{k}": v for k, v in layer_norm_variables(norm).items()})
        if self.differential is not None:
            tree.update({n: getattr(self, n) for n in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")})
            tree["sub_norm/scale"] = self.sub_norm.gamma
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(num_heads=self.num_heads, attention_dropout_rate=self.attention_dropout_rate)
        if self.relative_positions is not None:
            config.update(relative_positions=self.relative_positions)
        if self.relative_position_bias is not None:
            config.update(relative_position_bias=list(self.relative_position_bias))
        if self.rotary is not None:
            config.update(rotary=dict(self.rotary))
        if self.output_norm is not None:
            config.update(output_norm=True, norm=self.norm, norm_epsilon=self.norm_epsilon)
        if self.differential is not None:
            config.update(differential=self.differential)
        if self.qk_norm:
            config.update(qk_norm=True, norm=self.norm, norm_epsilon=self.norm_epsilon)
        if self.num_kv_heads != self.num_heads:
            config.update(num_kv_heads=self.num_kv_heads)
        if not self.use_bias:
            config.update(use_bias=False)
        if not self.key_bias_enabled:
            config.update(key_bias=False)
        if not self.out_bias_enabled:
            config.update(out_bias=False)
        return config


def _identity(x):
    return x


def _rotary_config(rotary):
    """The JSON form of an attention layer's `rotary` argument (lists, not tuples)."""
    reference = rotary.get("reference_grid")
    return {"grid": [int(g) for g in rotary["grid"]], "prefix_tokens": int(rotary.get("prefix_tokens", 0)),
            "temperature": float(rotary.get("temperature", 10000.0)),
            "reference_grid": None if reference is None else [int(g) for g in reference],
            "offset": float(rotary.get("offset", 0.0)), "indexing": str(rotary.get("indexing", "ij")),
            "coordinates": str(rotary.get("coordinates", "index")), "rotate_half": bool(rotary.get("rotate_half")),
            "learned": bool(rotary.get("learned")),
            # dynamic_image_size: input pixels per token, the block reading each batch's grid off the images
            **({"stride": int(rotary["stride"])} if rotary.get("stride") else {})}


# === Encoder ===


@register
class MlpBlock(keras.layers.Layer):
    """Dense(mlp_dim) -> GELU (tanh or erf form) -> dropout -> Dense(hidden) -> dropout.

    `activation` (one of MLP_ACTIVATIONS) replaces the GELU; `glu=True` makes it a gated MLP
    (SwiGLU with "silu": timm's SwiGLU and GluMlp): Dense_1(act(Dense_0(x)) * Dense_2(x)), the
    gate's branch Dense_0 and the linear branch Dense_2 each `mlp_dim` wide. `use_bias=False`
    drops every Dense bias (timm's proj_bias=False). `norm=True` normalises the hidden activations
    before Dense_1 (EVA-02's sub-LN, timm's `scale_mlp`), with `norm_kind` and `norm_epsilon`.
    """

    def __init__(self, mlp_dim, dropout_rate=0.0, gelu_approximate=True, activation=None, glu=False, use_bias=True,
                 norm=False, norm_kind="layer_norm", norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.norm_kind = norm_kind
        self.norm_epsilon = float(norm_epsilon)
        self.norm = make_norm(norm_kind, self.norm_epsilon, self.dtype_policy, "norm") if norm else None
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.gelu_approximate = bool(gelu_approximate)
        if activation not in MLP_ACTIVATIONS:
            raise ValueError(f"Unknown MLP activation {activation!r}; use one of {MLP_ACTIVATIONS[1:]}.")
        self.activation = activation
        self.glu = bool(glu)
        self.use_bias = bool(use_bias)
        init = dict(
            kernel_initializer=_init("glorot_uniform"),
            bias_initializer=_init(keras.initializers.RandomNormal(stddev=1e-6)),
            use_bias=self.use_bias,
        )
        self.dense_0 = Dense(self.mlp_dim, dtype=self.dtype_policy, name="Dense_0", **init)
        self.dense_2 = Dense(self.mlp_dim, dtype=self.dtype_policy, name="Dense_2", **init) if self.glu else None
        self.dense_1 = None
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=self.dtype_policy, name="dropout")
        self._init = init

    def build(self, input_shape):
        hidden = input_shape[-1]
        self.dense_1 = Dense(hidden, dtype=self.dtype_policy, name="Dense_1", **self._init)
        self.dense_0.build(input_shape)
        self.dense_1.build(tuple(input_shape[:-1]) + (self.mlp_dim,))
        if self.dense_2 is not None:
            self.dense_2.build(input_shape)
        if self.norm is not None:
            self.norm.build(tuple(input_shape[:-1]) + (self.mlp_dim,))

    def call(self, x, training=None, dropout_seeds=(None, None)):
        # The Dense layers see the (batch * tokens, hidden) view: a plain 2-D matmul whose bias
        # add and GELU TensorFlow's graph optimizer fuses into one oneDNN MatMul (on a 3-D input
        # Keras' matmul is reshape -> MatMul -> reshape, which blocks that fusion). The reshapes
        # are free views on every backend.
        shape = ops.shape(x)
        x2d = ops.reshape(x, (-1, x.shape[-1]))
        y = mlp_activation(self.dense_0(x2d), self.activation, self.gelu_approximate)
        if self.dense_2 is not None:
            y = y * self.dense_2(x2d)
        y = _dropout(self.dropout, y, training, dropout_seeds[0])
        if self.norm is not None:
            y = self.norm(y)
        y = self.dense_1(y)
        y = ops.reshape(y, shape)
        return _dropout(self.dropout, y, training, dropout_seeds[1])

    def compute_output_shape(self, input_shape):
        return input_shape

    def weight_tree_variables(self):
        tree = {}
        for name, dense in (("Dense_0", self.dense_0), ("Dense_1", self.dense_1), ("Dense_2", self.dense_2)):
            if dense is not None:
                tree[f"{name}/kernel"] = dense.kernel
                if dense.bias is not None:
                    tree[f"{name}/bias"] = dense.bias
        if self.norm is not None:
            tree.update({f"norm/{k}": v for k, v in layer_norm_variables(self.norm).items()})
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(mlp_dim=self.mlp_dim, dropout_rate=self.dropout_rate, gelu_approximate=self.gelu_approximate)
        for key, default in (("activation", None), ("glu", False), ("use_bias", True)):
            if getattr(self, key) != default:
                config[key] = getattr(self, key)
        if self.norm is not None:
            config.update(norm=True, norm_kind=self.norm_kind, norm_epsilon=self.norm_epsilon)
        return config


def layer_norm_variables(norm):
    """{"scale", "bias"} of a LayerNormalization ({"scale"} of an RMSNorm)."""
    if getattr(norm, "beta", None) is None:
        return {"scale": norm.gamma}
    return {"scale": norm.gamma, "bias": norm.beta}


@register
class EncoderBlock(keras.layers.Layer):
    """Pre-LN Transformer block: x + Dropout(MHA(LN(x))), then y + MLP(LN(y)).

    With `remat=True` the block keeps only its input for the backward pass and computes its
    activations again there (`keras.remat`: `jax.checkpoint`, `tf.recompute_grad`,
    `torch.utils.checkpoint`): the same gradients for about a third more compute, and the
    activation memory of one block instead of all of them. Training with dropout, the block
    draws the seeds of its dropout masks before its forward pass, from its dropout layers'
    generators, on JAX and TensorFlow (`seeded_dropout`): the recomputed pass draws the same
    masks (PyTorch's checkpoint replays its own random state), and a block without remat draws
    its masks the same way, so both give the same gradients.
    """

    def __init__(
        self,
        num_heads,
        mlp_dim,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        layer_norm_epsilon=1e-6,
        gelu_approximate=True,
        relative_positions=None,
        remat=False,
        qkv_bias=True,
        projection_bias=True,
        layer_scale=None,
        key_bias=True,
        norm="layer_norm",
        mlp_activation=None,
        glu=False,
        relative_position_bias=None,
        rotary=None,
        attention_norm=False,
        mlp_norm=False,
        post_norm=False,
        parallel=False,
        differential=None,
        qk_norm=False,
        num_kv_heads=None,
        attention_only_layer_scale=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.qk_norm = bool(qk_norm)
        self.num_kv_heads = None if num_kv_heads is None else int(num_kv_heads)
        # Sapiens2's: the layer scale on the attention branch only.
        self.attention_only_layer_scale = bool(attention_only_layer_scale)
        # differential attention's lambda_init (MultiHeadDotProductAttention's `differential`).
        self.differential = None if differential is None else float(differential)
        self.post_norm = bool(post_norm)
        # parallel (timm's ParallelScalingBlock): x + LS(MHA(LN(x)) + MLP(LN(x))), one norm, one layer scale.
        self.parallel = bool(parallel)
        # EVA-02's rotary position embedding and sub-LNs (MultiHeadDotProductAttention's `rotary`
        # and `output_norm`, MlpBlock's `norm`).
        self.rotary = None if rotary is None else _rotary_config(rotary)
        self.attention_norm = bool(attention_norm)
        self.mlp_norm = bool(mlp_norm)
        # BEiT's 2-D relative position bias: the (rows, cols) patch grid behind one class token.
        self.relative_position_bias = (
            None if relative_position_bias is None else tuple(int(g) for g in relative_position_bias)
        )
        # timm's switches (VisionTransformer's fields of the same names say what each does).
        self.qkv_bias = bool(qkv_bias)
        self.key_bias = bool(key_bias)
        self.projection_bias = bool(projection_bias)
        self.layer_scale = None if layer_scale is None else float(layer_scale)
        self.norm = norm
        self.mlp_activation = mlp_activation
        self.glu = bool(glu)
        self.relative_positions = None if relative_positions is None else int(relative_positions)
        self.remat = bool(remat)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        policy = self.dtype_policy
        self.norm_0 = make_norm(self.norm, self.layer_norm_epsilon, policy, "LayerNorm_0")
        self.attention = MultiHeadDotProductAttention(
            self.num_heads,
            self.attention_dropout_rate,
            self.relative_positions,
            use_bias=self.qkv_bias,
            key_bias=self.key_bias,
            out_bias=self.projection_bias,
            relative_position_bias=self.relative_position_bias,
            rotary=self.rotary,
            output_norm=self.attention_norm,
            norm=self.norm,
            norm_epsilon=self.layer_norm_epsilon,
            differential=self.differential,
            qk_norm=self.qk_norm,
            num_kv_heads=self.num_kv_heads,
            dtype=policy,
            name="MultiHeadDotProductAttention_1",
        )
        self.dropout = keras.layers.Dropout(self.dropout_rate, dtype=policy, name="dropout")
        self.norm_2 = None if self.parallel else make_norm(self.norm, self.layer_norm_epsilon, policy, "LayerNorm_2")
        self.mlp = MlpBlock(
            self.mlp_dim, self.dropout_rate, self.gelu_approximate, activation=self.mlp_activation, glu=self.glu,
            use_bias=self.projection_bias, norm=self.mlp_norm, norm_kind=self.norm,
            norm_epsilon=self.layer_norm_epsilon, dtype=policy, name="MlpBlock_3",
        )
        self.layer_scales = None
        if self.layer_scale is not None:
            self.layer_scales = tuple(
                LayerScale(self.layer_scale, dtype=policy, name=f"LayerScale_{i}") for i in range(1 if self.parallel or self.attention_only_layer_scale else 2)
            )

    def build(self, x_shape, images_shape=None):
        for sub in (self.norm_0, self.attention, self.norm_2, self.mlp, *(self.layer_scales or ())):
            if sub is not None:
                sub.build(x_shape)

    def call(self, x, images=None, keep=None, training=None, return_attention_weights=False):
        """`images`: the model's input, from which a rotary block built for dynamic_image_size
        (`rotary["stride"]`) reads the batch's patch grid; `keep`: in training, the (batch, kept)
        grid positions of the patch tokens that patch dropout left (`PatchDropout(...,
        return_indices=True)`), which a rotary block rotates by their own positions."""
        seeds = self._dropout_seeds(training)
        grid = self._runtime_grid(images)
        if not training or self.rotary is None:
            keep = None  # at inference every patch is there, in grid order
        if self.remat and not return_attention_weights:
            # Only the tensor is an argument of the recomputed function: the flags stay Python
            # values (jax.checkpoint would trace them), the variables and the dropout seeds (drawn
            # outside it, so that the recomputation reuses them) are read inside it.
            return keras.remat(lambda tokens: self._block(tokens, training, seeds=seeds, grid=grid, keep=keep))(x)
        return self._block(x, training, return_attention_weights, seeds, grid, keep)

    def _runtime_grid(self, images):
        """(rows, cols) of the batch's patch grid for a rotary block that follows the input size
        (ints when the size is known while tracing, scalar tensors otherwise), else None."""
        stride = (self.rotary or {}).get("stride")
        if stride is None:
            return None
        if images is None:
            raise ValueError(f"{self.name} follows the input size at run time (rotary stride {stride}): call it as "
                             "block(tokens, images).")
        shape = ops.shape(images)
        grid = (shape[1] // stride, shape[2] // stride)
        if isinstance(grid[0], int) != isinstance(grid[1], int):
            # One side known while tracing and one not (TensorFlow relaxes only the side that changed):
            # both as tensors, since a layer's nested argument cannot mix tensors and Python ints.
            grid = tuple(ops.convert_to_tensor(g, "int32") for g in grid)
        return grid

    def _dropout_seeds(self, training):
        """The seeds of the block's four dropout masks (attention weights, attention output, the
        MLP's two), each drawn from its dropout layer's generator, when training with dropout on
        JAX or TensorFlow; None otherwise. jax.checkpoint cannot advance a generator's state
        inside the recomputed function (a leaked tracer) and tf.recompute_grad would draw new
        masks there; drawn here, the forward pass and its recomputation share them."""
        if not training or keras.backend.backend() == "torch":
            return None
        if self.dropout_rate == 0 and self.attention_dropout_rate == 0:
            return None

        def draw(layer):
            return layer.seed_generator.next() if layer.rate > 0 else None

        return draw(self.attention.dropout), draw(self.dropout), draw(self.mlp.dropout), draw(self.mlp.dropout)

    def _block(self, x, training=None, return_attention_weights=False, seeds=None, grid=None, keep=None):
        attention_seed, residual_seed, *mlp_seeds = seeds or (None,) * 4
        if self.parallel:
            return self._parallel_block(x, training, return_attention_weights, seeds or (None,) * 4, grid, keep)
        # post_norm (EVA-02 enormous): the norms follow the branches, x + LN(MHA(x)), y + LN(MLP(y)).
        pre, post = (_identity, self.norm_0) if self.post_norm else (self.norm_0, _identity)
        y = self.attention(pre(x), training=training, return_attention_weights=return_attention_weights,
                           dropout_seed=attention_seed, grid=grid, keep=keep)
        if return_attention_weights:
            y, weights = y
        y = post(y)
        if self.layer_scales is not None:
            y = self.layer_scales[0](y)
        x = x + _dropout(self.dropout, y, training, residual_seed)
        if self.post_norm:
            y = self.norm_2(self.mlp(x, training=training, dropout_seeds=tuple(mlp_seeds)))
        else:
            y = self.mlp(self.norm_2(x), training=training, dropout_seeds=tuple(mlp_seeds))
        if self.layer_scales is not None and len(self.layer_scales) > 1:
            y = self.layer_scales[1](y)
        x = x + y
        return (x, weights) if return_attention_weights else x

    def _parallel_block(self, x, training, return_attention_weights, seeds, grid=None, keep=None):
        attention_seed, residual_seed, *mlp_seeds = seeds
        h = self.norm_0(x)
        y = self.attention(h, training=training, return_attention_weights=return_attention_weights,
                           dropout_seed=attention_seed, grid=grid, keep=keep)
        if return_attention_weights:
            y, weights = y
        y = _dropout(self.dropout, y, training, residual_seed)
        y = y + self.mlp(h, training=training, dropout_seeds=tuple(mlp_seeds))
        if self.layer_scales is not None:
            y = self.layer_scales[0](y)
        x = x + y
        return (x, weights) if return_attention_weights else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, x, images=None, keep=None, training=None, return_attention_weights=False):
        return _output_spec(x, self.num_heads, self.compute_dtype, return_attention_weights)

    def weight_tree_variables(self):
        tree = {f"LayerNorm_0/{k}": v for k, v in layer_norm_variables(self.norm_0).items()}
        tree.update({f"MultiHeadDotProductAttention_1/{k}": v for k, v in self.attention.weight_tree_variables().items()})
        if self.norm_2 is not None:
            tree.update({f"LayerNorm_2/{k}": v for k, v in layer_norm_variables(self.norm_2).items()})
        tree.update({f"MlpBlock_3/{k}": v for k, v in self.mlp.weight_tree_variables().items()})
        for scale in self.layer_scales or ():
            tree[f"{scale.name}/scale"] = scale.scale
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            dropout_rate=self.dropout_rate,
            attention_dropout_rate=self.attention_dropout_rate,
            layer_norm_epsilon=self.layer_norm_epsilon,
            gelu_approximate=self.gelu_approximate,
        )
        if self.relative_positions is not None:
            config.update(relative_positions=self.relative_positions)
        if self.relative_position_bias is not None:
            config.update(relative_position_bias=list(self.relative_position_bias))
        if self.rotary is not None:
            config.update(rotary=dict(self.rotary))
        for key in ("attention_norm", "mlp_norm", "post_norm", "parallel", "qk_norm", "attention_only_layer_scale"):
            if getattr(self, key):
                config[key] = True
        if self.num_kv_heads is not None:
            config.update(num_kv_heads=self.num_kv_heads)
        if self.differential is not None:
            config.update(differential=self.differential)
        if self.remat:
            config.update(remat=True)
        defaults = dict(qkv_bias=True, key_bias=True, projection_bias=True, layer_scale=None, norm="layer_norm", mlp_activation=None,
                        glu=False)
        config.update({k: getattr(self, k) for k, v in defaults.items() if getattr(self, k) != v})
        return config

    def resized_weight(self, key, value, source_grid=None, rule=None):
        """Relative embeddings index offsets in the flattened token sequence: no resize exists.
        BEiT's relative position bias table is resampled to the model's grid as BEiT's fine-tuning
        code resamples it (`layers.resize.resize_relative_position_bias`)."""
        if key.endswith("relative_position_bias_table"):
            try:
                return resize_relative_position_bias(value, self.relative_position_bias, source_grid=source_grid)
            except ValueError as err:
                rows, cols = self.relative_position_bias
                raise ValueError(
                    f"{self.name}: the checkpoint's relative position bias table ({tuple(value.shape)[0]} entries) "
                    f"cannot be resampled to the model's {rows}x{cols} grid: {err}") from None
        if key.endswith("relative_embedding"):
            raise ValueError(
                relative_resize_error(f"checkpoint {tuple(value.shape)}, model {tuple(self.attention.relative_embedding.shape)}")
            )
        return value  # nothing else of a block is resized: set_weight_tree reports the shapes


def relative_resize_error(what):
    """Why relative position embeddings (`what`: the two layouts) cannot follow a new grid."""
    return (
        f"relative position embeddings cannot be resized ({what}): they are learned per offset in the "
        "flattened 1-D token sequence, and on another grid the same offset joins other patch pairs. Use "
        "the checkpoint's image size, or a 'learned', 'learned_2d' or 'sincos2d' position embedding."
    )


# === Pooling ===


@register
class TokenPooling(keras.layers.Layer):
    """Pools the token sequence: "token" takes the class token, "first" the first token (of a
    model without a class token: big_vision's pool_type "0"), "gap" averages the patch tokens,
    "max" takes their maximum.

    "distillation" takes DeiT's distillation token (the second).

    `num_prefix_tokens` tokens at the front are left out of the average ("gap" models have none).
    """

    def __init__(self, mode="token", num_prefix_tokens=1, **kwargs):
        super().__init__(**kwargs)
        if mode not in ("token", "first", "gap", "max", "distillation"):
            raise ValueError(
                f"TokenPooling mode must be 'token', 'first', 'gap', 'max' or 'distillation'; got {mode!r}."
            )
        self.mode = mode
        self.num_prefix_tokens = int(num_prefix_tokens)

    def call(self, tokens):
        if self.mode in ("token", "first"):
            return tokens[:, 0]
        if self.mode == "distillation":
            return tokens[:, 1]
        patches = tokens[:, self.num_prefix_tokens :]
        if self.mode == "max":
            return ops.max(patches, axis=1)
        return ops.mean(patches, axis=1)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def get_config(self):
        config = super().get_config()
        config.update(mode=self.mode, num_prefix_tokens=self.num_prefix_tokens)
        return config
