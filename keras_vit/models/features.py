"""Feature maps for dense tasks: chosen blocks' outputs as (batch, H, W, C) grids or tokens."""

import keras
from keras import ops

register = keras.saving.register_keras_serializable(package="keras_vit")

OUTPUTS = ("nhwc", "tokens")


@register
class TokensToGrid(keras.layers.Layer):
    """(batch, prefix + rows * cols, C) tokens -> (batch, rows, cols, C), prefix tokens dropped.

    With `stride` set (models with `dynamic_image_size`), the layer is called as
    `layer(tokens, images)` and the grid is (height // stride, width // stride) of the images.
    """

    def __init__(self, grid_size, num_prefix_tokens=1, stride=None, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = None if stride is None else int(stride)

    def call(self, tokens, images=None):
        rows, cols = self.grid_size
        if self.stride is not None:
            shape = ops.shape(images)
            rows, cols = shape[1] // self.stride, shape[2] // self.stride
        return ops.reshape(tokens[:, self.num_prefix_tokens :], (-1, rows, cols, tokens.shape[-1]))

    def compute_output_spec(self, tokens, images=None):
        grid = self.grid_size if self.stride is None else (None, None)
        return keras.KerasTensor((tokens.shape[0], *grid, tokens.shape[-1]), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=list(self.grid_size), num_prefix_tokens=self.num_prefix_tokens)
        if self.stride is not None:
            config.update(stride=self.stride)
        return config


def _layer_name(model, layer):
    if isinstance(layer, int):
        index = layer if layer >= 0 else model.num_layers + layer
        if not 0 <= index < model.num_layers:
            raise ValueError(f"Block index {layer} is out of range for a model of {model.num_layers} blocks.")
        return f"encoderblock_{index}"
    names = [x.name for x in model.layers]
    if layer not in names:
        from keras_vit.models.config import suggest

        raise ValueError(
            f"{model.name} has no layer {layer!r}{suggest(str(layer), names)}; pass block indices (0, -1, ...) or "
            "layer names such as 'encoderblock_3' or 'encoder_norm'."
        )
    return layer


def feature_extractor(model, layers=(-1,), output="nhwc", name=None):
    """A keras.Model giving the outputs of `model`'s chosen blocks, for dense heads.

    Args:
        model: a keras_vit VisionTransformer (plain or hybrid; with `dynamic_image_size`, the
            grids follow each batch's input size).
        layers: block indices (negative counts from the end) or layer names of token-sequence
            layers (e.g. "encoderblock_5", "encoder_norm"); default the last block.
        output: "nhwc" gives (batch, rows, cols, hidden) grids with prefix tokens (the class
            token) removed; "tokens" gives the (batch, tokens, hidden) sequences as they are.
        name: name of the new model (default "<model>_features").

    Returns:
        A keras.Model on the same input (sharing the weights) with one output per entry of
        `layers` (a list, also for one).

    Example:
        >>> vit = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,  # doctest: +SKIP
        ...                                   num_layers=4, num_heads=2, mlp_dim=32)
        >>> features = feature_extractor(vit, [1, 3])  # doctest: +SKIP
        >>> [tuple(t.shape) for t in features.outputs]  # doctest: +SKIP
        [(None, 4, 4, 16), (None, 4, 4, 16)]
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be 'nhwc' or 'tokens'; got {output!r}.")
    if not hasattr(model, "grid_size") or not hasattr(model, "num_prefix_tokens"):
        raise TypeError(f"feature_extractor needs a keras_vit VisionTransformer; got {type(model).__name__}.")
    if isinstance(layers, (int, str)):
        layers = [layers]
    outputs = []
    for layer in layers:
        layer_name = _layer_name(model, layer)
        tokens = model.get_layer(layer_name).output
        if len(tokens.shape) != 3:
            raise ValueError(f"Layer {layer_name!r} does not output a token sequence (shape {tokens.shape}).")
        if output == "nhwc":
            if getattr(model, "dynamic_image_size", False):  # the grid follows each batch's images
                to_grid = TokensToGrid(model.grid_size, model.num_prefix_tokens, model.stride,
                                       name=f"{layer_name}_grid")
                tokens = to_grid(tokens, model.inputs[0])
            else:
                tokens = TokensToGrid(model.grid_size, model.num_prefix_tokens, name=f"{layer_name}_grid")(tokens)
        outputs.append(tokens)
    return keras.Model(model.inputs, outputs, name=name or f"{model.name}_features")
