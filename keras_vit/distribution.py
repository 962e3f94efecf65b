"""Scale-out with Keras' own engine: a `keras.distribution.LayoutMap` for every ViT and R+ViT.

`get_layout_map(device_mesh)` returns the tensor-parallel ("Megatron") layout of the model's
variables on the mesh's model axis; `keras.distribution.ModelParallel` applies it (JAX backend).
Each sublayer of an encoder block costs one all-reduce over the model axis per pass:

- attention: query/key/value kernels (hidden, heads, head_dim) are split along heads (their
  biases (heads, head_dim) likewise), so every device attends with whole heads of its own; the
  out kernel (heads, head_dim, hidden) is split along its rows (heads) and its partial sums are
  all-reduced; the out bias is replicated (added once, after the sum);
- MLP: Dense_0 (hidden, mlp) by columns with its bias, GELU on the local slice, Dense_1
  (mlp, hidden) by rows, one all-reduce; Dense_1's bias replicated;
- embeddings: the patch-embedding kernel and bias, the class token and the position embedding
  are split along hidden. A conv's output channels are independent, so each device computes its
  slice of every token with no communication; the sequence is gathered by the first block;
- pre_logits by columns and head by rows (input features): a column/row pair needs one
  all-reduce of (batch, classes) and works for any class count (21843 is odd);
- the hybrids' BiT ResNet (conv_root, gn_root, block*/unit*) is replicated on purpose: it works
  on large spatial activations with few parameters (ResNet-50 stages are < 8% of R50+ViT-L), and
  splitting output channels would all-gather (batch, height, width, channels) before every conv;
  data parallelism over the batch axis scales it instead;
- LayerNorm / GroupNorm scales and biases are replicated (tiny, needed whole by every device);
- the output of each block's two residual branches (attention, MLP) is laid out
  (batch, None, None): split over the data axis, whole on the model axis, which states where the
  all-reduce of each sublayer lands and keeps the batch on the data axis. (XLA may still choose
  to do the residual add and LayerNorm split on hidden, adding an all-gather per sublayer; the
  CPU compiler does, see docs/TPU.md.)

Every variable is matched by exactly one rule (replication is a rule, never a miss). Keys are
regular expressions on `Variable.path` (`encoderblock_3/MlpBlock_3/Dense_1/kernel`, ...),
optionally under any name scope, so a model built here, loaded from a checkpoint
(`keras_vit.load_checkpoint`, `keras.saving.load_model`) or from a constructor gets the same
layout: the paths are the layer names of the original checkpoints.
"""

import warnings

import keras

# Any name scope may precede the model's own paths (a model built inside another scope).
_SCOPE = r"(?:.*/)?"
_BLOCK = _SCOPE + r"encoderblock_\d+/"
_ATTENTION = _BLOCK + r"MultiHeadDotProductAttention_1/"
_MLP = _BLOCK + r"MlpBlock_3/"


def _rules(m):
    """(group, regex, axes) of every ViT variable, with `m` the model axis name.

    `group` names the dimension a sharded rule needs divisible: the fallback replicates a whole
    group at once so that no sublayer is left half-split.
    """
    return [
        # Attention: split along heads (columns of q/k/v), rows of out.
        ("heads", _ATTENTION + r"(?:query|key|value)_kernel", (None, m, None)),
        ("heads", _ATTENTION + r"(?:query|key|value)_bias", (m, None)),
        ("heads", _ATTENTION + r"out_kernel", (m, None, None)),
        (None, _ATTENTION + r"out_bias", (None,)),
        # MLP: Dense_0 by columns, Dense_1 by rows.
        ("mlp_dim", _MLP + r"Dense_0/kernel", (None, m)),
        ("mlp_dim", _MLP + r"Dense_0/bias", (m,)),
        ("mlp_dim", _MLP + r"Dense_1/kernel", (m, None)),
        (None, _MLP + r"Dense_1/bias", (None,)),
        # Norms: replicated.
        (None, _BLOCK + r"LayerNorm_[02]/(?:gamma|beta)", (None,)),
        (None, _SCOPE + r"encoder_norm/(?:gamma|beta)", (None,)),
        # Embeddings: split along hidden (the conv's output channels).
        ("hidden_size", _SCOPE + r"embedding/kernel", (None, None, None, m)),
        ("hidden_size", _SCOPE + r"embedding/bias", (m,)),
        ("hidden_size", _SCOPE + r"cls/cls", (None, None, m)),
        ("hidden_size", _SCOPE + r"posembed_input/pos_embedding", (None, None, m)),
        # Classifier: pre_logits by columns, head by rows.
        ("representation_size", _SCOPE + r"pre_logits/kernel", (None, m)),
        ("representation_size", _SCOPE + r"pre_logits/bias", (m,)),
        ("head_input", _SCOPE + r"head/kernel", (m, None)),
        (None, _SCOPE + r"head/bias", (None,)),
        # Hybrid BiT ResNet: replicated (see the module docstring).
        (None, _SCOPE + r"conv_root/kernel", (None, None, None, None)),
        (None, _SCOPE + r"gn_root/(?:scale|bias)", (None,)),
        (None, _SCOPE + r"block\d+/unit\d+/conv(?:1|2|3|_proj)/kernel", (None, None, None, None)),
        (None, _SCOPE + r"block\d+/unit\d+/gn(?:1|2|3|_proj)/(?:scale|bias)", (None,)),
    ]


_GROUP_WHAT = {
    "heads": "attention (query/key/value/out kernels and biases)",
    "mlp_dim": "MLP (Dense_0 and Dense_1)",
    "hidden_size": "embeddings (embedding kernel/bias, class token, position embedding)",
    "representation_size": "pre_logits",
    "head_input": "head kernel",
}


def _model_dims(config):
    """The sizes the fallback rule checks: heads, mlp_dim, hidden, representation, head input."""
    if config is None:
        return None
    if isinstance(config, str):
        from keras_vit.models.config import get_architecture

        config = get_architecture(config.replace("-", "").replace("/", "").replace("+", "")).kwargs()
    elif isinstance(config, keras.Model):
        config = config.get_config()
    elif not isinstance(config, dict):
        raise TypeError(
            "config must be None, a VisionTransformer, its get_config() dict or an architecture name "
            f"such as 'ViTL16'; got {type(config).__name__}."
        )
    missing = [k for k in ("hidden_size", "num_heads", "mlp_dim") if k not in config]
    if missing:
        raise ValueError(f"config lacks {missing}; pass a VisionTransformer config (model.get_config()).")
    hidden = int(config["hidden_size"])
    representation = config.get("representation_size")
    return {
        "heads": int(config["num_heads"]),
        "mlp_dim": int(config["mlp_dim"]),
        "hidden_size": hidden,
        "representation_size": None if representation is None else int(representation),
        "head_input": hidden if representation is None else int(representation),
    }


def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch", *, config=None):
    """The tensor-parallel `keras.distribution.LayoutMap` of a ViT or R+ViT on `device_mesh`.

    Attention is split along heads and the MLP along its hidden units on the mesh axis
    `model_parallel_dim_name` (one all-reduce per sublayer), embeddings along hidden, pre_logits
    by columns and the head by rows; norms and the hybrid ResNet stem are replicated. The outputs
    of each block's attention and MLP branches are laid out (batch, None, None), with batch the
    `data_parallel_dim_name` axis; no weight is split on that axis. See the
    module docstring for the reasons.

    A split needs the model axis size to divide the dimension it splits (JAX refuses uneven
    shards). Pass `config` to apply the fallback rule: a group whose size the axis does not
    divide — the attention (num_heads), the MLP (mlp_dim), the embeddings (hidden_size),
    pre_logits (representation_size), the head (its input width) — is replicated as a whole on
    the model axis, with a warning naming it. Without `config`, every group is split and the
    model axis must divide num_heads, mlp_dim and hidden_size (true for ViT-B on 2/4, ViT-L and
    ViT-H on 2/4/8/16, not for ViT-Ti's 3 heads).

    Args:
        device_mesh: a `keras.distribution.DeviceMesh`, e.g. shape (2, 4) with axis names
            ("batch", "model").
        model_parallel_dim_name: the mesh axis the weights are split on.
        data_parallel_dim_name: the mesh axis the batch is split on (None: no data axis).
        config: None, a `VisionTransformer`, its `get_config()` dict, or an architecture name
            of the table ("ViTL16", "ViT-L/16", "R50ViTB16").

    Returns:
        A `keras.distribution.LayoutMap` for `keras.distribution.ModelParallel`.

    Example:
        >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
        >>> layout_map = keras_vit.get_layout_map(mesh, config="ViTL16")
        >>> keras.distribution.set_distribution(
        ...     keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))
        >>> model = keras_vit.ViTL16(weights=None)     # built sharded
    """
    axes = tuple(device_mesh.axis_names)
    if model_parallel_dim_name not in axes:
        raise ValueError(
            f"The device mesh has axes {axes}, not the model axis {model_parallel_dim_name!r}. Name the mesh "
            f"axes e.g. ('batch', 'model') or pass model_parallel_dim_name= one of {axes}."
        )
    if data_parallel_dim_name is not None and data_parallel_dim_name not in axes:
        raise ValueError(
            f"The device mesh has axes {axes}, not the data axis {data_parallel_dim_name!r}. Pass "
            f"data_parallel_dim_name= one of {axes}, or None for a mesh without a data axis."
        )
    if data_parallel_dim_name == model_parallel_dim_name:
        raise ValueError(f"The data and model axes must differ; both are {model_parallel_dim_name!r}.")
    size = int(device_mesh.shape[axes.index(model_parallel_dim_name)])
    dims = _model_dims(config)

    replicated = {}
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for group, pattern, spec in _rules(model_parallel_dim_name):
        if group is not None and dims is not None:
            n = dims[group]
            if n is None or n % size:
                if n is not None:
                    replicated[group] = n
                spec = (None,) * len(spec)
        layout_map[pattern] = spec
    # The two residual branches of every block (attention after its dropout layer, the MLP
    # block): batch-split, whole on the model axis. This places the sublayers' all-reduce (the
    # partial sums of the out / Dense_1 row splits) and keeps the residual stream data-parallel.
    # Both are single (batch, tokens, hidden) tensors whatever the call's options.
    for branch in ("dropout", "MlpBlock_3"):
        layout_map[_BLOCK + branch + "/output"] = (data_parallel_dim_name, None, None)

    if replicated:
        detail = "; ".join(f"{_GROUP_WHAT[g]}: {g}={n}" for g, n in replicated.items())
        warnings.warn(
            f"The model axis {model_parallel_dim_name!r} has {size} devices, which does not divide {detail}. "
            "Those weights are replicated on the model axis (still split by nothing, trained data-parallel). "
            f"Choose a model axis size that divides them to shard them.",
            stacklevel=2,
        )
    return layout_map


def rule_for(layout_map, path):
    """The key of `layout_map` whose regex matches the variable path `path` in full, or None.

    Raises ValueError when several keys match (as `LayoutMap` itself does).
    """
    import re

    keys = [k for k in layout_map if re.fullmatch(k, path)]
    if len(keys) > 1:
        raise ValueError(f"Variable path {path!r} matches several layout rules: {keys}.")
    return keys[0] if keys else None
