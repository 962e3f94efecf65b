"""The original google-research/vision_transformer .npz files: reader and writer.

The canonical tree IS this layout, so reading is mostly cleaning up the variants the released
files come in: everything nested under `opt/target/` (optimizer checkpoints, whose optimizer
state is dropped), and GroupNorm parameters stored as (1, 1, 1, C).
"""

import math
import os
import tokenize
import zipfile
import zlib
from collections.abc import Mapping

import numpy as np

from keras_vit.checkpoints.registry import CheckpointFormat, reads_config_object
from keras_vit.errors import CheckpointError
from keras_vit.models.config import NUMERICS
from keras_vit.models.vit_family import infer_config
from keras_vit.storage.files import MAX_DEFLATE_RATIO, check_finite, corrupt_file_error, reading
from keras_vit.storage.lazy import LazyArray

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
            with np.errstate(over="ignore"):
                value = value.astype(np.float32)  # beyond float32's range becomes inf, refused below
        check_finite(value, name, source)
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


@reads_config_object
def read_npz(path):
    """Read an original .npz (or a folder holding one) into (canonical tree,
    ViTConfig with the original numerics).

    Example:
        >>> tree, config = read_npz("ViT-B_16.npz")   # doctest: +SKIP
        >>> config["num_heads"], config["image_size"]
        (12, (224, 224))
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = _single_npz(path) or path
    if not os.path.exists(path):
        raise FileNotFoundError(f"No checkpoint at {path!r}.")
    try:
        arrays = NpzMembers(path)
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, NotImplementedError, SyntaxError,
            tokenize.TokenError) as err:  # numpy parses a damaged .npy header with Python's tokenizer
        raise corrupt_file_error(path, err) from None
    with arrays, reading(path):
        tree = canonical_from_npz_arrays(arrays, source=path)
        return tree, infer_config(tree, NUMERICS["original"], source=path)


def lazy_member(members, key, index=None, shape=None):
    """A LazyArray of member `key` of `members` (an `NpzMembers`), or its entry `index` of the
    leading axis, as float32 (reshaped to `shape` if given), checked for non-finite values when
    read; a file damaged since its headers were read raises CheckpointError then."""
    stored = members.shape(key)
    if index is not None:
        stored = stored[1:]
    path = members.path

    def load():
        try:
            array = members[key] if index is None else members.read_index(key, index)
        except (zipfile.BadZipFile, EOFError, ValueError, OSError) as err:
            raise corrupt_file_error(path, err) from None
        if array.dtype != np.float32:
            with np.errstate(over="ignore"):
                array = array.astype(np.float32)  # beyond float32's range becomes inf, refused below
        if shape is not None:
            array = array.reshape(shape)
        name = key if index is None else f"{key}[{index}]"
        return check_finite(array, name, path)

    return LazyArray(load, stored if shape is None else shape)


def open_members(path):
    """`NpzMembers(path)`, with every sign of a damaged zip or .npy header as a CheckpointError."""
    try:
        return NpzMembers(path)
    except (zipfile.BadZipFile, EOFError, ValueError, OSError, NotImplementedError, SyntaxError,
            tokenize.TokenError) as err:  # numpy parses a damaged .npy header with Python's tokenizer
        if isinstance(err, (CheckpointError, FileNotFoundError)):
            raise
        raise corrupt_file_error(path, err) from None


class NpzMembers:
    """The arrays of an .npz, with every member's .npy header checked before anything is read.

    np.load allocates an array of the shape a header declares before reading its data, so a
    file of a few bytes could claim terabytes. Here each declared size must equal the member's
    size in the zip (and a compressed member may not claim more than deflate can expand), so
    nothing larger than the file (or its honest decompression) is allocated. Object arrays
    (pickles) and non-numeric dtypes are refused.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._zip = zipfile.ZipFile(self.path)
        self._members = {}
        self._crc_checked = set()
        try:
            for info in self._zip.infolist():
                if info.filename.endswith(".npy"):
                    self._members[info.filename[:-4]] = (info, *self._header(info))
        except BaseException:
            self._zip.close()
            raise

    def _header(self, info):
        if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_DEFLATE_RATIO * max(info.compress_size, 1):
            raise ValueError(f"member {info.filename!r} claims {info.file_size} bytes from {info.compress_size} "
                             "compressed bytes, more than deflate can expand")
        with self._zip.open(info) as f:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"member {info.filename!r} has .npy format version {version}, not 1.0 or 2.0")
            offset = f.tell()
        name = info.filename[:-4]
        if dtype.hasobject:
            raise CheckpointError(f"{self.path}: weight {name!r} is an object array (a pickle); it is never loaded.")
        if dtype.kind not in "fiub" or dtype.subdtype is not None:
            raise CheckpointError(f"{self.path}: weight {name!r} has dtype {dtype}; expected floats.")
        if any(int(d) < 0 for d in shape):
            raise ValueError(f"member {info.filename!r} declares a negative dimension {shape}")
        nbytes = dtype.itemsize * math.prod(int(d) for d in shape)  # Python integers: no overflow
        if offset + nbytes != info.file_size:
            raise ValueError(f"member {info.filename!r} declares shape {shape} of {dtype} ({nbytes} bytes) but holds "
                             f"{info.file_size - offset} data bytes")
        return tuple(int(d) for d in shape), fortran, dtype, offset

    def keys(self):
        return list(self._members)

    def shape(self, key):
        """The declared shape of member `key` (no data is read)."""
        return self._members[key][1]

    def dtype(self, key):
        """The declared dtype of member `key`."""
        return self._members[key][3]

    def read_index(self, key, index):
        """`self[key][index]` (one entry of the leading axis), reading only its bytes where the
        member is stored uncompressed in C order (a scanned checkpoint's per-layer slice), and
        from a zip file that is opened for the read when this object is closed."""
        info, shape, fortran, dtype, offset = self._members[key]
        if not shape or not 0 <= index < shape[0]:
            raise IndexError(f"index {index} is out of range for weight {key!r} of shape {shape}")
        if fortran or info.compress_type != zipfile.ZIP_STORED:
            return np.ascontiguousarray(self[key][index])
        row = dtype.itemsize * math.prod(shape[1:])
        array = np.empty(shape[1:], dtype=dtype)
        with open(self.path, "rb") as f:
            f.seek(info.header_offset)
            local = f.read(30)  # the local file header; its name and extra field lengths end it
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"member {info.filename!r} has no valid local header")
            name_length, extra_length = (int.from_bytes(local[i : i + 2], "little") for i in (26, 28))
            start = info.header_offset + 30 + name_length + extra_length
            if key not in self._crc_checked:
                self._check_crc(f, info, start)
                self._crc_checked.add(key)
            f.seek(start + offset + index * row)
            if f.readinto(memoryview(array.reshape(-1).view(np.uint8))) != row:
                raise EOFError(f"member {info.filename!r} is cut short")
        return array

    def _check_crc(self, f, info, start, chunk=2**22):
        """The zip's CRC-32 over the whole stored member `info` (whose data begin at `start`):
        the slices `read_index` hands out are then as checked as a whole-member read."""
        f.seek(start)
        crc, left = 0, info.file_size
        while left:
            block = f.read(min(chunk, left))
            if not block:
                raise EOFError(f"member {info.filename!r} is cut short")
            crc = zlib.crc32(block, crc)
            left -= len(block)
        if crc != info.CRC:
            raise zipfile.BadZipFile(f"Bad CRC-32 for file {info.filename!r}")

    def __getitem__(self, key):
        info, shape, fortran, dtype, offset = self._members[key]
        array = np.empty(math.prod(shape), dtype=dtype)
        if self._zip.fp is None:  # closed after the headers were read: reopen for this read
            with zipfile.ZipFile(self.path) as z, z.open(info) as f:
                return self._read_into(f, info, array, offset).reshape(shape, order="F" if fortran else "C")
        with self._zip.open(info) as f:
            return self._read_into(f, info, array, offset).reshape(shape, order="F" if fortran else "C")

    @staticmethod
    def _read_into(f, info, array, offset):
        f.seek(offset)
        view = memoryview(array.view(np.uint8))
        got = 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                raise EOFError(f"member {info.filename!r} is cut short")
            got += n
        if f.read(1):
            raise ValueError(f"member {info.filename!r} holds more data than its header declares")
        return array

    def close(self):
        self._zip.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def write_npz(tree, path, *, prefix="", group_norm_shape="flat"):
    """Write a canonical weight tree (or a keras_vit model's weights) as an original-layout .npz.

    The file loads in google-research/vision_transformer and in timm's .npz loader. A model
    whose class token has no position embedding (`class_token_position_embedding=False`, as
    loaded from big_vision) is written with a zero row for it, which computes the same.

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

        config = getattr(tree, "config", None)
        tree = get_weight_tree(tree)
        if getattr(config, "classifier", None) == "token" and not config.class_token_position_embedding:
            tree = _with_class_token_row(tree)
    if "embedding/kernel" not in tree:
        raise ValueError(
            "Not a ViT weight tree: it has no 'embedding/kernel'"
            + ("; write BiT ResNets with keras_vit.checkpoints.bit.write_bit_npz." if any(
                k.startswith("resnet/") for k in tree) else ".")
        )
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


def _with_class_token_row(tree):
    """The tree of a model whose class token has no position embedding (big_vision's), in the
    original layout, where the embedding covers the class token: its row is zeros (the same sum)."""
    tree = dict(tree)
    pos = "Transformer/posembed_input/pos_embedding"
    if pos in tree:
        tree[pos] = np.concatenate([np.zeros_like(tree[pos][:, :1]), tree[pos]], axis=1)
    x = "Transformer/posembed_input/x_embedding"
    if x in tree:
        tree["Transformer/posembed_input/prefix_embedding"] = np.zeros((1, tree[x].shape[-1] * 2), np.float32)
    return tree


FORMAT = CheckpointFormat(
    name="npz",
    description="an original google-research/vision_transformer .npz",
    detect=detect,
    read=read_npz,
    write=write_npz,
    numerics="original",
    hub_files=("*.npz",),
)
