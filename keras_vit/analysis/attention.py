"""Attention read off any keras_vit model, without rebuilding it.

`attention_weights(model, images)` builds (once per model, cached) a functional sub-model that
reuses the model's own layers: everything up to the first encoder block as it is, then each
`EncoderBlock` called with `return_attention_weights=True`. It finds the blocks wherever they
sit: a `VisionTransformer`, a hybrid, a loaded `.keras` file, or a `keras.Model` that wraps one
(e.g. the constructors' `input_tensor=` result, or preprocessing layers in front).
"""

import weakref
from dataclasses import dataclass

import keras
import numpy as np

from keras_vit.analysis import maths
from keras_vit.layers.resnet import ResNetStage, StdConv2D
from keras_vit.layers.transformer import EncoderBlock, PatchEmbedding, PositionEmbedding


@dataclass(frozen=True)
class Anatomy:
    """Where the Transformer sits in a model and the geometry the analysis needs."""

    model: keras.Model  # the model handed in
    owner: keras.Model  # the functional model whose layers are the encoder blocks
    chain: tuple  # models from `model` down to `owner`, each nested in the previous
    blocks: tuple  # the EncoderBlock layers in order
    patch_embedding: PatchEmbedding
    position_embedding: PositionEmbedding  # None for models without a learned 1-D embedding
    image_size: tuple  # (height, width) of the owner's input images; None when known only at run time
    grid_size: tuple  # (rows, cols) of the patch grid; None when it follows the input size (`grid_for`)
    num_prefix_tokens: int  # 1 with a class token, 0 for "gap" models
    stride: tuple  # input pixels per token along (height, width)
    hybrid: bool  # a ResNet (or other layers) turns the image into features before the embedding

    @property
    def num_heads(self):
        return self.blocks[0].num_heads

    def grid_for(self, images):
        """(rows, cols) of the patch grid of a batch of `images` (batch, height, width, channels)."""
        if self.grid_size is not None:
            return self.grid_size
        return images.shape[1] // self.stride[0], images.shape[2] // self.stride[1]


def _find_owner(model, chain=()):
    chain = chain + (model,)
    if any(isinstance(layer, EncoderBlock) for layer in model.layers):
        return chain
    for layer in model.layers:
        if isinstance(layer, keras.Model) and hasattr(layer, "layers"):
            found = _find_owner(layer, chain)
            if found:
                return found
    return None


def _only(layers, kind, owner):
    found = [layer for layer in layers if isinstance(layer, kind)]
    if len(found) != 1:
        raise ValueError(
            f"Expected one {kind.__name__} layer in model {owner.name!r}; found {len(found)}. "
            "keras_vit.analysis works on models built by keras_vit (VisionTransformer and the constructors)."
        )
    return found[0]


def anatomy(model):
    """Locate the encoder blocks, embeddings and patch grid of `model` (see `Anatomy`)."""
    if not isinstance(model, keras.Model) or not hasattr(model, "layers"):
        raise TypeError(f"Expected a keras.Model built with keras_vit; got {type(model).__name__}.")
    chain = _find_owner(model)
    if chain is None:
        raise ValueError(
            f"Model {model.name!r} holds no keras_vit EncoderBlock layer (not even in nested models), so "
            "it has no ViT attention to inspect. Pass a keras_vit.VisionTransformer or a model wrapping one."
        )
    owner = chain[-1]
    if hasattr(owner, "attention_axes"):  # an Axial-ViT (keras_vit.models.AxialVisionTransformer)
        raise ValueError(
            f"Model {owner.name!r} is an Axial-ViT: each block attends within the rows or within the columns of the "
            "patch grid, never over the whole grid, so keras_vit.analysis' (layers, batch, heads, tokens, tokens) "
            "maps, rollout and attention distance do not exist for it. Its row and column maps: "
            "model.attention_weights(images) -> {'row': (layers, batch, rows, heads, cols, cols), "
            "'column': (layers, batch, cols, heads, rows, rows)}."
        )
    blocks = tuple(layer for layer in owner.layers if isinstance(layer, EncoderBlock))
    patch = _only(owner.layers, PatchEmbedding, owner)
    # The grid: from the VisionTransformer itself (any position embedding), else from its
    # position-embedding layer.
    grid_layers = [layer for layer in owner.layers if hasattr(layer, "grid_size") and hasattr(layer, "num_prefix_tokens")]
    position = next((layer for layer in owner.layers if isinstance(layer, PositionEmbedding)), None)
    if hasattr(owner, "config") and hasattr(owner, "grid_size"):
        (rows, cols), prefix = owner.grid_size, owner.num_prefix_tokens
    elif grid_layers:
        (rows, cols), prefix = grid_layers[0].grid_size, grid_layers[0].num_prefix_tokens
    else:
        _only(owner.layers, PositionEmbedding, owner)  # raises: nothing tells the grid
    if len(owner.inputs) != 1:
        raise ValueError(f"Model {owner.name!r} has {len(owner.inputs)} inputs; expected one image input.")
    height, width = owner.inputs[0].shape[1:3]
    if (height is None or width is None) and getattr(getattr(owner, "config", None), "dynamic_image_size", False):
        # Any input size: the grid follows each batch's images (see Anatomy.grid_for).
        stride = owner.config.stride
        image_size, grid, stride = None, None, (stride, stride)
    elif height is None or width is None or height % rows or width % cols:
        raise ValueError(
            f"Cannot relate the {height}x{width} input of {owner.name!r} to its {rows}x{cols} patch grid."
        )
    else:
        image_size, grid, stride = (height, width), (rows, cols), (height // rows, width // cols)
    hybrid = any(isinstance(layer, (StdConv2D, ResNetStage)) for layer in owner.layers)
    return Anatomy(
        model=model,
        owner=owner,
        chain=chain,
        blocks=blocks,
        patch_embedding=patch,
        position_embedding=position,
        image_size=image_size,
        grid_size=grid,
        num_prefix_tokens=prefix,
        stride=stride,
        hybrid=hybrid,
    )


# === The attention sub-model ===


class _AttentionProbe(keras.layers.Layer):
    """Calls one of the model's own EncoderBlocks with `return_attention_weights=True`.

    A thin wrapper only so that the call has a symbolic output spec (tokens, weights) in a
    functional graph; the block and its variables are the model's, nothing is copied.
    """

    def __init__(self, block, **kwargs):
        super().__init__(name=f"{block.name}_attention", dtype=block.dtype_policy, **kwargs)
        self.block = block

    def call(self, tokens, images=None):
        if images is not None:  # a rotary block that reads each batch's grid off the images
            return self.block(tokens, images, training=False, return_attention_weights=True)
        return self.block(tokens, training=False, return_attention_weights=True)

    def compute_output_spec(self, tokens, images=None):
        batch, length, _ = tokens.shape
        weights = keras.KerasTensor((batch, self.block.num_heads, length, length), dtype=tokens.dtype)
        return keras.KerasTensor(tokens.shape, dtype=tokens.dtype), weights


def _input_tensors(layer, parent):
    nodes = [node for node in layer._inbound_nodes if node.operation is layer]
    if len(nodes) != 1:
        raise ValueError(
            f"Layer {layer.name!r} is called {len(nodes)} times inside {parent.name!r}; the attention "
            "sub-model needs a single call path from the images to the encoder blocks."
        )
    return nodes[0].input_tensors


def _single_input_tensor(layer, parent):
    tensors = _input_tensors(layer, parent)
    if len(tensors) != 1:
        raise ValueError(f"Layer {layer.name!r} takes {len(tensors)} inputs; expected one tensor.")
    return tensors[0]


def _block_inputs(block, parent):
    """(tokens, whether the block also reads the images): a rotary block of a dynamic_image_size
    model takes the model's images as its second input, to read each batch's grid. The kept
    patches' positions that a rotary block takes from patch dropout matter in training only, so
    the probe, which runs at inference, leaves them out."""
    tensors = [t for t in _input_tensors(block, parent) if not _is_patch_dropout_indices(t)]
    if len(tensors) == 2 and tensors[1] is parent.inputs[0]:
        return tensors[0], True
    if len(tensors) != 1:
        raise ValueError(f"Layer {block.name!r} takes {len(tensors)} inputs; expected one tensor.")
    return tensors[0], False


def _is_patch_dropout_indices(tensor):
    from keras_vit.layers import PatchDropout

    history = getattr(tensor, "_keras_history", None)  # the layer and output that made the tensor
    return history is not None and isinstance(history.operation, PatchDropout) and history.tensor_index == 1


def _build_attention_model(info):
    blocks = info.blocks
    # Blocks must follow one another directly (as VisionTransformer builds them).
    for previous, block in zip(blocks, blocks[1:]):
        if _block_inputs(block, info.owner)[0] is not previous.output:
            raise ValueError(
                f"{block.name!r} does not take {previous.name!r}'s output directly; cannot trace attention."
            )
    outer = info.chain[0]
    images = keras.Input(shape=tuple(outer.inputs[0].shape[1:]), dtype=outer.inputs[0].dtype, name="images")
    x = images
    # Outer wrappers: whatever runs between their input and the nested model (preprocessing).
    for parent, child in zip(info.chain, info.chain[1:]):
        child_input = _single_input_tensor(child, parent)
        if child_input is not parent.inputs[0]:
            x = keras.Model(parent.inputs, child_input, name=f"{parent.name}_to_{child.name}")(x)
    tokens, _ = _block_inputs(blocks[0], info.owner)
    owner_images = x
    x = keras.Model(info.owner.inputs, tokens, name=f"{info.owner.name}_embed")(x)
    weights = []
    for block in blocks:
        reads_images = _block_inputs(block, info.owner)[1]
        x, w = _AttentionProbe(block)(x, owner_images) if reads_images else _AttentionProbe(block)(x)
        weights.append(w)
    return keras.Model(images, weights, name=f"{outer.name}_attention")


_CACHE = weakref.WeakKeyDictionary()


def attention_model(model):
    """The cached functional model: images -> list of per-layer attention (batch, heads, T, T).

    Shares every layer and variable with `model` (later weight changes are seen).
    """
    cached = _CACHE.get(model)
    if cached is None:
        cached = _build_attention_model(anatomy(model))
        _CACHE[model] = cached
    return cached


def _as_batch(images, info):
    x = np.asarray(images)
    expected = tuple(info.chain[0].inputs[0].shape[1:])
    if x.ndim == len(expected):
        x = x[None]
    if tuple(x.shape[1:]) != tuple(s if s is not None else x.shape[1 + i] for i, s in enumerate(expected)):
        raise ValueError(
            f"Images of shape {tuple(x.shape[1:])} do not fit model {info.model.name!r}, which takes "
            f"{expected}. Resize them (and scale to [-1, 1] with keras_vit preprocessing) first."
        )
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype("float32")
    return x


def attention_weights(model, images, batch_size=32):
    """Every layer's softmax attention for `images`.

    Args:
        model: a keras_vit model (VisionTransformer, hybrid, loaded checkpoint, any head or
            pooling, or a keras.Model wrapping one).
        images: (batch, height, width, channels) or one (height, width, channels) image,
            prepared as the model expects (scaled to [-1, 1] for keras_vit models).
        batch_size: images per forward pass.

    Returns:
        float32 numpy array (layers, batch, heads, tokens, tokens); rows sum to one. Token 0 is
        the class token when the model has one; the patch tokens follow in row-major order.

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...                                     num_layers=2, num_heads=2, mlp_dim=32, classes=10)
        >>> attention_weights(model, np.zeros((1, 32, 32, 3))).shape
        (2, 1, 2, 17, 17)
    """
    info = anatomy(model)
    x = _as_batch(images, info)
    # predict() compiles the whole sub-model once (eager op-by-op calls are far slower on JAX).
    out = attention_model(model).predict(x, batch_size=batch_size, verbose=0)
    if not isinstance(out, (list, tuple)):  # a one-block model: Keras returns its single output bare
        out = [out]
    return np.stack([np.asarray(w, dtype=np.float32) for w in out])


def attention_rollout(model, images, head_fusion="mean", discard_ratio=0.0, batch_size=32):
    """Attention rollout maps of `images`: (batch, grid_rows, grid_cols).

    See `maths.rollout`: heads fused, identity added, rows renormalised, layers multiplied. The
    map is the class token's row over the patch tokens; for "gap" models (no class token) it is
    the mean over all query tokens, i.e. the rollout of the average the head reads. Values are
    the rollout weights themselves (for display, `overlay_attention` rescales them).

    Example:
        >>> maps = attention_rollout(model, images)        # (batch, 14, 14) for a /16 at 224
    """
    info = anatomy(model)
    x = _as_batch(images, info)
    maps = []
    for start in range(0, len(x), batch_size):
        a = attention_weights(model, x[start : start + batch_size], batch_size=batch_size)
        maps.append(maths.rollout_map(maths.rollout(a, head_fusion, discard_ratio), info.grid_for(x)))
    return np.concatenate(maps, axis=0)


def attention_distance(model, images, batch_size=32):
    """Mean attention distance in pixels, (layers, heads), of `model` on `images`.

    The model-level face of `maths.mean_attention_distance`, streamed in batches so that many
    images (the paper uses 128) need not hold every attention matrix at once. Pixels are input
    pixels: for hybrids one token covers `patch_size * ResNet stride` of them.
    """
    info = anatomy(model)
    x = _as_batch(images, info)
    total = None
    for start in range(0, len(x), batch_size):
        a = attention_weights(model, x[start : start + batch_size], batch_size=batch_size)
        d = maths.mean_attention_distance(a, info.grid_for(x), info.stride) * a.shape[1]
        total = d if total is None else total + d
    return total / len(x)
