"""What every reader shares: the error type and a zero-copy safetensors reader. (Inferring a
family's config from a canonical tree is the family file's: `keras_vit.models.vit_family.infer_config`.)

A reader's job ends at (tree, config): `tree` is the canonical weight tree (original Flax names
and shapes, float32 numpy arrays), `config` the VisionTransformer keyword arguments of the
checkpoint, inferred from the weights' shapes (and, where the weights cannot tell, from the
checkpoint's own config file), together with the source framework's numerics.
"""

import contextlib
import json
import math
import mmap
import os
import struct
import threading
import zipfile

import numpy as np

from keras_vit.errors import CheckpointError

# === Errors ===

#: What malformed content raises deep inside a reader (a field of the wrong type, a missing
#: key, an impossible reshape, JSON nested too deeply); `reading` turns each into a CheckpointError.
MALFORMED = (ValueError, TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError, OverflowError,
             RecursionError, NotImplementedError, struct.error, zipfile.BadZipFile, EOFError, UnicodeDecodeError)


@contextlib.contextmanager
def reading(path):
    """Run a reader's body: a CheckpointError or OSError passes through, any other sign of a
    malformed file (see MALFORMED) becomes a CheckpointError naming `path`."""
    try:
        yield
    except (CheckpointError, OSError):
        raise
    except MALFORMED as err:
        raise CheckpointError(
            f"Cannot read {os.fspath(path)!r}: its content is malformed ({type(err).__name__}: {str(err)[:300]}). "
            "Delete it and download or convert it again, or check that it is a checkpoint this package reads."
        ) from None


#: Deflate expands at most ~1032x; a zip member declaring more than this is a lie (or a bomb).
MAX_DEFLATE_RATIO = 1100


def check_finite(array, name, source):
    """`array` if every value is finite, else a CheckpointError naming the tensor.

    NaN or infinite weights never come out of training that converged; they mean a corrupt or
    tampered file, and would only show later as NaN logits.
    """
    if array.dtype.kind == "f" and array.size and not np.isfinite(array).all():
        bad = int(array.size - np.isfinite(array).sum())
        raise CheckpointError(
            f"{os.fspath(source)}: weight {name!r} holds {bad} non-finite value(s) (NaN or inf) of {array.size}; the "
            "file is corrupt. Delete it and download or convert it again."
        )
    return array


def corrupt_file_error(path, err):
    """The error for a file that exists but cannot be parsed: `misnamed_error` when the file is
    another kind than its name says (it is then not damaged, only mislabelled)."""
    misnamed = misnamed_error(path)
    if misnamed is not None:
        return misnamed
    return CheckpointError(
        f"Cannot read {os.fspath(path)!r}: the file is truncated or corrupt ({type(err).__name__}: {err}). "
        "Delete it and download or convert it again (for Hub files, remove it from the cache so that "
        "it is fetched anew)."
    )


# === What a file holds, whatever its name ===

#: kind -> (what the file is, in words; the names such files carry). `file_kind` tells the kind
#: from the first bytes, `named_kind` from the name.
FILE_KINDS = {
    "safetensors": ("a safetensors file", (".safetensors",)),
    "pytorch": ("a PyTorch zip file (torch.save)", (".pth.tar", ".pth", ".pt", ".bin", ".ckpt", ".tar")),
    "pickle": ("a Python pickle", (".pkl",)),
    "keras": ("a .keras archive", (".keras",)),
    "npz": ("a NumPy .npz archive", (".npz",)),
    "hdf5": ("an HDF5 file (Keras .weights.h5)", (".h5",)),
    "json": ("a JSON document", (".json",)),
}
#: Kinds a name may stand for: PyTorch's names are used for its zip files and for plain pickles.
_NAME_ALLOWS = {"pytorch": ("pytorch", "pickle"), "pickle": ("pytorch", "pickle")}
_HDF5_MAGIC = b"\x89HDF\r\n\x1a\n"


def named_kind(path):
    """The FILE_KINDS kind the name of `path` stands for (its extension), or None."""
    name = os.path.basename(os.fspath(path)).lower()
    for kind, (_, endings) in FILE_KINDS.items():
        if name.endswith(endings):
            return kind
    return None


def file_kind(path):
    """The FILE_KINDS kind the content of the file `path` has (from its first bytes and, for a
    zip archive, its member names), or None when it is none of them or cannot be told (a
    damaged file: its reader then says what is wrong with it). Never raises for a readable file."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head.startswith(_HDF5_MAGIC):
        return "hdf5"
    if head[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except (OSError, zipfile.BadZipFile, ValueError, EOFError, struct.error, NotImplementedError):
            return None
        if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
            return "pytorch"
        if "model.weights.h5" in names or "metadata.json" in names:
            return "keras"
        if names and all(n.endswith(".npy") for n in names):
            return "npz"
        return None
    if looks_like_safetensors(path):
        return "safetensors"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return None


def misnamed_error(path):
    """A CheckpointError when the file `path` holds another kind of file than its name says (a
    renamed or mislabelled download), else None. Readers pick a file's parser by its name, so such
    a file would fail deep inside the wrong one with a message about corruption."""
    named = named_kind(path)
    if named is None:
        return None
    actual = file_kind(path)
    if actual is None or actual in _NAME_ALLOWS.get(named, (named,)):
        return None
    what, endings = FILE_KINDS[actual]
    return CheckpointError(
        f"{os.fspath(path)!r} is named like {FILE_KINDS[named][0]} but holds {what}: the file was renamed or "
        f"mislabelled. Give it a name ending in {endings[0]!r} (or use the original file) and load that."
    )


def check_file_name(path):
    """Raise `misnamed_error(path)` when there is one."""
    error = misnamed_error(path)
    if error is not None:
        raise error


def describe_keys(keys, limit=8):
    keys = sorted(keys)
    shown = ", ".join(keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


# === Lazy tensors ===


class LazyArray:
    """A tensor that is read (and transposed, sliced, reshaped) only when `np.asarray` asks.

    Its shape is known up front, so config inference and validation need no data. Loading
    through lazy trees lets a model be built before the weights occupy memory, which keeps a
    conversion's peak near two copies of the weights.
    """

    __slots__ = ("_load", "shape")
    dtype = np.dtype(np.float32)

    def __init__(self, load, shape):
        self._load = load
        self.shape = tuple(int(s) for s in shape)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __array__(self, dtype=None, copy=None):
        array = self._load()
        return array if dtype is None else array.astype(dtype, copy=False)

    def _then(self, op, shape):
        load = self._load
        return LazyArray(lambda: op(load()), shape)

    @property
    def T(self):
        return self._then(lambda a: a.T, self.shape[::-1])

    def transpose(self, *axes):
        axes = tuple(axes[0]) if len(axes) == 1 and not isinstance(axes[0], int) else axes
        return self._then(lambda a: a.transpose(axes), tuple(self.shape[i] for i in axes))

    def reshape(self, *shape):
        shape = list(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else list(shape)
        if -1 in shape:
            known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
            shape[shape.index(-1)] = self.size // known
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {tuple(shape)}")
        return self._then(lambda a: a.reshape(shape), shape)

    def __getitem__(self, index):
        # Slicing a zero-stride stand-in gives the result's shape without touching data.
        # The slice is copied out so that it does not keep its whole source tensor alive.
        shape = np.broadcast_to(np.zeros((), np.float32), self.shape)[index].shape
        return self._then(lambda a: np.ascontiguousarray(a[index]), shape)


def materialize(tree):
    """The tree with every LazyArray read into a numpy array."""
    return {k: (np.asarray(v) if isinstance(v, LazyArray) else v) for k, v in tree.items()}


# === Safetensors ===

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
              "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_ST_ITEMSIZE = {k: np.dtype(v).itemsize for k, v in _ST_DTYPES.items()}
#: Weights are floating point; integer and boolean tensors are refused when read.
_ST_FLOATS = ("F64", "F32", "F16", "BF16")


def _header_int(value):
    """An integer of a safetensors header (offsets, dims); JSON floats, bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


_MAPPED = threading.local()


@contextlib.contextmanager
def mapped_reads():
    """Inside, safetensors tensors stored as float32 are returned as read-only views of a memory
    map of the file instead of fresh copies: no page of new memory is written for them. Only for
    a consumer that copies what it gets into memory of its own (JAX's `jnp.array(..., copy=True)`
    and TensorFlow's `tf.convert_to_tensor` when a variable is created); the views change if the
    file does."""
    previous = getattr(_MAPPED, "on", False), getattr(_MAPPED, "regions", None)
    _MAPPED.on, _MAPPED.regions = True, []
    try:
        yield
    finally:
        # Unmap the pages read (they stay in the page cache): the process's resident memory
        # then holds the consumer's copies, not the file's pages too.
        for mapping, offset, length in _MAPPED.regions:
            start = offset - offset % mmap.PAGESIZE
            with contextlib.suppress(OSError, ValueError):
                mapping.madvise(mmap.MADV_DONTNEED, start, offset + length - start)
        _MAPPED.on, _MAPPED.regions = previous


class SafetensorsFile:
    """A .safetensors file read one tensor at a time (no pickle, never the whole file at once).

    The header is validated on opening, so a truncated or malformed file raises CheckpointError
    before any tensor is handed out. Each `get` reads that tensor's bytes straight into a fresh
    array (float32 stored tensors need no further copy), so peak memory stays at the weights
    kept plus one tensor.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        try:
            with open(self.path, "rb") as f:
                raw = f.read(8)
                if len(raw) < 8:
                    raise ValueError(f"file of {size} bytes has no header")
                (n,) = struct.unpack("<Q", raw)
                if n > size - 8 or n > 100_000_000:
                    raise ValueError(f"header length {n} exceeds the file size {size}")
                header = json.loads(f.read(n).decode("utf-8"))
            if not isinstance(header, dict):
                raise ValueError("the header is not a JSON object")
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            raise corrupt_file_error(self.path, err) from None
        metadata = header.pop("__metadata__", None) or {}
        self.metadata = metadata if isinstance(metadata, dict) else {}
        self._start = 8 + n
        data_size = size - self._start
        end = 0
        entries = {}
        for key, entry in header.items():
            try:
                begin, stop = (_header_int(o) for o in entry["data_offsets"])
                dtype = entry["dtype"]
                shape = tuple(_header_int(s) for s in entry["shape"])
                if not isinstance(dtype, str):
                    raise TypeError(f"dtype {dtype!r} is not a string")
            except (KeyError, TypeError, ValueError) as err:
                raise corrupt_file_error(self.path, ValueError(f"bad header entry for {key!r}: {err}")) from None
            if dtype not in _ST_DTYPES:
                raise CheckpointError(f"{self.path}: tensor {key!r} has unsupported dtype {dtype[:20]!r}.")
            # Python integers: a declared shape cannot overflow its way past these checks.
            nbytes = _ST_ITEMSIZE[dtype] * math.prod(shape)
            if begin < 0 or min(shape, default=0) < 0 or stop - begin != nbytes:
                raise corrupt_file_error(self.path, ValueError(f"tensor {key!r} size does not match its shape"))
            if stop > data_size:
                raise corrupt_file_error(
                    self.path,
                    ValueError(f"tensor {key!r} needs data bytes up to {stop} but the file holds {data_size}"),
                )
            end = max(end, stop)
            entries[key] = {"data_offsets": (begin, stop), "dtype": dtype, "shape": shape}
        self._entries = entries

    def keys(self):
        return list(self._entries)

    def shape(self, key):
        return tuple(self._entries[key]["shape"])

    def __contains__(self, key):
        return key in self._entries

    def lazy(self, key):
        """The tensor `key` as a LazyArray (read when converted with np.asarray); slicing its
        first axis reads only those rows (timm's stacked qkv -> query, key, value)."""
        return _FileTensor(self, key)

    def get(self, key, rows=None):
        """The tensor `key` (or its rows [start, stop) of the first axis) as a float32 array."""
        entry = self._entries[key]
        begin, stop = entry["data_offsets"]
        shape = tuple(entry["shape"])
        dtype = entry["dtype"]
        if dtype not in _ST_FLOATS:
            raise CheckpointError(
                f"{self.path}: tensor {key!r} has dtype {dtype}; weights must be floating point ({', '.join(_ST_FLOATS)})."
            )
        stored = np.uint16 if dtype == "BF16" else _ST_DTYPES[dtype]
        if rows is not None:
            row_bytes = np.dtype(stored).itemsize * int(np.prod(shape[1:], dtype=np.int64))
            begin, stop = begin + rows[0] * row_bytes, begin + rows[1] * row_bytes
            shape = (rows[1] - rows[0],) + shape[1:]
        if getattr(_MAPPED, "on", False) and dtype == "F32":
            array = self._mapped(key, begin, stop, shape)
            return check_finite(array, key, self.path)
        array = np.empty(shape, dtype=stored)
        with open(self.path, "rb") as f:
            f.seek(self._start + begin)
            if f.readinto(memoryview(array.reshape(-1)).cast("B")) != stop - begin:
                raise corrupt_file_error(self.path, EOFError(f"tensor {key!r} is cut short"))
        if dtype == "BF16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        elif array.dtype != np.float32:
            with np.errstate(over="ignore"):
                array = array.astype(np.float32)  # a float64 beyond float32's range becomes inf, refused below
        return check_finite(array, key, self.path)

    def _mapped(self, key, begin, stop, shape):
        """A read-only float32 view of bytes [begin, stop) of the data (see `mapped_reads`)."""
        if getattr(self, "_map", None) is None:
            with open(self.path, "rb") as f:
                # A load reads every tensor: MAP_POPULATE maps the whole file in one call instead of
                # one page fault per 4 KB page as each tensor is first read (ViT-L/16: 0.1 s less).
                # The pages of each tensor are released once copied, so resident memory stays
                # where it would be.
                if hasattr(mmap, "MAP_POPULATE"):  # Linux
                    self._map = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                                          prot=mmap.PROT_READ)
                else:
                    self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if self._start + stop > len(self._map):
            raise corrupt_file_error(self.path, EOFError(f"tensor {key!r} is cut short"))
        count = (stop - begin) // 4
        _MAPPED.regions.append((self._map, self._start + begin, stop - begin))
        return np.frombuffer(self._map, np.float32, count=count, offset=self._start + begin).reshape(shape)


class _FileTensor(LazyArray):
    """A LazyArray backed by one safetensors tensor, or a row range of it."""

    __slots__ = ("_file", "_key", "_rows")

    def __init__(self, file, key, rows=None):
        shape = file.shape(key)
        if rows is not None:
            shape = (rows[1] - rows[0],) + tuple(shape[1:])
        super().__init__(lambda: file.get(key, rows), shape)
        self._file, self._key, self._rows = file, key, rows

    def __getitem__(self, index):
        if isinstance(index, slice) and index.step in (None, 1) and self._rows is None and self.ndim:
            start, stop, _ = index.indices(self.shape[0])
            return _FileTensor(self._file, self._key, (start, max(start, stop)))
        return super().__getitem__(index)


def safetensors_in_folder(folder, how_to_save):
    """The weights file of a Hub-layout folder; safetensors only (pickles are never loaded)."""
    for name in ("model.safetensors", "model.safetensors.index.json"):
        candidate = os.path.join(folder, name)
        if os.path.exists(candidate):
            return candidate
    raise CheckpointError(
        f"{folder}: no model.safetensors. Only safetensors weights are read (pickled "
        f"pytorch_model.bin files are not loaded for safety); {how_to_save}."
    )


def open_safetensors(path):
    """{key: SafetensorsFile} for a .safetensors file or a sharded set (*.safetensors.index.json)."""
    path = os.fspath(path)
    if path.endswith(".index.json"):
        weight_map = read_json(path).get("weight_map")
        if not isinstance(weight_map, dict) or not all(
            isinstance(name, str) and name == os.path.basename(name) and name.endswith(".safetensors")
            for name in weight_map.values()
        ):
            raise corrupt_file_error(
                path, ValueError("'weight_map' is not a map of tensor names to .safetensors files in this folder")
            )
        folder = os.path.dirname(path)
        files = {name: SafetensorsFile(os.path.join(folder, name)) for name in sorted(set(weight_map.values()))}
        return {key: files[name] for key, name in weight_map.items()}
    f = SafetensorsFile(path)
    return {key: f for key in f.keys()}


#: The largest JSON file read (configs and shard indexes are kilobytes; this refuses a huge
#: file before it is parsed).
MAX_JSON_BYTES = 16 * 2**20


def read_json(path):
    """The JSON object (a dict) in `path`; CheckpointError when it is not one, is malformed,
    nested too deeply or larger than MAX_JSON_BYTES."""
    size = os.path.getsize(path)
    if size > MAX_JSON_BYTES:
        raise CheckpointError(
            f"{os.fspath(path)}: {size:,} bytes is too large for a checkpoint's JSON file (at most "
            f"{MAX_JSON_BYTES:,}); the file is corrupt or not a config."
        )
    try:
        with open(path, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise corrupt_file_error(path, err) from None
    if not isinstance(value, dict):
        raise corrupt_file_error(path, ValueError(f"expected a JSON object, got a {type(value).__name__}"))
    return value


def read_json_or_empty(path):
    """The JSON object in `path`, or {} when it is missing, unreadable or not an object (for
    format detection, which must not raise on another format's files)."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def looks_like_safetensors(path):
    """Whether a file without a telling extension starts like a safetensors file (an 8-byte
    little-endian header length that fits the file, then a JSON object)."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
        size = os.path.getsize(path)
    except OSError:
        return False
    return len(head) == 9 and int.from_bytes(head[:8], "little") < size and head[8:9] == b"{"


def safetensors_flavour(path):
    """"transformers" or "timm", from the tensor names of a .safetensors (or its index); "timm"
    also for a file too damaged to tell (its reader then says what is wrong with it)."""
    try:
        if path.endswith(".index.json"):
            keys = list(read_json_or_empty(path).get("weight_map", {}))
        else:
            keys = SafetensorsFile(path).keys()
    except CheckpointError:
        return "timm"
    if any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in keys):
        return "transformers"
    return "timm"
