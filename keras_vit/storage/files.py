"""What a file holds, whatever its name, and the errors of a file that cannot be read: the one
table of file kinds and their name endings that every reader takes from."""

import contextlib
import os
import struct
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


def endings(*kinds):
    """The name endings of files of `kinds` (FILE_KINDS keys), longest first within a kind.

    Example:
        >>> endings("pytorch", "pickle")
        ('.pth.tar', '.pth', '.pt', '.bin', '.ckpt', '.tar', '.pkl')
    """
    return tuple(ending for kind in kinds for ending in FILE_KINDS[kind][1])


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
