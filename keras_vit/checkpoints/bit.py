"""BiT ResNet-v2 weights: timm's resnetv2_*_bit Hub repos and the original big_transfer .npz files.

Both are read into one canonical tree, the big_transfer .npz layout (flat '/'-joined keys, HWIO
kernels, (C,) GroupNorm parameters), which is also what `write_bit_npz` writes back and what
timm's `resnetv2._load_weights` reads:

    resnet/root_block/standardized_conv2d/kernel            (7, 7, 3, 64w)
    resnet/block{s}/unit{uu}/{a,b,c}/standardized_conv2d/kernel
    resnet/block{s}/unit{uu}/{a,b,c}/group_norm/{gamma,beta}
    resnet/block{s}/unit01/a/proj/standardized_conv2d/kernel
    resnet/group_norm/{gamma,beta}
    resnet/head/conv2d/{kernel,bias}                         (1, 1, C, classes)

The config is the `keras_vit.models.bit.BiTResNet` keyword arguments, inferred from the shapes,
with the numerics of the code that wrote the file: timm's for timm repositories (weight
standardisation eps 1e-8 inside the square root, GroupNorm eps 1e-5), big_transfer's own for
its .npz files (eps 1e-10, `BIG_TRANSFER_NUMERICS`). Pass `std_conv_epsilon=` to the load to run
a file with the other's. Both readers go through the common hardening: .npy headers checked
before anything is allocated, the zip's CRC-32 and finiteness checked as each weight is read,
config.json fields validated.

Two formats of the registry: "timm_bit" (timm folders, .safetensors and PyTorch state dicts)
and "bit_npz" (big_transfer .npz, with a writer); keras_vit.loading builds the BiTResNet.
"""

import os
import re
import zipfile
from collections.abc import Mapping

import numpy as np

from keras_vit.checkpoints.npz import _single_npz, lazy_member, open_members
from keras_vit.checkpoints.registry import CheckpointFormat, reads_config_object
from keras_vit.errors import CheckpointError
from keras_vit.models.bit_family import BIT_NUMERICS, count_units, width_factor
from keras_vit.storage.files import describe_keys, endings, reading
from keras_vit.storage.json_files import read_json_object
from keras_vit.storage.lazy import materialize
from keras_vit.storage.torch_zip import is_torch_zip, open_weights, weights_in_folder

#: The numerics of google-research/big_transfer's own code, which trained and wrote the .npz
#: files: weight standardisation (w - mean) / sqrt(var + 1e-10) (timm's port uses 1e-8),
#: GroupNorm eps 1e-5 (torch.nn.GroupNorm's, as in its PyTorch model).
BIG_TRANSFER_NUMERICS = dict(BIT_NUMERICS, std_conv_epsilon=1e-10, std_conv_epsilon_inside_sqrt=True)

PREFIX = "resnet/"
_ROOT = PREFIX + "root_block/standardized_conv2d/kernel"
_UNIT = re.compile(r"^resnet/block(\d+)/unit(\d+)/")



# === Config inference ===


def infer_bit_config(tree, *, source="checkpoint", image_size=None):
    """BiTResNet kwargs of a canonical BiT `tree` (units, width, classes, channels) + timm's numerics."""
    if _ROOT not in tree:
        raise CheckpointError(f"{source}: no {_ROOT!r}; this is not a BiT ResNet checkpoint.")
    root = tree[_ROOT]
    if len(root.shape) != 4 or root.shape[:2] != (7, 7):
        raise CheckpointError(f"{source}: {_ROOT} has shape {tuple(root.shape)}; expected (7, 7, in, 64 * width).")
    width = width_factor(root.shape[-1])
    units = count_units(tree, _UNIT)
    if not units or sorted(units) != list(range(1, len(units) + 1)):
        raise CheckpointError(f"{source}: BiT stages {sorted(units)} are not numbered block1..blockN.")
    head = tree.get(PREFIX + "head/conv2d/kernel")
    config = dict(
        image_size=image_size if image_size is not None else (224, 224),
        block_units=tuple(units[s] for s in sorted(units)),
        width_factor=width,
        classes=int(head.shape[-1]) if head is not None else None,
        num_channels=int(root.shape[2]),
    )
    config.update(BIT_NUMERICS)
    return config


# === timm (resnetv2_*_bit: model.safetensors + config.json) ===

_TIMM_UNIT = {
    "norm1.weight": "a/group_norm/gamma",
    "norm1.bias": "a/group_norm/beta",
    "conv1.weight": "a/standardized_conv2d/kernel",
    "norm2.weight": "b/group_norm/gamma",
    "norm2.bias": "b/group_norm/beta",
    "conv2.weight": "b/standardized_conv2d/kernel",
    "norm3.weight": "c/group_norm/gamma",
    "norm3.bias": "c/group_norm/beta",
    "conv3.weight": "c/standardized_conv2d/kernel",
    "downsample.conv.weight": "a/proj/standardized_conv2d/kernel",
}
_TIMM_STAGE = re.compile(r"^stages\.(\d+)\.blocks\.(\d+)\.(.+)$")


def _conv(w):
    """PyTorch conv weight (out, in, kh, kw) -> HWIO (a lazy view)."""
    return w.transpose(2, 3, 1, 0)


def _timm_files(path):
    """{key: file} of a timm folder's weights (model.safetensors, its shards, or a PyTorch zip
    pytorch_model.bin, read without running its pickle) or of such a file itself."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return open_weights(weights_in_folder(path, "save the model with timm's save_pretrained"))
    return open_weights(path)


def _timm_config(path):
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = os.path.join(folder, "config.json")
    config = read_json_object(config_path, missing={})
    return config if "architecture" in config else {}


def detect_timm_bit(path):
    """Whether `path` (a timm Hub folder, .safetensors or PyTorch state dict) holds a timm BiT
    ResNet-v2: config.json's `architecture` starts with "resnetv2_", or (a bare file) its tensors are a pre-activation
    ResNet-v2's (`stem.conv.weight`, `stages.0.blocks.0.norm1.weight`, no ViT parts)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        return False
    config = _timm_config(path)
    if config:
        return str(config.get("architecture", "")).startswith("resnetv2_")
    if os.path.isdir(path):
        return False
    if not path.endswith((".safetensors", ".safetensors.index.json")) and not (
            path.endswith(endings("pytorch")) and is_torch_zip(path)):
        return False
    try:
        keys = set(_timm_files(path))
    except (CheckpointError, OSError):
        return False
    return "stem.conv.weight" in keys and "stages.0.blocks.0.norm1.weight" in keys and "patch_embed.proj.weight" not in keys


def timm_bit_state_to_tree(files, *, source="checkpoint"):
    """The canonical BiT tree from timm ResNetV2 tensors `files` ({timm key: SafetensorsFile})."""
    tree, used = {}, set()

    def get(key):
        if key not in files:
            raise CheckpointError(f"{source}: missing weight {key!r} (timm resnetv2 layout).")
        used.add(key)
        return files[key].lazy(key)

    tree[_ROOT] = _conv(get("stem.conv.weight"))
    for key in files:
        m = _TIMM_STAGE.match(key)
        if not m or m.group(3) not in _TIMM_UNIT:
            continue
        s, u, part = int(m.group(1)), int(m.group(2)), m.group(3)
        value = get(key)
        name = _TIMM_UNIT[part]
        tree[f"{PREFIX}block{s + 1}/unit{u + 1:02d}/{name}"] = _conv(value) if name.endswith("kernel") else value
    tree[PREFIX + "group_norm/gamma"] = get("norm.weight")
    tree[PREFIX + "group_norm/beta"] = get("norm.bias")
    if "head.fc.weight" in files:
        weight = get("head.fc.weight")
        if len(weight.shape) != 4:
            raise CheckpointError(
                f"{source}: head.fc.weight has shape {weight.shape}; BiT's head is a 1x1 convolution (classes, C, 1, 1)."
            )
        tree[PREFIX + "head/conv2d/kernel"] = _conv(weight)
        tree[PREFIX + "head/conv2d/bias"] = get("head.fc.bias")
    unused = [k for k in files if k not in used]
    if unused:
        raise CheckpointError(
            f"{source}: unexpected weights {describe_keys(unused)}; this timm ResNetV2 has parts BiT does not "
            "(a deep stem, a non-pre-activation block, BatchNorm, ...), so it is not a BiT model."
        )
    return tree


@reads_config_object
def read_timm_bit(path, lazy=False):
    """Read a timm resnetv2_*_bit Hub folder (model.safetensors or pytorch_model.bin + config.json),
    .safetensors or PyTorch state dict.

    Returns (canonical BiT tree, BiTConfig with timm's numerics); the resolution is the
    repository's `pretrained_cfg.input_size` (224 for a bare file). With `lazy=True` the tree holds
    LazyArrays, read from the file when converted with np.asarray.

    Example:
        >>> tree, config = read_timm_bit("resnetv2_50x1_bit.goog_in21k/")  # doctest: +SKIP
        >>> config["block_units"], config["classes"]
        ((3, 4, 6, 3), 21843)
    """
    path = os.fspath(path)
    with reading(path):
        return _read_timm_bit(path, lazy)


def _read_timm_bit(path, lazy):
    config = _timm_config(path)
    arch = config.get("architecture", "")
    if not isinstance(arch, str):
        raise CheckpointError(f"{path}: config.json's 'architecture' is {arch!r}; expected a timm model name.")
    args = config.get("model_args") or {}
    if not isinstance(args, dict):
        raise CheckpointError(f"{path}: config.json's 'model_args' is {args!r}; expected an object (a dict).")
    if arch and not arch.startswith("resnetv2_"):
        raise CheckpointError(f"{path}: timm architecture {arch!r} is not a ResNetV2 (resnetv2_*_bit).")
    if args.get("stem_type") not in (None, "fixed"):
        raise CheckpointError(f"{path}: timm stem_type={args['stem_type']!r}; BiT's stem is 'fixed' (zero pad + max pool).")
    if args.get("global_pool") not in (None, "", "avg"):
        raise CheckpointError(f"{path}: timm global_pool={args['global_pool']!r}; BiT pools by averaging ('avg').")
    tree = timm_bit_state_to_tree(_timm_files(path), source=path)
    pretrained = config.get("pretrained_cfg") or {}
    size = pretrained.get("input_size") if isinstance(pretrained, dict) else None
    image_size = None
    if isinstance(size, list) and len(size) == 3:
        if not all(isinstance(s, int) and not isinstance(s, bool) and 0 < s <= 2**16 for s in size):
            raise CheckpointError(
                f"{path}: config.json's pretrained_cfg.input_size is {size!r}; expected [channels, height, width]."
            )
        image_size = tuple(size[1:])
    out = infer_bit_config(tree, source=path, image_size=image_size)
    return (tree if lazy else materialize(tree)), out


# === big_transfer .npz ===


def _npz_keys(path):
    with zipfile.ZipFile(path) as z:
        return [n[: -len(".npy")] if n.endswith(".npy") else n for n in z.namelist()]


def _bit_npz_path(path):
    """The .npz of `path`: the file itself, or the one .npz of a folder (a Hub snapshot)."""
    if os.path.isdir(path):
        return _single_npz(path)
    return path if os.path.isfile(path) else None


def detect_bit_npz(path):
    """Whether `path` is a big_transfer .npz (it holds `resnet/root_block/standardized_conv2d/kernel`),
    or a folder holding exactly one."""
    path = _bit_npz_path(os.fspath(path))
    if path is None:
        return False
    try:
        return _ROOT in _npz_keys(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False


@reads_config_object
def read_bit_npz(path):
    """Read an original BiT .npz (google-research/big_transfer, e.g. BiT-M-R50x1.npz), or a folder
    holding one (a Hub snapshot), into (lazy canonical tree, BiTConfig with big_transfer's
    numerics). GroupNorm parameters stored as (1, 1, 1, C) are flattened.

    Every member's .npy header is checked before anything is read (a declared size must fit the
    file: `NpzMembers`), each weight is read when the model assigns it, checked against the zip's
    CRC-32 and for non-finite values.

    Example:
        >>> tree, config = read_bit_npz("BiT-M-R50x1.npz")  # doctest: +SKIP
        >>> config["block_units"], config["width_factor"], config["std_conv_epsilon"]
        ((3, 4, 6, 3), 1, 1e-10)
    """
    path = os.fspath(path)
    file = _bit_npz_path(path) or path
    if not os.path.exists(file):
        raise FileNotFoundError(f"No checkpoint at {path!r}.")
    tree = {}
    with open_members(file) as members, reading(file):  # closed here; each lazy read reopens the file
        for key in members.keys():
            if not key.startswith(PREFIX):
                continue  # optimizer state, global step, ...
            if members.dtype(key).kind != "f":
                raise CheckpointError(f"{file}: weight {key!r} has dtype {members.dtype(key)}; expected floats.")
            shape = members.shape(key)
            if "/group_norm/" in key and len(shape) == 4 and shape[:3] == (1, 1, 1):
                tree[key] = lazy_member(members, key, shape=(shape[-1],))
            else:
                tree[key] = lazy_member(members, key)
        config = infer_bit_config(tree, source=file)
    config.update(BIG_TRANSFER_NUMERICS)
    return tree, config


def write_bit_npz(tree, path):
    """Write a canonical BiT tree (or a BiTResNet's weights) as a big_transfer .npz.

    The file loads in timm (`resnetv2._load_weights`, which needs the head: write a model built
    with include_top=True) and back with `read_bit_npz` / `keras_vit.load_checkpoint`.

    Example:
        >>> model = keras_vit.models.BiTResNet(image_size=64, block_units=(1, 1), width_factor=0.5, classes=3)
        >>> write_bit_npz(model, "/tmp/bit_tiny.npz")
        '/tmp/bit_tiny.npz'
    """
    if not isinstance(tree, Mapping):
        from keras_vit.models.weight_tree import get_weight_tree

        tree = get_weight_tree(tree)
    if _ROOT not in tree:
        raise ValueError(f"Not a BiT weight tree: it has no {_ROOT!r}. Use keras_vit.write_npz for ViT trees.")
    path = os.fspath(path)
    arrays = {key: np.asarray(value, dtype=np.float32) for key, value in tree.items()}
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return path


# === Building ===


# === Formats ===

FORMATS = (
    CheckpointFormat(
        name="timm_bit",
        description="a timm BiT ResNet-v2 Hub folder, .safetensors or PyTorch state dict (architecture resnetv2_*)",
        detect=detect_timm_bit,
        read=lambda path: read_timm_bit(path, lazy=True),
        numerics="timm",
        hub_files=("*.safetensors", "*.safetensors.index.json"),
        hub_fallback_files=("pytorch_model.bin",),  # read by storage.torch_zip, which runs nothing from it
        torch_zip=True,
    ),
    CheckpointFormat(
        name="bit_npz",
        description="an original google-research/big_transfer .npz (BiT-M-R50x1.npz, ...)",
        detect=detect_bit_npz,
        read=read_bit_npz,
        write=write_bit_npz,
        numerics="timm",
        hub_files=("*.npz",),
    ),
)
