"""The BiT ResNets, written once against keras.ops: the one that feeds the R+ViT hybrids and the
pre-activation ResNet-v2 of the paper's CNN baselines (keras_vit.models.bit).

Weight-standardised convolutions and GroupNorm, with padding done explicitly (pad, then VALID),
so that every backend computes the same thing. The hybrids pad TF-style SAME and name their
layers after the original Flax modules (conv_root, gn_root, block{s}/unit{u}/{conv1,gn1,...});
the BiT baselines pad symmetrically, as timm's port of big_transfer does, and their units
(`PreActBottleneckUnit`) name their weights as the big_transfer .npz files do
(a/group_norm/gamma, a/standardized_conv2d/kernel, a/proj/standardized_conv2d/kernel, ...).
"""

import keras
from keras import ops

from keras_vit.layers.init_scope import initializer as _init


def batch_norm_variables(bn):
    """{leaf: keras.Variable} of a BatchNormalization layer in the canonical weight tree (the
    names PyTorch's running statistics are read into)."""
    return {"gamma": bn.gamma, "beta": bn.beta, "moving_mean": bn.moving_mean, "moving_variance": bn.moving_variance}


register = keras.saving.register_keras_serializable(package="keras_vit")


def same_padding(size, kernel, stride):
    """TF-style SAME padding (before, after) of one spatial axis: the extra pixel goes after."""
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def symmetric_padding(kernel):
    """Symmetric padding (before, after) of one spatial axis: (kernel - 1) // 2 on each side, as
    PyTorch convolutions pad (timm's BiT port); the output then has floor((n + 2p - k) / s) + 1."""
    p = (int(kernel) - 1) // 2
    return p, p


def _symmetric_output(size, kernel, stride):
    if size is None:
        return None
    p = symmetric_padding(kernel)[0]
    return (size + 2 * p - kernel) // stride + 1


def _pad_symmetric(x, kernel, value=0.0):
    p = symmetric_padding(kernel)
    if p == (0, 0):
        return x
    return ops.pad(x, ((0, 0), p, p, (0, 0)), constant_values=value)


def _same_padding_tensor(size, kernel, stride):
    """`same_padding` of a size known only at run time (a scalar tensor in a traced graph)."""
    total = ops.maximum(((size + stride - 1) // stride - 1) * stride + kernel - size, 0)
    return total // 2, total - total // 2


def _pad_same(x, kernel, stride, value=0.0):
    h, w = x.shape[1], x.shape[2]
    if h is None or w is None:  # a graph traced for any input size (TensorFlow relaxes shapes)
        shape = ops.shape(x)
        ph, pw = _same_padding_tensor(shape[1], kernel, stride), _same_padding_tensor(shape[2], kernel, stride)
        return ops.pad(x, ((0, 0), ph, pw, (0, 0)), constant_values=value)
    ph, pw = same_padding(h, kernel, stride), same_padding(w, kernel, stride)
    if ph == (0, 0) and pw == (0, 0):
        return x
    return ops.pad(x, ((0, 0), ph, pw, (0, 0)), constant_values=value)


@register
class StdConv2D(keras.layers.Layer):
    """Convolution with weight standardisation over (height, width, in) and no bias.

    `epsilon_inside_sqrt=False` is the original form (w - mean) / (std + epsilon);
    True is timm's (w - mean) / sqrt(var + epsilon). The eps differs per source too.
    `padding`: "same" (TF-style SAME, the extra pixel after: the ViT hybrids) or "symmetric"
    ((kernel - 1) // 2 on each side: the BiT baselines as timm runs them).
    """

    def __init__(
        self, filters, kernel_size, strides=1, epsilon=1e-5, epsilon_inside_sqrt=False, padding="same", **kwargs
    ):
        super().__init__(**kwargs)
        if padding not in ("same", "symmetric"):
            raise ValueError(f"StdConv2D padding must be 'same' or 'symmetric'; got {padding!r}.")
        self.filters = int(filters)
        self.kernel_size = int(kernel_size)
        self.strides = int(strides)
        self.epsilon = float(epsilon)
        self.epsilon_inside_sqrt = bool(epsilon_inside_sqrt)
        self.padding = padding

    def build(self, input_shape):
        k = self.kernel_size
        self.kernel = self.add_weight(
            name="kernel",
            shape=(k, k, input_shape[-1], self.filters),
            initializer=_init(keras.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")),
        )

    def standardized_kernel(self):
        w = ops.cast(self.kernel.value, "float32")
        mean = ops.mean(w, axis=(0, 1, 2), keepdims=True)
        var = ops.mean(ops.square(w - mean), axis=(0, 1, 2), keepdims=True)
        if self.epsilon_inside_sqrt:
            w = (w - mean) / ops.sqrt(var + self.epsilon)
        else:
            w = (w - mean) / (ops.sqrt(var) + self.epsilon)
        return w

    def call(self, x):
        w = ops.cast(self.standardized_kernel(), x.dtype)
        if self.padding == "symmetric":
            x = _pad_symmetric(x, self.kernel_size)
        else:
            x = _pad_same(x, self.kernel_size, self.strides)
        return ops.conv(x, w, strides=self.strides, padding="valid", data_format="channels_last")

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        k, s = self.kernel_size, self.strides
        if self.padding == "symmetric":
            return (b, _symmetric_output(h, k, s), _symmetric_output(w, k, s), self.filters)
        return (b, None if h is None else -(-h // s), None if w is None else -(-w // s), self.filters)

    def weight_tree_variables(self):
        return {"kernel": self.kernel}

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters,
            kernel_size=self.kernel_size,
            strides=self.strides,
            epsilon=self.epsilon,
            epsilon_inside_sqrt=self.epsilon_inside_sqrt,
            padding=self.padding,
        )
        return config


@register
class GroupNorm(keras.layers.Layer):
    """Group normalisation over (height, width, channels-in-group), optionally followed by ReLU.

    Statistics are computed in float32 whatever the compute dtype.
    """

    def __init__(self, groups=32, epsilon=1e-6, relu=False, scale_initializer="ones", **kwargs):
        super().__init__(**kwargs)
        self.groups = int(groups)
        self.epsilon = float(epsilon)
        self.relu = bool(relu)
        self.scale_initializer = keras.initializers.get(scale_initializer)

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels % self.groups:
            raise ValueError(f"GroupNorm: {channels} channels do not split into {self.groups} groups.")
        self.scale = self.add_weight(name="scale", shape=(channels,), initializer=self.scale_initializer)
        self.bias = self.add_weight(name="bias", shape=(channels,), initializer="zeros")

    def call(self, x):
        dtype = x.dtype
        b, h, w, c = ops.shape(x)
        g = ops.reshape(ops.cast(x, "float32"), (b, h, w, self.groups, c // self.groups))
        mean = ops.mean(g, axis=(1, 2, 4), keepdims=True)
        var = ops.mean(ops.square(g - mean), axis=(1, 2, 4), keepdims=True)
        g = (g - mean) * ops.rsqrt(var + self.epsilon)
        y = ops.reshape(g, (b, h, w, c)) * ops.cast(self.scale, "float32") + ops.cast(self.bias, "float32")
        if self.relu:
            y = ops.relu(y)
        return ops.cast(y, dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def weight_tree_variables(self):
        return {"scale": self.scale, "bias": self.bias}

    def get_config(self):
        config = super().get_config()
        config.update(
            groups=self.groups,
            epsilon=self.epsilon,
            relu=self.relu,
            scale_initializer=keras.initializers.serialize(self.scale_initializer),
        )
        return config


@register
class MaxPoolSame(keras.layers.Layer):
    """Max-pool with TF-style SAME padding filled with -inf (as Flax and timm pad)."""

    def __init__(self, pool_size=3, strides=2, **kwargs):
        super().__init__(**kwargs)
        self.pool_size = int(pool_size)
        self.strides = int(strides)

    def call(self, x):
        x = _pad_same(x, self.pool_size, self.strides, value=float("-inf"))
        return ops.max_pool(x, self.pool_size, self.strides, padding="valid", data_format="channels_last")

    def compute_output_shape(self, input_shape):
        b, h, w, c = input_shape
        s = self.strides
        return (b, None if h is None else -(-h // s), None if w is None else -(-w // s), c)

    def get_config(self):
        config = super().get_config()
        config.update(pool_size=self.pool_size, strides=self.strides)
        return config


@register
class MaxPoolZeroPad(keras.layers.Layer):
    """Max-pool after symmetric zero padding: BiT's stem (timm's `ConstantPad2d(1, 0.)` then
    `MaxPool2d(3, 2)`). Zero, not -inf: the pool sees raw conv outputs, and a zero border wins
    over negative values."""

    def __init__(self, pool_size=3, strides=2, padding=1, **kwargs):
        super().__init__(**kwargs)
        self.pool_size = int(pool_size)
        self.strides = int(strides)
        self.padding = int(padding)

    def call(self, x):
        p = self.padding
        if p:
            x = ops.pad(x, ((0, 0), (p, p), (p, p), (0, 0)), constant_values=0.0)
        return ops.max_pool(x, self.pool_size, self.strides, padding="valid", data_format="channels_last")

    def compute_output_shape(self, input_shape):
        b, h, w, c = input_shape
        k, s, p = self.pool_size, self.strides, self.padding

        def out(n):
            return None if n is None else (n + 2 * p - k) // s + 1

        return (b, out(h), out(w), c)

    def get_config(self):
        config = super().get_config()
        config.update(pool_size=self.pool_size, strides=self.strides, padding=self.padding)
        return config


# === Bottleneck units and stages ===


class _NormSettings:
    """The per-source numerics shared by every conv and norm of one ResNet."""

    def __init__(self, group_norm_epsilon, std_conv_epsilon, std_conv_epsilon_inside_sqrt, dtype):
        self.gn_eps = group_norm_epsilon
        self.ws_eps = std_conv_epsilon
        self.ws_inside = std_conv_epsilon_inside_sqrt
        self.dtype = dtype

    def conv(self, filters, kernel, strides, name):
        return StdConv2D(filters, kernel, strides, self.ws_eps, self.ws_inside, dtype=self.dtype, name=name)

    def norm(self, name, relu, zero_scale=False):
        init = "zeros" if zero_scale else "ones"
        return GroupNorm(32, self.gn_eps, relu=relu, scale_initializer=init, dtype=self.dtype, name=name)


@register
class BottleneckUnit(keras.layers.Layer):
    """Pre-activation-free bottleneck: 1x1 -> 3x3 (stride) -> 1x1 (4x), GroupNorm after each,
    projection of the residual when channels or stride change, ReLU after the sum."""

    def __init__(
        self,
        features,
        strides=1,
        group_norm_epsilon=1e-6,
        std_conv_epsilon=1e-5,
        std_conv_epsilon_inside_sqrt=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.features = int(features)
        self.strides = int(strides)
        self.group_norm_epsilon = float(group_norm_epsilon)
        self.std_conv_epsilon = float(std_conv_epsilon)
        self.std_conv_epsilon_inside_sqrt = bool(std_conv_epsilon_inside_sqrt)
        n = _NormSettings(group_norm_epsilon, std_conv_epsilon, std_conv_epsilon_inside_sqrt, self.dtype_policy)
        f = self.features
        self.conv1, self.gn1 = n.conv(f, 1, 1, "conv1"), n.norm("gn1", relu=True)
        self.conv2, self.gn2 = n.conv(f, 3, self.strides, "conv2"), n.norm("gn2", relu=True)
        self.conv3, self.gn3 = n.conv(4 * f, 1, 1, "conv3"), n.norm("gn3", relu=False, zero_scale=True)
        self.conv_proj = self.gn_proj = None
        self._settings = n

    def build(self, input_shape):
        f = self.features
        if input_shape[-1] != 4 * f or self.strides != 1:
            self.conv_proj = self._settings.conv(4 * f, 1, self.strides, "conv_proj")
            self.gn_proj = self._settings.norm("gn_proj", relu=False)
            self.conv_proj.build(input_shape)
            self.gn_proj.build(self.conv_proj.compute_output_shape(input_shape))
        shape = input_shape
        for conv, norm in ((self.conv1, self.gn1), (self.conv2, self.gn2), (self.conv3, self.gn3)):
            conv.build(shape)
            shape = conv.compute_output_shape(shape)
            norm.build(shape)

    def call(self, x):
        residual = x
        if self.conv_proj is not None:
            residual = self.gn_proj(self.conv_proj(x))
        y = self.gn1(self.conv1(x))
        y = self.gn2(self.conv2(y))
        y = self.gn3(self.conv3(y))
        return ops.relu(residual + y)

    def compute_output_shape(self, input_shape):
        return self.conv2.compute_output_shape(input_shape)[:-1] + (4 * self.features,)

    def weight_tree_variables(self):
        tree = {}
        parts = ("conv1", "gn1", "conv2", "gn2", "conv3", "gn3", "conv_proj", "gn_proj")
        for part in parts:
            layer = getattr(self, part)
            if layer is not None:
                tree.update({f"{part}/{k}": v for k, v in layer.weight_tree_variables().items()})
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(
            features=self.features,
            strides=self.strides,
            group_norm_epsilon=self.group_norm_epsilon,
            std_conv_epsilon=self.std_conv_epsilon,
            std_conv_epsilon_inside_sqrt=self.std_conv_epsilon_inside_sqrt,
        )
        return config


class UnitStage(keras.layers.Layer):
    """`num_units` residual units of the class `UNIT`, named `UNIT_NAME.format(i)` from 1; the
    first carries the stage's stride. A subclass names its unit class, its units' names and its
    numerics' defaults (`DEFAULTS`), and nothing else: every ResNet stage is this one."""

    UNIT = None
    UNIT_NAME = "unit{}"
    DEFAULTS = {}

    def __init__(
        self,
        num_units,
        features,
        first_stride=1,
        group_norm_epsilon=None,
        std_conv_epsilon=None,
        std_conv_epsilon_inside_sqrt=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        given = dict(group_norm_epsilon=group_norm_epsilon, std_conv_epsilon=std_conv_epsilon,
                     std_conv_epsilon_inside_sqrt=std_conv_epsilon_inside_sqrt)
        numerics = {k: self.DEFAULTS[k] if v is None else v for k, v in given.items()}
        self.num_units = int(num_units)
        self.features = int(features)
        self.first_stride = int(first_stride)
        self.group_norm_epsilon = float(numerics["group_norm_epsilon"])
        self.std_conv_epsilon = float(numerics["std_conv_epsilon"])
        self.std_conv_epsilon_inside_sqrt = bool(numerics["std_conv_epsilon_inside_sqrt"])
        self.units = [
            self.UNIT(
                self.features,
                self.first_stride if i == 0 else 1,
                self.group_norm_epsilon,
                self.std_conv_epsilon,
                self.std_conv_epsilon_inside_sqrt,
                dtype=self.dtype_policy,
                name=self.UNIT_NAME.format(i + 1),
            )
            for i in range(self.num_units)
        ]

    def build(self, input_shape):
        shape = input_shape
        for unit in self.units:
            unit.build(shape)
            shape = unit.compute_output_shape(shape)

    def call(self, x):
        for unit in self.units:
            x = unit(x)
        return x

    def compute_output_shape(self, input_shape):
        shape = input_shape
        for unit in self.units:
            shape = unit.compute_output_shape(shape)
        return shape

    def weight_tree_variables(self):
        tree = {}
        for unit in self.units:
            tree.update({f"{unit.name}/{k}": v for k, v in unit.weight_tree_variables().items()})
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(
            num_units=self.num_units,
            features=self.features,
            first_stride=self.first_stride,
            group_norm_epsilon=self.group_norm_epsilon,
            std_conv_epsilon=self.std_conv_epsilon,
            std_conv_epsilon_inside_sqrt=self.std_conv_epsilon_inside_sqrt,
        )
        return config


@register
class ResNetStage(UnitStage):
    """`num_units` bottleneck units `unit1..unitN` (the hybrids' ResNet, v1 units with the original
    Flax numerics by default); the first carries the stage's stride."""

    UNIT = BottleneckUnit
    UNIT_NAME = "unit{}"
    DEFAULTS = dict(group_norm_epsilon=1e-6, std_conv_epsilon=1e-5, std_conv_epsilon_inside_sqrt=False)


# === Pre-activation (v2) units and stages: the BiT baselines ===


@register
class PreActBottleneckUnit(keras.layers.Layer):
    """BiT's pre-activation bottleneck: GN+ReLU on the input, then 1x1 -> GN+ReLU -> 3x3 (stride)
    -> GN+ReLU -> 1x1 (4x features), plus the shortcut. The shortcut is the raw input, or, when
    the channels or the stride change, a 1x1 projection (with the stride) of the *pre-activated*
    input.

    Sub-layers are named after the big_transfer weights: `a_group_norm`, `a_standardized_conv2d`,
    `a_proj`, `b_...`, `c_...`; `weight_tree_variables()` gives their .npz names
    (`a/group_norm/gamma`, `a/proj/standardized_conv2d/kernel`, ...).
    """

    def __init__(
        self,
        features,
        strides=1,
        group_norm_epsilon=1e-5,
        std_conv_epsilon=1e-8,
        std_conv_epsilon_inside_sqrt=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.features = int(features)
        self.strides = int(strides)
        self.group_norm_epsilon = float(group_norm_epsilon)
        self.std_conv_epsilon = float(std_conv_epsilon)
        self.std_conv_epsilon_inside_sqrt = bool(std_conv_epsilon_inside_sqrt)
        f, norm, conv = self.features, self._norm, self._conv
        self.a_norm, self.a_conv = norm("a_group_norm"), conv(f, 1, 1, "a_standardized_conv2d")
        self.b_norm, self.b_conv = norm("b_group_norm"), conv(f, 3, self.strides, "b_standardized_conv2d")
        self.c_norm, self.c_conv = norm("c_group_norm"), conv(4 * f, 1, 1, "c_standardized_conv2d")
        self.proj = None

    def _conv(self, filters, kernel, strides, name):
        return StdConv2D(
            filters, kernel, strides, self.std_conv_epsilon, self.std_conv_epsilon_inside_sqrt,
            padding="symmetric", dtype=self.dtype_policy, name=name,
        )

    def _norm(self, name):
        return GroupNorm(32, self.group_norm_epsilon, relu=True, dtype=self.dtype_policy, name=name)

    def build(self, input_shape):
        if input_shape[-1] != 4 * self.features or self.strides != 1:
            self.proj = self._conv(4 * self.features, 1, self.strides, "a_proj")
            self.proj.build(input_shape)
        shape = input_shape
        for norm, conv in ((self.a_norm, self.a_conv), (self.b_norm, self.b_conv), (self.c_norm, self.c_conv)):
            norm.build(shape)
            conv.build(shape)
            shape = conv.compute_output_shape(shape)

    def call(self, x):
        preact = self.a_norm(x)
        shortcut = x if self.proj is None else self.proj(preact)
        y = self.b_conv(self.b_norm(self.a_conv(preact)))
        y = self.c_conv(self.c_norm(y))
        return y + shortcut

    def compute_output_shape(self, input_shape):
        return self.b_conv.compute_output_shape(input_shape)[:-1] + (4 * self.features,)

    def weight_tree_variables(self):
        tree = {}
        for part, norm, conv in (("a", self.a_norm, self.a_conv), ("b", self.b_norm, self.b_conv),
                                 ("c", self.c_norm, self.c_conv)):
            tree[f"{part}/group_norm/gamma"] = norm.scale
            tree[f"{part}/group_norm/beta"] = norm.bias
            tree[f"{part}/standardized_conv2d/kernel"] = conv.kernel
        if self.proj is not None:
            tree["a/proj/standardized_conv2d/kernel"] = self.proj.kernel
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(
            features=self.features,
            strides=self.strides,
            group_norm_epsilon=self.group_norm_epsilon,
            std_conv_epsilon=self.std_conv_epsilon,
            std_conv_epsilon_inside_sqrt=self.std_conv_epsilon_inside_sqrt,
        )
        return config


@register
class PreActResNetStage(UnitStage):
    """`num_units` pre-activation units `unit01..unitNN` (big_transfer's names, timm's numerics by
    default); the first carries the stage's stride (and the projection)."""

    UNIT = PreActBottleneckUnit
    UNIT_NAME = "unit{:02d}"
    DEFAULTS = dict(group_norm_epsilon=1e-5, std_conv_epsilon=1e-8, std_conv_epsilon_inside_sqrt=True)
