"""The members of Keras' files: a `.keras` zip archive's members (checked, and read in place),
and the datasets of a weights `.h5` file (checked before Keras reads them)."""

import io
import math
import mmap
import os
import struct
import zipfile
import zlib

import numpy as np

from keras_vit.errors import CheckpointError
from keras_vit.storage.files import MAX_DEFLATE_RATIO, check_finite, corrupt_file_error
from keras_vit.storage.json_files import MAX_JSON_BYTES, json_object


def check_members(path, names, what):
    """{member name: ZipInfo} of the zip archive `path`, after checking that it holds each of
    `names` (`what` it then is, in words), that no member claims more bytes than deflate can
    expand, and that no JSON member is larger than MAX_JSON_BYTES."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise corrupt_file_error(path, err) from None
    with archive:
        infos = {i.filename: i for i in archive.infolist()}
    for name in names:
        if name not in infos:
            raise CheckpointError(f"{path}: {what} holds {' and '.join(names)}; {name} is missing.")
        info = infos[name]
        if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_DEFLATE_RATIO * max(info.compress_size, 1):
            raise corrupt_file_error(path, ValueError(f"{name} claims more bytes than deflate can expand"))
        if name.endswith(".json") and info.file_size > MAX_JSON_BYTES:
            raise CheckpointError(f"{path}: its {name} of {info.file_size:,} bytes is too large.")
    return infos


def read_member_json(path, name):
    """The JSON object of the member `name` of the zip archive `path` (see `check_members`)."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = archive.read(name)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, zlib.error) as err:
        raise corrupt_file_error(path, err) from None
    return json_object(data, path)


def is_zip_with(path, names):
    """Whether `path` is a zip archive holding every member of `names` (False for any other file)."""
    try:
        with zipfile.ZipFile(path) as archive:
            held = set(archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False
    return set(names) <= held


class _MappedMember(io.RawIOBase):
    """A read-only, seekable file over `size` bytes at `start` of a memory-mapped archive."""

    def __init__(self, mapped, start, size):
        super().__init__()
        self._map, self._view = mapped, memoryview(mapped)
        self._start, self._size, self._pos = start, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer):
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self._size - self._pos))
        begin = self._start + self._pos
        out[:n] = self._view[begin:begin + n]
        self._pos += n
        return n

    def close(self):
        if not self.closed:
            self._view.release()
            self._map.close()
        super().close()


def open_member(path, name):
    """A seekable, read-only file object of the member `name` of the zip archive `path`.

    A stored (uncompressed) member, as Keras writes them, is read in place through a memory map
    of the archive, after its CRC-32 is checked once. zipfile's own reader re-reads a member
    from its start on every backward seek (Python 3.11), and HDF5 seeks back and forth: a
    ViT-B/16 .keras file took 17 s to load that way, and the time grows with the square of the
    file's size. Other members (compressed, encrypted) are read through zipfile."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        return zipfile.ZipFile(path).open(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(_LOCAL_HEADER_SIZE)
        if len(header) != _LOCAL_HEADER_SIZE or header[:4] != b"PK\x03\x04":
            raise corrupt_file_error(path, ValueError(f"bad local header of {name}"))
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        start = info.header_offset + _LOCAL_HEADER_SIZE + name_length + extra_length
        if start + info.file_size > os.fstat(f.fileno()).st_size:
            raise corrupt_file_error(path, EOFError(f"{name} runs past the end of the archive"))
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    member = _MappedMember(mapped, start, info.file_size)
    if zlib.crc32(member._view[start:start + info.file_size]) != info.CRC:
        member.close()
        raise corrupt_file_error(path, ValueError(f"{name} fails the archive's CRC-32 check"))
    return member


#: The fixed part of a zip local file header (signature to extra-field length).
_LOCAL_HEADER_SIZE = 30


def check_h5_datasets(file, limit, source):
    """Check every dataset of a Keras weights file before Keras reads it: declared sizes within
    `limit` bytes (h5py allocates a dataset's declared shape when it is read), float or integer
    values only."""
    import h5py

    total = 0
    try:
        with h5py.File(file, "r") as h5:
            datasets = []
            h5.visititems(lambda name, obj: datasets.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
            for name, ds in datasets:
                if ds.dtype.kind not in "fiub" or ds.dtype.hasobject:
                    raise CheckpointError(f"{source}: weight {name!r} has dtype {ds.dtype}; expected numbers.")
                total += ds.dtype.itemsize * math.prod(ds.shape or ())
                if total > limit:
                    raise CheckpointError(
                        f"{source}: the weights declare more than {limit:,} bytes of tensors ({name!r} and before), "
                        "more than the file holds; the file is corrupt. Delete it and save or download it again."
                    )
    except CheckpointError:
        raise
    except Exception as err:  # h5py reports format damage as OSError, KeyError, ValueError, ...
        raise corrupt_file_error(source, err) from None


def read_h5_dataset(handle, path, source):
    """The dataset `path` of the open HDF5 file `handle` as a float32 array (finite values only)."""
    try:
        array = np.asarray(handle[path][()], dtype=np.float32)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise corrupt_file_error(source, err) from None
    return check_finite(array, path, source)
