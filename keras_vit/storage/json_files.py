"""The one reader of a JSON object (a dict) from a file or from bytes (a zip member): checkpoint
configs and shard indexes, run folders' records, the Hub cache's markers, VTAB task results.

Each caller says what a missing file and a malformed one mean to it (a default, its own error);
what counts as malformed is decided here, once: not UTF-8 JSON, nested too deeply, larger than
the bound, or a JSON value that is not an object.

    >>> read_json_object("no/such/config.json", missing={})
    {}
"""

import json
import os

from keras_vit.errors import CheckpointError
from keras_vit.storage.files import corrupt_file_error

#: The largest JSON file read (configs and shard indexes are kilobytes; this refuses a huge
#: file before it is parsed).
MAX_JSON_BYTES = 16 * 2**20

_RAISE = object()
_KINDS = {list: "an array", str: "a string", type(None): "null", bool: "a boolean"}


def read_json_object(path, *, missing=_RAISE, malformed=_RAISE, max_bytes=MAX_JSON_BYTES):
    """The JSON object (a dict) in the file `path`.

    Args:
        path: the file.
        missing: returned when there is no file at `path` (default: FileNotFoundError raised).
        malformed: what a file that is not a JSON object gives. By default a CheckpointError
            naming the file; a callable `(path, reason) -> exception` raises the exception it
            returns (reason: "is not valid JSON (...)", "holds an array, not a JSON object",
            "is N bytes, ..."); any other value is returned instead, also for a file that cannot
            be opened (for format detection and best-effort checks, which must not raise on
            another kind of file).
        max_bytes: the largest file parsed.
    """
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        if size > max_bytes:
            return _malformed(path, malformed, f"is {size:,} bytes, more than a JSON file of this package holds "
                                               f"(at most {max_bytes:,})", size=size, max_bytes=max_bytes)
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if missing is _RAISE:
            raise
        return missing
    except OSError:
        if malformed is _RAISE or callable(malformed):
            raise
        return malformed
    return json_object(data, path, malformed=malformed)


def json_object(data, source, *, malformed=_RAISE):
    """The JSON object (a dict) the bytes `data` hold (the content of `source`, a file or a zip
    member, named in errors); `malformed` as in `read_json_object`."""
    try:
        value = json.loads(data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        return _malformed(source, malformed, f"is not valid JSON ({type(err).__name__}: {str(err)[:200]})", error=err)
    if not isinstance(value, dict):
        kind = _KINDS.get(type(value), "a number")
        return _malformed(source, malformed, f"holds {kind}, not a JSON object",
                          error=ValueError(f"expected a JSON object, got a {type(value).__name__}"))
    return value


def _malformed(source, malformed, reason, error=None, size=None, max_bytes=None):
    if malformed is _RAISE:
        if error is not None:
            raise corrupt_file_error(source, error) from None
        raise CheckpointError(
            f"{os.fspath(source)}: {size:,} bytes is too large for a checkpoint's JSON file (at most "
            f"{max_bytes:,}); the file is corrupt or not a config."
        )
    if callable(malformed):
        raise malformed(source, reason) from None
    return malformed
