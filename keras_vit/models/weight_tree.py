"""The canonical weight tree: a model's weights under the original Flax checkpoint names.

Keys are '/'-joined paths of google-research/vision_transformer's .npz files
(`Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel`, `cls`, `block1/unit1/conv1/kernel`),
values are arrays in the original shapes. Every checkpoint reader produces this tree and every
writer consumes it; `set_weight_tree` is the one place weights enter a model.
"""

import numpy as np

# Layers that live under the original `Transformer` module.
_TRANSFORMER_PREFIX = ("encoderblock_", "posembed_input", "encoder_norm")


class WeightTreeError(ValueError):
    """A weight tree that does not fit the model: missing, unexpected or mis-shaped weights."""


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
        elif layer.weights and hasattr(layer, "gamma"):  # LayerNormalization
            items = {"scale": layer.gamma, "bias": layer.beta}.items()
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


def set_weight_tree(model, tree, *, source_grid=None, resize_rule=None, skip=(), allow_missing=()):
    """Assign `tree` to `model`, checking everything first so a failure changes nothing.

    Args:
        model: a keras_vit VisionTransformer.
        tree: {canonical key: array}. Keys under `skip` prefixes (e.g. "head/", "pre_logits/")
            are ignored; keys under `allow_missing` prefixes may be absent from the tree (their
            variables keep their initial values).
        source_grid: (rows, cols) of the tree's position embedding when it is not square or not
            the model's grid; the embedding is then resized with `resize_rule` (default: the
            model's own rule).

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
    pos_key = "Transformer/posembed_input/pos_embedding"
    for key, var in variables.items():
        if key not in tree:
            continue
        value = tree[key]
        if not hasattr(value, "shape"):
            value = np.asarray(value)
        # Arrays that are read lazily (keras_vit.checkpoints) are checked by shape here and read
        # one at a time below, so a conversion never holds the whole tree next to the model.
        if key == pos_key and tuple(value.shape) != tuple(var.shape):
            value = _resized_position_embedding(model, np.asarray(value), source_grid, resize_rule, problems)
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
    for key, value in values.items():
        var = variables[key]
        var.assign(np.array(value, dtype=var.dtype))  # a copy: the model never aliases the tree


def _resized_position_embedding(model, value, source_grid, resize_rule, problems):
    layer = model.get_layer("posembed_input")
    if value.ndim != 3 or value.shape[-1] != layer.pos_embedding.shape[-1]:
        problems.append(
            f"shape mismatch for position embedding: checkpoint {tuple(value.shape)} vs model "
            f"{tuple(layer.pos_embedding.shape)}"
        )
        return None
    try:
        return layer.resized(value, source_grid, rule=resize_rule)
    except ValueError as err:
        problems.append(str(err))
        return None
