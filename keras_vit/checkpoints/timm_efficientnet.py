"""timm's TF-ported EfficientNets (`tf_efficientnet_b0` ... `b8`, `tf_efficientnet_l2`) -> the
EfficientNet weight tree.

Read from a timm Hub folder (`model.safetensors` or `pytorch_model.bin` beside the config.json
that `save_pretrained` / `push_to_hub` writes, whose `architecture` names the model), a bare
`.safetensors`, or a state dict saved with `torch.save` (a PyTorch zip file, `.pth` or `.bin`, read by
keras_vit.storage.torch_zip: no pickle code runs; files in torch's legacy pre-1.6 format are
refused, as for every format).

Mapping (PyTorch layout -> Keras layout, module paths kept, '.' -> '/'):

    conv_stem.weight (32s, 3, 3, 3)                  conv_stem/kernel (3, 3, 3, 32s)
    *.bn{1,2,3}.weight / bias / running_mean / running_var
                                                     */bn{1,2,3}/gamma / beta / moving_mean / moving_variance
    blocks.I.J.conv_dw.weight (C, 1, k, k)           blocks/I/J/conv_dw/kernel (k, k, C, 1)
    blocks.I.J.conv_pw / conv_pwl.weight (out, in, 1, 1)   .../kernel (1, 1, in, out)
    blocks.I.J.se.conv_reduce / conv_expand.weight, .bias  .../se/conv_*/kernel (1, 1, in, out), bias
    conv_head.weight, bn2.*                          conv_head/kernel, bn2/*
    classifier.weight (classes, C) / .bias           classifier/kernel (C, classes) / bias

BatchNorm's `num_batches_tracked` is dropped. `write_timm_efficientnet` writes the tree back as
a timm folder (model.safetensors + config.json) that timm loads as its `tf_efficientnet_*`
(`keras-vit convert SRC DST --to timm_efficientnet`). The config is the `EfficientNet` keyword
arguments: the width and depth multipliers of the architecture config.json names (checked
against every shape), or, for a file without one, of the architecture whose shapes the file
has; the resolution from `pretrained_cfg.input_size` (else the architecture's own); numerics of
the TF ports (BatchNorm eps 1e-3, `model_args.bn_eps` where stated). timm's other EfficientNets
(`efficientnet_b0`, PyTorch padding and BatchNorm eps 1e-5; `tf_efficientnet_lite*`, `_cc_`,
`_es`/`_em`/`_el`, `tf_efficientnetv2_*`) are other architectures and are refused by name.
"""

import json
import math
import os
import re

import numpy as np

from keras_vit.checkpoints.registry import CheckpointFormat, reads_config_object
from keras_vit.errors import CheckpointError
from keras_vit.geometry import as_pair
from keras_vit.models.efficientnet_family import (
    BATCH_NORM_EPSILON,
    CROP_PCT,
    IMAGENET_MEAN,
    IMAGENET_STD,
    INTERPOLATION,
    TIMM_MULTIPLIERS,
    weight_shapes,
)
from keras_vit.storage.files import MALFORMED, describe_keys, looks_like_safetensors, reading
from keras_vit.storage.json_files import read_json_object
from keras_vit.storage.lazy import materialize
from keras_vit.storage.torch_zip import TorchZipFile, is_torch_zip, open_weights, weights_in_folder

_SUPPORTED = re.compile(r"^tf_efficientnet_(b[0-8]|l2)$")
#: timm's EfficientNet-like architectures this reader recognises (to refuse them by name).
_EFFICIENTNET_LIKE = re.compile(r"^(tf_)?efficientnet")
_BN = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
_BN_MODULE = re.compile(r"(^|\.)bn\d$")
_MARKERS = ("conv_stem.weight", "blocks.0.0.conv_dw.weight")


def _base_name(architecture):
    return architecture.split(".", 1)[0]  # drop a pretrained tag


def is_efficientnet_state(keys):
    """Whether tensor names are an EfficientNet's of timm (its stem and first depthwise conv)."""
    keys = set(keys)
    return all(k in keys for k in _MARKERS)


# === Key mapping ===


def _tree_key(key):
    """(canonical key, layout) of timm's `key`, or None for a buffer that is dropped."""
    module, _, leaf = key.rpartition(".")
    if leaf == "num_batches_tracked":
        return None
    path = module.replace(".", "/")
    if _BN_MODULE.search(module) and leaf in _BN:
        return f"{path}/{_BN[leaf]}", None
    if module == "classifier":
        return f"classifier/{'kernel' if leaf == 'weight' else leaf}", "dense" if leaf == "weight" else None
    if leaf == "weight":
        return f"{path}/kernel", "depthwise" if module.endswith("conv_dw") else "conv"
    return f"{path}/{leaf}", None


def efficientnet_state_to_tree(files, *, source="checkpoint"):
    """The EfficientNet tree of timm tensors `files` ({timm key: file with .lazy(key)}), lazily:
    each tensor is read (and transposed) when the model assigns it."""
    tree = {}
    for key in files:
        mapped = _tree_key(key)
        if mapped is None:
            continue
        name, layout = mapped
        value = files[key].lazy(key)
        shape = tuple(value.shape)
        if layout in ("conv", "depthwise"):
            if len(shape) != 4:
                raise CheckpointError(
                    f"{source}: {key} has shape {shape}; a convolution's weight is (out, in, kh, kw).")
            value = value.transpose(2, 3, 1, 0) if layout == "conv" else value.transpose(2, 3, 0, 1)
        elif layout == "dense":
            if len(shape) != 2:
                raise CheckpointError(f"{source}: {key} has shape {shape}; the classifier's weight is (classes, C).")
            value = value.T
        elif len(shape) != 1:
            raise CheckpointError(f"{source}: {key} has shape {shape}; expected a vector.")
        tree[name] = value
    return tree


# === Config inference ===


def _compare(tree, expected, what, source, hint=""):
    """Raise a CheckpointError naming every missing, unexpected and mis-shaped weight of `tree`
    against the {key: shape} of `what`."""
    got = {k: tuple(v.shape) for k, v in tree.items()}
    missing = [k for k in expected if k not in got]
    unexpected = [k for k in got if k not in expected]
    wrong = [f"{k} {got[k]} (expected {expected[k]})" for k in expected if k in got and got[k] != expected[k]]
    if missing or unexpected or wrong:
        problems = []
        if missing:
            problems.append(f"missing weights {describe_keys(missing)}")
        if unexpected:
            problems.append(f"unexpected weights {describe_keys(unexpected)}")
        if wrong:
            problems.append(f"shape mismatches {', '.join(wrong[:4])}" + (f", ... ({len(wrong) - 4} more)"
                                                                          if len(wrong) > 4 else ""))
        raise CheckpointError(f"{source}: the weights are not those of {what}: {'; '.join(problems)}.{hint}")


def _counts(tree):
    """(stem channels, input channels, {stage: blocks}, classes or None) from the tree's shapes."""
    stem = tree.get("conv_stem/kernel")
    if stem is None or len(stem.shape) != 4:
        raise CheckpointError("no conv_stem of shape (out, in, 3, 3)")
    stages = {}
    for key in tree:
        m = re.match(r"^blocks/(\d+)/(\d+)/", key)
        if m:
            stages[int(m.group(1))] = max(stages.get(int(m.group(1)), 0), int(m.group(2)) + 1)
    head = tree.get("classifier/kernel")
    return int(stem.shape[-1]), int(stem.shape[2]), stages, (int(head.shape[-1]) if head is not None else None)


def _summary(tree):
    """"stem C, blocks per stage (...), head C" of a tree or a {key: shape} table."""
    shape = lambda key: tuple(getattr(tree[key], "shape", tree[key])) if key in tree else (0,)  # noqa: E731
    stages = {}
    for key in tree:
        m = re.match(r"^blocks/(\d+)/(\d+)/", key)
        if m:
            stages[int(m.group(1))] = max(stages.get(int(m.group(1)), 0), int(m.group(2)) + 1)
    return (f"stem {shape('conv_stem/kernel')[-1]}, blocks per stage {tuple(stages[i] for i in sorted(stages))}, "
            f"head {shape('conv_head/kernel')[-1]}")


def _candidates(tree):
    """The (width, depth) multipliers on a grid of 0.05 whose stem width and blocks per stage
    are the tree's."""
    stem, _, stages, _ = _counts(tree)
    from keras_vit.models.efficientnet_family import BASE_STAGES, round_channels

    widths = [w / 20 for w in range(1, 321) if round_channels(32, w / 20) == stem]
    repeats = [stages.get(i, 0) for i in range(len(BASE_STAGES))]
    depths = [d / 20 for d in range(1, 321)
              if [int(math.ceil(r * d / 20)) for _, r, *_ in BASE_STAGES] == repeats]
    return [(width, depth) for width in widths for depth in depths]


def _search_multipliers(tree, classes, channels):
    """(width, depth) whose shapes are the tree's, searched on a grid of 0.05 (the table's rows
    first), or None."""
    target = {k: tuple(v.shape) for k, v in tree.items()}
    for width, depth, _ in TIMM_MULTIPLIERS.values():
        if weight_shapes(width, depth, classes, channels) == target:
            return width, depth
    for width, depth in _candidates(tree):
        if weight_shapes(width, depth, classes, channels) == target:
            return width, depth
    return None


def _nearest_multipliers(tree, classes, channels):
    """The (width, depth) of `_candidates` whose shapes differ from the tree's in the fewest
    weights (timm's own rows first among equals: several depths give the same blocks per stage),
    or None when no multipliers give the tree's stem and blocks per stage."""
    target = {k: tuple(v.shape) for k, v in tree.items()}

    def differences(multipliers):
        expected = weight_shapes(*multipliers, classes, channels)
        return len(set(expected) ^ set(target)) + sum(target[k] != v for k, v in expected.items() if k in target)

    rows = [(width, depth) for width, depth, _ in TIMM_MULTIPLIERS.values()]
    candidates = sorted(_candidates(tree), key=lambda c: c not in rows)
    return min(candidates, key=differences) if candidates else None


def infer_efficientnet_config(tree, *, architecture=None, image_size=None, batch_norm_epsilon=None,
                              source="checkpoint"):
    """EfficientNet kwargs of a canonical EfficientNet `tree`: the multipliers of timm's
    `architecture` (its shapes checked) or, without one, of the shapes themselves."""
    try:
        _, channels, _, classes = _counts(tree)
    except CheckpointError as err:
        raise CheckpointError(f"{source}: {err}; this is not an EfficientNet checkpoint.") from None
    resolution = None
    if architecture is not None:
        width, depth, resolution = TIMM_MULTIPLIERS[architecture]
        expected = weight_shapes(width, depth, classes, channels)
        _compare(tree, expected, f"timm's {architecture} ({_summary(expected)}; the file: {_summary(tree)})", source)
    else:
        found = _search_multipliers(tree, classes, channels)
        if found is None:
            nearest = _nearest_multipliers(tree, classes, channels)
            if nearest is not None:
                # Its stem and stages are an EfficientNet's: name the weights that are not.
                _compare(tree, weight_shapes(*nearest, classes, channels),
                         f"the EfficientNet whose stem and blocks per stage it has (nearest: width x{nearest[0]:g}, "
                         f"depth x{nearest[1]:g})", source,
                         " The file is incomplete or altered: use it as timm saved it (a folder with its config.json).")
            raise CheckpointError(
                f"{source}: no EfficientNet width and depth multipliers give these weights' shapes (the stages hold "
                f"{describe_keys(sorted({k.rsplit('/', 3)[0] for k in tree if k.startswith('blocks/')}), limit=4)}); "
                "it is not one of timm's tf_efficientnet_* models. Pass the folder with its config.json."
            )
        width, depth = found
        for _, (w, d, r) in TIMM_MULTIPLIERS.items():
            if (w, d) == (width, depth):
                resolution = r
    if image_size is None:
        image_size = (resolution, resolution) if resolution else (224, 224)
    return dict(
        image_size=tuple(image_size),
        width_multiplier=float(width),
        depth_multiplier=float(depth),
        classes=classes,
        num_channels=channels,
        batch_norm_epsilon=BATCH_NORM_EPSILON if batch_norm_epsilon is None else batch_norm_epsilon,
    )


# === Reading ===


def _timm_config(path):
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        return {}, config_path
    config = read_json_object(config_path)
    return (config if "architecture" in config else {}), config_path


def _config_fields(config, config_path):
    """(architecture, image size, BatchNorm eps) from a timm config.json, validated."""
    arch = config.get("architecture")
    if arch is None:
        return None, None, None
    if not isinstance(arch, str):
        raise CheckpointError(f"{config_path}: 'architecture' is {str(arch)[:40]!r}; expected a timm model name.")
    base = _base_name(arch)
    if not _SUPPORTED.match(base):
        what = ("timm's PyTorch-native EfficientNet (symmetric padding, BatchNorm eps 1e-5)"
                if not base.startswith("tf_") else "a variant with other blocks than tf_efficientnet_b0-b8 / l2")
        raise CheckpointError(
            f"{config_path}: timm architecture {arch!r} is {what}; keras_vit's EfficientNet reproduces timm's TF "
            "ports tf_efficientnet_b0 ... b8 and tf_efficientnet_l2 (TF \"SAME\" padding, eps 1e-3)."
        )
    args = config.get("model_args") or {}
    if not isinstance(args, dict):
        raise CheckpointError(f"{config_path}: 'model_args' is {str(args)[:40]!r}; expected an object.")
    if args.get("pad_type") not in (None, "same"):
        raise CheckpointError(f"{config_path}: model_args.pad_type={args['pad_type']!r}; the TF ports pad 'same'.")
    pool = args.get("global_pool", config.get("global_pool"))
    if pool not in (None, "", "avg"):
        raise CheckpointError(f"{config_path}: global_pool={pool!r}; EfficientNet pools by averaging ('avg').")
    eps = args.get("bn_eps")
    if eps is not None and (isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1):
        raise CheckpointError(f"{config_path}: model_args.bn_eps is {str(eps)[:40]!r}; expected a number in (0, 1).")
    pretrained = config.get("pretrained_cfg") or {}
    if not isinstance(pretrained, dict):
        raise CheckpointError(f"{config_path}: 'pretrained_cfg' is not an object.")
    size = pretrained.get("input_size")
    image_size = None
    if size is not None:
        if not (isinstance(size, list) and len(size) == 3
                and all(isinstance(s, int) and not isinstance(s, bool) and 0 < s <= 2**16 for s in size)):
            raise CheckpointError(
                f"{config_path}: pretrained_cfg.input_size is {str(size)[:60]!r}; expected [channels, height, width]."
            )
        image_size = tuple(size[1:])
    return base, image_size, (float(eps) if eps is not None else None)


@reads_config_object
def read_timm_efficientnet(path, lazy=False):
    """Read a timm tf_efficientnet folder, .safetensors or PyTorch state dict.

    Returns (EfficientNet weight tree, EfficientNetConfig). With `lazy=True` the tree holds
    LazyArrays, read from the file when the model assigns them.

    Example:
        >>> tree, config = read_timm_efficientnet("tf_efficientnet_l2.ns_jft_in1k_475/")  # doctest: +SKIP
        >>> config["width_multiplier"], config["image_size"]
        (4.3, (475, 475))
    """
    path = os.fspath(path)
    with reading(path):
        config, config_path = _timm_config(path)
        architecture, image_size, eps = _config_fields(config, config_path)
        weights = weights_in_folder(path, "save the model with timm's save_pretrained") if os.path.isdir(path) else path
        files = open_weights(weights)
        if not is_efficientnet_state(files):
            raise CheckpointError(
                f"{weights}: no {' or '.join(repr(k) for k in _MARKERS)} in its tensors ({describe_keys(files)}); this "
                "is not a timm EfficientNet checkpoint."
            )
        tree = efficientnet_state_to_tree(files, source=weights)
        out = infer_efficientnet_config(tree, architecture=architecture, image_size=image_size, batch_norm_epsilon=eps,
                                        source=weights)
    return (tree if lazy else materialize(tree)), out


# === Writing ===


def _timm_state(tree):
    """The canonical tree in timm's layout (the inverse of `efficientnet_state_to_tree`), with the
    BatchNorm step counters timm's modules hold."""
    leaves = {v: k for k, v in _BN.items()}
    state = {}
    for key, value in tree.items():
        module, leaf = key.rsplit("/", 1)
        name = module.replace("/", ".")
        value = np.asarray(value, dtype=np.float32)
        if leaf == "kernel":
            if module == "classifier":
                value = value.T
            elif module.endswith("conv_dw"):
                value = value.transpose(2, 3, 0, 1)
            else:
                value = value.transpose(3, 2, 0, 1)
            state[f"{name}.weight"] = value
        elif leaf in leaves:
            state[f"{name}.{leaves[leaf]}"] = value
            if leaf == "moving_variance":
                state[f"{name}.num_batches_tracked"] = np.zeros((), np.int64)
        else:
            state[f"{name}.{leaf}"] = value
    return {k: np.asarray(v, order="C") for k, v in state.items()}  # (ascontiguousarray makes 0-d 1-d)


def write_timm_efficientnet(tree, path, image_size=None):
    """Write an EfficientNet (or its weight tree) as a timm Hub folder: model.safetensors and the
    config.json `save_pretrained` writes, which timm loads as its `tf_efficientnet_*`.

    Args:
        tree: a keras_vit EfficientNet, or its canonical weight tree.
        path: the folder to write (created; files in it are replaced).
        image_size: the resolution config.json states (default: the model's, else the
            architecture's own).

    Example:
        >>> model = keras_vit.EfficientNetB0(weights=None)  # doctest: +SKIP
        >>> write_timm_efficientnet(model, "tf_efficientnet_b0_keras")  # doctest: +SKIP
        'tf_efficientnet_b0_keras'
    """
    from collections.abc import Mapping

    import safetensors.numpy

    if not isinstance(tree, Mapping):
        from keras_vit.models.weight_tree import get_weight_tree

        size = tuple(tree.get_config().get("image_size") or ())
        if image_size is None and len(size) == 2 and None not in size:
            image_size = size
        tree = get_weight_tree(tree)
    if "conv_stem/kernel" not in tree:
        raise ValueError("Not an EfficientNet weight tree: it has no 'conv_stem/kernel'.")
    if "classifier/kernel" not in tree:
        raise ValueError("timm's EfficientNets end in a classifier; write a model built with include_top=True.")
    _, channels, _, classes = _counts(tree)
    found = _search_multipliers(tree, classes, channels)
    names = [name for name, (w, d, _) in TIMM_MULTIPLIERS.items() if found is not None and (w, d) == found]
    if not names:
        raise ValueError(
            "timm builds its EfficientNets by name (tf_efficientnet_b0 ... b8, l2); these weights are none of them "
            "(their width and depth multipliers are another network's). Save them as a .keras file or a Keras preset."
        )
    architecture = names[0]
    if image_size is None:
        image_size = (TIMM_MULTIPLIERS[architecture][2],) * 2
    h, w = as_pair(image_size)
    # The Noisy Student preset's central crop at this size, where there is one (timm's default else).
    repo = f"timm/{architecture}.ns_jft_in1k"
    crop_pct = CROP_PCT.get(f"{repo}_{h}", CROP_PCT.get(repo, 0.875))
    config = {
        "architecture": architecture,
        "num_classes": classes,
        "num_features": int(tree["conv_head/kernel"].shape[-1]),
        "global_pool": "avg",
        "model_args": {"in_chans": channels, "num_classes": classes, "global_pool": "avg"},
        "pretrained_cfg": {"input_size": [channels, h, w], "interpolation": INTERPOLATION, "crop_pct": crop_pct,
                           "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD),
                           "num_classes": classes, "first_conv": "conv_stem", "classifier": "classifier"},
    }
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    weights, config_path = os.path.join(path, "model.safetensors"), os.path.join(path, "config.json")
    safetensors.numpy.save_file(_timm_state(tree), weights + ".tmp", metadata={"format": "pt"})
    with open(config_path + ".tmp", "w") as f:
        json.dump(config, f, indent=2)
    os.replace(weights + ".tmp", weights)
    os.replace(config_path + ".tmp", config_path)
    return path


# === Format ===


def detect(path):
    """A folder whose config.json names one of timm's EfficientNets; a .safetensors or PyTorch zip
    file whose tensors are a timm EfficientNet's."""
    path = os.fspath(path)
    if os.path.isdir(path):
        arch = read_json_object(os.path.join(path, "config.json"), missing={}, malformed={}).get("architecture")
        return isinstance(arch, str) and bool(_EFFICIENTNET_LIKE.match(_base_name(arch)))
    if not os.path.isfile(path):
        return False
    try:
        if path.endswith(".safetensors") or looks_like_safetensors(path):
            return is_efficientnet_state(open_weights(path))
        if is_torch_zip(path):
            return is_efficientnet_state(TorchZipFile(path).state_dict())
    except (CheckpointError, OSError, *MALFORMED):  # a damaged file: the broader formats' readers say what is wrong
        return False
    return False


FORMAT = CheckpointFormat(
    name="timm_efficientnet",
    description="a timm tf_efficientnet_* Hub folder, .safetensors or PyTorch state dict",
    detect=detect,
    read=lambda path: read_timm_efficientnet(path, lazy=True),
    write=write_timm_efficientnet,
    numerics=None,
    hub_files=("*.safetensors", "*.safetensors.index.json"),
    torch_zip=True,
)
