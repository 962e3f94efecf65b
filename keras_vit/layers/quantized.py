"""int8 matmuls that are fast on every backend, and the Dense layer that uses them.

Keras' int8 Dense multiplies int8 by int8 into int32 with `keras.ops.matmul`. JAX (XLA) runs
that as a real integer kernel, about 3x faster than float32 on a CPU with VNNI/AMX. TensorFlow
(an Eigen integer kernel) and PyTorch on the CPU (int32 `torch.matmul`) do not: there the same
call was 5x (TensorFlow) and 14x (PyTorch) slower than float32 for ViT-B/16
(benchmarks/README.md). On those backends `integer_matmul` multiplies the int8 values as
float32 instead: products of int8 are exact in float32 and so are their sums below 2**24
(|sum| < 16.7M, i.e. the worst case of 1040 terms of 127 * 127; typical sums are far smaller;
beyond it float32 rounds by 6e-8 relative, far below the int8 quantization step), so the
result is the integer product, at float32 speed, with the weights still stored in int8.
"""

import keras
from keras import ops

from keras_vit.layers.matmul import matmul, matmul_add
from keras_vit.layers.init_scope import unwrap

register = keras.saving.register_keras_serializable(package="keras_vit")


def _has_integer_kernel(x):
    backend = keras.backend.backend()
    if backend == "jax":
        return True
    if backend == "torch":
        # Keras runs int8 x int8 on CUDA through torch._int_mm.
        return getattr(getattr(x, "device", None), "type", None) == "cuda"
    return False


def integer_matmul(x_int8, kernel_int8):
    """The product of two int8 tensors: int32 on JAX and PyTorch-CUDA, float32 elsewhere (exact
    while |sums| < 2**24, see the module docstring)."""
    if _has_integer_kernel(x_int8):
        return ops.matmul(x_int8, kernel_int8)
    return ops.matmul(ops.cast(x_int8, "float32"), ops.cast(kernel_int8, "float32"))


def int8_matmul(x, kernel, kernel_scale, inputs_quantizer, compute_dtype):
    """`x @ (kernel / kernel_scale)` for an int8 `kernel` with one scale per output column.

    `x` is quantized per row on the fly by `inputs_quantizer` (Keras' AbsMaxQuantizer by
    default; None keeps `x` float and multiplies by the de-quantized kernel). The gradient
    reaches `x` through the de-quantized kernel; the int8 kernel and its scale get none.
    """

    @ops.custom_gradient
    def quantized_product(x, kernel, kernel_scale):
        def grad_fn(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            float_kernel = ops.divide(ops.cast(kernel, compute_dtype), kernel_scale)
            return ops.matmul(upstream, ops.transpose(float_kernel)), None, None

        if inputs_quantizer:
            x_int8, x_scale = inputs_quantizer(x, axis=-1)
            y = integer_matmul(x_int8, kernel)
            scale = ops.multiply(kernel_scale, x_scale)
        else:
            y = ops.matmul(x, ops.cast(kernel, compute_dtype))
            scale = kernel_scale
        return ops.divide(ops.cast(y, compute_dtype), scale), grad_fn

    return quantized_product(x, ops.convert_to_tensor(kernel), ops.convert_to_tensor(kernel_scale))


@register
class Dense(keras.layers.Dense):
    """keras.layers.Dense whose int8 mode runs `int8_matmul` (fast on every backend).

    Float, int4, float8 and LoRA compute exactly what Keras' Dense computes; the float call goes
    through `layers.matmul.matmul` (bfloat16 on JAX's CPU: float32 accumulation asked for
    explicitly, 5x faster) and the int8 call through `int8_matmul` (integer kernels where the
    backend has them). Variables, names and saved files are Keras' Dense's.
    """

    def get_config(self):
        config = super().get_config()
        for key in ("kernel_initializer", "bias_initializer"):  # the initialiser, not how it draws on JAX
            config[key] = keras.initializers.serialize(unwrap(getattr(self, key)))
        return config

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras' Dense refuses to quantize subclasses (type_check); this one keeps its layout.
        super().quantize(mode, type_check=False, config=config)

    def call(self, inputs, training=None):
        if self.lora_enabled:
            return super().call(inputs, training=training)
        if self.bias is not None:
            x = matmul_add(inputs, self.kernel, self.bias)
        else:
            x = matmul(inputs, self.kernel)
        if self.activation is not None:
            x = self.activation(x)
        return x

    def _int8_call(self, inputs, training=None):
        if self.lora_enabled:
            return super()._int8_call(inputs, training=training)
        x = int8_matmul(inputs, self._kernel, self.kernel_scale, self.inputs_quantizer, self.compute_dtype)
        if self.bias is not None:
            x = ops.add(x, self.bias)
        if self.activation is not None:
            x = self.activation(x)
        return x


# === int8 attention ===


class Int8AttentionMixin:
    """int8 mode of `layers.transformer.MultiHeadDotProductAttention` (its `quantize`, the int8
    variables and the int8 call); the float layer itself knows nothing of quantization beyond
    building these variables when restored under an int8 policy."""

    # --- int8 ---------------------------------------------------------------------------------
    # Keras' Model.quantize reaches only leaf layers (this one holds a Dropout), so
    # VisionTransformer.quantize calls `quantize` here itself. The int8 layout: one fused
    # (hidden, 3 * heads * head_dim) int8 kernel for query/key/value -- the input is quantized once
    # and multiplied once -- and a (heads * head_dim, hidden) int8 out kernel, each with a float
    # scale per output channel (Keras' Dense convention: int8 = round(w * scale)), multiplied by
    # layers.quantized.int8_matmul like the MLP's Dense layers. Biases stay
    # float and trainable; gradients reach the input through the de-quantized kernels.

    def quantize(self, mode=None, type_check=True, config=None):
        if type_check and type(self).__name__ != "MultiHeadDotProductAttention":
            raise self._not_implemented_error(self.quantize)
        # Keras' quantize wrapper has checked the arguments and resolved `config` for `mode`.
        mode = getattr(config, "mode", None) or mode
        if mode != "int8":
            raise NotImplementedError(
                f"{type(self).__name__} quantizes to int8 only (received mode={mode!r}); its "
                f"projections stay in {self.compute_dtype}."
            )
        if getattr(self, "num_kv_heads", self.num_heads) != self.num_heads:
            raise NotImplementedError(
                f"{self.name}: int8 quantization packs query, key and value of equal widths; grouped-query "
                f"attention ({self.num_kv_heads} key/value heads for {self.num_heads}) is not quantized. Keep the "
                "model in float, or quantize its Dense layers only.")
        self.quantization_config = config
        weight_quantizer = keras.quantizers.QuantizationConfig.weight_quantizer_or_default(
            config, keras.quantizers.AbsMaxQuantizer(axis=0)
        )
        hidden = self.query_kernel.shape[0]
        width = self.num_heads * self.head_dim
        qkv = ops.concatenate([ops.reshape(getattr(self, f"{n}_kernel"), (hidden, width)) for n in ("query", "key", "value")], axis=1)
        qkv_value, qkv_scale = weight_quantizer(qkv, axis=0, to_numpy=True)
        out_value, out_scale = weight_quantizer(ops.reshape(self.out_kernel, (width, hidden)), axis=0, to_numpy=True)
        for name in ("query_kernel", "key_kernel", "value_kernel", "out_kernel"):
            delattr(self, name)
        self._int8_build(hidden, width, config)
        self.qkv_kernel.assign(qkv_value)
        self.qkv_kernel_scale.assign(ops.reshape(qkv_scale, (-1,)))
        self.out_kernel.assign(out_value)
        self.out_kernel_scale.assign(ops.reshape(out_scale, (-1,)))
        self._is_quantized = True  # before the policy: setting an int8 policy quantizes otherwise
        if self.dtype_policy.quantization_mode is None:
            self.dtype_policy = keras.dtype_policies.get(f"int8_from_{self.dtype_policy.name}")

    def _int8_build(self, hidden, width, config=None):
        self.inputs_quantizer = keras.quantizers.QuantizationConfig.activation_quantizer_or_default(
            config, keras.quantizers.AbsMaxQuantizer()
        )
        int8 = dict(initializer="zeros", dtype="int8", trainable=False)
        self.qkv_kernel = self.add_weight(name="qkv_kernel", shape=(hidden, 3 * width), **int8)
        self.qkv_kernel_scale = self.add_weight(name="qkv_kernel_scale", shape=(3 * width,), initializer="ones", trainable=False)
        self.out_kernel = self.add_weight(name="out_kernel", shape=(width, hidden), **int8)
        self.out_kernel_scale = self.add_weight(name="out_kernel_scale", shape=(hidden,), initializer="ones", trainable=False)

    def _int8_matmul(self, x2d, kernel, kernel_scale):
        return int8_matmul(x2d, kernel, kernel_scale, self.inputs_quantizer, self.compute_dtype)

    def _int8_call(self, x, training=None, return_attention_weights=False, dropout_seed=None, grid=None, keep=None):
        shape = ops.shape(x)
        batch, tokens, hidden = shape[0], shape[1], x.shape[-1]
        width = self.num_heads * self.head_dim
        x2d = ops.reshape(x, (-1, hidden))
        qkv = self._int8_matmul(x2d, self.qkv_kernel, self.qkv_kernel_scale)
        if self.query_bias is not None:  # timm's qkv_bias=False models have none
            biases = ops.concatenate([ops.zeros((width,), self.query_bias.dtype) if getattr(self, f"{n}_bias") is None
                                      else ops.reshape(getattr(self, f"{n}_bias"), (width,))
                                      for n in ("query", "key", "value")])  # no key bias: zeros (BEiT's)
            qkv = qkv + ops.cast(biases, qkv.dtype)
        heads_shape = (batch, tokens, self.num_heads, self.head_dim)
        q, k, v = (ops.reshape(qkv[:, i * width : (i + 1) * width], heads_shape) for i in range(3))
        y, weights = self._attend(q, k, v, training, return_attention_weights, dropout_seed, grid, keep)
        out = self._int8_matmul(y, self.out_kernel, self.out_kernel_scale)
        if self.out_bias is not None:
            out = out + ops.cast(self.out_bias, y.dtype)
        out = ops.reshape(out, (batch, tokens, hidden))
        return (out, weights) if return_attention_weights else out
