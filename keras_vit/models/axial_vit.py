"""Axial-ViT (the paper's Appendix D.6), as keras_vit reads it: the patch grid stays 2-D and every
Transformer layer is a row Axial Transformer block followed by a column one.

The config, the architecture table, the FLOP count and the family record live in
`keras_vit.models.axial_vit_family` (no Keras there); this module builds the model.
"""

import keras

from keras_vit import compilation
from keras_vit.backend_workarounds import TraceTrainStepOnce
from keras_vit.layers.axial_transformer import AxialEncoderBlock
from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.position import PositionEmbedding
from keras_vit.layers.quantized import Dense
from keras_vit.layers.transformer import PatchEmbedding
from keras_vit.models.axial_vit_family import AxialViTConfig
from keras_vit.models.config_model import ConfigModel, config_from_arguments, expose_config_fields
from keras_vit.models.export_method import DeploymentExport
from keras_vit.models.features import FeatureEndpoint, FeatureMaps
from keras_vit.models.fit_checks import CheckedLabels


def _graph(c, dtype):
    """(inputs, outputs) of the functional model described by the AxialViTConfig `c`."""
    rows, cols = c.grid_size
    images = keras.Input(shape=(*c.image_size, c.num_channels), name="images")
    x = PatchEmbedding(c.hidden_size, c.patch_size, dtype=dtype, name="embedding")(images)  # (batch, rows*cols, d)
    x = PositionEmbedding((rows, cols), 0, resize_rule=c.position_embedding_resize, dtype=dtype,
                          name="posembed_input")(x)
    x = keras.layers.Dropout(c.dropout_rate, dtype=dtype, name="dropout")(x)
    x = keras.layers.Reshape((rows, cols, c.hidden_size), dtype=dtype, name="grid")(x)  # tokens are row-major
    extra = {"remat": True} if c.remat else {}
    for i in range(c.num_layers):
        for axis in c.attention_axes:
            x = AxialEncoderBlock(
                axis,
                c.num_heads,
                c.mlp_dim,
                dropout_rate=c.dropout_rate,
                attention_dropout_rate=c.attention_dropout_rate,
                layer_norm_epsilon=c.layer_norm_epsilon,
                gelu_approximate=c.gelu_approximate,
                dtype=dtype,
                name=f"encoderblock_{i}_{axis}",
                **extra,
            )(x)
    x = keras.layers.LayerNormalization(epsilon=c.layer_norm_epsilon, dtype=dtype, name="encoder_norm")(x)
    if c.include_top or c.pooling is not None:
        if c.pooling == "max":
            x = keras.layers.GlobalMaxPooling2D(dtype=dtype, name="pool")(x)
        else:
            x = keras.layers.GlobalAveragePooling2D(dtype=dtype, name="pool")(x)
        if c.representation_size is not None:
            x = Dense(c.representation_size, activation="tanh", kernel_initializer=_init("glorot_uniform"),
                      dtype=dtype, name="pre_logits")(x)
    if c.include_top:
        x = Dense(c.classes, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype, name="head")(x)
        x = keras.layers.Activation(c.classifier_activation, dtype="float32", name="predictions")(x)
    return images, x


@keras.saving.register_keras_serializable(package="keras_vit")
class AxialVisionTransformer(
    DeploymentExport, ConfigModel, FeatureMaps, CheckedLabels, TraceTrainStepOnce, keras.Model
):
    """Axial-ViT (Appendix D.6 of Dosovitskiy et al., 2021), keras_vit's reading of it.

    The patches stay a (rows, cols) grid: ViT's patch embedding (`embedding`), no class token,
    a learned position embedding over the grid (`Transformer/posembed_input`); each layer `i` is
    the blocks `encoderblock_{i}_row` (pre-LN multi-head attention along the width within each
    row, residual; pre-LN MLP, residual) and `encoderblock_{i}_column` (the same along the
    height); a final LayerNorm `encoder_norm`, global average pooling over the grid, optional
    `pre_logits` (Dense + tanh) and the zero-initialised `head`. Weight names follow the ViT's
    (`get_weight_tree` gives e.g. `Transformer/encoderblock_0_row/MlpBlock_3/Dense_0/kernel`).

    The arguments are the fields of `keras_vit.models.axial_vit_family.AxialViTConfig`; the model
    is built for one input size (position embeddings loaded from another grid are resized).

    `attention_weights(images)` returns every block's attention maps: {"row": (layers, batch,
    rows, heads, cols, cols), "column": (layers, batch, cols, heads, rows, rows)}.

    Example:
        >>> model = AxialVisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...     num_layers=1, num_heads=2, mlp_dim=32, classes=10)
        >>> model.output_shape
        (None, 10)
    """

    def __init__(self, config=None, /, *, name=None, dtype=None, trainable=True, **kwargs):
        config = config_from_arguments(AxialViTConfig, config, kwargs, "AxialVisionTransformer")
        activation = config.classifier_activation
        if activation is None:
            config = config.replace(classifier_activation="linear")
        elif not isinstance(activation, str):
            config = config.replace(classifier_activation=keras.activations.serialize(keras.activations.get(activation)))
        inputs, outputs = _graph(config, dtype)
        super().__init__(inputs=inputs, outputs=outputs, name=name or "axial_vision_transformer", trainable=trainable)
        compilation.configure_model(self)
        self._model_config = config

    @property
    def grid_size(self):
        return self.config.grid_size

    @property
    def stride(self):
        return self.config.patch_size

    @property
    def blocks(self):
        """The AxialEncoderBlock layers in order (row, column, row, ...)."""
        return [layer for layer in self.layers if isinstance(layer, AxialEncoderBlock)]

    def attention_weights(self, images):
        """Every block's softmax attention for `images` (batch, height, width, channels), as NumPy:
        {"row": (layers, batch, rows, heads, cols, cols), "column": (layers, batch, cols, heads,
        rows, rows)}. A row block's map [l, b, r, h, i, j] is how much the token in row r, column
        i attends to the token in the same row, column j."""
        import numpy as np

        x = keras.ops.convert_to_tensor(np.asarray(images, dtype="float32"))
        for layer in self.layers:
            if isinstance(layer, AxialEncoderBlock):
                break
            if not isinstance(layer, keras.layers.InputLayer):
                x = layer(x, training=False)
        maps = {axis: [] for axis in self.config.attention_axes}
        for block in self.blocks:
            x, weights = block(x, training=False, return_attention_weights=True)
            maps[block.axis].append(keras.ops.convert_to_numpy(weights))
        return {axis: np.stack(m) for axis, m in maps.items()}

    def _feature_endpoints(self):
        # One feature per layer: the grid after its last axial block, normed by the final LayerNorm.
        last = self.config.attention_axes[-1]
        return [FeatureEndpoint(f"encoderblock_{i}_{last}", self.stride, "encoder_norm") for i in range(self.num_layers)]

    def _final_feature_layer(self):
        return "encoder_norm"


# Every config field reads as a model attribute; help() and IDEs show them as keyword arguments.
expose_config_fields(AxialVisionTransformer, AxialViTConfig)
