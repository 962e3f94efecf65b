"""AxialResNet (Wang et al., "Axial-DeepLab", ECCV 2020): the paper's D.6 baseline, as
csrhddlam/axial-deeplab's `lib/models/axialnet.py` builds it.

A ResNet-50 layout whose bottleneck 3x3 convolution is a height then a width position-sensitive
axial attention (keras_vit.layers.axial), with `s` scaling every width: a 7x7 stride-2 stem conv
with BatchNorm and ReLU, a 3x3 stride-2 max pool, four stages of `AxialBlock`s of 128s, 256s,
512s and 1024s attention channels (outputs twice that), global average pooling and a linear
head. Every norm is a BatchNorm (PyTorch's eps 1e-5); inference uses the running statistics.

Its weight tree keeps the original's module paths with Keras layouts and leaf names
(`conv1/kernel` (7, 7, 3, 64s), `layer1/0/hight_block/qkv_transform/kernel` (in, 2 * out),
`layer1/0/hight_block/relative` (2 * head width, 2 * span - 1), `layer2/0/downsample/1/gamma`,
`fc/kernel` (in, classes), BatchNorms as gamma, beta, moving_mean, moving_variance), given by
`AxialResNet.weight_tree_variables()`; keras_vit.checkpoints.axial_deeplab reads the original's
files into it.

Spans are fixed per block by the image size (see keras_vit.models.axial_resnet_family): 224 px
gives the original's 56, 56, 28, 14; other square sizes whose stem grid halves evenly build a
network of other spans, which the original's weights do not fit.
"""

import keras

from keras_vit import compilation
from keras_vit.backend_workarounds import TraceTrainStepOnce
from keras_vit.layers.axial import BATCH_NORM_MOMENTUM, AxialBlock
from keras_vit.layers.heads import pooled_classifier
from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.resnet import MaxPoolZeroPad, batch_norm_variables
from keras_vit.models.axial_resnet_family import AxialResNetConfig
from keras_vit.models.config_model import (
    ConfigModel,
    config_from_arguments,
    expose_config_fields,
)
from keras_vit.models.export_method import DeploymentExport
from keras_vit.models.features import FeatureEndpoint, FeatureMaps
from keras_vit.models.fit_checks import CheckedLabels


@keras.saving.register_keras_serializable(package="keras_vit")
class AxialResNet(DeploymentExport, ConfigModel, FeatureMaps, CheckedLabels, TraceTrainStepOnce, keras.Model):
    """AxialResNet: a functional model whose layers carry the original's module names.

    The arguments are the fields of `keras_vit.models.axial_resnet_family.AxialResNetConfig`
    (normalised and validated there; `model.config` is that object, and each field reads as a
    model attribute: `model.width_multiplier`, ...); an AxialResNetConfig may also be passed as
    the only positional argument. Unknown keyword arguments raise a TypeError with a suggestion.

    Args:
        image_size: int or (height, width), square; sets every block's attention span (224 for
            the original's weights). Sizes that cannot work raise a ValueError saying why.
        block_units: blocks per stage, (1, 2, 4, 1) for 26-S, (3, 4, 6, 3) for the 50s.
        width_multiplier: the original's `s` (0.5 S, 0.75 M, 1 L); fractions such as 0.25 make
            small test models.
        groups: attention heads per axial attention (8 in the original).
        classes: size of the linear head.
        include_top: whether to end in global average pooling and the head.
        pooling: with include_top=False: None returns the (batch, h, w, channels) features of
            the last stage; "avg" (alias "gap") or "max" pool them to (batch, channels).
        classifier_activation: activation of the head ("softmax", None for logits, ...).
        batch_norm_epsilon: every BatchNorm's epsilon (PyTorch's 1e-5).
        num_channels: input channels.
        name, dtype, trainable: as for any Keras model.

    Example:
        >>> model = AxialResNet(image_size=32, block_units=(1, 1), width_multiplier=0.25, classes=10)
        >>> model.output_shape
        (None, 10)
    """

    def __init__(self, config=None, /, *, name=None, dtype=None, trainable=True, **kwargs):
        config = config_from_arguments(AxialResNetConfig, config, kwargs, "AxialResNet")
        height, width = config.image_size
        spans = config.spans
        s, eps = config.width_multiplier, config.batch_norm_epsilon

        # === Layers / graph ===
        images = keras.Input(shape=(height, width, config.num_channels), name="images")
        x = keras.layers.ZeroPadding2D(3, dtype=dtype, name="conv1_pad")(images)
        x = keras.layers.Conv2D(
            int(64 * s), 7, strides=2, use_bias=False, dtype=dtype, name="conv1",
            kernel_initializer=_init(keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")),
        )(x)
        x = keras.layers.BatchNormalization(epsilon=eps, momentum=BATCH_NORM_MOMENTUM, dtype=dtype, name="bn1")(x)
        x = keras.layers.ReLU(dtype=dtype, name="relu")(x)
        # Zero padding equals PyTorch's -inf padding here: the pool follows a ReLU.
        x = MaxPoolZeroPad(3, 2, 1, dtype=dtype, name="maxpool")(x)
        inplanes, index = int(64 * s), 0
        for stage, units in enumerate(config.block_units):
            planes = int(128 * 2**stage * s)
            for unit in range(units):
                span, stride = spans[index]
                index += 1
                x = AxialBlock(
                    planes, span, config.groups, stride,
                    downsample=unit == 0 and (stride != 1 or inplanes != AxialBlock.expansion * planes),
                    epsilon=eps, dtype=dtype, name=f"layer{stage + 1}_{unit}",
                )(x)
                inplanes = AxialBlock.expansion * planes
        x = pooled_classifier(x, config, dtype, pool="avgpool", max_pool="maxpool_features",
                              head=lambda x: keras.layers.Dense(config.classes, dtype=dtype, name="fc")(x))
        super().__init__(inputs=images, outputs=x, name=name or "axial_resnet", trainable=trainable)
        compilation.configure_model(self)
        self._keep_config(config)

    @property
    def stride(self):
        """Input pixels per position of the final feature map."""
        return 4 * 2 ** (len(self.block_units) - 1)

    @property
    def spans(self):
        """[(span, stride)] of every block, in order."""
        return self.config.spans

    def weight_tree_variables(self):
        """{canonical key: keras.Variable}: the original's module paths, Keras layouts."""
        tree = {"conv1/kernel": self.get_layer("conv1").kernel}
        tree.update({f"bn1/{k}": v for k, v in batch_norm_variables(self.get_layer("bn1")).items()})
        for stage, units in enumerate(self.block_units):
            for unit in range(units):
                block = self.get_layer(f"layer{stage + 1}_{unit}")
                tree.update({f"layer{stage + 1}/{unit}/{k}": v for k, v in block.weight_tree_variables().items()})
        if self.include_top:
            head = self.get_layer("fc")
            tree["fc/kernel"] = head.kernel
            tree["fc/bias"] = head.bias
        return tree

    def _feature_endpoints(self):
        # As timm's ResNets: the stem's ReLU (before the pool), then the last block of every stage.
        return [FeatureEndpoint("relu", 2)] + [
            FeatureEndpoint(f"layer{stage + 1}_{units - 1}", 4 * 2**stage) for stage, units in enumerate(self.block_units)
        ]

    def _final_feature_layer(self):
        return f"layer{len(self.block_units)}_{self.block_units[-1] - 1}"


# Every config field reads as a model attribute; help() and IDEs show them as keyword arguments.
expose_config_fields(AxialResNet, AxialResNetConfig)
