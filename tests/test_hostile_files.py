"""Hostile files for every checkpoint reader: property-based (hypothesis) damage to valid files.

Each case writes a damaged copy of a small valid checkpoint into a fresh folder and reads it with
`keras_vit.read_checkpoint` (format detection, the reader, every tensor read); where it reads,
`build_model` assigns it. Every case must end in one of:
- a `keras_vit.CheckpointError` with a message naming the file or tensor (or an OSError for I/O),
- a successful read (a flipped byte inside a tensor's raw data is a valid file with other values:
  only a hash recorded at download time can tell, which the cache does, not the reader).
Nothing else (no TypeError, KeyError, MemoryError, RecursionError), no case over 5 s (hypothesis
deadline), nothing allocated beyond the file's size (declared sizes are refused before
allocating; tracemalloc checks a 100 GB claim), nothing written to the caches or next to the file.

Cases per reader in the default profile (derandomized, so every run tries the same cases;
KERAS_VIT_FUZZ=heavy tries 10x as many, with fresh random cases):

| reader | truncation | flipped bytes | structured damage |
|---|---|---|---|
| original .npz | 60 | 60 | 40 (dtypes, shapes, values, dropped keys) + 4 npy headers claiming 100 GB / objects |
| timm safetensors folder | 60 | 60 | 60 header entries (dtypes, shapes, offsets, header lengths) + 4 claiming 100 GB + 4 non-finite / integer + 40 config.json fields |
| transformers folder | 30 | 30 | 40 config.json fields |
| Keras preset folder | 10 | 10 | 20 config.json fields + 4 configs claiming a huge model + 2 missing files |
| .weights.h5 + config.json | 10 | 10 | (the preset's config cases) |
| .keras | 10 | 10 | 1 config claiming a huge model |
| config.json of timm / transformers / preset | | | 6 documents each (nested 10^5 deep, 17 MB, not UTF-8, not an object, 5000-digit integer) |
"""

import collections
import io
import json
import math
import os
import shutil
import struct
import tempfile
import tracemalloc
import zipfile

import numpy as np
import pytest
from conftest import TINY, randomize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_vit
from keras_vit import CheckpointError, build_model, read_checkpoint, write_npz
from keras_vit.checkpoints.keras_format import save_preset
from keras_vit.models.weight_tree import get_weight_tree

pytestmark = pytest.mark.backend_independent

HEAVY = os.environ.get("KERAS_VIT_FUZZ") == "heavy"


def cases(n):
    return settings(
        max_examples=n * (10 if HEAVY else 1),
        deadline=5000,
        derandomize=not HEAVY,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.data_too_large],
    )


#: reader -> Counter of how cases ended; written to $KERAS_VIT_FUZZ_REPORT (JSON) when set.
OUTCOMES = collections.defaultdict(collections.Counter)


# === Valid small checkpoints of every format ===

SMALL = dict(TINY, num_layers=1)


def _timm_state(tree, hidden):
    """The canonical tree in timm's layout (the inverse of the reader's mapping, written out)."""
    t = {k: np.asarray(v, np.float32) for k, v in tree.items()}
    att = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/"
    mlp = "Transformer/encoderblock_0/MlpBlock_3/"
    qkv_w = np.concatenate([t[f"{att}{n}/kernel"].reshape(hidden, hidden).T for n in ("query", "key", "value")])
    qkv_b = np.concatenate([t[f"{att}{n}/bias"].reshape(hidden) for n in ("query", "key", "value")])
    return {
        "patch_embed.proj.weight": t["embedding/kernel"].transpose(3, 2, 0, 1),
        "patch_embed.proj.bias": t["embedding/bias"],
        "cls_token": t["cls"],
        "pos_embed": t["Transformer/posembed_input/pos_embedding"],
        "blocks.0.norm1.weight": t["Transformer/encoderblock_0/LayerNorm_0/scale"],
        "blocks.0.norm1.bias": t["Transformer/encoderblock_0/LayerNorm_0/bias"],
        "blocks.0.attn.qkv.weight": qkv_w,
        "blocks.0.attn.qkv.bias": qkv_b,
        "blocks.0.attn.proj.weight": t[f"{att}out/kernel"].reshape(hidden, hidden).T,
        "blocks.0.attn.proj.bias": t[f"{att}out/bias"],
        "blocks.0.norm2.weight": t["Transformer/encoderblock_0/LayerNorm_2/scale"],
        "blocks.0.norm2.bias": t["Transformer/encoderblock_0/LayerNorm_2/bias"],
        "blocks.0.mlp.fc1.weight": t[f"{mlp}Dense_0/kernel"].T,
        "blocks.0.mlp.fc1.bias": t[f"{mlp}Dense_0/bias"],
        "blocks.0.mlp.fc2.weight": t[f"{mlp}Dense_1/kernel"].T,
        "blocks.0.mlp.fc2.bias": t[f"{mlp}Dense_1/bias"],
        "norm.weight": t["Transformer/encoder_norm/scale"],
        "norm.bias": t["Transformer/encoder_norm/bias"],
        "head.weight": t["head/kernel"].T,
        "head.bias": t["head/bias"],
    }


def _transformers_state(timm_state, hidden):
    s = timm_state
    q, k, v = np.split(s["blocks.0.attn.qkv.weight"], 3)
    qb, kb, vb = np.split(s["blocks.0.attn.qkv.bias"], 3)
    p, e = "vit.encoder.layer.0.", "vit.embeddings."
    return {
        e + "patch_embeddings.projection.weight": s["patch_embed.proj.weight"],
        e + "patch_embeddings.projection.bias": s["patch_embed.proj.bias"],
        e + "cls_token": s["cls_token"],
        e + "position_embeddings": s["pos_embed"],
        p + "layernorm_before.weight": s["blocks.0.norm1.weight"],
        p + "layernorm_before.bias": s["blocks.0.norm1.bias"],
        p + "attention.attention.query.weight": q, p + "attention.attention.query.bias": qb,
        p + "attention.attention.key.weight": k, p + "attention.attention.key.bias": kb,
        p + "attention.attention.value.weight": v, p + "attention.attention.value.bias": vb,
        p + "attention.output.dense.weight": s["blocks.0.attn.proj.weight"],
        p + "attention.output.dense.bias": s["blocks.0.attn.proj.bias"],
        p + "layernorm_after.weight": s["blocks.0.norm2.weight"],
        p + "layernorm_after.bias": s["blocks.0.norm2.bias"],
        p + "intermediate.dense.weight": s["blocks.0.mlp.fc1.weight"],
        p + "intermediate.dense.bias": s["blocks.0.mlp.fc1.bias"],
        p + "output.dense.weight": s["blocks.0.mlp.fc2.weight"],
        p + "output.dense.bias": s["blocks.0.mlp.fc2.bias"],
        "vit.layernorm.weight": s["norm.weight"],
        "vit.layernorm.bias": s["norm.bias"],
        "classifier.weight": s["head.weight"],
        "classifier.bias": s["head.bias"],
    }


_ST_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.float64): "F64",
             np.dtype(np.int64): "I64", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8", np.dtype(bool): "BOOL"}


def safetensors_parts(tensors):
    """(header dict, data bytes) of a safetensors file (the format written out by hand)."""
    header, chunks, offset = {}, [], 0
    for key, value in tensors.items():
        raw = np.ascontiguousarray(value).tobytes()
        header[key] = {"dtype": _ST_NAMES[value.dtype], "shape": list(value.shape),
                       "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    return header, b"".join(chunks)


def safetensors_bytes(header, data, length=None):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


@pytest.fixture(scope="module")
def valid():
    """{format: {file name: bytes}} of one small random ViT in every format, plus its tree."""
    model = randomize(keras_vit.VisionTransformer(**SMALL))
    tree = {k: np.asarray(v) for k, v in get_weight_tree(model).items()}
    hidden = SMALL["hidden_size"]
    root = tempfile.mkdtemp()
    try:
        write_npz(tree, os.path.join(root, "m.npz"))
        save_preset(model, os.path.join(root, "preset"), readme=False)
        model.save(os.path.join(root, "m.keras"))
        files = {"npz": {"m.npz": open(os.path.join(root, "m.npz"), "rb").read()}}
        files["keras_preset"] = {
            name: open(os.path.join(root, "preset", name), "rb").read() for name in os.listdir(os.path.join(root, "preset"))
        }
        files["weights_h5"] = {"w.weights.h5": files["keras_preset"]["model.weights.h5"],
                               "config.json": files["keras_preset"]["config.json"]}
        files["keras"] = {"m.keras": open(os.path.join(root, "m.keras"), "rb").read()}
    finally:
        shutil.rmtree(root)
    timm_state = _timm_state(tree, hidden)
    files["timm"] = {
        "model.safetensors": safetensors_bytes(*safetensors_parts(timm_state)),
        "config.json": json.dumps({"architecture": "vit_tiny_patch16_224", "num_classes": SMALL["classes"],
                                   "model_args": {"num_heads": SMALL["num_heads"], "img_size": 32}}).encode(),
    }
    files["transformers"] = {
        "model.safetensors": safetensors_bytes(*safetensors_parts(_transformers_state(timm_state, hidden))),
        "config.json": json.dumps({"model_type": "vit", "hidden_size": hidden, "num_attention_heads": SMALL["num_heads"],
                                   "image_size": 32, "patch_size": 8, "hidden_act": "gelu",
                                   "layer_norm_eps": 1e-12}).encode(),
    }
    return {"files": files, "tree": tree, "timm_state": timm_state}


# Which file of each format is damaged, and what is handed to the reader.
TARGET = {"npz": "m.npz", "timm": "model.safetensors", "transformers": "model.safetensors",
          "keras_preset": "model.weights.h5", "weights_h5": "w.weights.h5", "keras": "m.keras"}
ENTRY = {"npz": "m.npz", "timm": ".", "transformers": ".", "keras_preset": ".", "weights_h5": "w.weights.h5",
         "keras": "m.keras"}


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """A folder for the cases, with the caches pointed at empty folders that must stay empty."""
    root = tmp_path_factory.mktemp("hostile")
    caches = {"KERAS_VIT_CACHE": root / "keras_vit_cache", "HF_HOME": root / "hf_home",
              "HF_HUB_CACHE": root / "hf_home" / "hub", "XDG_CACHE_HOME": root / "xdg"}
    with pytest.MonkeyPatch.context() as mp:
        for name, path in caches.items():
            path.mkdir(parents=True, exist_ok=True)
            mp.setenv(name, str(path))
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield root
        for name, path in caches.items():
            left = [str(p) for p in path.rglob("*") if p.is_file()]
            assert not left, f"a reader wrote to the cache {name}: {left}"
    report = os.environ.get("KERAS_VIT_FUZZ_REPORT")
    if report:
        with open(report, "w") as f:
            json.dump({k: dict(v) for k, v in OUTCOMES.items()}, f, indent=1, sort_keys=True)


def attempt(label, sandbox, files, entry, build=False):
    """Write `files` into a fresh folder, read (and with `build`, assign) the checkpoint at
    `entry`; return how it ended, failing on anything but CheckpointError / OSError / success."""
    folder = tempfile.mkdtemp(dir=sandbox)
    try:
        for name, data in files.items():
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
        before = sorted(os.listdir(folder))
        try:
            tree, config = read_checkpoint(os.path.join(folder, entry))
            if build:
                build_model(tree, config)
            outcome = "read"
        except CheckpointError as err:
            message = str(err)
            assert len(message) > 20 and ("/" in message or "'" in message), message  # names the file or tensor
            outcome = "CheckpointError"
        except OSError as err:
            assert str(err)
            outcome = f"OSError ({type(err).__name__})"
        assert sorted(os.listdir(folder)) == before, "a reader wrote next to the checkpoint"
    finally:
        shutil.rmtree(folder)
    OUTCOMES[label][outcome] += 1
    return outcome


def _damaged(valid, fmt, data):
    return {**valid["files"][fmt], TARGET[fmt]: data}


# === Truncation and flipped bytes, every format ===

CHEAP = ["npz", "timm", "transformers"]
BUILDS = ["keras_preset", "weights_h5", "keras"]  # these readers build a model to read the weights


def _cut(fmt, n, sandbox, valid):
    data = valid["files"][fmt][TARGET[fmt]]

    @cases(n)
    @given(st.integers(0, len(data) - 1))
    def run(length):
        attempt(f"{fmt} truncation", sandbox, _damaged(valid, fmt, data[:length]), ENTRY[fmt])

    run()


def _flip(fmt, n, sandbox, valid):
    data = valid["files"][fmt][TARGET[fmt]]

    @cases(n)
    @given(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(1, 255)), min_size=1, max_size=8))
    def run(flips):
        damaged = bytearray(data)
        for position, mask in flips:
            damaged[position] ^= mask
        attempt(f"{fmt} flipped bytes", sandbox, _damaged(valid, fmt, bytes(damaged)), ENTRY[fmt], build=fmt in CHEAP)

    run()


@pytest.mark.parametrize("fmt,n", [("npz", 60), ("timm", 60), ("transformers", 30)])
def test_truncated_files(fmt, n, sandbox, valid):
    _cut(fmt, n, sandbox, valid)
    assert OUTCOMES[f"{fmt} truncation"]["read"] == 0  # a cut file never reads


@pytest.mark.parametrize("fmt,n", [("npz", 60), ("timm", 60), ("transformers", 30)])
def test_flipped_bytes(fmt, n, sandbox, valid):
    _flip(fmt, n, sandbox, valid)


@pytest.mark.parametrize("fmt", BUILDS)
def test_truncated_and_flipped_keras_files(fmt, sandbox, valid):
    _cut(fmt, 10, sandbox, valid)
    _flip(fmt, 10, sandbox, valid)
    assert OUTCOMES[f"{fmt} truncation"]["read"] == 0


# === Structured damage: safetensors headers ===

_HUGE = [2**31, 2**40, 2**62, 2**64 + 5, 10**30]
_BAD_INTS = st.sampled_from([-1, -(2**40), 0, 1, 3] + _HUGE) | st.integers(-5, 10**6)
_ODD = st.sampled_from([None, "12", 1.5, float("nan"), True, [], {}, [1, 2], "F32"])


@pytest.mark.parametrize("fmt", ["timm"])
def test_safetensors_header_entries(fmt, sandbox, valid):
    header, data = safetensors_parts(valid["timm_state"])
    keys = sorted(header)

    mutation = st.one_of(
        st.tuples(st.just("dtype"), st.sampled_from(["F64", "F16", "BF16", "I64", "I8", "BOOL", "U8", "F8_E4M3", "X",
                                                     "f32", ""]) | _ODD),
        st.tuples(st.just("shape"), st.lists(_BAD_INTS, max_size=5) | _ODD),
        st.tuples(st.just("data_offsets"), st.lists(_BAD_INTS, min_size=2, max_size=2) | st.lists(_BAD_INTS, max_size=4)
                  | _ODD),
        st.tuples(st.just("entry"), _ODD | st.just("x")),
        st.tuples(st.just("drop"), st.none()),
    )

    @cases(60)
    @given(st.sampled_from(keys), mutation, st.sampled_from([None, 0, 7, 10**6, 2**63]))
    def run(key, change, length):
        h = json.loads(json.dumps(header))
        what, value = change
        if what == "entry":
            h[key] = value
        elif what == "drop":
            del h[key]
        else:
            h[key][what] = value
        text_len = len(json.dumps(h).encode())
        blob = safetensors_bytes(h, data, None if length is None else (text_len + length if length < 10**6 else length))
        ending = attempt("safetensors header", sandbox, {**valid["files"][fmt], "model.safetensors": blob}, ".",
                         build=True)
        if length not in (None, 0):
            assert ending != "read"

    run()


def test_safetensors_claiming_100_gb_fails_fast_without_allocating(sandbox, valid):
    header, data = safetensors_parts(valid["timm_state"])
    key = "blocks.0.mlp.fc1.weight"
    for shape, offsets in [
        ([50_000, 500_000], [0, 100_000_000_000]),  # 100 GB declared, consistent with the shape
        ([2**32, 2**32, 2**32], [0, 4 * 2**96]),  # beyond int64: no overflow to a small number
        ([-50_000, -500_000], [0, 100_000_000_000]),  # negative dimensions
        ([48, 24], [0, 4 * 48 * 24 + 2**40]),  # offsets past the end
    ]:
        h = json.loads(json.dumps(header))
        h[key].update(shape=shape, data_offsets=offsets)
        tracemalloc.start()
        try:
            ending = attempt("safetensors 100 GB claims", sandbox,
                             {**valid["files"]["timm"], "model.safetensors": safetensors_bytes(h, data)}, ".")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert ending == "CheckpointError"
        assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB allocated for a {len(data) / 1024:.0f} KiB file"


def test_safetensors_non_finite_and_integer_weights(sandbox, valid):
    state = dict(valid["timm_state"])
    for label, change in [
        ("nan", {"norm.weight": np.full(24, np.nan, np.float32)}),
        ("inf", {"blocks.0.mlp.fc1.weight": np.where(np.arange(48 * 24).reshape(48, 24) == 7, np.inf, 0).astype(np.float32)}),
        ("float64 overflow", {"head.bias": np.full(7, 1e300)}),
        ("int64", {"head.bias": np.arange(7)}),
    ]:
        blob = safetensors_bytes(*safetensors_parts({**state, **change}))
        with pytest.raises(CheckpointError, match=f"'{next(iter(change))}'"):
            read_checkpoint(_write(sandbox, {**valid["files"]["timm"], "model.safetensors": blob}))
        OUTCOMES["safetensors non-finite / int"]["CheckpointError"] += 1


def _write(sandbox, files):
    folder = tempfile.mkdtemp(dir=sandbox)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)
    return folder


# === Structured damage: original .npz ===


def _npz_bytes(arrays, raw_members=None):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for key, value in arrays.items():
            member = io.BytesIO()
            np.save(member, value, allow_pickle=True)
            z.writestr(key + ".npy", member.getvalue())
        for name, data in (raw_members or {}).items():
            z.writestr(name, data)
    return buf.getvalue()


def test_npz_dtypes_shapes_and_values(sandbox, valid):
    tree = valid["tree"]
    keys = sorted(tree)
    dtypes = st.sampled_from([np.float16, np.float64, np.int32, np.int8, np.bool_, np.complex64, np.uint8, object])

    @cases(40)
    @given(st.sampled_from(keys), st.one_of(
        st.tuples(st.just("dtype"), dtypes),
        st.tuples(st.just("shape"), st.lists(st.integers(0, 50), max_size=4)),
        st.tuples(st.just("value"), st.sampled_from([np.nan, np.inf, -np.inf, 1e300])),
        st.tuples(st.just("drop"), st.none()),
    ))
    def run(key, change):
        arrays = dict(tree)
        what, value = change
        if what == "dtype":
            arrays[key] = np.asarray(tree[key]).astype(value)
        elif what == "shape":
            arrays[key] = np.zeros(value, np.float32)
        elif what == "value":
            arrays[key] = np.asarray(tree[key], np.float64).copy()
            arrays[key].flat[0] = value
        else:
            del arrays[key]
        ending = attempt("npz dtypes/shapes/values", sandbox, {"m.npz": _npz_bytes(arrays)}, "m.npz", build=True)
        if what == "value" or (what == "dtype" and value in (np.int32, np.int8, np.bool_, np.complex64, np.uint8,
                                                               object)):
            assert ending == "CheckpointError"

    run()


def test_npz_headers_claiming_100_gb_fail_fast_without_allocating(sandbox, valid):
    tree = dict(valid["tree"])
    kernel = "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"
    del tree[kernel]
    for descr, shape in [("<f4", (100_000, 250_000)), ("<f4", (2**40, 2**40, 2**40)), ("|O", (3,)), ("<f4", (5,))]:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
        member = header.getvalue() + b"\0" * 64  # 64 data bytes, whatever the header says
        blob = _npz_bytes(tree, {kernel + ".npy": member})
        tracemalloc.start()
        try:
            ending = attempt("npz 100 GB claims", sandbox, {"m.npz": blob}, "m.npz")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert ending == "CheckpointError"
        assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB allocated for a {len(blob) / 1024:.0f} KiB file"


# === Structured damage: config.json of every reader ===

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
_CONFIG_FIELDS = {
    "timm": ["architecture", "model_args", "num_classes", "global_pool"],
    "transformers": ["model_type", "num_attention_heads", "image_size", "hidden_act", "layer_norm_eps", "pooler_act"],
    "keras_preset": ["image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim", "classes",
                     "resnet", "classifier", "layer_norm_epsilon", "representation_size", "num_channels",
                     "include_top", "position_embedding_resize", "quantization"],
}


@pytest.mark.parametrize("fmt,n", [("timm", 40), ("transformers", 40), ("keras_preset", 20)])
def test_config_fields_of_any_json_value(fmt, n, sandbox, valid):
    config = json.loads(valid["files"][fmt]["config.json"])
    fields = _CONFIG_FIELDS[fmt]
    numbers = st.sampled_from([0, -1, 10**6, 10**12, 2**63, 1e300, 0.5, True, "12", None, [], [10**9, 10**9]])

    @cases(n)
    @given(st.sampled_from(fields), _JSON | numbers,
           st.sampled_from(["num_heads", "img_size", "patch_size", "embed_dim", "depth"]) if fmt == "timm"
           else st.none())
    def run(field, value, arg):
        c = json.loads(json.dumps(config))
        if fmt == "timm" and field == "model_args" and arg is not None and not isinstance(value, (dict, list)):
            c["model_args"][arg] = value
        else:
            c[field] = value
        files = {**valid["files"][fmt], "config.json": json.dumps(c).encode()}
        attempt(f"{fmt} config.json fields", sandbox, files, ".", build=fmt != "keras_preset")

    run()


def test_keras_config_claiming_a_huge_model_is_refused_before_building(sandbox, valid):
    config = json.loads(valid["files"]["keras_preset"]["config.json"])
    for change in [dict(hidden_size=2**20, num_heads=1), dict(num_layers=10**6), dict(image_size=[10**6, 10**6]),
                   dict(classes=10**9)]:
        c = dict(config, **change)
        tracemalloc.start()
        try:
            with pytest.raises(CheckpointError, match="parameters but the weights file holds only"):
                read_checkpoint(_write(sandbox, {**valid["files"]["keras_preset"], "config.json": json.dumps(c).encode()}))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 16 * 2**20
        OUTCOMES["keras config claiming a huge model"]["CheckpointError"] += 1
    # The same config inside a .keras archive.
    with zipfile.ZipFile(io.BytesIO(valid["files"]["keras"]["m.keras"])) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    inner = json.loads(members["config.json"])
    inner["config"]["hidden_size"] = 2**20
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, json.dumps(inner).encode() if name == "config.json" else data)
    with pytest.raises(CheckpointError, match="parameters but the weights file holds only"):
        read_checkpoint(os.path.join(_write(sandbox, {"m.keras": buf.getvalue()}), "m.keras"))
    OUTCOMES["keras config claiming a huge model"]["CheckpointError"] += 1


@pytest.mark.parametrize("fmt", ["timm", "transformers", "keras_preset"])
def test_hostile_json_documents(fmt, sandbox, valid):
    for label, text in [
        ("nested 10^5 deep", b"[" * 100_000 + b"]" * 100_000),
        ("nested objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        ("17 MB", b'{"architecture": "' + b"x" * (17 * 2**20) + b'"}'),
        ("not UTF-8", b'{"architecture": "\xff\xfe"}'),
        ("not an object", b"[1, 2, 3]"),
        ("huge integer", b'{"num_attention_heads": 1' + b"0" * 5000 + b', "model_type": "vit"}'),
    ]:
        ending = attempt("JSON documents", sandbox, {**valid["files"][fmt], "config.json": text}, ".")
        assert ending == "CheckpointError", (fmt, label)


def test_preset_folder_missing_files(sandbox, valid):
    files = valid["files"]["keras_preset"]
    for missing in ("model.weights.h5", "config.json"):
        left = {k: v for k, v in files.items() if k != missing}
        ending = attempt("preset missing files", sandbox, left, ".")
        assert ending == "CheckpointError"


def test_valid_files_still_read_exactly(sandbox, valid):
    """The hardening refuses nothing valid: every format reads back the original tree."""
    for fmt in ("npz", "timm", "transformers", "keras_preset", "weights_h5", "keras"):
        folder = _write(sandbox, valid["files"][fmt])
        tree, config = read_checkpoint(os.path.join(folder, ENTRY[fmt]))
        assert config["hidden_size"] == SMALL["hidden_size"] and config["num_layers"] == 1
        for key, value in valid["tree"].items():
            np.testing.assert_allclose(np.asarray(tree[key]), value, rtol=0, atol=1e-7, err_msg=f"{fmt} {key}")
        model = build_model(tree, config)
        assert math.isfinite(float(np.abs(model.predict(np.zeros((1, 32, 32, 3), np.float32), verbose=0)).sum()))


def test_keras_archive_member_reads_like_zipfile_and_checks_its_crc(sandbox, valid):
    """A .keras file's weights are read in place through a memory map (keras_format.open_member):
    every read at every position gives zipfile's bytes, and a flipped byte inside the stored
    weights (which HDF5 itself never checks) is refused by the archive's CRC-32."""
    from keras_vit.checkpoints.keras_format import open_member

    data = valid["files"]["keras"]["m.keras"]
    path = os.path.join(_write(sandbox, {"m.keras": data}), "m.keras")
    with zipfile.ZipFile(path) as archive:
        expected = archive.read("model.weights.h5")
        start = data.index(expected[:64])  # where the stored member's bytes begin in the archive
    rng = np.random.default_rng(0)
    with open_member(path, "model.weights.h5") as member:
        assert member.seek(0, os.SEEK_END) == len(expected)
        for _ in range(200):  # backward and forward seeks, reads past the end
            position, size = int(rng.integers(0, len(expected) + 10)), int(rng.integers(0, 5000))
            member.seek(position)
            assert member.read(size) == expected[position:position + size]
            assert member.tell() == min(position + size, len(expected)) or position > len(expected)
        member.seek(10)
        member.seek(-4, os.SEEK_CUR)
        assert member.read(3) == expected[6:9]
    damaged = bytearray(data)
    damaged[start + len(expected) // 2] ^= 0x10
    bad = os.path.join(_write(sandbox, {"m.keras": bytes(damaged)}), "m.keras")
    with pytest.raises(CheckpointError, match="CRC-32"):
        open_member(bad, "model.weights.h5")
    with pytest.raises(CheckpointError, match="CRC-32"):
        read_checkpoint(bad)
