"""EfficientNet as timm's TF ports build it (`tf_efficientnet_b0` ... `b7`, `tf_efficientnet_l2`):
the Noisy Student baselines of the paper's Table 2.

A 3x3 stride-2 stem convolution with BatchNorm and SiLU; seven stages of blocks (see
keras_vit.models.efficientnet_family for the plan): a depthwise-separable block (depthwise 3x3,
BatchNorm, SiLU, squeeze-excitation, pointwise projection, BatchNorm) and inverted residuals
(pointwise expansion x6, BatchNorm, SiLU, depthwise k x k, BatchNorm, SiLU, squeeze-excitation,
pointwise projection, BatchNorm), the input added back where the shapes allow (after drop path
in training); a 1x1 head convolution with BatchNorm and SiLU, global average pooling, dropout and
the classifier. Squeeze-excitation: global mean, 1x1 convolution to a quarter of the block's input
channels, SiLU, 1x1 convolution back, sigmoid gate. Every BatchNorm has TensorFlow's eps 1e-3;
inference uses the running statistics.

Padding is TensorFlow's "SAME", from the actual input size: output ceil(n / stride), the extra
row and column of an even total padding at the bottom and right. Keras' `padding="same"`
computes exactly that on every backend, for any height and width (odd, non-square, or known only
at run time).

Why not `keras.applications.EfficientNetB0..B7`: the same architecture family, but it pads with
a fixed `ZeroPadding2D` before its strided convolutions (computed for the build size, symmetric
where TF "SAME" puts the extra pixel at the bottom/right, so other sizes and odd sizes shift the
receptive field), builds rescaling and normalisation into the graph, has no L2, and names its
weights its own way (`block1a_dwconv`, ...). The Noisy Student weights exist as timm's ports,
so this model keeps timm's numerics and module paths: a converted checkpoint is a renaming and a
transpose per tensor, and it reproduces timm's logits to float32 rounding at any input size.

Its weight tree keeps timm's module paths with Keras layouts and leaf names (`conv_stem/kernel`
(3, 3, 3, 32s), `blocks/1/0/conv_dw/kernel` (k, k, C, 1), `blocks/1/0/se/conv_reduce/kernel`
(1, 1, C, C / 24), `bn2/moving_variance`, `classifier/kernel` (C, classes)), given by
`EfficientNet.weight_tree_variables()`; keras_vit.checkpoints.timm_efficientnet reads timm's
files into it.
"""

import contextlib
import sys

import keras

from keras_vit import compilation
from keras_vit.backend_workarounds import TraceTrainStepOnce
from keras_vit.layers.heads import pooled_classifier
from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.resnet import batch_norm_variables
from keras_vit.models.config_model import (
    ConfigModel,
    config_from_arguments,
    expose_config_fields,
)
from keras_vit.models.export_method import DeploymentExport
from keras_vit.models.features import FeatureEndpoint, FeatureMaps
from keras_vit.models.fit_checks import CheckedLabels
from keras_vit.models.efficientnet_family import (
    BATCH_NORM_MOMENTUM,
    EfficientNetConfig,
    block_plan,
    head_channels,
    stem_channels,
)


@contextlib.contextmanager
def _recursion_limit(frames):
    """Python's recursion limit raised to at least `frames` for the block (restored after)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, frames))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def _conv_init():
    # timm's efficientnet_init_weights (and the original's): normal(0, sqrt(2 / fan_out)).
    return _init(keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal"))


def _layer_name(path):
    """A Keras layer name for a weight-tree path ("blocks/1/0/conv_dw" -> "blocks_1_0_conv_dw")."""
    return path.replace("/", "_")


@keras.saving.register_keras_serializable(package="keras_vit")
class EfficientNet(DeploymentExport, ConfigModel, FeatureMaps, CheckedLabels, TraceTrainStepOnce, keras.Model):
    """EfficientNet: a functional model whose layers carry timm's module paths.

    The arguments are the fields of `keras_vit.models.efficientnet_family.EfficientNetConfig`
    (normalised and validated there; `model.config` is that object, and each field reads as a
    model attribute: `model.width_multiplier`, ...); an EfficientNetConfig may also be passed as
    the only positional argument. Unknown keyword arguments raise a TypeError with a suggestion.

    Args:
        image_size: int or (height, width); None dimensions build a model for any size at run
            time (the network is fully convolutional).
        width_multiplier: scales every channel count (rounded to multiples of 8): 1.0 for B0,
            4.3 for L2.
        depth_multiplier: scales every stage's repeats (rounded up): 1.0 for B0, 5.3 for L2.
        classes: size of the classifier.
        include_top: whether to end in global average pooling, dropout and the classifier.
        pooling: with include_top=False: None returns the (batch, h, w, channels) features after
            the head convolution; "avg" (alias "gap") or "max" pool them to (batch, channels).
        classifier_activation: activation of the classifier ("softmax", None for logits, ...).
        dropout_rate: dropout before the classifier in training.
        drop_path_rate: stochastic depth in training: block i of n drops its residual branch
            with probability drop_path_rate * i / n (timm's rule).
        batch_norm_epsilon: every BatchNorm's epsilon (TensorFlow's 1e-3).
        num_channels: input channels.
        name, dtype, trainable: as for any Keras model.

    Example:
        >>> model = EfficientNet(image_size=64, width_multiplier=0.25, depth_multiplier=0.3, classes=10)
        >>> model.output_shape
        (None, 10)
    """

    def __init__(self, config=None, /, *, name=None, dtype=None, trainable=True, **kwargs):
        config = config_from_arguments(EfficientNetConfig, config, kwargs, "EfficientNet")
        eps = config.batch_norm_epsilon

        def conv(path, filters, kernel, stride=1, bias=False):
            return keras.layers.Conv2D(
                filters, kernel, strides=stride, padding="same", use_bias=bias, kernel_initializer=_conv_init(),
                bias_initializer="zeros", dtype=dtype, name=_layer_name(path),
            )

        def norm(path):
            return keras.layers.BatchNormalization(
                epsilon=eps, momentum=BATCH_NORM_MOMENTUM, dtype=dtype, name=_layer_name(path)
            )

        def silu(path):
            return keras.layers.Activation("silu", dtype=dtype, name=_layer_name(path))

        # === Layers / graph ===
        height, width = config.image_size
        images = keras.Input(shape=(height, width, config.num_channels), name="images")
        x = conv("conv_stem", stem_channels(config.width_multiplier), 3, 2)(images)
        x = silu("act1")(norm("bn1")(x))
        plan = block_plan(config.width_multiplier, config.depth_multiplier)
        for number, block in enumerate(plan):
            p = block.prefix
            shortcut = x
            if block.kind == "ir":
                x = conv(p + "conv_pw", block.mid_channels, 1)(x)
                x = silu(p + "act1")(norm(p + "bn1")(x))
            x = keras.layers.DepthwiseConv2D(
                block.kernel, strides=block.stride, padding="same", use_bias=False,
                depthwise_initializer=_conv_init(), dtype=dtype, name=_layer_name(p + "conv_dw"),
            )(x)
            after_dw = "bn2" if block.kind == "ir" else "bn1"
            x = silu(p + ("act2" if block.kind == "ir" else "act1"))(norm(p + after_dw)(x))
            # Squeeze-excitation.
            s = keras.layers.GlobalAveragePooling2D(keepdims=True, dtype=dtype, name=_layer_name(p + "se/pool"))(x)
            s = conv(p + "se/conv_reduce", block.se_channels, 1, bias=True)(s)
            s = silu(p + "se/act1")(s)
            s = conv(p + "se/conv_expand", block.mid_channels, 1, bias=True)(s)
            s = keras.layers.Activation("sigmoid", dtype=dtype, name=_layer_name(p + "se/gate"))(s)
            x = keras.layers.Multiply(dtype=dtype, name=_layer_name(p + "se/scale"))([x, s])
            last = ("conv_pwl", "bn3") if block.kind == "ir" else ("conv_pw", "bn2")
            x = norm(p + last[1])(conv(p + last[0], block.out_channels, 1)(x))
            if block.residual:
                rate = config.drop_path_rate * number / len(plan)
                if rate > 0:  # drops the whole residual branch of a sample: one draw per sample
                    x = keras.layers.Dropout(rate, noise_shape=(None, 1, 1, 1), dtype=dtype,
                                             name=_layer_name(p + "drop_path"))(x)
                x = keras.layers.Add(dtype=dtype, name=_layer_name(p + "add"))([x, shortcut])
        x = conv("conv_head", head_channels(config.width_multiplier), 1)(x)
        x = silu("act2")(norm("bn2")(x))

        def head(x):  # timm's dropout before the classifier (trained with it)
            if config.dropout_rate > 0:
                x = keras.layers.Dropout(config.dropout_rate, dtype=dtype, name="dropout")(x)
            return keras.layers.Dense(
                config.classes, dtype=dtype, name="classifier",
                kernel_initializer=_init(keras.initializers.VarianceScaling(1.0 / 3.0, "fan_out", "uniform")),
            )(x)

        x = pooled_classifier(x, config, dtype, pool="global_pool", max_pool="global_max_pool", head=head)
        # Keras maps a functional graph by recursing once per layer along its longest path: about
        # 1,050 layers for L2, over Python's default limit of 1,000 frames (reached sooner from a
        # deeper caller such as a notebook or a test runner's thread).
        with _recursion_limit(20 * len(plan) + 2_000):
            super().__init__(inputs=images, outputs=x, name=name or "efficientnet", trainable=trainable)
        compilation.configure_model(self)
        self._keep_config(config)

    @property
    def stride(self):
        """Input pixels per position of the final feature map."""
        return 32

    def weight_tree_variables(self):
        """{canonical key: keras.Variable}: timm's module paths, Keras layouts."""
        tree = {}

        def add(path, leaves):
            layer = self.get_layer(_layer_name(path))
            if isinstance(layer, keras.layers.BatchNormalization):
                tree.update({f"{path}/{k}": v for k, v in batch_norm_variables(layer).items()})
            else:
                tree[f"{path}/kernel"] = layer.kernel
                if "bias" in leaves:
                    tree[f"{path}/bias"] = layer.bias

        add("conv_stem", ())
        add("bn1", ())
        for block in block_plan(self.width_multiplier, self.depth_multiplier):
            p = block.prefix
            names = ("conv_pw", "bn1", "conv_dw", "bn2", "conv_pwl", "bn3") if block.kind == "ir" else (
                "conv_dw", "bn1", "conv_pw", "bn2")
            for module in names:
                add(p + module, ())
            add(p + "se/conv_reduce", ("bias",))
            add(p + "se/conv_expand", ("bias",))
        add("conv_head", ())
        add("bn2", ())
        if self.include_top:
            add("classifier", ("bias",))
        return tree

    def _feature_endpoints(self):
        # timm's stage ends: the last block of every stage that the next one downsamples, and of
        # the last stage (B0: reductions 2, 4, 8, 16, 32).
        plan = block_plan(self.width_multiplier, self.depth_multiplier)
        endpoints, reduction = [], 2
        for number, block in enumerate(plan):
            reduction *= block.stride
            following = plan[number + 1] if number + 1 < len(plan) else None
            if following is None or (following.stage != block.stage and following.stride > 1):
                p = block.prefix
                last = "add" if block.residual else ("bn3" if block.kind == "ir" else "bn2")
                endpoints.append(FeatureEndpoint(_layer_name(p + last), reduction))
        return endpoints

    def _final_feature_layer(self):
        return "act2"


# Every config field reads as a model attribute; help() and IDEs show them as keyword arguments.
expose_config_fields(EfficientNet, EfficientNetConfig)
