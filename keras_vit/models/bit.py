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

from keras_vit.layers.resnet import GroupNorm, MaxPoolZeroPad, PreActResNetStage, StdConv2D
from keras_vit.models.config import BIT_NUMERICS

_POOLING = (None, "avg", "gap", "max")


def _image_shape(image_size):
    if image_size is None:
        return None, None
    if isinstance(image_size, int):
        return image_size, image_size
    size = tuple(None if s is None else int(s) for s in image_size)
    if len(size) != 2:
        raise ValueError(f"image_size must be an int, (height, width) or None; got {image_size!r}.")
    return size


@keras.saving.register_keras_serializable(package="keras_vit")
class BiTResNet(TraceTrainStepOnce, keras.Model):
    """BiT ResNet-v2: a functional model whose layers carry big_transfer's module names.

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
            weights' source (default timm's, `keras_vit.models.config.BIT_NUMERICS`).
        num_channels: input channels.
        name, dtype: as for any Keras model.

    Example:
        >>> model = BiTResNet(image_size=64, block_units=(1, 1), width_factor=0.5, classes=10)
        >>> model.output_shape
        (None, 10)
    """

    def __init__(
        self,
        *,
        image_size=224,
        block_units=(3, 4, 6, 3),
        width_factor=1,
        classes=1000,
        include_top=True,
        pooling=None,
        classifier_activation="softmax",
        group_norm_epsilon=BIT_NUMERICS["group_norm_epsilon"],
        std_conv_epsilon=BIT_NUMERICS["std_conv_epsilon"],
        std_conv_epsilon_inside_sqrt=BIT_NUMERICS["std_conv_epsilon_inside_sqrt"],
        num_channels=3,
        name=None,
        dtype=None,
        **kwargs,
    ):
        height, width = _image_shape(image_size)
        block_units = tuple(int(u) for u in block_units)
        if not block_units or any(u < 1 for u in block_units):
            raise ValueError(
                f"block_units must be one or more positive unit counts, e.g. (3, 4, 6, 3); got {block_units!r}."
            )
        if pooling not in _POOLING:
            raise ValueError(f"pooling must be one of None, 'avg' (alias 'gap') or 'max'; got {pooling!r}.")
        if include_top and (classes is None or int(classes) < 1):
            raise ValueError(f"include_top=True needs a positive number of classes; got classes={classes!r}.")
        root = 64 * width_factor
        if root != int(root) or int(root) % 32:
            raise ValueError(
                f"width_factor {width_factor} gives a {root}-channel stem; GroupNorm's 32 groups need a multiple "
                "of 32 (width_factor 0.5, 1, 1.5, 2, ...)."
            )
        root = int(root)
        numerics = dict(
            group_norm_epsilon=group_norm_epsilon,
            std_conv_epsilon=std_conv_epsilon,
            std_conv_epsilon_inside_sqrt=std_conv_epsilon_inside_sqrt,
        )

        # === Layers / graph ===
        images = keras.Input(shape=(height, width, num_channels), name="images")
        x = StdConv2D(
            root, 7, 2, std_conv_epsilon, std_conv_epsilon_inside_sqrt, padding="symmetric", dtype=dtype,
            name="root_block",
        )(images)
        x = MaxPoolZeroPad(3, 2, 1, dtype=dtype, name="root_pool")(x)
        for i, n in enumerate(block_units):
            x = PreActResNetStage(n, root * 2**i, 1 if i == 0 else 2, dtype=dtype, name=f"block{i + 1}", **numerics)(x)
        x = GroupNorm(32, group_norm_epsilon, relu=True, dtype=dtype, name="group_norm")(x)
        if include_top:
            x = keras.layers.GlobalAveragePooling2D(keepdims=True, dtype=dtype, name="pool")(x)
            x = keras.layers.Conv2D(
                classes, 1, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype, name="head"
            )(x)
            x = keras.layers.Flatten(dtype=dtype, name="flatten")(x)
            x = keras.layers.Activation(classifier_activation, dtype="float32", name="predictions")(x)
        elif pooling in ("avg", "gap"):
            x = keras.layers.GlobalAveragePooling2D(dtype=dtype, name="pool")(x)
        elif pooling == "max":
            x = keras.layers.GlobalMaxPooling2D(dtype=dtype, name="pool")(x)
        super().__init__(inputs=images, outputs=x, name=name or "bit_resnet", **kwargs)
        compilation.configure_model(self)

        # === Config ===
        self.image_size = (height, width)
        self.block_units = block_units
        self.width_factor = width_factor
        self.classes = None if classes is None else int(classes)
        self.include_top = bool(include_top)
        self.pooling = pooling
        self.classifier_activation = keras.activations.serialize(keras.activations.get(classifier_activation))
        self.group_norm_epsilon = float(group_norm_epsilon)
        self.std_conv_epsilon = float(std_conv_epsilon)
        self.std_conv_epsilon_inside_sqrt = bool(std_conv_epsilon_inside_sqrt)
        self.num_channels = int(num_channels)

    @property
    def stride(self):
        """Input pixels per position of the final feature map."""
        return 4 * 2 ** (len(self.block_units) - 1)

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

    def get_config(self):
        return {
            "image_size": list(self.image_size),
            "block_units": list(self.block_units),
            "width_factor": self.width_factor,
            "classes": self.classes,
            "include_top": self.include_top,
            "pooling": self.pooling,
            "classifier_activation": self.classifier_activation,
            "group_norm_epsilon": self.group_norm_epsilon,
            "std_conv_epsilon": self.std_conv_epsilon,
            "std_conv_epsilon_inside_sqrt": self.std_conv_epsilon_inside_sqrt,
            "num_channels": self.num_channels,
            "name": self.name,
            "trainable": self.trainable,
        }

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        if "dtype" in config and isinstance(config["dtype"], dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def is_bit_config(config):
    """Whether a checkpoint/model config describes a BiTResNet (not a VisionTransformer)."""
    return isinstance(config, dict) and "block_units" in config
