"""google-research/big_vision ViT .npz files (`big_vision/models/vit.py`): reader and writer.

big_vision keeps the original module names where it can, so its files differ from the
canonical tree (the original vision_transformer layout) in a few places, each handled here:

- keys may sit under `params/`, or `params/img/` for the image tower of a two-tower model
  (SigLIP, LiT), whose other parts (`params/txt/...`, `params/t`, ...) are left alone;
- Flax counts submodules per class inside a block (`LayerNorm_0`, `MultiHeadDotProductAttention_0`,
  `LayerNorm_1`, `MlpBlock_0`) where the original counts across classes (`LayerNorm_0`,
  `MultiHeadDotProductAttention_1`, `LayerNorm_2`, `MlpBlock_3`);
- with `scan=True` the blocks are one `Transformer/encoderblock/...` whose arrays have a
  leading layer axis; each block's slice is read on its own, when the model assigns it;
- `pos_embedding` is a top-level parameter over the patch grid alone, added before the class
  token is prepended (the model runs with `class_token_position_embedding=False`); without it
  the model used the fixed "sincos2d" embedding;
- `pool_type`: a `cls` parameter means "tok", `MAPHead_0` means "map", anything else reads as
  "gap" ("0" and "none" hold the same weights as "gap": name them with
  `load_checkpoint(..., classifier="first")` or `classifier="none"`).

Older files are fixed up as big_vision's `fix_old_checkpoints` does: the position embedding
under `Transformer/posembed_input/` or `Transformer/`, one that also covers the class token
(the old order: concatenate, then add; kept as the original layout), and a MAP head inlined at
the top level (`probe`, ...).
"""

import math
import os
import re
import zipfile
from collections.abc import Mapping

import numpy as np

from keras_vit.checkpoints.npz import _single_npz, lazy_member, open_members
from keras_vit.checkpoints.registry import CheckpointFormat, reads_config_object
from keras_vit.errors import CheckpointError
from keras_vit.geometry import as_pair
from keras_vit.models.config import NUMERICS
from keras_vit.models.vit_family import infer_config
from keras_vit.storage.files import describe_keys, reading

#: Where the model's parameters sit in a file, tried in this order.
PREFIXES = ("params/img/", "params/", "")
_POS = "Transformer/posembed_input/pos_embedding"
#: Where files of different ages keep the position embedding (after the prefix).
_POS_KEYS = ("pos_embedding", "Transformer/pos_embedding", _POS)
_SCANNED = "Transformer/encoderblock/"
_BLOCK = re.compile(r"^Transformer/encoderblock_(\d+)/([^/]+)/(.+)$")
#: big_vision's per-class Flax counters inside a block -> the original's, counted across classes.
_BLOCK_PARTS = {
    "LayerNorm_0": "LayerNorm_0",
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}
_ORIGINAL_PARTS = {v: k for k, v in _BLOCK_PARTS.items()}
#: Top-level names whose keys are canonical as they are.
_AS_IS = ("embedding/", "cls", "pre_logits/", "head/", "MAPHead_0/", "Transformer/encoder_norm/")
#: A MAP head inlined at the top level (ViT-G development files): its parts move under MAPHead_0/.
_INLINED_MAP = ("probe", "MlpBlock_0/", "MultiHeadDotProductAttention_0/", "LayerNorm_0/")


# === Detection ===


def parameter_prefix(names):
    """The prefix ("params/img/", "params/" or "") under which `names` hold a ViT's
    `embedding/kernel`, or None."""
    for prefix in PREFIXES:
        if prefix + "embedding/kernel" in names:
            return prefix
    return None


def is_big_vision(names):
    """Whether the '/'-joined parameter names `names` are a big_vision ViT's: its blocks are
    scanned (`Transformer/encoderblock/...`) or count Flax submodules per class
    (`encoderblock_0/MultiHeadDotProductAttention_0`, where the original has `..._1`)."""
    prefix = parameter_prefix(names)
    if prefix is None:
        return False
    block = prefix + "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/"
    scanned = prefix + _SCANNED
    return any(n.startswith((block, scanned)) for n in names)


def _npz_path(path):
    path = os.fspath(path)
    if os.path.isdir(path):
        return _single_npz(path)
    return path if os.path.isfile(path) else None


def detect(path):
    """A big_vision ViT .npz (or a folder holding exactly one), told by its member names alone
    (the zip directory; no array is read)."""
    path = _npz_path(path)
    if path is None:
        return False
    try:
        with zipfile.ZipFile(path) as z:
            names = {n[: -len(".npy")] for n in z.namelist() if n.endswith(".npy")}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return False
    return is_big_vision(names)


# === Reading ===


def _lazy(members, key, index=None):
    return lazy_member(members, key, index)


def _canonical_block(part, rest, key, source):
    if part not in _BLOCK_PARTS:
        raise CheckpointError(
            f"{source}: unexpected weight {key!r}: a big_vision encoder block holds "
            f"{', '.join(_BLOCK_PARTS)}; this is not a big_vision ViT (or one with parts it does not have)."
        )
    return f"{_BLOCK_PARTS[part]}/{rest}"


def canonical_from_big_vision(members, source="checkpoint"):
    """(canonical tree of LazyArrays, the stored name of its position embedding or None) from
    the '/'-joined members of a big_vision .npz (an object with keys(), shape(key), dtype(key), [key] and
    read_index(key, i), such as `NpzMembers`)."""
    names = members.keys()
    prefix = parameter_prefix(set(names))
    if prefix is None:
        raise CheckpointError(
            f"{source}: no 'embedding/kernel' (at the top level, under 'params/' or 'params/img/'); this .npz "
            "is not a big_vision ViT checkpoint."
        )
    keys = {n[len(prefix):]: n for n in names if n.startswith(prefix)}
    for name in keys.values():
        if members.dtype(name).kind != "f":
            raise CheckpointError(f"{source}: weight {name!r} has dtype {members.dtype(name)}; expected floats.")

    tree, unexpected, scanned, positions = {}, [], {}, []
    for key, name in keys.items():
        m = _BLOCK.match(key)
        if key.startswith(_AS_IS):
            tree[key] = _lazy(members, name)
        elif key in _POS_KEYS:
            positions.append(name)
            tree[_POS] = _lazy(members, name)
        elif key.startswith(_INLINED_MAP):
            tree[f"MAPHead_0/{key}"] = _lazy(members, name)
        elif m:
            i, part, rest = m.groups()
            sub = _canonical_block(part, rest, name, source)
            tree[f"Transformer/encoderblock_{int(i)}/{sub}"] = _lazy(members, name)
        elif key.startswith(_SCANNED):
            part, _, rest = key[len(_SCANNED):].partition("/")
            scanned[_canonical_block(part, rest, name, source)] = name
        else:
            unexpected.append(name)
    if unexpected:
        raise CheckpointError(
            f"{source}: unexpected weights {describe_keys(unexpected)}; a big_vision ViT holds embedding/, "
            "pos_embedding, cls, Transformer/, MAPHead_0/, pre_logits/ and head/ only."
        )
    if len(positions) > 1:
        raise CheckpointError(f"{source}: more than one position embedding ({', '.join(positions)}).")
    if scanned:
        if any(k.startswith("Transformer/encoderblock_") for k in tree):
            raise CheckpointError(
                f"{source}: both scanned (Transformer/encoderblock/) and per-layer (Transformer/encoderblock_N/) "
                "blocks; a checkpoint holds one or the other."
            )
        depths = {name: (members.shape(name) or (0,))[0] for name in scanned.values()}
        if len(set(depths.values())) != 1 or 0 in depths.values():
            listed = ", ".join(f"{n} {members.shape(n)}" for n in sorted(depths)[:6])
            raise CheckpointError(
                f"{source}: the scanned blocks disagree on the number of layers (the leading axis of each "
                f"Transformer/encoderblock/ array): {listed}. The file is corrupt or was not written by big_vision."
            )
        depth = next(iter(depths.values()))
        for sub, name in scanned.items():
            for i in range(depth):
                tree[f"Transformer/encoderblock_{i}/{sub}"] = _lazy(members, name, i)

    for part in ("MultiHeadDotProductAttention_0/query/kernel", "MlpBlock_0/Dense_0/kernel"):
        sub = _canonical_block(*part.split("/", 1), part, source)
        if f"Transformer/encoderblock_0/{sub}" not in tree:  # what config inference reads
            raise CheckpointError(
                f"{source}: missing weight '{prefix}Transformer/encoderblock_0/{part}' (or its scanned form under "
                f"'{prefix}Transformer/encoderblock/'); this is not a complete big_vision ViT checkpoint."
            )

    if _POS in tree:
        pos = tree[_POS]
        if pos.ndim != 3 or pos.shape[0] != 1:
            raise CheckpointError(f"{source}: {positions[0]} has shape {pos.shape}; expected (1, tokens, width).")
    return tree, (positions[0][len(prefix):] if positions else None)


def _nontrivial_grids(tokens):
    """The (rows, cols) grids of `tokens` cells other than a single row or column."""
    return [(r, tokens // r) for r in range(2, tokens // 2 + 1) if tokens % r == 0]


def position_layout(tree, position_key, image_size, source="checkpoint"):
    """(class_token_position_embedding, image_size) of a big_vision tree whose position embedding
    `tree[_POS]` was stored under `position_key`, as big_vision's own loader would read it at
    `image_size` (the resolution the load asks for; None: unknown).

    big_vision uses a stored embedding as it is when its shape is the model's (`resample_posemb`),
    whatever the grid; otherwise it takes the stored grid as square. An embedding of n^2 + 1
    tokens is the old layout whose first row belongs to the class token (`fix_old_checkpoints`).
    Here the load's `image_size` decides first: a grid of as many cells as the stored tokens
    (or one fewer: the old layout) is the stored grid. Without one that fits, a square count is
    a square grid, and n^2 + 1 tokens the old layout where nothing else is plausible (the embedding
    sits where the old code kept it, or the count has no other grid). Anything else is ambiguous
    and refused with a CheckpointError that asks for the image size.
    """
    tokens = tree[_POS].shape[1]
    patch = tree["embedding/kernel"].shape[0]
    if image_size is not None:
        h, w = as_pair(image_size)
        if min(h, w) >= patch:
            cells = (h // patch) * (w // patch)
            if cells == tokens:
                return False, (h // patch * patch, w // patch * patch)
            if cells == tokens - 1:
                return True, (h // patch * patch, w // patch * patch)
    side = math.isqrt(tokens)
    if side * side == tokens:
        return False, (side * patch, side * patch)
    side = math.isqrt(tokens - 1)
    old_place = position_key != "pos_embedding"
    if tokens > 1 and side * side == tokens - 1 and (old_place or not _nontrivial_grids(tokens)):
        return True, (side * patch, side * patch)
    grids = _nontrivial_grids(tokens)
    if side * side == tokens - 1:
        what = (f"either the old layout ({side}x{side} patches after a class-token row) or a {grids[0][0]}x"
                f"{grids[0][1]} grid")
    else:
        what = "not a square grid"
    example = grids[len(grids) // 2] if grids else (1, tokens)
    raise CheckpointError(
        f"{source}: the position embedding holds {tokens} tokens, {what}, and the file does not store its image "
        f"size. Pass image_size=(height, width) of the resolution it was trained at (patch {patch}: e.g. "
        f"image_size=({example[0] * patch}, {example[1] * patch}) for a {example[0]}x{example[1]} grid)."
    )


@reads_config_object
def read_big_vision(path, image_size=None):
    """Read a big_vision ViT .npz (or a folder holding one) into (lazy canonical tree,
    ViTConfig with big_vision's numerics).

    The tree's values are LazyArrays (read, and for scanned files sliced per layer, when the
    model assigns them). A file without `pos_embedding` used big_vision's "sincos2d"
    embedding; its resolution is then not stored (224 is assumed: pass image_size to the load).
    `image_size` is the resolution the load asks for: where the stored position embedding has
    as many cells as its grid, that is the stored grid (see `position_layout`; a grid that is not
    square can only be told this way).

    Example:
        >>> tree, config = read_big_vision("vit_s16_i1k_90ep.npz")   # doctest: +SKIP
        >>> config["classifier"], config["class_token_position_embedding"]
        ('gap', False)
    """
    path = os.fspath(path)
    file = _npz_path(path) or path
    if not os.path.exists(file):
        raise FileNotFoundError(f"No checkpoint at {path!r}.")
    members = open_members(file)
    with members, reading(file):  # closed here; each lazy read reopens the file
        tree, position_key = canonical_from_big_vision(members, source=file)
        class_token_pe, size = False, image_size
        if position_key is not None:
            class_token_pe, size = position_layout(tree, position_key, image_size, source=file)
            if class_token_pe and "cls" not in tree:
                tree[_POS] = tree[_POS][:, 1:]  # the old layout's class-token row, without a class token: unused
                class_token_pe = False
        config = infer_config(
            tree,
            NUMERICS["big_vision"],
            source=file,
            image_size=size,
            class_token_position_embedding=class_token_pe,
            position_embedding="learned" if _POS in tree else "sincos2d",
        )
    return tree, config


# === Writing ===


def write_big_vision_npz(tree, path, *, config=None, prefix="", scan=False):
    """Write a keras_vit ViT (or a canonical weight tree) in big_vision's layout.

    The position embedding goes to the top level over the patch grid alone; where the model's
    class token has an embedding row (the original layout), that row is folded into `cls`, which
    computes the same (big_vision's own fix for such files). The file loads back with
    `keras_vit.load_checkpoint` and in big_vision (`vit.load`, with the model's `pool_type`).

    Args:
        tree: a keras_vit VisionTransformer, or {canonical key: array}.
        path: the .npz to write (written to a temporary name first, then moved into place).
        config: for a tree, its VisionTransformer config (a dict or ViTConfig); only
            `class_token_position_embedding` is read (default True: the canonical layout).
        prefix: e.g. "params/" or "params/img/" to nest the weights as big_vision's files do.
        scan: write the blocks as one `Transformer/encoderblock/` with a leading layer axis.

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...     num_layers=2, num_heads=2, mlp_dim=32, classes=3, classifier="map")
        >>> write_big_vision_npz(model, "/tmp/tiny_bv.npz", scan=True)
        '/tmp/tiny_bv.npz'
    """
    if not isinstance(tree, Mapping):
        from keras_vit.models.weight_tree import get_weight_tree

        config = getattr(tree, "config", None)
        tree = get_weight_tree(tree)
    # A get_config() dict or a config object (a mapping of its fields).
    class_token_pe = True if config is None else config.get("class_token_position_embedding", True)
    out, layers = {}, {}
    for key, value in tree.items():
        value = np.asarray(value, dtype=np.float32)
        m = re.match(r"^Transformer/encoderblock_(\d+)/([^/]+)/(.+)$", key)
        if m and m.group(2) in _ORIGINAL_PARTS:
            layers.setdefault(f"{_ORIGINAL_PARTS[m.group(2)]}/{m.group(3)}", {})[int(m.group(1))] = value
        elif key == _POS:
            out["pos_embedding"] = value
        elif key.startswith(_AS_IS):
            out[key] = value
        else:
            raise ValueError(
                f"big_vision's ViT has no weight like {key!r} (hybrid ResNet stems, learned 2-D and relative "
                "position embeddings are not part of it). Write this model with keras_vit.write_npz or save_preset."
            )
    if "cls" in out and "pos_embedding" in out and class_token_pe:
        pos = out["pos_embedding"]
        out["cls"] = out["cls"] + pos[:, :1]
        out["pos_embedding"] = pos[:, 1:]
    depth = 1 + max((i for per_layer in layers.values() for i in per_layer), default=-1)
    for sub, per_layer in layers.items():
        if sorted(per_layer) != list(range(depth)):
            raise ValueError(f"Encoder blocks {sorted(per_layer)} of {sub!r} are not numbered 0..{depth - 1}.")
        if scan:
            out[f"{_SCANNED}{sub}"] = np.stack([per_layer[i] for i in range(depth)])
        else:
            out.update({f"Transformer/encoderblock_{i}/{sub}": per_layer[i] for i in range(depth)})
    path = os.fspath(path)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **{prefix + k: v for k, v in out.items()})
    os.replace(tmp, path)
    return path


FORMAT = CheckpointFormat(
    name="big_vision",
    description="a google-research/big_vision ViT .npz (top level, params/ or params/img/; scanned or not)",
    detect=detect,
    read=read_big_vision,
    read_sized=read_big_vision,
    write=write_big_vision_npz,
    numerics="big_vision",
    hub_files=("*.npz",),
    # big_vision's FlexiViT (`models/proj/flexi/vit.py`, `resample_patchemb`) inverts
    # tf.image.resize(method="bilinear"): half-pixel bilinear without antialiasing.
    patch_resize_rule="bilinear",
)
