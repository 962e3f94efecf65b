"""The original google-research/vision_transformer .npz files: reader and writer.

The canonical tree IS this layout, so reading is mostly cleaning up the variants the released
files come in: everything nested under `opt/target/` (optimizer checkpoints, whose optimizer
state is dropped), and GroupNorm parameters stored as (1, 1, 1, C).
"""

import os
import zipfile
from collections.abc import Mapping

import numpy as np

from keras_vit.checkpoints.common import CheckpointError, corrupt_file_error, infer_config
from keras_vit.checkpoints.registry import CheckpointFormat
from keras_vit.models.config import NUMERICS

_TARGET_PREFIX = "opt/target/"


def canonical_from_npz_arrays(arrays, source="checkpoint"):
    """The canonical tree from the flat {key: array} of an original .npz (lazily indexable)."""
    keys = list(arrays.keys())
    if any(k.startswith(_TARGET_PREFIX) for k in keys):
        keys = [k for k in keys if k.startswith(_TARGET_PREFIX)]
        strip = len(_TARGET_PREFIX)
    else:
        strip = 0
    if not any(k[strip:] == "embedding/kernel" for k in keys):
        raise CheckpointError(
            f"{source}: no 'embedding/kernel' (nor 'opt/target/embedding/kernel'); this .npz is not a "
            "google-research/vision_transformer ViT checkpoint."
        )
    tree = {}
    for key in keys:
        value = np.asarray(arrays[key])
        name = key[strip:]
        if value.dtype != np.float32:
            if value.dtype.kind != "f":
                raise CheckpointError(f"{source}: weight {name!r} has dtype {value.dtype}; expected floats.")
            value = value.astype(np.float32)
        leaf = name.rsplit("/", 2)
        # GroupNorm scale/bias stored as (1, 1, 1, C) by older files.
        if len(leaf) >= 2 and leaf[-2].startswith("gn") and value.ndim == 4 and value.shape[:3] == (1, 1, 1):
            value = value.reshape(value.shape[-1])
        tree[name] = value
    return tree


def _single_npz(folder):
    found = [f for f in os.listdir(folder) if f.endswith(".npz")]
    return os.path.join(folder, found[0]) if len(found) == 1 else None


def _is_zip(path):
    with open(path, "rb") as f:
        return f.read(4) in (b"PK\x03\x04", b"PK\x05\x06")


def detect(path):
    """An .npz file (or a zip that is not a .keras file), or a folder holding exactly one .npz."""
    if os.path.isdir(path):
        return _single_npz(path) is not None
    return path.endswith(".npz") or (not path.endswith(".keras") and _is_zip(path))


def read_npz(path):
    """Read an original .npz (or a folder holding one) into (canonical tree, VisionTransformer
    kwargs with the original numerics).

    Example:
        >>> tree, config = read_npz("ViT-B_16.npz")   # doctest: +SKIP
        >>> config["num_heads"], config["image_size"]
        (12, (224, 224))
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = _single_npz(path) or path
    try:
        with np.load(path, allow_pickle=False) as data:
            tree = canonical_from_npz_arrays(data, source=path)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as err:
        if isinstance(err, CheckpointError):
            raise
        if isinstance(err, FileNotFoundError):
            raise
        raise corrupt_file_error(path, err) from None
    return tree, infer_config(tree, NUMERICS["original"], source=path)


def write_npz(tree, path, *, prefix="", group_norm_shape="flat"):
    """Write a canonical weight tree (or a keras_vit model's weights) as an original-layout .npz.

    The file loads in google-research/vision_transformer and in timm's .npz loader.

    Args:
        tree: {canonical key: array}, or a keras_vit VisionTransformer.
        path: the file to write (written to a temporary name first, then moved into place).
        prefix: e.g. "opt/target/" to nest the weights as the original optimizer checkpoints do.
        group_norm_shape: "flat" stores GroupNorm parameters as (C,), "legacy" as (1, 1, 1, C).

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...     num_layers=1, num_heads=2, mlp_dim=32, classes=3)
        >>> write_npz(model, "/tmp/tiny.npz")
    """
    if not isinstance(tree, Mapping):
        from keras_vit.models.weight_tree import get_weight_tree

        tree = get_weight_tree(tree)
    if group_norm_shape not in ("flat", "legacy"):
        raise ValueError(f"group_norm_shape must be 'flat' or 'legacy'; got {group_norm_shape!r}.")
    path = os.fspath(path)
    arrays = {}
    for key, value in tree.items():
        value = np.asarray(value, dtype=np.float32)
        parts = key.split("/")
        if group_norm_shape == "legacy" and len(parts) >= 2 and parts[-2].startswith("gn") and value.ndim == 1:
            value = value.reshape(1, 1, 1, -1)
        arrays[prefix + key] = value
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)
    return path


FORMAT = CheckpointFormat(
    name="npz",
    description="an original google-research/vision_transformer .npz",
    detect=detect,
    read=read_npz,
    write=write_npz,
    numerics="original",
    hub_files=("*.npz",),
)
