"""The learned embeddings of a model: position-embedding similarity and patch-embedding filters."""

import keras
import numpy as np

from keras_vit.analysis import maths
from keras_vit.analysis.attention import anatomy


def position_embedding_similarity(model):
    """Cosine similarity of the position embeddings of every pair of patches (Figure 10).

    Works on any keras_vit model (hybrids included: their tokens are patches of the ResNet
    feature map). The class token's embedding is left out.

    Returns:
        (rows, cols, rows, cols) float64: [i, j] is the similarity map of patch (i, j).

    Example:
        >>> sim = position_embedding_similarity(model)     # (14, 14, 14, 14) for a /16 at 224
        >>> plots.plot_position_embedding_similarity(sim, "pe.png")
    """
    info = anatomy(model)
    layer = next((x for x in info.owner.layers if hasattr(x, "embedding") and hasattr(x, "grid_size")), None)
    if layer is None:
        raise ValueError(
            f"Model {model.name!r} adds no position embedding to its tokens (position_embedding="
            f"{getattr(info.owner, 'position_embedding', None)!r}); nothing to compare."
        )
    pe = np.asarray(keras.ops.convert_to_numpy(layer.embedding()), dtype=np.float32)[None]
    return maths.position_embedding_similarity(pe, layer.grid_size)  # the grid its weights are laid out on


def patch_embedding_components(model, n=28, return_variance=False):
    """Leading principal components of the patch-embedding filters (Figure 7, left).

    The `embedding` conv has `hidden_size` filters of patch x patch x channels pixels; their
    principal components (after centring) are returned as small images. Fewer than `n` come
    back when the filters span fewer dimensions (min(hidden, p * p * channels)).

    Args:
        model: a keras_vit ViT (not a hybrid, see Raises).
        n: number of components (the paper shows 28).
        return_variance: also return each component's explained variance ratio.

    Returns:
        (n, p, p, channels) unit-norm components (signs arbitrary), and with `return_variance`
        a (n,) array of explained variance ratios.

    Raises:
        ValueError for hybrids (R+ViT): their embedding projects ResNet feature maps, not image
        pixels, so its filters are not pictures of the input.

    Example:
        >>> comps = patch_embedding_components(keras_vit.ViTB16(weights=None))   # (28, 16, 16, 3)
    """
    info = anatomy(model)
    kernel = np.asarray(info.patch_embedding.kernel.numpy(), dtype=np.float32)
    if info.hybrid:
        p, _, channels, _ = kernel.shape
        raise ValueError(
            f"Model {info.model.name!r} is a hybrid (R+ViT): its patch embedding is a {p}x{p} projection of "
            f"{channels}-channel ResNet features (one token per {info.stride[0]}x{info.stride[1]} input pixels), "
            "not of image pixels, so its filters are not images and Figure 7 (left) does not apply. Inspect a "
            "pure ViT, or the ResNet's first convolution (layer 'conv_root') for pixel-space filters."
        )
    components, variance = maths.principal_components(kernel, n)
    return (components, variance) if return_variance else components
