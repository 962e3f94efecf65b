"""Position-sensitive axial attention and the AxialResNet bottleneck (Wang et al., "Axial-DeepLab",
ECCV 2020), as csrhddlam/axial-deeplab's `lib/models/axialnet.py` computes them, channels-last.

One `AxialAttention` attends along one axis (the height or the width) of a (batch, h, w, c)
map: every column (height attention) or row (width attention) is a sequence of length `span`.
A 1x1 projection (no bias) and a BatchNorm make per head a query and a key of half the head
width and a value of the full head width. A learned table of relative embeddings
`relative` (2 * head width, 2 * span - 1), indexed by key - query, gives query, key and value
embeddings; the similarities q.k, q.r_q and k.r_k are BatchNormed as 3 * heads channels and
summed (no 1/sqrt(d) scale), softmaxed over the keys, and the output is the attention over the
values plus the attention over the value embeddings, BatchNormed as 2 * width channels (the two
interleaved per channel) and summed. With `stride` 2 a 2x2 average pool follows.

The span is fixed when the layer is built: the relative table has one entry per offset of
that span, so the attended axis must have exactly `span` positions (as in the original).
"""

import math

import keras
import numpy as np
from keras import ops

from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.resnet import batch_norm_variables

register = keras.saving.register_keras_serializable(package="keras_vit")

#: PyTorch's BatchNorm defaults (eps 1e-5, running averages updated by 0.1 per step).
BATCH_NORM_EPSILON = 1e-5
BATCH_NORM_MOMENTUM = 0.9


def relative_index(span):
    """(span, span) int32: entry [i, j] = i - j + span - 1, the column of the relative table
    that query i and key j use (the original's `flatten_index`, as a matrix)."""
    i = np.arange(span)
    return (i[:, None] - i[None, :] + span - 1).astype(np.int32)


def _batch_norm(name, axis, epsilon, dtype):
    return keras.layers.BatchNormalization(
        axis=axis, epsilon=epsilon, momentum=BATCH_NORM_MOMENTUM, dtype=dtype, name=name
    )


@register
class AxialAttention(keras.layers.Layer):
    """Position-sensitive axial self-attention along the height or the width.

    Args:
        filters: output channels (the original's `out_planes`), split into `groups` heads.
        span: length of the attended axis (the original's `kernel_size`).
        groups: attention heads; `filters // groups` must be even.
        axis: "height" or "width".
        stride: 1, or 2 for a 2x2 average pool after the attention.
        epsilon: BatchNorm epsilon.

    Example:
        >>> layer = AxialAttention(16, span=8, groups=2, axis="width")
        >>> tuple(layer(np.zeros((1, 8, 8, 4), "float32")).shape)
        (1, 8, 8, 16)
    """

    def __init__(self, filters, span, groups=8, axis="height", stride=1, epsilon=BATCH_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        if axis not in ("height", "width"):
            raise ValueError(f"axis must be 'height' or 'width'; got {axis!r}.")
        if filters % groups or (filters // groups) % 2:
            raise ValueError(
                f"AxialAttention: {filters} channels in {groups} heads must give an even head width (queries and "
                "keys take half of it each)."
            )
        self.filters, self.span, self.groups = int(filters), int(span), int(groups)
        self.axis, self.stride, self.epsilon = axis, int(stride), float(epsilon)
        self.group_width = self.filters // self.groups
        self.bn_qkv = _batch_norm("bn_qkv", -1, epsilon, self.dtype_policy)
        self.bn_similarity = _batch_norm("bn_similarity", 1, epsilon, self.dtype_policy)
        self.bn_output = _batch_norm("bn_output", -1, epsilon, self.dtype_policy)

    def build(self, input_shape):
        length = input_shape[1] if self.axis == "height" else input_shape[2]
        if length is not None and length != self.span:
            raise ValueError(
                f"AxialAttention {self.name!r}: the {self.axis} is {length} but the layer's span is {self.span}; "
                "its relative embeddings cover exactly `span` positions."
            )
        channels = input_shape[-1]
        self.qkv_kernel = self.add_weight(
            name="qkv_transform", shape=(channels, 2 * self.filters),
            initializer=_init(keras.initializers.RandomNormal(0.0, math.sqrt(1.0 / channels))),
        )
        self.relative = self.add_weight(
            name="relative", shape=(2 * self.group_width, 2 * self.span - 1),
            initializer=_init(keras.initializers.RandomNormal(0.0, math.sqrt(1.0 / self.group_width))),
        )
        self.bn_qkv.build((None, self.span, 2 * self.filters))
        self.bn_similarity.build((None, 3 * self.groups, self.span, self.span))
        self.bn_output.build((None, self.span, 2 * self.filters))

    def call(self, x, training=None):
        c, L, g, d = x.shape[-1], self.span, self.groups, self.group_width
        if self.axis == "height":  # every column is a sequence: (batch * w, h, c)
            seq = ops.reshape(ops.transpose(x, (0, 2, 1, 3)), (-1, L, c))
        else:  # every row: (batch * h, w, c)
            seq = ops.reshape(x, (-1, L, c))
        qkv = self.bn_qkv(ops.matmul(seq, self.qkv_kernel), training=training)
        qkv = ops.reshape(qkv, (-1, L, g, 2 * d))
        q, k, v = qkv[..., : d // 2], qkv[..., d // 2 : d], qkv[..., d:]
        embeddings = ops.take(self.relative, relative_index(L), axis=1)  # (2d, query, key)
        q_emb, k_emb, v_emb = embeddings[: d // 2], embeddings[d // 2 : d], embeddings[d:]
        qk = ops.einsum("nigc,njgc->ngij", q, k)
        qr = ops.einsum("nigc,cij->ngij", q, q_emb)
        kr = ops.einsum("njgc,cji->ngij", k, k_emb)
        similarity = self.bn_similarity(ops.concatenate([qk, qr, kr], axis=1), training=training)
        similarity = ops.sum(ops.reshape(similarity, (-1, 3, g, L, L)), axis=1)
        weights = ops.softmax(similarity, axis=-1)
        sv = ops.einsum("ngij,njgc->nigc", weights, v)
        sve = ops.einsum("ngij,cij->nigc", weights, v_emb)
        # Channel 2 * (head * d + c) + {0: sv, 1: sve}: the original's interleaving.
        out = ops.reshape(ops.stack([sv, sve], axis=-1), (-1, L, 2 * self.filters))
        out = self.bn_output(out, training=training)
        out = ops.sum(ops.reshape(out, (-1, L, self.filters, 2)), axis=-1)
        if self.axis == "height":
            out = ops.transpose(ops.reshape(out, (-1, x.shape[2], L, self.filters)), (0, 2, 1, 3))
        else:
            out = ops.reshape(out, (-1, x.shape[1], L, self.filters))
        if self.stride > 1:
            out = ops.average_pool(out, self.stride, self.stride, padding="valid", data_format="channels_last")
        return out

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        s = self.stride

        def pooled(n):
            return None if n is None else n // s

        return (b, pooled(h), pooled(w), self.filters)

    def weight_tree_variables(self):
        """{name: variable} under the original's module names (`qkv_transform/kernel`, ...)."""
        tree = {"qkv_transform/kernel": self.qkv_kernel, "relative": self.relative}
        for bn in (self.bn_qkv, self.bn_similarity, self.bn_output):
            tree.update({f"{bn.name}/{k}": v for k, v in batch_norm_variables(bn).items()})
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(filters=self.filters, span=self.span, groups=self.groups, axis=self.axis, stride=self.stride,
                      epsilon=self.epsilon)
        return config


@register
class AxialBlock(keras.layers.Layer):
    """The AxialResNet bottleneck: 1x1 conv + BN + ReLU, height then width axial attention (the
    stride as average pooling after the width one), ReLU, 1x1 conv up to 2x `planes` + BN, plus
    the shortcut (a strided 1x1 conv + BN where the shape changes), ReLU.

    Args:
        planes: the attention width; the block outputs `2 * planes` channels.
        span: height and width of the block's input (the attention span).
        groups: attention heads.
        stride: 1 or 2.
        downsample: whether the shortcut is a projection (1x1 conv with `stride`, BN).
        epsilon: BatchNorm epsilon.
    """

    expansion = 2

    def __init__(self, planes, span, groups=8, stride=1, downsample=False, epsilon=BATCH_NORM_EPSILON, **kwargs):
        super().__init__(**kwargs)
        self.planes, self.span, self.groups, self.stride = int(planes), int(span), int(groups), int(stride)
        self.downsample, self.epsilon = bool(downsample), float(epsilon)
        dtype = self.dtype_policy
        out = self.expansion * self.planes

        def conv(filters, name, strides=1):
            return keras.layers.Conv2D(
                filters, 1, strides=strides, use_bias=False, dtype=dtype, name=name,
                kernel_initializer=_init(keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")),
            )

        self.conv_down = conv(self.planes, "conv_down")
        self.bn1 = _batch_norm("bn1", -1, epsilon, dtype)
        self.hight_block = AxialAttention(self.planes, self.span, groups, "height", 1, epsilon, dtype=dtype,
                                          name="hight_block")
        self.width_block = AxialAttention(self.planes, self.span, groups, "width", self.stride, epsilon, dtype=dtype,
                                          name="width_block")
        self.conv_up = conv(out, "conv_up")
        # The original starts each residual branch at zero (its last BN's scale is 0).
        self.bn2 = keras.layers.BatchNormalization(
            axis=-1, epsilon=epsilon, momentum=BATCH_NORM_MOMENTUM, gamma_initializer="zeros", dtype=dtype, name="bn2"
        )
        if self.downsample:
            self.down_conv = conv(out, "downsample_conv", self.stride)
            self.down_bn = _batch_norm("downsample_bn", -1, epsilon, dtype)

    def build(self, input_shape):
        b, h, w, c = input_shape
        for n in (h, w):
            if n is not None and n != self.span:
                raise ValueError(
                    f"AxialBlock {self.name!r}: its input is {h}x{w} but its span is {self.span}; the attention's "
                    "relative embeddings cover exactly `span` positions along each axis."
                )
        if self.stride > 1 and self.span % self.stride:
            raise ValueError(
                f"AxialBlock {self.name!r}: span {self.span} is not divisible by its stride {self.stride} (the average "
                "pool and the strided shortcut would disagree on the output size)."
            )
        grid = (b, self.span, self.span, self.planes)
        self.conv_down.build(input_shape)
        self.bn1.build(grid)
        self.hight_block.build(grid)
        self.width_block.build(grid)
        pooled = (b, self.span // self.stride, self.span // self.stride, self.planes)
        self.conv_up.build(pooled)
        self.bn2.build(pooled[:3] + (self.expansion * self.planes,))
        if self.downsample:
            self.down_conv.build(input_shape)
            self.down_bn.build(pooled[:3] + (self.expansion * self.planes,))

    def call(self, x, training=None):
        out = ops.relu(self.bn1(self.conv_down(x), training=training))
        out = self.hight_block(out, training=training)
        out = ops.relu(self.width_block(out, training=training))
        out = self.bn2(self.conv_up(out), training=training)
        shortcut = self.down_bn(self.down_conv(x), training=training) if self.downsample else x
        return ops.relu(out + shortcut)

    def compute_output_shape(self, input_shape):
        b, h, w, _ = input_shape
        s = self.stride
        return (b, None if h is None else h // s, None if w is None else w // s, self.expansion * self.planes)

    def weight_tree_variables(self):
        """{name: variable} under the original's module names (`conv_down/kernel`,
        `hight_block/relative`, `downsample/0/kernel`, `downsample/1/gamma`, ...)."""
        tree = {"conv_down/kernel": self.conv_down.kernel, "conv_up/kernel": self.conv_up.kernel}
        tree.update({f"bn1/{k}": v for k, v in batch_norm_variables(self.bn1).items()})
        tree.update({f"bn2/{k}": v for k, v in batch_norm_variables(self.bn2).items()})
        for block in (self.hight_block, self.width_block):
            tree.update({f"{block.name}/{k}": v for k, v in block.weight_tree_variables().items()})
        if self.downsample:
            tree["downsample/0/kernel"] = self.down_conv.kernel
            tree.update({f"downsample/1/{k}": v for k, v in batch_norm_variables(self.down_bn).items()})
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(planes=self.planes, span=self.span, groups=self.groups, stride=self.stride,
                      downsample=self.downsample, epsilon=self.epsilon)
        return config
