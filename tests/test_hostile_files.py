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

The truncation and flipped-byte matrix is built from `keras_vit.checkpoints.registry`: every
registered format needs a generator in GENERATORS below (a small valid file of that format), and a
format without one fails `test_every_registered_format_has_a_generator` saying what to add. The
truncations and flips come from a NumPy generator seeded per case label (hypothesis' derandomized
generation changes with what ran before in the process) and the structured damage from
derandomized hypothesis strategies, so each run tries the same cases; their outcome counts are asserted
(EXPECTED) and docs/reliability.md's table is rendered from them (`python tests/test_hostile_files.py`
prints it; `test_reliability_doc_shows_the_asserted_counts` checks the doc). KERAS_VIT_FUZZ=heavy
tries 10x as many fresh random cases and asserts only how each case ends.
"""

import collections
import dataclasses
import io
import json
import math
import os
import re
import shutil
import struct
import tempfile
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest
from conftest import TINY, randomize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import keras_vit
from torch_zip_files import axial_deeplab_sample, edge_torch_files, hostile_torch_files

from keras_vit import CheckpointError, build_model, read_checkpoint, write_npz
from keras_vit.checkpoints.big_vision import write_big_vision_npz
from keras_vit.checkpoints.bit import write_bit_npz
from keras_vit.checkpoints.keras_format import save_preset
from keras_vit.models.weight_tree import get_weight_tree
from keras_vit.storage.torch_zip import TorchZipFile

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

#: How the default profile's cases end, per reader and damage (asserted by each test; the table of
#: docs/reliability.md is rendered from it). "read": the damaged file still loaded, with changed
#: values, where the format has no checksum over the bytes changed.
EXPECTED = {
    "npz truncation": {"CheckpointError": 60},
    "npz flipped bytes": {"CheckpointError": 60},
    "npz headers claiming 100 GB / objects": {"CheckpointError": 4},
    "npz dtypes/shapes/values": {"CheckpointError": 35, "read": 5},
    "big_vision truncation": {"CheckpointError": 20},
    "big_vision flipped bytes": {"CheckpointError": 20},
    "big_vision headers claiming 100 GB / objects": {"CheckpointError": 4},
    "big_vision scanned truncation": {"CheckpointError": 20},
    "big_vision scanned flipped bytes": {"CheckpointError": 20},
    "big_vision scanned headers claiming 100 GB / objects": {"CheckpointError": 4},
    "bit_npz truncation": {"CheckpointError": 20},
    "bit_npz flipped bytes": {"CheckpointError": 20},
    "bit_npz headers claiming 100 GB / objects": {"CheckpointError": 4},
    "timm truncation": {"CheckpointError": 60},
    "timm flipped bytes": {"CheckpointError": 9, "read": 51},
    "safetensors header": {"CheckpointError": 59, "read": 1},
    "safetensors 100 GB claims": {"CheckpointError": 4},
    "safetensors non-finite / int": {"CheckpointError": 4},
    "timm config.json fields": {"CheckpointError": 19, "read": 21},
    "timm JSON documents": {"CheckpointError": 6},
    "timm_bit truncation": {"CheckpointError": 20},
    "timm_bit flipped bytes": {"read": 20},
    "timm_bit config.json fields": {"CheckpointError": 5, "read": 15},
    "timm_bit JSON documents": {"CheckpointError": 6},
    "transformers truncation": {"CheckpointError": 30},
    "transformers flipped bytes": {"CheckpointError": 7, "read": 23},
    "transformers config.json fields": {"CheckpointError": 35, "read": 5},
    "transformers JSON documents": {"CheckpointError": 6},
    "keras_preset truncation": {"CheckpointError": 10},
    "keras_preset flipped bytes": {"CheckpointError": 1, "read": 9},
    "keras_preset config.json fields": {"CheckpointError": 17, "read": 3},
    "keras_preset JSON documents": {"CheckpointError": 6},
    "keras config claiming a huge model": {"CheckpointError": 5},
    "preset missing files": {"CheckpointError": 2},
    "keras_weights truncation": {"CheckpointError": 10},
    "keras_weights flipped bytes": {"CheckpointError": 2, "read": 8},
    "keras truncation": {"CheckpointError": 10},
    "keras flipped bytes": {"CheckpointError": 10},
    "axial_deeplab truncation": {"CheckpointError": 20},
    "axial_deeplab flipped bytes": {"CheckpointError": 20},
    "timm_efficientnet truncation": {"CheckpointError": 20},
    "timm_efficientnet flipped bytes": {"CheckpointError": 1, "read": 19},
    "torch zip pickles / storages": {"CheckpointError": 28},
    "torch zip edges (deflated, big-endian, last element)": {"read": 3},
    "files under another format's name": {"CheckpointError": 51},
}


# === Valid small checkpoints of every format ===

SMALL = dict(TINY, num_layers=1)
BIT_SMALL = dict(image_size=32, block_units=(1, 1), width_factor=0.5, classes=3)


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
    bit_model = randomize(keras_vit.models.BiTResNet(**BIT_SMALL), seed=1)
    bit_tree = {k: np.asarray(v) for k, v in get_weight_tree(bit_model).items()}
    files["bit_npz"] = {"b.npz": _saved(lambda path: write_bit_npz(bit_tree, path))}
    files["timm_bit"] = {
        "model.safetensors": safetensors_bytes(*safetensors_parts(_timm_bit_state(bit_tree))),
        "config.json": json.dumps({"architecture": "resnetv2_50x1_bit", "num_classes": BIT_SMALL["classes"],
                                   "pretrained_cfg": {"input_size": [3, 32, 32]}}).encode(),
    }
    files["big_vision"] = {"bv.npz": _saved(lambda path: write_big_vision_npz(model, path, prefix="params/"))}
    files["big_vision scanned"] = {"bv.npz": _saved(lambda path: write_big_vision_npz(model, path, scan=True))}
    axial_bytes, axial_tree = axial_deeplab_sample()
    files["axial_deeplab"] = {"model.pth.tar": axial_bytes}
    efficientnet_bytes, efficientnet_tree = timm_efficientnet_sample()
    files["timm_efficientnet"] = {"model.safetensors": efficientnet_bytes}
    return {"files": files, "tree": tree, "timm_state": timm_state, "bit_tree": bit_tree, "axial_tree": axial_tree,
            "efficientnet_tree": efficientnet_tree}


def _saved(write):
    """The bytes a writer `write(path)` writes."""
    folder = tempfile.mkdtemp()
    try:
        path = os.path.join(folder, "f.npz")
        write(path)
        return open(path, "rb").read()
    finally:
        shutil.rmtree(folder)


def _timm_bit_state(tree):
    """A canonical BiT tree in timm's ResNetV2 layout (the inverse of the reader's mapping, written out)."""
    conv = {"a": "conv1", "b": "conv2", "c": "conv3"}
    norm = {"a": "norm1", "b": "norm2", "c": "norm3"}
    state = {}
    for key, value in tree.items():
        parts = key.split("/")
        if key == "resnet/root_block/standardized_conv2d/kernel":
            state["stem.conv.weight"] = value.transpose(3, 2, 0, 1)
        elif parts[1] == "group_norm":
            state["norm." + {"gamma": "weight", "beta": "bias"}[parts[2]]] = value
        elif parts[1] == "head":
            state["head.fc." + {"kernel": "weight", "bias": "bias"}[parts[3]]] = (
                value.transpose(3, 2, 0, 1) if value.ndim == 4 else value)
        else:
            stage, unit, part = int(parts[1][5:]) - 1, int(parts[2][4:]) - 1, parts[3]
            prefix = f"stages.{stage}.blocks.{unit}."
            if parts[4] == "proj":
                state[prefix + "downsample.conv.weight"] = value.transpose(3, 2, 0, 1)
            elif parts[4] == "standardized_conv2d":
                state[prefix + conv[part] + ".weight"] = value.transpose(3, 2, 0, 1)
            else:
                state[prefix + norm[part] + "." + {"gamma": "weight", "beta": "bias"}[parts[5]]] = value
    return {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}


def _timm_efficientnet_state(tree):
    """A canonical EfficientNet tree in timm's layout (the inverse of the reader's mapping, written out)."""
    leaves = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var",
              "bias": "bias"}
    state = {}
    for key, value in tree.items():
        module, leaf = key.rsplit("/", 1)
        name = module.replace("/", ".")
        if leaf != "kernel":
            state[f"{name}.{leaves[leaf]}"] = value
        elif module == "classifier":
            state[f"{name}.weight"] = value.T
        elif module.endswith("conv_dw"):
            state[f"{name}.weight"] = value.transpose(2, 3, 0, 1)
        else:
            state[f"{name}.weight"] = value.transpose(3, 2, 0, 1)
    return {k: np.ascontiguousarray(v, np.float32) for k, v in state.items()}


def timm_efficientnet_sample():
    """(bytes of a small bare timm EfficientNet .safetensors (width x0.25, depth x0.3: one or two
    blocks per stage), which the reader recognises by its shapes, and its EfficientNet tree)."""
    model = keras_vit.models.EfficientNet(image_size=32, width_multiplier=0.25, depth_multiplier=0.3, classes=3)
    tree = get_weight_tree(model)
    rng = np.random.default_rng(0)
    tree = {k: (v + rng.normal(0, 0.1, v.shape)).astype(np.float32) for k, v in tree.items()}
    tree = {k: (np.abs(v) + 0.5 if k.endswith("moving_variance") else v) for k, v in tree.items()}
    return safetensors_bytes(*safetensors_parts(_timm_efficientnet_state(tree))), tree


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
        tree = None
        try:
            tree, config = read_checkpoint(os.path.join(folder, entry))
            if build:
                build_model(tree, config)
            outcome = "read"
        except CheckpointError as err:
            message = str(err)
            if tree is None:  # the read failed: it names the checkpoint by its path (this case's fresh
                # folder, a unique name) or the file read
                named = os.path.basename(os.path.normpath(os.path.join(folder, entry)))
                assert os.path.basename(folder) in message or named in message, (
                    f"the error names neither {named!r} nor its folder: {message}")
            else:  # the tree read but does not fit a model: it names a weight (a path such as "head/kernel")
                assert re.search(r"\w+/[\w/]+", message), f"the error names no weight: {message}"
            outcome = "CheckpointError"
        except OSError as err:
            assert str(err)
            outcome = f"OSError ({type(err).__name__})"
        assert sorted(os.listdir(folder)) == before, "a reader wrote next to the checkpoint"
    finally:
        shutil.rmtree(folder)
    OUTCOMES[label][outcome] += 1
    return outcome


# === The matrix: every registered format, truncated and with flipped bytes ===


@dataclasses.dataclass(frozen=True)
class Sample:
    """A small valid checkpoint: `files` {name: bytes} written into a fresh folder, `target` the
    file damaged, `entry` what `read_checkpoint` is handed ("." for the folder), `cases` the
    truncation and flipped-byte cases of the default profile, `build` whether a read is also
    assigned to a model (cheap for files without a model config)."""

    files: str  # the key of valid["files"]
    target: str
    entry: str
    cases: int
    build: bool = True


#: Registered format -> {label: Sample}. A new format in keras_vit.checkpoints.registry needs a
#: line here (and its small valid file in the `valid` fixture).
GENERATORS = {
    "npz": {"npz": Sample("npz", "m.npz", "m.npz", 60)},
    "big_vision": {"big_vision": Sample("big_vision", "bv.npz", "bv.npz", 20),
                   "big_vision scanned": Sample("big_vision scanned", "bv.npz", "bv.npz", 20)},
    "bit_npz": {"bit_npz": Sample("bit_npz", "b.npz", "b.npz", 20)},
    "timm": {"timm": Sample("timm", "model.safetensors", ".", 60)},
    "timm_bit": {"timm_bit": Sample("timm_bit", "model.safetensors", ".", 20)},
    "transformers": {"transformers": Sample("transformers", "model.safetensors", ".", 30)},
    "keras_preset": {"keras_preset": Sample("keras_preset", "model.weights.h5", ".", 10, build=False)},
    "keras_weights": {"keras_weights": Sample("weights_h5", "w.weights.h5", "w.weights.h5", 10, build=False)},
    "keras": {"keras": Sample("keras", "m.keras", "m.keras", 10, build=False)},
    "axial_deeplab": {"axial_deeplab": Sample("axial_deeplab", "model.pth.tar", "model.pth.tar", 20)},
    "timm_efficientnet": {"timm_efficientnet": Sample("timm_efficientnet", "model.safetensors", "model.safetensors",
                                                      20)},
}


def _registered():
    from keras_vit.checkpoints.registry import formats

    return list(formats())


def _samples(fmt):
    if fmt not in GENERATORS:
        pytest.fail(
            f"The checkpoint format {fmt!r} is registered (keras_vit.checkpoints.registry) but has no hostile-file "
            f"generator: add GENERATORS[{fmt!r}] = {{label: Sample(...)}} in tests/test_hostile_files.py, with its "
            "small valid file in the `valid` fixture, and its outcome counts in EXPECTED (run the test once: the "
            "failure prints them)."
        )
    return GENERATORS[fmt]


def test_every_registered_format_has_a_generator():
    missing = [fmt for fmt in _registered() if fmt not in GENERATORS]
    assert not missing, (
        f"registered formats without a hostile-file generator: {', '.join(missing)}; add GENERATORS entries "
        "(tests/test_hostile_files.py) so that they are truncated and flipped like every other format."
    )


def _damaged(valid, sample, data):
    return {**valid["files"][sample.files], sample.target: data}


def _rng(label):
    """The random cases of `label`: the same in every run and process (hypothesis' derandomized
    generation is not: it changes with what ran before in the process), fresh with KERAS_VIT_FUZZ=heavy."""
    return np.random.default_rng(None if HEAVY else zlib.crc32(label.encode()))


def _cut(label, sample, sandbox, valid):
    data = valid["files"][sample.files][sample.target]
    rng = _rng(f"{label} truncation")
    for length in rng.integers(0, len(data), sample.cases * (10 if HEAVY else 1)):
        attempt(f"{label} truncation", sandbox, _damaged(valid, sample, data[:int(length)]), sample.entry)


def _flip(label, sample, sandbox, valid):
    data = valid["files"][sample.files][sample.target]
    rng = _rng(f"{label} flipped bytes")
    for _ in range(sample.cases * (10 if HEAVY else 1)):
        damaged = bytearray(data)
        for _ in range(int(rng.integers(1, 9))):  # 1 to 8 bytes, each XORed with a non-zero mask
            damaged[int(rng.integers(0, len(data)))] ^= int(rng.integers(1, 256))
        attempt(f"{label} flipped bytes", sandbox, _damaged(valid, sample, bytes(damaged)), sample.entry,
                build=sample.build)


def check_outcomes(label):
    """Assert the outcome counts of `label` (default profile) against EXPECTED."""
    got = dict(OUTCOMES[label])
    if HEAVY or os.environ.get("H4_RECORD"):
        return
    assert label in EXPECTED, f"no expected outcome counts for {label!r}; measured {got}: add them to EXPECTED"
    assert got == EXPECTED[label], f"{label}: outcomes {got}, expected {EXPECTED[label]}"


@pytest.mark.parametrize("fmt", _registered())
def test_truncated_files(fmt, sandbox, valid):
    for label, sample in _samples(fmt).items():
        _cut(label, sample, sandbox, valid)
        assert OUTCOMES[f"{label} truncation"]["read"] == 0  # a cut file never reads
        check_outcomes(f"{label} truncation")


@pytest.mark.parametrize("fmt", _registered())
def test_flipped_bytes(fmt, sandbox, valid):
    for label, sample in _samples(fmt).items():
        _flip(label, sample, sandbox, valid)
        check_outcomes(f"{label} flipped bytes")


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
    check_outcomes("safetensors header")


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
    check_outcomes("safetensors 100 GB claims")


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
    check_outcomes("safetensors non-finite / int")


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
    check_outcomes("npz dtypes/shapes/values")


#: The .npz samples of the matrix (every format stored as NumPy's zip of .npy members).
NPZ_SAMPLES = [(label, sample) for samples in GENERATORS.values() for label, sample in samples.items()
               if sample.target.endswith(".npz")]


@pytest.mark.parametrize("label,sample", NPZ_SAMPLES, ids=[label for label, _ in NPZ_SAMPLES])
def test_npz_headers_claiming_100_gb_fail_fast_without_allocating(label, sample, sandbox, valid):
    """Every .npz reader (original, big_vision per-layer and scanned, big_transfer) checks each
    member's declared size against the zip before allocating: its largest member replaced by
    headers claiming 100 GB, beyond int64, an object array, or fewer bytes than it holds."""
    with zipfile.ZipFile(io.BytesIO(valid["files"][sample.files][sample.target])) as z:
        members = {i.filename: z.read(i.filename) for i in z.infolist()}
    largest = max(members, key=lambda name: len(members[name]))
    for descr, shape in [("<f4", (100_000, 250_000)), ("<f4", (2**40, 2**40, 2**40)), ("|O", (3,)), ("<f4", (5,))]:
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": descr, "fortran_order": False, "shape": shape})
        member = header.getvalue() + b"\0" * 64  # 64 data bytes, whatever the header says
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            for name, data in members.items():
                z.writestr(name, member if name == largest else data)
        blob = buf.getvalue()
        tracemalloc.start()
        try:
            ending = attempt(f"{label} headers claiming 100 GB / objects", sandbox,
                             _damaged(valid, sample, blob), sample.entry)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert ending == "CheckpointError", (label, shape)
        assert peak < 16 * 2**20, f"{peak / 2**20:.0f} MiB allocated for a {len(blob) / 1024:.0f} KiB file"
    check_outcomes(f"{label} headers claiming 100 GB / objects")


# === Structured damage: config.json of every reader ===

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
_CONFIG_FIELDS = {
    "timm": ["architecture", "model_args", "num_classes", "global_pool"],
    "transformers": ["model_type", "num_attention_heads", "image_size", "hidden_act", "layer_norm_eps", "pooler_act"],
    "timm_bit": ["architecture", "model_args", "num_classes", "pretrained_cfg"],
    "keras_preset": ["image_size", "patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim", "classes",
                     "resnet", "classifier", "layer_norm_epsilon", "representation_size", "num_channels",
                     "include_top", "position_embedding_resize", "quantization"],
}


@pytest.mark.parametrize("fmt,n", [("timm", 40), ("timm_bit", 20), ("transformers", 40), ("keras_preset", 20)])
def test_config_fields_of_any_json_value(fmt, n, sandbox, valid):
    config = json.loads(valid["files"][fmt]["config.json"])
    fields = _CONFIG_FIELDS[fmt]
    numbers = st.sampled_from([0, -1, 10**6, 10**12, 2**63, 1e300, 0.5, True, "12", None, [], [10**9, 10**9]])

    @cases(n)
    @given(st.sampled_from(fields), _JSON | numbers,
           st.sampled_from(["num_heads", "img_size", "patch_size", "embed_dim", "depth"]) if fmt == "timm"
           else st.sampled_from(["stem_type", "global_pool", "input_size"]) if fmt == "timm_bit" else st.none())
    def run(field, value, arg):
        c = json.loads(json.dumps(config))
        if fmt == "timm" and field == "model_args" and arg is not None and not isinstance(value, (dict, list)):
            c["model_args"][arg] = value
        elif fmt == "timm_bit" and field in ("model_args", "pretrained_cfg") and not isinstance(value, (dict, list)):
            c[field] = {arg: value}
        else:
            c[field] = value
        files = {**valid["files"][fmt], "config.json": json.dumps(c).encode()}
        attempt(f"{fmt} config.json fields", sandbox, files, ".", build=fmt != "keras_preset")

    run()
    check_outcomes(f"{fmt} config.json fields")


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
    check_outcomes("keras config claiming a huge model")


@pytest.mark.parametrize("fmt", ["timm", "timm_bit", "transformers", "keras_preset"])
def test_hostile_json_documents(fmt, sandbox, valid):
    for label, text in [
        ("nested 10^5 deep", b"[" * 100_000 + b"]" * 100_000),
        ("nested objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
        ("17 MB", b'{"architecture": "' + b"x" * (17 * 2**20) + b'"}'),
        ("not UTF-8", b'{"architecture": "\xff\xfe"}'),
        ("not an object", b"[1, 2, 3]"),
        ("huge integer", b'{"num_attention_heads": 1' + b"0" * 5000 + b', "model_type": "vit"}'),
    ]:
        ending = attempt(f"{fmt} JSON documents", sandbox, {**valid["files"][fmt], "config.json": text}, ".")
        assert ending == "CheckpointError", (fmt, label)
    check_outcomes(f"{fmt} JSON documents")


def test_preset_folder_missing_files(sandbox, valid):
    files = valid["files"]["keras_preset"]
    for missing in ("model.weights.h5", "config.json"):
        left = {k: v for k, v in files.items() if k != missing}
        ending = attempt("preset missing files", sandbox, left, ".")
        assert ending == "CheckpointError"
    check_outcomes("preset missing files")


def test_valid_files_still_read_exactly(sandbox, valid):
    """The hardening refuses nothing valid: every sample reads back its tree (big_vision's layout
    moves the class token's position-embedding row into `cls`: there the model must run)."""
    for samples in GENERATORS.values():  # a registered format without one: test_every_registered_format_has_a_generator
        for label, sample in samples.items():
            folder = _write(sandbox, valid["files"][sample.files])
            tree, config = read_checkpoint(os.path.join(folder, sample.entry))
            family = keras_vit.family_of(config).name
            expected = {"bit": valid["bit_tree"], "axial_resnet": valid["axial_tree"],
                        "efficientnet": valid["efficientnet_tree"]}.get(family, valid["tree"])
            if not label.startswith("big_vision"):
                assert set(tree) == set(expected), label
                for key, value in expected.items():
                    np.testing.assert_allclose(np.asarray(tree[key]), value, rtol=0, atol=1e-7, err_msg=f"{label} {key}")
            model = build_model(tree, config)
            if label.startswith("big_vision"):
                x = np.linspace(-1, 1, 32 * 32 * 3, dtype=np.float32).reshape(1, 32, 32, 3)
                assert math.isfinite(float(np.abs(np.asarray(model(x))).sum())), label


#: The config class of what each registered format's samples hold (the `valid` fixture's models).
CONFIG_CLASSES = {"npz": "ViTConfig", "big_vision": "ViTConfig", "timm": "ViTConfig", "transformers": "ViTConfig",
                  "keras_preset": "ViTConfig", "keras_weights": "ViTConfig", "keras": "ViTConfig",
                  "bit_npz": "BiTConfig", "timm_bit": "BiTConfig", "axial_deeplab": "AxialResNetConfig",
                  "timm_efficientnet": "EfficientNetConfig"}


def test_every_format_reads_its_familys_config_object(sandbox, valid):
    """Every registered format's reader, its `read_at` and `read_checkpoint` give the family's config
    object (sizes as pairs), which still answers the dict reads code wrote for the readers' old dicts."""
    from keras_vit.checkpoints.registry import detect_format, formats

    for name in formats():
        assert name in CONFIG_CLASSES, f"add the config class of the format {name!r} to CONFIG_CLASSES"
        for label, sample in _samples(name).items():
            path = os.path.join(_write(sandbox, valid["files"][sample.files]), sample.entry)
            fmt = detect_format(path)
            assert fmt.name == name, label
            _, config = fmt.read_at(os.path.normpath(path))
            assert type(config).__name__ == CONFIG_CLASSES[name], label
            assert type(fmt.read(os.path.normpath(path))[1]) is type(config), label  # the module's own reader
            _, public = read_checkpoint(path)
            assert public == config, label
            assert len(config.image_size) == 2 and all(isinstance(s, int) for s in config.image_size), label
            assert dict(config)["image_size"] == config["image_size"] == config.image_size, label
            if CONFIG_CLASSES[name] == "ViTConfig":
                assert public["num_heads"] == public.num_heads == SMALL["num_heads"], label
                assert public["hidden_size"] == SMALL["hidden_size"] and public.image_size == (32, 32), label
            if name in ("bit_npz", "timm_bit"):
                assert public["block_units"] == BIT_SMALL["block_units"], label
                assert public.image_size == (32, 32) or name == "bit_npz", label  # an .npz states no size


def test_a_checkpoint_without_a_head_reads_as_a_headless_config(sandbox, valid):
    """A file without `head/` reads as `include_top=False` with `classes` None, as the readers' dicts said."""
    tree = {k: v for k, v in valid["tree"].items() if not k.startswith("head/")}
    folder = tempfile.mkdtemp(dir=sandbox)
    write_npz(tree, os.path.join(folder, "features.npz"))
    _, config = read_checkpoint(os.path.join(folder, "features.npz"))
    assert config.include_top is False and config.classes is None and config["classes"] is None
    _, with_head = read_checkpoint(os.path.join(_write(sandbox, valid["files"]["npz"]), "m.npz"))
    assert with_head.include_top is True and with_head["classes"] == SMALL["classes"]
    model = keras_vit.load_checkpoint(os.path.join(folder, "features.npz"), include_top=None)
    assert model.include_top is False and model.output_shape == (None, SMALL["hidden_size"])


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


# === Structured damage: PyTorch zip files ===


def test_torch_files_that_would_run_code_or_claim_too_much(sandbox):
    """PyTorch zip files (tests/torch_zip_files.py): pickles naming os.system, eval, exec, Popen
    (each would create a marker file if unpickled), storages claiming 100 GB, tensors past or
    overlapping their storage, unknown storage types, missing members, truncations, a CRC
    failure, a legacy file, pickles changing a tensor, a storage or a dict after it is built (BUILD,
    SETITEM, APPENDS, NEWOBJ), a tensor one element past its storage, a bad byte order and a
    deflate bomb: each ends in a CheckpointError naming what is wrong, nothing runs, nothing is
    allocated for what the file claims."""
    folder = tempfile.mkdtemp(dir=sandbox)
    for name, path, expect in hostile_torch_files(folder):
        with open(path, "rb") as f:
            data = f.read()
        tracemalloc.start()
        try:
            ending = attempt("torch zip pickles / storages", sandbox, {"model.pth.tar": data}, "model.pth.tar")
            # The file's own defect, where every tensor is read (read_checkpoint can stop earlier: a
            # state dict of no model family).
            with pytest.raises(CheckpointError, match=expect):
                {key: np.asarray(value) for key, value in TorchZipFile(path).state_dict().items()}
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert ending == "CheckpointError", name
        assert peak < 64 * 2**20, (name, peak)
    assert not os.path.exists(os.path.join(folder, "ran")), "a pickle's payload ran"
    check_outcomes("torch zip pickles / storages")


def test_torch_files_at_the_edges_of_the_format_read(sandbox):
    """Valid PyTorch zip files at the format's edges (tests/torch_zip_files.py): every member
    deflated, a big-endian file, a tensor ending on its storage's last element; each reads to the
    values it was written from (read by the torch zip reader itself: they hold no model)."""
    folder = tempfile.mkdtemp(dir=sandbox)
    for name, path, expected in edge_torch_files(folder):
        got = TorchZipFile(path).state_dict()
        assert sorted(got) == sorted(expected), name
        for key, value in expected.items():
            np.testing.assert_array_equal(np.asarray(got[key]), value, err_msg=f"{name} {key}")
        OUTCOMES["torch zip edges (deflated, big-endian, last element)"]["read"] += 1
    check_outcomes("torch zip edges (deflated, big-endian, last element)")


# === Files under another format's name ===

#: The name each kind of file carries, for `test_files_under_another_formats_name`.
KIND_NAMES = {"npz": "x.npz", "safetensors": "x.safetensors", "pytorch": "x.pth", "keras": "x.keras",
              "hdf5": "x.weights.h5"}
#: What each sample's damaged file is (its own name says it): kind, as error messages word it.
SAMPLE_KINDS = {".npz": ("npz", "a NumPy .npz archive"), ".safetensors": ("safetensors", "a safetensors file"),
                ".pth.tar": ("pytorch", r"a PyTorch zip file \(torch.save\)"), ".keras": ("keras", "a .keras archive"),
                ".h5": ("hdf5", r"an HDF5 file \(Keras .weights.h5\)")}


def test_files_under_another_formats_name(sandbox, valid):
    """Every sample of the matrix saved under each other format's name (a renamed download, a
    .npz saved as .pth, a PyTorch file as .safetensors) is refused with one CheckpointError that
    says what the file holds and the name to give it, instead of a parse error of the wrong
    reader; so are mislabelled weights inside a Hub-layout folder."""
    for samples in GENERATORS.values():
        for label, sample in samples.items():
            data = valid["files"][sample.files][sample.target]
            own, words = next(v for ending, v in SAMPLE_KINDS.items() if sample.target.endswith(ending))
            for kind, name in KIND_NAMES.items():
                if kind == own:
                    continue
                folder = _write(sandbox, {name: data})
                with pytest.raises(CheckpointError, match=rf"{name}' is named like .* but holds {words}: the file was "
                                                          r"renamed or mislabelled\. Give it a name ending in"):
                    read_checkpoint(os.path.join(folder, name))
                assert os.listdir(folder) == [name]
                OUTCOMES["files under another format's name"]["CheckpointError"] += 1
    # Inside Hub-layout folders: a PyTorch file as model.safetensors, a safetensors file as pytorch_model.bin.
    axial = valid["files"]["axial_deeplab"]["model.pth.tar"]
    folder = _write(sandbox, {**valid["files"]["timm"], "model.safetensors": axial})
    with pytest.raises(CheckpointError, match=r"model.safetensors' is named like a safetensors file but holds a "
                                              r"PyTorch zip file"):
        read_checkpoint(folder)
    OUTCOMES["files under another format's name"]["CheckpointError"] += 1
    files = dict(valid["files"]["transformers"])
    files["pytorch_model.bin"] = files.pop("model.safetensors")
    with pytest.raises(CheckpointError, match=r"pytorch_model.bin' is named like a PyTorch zip file \(torch.save\) "
                                              r"but holds a safetensors file.*ending in '.safetensors'"):
        read_checkpoint(_write(sandbox, files))
    OUTCOMES["files under another format's name"]["CheckpointError"] += 1
    folder = _write(sandbox, {**valid["files"]["keras_preset"], "model.weights.h5": axial})
    with pytest.raises(CheckpointError, match=r"model.weights.h5' is named like an HDF5 file .* but holds a PyTorch"):
        read_checkpoint(folder)
    OUTCOMES["files under another format's name"]["CheckpointError"] += 1
    check_outcomes("files under another format's name")


# === A file that fails while it is assigned ===

#: The samples whose readers leave tensors to be read when assigned (the original .npz reader
#: reads every tensor as it reads the file; the Keras files are read by Keras).
LAZY_SAMPLES = [(label, sample) for samples in GENERATORS.values() for label, sample in samples.items()
                if sample.build and label != "npz"]


@pytest.mark.parametrize("label,sample", LAZY_SAMPLES, ids=[label for label, _ in LAZY_SAMPLES])
def test_a_read_failing_midway_leaves_a_built_models_weights_untouched(label, sample, sandbox, valid):
    """Loading into a built model (`set_weight_tree`) from a lazy tree whose file is cut short
    after the tree was read (its tensors are then read one at a time): the read fails with a
    CheckpointError naming the file, and not one weight of the model has changed, although the
    tensors before the cut still read."""
    from keras_vit.checkpoints.registry import detect_format
    from keras_vit.models.weight_tree import set_weight_tree

    folder = _write(sandbox, valid["files"][sample.files])
    path = os.path.join(folder, sample.entry)
    model = randomize(build_model(*read_checkpoint(path)), seed=5)
    before = {k: np.asarray(v) for k, v in get_weight_tree(model).items()}
    tree, _ = detect_format(path).read_at(path)
    if hasattr(tree, "bind"):
        tree = tree.bind(model)
    assert not all(isinstance(v, np.ndarray) for v in tree.values()), f"{label}: nothing is left to read"
    target = os.path.join(folder, sample.target)
    with open(target, "r+b") as f:
        f.truncate(os.path.getsize(target) * 3 // 5)
    with pytest.raises(CheckpointError, match=sample.target):
        set_weight_tree(model, tree)
    after = get_weight_tree(model)
    changed = [k for k in before if not np.array_equal(before[k], after[k])]
    assert not changed, f"{label}: a failed load changed {changed}"


# === docs/reliability.md's table ===

DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "docs", "reliability.md")
TABLE_START = "<!-- hostile-file table: generated from tests/test_hostile_files.py EXPECTED -->"
TABLE_END = "<!-- end of the generated table -->"


def outcome_table(expected=None):
    """The markdown table of the outcome counts the tests assert."""
    rows = ["| reader / damage | cases | CheckpointError | read |", "|---|---|---|---|"]
    for label, counts in (expected or EXPECTED).items():
        other = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()) if k not in ("CheckpointError", "read"))
        errors = str(counts.get("CheckpointError", 0)) + (f" (+ {other})" if other else "")
        rows.append(f"| {label} | {sum(counts.values())} | {errors} | {counts.get('read', 0)} |")
    total = sum(sum(c.values()) for c in (expected or EXPECTED).values())
    return "\n".join(rows) + f"\n\n{total} cases in all."


def test_reliability_doc_shows_the_asserted_counts():
    text = open(DOC).read()
    assert TABLE_START in text and TABLE_END in text, f"{DOC} lost the markers around the hostile-file table"
    shown = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert shown == outcome_table(), (
        "docs/reliability.md's hostile-file table differs from EXPECTED; paste the output of "
        "`python tests/test_hostile_files.py` between its markers"
    )


if __name__ == "__main__":
    print(outcome_table())

