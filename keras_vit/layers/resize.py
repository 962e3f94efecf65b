"""Position-embedding resizing as a pure NumPy function.

A ViT learns one embedding per grid cell. Loading weights at another resolution means resampling
that grid; every upstream framework does it with its own rule, and a converted model must use
the rule of its source to reproduce it. The rules are expressed as separable interpolation
matrices, so the same code handles square and non-square grids in both directions.
"""

import math

import numpy as np

# === Rules ===

#: Rule name -> (kernel, sampling). Kept as data so callers can name a source's rule.
RESIZE_RULES = (
    "original",  # google-research/vision_transformer: linear, corners aligned (ndimage.zoom order=1)
    "bilinear",  # half-pixel bilinear (timm's .npz loader, align_corners=False)
    "bicubic",  # half-pixel bicubic, a=-0.75 (transformers' interpolate_pos_encoding)
    "bicubic_antialias",  # half-pixel bicubic with antialias, a=-0.5 (timm's resample_abs_pos_embed)
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


def _antialias_bicubic_matrix(n_in, n_out):
    """(n_out, n_in) weights of the antialiased bicubic filter (a=-0.5), renormalised at edges."""
    m = np.zeros((n_out, n_in), np.float64)
    scale = n_in / n_out
    support = 2.0 * max(scale, 1.0)
    inv = 1.0 / max(scale, 1.0)
    for i in range(n_out):
        center = scale * (i + 0.5)
        lo = max(int(center - support + 0.5), 0)
        hi = min(int(center + support + 0.5), n_in)
        js = np.arange(lo, hi)
        w = _cubic((js - center + 0.5) * inv, -0.5)
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
        return _antialias_bicubic_matrix(n_in, n_out)
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
