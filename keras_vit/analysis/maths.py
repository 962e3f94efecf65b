"""The paper's inspection measures (§4.5) as pure NumPy functions on arrays.

Nothing here knows about Keras: attention matrices, position embeddings and patch-embedding
kernels go in as arrays, numbers come out. `keras_vit.analysis.attention` and `.embeddings`
read those arrays off a model; `.plots` draws the results.
"""

import numpy as np

from keras_vit.geometry import as_pair

_HEAD_FUSIONS = ("mean", "max", "min")


def _prefix_tokens(num_tokens, grid_size):
    rows, cols = grid_size
    prefix = num_tokens - rows * cols
    if prefix < 0:
        raise ValueError(
            f"Attention over {num_tokens} tokens cannot hold a {rows}x{cols} patch grid ({rows * cols} "
            "patch tokens). Pass the grid the model was run at (model.grid_size)."
        )
    return prefix


# === Attention rollout ===


def rollout(attentions, head_fusion="mean", discard_ratio=0.0):
    """Attention rollout (Abnar & Zuidema, 2020): attention propagated through all layers.

    Per layer the heads are fused (`head_fusion`: "mean" as in the paper, or "max" / "min"),
    the identity is added for the residual connection, rows are renormalised to sum to one, and
    the layers are multiplied in order: R = A_L @ ... @ A_2 @ A_1. Row i of R says how much each
    input token flows into output token i.

    Args:
        attentions: softmax attention, (layers, batch, heads, tokens, tokens) as returned by
            `keras_vit.analysis.attention_weights`; (layers, heads, tokens, tokens) is taken as a
            batch of one.
        head_fusion: how the heads of a layer are combined.
        discard_ratio: before adding the identity, the smallest `discard_ratio` fraction of each
            fused (tokens, tokens) matrix is set to zero (a noise filter some implementations
            use; 0 keeps the plain method).

    Returns:
        (batch, tokens, tokens) float64 rollout matrices, rows summing to one.

    Example:
        >>> a = np.full((2, 1, 1, 3, 3), 1 / 3)   # 2 layers of uniform attention over 3 tokens
        >>> rollout(a)[0, 0].round(3)
        array([0.5 , 0.25, 0.25])
    """
    a = np.asarray(attentions, dtype=np.float64)
    if a.ndim == 4:
        a = a[:, None]
    if a.ndim != 5 or a.shape[-1] != a.shape[-2]:
        raise ValueError(
            "rollout expects attentions of shape (layers, batch, heads, tokens, tokens); "
            f"got {np.shape(attentions)}."
        )
    if head_fusion not in _HEAD_FUSIONS:
        raise ValueError(f"head_fusion must be one of {_HEAD_FUSIONS}; got {head_fusion!r}.")
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard_ratio must be in [0, 1); got {discard_ratio!r}.")
    fused = getattr(a, head_fusion)(axis=2)  # (layers, batch, T, T)
    tokens = fused.shape[-1]
    if discard_ratio > 0:
        flat = fused.reshape(fused.shape[0], fused.shape[1], -1).copy()
        drop = int(flat.shape[-1] * discard_ratio)
        if drop:
            lowest = np.argsort(flat, axis=-1)[..., :drop]
            np.put_along_axis(flat, lowest, 0.0, axis=-1)
        fused = flat.reshape(fused.shape)
    fused = fused + np.eye(tokens)
    fused = fused / fused.sum(axis=-1, keepdims=True)
    joint = fused[0]
    for layer in fused[1:]:
        joint = layer @ joint
    return joint


def rollout_map(joint, grid_size):
    """The (batch, rows, cols) map of a rollout: what each patch contributes to the output.

    With a class token (tokens = 1 + rows * cols, or any prefix) the map is the class token's
    row over the patch tokens — what the classifier reads. Models without a class token ("gap":
    the head averages all patch tokens) have no such row; their map is the mean of all rows, the
    rollout of the averaged token the head reads.
    """
    joint = np.asarray(joint, dtype=np.float64)
    rows, cols = as_pair(grid_size, "grid_size")
    prefix = _prefix_tokens(joint.shape[-1], (rows, cols))
    per_patch = joint[:, 0, prefix:] if prefix else joint.mean(axis=1)
    return per_patch.reshape(joint.shape[0], rows, cols)


# === Mean attention distance ===


def patch_centres(grid_size, patch_size):
    """(rows * cols, 2) pixel coordinates (y, x) of the patch centres, row-major like the tokens."""
    rows, cols = as_pair(grid_size, "grid_size")
    py, px = as_pair(patch_size, "patch_size")
    r, c = np.divmod(np.arange(rows * cols), cols)
    return np.stack([(r + 0.5) * py, (c + 0.5) * px], axis=1).astype(np.float64)


def mean_attention_distance(attentions, grid_size, patch_size):
    """Mean attention distance in pixels per layer and head (the paper's Figure 7, right).

    For each query patch, the attention-weighted mean of the distances from its centre to every
    key patch's centre; then the mean over query patches and images. Prefix tokens (the class
    token) are left out as queries and as keys; the remaining weights of each query are
    renormalised to sum to one, so the result is a true weighted mean distance.

    Args:
        attentions: (layers, batch, heads, tokens, tokens) softmax attention, or one layer
            (batch, heads, tokens, tokens).
        grid_size: (rows, cols) of the patch grid (an int for square grids).
        patch_size: input pixels per token along each axis (for hybrids the patch size times the
            ResNet stride, `model.stride`).

    Returns:
        (layers, heads) distances in pixels, or (heads,) for a single layer.

    Example:
        >>> uniform = np.full((1, 1, 196, 196), 1 / 196)    # one head on a 14x14 grid
        >>> float(mean_attention_distance(uniform, 14, 16)[0].round(1))
        116.5
    """
    a = np.asarray(attentions, dtype=np.float64)
    single_layer = a.ndim == 4
    if single_layer:
        a = a[None]
    if a.ndim != 5 or a.shape[-1] != a.shape[-2]:
        raise ValueError(
            "mean_attention_distance expects (layers, batch, heads, tokens, tokens) or "
            f"(batch, heads, tokens, tokens); got {np.shape(attentions)}."
        )
    grid = as_pair(grid_size, "grid_size")
    prefix = _prefix_tokens(a.shape[-1], grid)
    a = a[..., prefix:, prefix:]
    a = a / np.maximum(a.sum(axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    centres = patch_centres(grid, patch_size)
    distance = np.sqrt(((centres[:, None, :] - centres[None, :, :]) ** 2).sum(-1))  # (N, N)
    per_query = np.einsum("lbhqk,qk->lbhq", a, distance)
    result = per_query.mean(axis=(1, 3))
    return result[0] if single_layer else result


# === Embeddings ===


def position_embedding_similarity(position_embedding, grid_size):
    """Cosine similarity between the position embeddings of all patch pairs (Figure 10).

    Args:
        position_embedding: (1, tokens, hidden) or (tokens, hidden); prefix tokens (the class
            token's embedding) in front of the rows * cols patch embeddings are dropped.
        grid_size: (rows, cols) of the patch grid.

    Returns:
        (rows, cols, rows, cols): entry [i, j, k, l] is the similarity of patch (i, j) with
        patch (k, l); each [i, j] tile is one small image of the paper's figure.
    """
    pe = np.asarray(position_embedding, dtype=np.float64)
    if pe.ndim == 3:
        pe = pe[0]
    rows, cols = as_pair(grid_size, "grid_size")
    prefix = _prefix_tokens(pe.shape[0], (rows, cols))
    pe = pe[prefix:]
    unit = pe / np.maximum(np.linalg.norm(pe, axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    return (unit @ unit.T).reshape(rows, cols, rows, cols)


def principal_components(kernel, n=28):
    """Leading principal components of the filters of a patch-embedding kernel (Figure 7, left).

    Args:
        kernel: (p, p, channels, hidden) conv kernel: `hidden` filters of p x p x channels.
        n: how many components; at most min(hidden, p * p * channels) exist and are returned.

    Returns:
        (components (n, p, p, channels), explained variance ratio (n,)). Components are unit
        vectors (their sign is arbitrary, as for any PCA); the filters are centred first.
    """
    k = np.asarray(kernel, dtype=np.float64)
    if k.ndim != 4:
        raise ValueError(f"Expected a (p, p, channels, hidden) kernel; got shape {k.shape}.")
    p_h, p_w, channels, hidden = k.shape
    filters = k.reshape(-1, hidden).T  # (hidden, p*p*C): one row per filter
    filters = filters - filters.mean(axis=0, keepdims=True)
    _, singular, vt = np.linalg.svd(filters, full_matrices=False)
    n = int(min(n, vt.shape[0]))
    variance = singular**2
    ratio = variance[:n] / max(variance.sum(), np.finfo(np.float64).tiny)
    return vt[:n].reshape(n, p_h, p_w, channels), ratio
