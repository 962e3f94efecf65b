"""PyTorch zip files read without torch and without running pickle code.

Valid files are written by the real `torch.save` and compared with `torch.load(weights_only=True)`.
Hostile files are written by `torch_zip_bytes` below, which emits the pickle opcodes of a
torch.save file by hand (so a test controls every field) and packs them the way torch.save does;
`hostile_torch_files` is the list of damaged files the hostile-file matrix runs too.
"""

import io
import os
import pickle
import shutil
import struct
import sys
import tracemalloc
import zipfile

import numpy as np
import pytest

from keras_vit import CheckpointError, read_checkpoint
from keras_vit.checkpoints.registry import detect_format
from keras_vit.checkpoints.torch_zip import TorchStateFile, TorchZipFile

pytestmark = pytest.mark.backend_independent

sys.modules.setdefault("triton", None)  # see test_checkpoints: triton's LLVM and TensorFlow clash


# === Files written by hand: a torch.save archive with every field under the test's control ===


def _str(s):
    data = s.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _int(n):
    if 0 <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    data = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(data)]) + data


def _tuple(items):
    return b"(" + b"".join(items) + b"t"


def _tensor(key, numel, shape, stride, offset=0, storage="FloatStorage"):
    """The opcodes of torch._utils._rebuild_tensor_v2(storage, offset, shape, stride, False, {})."""
    pid = _tuple([_str("storage"), b"ctorch\n" + storage.encode() + b"\n", _str(key), _str("cpu"), _int(numel)])
    args = [pid + b"Q", _int(offset), _tuple(map(_int, shape)), _tuple(map(_int, stride)), b"\x89", b"}"]
    return b"ctorch._utils\n_rebuild_tensor_v2\n" + _tuple(args) + b"R"


def _dict(entries):
    """The opcodes of a dict {name: opcodes}."""
    return b"}(" + b"".join(_str(name) + value for name, value in entries.items()) + b"u"


def state_pickle(entries):
    """A protocol-2 pickle of {name: opcodes} (values are opcode strings such as `_tensor(...)`)."""
    return b"\x80\x02" + _dict(entries) + b"."


def state_dict_bytes(arrays, wrap=None, prefix=""):
    """A torch.save zip of the state dict {name: float32 / int64 array}, each tensor its own
    contiguous storage; `wrap` (e.g. "state_dict") nests it as {"epoch": 1, wrap: state}, as
    training scripts save it, and `prefix` ("module.") prefixes every key."""
    entries, storages = {}, {}
    for i, (name, value) in enumerate(arrays.items()):
        value = np.ascontiguousarray(value)
        kind = {"f": "FloatStorage", "i": "LongStorage"}[value.dtype.kind]
        value = value.astype(np.float32 if kind == "FloatStorage" else np.int64)
        strides = tuple(s // value.itemsize for s in value.strides)
        entries[prefix + name] = _tensor(str(i), value.size, value.shape, strides, storage=kind)
        storages[str(i)] = value.tobytes()
    body = _dict(entries)
    if wrap is not None:
        body = b"}(" + _str("epoch") + _int(1) + _str(wrap) + body + b"u"
    return torch_zip_bytes(b"\x80\x02" + body + b".", storages)


def axial_deeplab_state(tree):
    """The state dict axialnet.py's AxialAttentionNet holds for an AxialResNet weight tree (the
    inverse of the reader's mapping, written out), its buffers included."""
    bn = {"gamma": "weight", "beta": "bias", "moving_mean": "running_mean", "moving_variance": "running_var"}
    state = {}
    for key, value in tree.items():
        value = np.asarray(value)
        module, leaf = key.rsplit("/", 1)
        name = module.replace("/", ".")
        if leaf in bn:
            state[f"{name}.{bn[leaf]}"] = value
            if leaf == "moving_variance":
                state[f"{name}.num_batches_tracked"] = np.array(100, np.int64)
        elif module.endswith("qkv_transform"):
            state[f"{name}.weight"] = value.T[:, :, None]
        elif leaf == "kernel" and value.ndim == 4:
            state[f"{name}.weight"] = value.transpose(3, 2, 0, 1)
        elif key == "fc/kernel":
            state["fc.weight"] = value.T
        elif leaf == "relative":
            span = (value.shape[1] + 1) // 2
            i = np.arange(span)
            state[f"{name}.relative"] = value
            state[f"{name}.flatten_index"] = (i[:, None] - i[None, :] + span - 1).reshape(-1).astype(np.int64)
        else:
            state[f"{name}.{leaf}"] = value
    return state


def torch_zip_bytes(pickle_bytes, storages, prefix="archive"):
    """A zip laid out as torch.save lays it out: data.pkl, data/<key> (stored), version, byteorder."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", pickle_bytes)
        z.writestr(f"{prefix}/byteorder", "little")
        for key, data in storages.items():
            z.writestr(f"{prefix}/data/{key}", data)
        z.writestr(f"{prefix}/version", "3\n")
    return buffer.getvalue()


def valid_state_file():
    """(bytes, {name: expected array}) of a small valid state dict written by hand."""
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    b = np.array([1.5, -2.0], np.float32)
    data = state_pickle({"w": _tensor("0", 12, (3, 4), (4, 1)), "b": _tensor("1", 2, (2,), (1,))})
    return torch_zip_bytes(data, {"0": w.tobytes(), "1": b.tobytes()}), {"w": w, "b": b}


class _Payload:
    """Pickles as a call of `func(*args)`: what a hostile checkpoint does."""

    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _code_pickles(marker):
    """Pickles that would run code (each creates `marker` when unpickled with pickle.load)."""
    import builtins
    import subprocess

    return {
        "os.system": pickle.dumps({"w": _Payload(os.system, f"touch {marker}")}, protocol=2),
        "builtins.eval": pickle.dumps({"w": _Payload(builtins.eval, f"open({str(marker)!r}, 'w')")}, protocol=2),
        "builtins.exec": pickle.dumps({"w": _Payload(builtins.exec, f"open({str(marker)!r}, 'w')")}, protocol=4),
        "subprocess.Popen": pickle.dumps([_Payload(subprocess.Popen, ["touch", str(marker)])], protocol=2),
        # protocol 0's INST opcode, which instantiates a named class with arguments
        "INST": b"(S'touch " + str(marker).encode() + b"'\nios\nsystem\n.",
        # a tensor whose storage type is a callable of another module
        "storage type": state_pickle({"w": _tensor("0", 1, (1,), (1,)).replace(b"ctorch\nFloatStorage", b"cos\nsystem")}),
    }


def hostile_torch_files(folder):
    """[(name, path, what the error must name)] of damaged torch zip files written into `folder`:
    pickles that would run code, storages and tensors claiming more than the file holds,
    truncations, a CRC failure, a legacy file, and a file whose storage member is missing."""
    os.makedirs(folder, exist_ok=True)
    marker = os.path.join(folder, "ran")
    cases = []

    def write(name, data, expect):
        path = os.path.join(folder, f"{name.replace(' ', '_').replace('.', '_')}.pth")
        with open(path, "wb") as f:
            f.write(data)
        cases.append((name, path, expect))

    storages = {"0": np.zeros(12, np.float32).tobytes()}
    for name, data in _code_pickles(marker).items():
        expect = "(os|posix)\\.system" if name in ("INST", "storage type", "os.system") else name
        write(f"code {name}", torch_zip_bytes(data, storages), expect)
    huge = 25 * 10**9  # a 100 GB float32 storage
    write("huge storage", torch_zip_bytes(state_pickle({"w": _tensor("0", huge, (huge,), (1,))}), storages),
          "claims 25,000,000,000 elements")
    write("tensor past its storage", torch_zip_bytes(state_pickle({"w": _tensor("0", 12, (10**6, 10**6), (1, 1))}),
                                                     storages), "reaches element")
    write("expanded tensor", torch_zip_bytes(state_pickle({"w": _tensor("0", 12, (10**5, 12), (0, 1))}), storages),
          "overlapping strides")
    write("negative offset", torch_zip_bytes(state_pickle({"w": _tensor("0", 12, (4,), (1,), offset=-3)}), storages),
          "malformed")
    write("unknown storage type", torch_zip_bytes(
        state_pickle({"w": _tensor("0", 1, (1,), (1,), storage="ComplexFloatStorage")}), storages),
        "ComplexFloatStorage")
    write("missing storage member", torch_zip_bytes(state_pickle({"w": _tensor("7", 1, (1,), (1,))}), storages),
          "no member data/7")
    valid, _ = valid_state_file()
    for cut in (len(valid) // 4, len(valid) // 2, len(valid) - 30):
        write(f"truncated at {cut}", valid[:cut], "truncated|corrupt|not a PyTorch zip")
    flipped = bytearray(valid)
    at = valid.index(np.float32(1.5).tobytes())  # inside storage "1"
    flipped[at] ^= 0x40
    write("flipped storage byte", bytes(flipped), "CRC")
    legacy = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2) + pickle.dumps(1001, protocol=2)
    write("legacy torch file", legacy, "legacy")
    return cases


# === Tests ===


def _read_all(path):
    """Open with the restricted reader and convert every tensor (storages are read lazily)."""
    return {k: np.asarray(v) for k, v in TorchZipFile(path).state_dict().items()}


def test_hand_written_file_reads(tmp_path):
    data, expected = valid_state_file()
    (tmp_path / "ok.pt").write_bytes(data)
    got = _read_all(tmp_path / "ok.pt")
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])


def test_hostile_files_are_refused_and_nothing_runs(tmp_path):
    cases = hostile_torch_files(tmp_path / "files")
    assert len(cases) >= 15
    for name, path, expect in cases:
        tracemalloc.start()
        try:
            with pytest.raises(CheckpointError, match=expect):
                _read_all(path)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 50 * 2**20, (name, peak)  # no allocation of what a file claims
        assert not os.path.exists(tmp_path / "files" / "ran"), name
    # The code payloads are real: plain pickle.load runs them (this is what the reader prevents).
    payload = _code_pickles(tmp_path / "ran_by_pickle")["os.system"]
    pickle.loads(payload)
    assert os.path.exists(tmp_path / "ran_by_pickle")


def test_code_payload_error_names_the_global(tmp_path):
    marker = tmp_path / "ran"
    (tmp_path / "evil.pt").write_bytes(torch_zip_bytes(_code_pickles(marker)["builtins.eval"], {}))
    with pytest.raises(CheckpointError, match=r"builtins\.eval.*Nothing was loaded or run"):
        TorchZipFile(tmp_path / "evil.pt")
    # Through the registry too: detection opens nothing that runs it.
    with pytest.raises(CheckpointError):
        read_checkpoint(tmp_path / "evil.pt")
    assert not marker.exists()


# --- Files written by torch.save ---

torch = pytest.importorskip("torch")


def test_torch_save_dtypes_views_and_shared_storages(tmp_path):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 8, generator=g)
    state = {
        "float32": torch.randn(3, 5, generator=g),
        "float16": torch.randn(4, 3, generator=g).half(),
        "bfloat16": torch.randn(7, generator=g).bfloat16(),
        "int64": torch.arange(-5, 10),
        "scalar": torch.tensor(3.25),
        "empty": torch.zeros(0, 4),
        "view_offset": base[2:5, 3:],  # offset 19, stride (8, 1), shares base's storage
        "transposed": base.t(),  # stride (1, 8)
        "column": base[:, 5],  # offset 5, stride (8,)
        "base": base,
        "parameter": torch.nn.Parameter(torch.randn(2, 2, generator=g)),
    }
    torch.save(state, tmp_path / "state.pt")
    reference = torch.load(tmp_path / "state.pt", weights_only=True)
    tensors = TorchZipFile(tmp_path / "state.pt").state_dict()
    assert tensors["view_offset"].storage is tensors["base"].storage  # one storage, read per tensor
    assert tensors["view_offset"].offset == 19 and tensors["transposed"].stride == (1, 8)
    for key, tensor in tensors.items():
        ref = reference[key].detach()
        got = tensor.numpy()
        assert got.shape == tuple(ref.shape), key
        expected = ref.float().numpy() if ref.dtype == torch.bfloat16 else ref.numpy()
        assert got.dtype == expected.dtype, key
        np.testing.assert_array_equal(got, expected, err_msg=key)
        if ref.is_floating_point():  # np.asarray: float32, exactly the stored values widened
            np.testing.assert_array_equal(np.asarray(tensor), ref.float().numpy(), err_msg=key)


def test_training_checkpoint_with_optimizer_state(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.Linear(6, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    optimizer.step()
    torch.save({"epoch": 7, "state_dict": model.state_dict(), "optimizer": optimizer.state_dict()},
               tmp_path / "checkpoint.pth.tar")
    archive = TorchZipFile(tmp_path / "checkpoint.pth.tar")
    assert archive.object["epoch"] == 7
    assert archive.object["optimizer"]["param_groups"][0]["momentum"] == 0.9
    momentum = archive.object["optimizer"]["state"][0]["momentum_buffer"]
    np.testing.assert_array_equal(np.asarray(momentum), optimizer.state_dict()["state"][0]["momentum_buffer"].numpy())
    state = archive.state_dict()
    assert list(state) == list(model.state_dict())  # order kept
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(state[key].numpy(), value.numpy())
    assert state["1.num_batches_tracked"].numpy().dtype == np.int64


def test_legacy_file_is_refused_with_the_reason(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "old.pth", _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match="legacy .*non-zip.* never"):
        TorchZipFile(tmp_path / "old.pth")
    with pytest.raises(CheckpointError, match="legacy"):
        detect_format(tmp_path / "old.pth")


def test_unknown_family_torch_file_says_what_to_pass(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "weights.pt")
    with pytest.raises(CheckpointError, match="no model family .* pass the folder"):
        detect_format(tmp_path / "weights.pt")


def test_state_file_refuses_integer_weights(tmp_path):
    torch.save({"w": torch.arange(3)}, tmp_path / "w.bin")
    with pytest.raises(CheckpointError, match="Long; weights must be floating point"):
        TorchStateFile(tmp_path / "w.bin").lazy("w")


# --- Hub-layout folders with only pytorch_model.bin ---


def _same_tree(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_timm_folder_with_only_pytorch_model_bin(tmp_path):
    timm = pytest.importorskip("timm")
    from timm.models._hub import save_for_hf

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=2, num_classes=5).eval()
    save_for_hf(model, tmp_path / "st", safe_serialization=True)
    os.makedirs(tmp_path / "bin")
    shutil.copy(tmp_path / "st" / "config.json", tmp_path / "bin" / "config.json")
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    tree_bin, config_bin = read_checkpoint(tmp_path / "bin")
    tree_st, config_st = read_checkpoint(tmp_path / "st")
    assert config_bin == config_st and config_bin["num_heads"] == 3
    _same_tree(tree_bin, tree_st)
    np.testing.assert_array_equal(tree_bin["head/kernel"], model.head.weight.detach().numpy().T)


def test_transformers_folder_with_only_pytorch_model_bin(tmp_path):
    transformers = pytest.importorskip("transformers")

    config = transformers.ViTConfig(hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=96, image_size=32, patch_size=8, num_labels=5)
    model = transformers.ViTForImageClassification(config).eval()
    model.save_pretrained(tmp_path / "st")
    os.makedirs(tmp_path / "bin")
    shutil.copy(tmp_path / "st" / "config.json", tmp_path / "bin" / "config.json")
    # The tensors under the names save_pretrained writes (transformers 5 renames its modules in
    # memory), as an older repository's pytorch_model.bin holds them.
    from safetensors.torch import load_file

    torch.save(load_file(tmp_path / "st" / "model.safetensors"), tmp_path / "bin" / "pytorch_model.bin")
    tree_bin, config_bin = read_checkpoint(tmp_path / "bin")
    tree_st, config_st = read_checkpoint(tmp_path / "st")
    assert config_bin == config_st
    _same_tree(tree_bin, tree_st)
    np.testing.assert_array_equal(tree_bin["head/kernel"], model.classifier.weight.detach().numpy().T)


# --- The axial-deeplab layout written by hand (the hostile-file matrix's valid sample) ---


def axial_deeplab_sample():
    """(bytes of a small axial-deeplab .pth.tar written without torch, its AxialResNet tree)."""
    from keras_vit.models import AxialResNet
    from keras_vit.models.weight_tree import get_weight_tree

    model = AxialResNet(image_size=32, block_units=(1, 1, 1, 1), width_multiplier=0.25, classes=3)
    tree = get_weight_tree(model)
    rng = np.random.default_rng(0)
    tree = {k: (v + rng.normal(0, 0.1, v.shape)).astype(np.float32) for k, v in tree.items()}  # no zero BN scales
    tree = {k: (np.abs(v) + 0.5 if k.endswith("moving_variance") else v) for k, v in tree.items()}
    return state_dict_bytes(axial_deeplab_state(tree), wrap="state_dict", prefix="module."), tree


def test_hand_written_axial_deeplab_file_reads_back(tmp_path):
    data, tree = axial_deeplab_sample()
    (tmp_path / "model.pth.tar").write_bytes(data)
    assert detect_format(tmp_path / "model.pth.tar").name == "axial_deeplab"
    got, config = read_checkpoint(tmp_path / "model.pth.tar")
    assert config["block_units"] == (1, 1, 1, 1) and config["image_size"] == (32, 32) and config["classes"] == 3
    _same_tree(got, tree)
