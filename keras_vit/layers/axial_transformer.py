"""The Axial Transformer block of Axial-ViT (the paper's Appendix D.6): a pre-LN Transformer
block (`EncoderBlock`) that attends along one axis of a (batch, rows, cols, hidden) grid.

A "row" block runs every row of the grid as its own sequence (attention along the width); a
"column" block runs every column (attention along the height). Tokens in different rows (or
columns) never see each other within one block; the MLP acts on each token alone.
"""

import keras
from keras import ops

from keras_vit.layers.transformer import EncoderBlock

register = keras.saving.register_keras_serializable(package="keras_vit")


@register
class AxialEncoderBlock(EncoderBlock):
    """`EncoderBlock` along one axis of a (batch, rows, cols, hidden) grid.

    Args:
        axis: "row" (each row is a sequence: attention along the width) or "column" (each column
            is a sequence: attention along the height).
        The rest as `EncoderBlock` (relative position embeddings excepted).

    Called with `return_attention_weights=True` it also returns the softmax weights as
    (batch, rows, heads, cols, cols) for a row block, (batch, cols, heads, rows, rows) for a
    column block.

    Example:
        >>> block = AxialEncoderBlock("row", num_heads=2, mlp_dim=16)
        >>> block(keras.ops.zeros((1, 3, 4, 8))).shape
        (1, 3, 4, 8)
    """

    def __init__(self, axis="row", num_heads=1, mlp_dim=1, **kwargs):
        if axis not in ("row", "column"):
            raise ValueError(f"axis must be 'row' or 'column'; got {axis!r}.")
        if kwargs.get("relative_positions") is not None:
            raise ValueError("AxialEncoderBlock has no relative position embeddings.")
        super().__init__(num_heads, mlp_dim, **kwargs)
        self.axis = axis

    def build(self, input_shape):
        if len(input_shape) != 4:
            raise ValueError(f"{self.name} takes a (batch, rows, cols, hidden) grid; got shape {tuple(input_shape)}.")
        length = input_shape[2] if self.axis == "row" else input_shape[1]
        super().build((None, length, input_shape[-1]))

    def call(self, x, training=None, return_attention_weights=False):
        if self.axis == "column":
            x = ops.transpose(x, (0, 2, 1, 3))
        shape = ops.shape(x)
        batch, lines, length, hidden = shape[0], shape[1], shape[2], x.shape[-1]
        out = super().call(ops.reshape(x, (-1, length, hidden)), training=training,
                           return_attention_weights=return_attention_weights)
        if return_attention_weights:
            out, weights = out
            weights = ops.reshape(weights, (batch, lines, self.num_heads, length, length))
        out = ops.reshape(out, (batch, lines, length, hidden))
        if self.axis == "column":
            out = ops.transpose(out, (0, 2, 1, 3))
        return (out, weights) if return_attention_weights else out

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, x, training=None, return_attention_weights=False):
        out = keras.KerasTensor(x.shape, dtype=self.compute_dtype)
        if not return_attention_weights:
            return out
        batch, rows, cols, _ = x.shape
        lines, length = (rows, cols) if self.axis == "row" else (cols, rows)
        return out, keras.KerasTensor((batch, lines, self.num_heads, length, length), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(axis=self.axis)
        return config
