"""Safetensors files read one tensor at a time (no pickle, never the whole file at once), and
memory-mapped reads for consumers that copy what they get."""

import contextlib
import math
import mmap
import os
import struct
import threading

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.storage.files import check_finite, corrupt_file_error
from keras_vit.storage.json_files import json_object, read_json_object
from keras_vit.storage.lazy import LazyArray

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
                header_bytes = f.read(n)
        except ValueError as err:
            raise corrupt_file_error(self.path, err) from None
        header = json_object(header_bytes, self.path)
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
        weight_map = read_json_object(path).get("weight_map")
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
