"""The canonical weight tree: a model's weights under the original Flax checkpoint names.

Keys are '/'-joined paths of google-research/vision_transformer's .npz files
(`Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel`, `cls`, `block1/unit1/conv1/kernel`),
values are arrays in the original shapes. Every checkpoint reader produces this tree and every
writer consumes it; `set_weight_tree` is the one place weights enter a model.
"""

import keras
import numpy as np

from keras_vit.errors import CheckpointError

# Layers that live under the original `Transformer` module.
_TRANSFORMER_PREFIX = ("encoderblock_", "posembed_input", "encoder_norm")


class WeightTreeError(CheckpointError):
    """A weight tree that does not fit the model: missing, unexpected or mis-shaped weights (a
    CheckpointError, so one `except` catches every way a checkpoint can fail to load)."""


def _layer_prefix(name):
    if name.startswith(_TRANSFORMER_PREFIX):
        return f"Transformer/{name}"
    return name


def weight_variables(model):
    """{canonical key: keras.Variable} for every weight of a keras_vit model (a model that defines
    `weight_tree_variables()`, such as BiTResNet, states its own tree)."""
    quantized = {
        layer.path: layer.quantization_mode
        for layer in model._flatten_layers()
        if getattr(layer, "quantization_mode", None) is not None
    }
    if quantized:
        modes = "/".join(sorted(set(quantized.values())))
        raise WeightTreeError(
            f"The model is {modes}-quantized ({_describe(quantized, limit=3)}); the weight tree holds "
            "float weights in the original layout, which a quantized model no longer has. Convert, "
            "export or load the float model, then quantize."
        )
    if hasattr(model, "weight_tree_variables"):  # a model with its own layout (BiTResNet)
        return dict(model.weight_tree_variables())
    out = {}
    for layer in model.layers:
        prefix = _layer_prefix(layer.name)
        if hasattr(layer, "weight_tree_variables"):
            items = layer.weight_tree_variables().items()
        elif layer.weights and hasattr(layer, "gamma"):  # LayerNormalization (RMSNorm: no bias)
            items = {"scale": layer.gamma, **({"bias": layer.beta} if getattr(layer, "beta", None) is not None else {})}
            items = items.items()
        elif layer.weights and hasattr(layer, "kernel"):  # Dense (pre_logits, head)
            items = {"kernel": layer.kernel, "bias": layer.bias}.items()
        elif layer.weights:
            raise TypeError(f"Layer {layer.name!r} has weights but no canonical names.")
        else:
            continue
        for key, var in items:
            out[f"{prefix}/{key}" if key else prefix] = var
    return out


def get_weight_tree(model):
    """The model's weights as {canonical key: float32 numpy array}."""
    return {k: np.asarray(v.numpy(), dtype=np.float32) for k, v in weight_variables(model).items()}


def _describe(keys, limit=8):
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


def set_weight_tree(model, tree, *, source_grid=None, resize_rule=None, patch_resize_rule=None, skip=(),
                    allow_missing=()):
    """Assign `tree` to `model`, checking everything first so a failure changes nothing.

    Args:
        model: a keras_vit VisionTransformer.
        tree: {canonical key: array}. Keys under `skip` prefixes (e.g. "head/", "pre_logits/")
            are ignored; keys under `allow_missing` prefixes may be absent from the tree (their
            variables keep their initial values).
        source_grid: (rows, cols) of the tree's position embedding when it is not square or not
            the model's grid; the embedding is then resized with `resize_rule` (default: the
            model's own rule).
        patch_resize_rule: a rule of `layers.resize.PATCH_RESIZE_RULES` to PI-resize a patch
            embedding kernel of another patch size to the model's; None treats it as a mismatch.

    Raises:
        WeightTreeError naming every missing, unexpected and mis-shaped weight.
    """
    variables = weight_variables(model)
    # str.startswith(()) is False, so empty prefix tuples skip / allow nothing.
    tree = {k: v for k, v in tree.items() if not k.startswith(tuple(skip))}
    missing = [k for k in variables if k not in tree and not k.startswith(tuple(allow_missing))]
    unexpected = [k for k in tree if k not in variables]
    problems = []
    if missing:
        problems.append(f"missing weights: {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected weights: {_describe(unexpected)}")
    values = {}
    grid = getattr(model, "grid_size", None)
    if getattr(model, "position_embedding", None) == "relative" and source_grid is not None and grid is not None:
        if tuple(source_grid) != tuple(grid):
            from keras_vit.layers.transformer import relative_resize_error

            problems.append(relative_resize_error(f"grid {tuple(source_grid)} to {tuple(grid)}"))
    for key, var in variables.items():
        if key not in tree:
            continue
        value = tree[key]
        if not hasattr(value, "shape"):
            value = np.asarray(value)
        # Arrays that are read lazily (keras_vit.checkpoints) are checked by shape here; a model
        # being built (keras_vit.loading) reads each only as its variable is created, so a
        # conversion never holds the whole tree next to the model.
        if tuple(value.shape) != tuple(var.shape):
            # Position embeddings laid out on another grid: the owning layer resizes them.
            value = _resized(model, key, value, source_grid, resize_rule, patch_resize_rule, problems)
            if value is None:
                continue
        if tuple(value.shape) != tuple(var.shape):
            problems.append(f"shape mismatch for {key}: checkpoint {tuple(value.shape)} vs model {tuple(var.shape)}")
            continue
        values[key] = value
    if problems:
        raise WeightTreeError(
            "The checkpoint does not fit the model: "
            + "; ".join(problems)
            + ". Check that the architecture (size, patch, classifier, hybrid stages) matches the checkpoint, "
            "or load it with keras_vit.load_checkpoint(), which infers the architecture from the file."
        )
    # Into a built model, values read lazily from a file are read before anything is assigned: a
    # read that fails (a truncated file, a NaN) then leaves every weight as it was.
    values = {
        key: value if isinstance(value, np.ndarray) or _deferred(variables[key]) else np.asarray(value)
        for key, value in values.items()
    }
    for key, value in values.items():
        var = variables[key]
        if _deferred(var):
            # Created in a keras.StatelessScope and not initialised yet (keras_vit.loading builds
            # so): the value becomes its initialiser, and the variable is created from it once,
            # when the scope ends; no zeros are written first and nothing is copied twice.
            var._initializer = _ValueInitializer(value)
        else:
            var.assign(np.array(value, dtype=var.dtype))  # a copy: the model never aliases the tree


def _deferred(var):
    """Whether `var` was created in a keras.StatelessScope and is not initialised yet."""
    return getattr(var, "_value", 0) is None and getattr(var, "_initializer", None) is not None


class _ValueInitializer:
    """An initialiser returning a checkpoint value (read only now, when it is lazy)."""

    def __init__(self, value):
        self.value = value

    def __call__(self, shape, dtype=None):
        from keras_vit.storage.safetensors import mapped_reads

        # The file's pages (a memory map) straight into the backend's own buffer: one copy, and
        # no fresh NumPy array in between. The views are often transposed (PyTorch's (out, in)
        # kernels), which each backend copies in blocks, far faster than NumPy's strided copy.
        with mapped_reads():
            view = np.asarray(self.value, dtype=np.float32)
            backend = keras.backend.backend()
            if backend == "jax":
                import jax.numpy as jnp

                array = jnp.array(view, copy=True)  # copy=True: JAX may alias aligned host memory
            elif backend == "tensorflow":
                array = _tensorflow_tensor(view)
            elif backend == "torch":
                array = _torch_tensor(view)
            else:
                array = np.array(view)
        self.value = None  # the variable holds its own copy from here on
        return array


def contiguous_layout(array):
    """(base, axes) with `base` a C-contiguous view of the same memory and
    `base.transpose(axes)` equal to `array`, or None when no permutation of the axes makes the
    array contiguous (overlapping or broadcast strides, gaps)."""
    order = sorted(range(array.ndim), key=lambda i: -abs(array.strides[i]))
    base = array.transpose(order)
    if not base.flags.c_contiguous:
        return None
    return base, tuple(order.index(i) for i in range(array.ndim))


def _tensorflow_tensor(view):
    """A TensorFlow tensor of `view` (a strided NumPy view, e.g. a transposed kernel).

    NumPy copies a transposed view element by element, several times slower than a plain copy
    of the same bytes; TensorFlow's transpose works in blocks on every core. So the view's
    contiguous base is copied as it lies (`tf.convert_to_tensor` copies every NumPy array) and
    TensorFlow permutes the axes; the variable then adopts that tensor's buffer.
    """
    import tensorflow as tf

    layout = contiguous_layout(view)
    if layout is None:
        return tf.convert_to_tensor(np.ascontiguousarray(view))
    base, axes = layout
    tensor = tf.convert_to_tensor(base)
    return tensor if axes == tuple(range(view.ndim)) else tf.transpose(tensor, axes)


def _as_matrix_transpose(shape, axes):
    """(rows, cols) when permuting a C-contiguous array of `shape` by `axes` is the transpose of
    it seen as a rows x cols matrix (the axes rotated: (k, ..., n-1, 0, ..., k-1)), else None."""
    n = len(axes)
    for k in range(1, n):
        if axes == tuple(range(k, n)) + tuple(range(k)):
            return int(np.prod(shape[:k], dtype=np.int64)), int(np.prod(shape[k:], dtype=np.int64))
    return None


#: Rows of the source per stripe of a transposed copy on PyTorch: a stripe's cache lines stay in
#: the L1 cache while its columns are written out (ViT-L/16's kernels: 0.54 s against 1.0 s for
#: one `contiguous()` of each).
_STRIPE = 128


def _torch_tensor(view):
    """A PyTorch tensor of its own holding `view` (a strided NumPy view of a memory map)."""
    import warnings

    import torch

    layout = contiguous_layout(view)
    if layout is None:  # gaps or broadcast strides: NumPy's copy is already a private array
        return torch.from_numpy(np.ascontiguousarray(view))
    base, axes = layout
    with warnings.catch_warnings():
        # The view is read-only; it is only read here, into the tensor's own memory.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        source = torch.from_numpy(base)
    out = torch.empty(view.shape, dtype=torch.float32)
    matrix = _as_matrix_transpose(base.shape, axes)
    if matrix is None:
        out.copy_(source.permute(axes))
    else:
        rows, cols = matrix
        source, target = source.reshape(rows, cols), out.view(cols, rows)
        for i in range(0, rows, _STRIPE):
            target[:, i : i + _STRIPE].copy_(source[i : i + _STRIPE].t())
    return out


def _resized(model, key, value, source_grid, resize_rule, patch_resize_rule, problems):
    """`value` fitted to the model by the layer owning `key` (its `resized_weight`), or the value
    unchanged when that layer resizes nothing (the shape check then reports it)."""
    parts = key.split("/")
    name = parts[1] if parts[0] == "Transformer" and len(parts) > 2 else parts[0]
    try:
        layer = model.get_layer(name)
    except ValueError:
        return value
    if not hasattr(layer, "resized_weight"):
        return value
    subkey = key.split(f"{name}/", 1)[-1]
    from keras_vit.layers.transformer import PatchEmbedding

    if isinstance(layer, PatchEmbedding):
        resize_rule = patch_resize_rule
    try:
        return layer.resized_weight(subkey, np.asarray(value), source_grid, resize_rule)
    except ValueError as err:
        problems.append(str(err))
        return None
