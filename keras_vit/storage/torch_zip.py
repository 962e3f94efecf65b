"""PyTorch checkpoint files (`torch.save`'s zip format) read without torch and without running
any code from the file.

A `torch.save` file is a zip archive: `<name>/data.pkl` is a pickle of the saved object whose
tensors are calls of `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`, each
storage a persistent id `("storage", torch.FloatStorage, "<key>", "<device>", numel)` whose bytes
are the member `<name>/data/<key>`. Unpickling such a file with `pickle` or `torch.load` would
call whatever the pickle names; here a restricted unpickler resolves only

- the tensor and parameter rebuild functions (to functions of this module that record the
  layout, nothing of torch's),
- the typed storage classes (`torch.FloatStorage`, `torch.HalfStorage`, `torch.BFloat16Storage`,
  `torch.LongStorage`, ...),
- `collections.OrderedDict`; dicts, lists, tuples, strings and numbers are pickle's own.

Nothing built can be changed afterwards: BUILD (pickle's `__setstate__` / `__dict__` update) is
refused on everything but an OrderedDict (whose attributes, torch's `_metadata`, are dropped),
SETITEM(S) and APPEND(S) on everything but a plain dict, OrderedDict or list, and the objects
pickle builds by calling a class (NEWOBJ, OBJ) are refused outright; the rebuilt tensors and
storages refuse attribute assignment too.

Any other global (`os.system`, `builtins.eval`, `torch.load` itself, ...) is a CheckpointError
naming it, raised when the unpickler meets the name, before anything could be called. Storages
are read from the zip into NumPy when a tensor is converted (lazily), with every size, offset
and stride checked against the member's size (when the pickle is read, and again when the
bytes are read), and the member's CRC-32 checked. Files written on a big-endian machine
(`byteorder` "big") are byteswapped to the native order.
Legacy (pre-1.6, non-zip) torch files are refused: their format interleaves pickles and raw
storages in a way that has no table of contents to check against.

    state = TorchZipFile("checkpoint.pth.tar").state_dict()   # {key: TorchTensor}
    kernel = np.asarray(state["conv1.weight"])                  # read now, float32
"""

import _compat_pickle
import collections
import io
import math
import os
import pickle
import struct
import zipfile
import zlib

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.storage.files import MAX_DEFLATE_RATIO, check_finite, endings, misnamed_error
from keras_vit.storage.lazy import LazyArray

#: The largest data.pkl read (a ViT-H state dict's pickle is ~50 KB; optimizer states a few MB).
MAX_PICKLE_BYTES = 256 * 2**20

#: Python-level pickle magic of torch's legacy format (torch.serialization.MAGIC_NUMBER).
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

# === Storages ===


class _Frozen:
    """Attributes are set once, in `__init__`, and never changed or deleted afterwards (so no
    pickle opcode, and no bug of this module, can change a checked layout); those named in
    `_NAMED_LATER` may be set once more while they are None."""

    __slots__ = ()
    _NAMED_LATER = ()

    def __setattr__(self, name, value):
        try:
            current = object.__getattribute__(self, name)
        except AttributeError:  # an unset slot: set in __init__
            object.__setattr__(self, name, value)
            return
        if name in self._NAMED_LATER and current is None:
            object.__setattr__(self, name, value)
            return
        raise AttributeError(f"{type(self).__name__}.{name} cannot be changed after it is built")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__}.{name} cannot be deleted")


class _StorageType(_Frozen):
    """A typed storage class named in the pickle (`torch.FloatStorage` -> float32)."""

    __slots__ = ("name", "dtype")

    def __init__(self, name, dtype):
        self.name, self.dtype = name, np.dtype(dtype)

    def __repr__(self):
        return f"torch.{self.name}"

    def __call__(self, *args, **kwargs):  # a pickle that REDUCEs a storage class itself
        raise pickle.UnpicklingError(f"torch.{self.name} is only accepted as a storage's type")


#: torch's typed storages -> the NumPy dtype of their bytes (bfloat16 kept as its uint16 bits).
STORAGE_TYPES = {
    name: _StorageType(name, dtype)
    for name, dtype in {
        "FloatStorage": np.float32,
        "DoubleStorage": np.float64,
        "HalfStorage": np.float16,
        "BFloat16Storage": np.uint16,
        "LongStorage": np.int64,
        "IntStorage": np.int32,
        "ShortStorage": np.int16,
        "CharStorage": np.int8,
        "ByteStorage": np.uint8,
        "BoolStorage": np.bool_,
    }.items()
}


class _Storage(_Frozen):
    """One storage of the archive: its member, element type and element count (read on demand)."""

    __slots__ = ("archive", "key", "type", "numel", "member")

    def __init__(self, archive, key, storage_type, numel, member):
        self.archive, self.key, self.type, self.numel, self.member = archive, key, storage_type, numel, member

    @property
    def nbytes(self):
        return self.numel * self.type.dtype.itemsize

    def check(self):
        """Refuse a storage whose type, element count or member is not one the archive declared
        (checked again before every read, whatever the unpickler let through)."""
        if self.type not in STORAGE_TYPES.values() or not _is_int(self.numel) or self.numel < 0:
            raise CheckpointError(f"{self.archive.path}: storage {str(self.key)[:40]!r} has type {str(self.type)[:40]} "
                                  f"and {str(self.numel)[:40]} elements; the file is malformed.")
        member = self.archive.members.get(f"{self.archive.prefix}data/{self.key}")
        if member is None or member is not self.member:
            raise CheckpointError(f"{self.archive.path}: storage {str(self.key)[:40]!r} is not the member "
                                  f"data/{str(self.key)[:40]} of the archive; the file is malformed.")
        nbytes = self.numel * self.type.dtype.itemsize  # Python ints: no overflow
        if nbytes > member.file_size:
            raise CheckpointError(
                f"{self.archive.path}: storage {self.key!r} claims {self.numel:,} elements ({nbytes:,} bytes) but its "
                f"member holds {member.file_size:,} bytes; the file is truncated or corrupt."
            )
        return nbytes

    def read(self):
        """The storage's elements as a 1-D array of its dtype (the member's CRC-32 checked)."""
        nbytes = self.check()
        array = np.empty(self.numel, self.type.dtype)
        self.archive.read_member(self.member, memoryview(array.view(np.uint8)), nbytes)
        if self.archive.byteorder == "big" and array.dtype.itemsize > 1:
            array = array.byteswap()
        return array


# === Tensors ===


class TorchTensor(_Frozen, LazyArray):
    """A tensor of a torch zip file: shape, dtype and layout known, values read when converted.

    `np.asarray(tensor)` gives float32 for floating-point storages (bfloat16 and float16
    widened exactly, non-finite values refused) and the stored integer type otherwise;
    `tensor.numpy()` gives the stored dtype (bfloat16 as float32, which holds it exactly).
    Its layout cannot be changed once built; its `name` is set once.
    """

    __slots__ = ("storage", "offset", "stride", "torch_dtype", "name")
    _NAMED_LATER = ("name",)

    def __init__(self, storage, offset, shape, stride, name=None):
        self.storage, self.offset, self.stride = storage, offset, tuple(stride)
        self.name = name  # its key in the state dict (`find_state_dict` sets it once), for errors
        self.torch_dtype = storage.type.name.replace("Storage", "")
        super().__init__(self._float32, shape)

    @property
    def dtype(self):
        kind = self.storage.type.dtype
        return np.dtype(np.float32) if kind.kind == "f" or self.torch_dtype == "BFloat16" else kind

    @property
    def is_floating_point(self):
        return self.storage.type.dtype.kind == "f" or self.torch_dtype == "BFloat16"

    def numpy(self):
        """The values in their stored dtype (bfloat16 as float32), C-contiguous."""
        if not isinstance(self.storage, _Storage):
            raise CheckpointError(f"tensor {self.name!r}: its storage is not a storage of a PyTorch archive.")
        offset, shape, stride = _check_layout(self.storage, self.offset, self.shape, self.stride)
        flat = self.storage.read()
        itemsize = flat.dtype.itemsize
        if math.prod(shape) == 0:
            array = np.zeros(shape, flat.dtype)
        else:
            view = np.lib.stride_tricks.as_strided(
                flat[offset:], shape=shape, strides=tuple(s * itemsize for s in stride), writeable=False
            )
            array = np.array(view, copy=True, order="C")
        if self.torch_dtype == "BFloat16":
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return array

    def _float32(self):
        array = self.numpy()
        if array.dtype.kind == "f":
            with np.errstate(over="ignore"):
                array = array.astype(np.float32, copy=False)
            name = self.name if self.name is not None else f"in storage {self.storage.key}"
            return check_finite(array, name, self.storage.archive.path)
        return array

    def __repr__(self):
        return f"TorchTensor({self.torch_dtype}, shape={self.shape})"


def _is_int(value):
    return type(value) is int  # a Python int: no bool, no NumPy integer that could wrap


#: The largest dimension or stride read (2^48 elements: far beyond any real tensor; keeps every
#: byte stride NumPy is handed inside its 64-bit index range).
MAX_EXTENT = 2**48


def _check_layout(storage, offset, shape, stride):
    """(offset, shape, stride) as tuples of Python ints, checked against `storage`: non-negative
    integers, one stride per dimension, and every element the layout reaches inside the storage's
    elements; else a CheckpointError naming the file. Run when a tensor is rebuilt from the
    pickle and again before its bytes are read."""
    path = storage.archive.path
    for what, values in (("size", shape), ("stride", stride), ("storage offset", (offset,))):
        if not isinstance(values, (tuple, list)) or not all(_is_int(v) and 0 <= v <= MAX_EXTENT for v in values):
            raise CheckpointError(f"{path}: its data.pkl is malformed: a tensor's {what} {str(values)[:80]} is not "
                                  f"a tuple of integers in [0, {MAX_EXTENT}].")
    shape, stride = tuple(shape), tuple(stride)
    if len(shape) != len(stride):
        raise CheckpointError(f"{path}: its data.pkl is malformed: a tensor has {len(shape)} dimensions but "
                              f"{len(stride)} strides.")
    numel = math.prod(shape)  # Python ints throughout: nothing wraps
    if offset > storage.numel:
        raise CheckpointError(f"{path}: a tensor starts at element {offset} of storage {storage.key!r}, which holds "
                              f"{storage.numel}; the file is corrupt.")
    if numel:
        last = offset + sum((n - 1) * s for n, s in zip(shape, stride))
        if last >= storage.numel:
            raise CheckpointError(
                f"{path}: a tensor of shape {shape} (offset {offset}, stride {stride}) reaches element "
                f"{last} of storage {storage.key!r}, which holds {storage.numel}; the file is corrupt."
            )
        if numel > storage.numel:
            raise CheckpointError(
                f"{path}: a tensor of shape {shape} has {numel} elements in a storage of "
                f"{storage.numel} (overlapping strides {stride}, e.g. an expanded tensor); such layouts are "
                "not read. Save `tensor.contiguous()` (or `.clone()`) instead."
            )
    return offset, shape, stride


def _rebuild_tensor(storage, storage_offset, size, stride, *_ignored):
    """Stands in for torch._utils._rebuild_tensor_v2: checks the layout against the storage and
    records it (the `requires_grad`, backward hooks and metadata arguments are dropped)."""
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor's storage is not a storage of the archive")
    offset, shape, stride = _check_layout(storage, storage_offset, size, stride)
    return TorchTensor(storage, offset, shape, stride)


def _rebuild_parameter(data, requires_grad=None, backward_hooks=None, state=None):
    """Stands in for torch._utils._rebuild_parameter(_with_state): a parameter is its tensor."""
    if not isinstance(data, TorchTensor):
        raise pickle.UnpicklingError("a parameter does not hold a tensor")
    return data


#: The only globals a data.pkl may name, and what each resolves to.
ALLOWED_GLOBALS = {
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    **{("torch", name): storage_type for name, storage_type in STORAGE_TYPES.items()},
}


#: The containers pickle may fill (SETITEM(S), APPEND(S)) while it builds them.
_MAPPINGS = (dict, collections.OrderedDict)


class _RestrictedUnpickler(pickle._Unpickler):
    """pickle's own (Python) unpickler with its globals restricted (`find_class`) and every
    opcode that changes an object after it is built refused on anything but a plain container."""

    def __init__(self, data, archive):
        super().__init__(io.BytesIO(data))
        self.archive = archive
        self.storages = {}

    def _refuse(self, what, target):
        raise CheckpointError(
            f"{self.archive.path}: its pickle {what} a {type(target).__name__} after it was built, which torch.save "
            "never writes; a file that does so could change a checked tensor layout. Nothing was loaded. Use "
            "weights from a source you trust, saved as a plain state dict, or as safetensors."
        )

    def _target(self, depth):
        if len(self.stack) < depth:
            raise pickle.UnpicklingError("stack underflow")
        return self.stack[-depth]

    def _marked_target(self):
        if not self.metastack or not self.metastack[-1]:
            raise pickle.UnpicklingError("stack underflow")
        return self.metastack[-1][-1]

    def _load_build(self):
        state, inst = self._target(1), self._target(2)
        if type(inst) is collections.OrderedDict and type(state) is dict and all(type(k) is str for k in state):
            self.stack.pop()  # a state dict's attributes (torch's `_metadata`): not needed, dropped
            return
        self._refuse("sets the state (BUILD) of", inst)

    def _load_setitem(self):
        if type(self._target(3)) not in _MAPPINGS:
            self._refuse("sets an item of", self._target(3))
        pickle._Unpickler.load_setitem(self)

    def _load_setitems(self):
        if type(self._marked_target()) not in _MAPPINGS:
            self._refuse("sets items of", self._marked_target())
        pickle._Unpickler.load_setitems(self)

    def _load_append(self):
        if type(self._target(2)) is not list:
            self._refuse("appends to", self._target(2))
        pickle._Unpickler.load_append(self)

    def _load_appends(self):
        if type(self._marked_target()) is not list:
            self._refuse("appends to", self._marked_target())
        pickle._Unpickler.load_appends(self)

    def _load_additems(self):
        if type(self._marked_target()) is not set:
            self._refuse("adds items to", self._marked_target())
        pickle._Unpickler.load_additems(self)

    def _load_by_class(self):
        raise CheckpointError(
            f"{self.archive.path}: its pickle creates an object by calling a class (NEWOBJ / OBJ), which torch.save "
            "never writes for tensors, storages or containers. Nothing was loaded. Use weights from a source you "
            "trust, saved as a plain state dict, or as safetensors."
        )

    dispatch = dict(pickle._Unpickler.dispatch)
    dispatch[pickle.BUILD[0]] = _load_build
    dispatch[pickle.SETITEM[0]] = _load_setitem
    dispatch[pickle.SETITEMS[0]] = _load_setitems
    dispatch[pickle.APPEND[0]] = _load_append
    dispatch[pickle.APPENDS[0]] = _load_appends
    dispatch[pickle.ADDITEMS[0]] = _load_additems
    for _opcode in (pickle.NEWOBJ, pickle.NEWOBJ_EX, pickle.OBJ):
        dispatch[_opcode[0]] = _load_by_class
    del _opcode

    def find_class(self, module, name):
        found = ALLOWED_GLOBALS.get((module, name))
        if found is None:
            # Python 2 names (protocol <= 2 pickles write __builtin__.eval) as Python 3 calls them
            module, name = _compat_pickle.NAME_MAPPING.get(
                (module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module), name))
            raise CheckpointError(
                f"{self.archive.path}: its pickle names {str(module)[:80]}.{str(name)[:80]}, which is not a tensor, storage "
                "or container of a PyTorch checkpoint. Nothing was loaded or run: unpickling this file "
                "(torch.load, pickle.load) would call it. Use weights from a source you trust, saved as a "
                "plain state dict, or as safetensors."
            )
        return found

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise pickle.UnpicklingError(f"persistent id {str(pid)[:80]} is not a storage")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType):
            raise CheckpointError(
                f"{self.archive.path}: a storage has type {str(storage_type)[:60]}; the types read are "
                f"{', '.join(f'torch.{n}' for n in STORAGE_TYPES)}."
            )
        if not isinstance(key, str) or not _is_int(numel) or numel < 0:
            raise pickle.UnpicklingError(f"storage id {str(pid)[:80]} is malformed")
        if key in self.storages:
            storage = self.storages[key]
            if storage.type is not storage_type or storage.numel != numel:
                raise pickle.UnpicklingError(f"storage {key!r} is declared twice with different types or sizes")
            return storage
        storage = _Storage(self.archive, key, storage_type, numel, self.archive.storage_member(key))
        storage.check()  # its bytes inside its member
        self.storages[key] = storage
        return storage


# === Archive ===


def is_legacy_torch_file(path):
    """Whether `path` starts like torch's legacy (non-zip) serialization: a pickled magic number."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    # protocol-2 pickle of the magic int: \x80\x02 then LONG1 (\x8a) of 10 bytes
    return head[:3] == b"\x80\x02\x8a" and int.from_bytes(head[4:14], "little") == _LEGACY_MAGIC


def is_torch_zip(path):
    """Whether `path` is a zip archive holding a `data.pkl` (torch.save's format since 1.6)."""
    try:
        if not zipfile.is_zipfile(path):
            return False
        with zipfile.ZipFile(path) as archive:
            return any(n == "data.pkl" or n.endswith("/data.pkl") for n in archive.namelist())
    except (OSError, zipfile.BadZipFile, ValueError, EOFError, struct.error):
        return False


def legacy_error(path):
    return CheckpointError(
        f"{os.fspath(path)!r} is a PyTorch file in the legacy (pre-1.6, non-zip) format, which is a stream of "
        "pickles with no table of contents: it can only be read by running its pickles, which this package never "
        "does. Re-save it with a current torch (torch.save(torch.load(path, weights_only=True), new_path)) or "
        "as safetensors."
    )


class TorchZipFile:
    """A `torch.save` zip archive, parsed without torch: `object` is the saved object with
    `TorchTensor` leaves; `state_dict()` finds the weights in it.

    Raises CheckpointError for a legacy torch file, a file that is not a torch zip, a corrupt or
    truncated archive, a pickle naming anything but tensors, storages and containers, and
    storages or tensors larger than their members.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        if is_legacy_torch_file(self.path):
            raise legacy_error(self.path)
        self.size = os.path.getsize(self.path)
        try:
            with zipfile.ZipFile(self.path) as archive:
                infos = archive.infolist()
        except (zipfile.BadZipFile, ValueError, EOFError, struct.error, NotImplementedError) as err:
            raise misnamed_error(self.path) or CheckpointError(
                f"Cannot read {self.path!r}: it is not a PyTorch zip file or it is truncated or corrupt "
                f"({type(err).__name__}: {err}). Delete it and download or save it again."
            ) from None
        pickles = [i for i in infos if i.filename == "data.pkl" or i.filename.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise (misnamed_error(self.path) if not pickles else None) or CheckpointError(
                f"{self.path}: a PyTorch zip file holds one data.pkl; this archive holds {len(pickles)}, so it was not "
                "written by torch.save."
            )
        self.prefix = pickles[0].filename[: -len("data.pkl")]
        self.members = {}
        for info in infos:
            self._check_member(info)
            self.members[info.filename] = info
        order = self.members.get(self.prefix + "byteorder")
        self.byteorder = "little"
        if order is not None:
            self.byteorder = self._read_small(order).decode("ascii", "replace").strip()
            if self.byteorder not in ("little", "big"):
                raise CheckpointError(f"{self.path}: byteorder {self.byteorder[:20]!r} is neither 'little' nor 'big'.")
        data = self._read_small(pickles[0])
        try:
            self.object = _RestrictedUnpickler(data, self).load()
        except CheckpointError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
                OverflowError, RecursionError, MemoryError, struct.error, UnicodeDecodeError) as err:
            raise CheckpointError(
                f"Cannot read {self.path!r}: its data.pkl is malformed ({type(err).__name__}: {str(err)[:200]}). Delete "
                "it and download or save it again."
            ) from None

    def _check_member(self, info):
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise CheckpointError(f"{self.path}: member {info.filename!r} uses zip compression {info.compress_type}, "
                                  "which torch.save never writes.")
        if info.header_offset + 30 + info.compress_size > self.size:
            raise CheckpointError(
                f"Cannot read {self.path!r}: member {info.filename!r} extends past the end of the file; the file is "
                "truncated. Delete it and download or save it again."
            )
        limit = info.compress_size if info.compress_type == zipfile.ZIP_STORED else info.compress_size * MAX_DEFLATE_RATIO
        if info.file_size > limit:
            raise CheckpointError(
                f"{self.path}: member {info.filename!r} claims {info.file_size:,} bytes from {info.compress_size:,} "
                "stored bytes; the file is corrupt."
            )

    def storage_member(self, key):
        member = self.members.get(f"{self.prefix}data/{key}")
        if member is None:
            raise CheckpointError(f"{self.path}: storage {key[:40]!r} has no member data/{key[:40]} in the archive; the "
                                  "file is incomplete.")
        return member

    def _read_small(self, info):
        if info.file_size > MAX_PICKLE_BYTES:
            raise CheckpointError(f"{self.path}: {info.filename} claims {info.file_size:,} bytes, more than a "
                                  f"checkpoint's pickle holds (at most {MAX_PICKLE_BYTES:,}).")
        buffer = bytearray(info.file_size)
        self.read_member(info, memoryview(buffer), info.file_size)
        return bytes(buffer)

    def read_member(self, info, out, nbytes):
        """Read the first `nbytes` of member `info` into the writable buffer `out`, checking the
        whole member's CRC-32."""
        try:
            with open(self.path, "rb") as f:
                if info.compress_type == zipfile.ZIP_STORED:
                    self._read_stored(f, info, out, nbytes)
                    return
            with zipfile.ZipFile(self.path) as archive, archive.open(info) as member:
                got = member.readinto(out[:nbytes]) if nbytes else 0
                rest = member.read(info.file_size - nbytes)  # to the end: zipfile checks the CRC there
                if got != nbytes or len(rest) != info.file_size - nbytes:
                    raise EOFError("cut short")
        except (zipfile.BadZipFile, EOFError, zlib.error) as err:
            raise CheckpointError(
                f"Cannot read {self.path!r}: member {info.filename!r} is truncated or corrupt ({err}). Delete the file "
                "and download or save it again."
            ) from None

    def _read_stored(self, f, info, out, nbytes):
        f.seek(info.header_offset)
        header = f.read(30)
        if len(header) != 30 or header[:4] != b"PK\x03\x04":
            raise zipfile.BadZipFile("bad local file header")
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        start = info.header_offset + 30 + name_length + extra_length
        if start + info.compress_size > self.size:
            raise EOFError("member extends past the end of the file")
        f.seek(start)
        got = f.readinto(out[:nbytes]) if nbytes else 0
        if got != nbytes:
            raise EOFError("cut short")
        crc = zlib.crc32(out[:nbytes])
        remaining = info.file_size - nbytes
        while remaining:
            chunk = f.read(min(remaining, 1 << 22))
            if not chunk:
                raise EOFError("cut short")
            crc = zlib.crc32(chunk, crc)
            remaining -= len(chunk)
        if crc != info.CRC:
            raise zipfile.BadZipFile(f"bad CRC-32 for {info.filename!r}")

    def state_dict(self, keys=("state_dict", "model", "module")):
        """The {name: TorchTensor} map in the file: the saved object itself when it is one, else
        the first of `keys` holding one (training scripts save {"epoch", "state_dict", ...})."""
        return find_state_dict(self.object, self.path, keys)


def _is_state_dict(value):
    return isinstance(value, dict) and value and all(
        isinstance(k, str) and isinstance(v, TorchTensor) for k, v in value.items()
    )


def _named(state):
    """`state` with each tensor knowing its key (errors name the weight, not its storage)."""
    for key, tensor in state.items():
        if tensor.name is None:  # set once: a tensor under two keys keeps the first
            tensor.name = key
    return dict(state)


def find_state_dict(obj, source, keys=("state_dict", "model", "module")):
    """The {name: TorchTensor} map of an unpickled checkpoint object (see TorchZipFile.state_dict)."""
    if _is_state_dict(obj):
        return _named(obj)
    if isinstance(obj, dict):
        for key in keys:
            if _is_state_dict(obj.get(key)):
                return _named(obj[key])
        shown = ", ".join(repr(k)[:40] for k in list(obj)[:10])
        raise CheckpointError(
            f"{source}: no state dict of tensors found; the saved dict holds {shown}, none of them a "
            f"{{name: tensor}} map under {', '.join(map(repr, keys))}."
        )
    raise CheckpointError(f"{source}: the saved object is a {type(obj).__name__}, not a state dict of tensors.")


class TorchStateFile:
    """A torch zip state dict behind the interface of `storage.safetensors.SafetensorsFile` (`keys`, `shape`,
    `lazy`, `get`, `in`), so the timm and transformers readers take either file."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._tensors = TorchZipFile(self.path).state_dict()

    def keys(self):
        return list(self._tensors)

    def __contains__(self, key):
        return key in self._tensors

    def shape(self, key):
        return self._tensors[key].shape

    def lazy(self, key):
        tensor = self._tensors[key]
        if not tensor.is_floating_point:
            raise CheckpointError(f"{self.path}: tensor {key!r} has dtype {tensor.torch_dtype}; weights must be floating "
                                  "point.")
        return tensor

    def get(self, key):
        return np.asarray(self.lazy(key))


# === Hub-layout folders (timm, transformers) ===

#: Weight files of a Hub-layout folder, in the order they are preferred.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def weights_in_folder(folder, how_to_save):
    """The weights file of a Hub-layout folder: safetensors when present, else a PyTorch zip
    `pytorch_model.bin` (read with the restricted unpickler of this module)."""
    for name in WEIGHT_FILES:
        candidate = os.path.join(folder, name)
        if os.path.exists(candidate):
            return candidate
    raise CheckpointError(f"{folder}: no model.safetensors or pytorch_model.bin; {how_to_save}.")


def open_weights(path):
    """{key: file} for a .safetensors (or sharded index) or a PyTorch zip file (.pth, .pt, .bin, ...)."""
    from keras_vit.storage.safetensors import open_safetensors

    path = os.fspath(path)
    if path.endswith(endings("pytorch")):
        f = TorchStateFile(path)
        return {key: f for key in f.keys()}
    return open_safetensors(path)
