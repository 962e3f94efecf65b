"""Position embeddings: learned 1-D (the paper's default), learned 2-D and fixed 2-D sin-cos.

The paper's Appendix D.4 compares no position embedding, a learned 1-D embedding (one vector
per token), a learned 2-D embedding (an X and a Y table of width D/2 each, concatenated per
patch) and relative attention (`MultiHeadDotProductAttention(relative_positions=...)`); later
big_vision ViTs use a fixed 2-D sin-cos embedding. Each layer here adds its embedding to the
token sequence (prefix tokens first) and says how its weights follow a new patch grid.

With `stride` set, a layer follows the input size at run time: it is called as
`layer(tokens, images)`, reads the grid off the images, (height // stride, width // stride),
and resamples its weights to that grid inside the graph with its resize rule (the same weights
`resize_position_embedding` computes at load time, built with keras.ops).
"""

import keras
import numpy as np
from keras import ops

from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.resize import interpolation_matrix, interpolation_matrix_tensor, resize_position_embedding

register = keras.saving.register_keras_serializable(package="keras_vit")


def _check_tokens(layer, input_shape):
    if input_shape[1] is not None and input_shape[1] != layer.num_tokens:
        raise ValueError(
            f"{type(layer).__name__} laid out for a {layer.grid_size[0]}x{layer.grid_size[1]} grid plus "
            f"{layer.num_prefix_tokens} prefix token(s) ({layer.num_tokens} tokens) received "
            f"{input_shape[1]} tokens."
        )


def _resample(table, grid_in, grid_out, rule):
    """(rows_in, cols_in, dim) `table` resampled to `grid_out` (ints or scalar tensors) in the graph."""
    if all(isinstance(g, int) for g in grid_out) and tuple(grid_out) == tuple(grid_in):
        return table  # known and equal: nothing to do (the matrices are the identity)
    rows = interpolation_matrix_tensor(grid_in[0], grid_out[0], rule)
    cols = interpolation_matrix_tensor(grid_in[1], grid_out[1], rule)
    return ops.einsum("ri,ijd,cj->rcd", rows, table, cols)


class _GridLayer(keras.layers.Layer):
    def __init__(self, grid_size, num_prefix_tokens=1, resize_rule="original", stride=None, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.resize_rule = resize_rule
        self.stride = None if stride is None else int(stride)

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    @property
    def dynamic(self):
        """Whether the layer follows the input size at run time (called as layer(tokens, images))."""
        return self.stride is not None

    def runtime_grid(self, images):
        """(rows, cols) of the patch grid of `images`: Python ints when the size is known while
        the graph is traced (eager, jit), scalar tensors otherwise."""
        if images is None:
            raise ValueError(
                f"{self.name} follows the input size at run time (stride={self.stride}): call it as "
                "layer(tokens, images)."
            )
        shape = ops.shape(images)
        for axis, size in zip(("height", "width"), images.shape[1:3]):
            if size is not None and size % self.stride:
                s = self.stride
                raise ValueError(
                    f"Image {axis} {size} is not divisible by the model's stride {s} (input pixels per token). "
                    f"Resize the images to a multiple of {s}, e.g. {max(size // s, 1) * s} or {(size // s + 1) * s}."
                )
        return shape[1] // self.stride, shape[2] // self.stride

    def compute_output_shape(self, tokens_shape, images_shape=None):
        return tokens_shape

    def compute_output_spec(self, tokens, images=None):
        return keras.KerasTensor(tokens.shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            grid_size=list(self.grid_size), num_prefix_tokens=self.num_prefix_tokens, resize_rule=self.resize_rule
        )
        if self.stride is not None:
            config.update(stride=self.stride)
        return config


@register
class PositionEmbedding(_GridLayer):
    """Adds a learned position embedding (1, prefix + rows * cols, hidden), normal(0.02) init.

    `grid_size` is the (rows, cols) patch grid the embedding is laid out on; `num_prefix_tokens`
    the tokens in front of it (1 for the class token, 0 for gap models). `resized(...)` gives the
    embedding for another grid, with the resize rule of the weights' source (`resize_rule`).
    """

    def build(self, tokens_shape, images_shape=None):
        input_shape = tokens_shape
        _check_tokens(self, input_shape)
        self.pos_embedding = self.add_weight(
            name="pos_embedding",
            shape=(1, self.num_tokens, input_shape[-1]),
            initializer=_init(keras.initializers.RandomNormal(stddev=0.02)),
        )

    def embedding(self):
        """The (prefix + rows * cols, hidden) embedding."""
        return self.pos_embedding[0]

    def call(self, tokens, images=None):
        if not self.dynamic:
            return tokens + ops.cast(self.pos_embedding, tokens.dtype)
        prefix = self.num_prefix_tokens
        table = ops.reshape(self.pos_embedding[0, prefix:], (*self.grid_size, -1))
        grid = _resample(table, self.grid_size, self.runtime_grid(images), self.resize_rule)
        embedding = ops.concatenate(
            [self.pos_embedding[0, :prefix], ops.reshape(grid, (-1, self.pos_embedding.shape[-1]))], axis=0
        )
        return tokens + ops.cast(embedding, tokens.dtype)[None]

    def resized(self, value, source_grid, rule=None):
        """`value` (from a checkpoint laid out on `source_grid`) resampled to this layer's grid."""
        return resize_position_embedding(
            value,
            self.grid_size,
            num_prefix_tokens=self.num_prefix_tokens,
            source_grid=source_grid,
            rule=rule or self.resize_rule,
        )

    def resized_weight(self, key, value, source_grid, rule=None):
        """The weight-tree value `key` of another grid, fitted to this layer (see set_weight_tree)."""
        value = np.asarray(value)
        if value.ndim != 3 or value.shape[-1] != self.pos_embedding.shape[-1]:
            raise ValueError(
                f"shape mismatch for position embedding: checkpoint {tuple(value.shape)} vs model "
                f"{tuple(self.pos_embedding.shape)}"
            )
        return self.resized(value, source_grid, rule)

    def weight_tree_variables(self):
        return {"pos_embedding": self.pos_embedding}


@register
class PositionEmbedding2D(_GridLayer):
    """The paper's learned 2-D position embedding (Appendix D.4).

    Two tables are learned, one per axis: `x_embedding` (cols, hidden / 2) and `y_embedding`
    (rows, hidden / 2); a patch at (row, col) gets concat(x_embedding[col], y_embedding[row]).
    Prefix tokens (the class token) have their own learned vector, `prefix_embedding`
    (prefix, hidden). A new grid resizes each table along its own axis with the 1-D form of the
    resize rule. Tables are normal(0.02)-initialised, as the 1-D embedding.
    """

    def build(self, tokens_shape, images_shape=None):
        input_shape = tokens_shape
        _check_tokens(self, input_shape)
        hidden = input_shape[-1]
        if hidden % 2:
            raise ValueError(f"PositionEmbedding2D needs an even hidden size (two halves); got {hidden}.")
        init = _init(keras.initializers.RandomNormal(stddev=0.02))
        rows, cols = self.grid_size
        self.x_embedding = self.add_weight(name="x_embedding", shape=(cols, hidden // 2), initializer=init)
        self.y_embedding = self.add_weight(name="y_embedding", shape=(rows, hidden // 2), initializer=init)
        self.prefix_embedding = None
        if self.num_prefix_tokens:
            self.prefix_embedding = self.add_weight(
                name="prefix_embedding", shape=(self.num_prefix_tokens, hidden), initializer=init
            )

    def embedding(self, grid_size=None):
        """The (prefix + rows * cols, hidden) embedding, row-major over the grid (the layer's, or
        `grid_size`, to which each table is resampled along its axis with the resize rule)."""
        x_table, y_table = self.x_embedding, self.y_embedding
        rows, cols = self.grid_size
        known = grid_size is not None and all(isinstance(g, int) for g in grid_size)
        if grid_size is not None and not (known and tuple(grid_size) == self.grid_size):
            rows, cols = grid_size
            x_table = ops.matmul(interpolation_matrix_tensor(self.grid_size[1], cols, self.resize_rule), x_table)
            y_table = ops.matmul(interpolation_matrix_tensor(self.grid_size[0], rows, self.resize_rule), y_table)
        half = self.x_embedding.shape[-1]
        x = ops.broadcast_to(x_table[None, :, :], (rows, cols, half))
        y = ops.broadcast_to(y_table[:, None, :], (rows, cols, half))
        grid = ops.reshape(ops.concatenate([x, y], axis=-1), (-1, 2 * half))
        if self.prefix_embedding is None:
            return grid
        return ops.concatenate([self.prefix_embedding, grid], axis=0)

    def call(self, tokens, images=None):
        grid_size = self.runtime_grid(images) if self.dynamic else None
        return tokens + ops.cast(self.embedding(grid_size), tokens.dtype)[None]

    def resized_weight(self, key, value, source_grid=None, rule=None):
        value = np.asarray(value, np.float64)
        axis = {"x_embedding": 1, "y_embedding": 0}.get(key)
        target = self.x_embedding if key == "x_embedding" else self.y_embedding if axis is not None else None
        if target is None or value.ndim != 2 or value.shape[1] != target.shape[1]:
            shape = None if target is None else tuple(target.shape)
            raise ValueError(f"shape mismatch for position embedding {key}: checkpoint {value.shape} vs model {shape}")
        matrix = interpolation_matrix(value.shape[0], self.grid_size[axis], rule or self.resize_rule)
        return (matrix @ value).astype(np.float32)

    def weight_tree_variables(self):
        tree = {"x_embedding": self.x_embedding, "y_embedding": self.y_embedding}
        if self.prefix_embedding is not None:
            tree["prefix_embedding"] = self.prefix_embedding
        return tree


def relative_position_index(grid_size):
    """(tokens, tokens) indices into BEiT's relative position bias table for a class token followed
    by the patches of a (rows, cols) grid in row-major order (Bao et al. 2022; timm's
    `gen_relative_position_index`).

    The table has (2 rows - 1) (2 cols - 1) + 3 entries: one per 2-D offset between two patches,
    (row offset + rows - 1) * (2 cols - 1) + col offset + cols - 1, then three for the class
    token: class-to-patch, patch-to-class and class-to-class.

    Example:
        >>> relative_position_index((1, 2)).tolist()
        [[5, 3, 3], [4, 1, 0], [4, 2, 1]]
    """
    rows, cols = (int(g) for g in grid_size)
    r, c = (a.reshape(-1) for a in np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij"))
    offsets = (2 * rows - 1) * (2 * cols - 1)
    index = np.empty((rows * cols + 1,) * 2, dtype=np.int32)
    index[1:, 1:] = (r[:, None] - r[None, :] + rows - 1) * (2 * cols - 1) + (c[:, None] - c[None, :] + cols - 1)
    index[0, :] = offsets  # the class token attending to every token
    index[:, 0] = offsets + 1  # every token attending to the class token
    index[0, 0] = offsets + 2
    return index


def relative_position_entries(grid_size):
    """Rows of BEiT's relative position bias table for a (rows, cols) grid: (2 rows - 1) (2 cols - 1) + 3."""
    rows, cols = (int(g) for g in grid_size)
    return (2 * rows - 1) * (2 * cols - 1) + 3


def rotary_embedding_tables(grid_size, head_dim, temperature=10000.0, reference_grid=None, offset=0.0, indexing="ij",
                            coordinates="index", rotate_half=False):
    """(sin, cos), each (rows * cols, head_dim) float32: EVA-02's 2-D rotary position embedding
    (Fang et al. 2023; timm's `RotaryEmbeddingCat` with integer positions) for the patches of a
    (rows, cols) grid in row-major order.

    head_dim / 4 frequencies 1 / temperature ** (i / (head_dim / 4)) rotate the first half of a
    head's channels by the patch's row and the second half by its column, in interleaved pairs
    (channels 2j and 2j + 1 share an angle). With `reference_grid` the positions are rescaled so that
    the grid spans the reference one (row * ref_rows / rows), as EVA-02 runs at another resolution
    than it was pre-trained at. `offset` is added to the patch indices first (Perception Encoder's
    1); `indexing="xy"` rotates the first half by the column and the second by the row (timm's
    `grid_indexing`). `coordinates="centered"` is DINOv3's form (timm's RotaryEmbeddingDinoV3): each
    axis' patch centres (i + 0.5 + offset) / n mapped to [-1, 1], angles 2 pi coordinate / period
    with periods temperature ** (i / (head_dim / 4)). `rotate_half=True` lays the angles out as two
    halves (channel j pairs with j + head_dim / 2) instead of interleaved pairs. Computed in
    float32, as timm computes them.

    Example:
        >>> sin, cos = rotary_embedding_tables((2, 3), 8)
        >>> sin.shape, float(sin[0].max()), float(cos[5, 0])
        ((6, 8), 0.0, 0.5403022766113281)
    """
    rows, cols = (int(g) for g in grid_size)
    bands = int(head_dim) // 4
    f32 = np.float32
    if indexing not in ("ij", "xy") or coordinates not in ("index", "centered"):
        raise ValueError(f"indexing must be 'ij' (rows first) or 'xy' (columns first) and coordinates 'index' or "
                         f"'centered'; got {indexing!r}, {coordinates!r}.")
    if coordinates == "centered":
        axes = [(np.arange(n).astype(f32) + f32(0.5) + f32(offset)) / f32(n) for n in (rows, cols)]
        axes = [f32(2.0) * a - f32(1.0) for a in axes]
        periods = f32(temperature) ** (f32(2.0) * np.arange(bands).astype(f32) / f32(int(head_dim) // 2))
    else:
        axes = [np.arange(n).astype(f32) + f32(offset) for n in (rows, cols)]
        frequencies = f32(1.0) / (f32(temperature) ** (np.arange(bands).astype(f32) / f32(bands)))
    if reference_grid is not None:
        axes = [a / f32(n) * f32(r) for a, n, r in zip(axes, (rows, cols), reference_grid)]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)  # (rows, cols, 2): (row, col)
    if indexing == "xy":
        grid = grid[..., ::-1]  # (col, row)
    if coordinates == "centered":
        angles = (f32(2 * np.pi) * grid[..., None] / periods).astype(f32)
    else:
        angles = (grid[..., None] * frequencies).astype(f32)
    angles = angles.reshape(rows * cols, 2 * bands)
    if rotate_half:  # channel j pairs with channel j + head_dim / 2
        angles = np.concatenate([angles, angles], axis=-1)
    else:  # interleaved: channels 2j and 2j + 1 share an angle
        angles = np.repeat(angles, 2, axis=-1)
    return np.sin(angles).astype(f32), np.cos(angles).astype(f32)


def _grid_axes(rows, cols):
    """(row index, col index) of each patch of a (rows, cols) grid in row-major order, float32
    tensors of rows * cols values; `rows` and `cols` may be scalar tensors (a run-time grid)."""
    row = ops.cast(ops.arange(rows), "float32")[:, None] + ops.zeros((1, cols), "float32")
    col = ops.cast(ops.arange(cols), "float32")[None, :] + ops.zeros((rows, 1), "float32")
    return ops.reshape(row, (-1,)), ops.reshape(col, (-1,))


def rotary_embedding_tensors(grid_size, head_dim, temperature=10000.0, reference_grid=None, offset=0.0,
                             indexing="ij", coordinates="index", rotate_half=False):
    """`rotary_embedding_tables` computed with keras.ops for a grid known at run time (`grid_size`:
    ints or scalar tensors): (sin, cos), each (rows * cols, head_dim) float32 tensors, the same
    values in the same float32 steps.

    Example:
        >>> sin, cos = rotary_embedding_tensors((2, 3), 8)
        >>> tuple(sin.shape)
        (6, 8)
    """
    rows, cols = grid_size
    bands = int(head_dim) // 4
    sizes = [ops.cast(n, "float32") for n in (rows, cols)]
    axes = list(_grid_axes(rows, cols))
    if coordinates == "centered":
        axes = [2.0 * ((a + np.float32(0.5) + np.float32(offset)) / n) - 1.0 for a, n in zip(axes, sizes)]
        periods = ops.convert_to_tensor(np.float32(temperature) ** (
            np.float32(2.0) * np.arange(bands, dtype=np.float32) / np.float32(int(head_dim) // 2)))
    else:
        axes = [a + np.float32(offset) for a in axes]
        frequencies = ops.convert_to_tensor(np.float32(1.0) / (
            np.float32(temperature) ** (np.arange(bands, dtype=np.float32) / np.float32(bands))))
    if reference_grid is not None:
        axes = [a / n * np.float32(r) for a, n, r in zip(axes, sizes, reference_grid)]
    if indexing == "xy":
        axes = axes[::-1]
    if coordinates == "centered":  # 2 pi coordinate / period, grouped as the NumPy form groups it
        angles = [a[:, None] * np.float32(2 * np.pi) / periods for a in axes]
    else:
        angles = [a[:, None] * frequencies for a in axes]
    angles = ops.concatenate(angles, axis=-1)
    angles = ops.concatenate([angles, angles], axis=-1) if rotate_half else ops.repeat(angles, 2, axis=-1)
    return ops.sin(angles), ops.cos(angles)


def rotary_positions_tensor(grid_size, indexing="ij"):
    """`rotary_positions` with keras.ops, for a grid known at run time: (rows * cols, 2) float32."""
    row, col = _grid_axes(*grid_size)
    return ops.stack([col, row] if indexing == "xy" else [row, col], axis=-1)


def rotary_positions(grid_size, indexing="ij"):
    """(rows * cols, 2) float32 patch indices in row-major order, (row, col) for "ij" and (col, row)
    for "xy": the positions the learned ("mixed") rotary embedding multiplies by its frequencies.

    Example:
        >>> rotary_positions((2, 2), "xy").tolist()
        [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
    """
    rows, cols = (int(g) for g in grid_size)
    grid = np.stack(np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij"), axis=-1).astype(np.float32)
    return (grid[..., ::-1] if indexing == "xy" else grid).reshape(rows * cols, 2)


def sincos2d_position_embedding(grid_size, width, temperature=10000.0):
    """big_vision's fixed 2-D sin-cos embedding, (rows * cols, width) float32, row-major.

    With omega_i = temperature ** -(i / (width / 4 - 1)) for i < width / 4, a patch at
    (row, col) gets [sin(col * omega), cos(col * omega), sin(row * omega), cos(row * omega)].

    Example:
        >>> sincos2d_position_embedding((2, 3), 8).shape
        (6, 8)
    """
    rows, cols = (int(g) for g in grid_size)
    quarter = int(width) // 4
    if int(width) % 4 or quarter < 2:
        raise ValueError(f"The sin-cos 2-D embedding needs a width divisible by 4 and at least 8; got {width}.")
    y, x = np.mgrid[:rows, :cols]
    omega = 1.0 / float(temperature) ** (np.arange(quarter) / (quarter - 1))
    y = y.reshape(-1, 1) * omega
    x = x.reshape(-1, 1) * omega
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1).astype(np.float32)


@register
class SinCos2DPositionEmbedding(_GridLayer):
    """Adds big_vision's fixed 2-D sin-cos embedding to the patch tokens (no weights).

    As in big_vision, prefix tokens (the class token) get none. The embedding is computed for
    the layer's grid, so a model at any size has it (nothing to resize).
    """

    def __init__(self, grid_size, num_prefix_tokens=1, temperature=10000.0, **kwargs):
        kwargs.pop("resize_rule", None)
        super().__init__(grid_size, num_prefix_tokens, **kwargs)
        self.temperature = float(temperature)

    def build(self, tokens_shape, images_shape=None):
        input_shape = tokens_shape
        _check_tokens(self, input_shape)
        self.hidden = int(input_shape[-1])
        table = sincos2d_position_embedding(self.grid_size, self.hidden, self.temperature)
        self._table = np.concatenate([np.zeros((self.num_prefix_tokens, self.hidden), np.float32), table])[None]

    def embedding(self):
        """The (prefix + rows * cols, hidden) embedding (zeros for the prefix tokens)."""
        return ops.convert_to_tensor(self._table[0])

    def _runtime_table(self, grid):
        """`sincos2d_position_embedding` of `grid` (ints or scalar tensors), with keras.ops."""
        rows, cols = grid
        quarter = self.hidden // 4
        omega = ops.convert_to_tensor(
            (1.0 / self.temperature ** (np.arange(quarter) / (quarter - 1))).astype(np.float32)
        )
        y = ops.cast(ops.arange(rows), "float32")[:, None] + ops.zeros((1, cols), "float32")
        x = ops.cast(ops.arange(cols), "float32")[None, :] + ops.zeros((rows, 1), "float32")
        y = ops.reshape(y, (-1, 1)) * omega
        x = ops.reshape(x, (-1, 1)) * omega
        table = ops.concatenate([ops.sin(x), ops.cos(x), ops.sin(y), ops.cos(y)], axis=1)
        prefix = ops.zeros((self.num_prefix_tokens, self.hidden), "float32")
        return ops.concatenate([prefix, table], axis=0)[None]

    def call(self, tokens, images=None):
        if self.dynamic:
            return tokens + ops.cast(self._runtime_table(self.runtime_grid(images)), tokens.dtype)
        return tokens + ops.cast(ops.convert_to_tensor(self._table), tokens.dtype)

    def get_config(self):
        config = super().get_config()
        config.pop("resize_rule")
        config.update(temperature=self.temperature)
        return config
