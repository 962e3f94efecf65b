"""BiT ResNet-v2 (Kolesnikov et al., "Big Transfer", 2020): the paper's CNN baselines.

A pre-activation bottleneck ResNet with GroupNorm and weight-standardised convolutions, built
from the same StdConv2D / GroupNorm layers as the R+ViT hybrids. It computes what timm's port
of big_transfer computes (`timm.models.resnetv2`, `resnetv2_*_bit`): symmetric padding, a zero-
padded max pool in the stem, GN+ReLU before every unit and once more before the head.

Its weight tree is the big_transfer .npz layout (`resnet/root_block/standardized_conv2d/kernel`,
`resnet/block1/unit01/a/group_norm/gamma`, ..., `resnet/head/conv2d/kernel`), given by
`BiTResNet.weight_tree_variables()`, so `keras_vit.get_weight_tree` / `set_weight_tree` work as
for the ViTs.
"""

import keras

from keras_vit import compilation
from keras_vit.backend_workarounds import TraceTrainStepOnce

from keras_vit.layers.heads import pooled_classifier
from keras_vit.layers.resnet import GroupNorm, MaxPoolZeroPad, PreActResNetStage, StdConv2D
from keras_vit.models.bit_family import BiTConfig
from keras_vit.models.config_model import (
    ConfigModel,
    config_from_arguments,
    expose_config_fields,
)
from keras_vit.models.export_method import DeploymentExport
from keras_vit.models.features import FeatureEndpoint, FeatureMaps
from keras_vit.models.fit_checks import CheckedLabels


@keras.saving.register_keras_serializable(package="keras_vit")
class BiTResNet(DeploymentExport, ConfigModel, FeatureMaps, CheckedLabels, TraceTrainStepOnce, keras.Model):
    """BiT ResNet-v2: a functional model whose layers carry big_transfer's module names.

    The arguments are the fields of `keras_vit.models.bit_family.BiTConfig` (normalised and
    validated there; `model.config` is that object, and each field reads as a model attribute:
    `model.block_units`, ...); a BiTConfig may also be passed as the only positional argument.
    Unknown keyword arguments raise a TypeError with a suggestion.

    Args:
        image_size: int, (height, width), or None (any size: the network is fully convolutional;
            a dimension may also be None alone).
        block_units: units per stage, e.g. (3, 4, 6, 3) for ResNet-50.
        width_factor: the width multiplier w: stem 64w channels, stage i bottlenecks 64w*2^i
            wide with 256w*2^i outputs. Fractions (e.g. 0.5) make small test models.
        classes: size of the classification head.
        include_top: whether to end in the head (GN+ReLU, global average pool, 1x1 conv).
        pooling: with include_top=False: None returns the (batch, h, w, channels) features after
            the final GN+ReLU; "avg" (alias "gap") or "max" pool them to (batch, channels).
        classifier_activation: activation of the head ("softmax", None for logits, ...).
        group_norm_epsilon, std_conv_epsilon, std_conv_epsilon_inside_sqrt: the numerics of the
            weights' source (default timm's, `keras_vit.models.bit_family.BIT_NUMERICS`).
        num_channels: input channels.
        name, dtype, trainable: as for any Keras model.

    Example:
        >>> model = BiTResNet(image_size=64, block_units=(1, 1), width_factor=0.5, classes=10)
        >>> model.output_shape
        (None, 10)
    """

    def __init__(self, config=None, /, *, name=None, dtype=None, trainable=True, **kwargs):
        config = config_from_arguments(BiTConfig, config, kwargs, "BiTResNet")
        (height, width), block_units, width_factor = config.image_size, config.block_units, config.width_factor
        root = int(64 * width_factor)
        numerics = dict(
            group_norm_epsilon=config.group_norm_epsilon,
            std_conv_epsilon=config.std_conv_epsilon,
            std_conv_epsilon_inside_sqrt=config.std_conv_epsilon_inside_sqrt,
        )

        # === Layers / graph ===
        images = keras.Input(shape=(height, width, config.num_channels), name="images")
        x = StdConv2D(
            root, 7, 2, config.std_conv_epsilon, config.std_conv_epsilon_inside_sqrt, padding="symmetric", dtype=dtype,
            name="root_block",
        )(images)
        x = MaxPoolZeroPad(3, 2, 1, dtype=dtype, name="root_pool")(x)
        for i, n in enumerate(block_units):
            x = PreActResNetStage(n, root * 2**i, 1 if i == 0 else 2, dtype=dtype, name=f"block{i + 1}", **numerics)(x)
        x = GroupNorm(32, config.group_norm_epsilon, relu=True, dtype=dtype, name="group_norm")(x)

        def head(x):  # big_transfer's 1x1 convolution on the kept 1x1 map
            x = keras.layers.Conv2D(
                config.classes, 1, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype, name="head"
            )(x)
            return keras.layers.Flatten(dtype=dtype, name="flatten")(x)

        x = pooled_classifier(x, config, dtype, pool="pool", head=head, keepdims=True)
        super().__init__(inputs=images, outputs=x, name=name or "bit_resnet", trainable=trainable)
        compilation.configure_model(self)
        self._keep_config(config)

    @property
    def stride(self):
        """Input pixels per position of the final feature map."""
        return self.config.stride

    @property
    def stages(self):
        """The PreActResNetStage layers `block1..blockN` in order."""
        return [self.get_layer(f"block{i + 1}") for i in range(len(self.block_units))]

    def weight_tree_variables(self):
        """{big_transfer .npz key: keras.Variable} for every weight of the model."""
        tree = {"resnet/root_block/standardized_conv2d/kernel": self.get_layer("root_block").kernel}
        for stage in self.stages:
            tree.update({f"resnet/{stage.name}/{k}": v for k, v in stage.weight_tree_variables().items()})
        norm = self.get_layer("group_norm")
        tree["resnet/group_norm/gamma"] = norm.scale
        tree["resnet/group_norm/beta"] = norm.bias
        if self.include_top:
            head = self.get_layer("head")
            tree["resnet/head/conv2d/kernel"] = head.kernel
            tree["resnet/head/conv2d/bias"] = head.bias
        return tree

    def _feature_endpoints(self):
        # timm's ResNetV2: the stem convolution (before its pool), then every stage; the final
        # GroupNorm+ReLU normalises the last stage.
        stages = len(self.block_units)
        return [FeatureEndpoint("root_block", 2)] + [
            FeatureEndpoint(f"block{i + 1}", 4 * 2**i, "group_norm" if i == stages - 1 else None)
            for i in range(stages)
        ]

    def _final_feature_layer(self):
        return "group_norm"


# Every config field reads as a model attribute; help() and IDEs show them as keyword arguments.
expose_config_fields(BiTResNet, BiTConfig)
