"""Position-embedding and patch-embedding resizing as pure functions.

A ViT learns one embedding per grid cell. Loading weights at another resolution means resampling
that grid; every upstream framework does it with its own rule, and a converted model must use
the rule of its source to reproduce it. The rules are expressed as separable interpolation
matrices, so the same code handles square and non-square grids in both directions.

The same matrices serve three callers: `resize_position_embedding` (NumPy, at load time),
`interpolation_matrix_tensor` (keras.ops, inside a model whose input size is known only at run
time) and `resize_patch_embedding` (FlexiViT's pseudo-inverse resize of the patch kernel).
"""

import math

import numpy as np

from keras_vit.geometry import RESIZE_RULES, positive_pair  # noqa: F401  (RESIZE_RULES re-exported)

# === Rules ===

#: Rules `resize_patch_embedding` accepts: the pixel resize whose effect the new kernel inverts.
PATCH_RESIZE_RULES = (
    "bicubic_antialias",  # torch F.interpolate(bicubic, antialias=True): timm's resample_patch_embed default
    "bilinear_antialias",  # torch F.interpolate(bilinear, antialias=True)
    "bilinear",  # half-pixel bilinear without antialias: tf.image.resize, as big_vision's FlexiViT resizes
)


def _linear_corners_matrix(n_in, n_out):
    """(n_out, n_in) weights of linear interpolation whose corner samples align."""
    m = np.zeros((n_out, n_in), np.float64)
    if n_in == 1 or n_out == 1:
        m[:, 0] = 1.0
        return m
    pos = np.arange(n_out) * (n_in - 1) / (n_out - 1)
    lo = np.clip(np.floor(pos).astype(int), 0, n_in - 2)
    frac = pos - lo
    m[np.arange(n_out), lo] += 1.0 - frac
    m[np.arange(n_out), lo + 1] += frac
    return m


def _cubic(x, a):
    x = np.abs(x)
    return np.where(
        x <= 1,
        ((a + 2) * x - (a + 3)) * x * x + 1,
        np.where(x < 2, (((x - 5) * x + 8) * x - 4) * a, 0.0),
    )


def _half_pixel_matrix(n_in, n_out, kernel):
    """(n_out, n_in) weights of half-pixel (align_corners=False) interpolation, edges clamped."""
    m = np.zeros((n_out, n_in), np.float64)
    scale = n_in / n_out
    src = (np.arange(n_out) + 0.5) * scale - 0.5
    if kernel == "bilinear":
        src = np.maximum(src, 0.0)
        lo = np.floor(src).astype(int)
        frac = src - lo
        for i in range(n_out):
            m[i, min(lo[i], n_in - 1)] += 1.0 - frac[i]
            m[i, min(lo[i] + 1, n_in - 1)] += frac[i]
        return m
    lo = np.floor(src).astype(int)
    frac = src - lo
    for i in range(n_out):
        for off in range(-1, 3):
            m[i, min(max(lo[i] + off, 0), n_in - 1)] += _cubic(off - frac[i], -0.75)
    return m


def _triangle(x):
    return np.maximum(1.0 - np.abs(x), 0.0)


def _antialias_matrix(n_in, n_out, kernel="bicubic"):
    """(n_out, n_in) weights of PyTorch's antialiased filter (bicubic a=-0.5, support 2, or
    triangle, support 1), widened by the scale when shrinking and renormalised at the edges."""
    m = np.zeros((n_out, n_in), np.float64)
    scale = n_in / n_out
    support = (2.0 if kernel == "bicubic" else 1.0) * max(scale, 1.0)
    inv = 1.0 / max(scale, 1.0)
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        js = np.arange(lo, hi)
        x = (js - center + 0.5) * inv
        w = _cubic(x, -0.5) if kernel == "bicubic" else _triangle(x)
        total = w.sum()
        m[i, lo:hi] = w / total if total != 0 else w
    return m


def interpolation_matrix(n_in, n_out, rule):
    """The (n_out, n_in) matrix that resamples a 1-D signal of length n_in under `rule`."""
    if rule == "original":
        return _linear_corners_matrix(n_in, n_out)
    if rule in ("bilinear", "bicubic"):
        return _half_pixel_matrix(n_in, n_out, rule)
    if rule == "bicubic_antialias":
        return _antialias_matrix(n_in, n_out, "bicubic")
    if rule == "bilinear_antialias":
        return _antialias_matrix(n_in, n_out, "bilinear")
    raise ValueError(f"Unknown position-embedding resize rule {rule!r}; expected one of {RESIZE_RULES}.")


# === Public function ===


def grid_from_length(num_patches):
    """The square grid (n, n) holding `num_patches` tokens; raises if it is not a square."""
    side = int(round(math.sqrt(num_patches)))
    if side * side != num_patches:
        raise ValueError(
            f"Cannot infer the grid of {num_patches} position embeddings: it is not a square. "
            "Pass `source_grid=(rows, cols)` explicitly."
        )
    return side, side


def resize_position_embedding(
    pos_embedding, target_grid, *, num_prefix_tokens=1, source_grid=None, rule="original"
):
    """Resample a learned position embedding to another patch grid.

    Args:
        pos_embedding: array (1, prefix + rows * cols, dim) or (prefix + rows * cols, dim).
        target_grid: (rows, cols) of the new patch grid.
        num_prefix_tokens: leading tokens (the class token) kept apart and re-attached unchanged.
        source_grid: (rows, cols) of the stored grid; inferred as a square when None.
        rule: one of RESIZE_RULES — the interpolation of the checkpoint's source framework.

    Returns:
        float32 array with the input's rank holding prefix + new rows * cols tokens.

    Example:
        >>> pe = np.random.rand(1, 1 + 14 * 14, 8).astype("float32")
        >>> resize_position_embedding(pe, (24, 24)).shape
        (1, 577, 8)
    """
    pos_embedding = np.asarray(pos_embedding)
    squeeze = pos_embedding.ndim == 2
    pe = pos_embedding[None] if squeeze else pos_embedding
    if pe.ndim != 3 or pe.shape[0] != 1:
        raise ValueError(f"Expected a position embedding of shape (1, tokens, dim); got {pos_embedding.shape}.")
    prefix, grid = pe[:, :num_prefix_tokens], pe[0, num_prefix_tokens:]
    if source_grid is None:
        source_grid = grid_from_length(grid.shape[0])
    source_grid, target_grid = tuple(int(s) for s in source_grid), tuple(int(t) for t in target_grid)
    if source_grid[0] * source_grid[1] != grid.shape[0]:
        raise ValueError(
            f"Position embedding holds {grid.shape[0]} patch tokens, which does not match the "
            f"source grid {source_grid}."
        )
    if source_grid == target_grid:
        return pos_embedding.astype(np.float32)
    dim = grid.shape[-1]
    g = grid.reshape(source_grid[0], source_grid[1], dim).astype(np.float64)
    rows = interpolation_matrix(source_grid[0], target_grid[0], rule)
    cols = interpolation_matrix(source_grid[1], target_grid[1], rule)
    out = np.einsum("ri,ijd,cj->rcd", rows, g, cols).reshape(1, -1, dim)
    out = np.concatenate([prefix.astype(np.float64), out], axis=1).astype(np.float32)
    return out[0] if squeeze else out


def _geometric_offsets(source, target):
    """Where BEiT's resize places the `source` offsets of one axis (-source // 2 ... source // 2)
    among the `target` ones: the offset k > 0 at 1 + q + ... + q^(k-1), with the ratio q in [1.01,
    1.5] found by bisection (to 1e-6) so that the largest lands near target // 2; mirrored for
    k < 0. Near offsets keep their spacing, far ones are spread (BEiT's run_class_finetuning.py)."""
    half_source, half_target = source // 2, target // 2
    left, right = 1.01, 1.5
    while right - left > 1e-6:
        ratio = (left + right) / 2.0
        if (1.0 - ratio**half_source) / (1.0 - ratio) > half_target:
            right = ratio
        else:
            left = ratio
    positions, current = [], 1.0
    for k in range(half_source):  # the last ratio tried, as BEiT's code keeps it
        positions.append(current)
        current += ratio ** (k + 1)
    return np.array([-p for p in reversed(positions)] + [0.0] + positions)


def resize_relative_position_bias(table, target_grid, *, source_grid=None, extra_tokens=3):
    """Resample BEiT's relative position bias table to another patch grid, as BEiT's fine-tuning
    code and timm's `resize_rel_pos_bias_table` (without SciPy) do.

    The table holds one row per 2-D offset of a (rows, cols) grid, (2 rows - 1) x (2 cols - 1) in
    row-major order (see `layers.position.relative_position_index`), then `extra_tokens` rows of
    the class token, kept as they are. Each head's offset grid is placed on geometric positions
    that reach the target's largest offset (`_geometric_offsets`) and sampled at the target's
    integer offsets by linear interpolation along each axis, holding the edge values beyond it.

    Args:
        table: array ((2 rows - 1) (2 cols - 1) + extra_tokens, heads).
        target_grid: (rows, cols) of the new patch grid.
        source_grid: (rows, cols) of the stored table; inferred as a square when None.
        extra_tokens: rows after the offsets (BEiT's: class-to-patch, patch-to-class, class-to-class).

    Returns:
        float32 array ((2 R - 1) (2 C - 1) + extra_tokens, heads) for the target (R, C).

    Example:
        >>> table = np.random.rand(7 * 7 + 3, 2).astype("float32")
        >>> resize_relative_position_bias(table, (6, 6)).shape
        (124, 2)
    """
    table = np.asarray(table)
    if table.ndim != 2 or table.shape[0] <= extra_tokens:
        raise ValueError(f"Expected a relative position bias table (offsets + {extra_tokens}, heads); got "
                         f"{table.shape}.")
    offsets = table.shape[0] - extra_tokens
    if source_grid is None:
        side = int(round(math.sqrt(offsets)))
        if side * side != offsets or side % 2 == 0:
            raise ValueError(f"Cannot infer the grid of a relative position bias table of {offsets} offsets: it is "
                             "not a square of an odd side. Pass `source_grid=(rows, cols)` explicitly.")
        source = (side, side)
    else:
        source = tuple(2 * int(g) - 1 for g in source_grid)
        if source[0] * source[1] != offsets:
            raise ValueError(f"The relative position bias table holds {offsets} offsets, not the "
                             f"{source[0]} x {source[1]} of a {tuple(source_grid)} grid.")
    target = tuple(2 * int(g) - 1 for g in target_grid)
    if source == target:
        return table.astype(np.float32)
    rows_at, cols_at = (_geometric_offsets(s, t) for s, t in zip(source, target))
    rows_to, cols_to = (np.arange(t, dtype=np.float64) - t // 2 for t in target)
    grid = table[:offsets].astype(np.float64).reshape(source[0], source[1], -1)
    heads = grid.shape[-1]
    # Linear along the columns, then along the rows: the bilinear interpolation of a rectilinear grid.
    by_cols = np.stack([[np.interp(cols_to, cols_at, grid[r, :, h]) for h in range(heads)]
                        for r in range(source[0])])  # (source rows, heads, target cols)
    out = np.stack([[np.interp(rows_to, rows_at, by_cols[:, h, c]) for c in range(target[1])]
                    for h in range(heads)])  # (heads, target cols, target rows)
    out = out.transpose(2, 1, 0).reshape(target[0] * target[1], heads)
    return np.concatenate([out, table[offsets:].astype(np.float64)]).astype(np.float32)


def resize_patch_embedding(kernel, new_patch_size, *, rule="bicubic_antialias"):
    """FlexiViT's pseudo-inverse resize (PI-resize) of a patch-embedding kernel.

    A patch x of the old size and the same patch resized to the new size, B x, should give the
    same token: <B x, w_new> = <x, w_old>. With B the (new pixels, old pixels) matrix of the
    pixel resize, the least-squares solution is w_new = pinv(B^T) w_old (Beyer et al.,
    "FlexiViT: One Model for All Patch Sizes", CVPR 2023). The resize is separable, so B is
    the Kronecker product of one matrix per axis and so is its pseudo-inverse; the kernel is
    resized one axis at a time in float64.

    Args:
        kernel: (patch_h, patch_w, in_channels, hidden) array (Keras / Flax HWIO layout).
        new_patch_size: int or (height, width) of the new patches.
        rule: the pixel resize to invert, one of PATCH_RESIZE_RULES: "bicubic_antialias"
            (timm's `resample_patch_embed` default, used when timm loads a checkpoint at another
            patch size), "bilinear_antialias", or "bilinear" (tf.image.resize, big_vision's
            FlexiViT).

    Returns:
        float32 array (new_h, new_w, in_channels, hidden).

    Example:
        >>> w = np.random.rand(16, 16, 3, 8).astype("float32")
        >>> resize_patch_embedding(w, 8).shape
        (8, 8, 3, 8)
    """
    kernel = np.asarray(kernel)
    if kernel.ndim != 4:
        raise ValueError(
            f"Expected a patch-embedding kernel (patch_h, patch_w, in_channels, hidden); got shape {kernel.shape}. "
            "A PyTorch (out, in, h, w) weight is kernel.transpose(2, 3, 1, 0)."
        )
    if rule not in PATCH_RESIZE_RULES:
        raise ValueError(f"Unknown patch-embedding resize rule {rule!r}; expected one of {PATCH_RESIZE_RULES}.")
    new = positive_pair(new_patch_size, "new_patch_size")
    old = tuple(kernel.shape[:2])
    if old == new:
        return kernel.astype(np.float32)
    # pinv(B) for B = kron(rows, cols) is kron(pinv(rows), pinv(cols)): (old, new) per axis.
    rows = np.linalg.pinv(interpolation_matrix(old[0], new[0], rule))
    cols = np.linalg.pinv(interpolation_matrix(old[1], new[1], rule))
    out = np.einsum("ia,jb,ijcd->abcd", rows, cols, kernel.astype(np.float64))
    return out.astype(np.float32)


# === In the graph (keras.ops) ===


def _cubic_tensor(x, a):
    from keras import ops

    x = ops.abs(x)
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return ops.where(x <= 1, near, ops.where(x < 2, far, ops.zeros_like(x)))


def interpolation_matrix_tensor(n_in, n_out, rule):
    """`interpolation_matrix` built with keras.ops, for an output length known only at run time.

    `n_in` is a Python int (the stored grid); `n_out` may be a scalar tensor (a grid that follows
    the input size inside a compiled graph). Returns a float32 (n_out, n_in) tensor with the
    weights of `interpolation_matrix(n_in, n_out, rule)`, computed in float32.
    """
    from keras import ops

    n_in = int(n_in)
    i = ops.cast(ops.arange(n_out), "float32")[:, None]  # (n_out, 1)
    j = ops.cast(ops.arange(n_in), "float32")[None, :]  # (1, n_in)
    n_out_f = ops.cast(n_out, "float32")

    def hat(index):  # one-hot rows: (n_out, 1) indices -> (n_out, n_in)
        return ops.cast(ops.equal(j, index), "float32")

    if rule == "original":
        if n_in == 1:
            return ops.ones_like(i)
        pos = i * float(n_in - 1) / ops.maximum(n_out_f - 1.0, 1.0)
        lo = ops.clip(ops.floor(pos), 0.0, float(n_in - 2))
        frac = pos - lo
        return hat(lo) * (1.0 - frac) + hat(lo + 1.0) * frac
    scale = float(n_in) / n_out_f
    if rule in ("bilinear", "bicubic"):
        src = (i + 0.5) * scale - 0.5
        last = float(n_in - 1)
        if rule == "bilinear":
            src = ops.maximum(src, 0.0)
            lo = ops.floor(src)
            frac = src - lo
            return hat(ops.minimum(lo, last)) * (1.0 - frac) + hat(ops.minimum(lo + 1.0, last)) * frac
        lo = ops.floor(src)
        frac = src - lo
        taps = (-1.0, 0.0, 1.0, 2.0)
        return sum(hat(ops.clip(lo + off, 0.0, last)) * _cubic_tensor(off - frac, -0.75) for off in taps)
    if rule in ("bicubic_antialias", "bilinear_antialias"):
        bicubic = rule == "bicubic_antialias"
        stretch = ops.maximum(scale, 1.0)
        support = (2.0 if bicubic else 1.0) * stretch
        center = scale * (i + 0.5)
        lo = ops.maximum(ops.floor(center - support + 0.5), 0.0)
        hi = ops.minimum(ops.floor(center + support + 0.5), float(n_in))
        x = (j - center + 0.5) / stretch
        w = _cubic_tensor(x, -0.5) if bicubic else ops.maximum(1.0 - ops.abs(x), 0.0)
        w = w * ops.cast(ops.logical_and(j >= lo, j < hi), "float32")
        total = ops.sum(w, axis=1, keepdims=True)
        return w / ops.where(ops.equal(total, 0.0), ops.ones_like(total), total)
    raise ValueError(f"Unknown position-embedding resize rule {rule!r}; expected one of {RESIZE_RULES}.")
