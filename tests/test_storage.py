"""The storage floor's shared pieces: the one JSON-object reader (what each caller gets for a
missing or malformed file) and the one table of file kinds and their endings."""

import json
import zipfile

import numpy as np
import pytest

from keras_vit.errors import CheckpointError
from keras_vit.storage.files import FILE_KINDS, endings, file_kind, named_kind
from keras_vit.storage.json_files import json_object, read_json_object

pytestmark = pytest.mark.backend_independent


def _reason(path, reason):
    return ValueError(f"{path} {reason}")


def test_a_json_object_reads_as_the_json_module_reads_it(tmp_path):
    value = {"a": [1, 2.5, None, True], "b": {"c": "é"}, "d": -1e300}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(value), encoding="utf-8")
    assert read_json_object(path) == json.loads(path.read_text(encoding="utf-8")) == value
    assert json_object(path.read_bytes(), "member") == value


def test_a_missing_file_is_the_callers_default_or_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_json_object(tmp_path / "none.json")
    assert read_json_object(tmp_path / "none.json", missing=None) is None
    assert read_json_object(tmp_path / "none.json", missing={}, malformed=_reason) == {}


@pytest.mark.parametrize("content,reason", [
    (b"{\"a\": 1", "is not valid JSON"),
    (b"\xff\xfe{}", "is not valid JSON"),
    (b"[1, 2]", "holds an array, not a JSON object"),
    (b"\"text\"", "holds a string, not a JSON object"),
    (b"3", "holds a number, not a JSON object"),
    (b"null", "holds null, not a JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, "is not valid JSON"),  # nested too deeply for Python's parser
])
def test_a_malformed_file_is_one_decision_each_caller_words(tmp_path, content, reason):
    path = tmp_path / "m.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match=r"m\.json.*(truncated or corrupt)"):
        read_json_object(path)
    with pytest.raises(ValueError, match=rf"m\.json {reason}"):
        read_json_object(path, malformed=_reason)
    assert read_json_object(path, malformed={}) == {}


def test_a_file_over_the_bound_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"pad": "x" * 2000}))
    with pytest.raises(CheckpointError, match="too large"):
        read_json_object(path, max_bytes=1000)
    with pytest.raises(ValueError, match=r"is 2,\d{3} bytes, more than"):
        read_json_object(path, max_bytes=1000, malformed=_reason)


def test_a_folder_in_place_of_the_file(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(OSError):
        read_json_object(tmp_path / "config.json")
    assert read_json_object(tmp_path / "config.json", malformed={}) == {}


def test_one_table_of_endings_that_names_and_contents_agree_on(tmp_path):
    # Every ending names its own kind (a longer ending is matched before a shorter one).
    for kind, (_, names) in FILE_KINDS.items():
        for ending in names:
            assert named_kind(f"weights{ending}") == kind, ending
    assert named_kind("model.pth.tar") == "pytorch" and named_kind("x.PTH") == "pytorch"
    assert set(endings("pytorch")) >= {".pth", ".pt", ".bin", ".pth.tar", ".ckpt"}
    assert endings("pytorch", "pickle") == endings("pytorch") + endings("pickle")
    # Content, not name: a NumPy archive and a JSON document under a PyTorch name.
    npz = tmp_path / "a.bin"
    with open(npz, "wb") as f:
        np.savez(f, x=np.zeros(2))
    assert zipfile.is_zipfile(npz) and file_kind(npz) == "npz"
    doc = tmp_path / "b.pt"
    doc.write_text("{}")
    assert file_kind(doc) == "json"
