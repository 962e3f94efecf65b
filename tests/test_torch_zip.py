"""PyTorch zip files read without torch and without running pickle code.

Valid files are written by the real `torch.save` and compared with `torch.load(weights_only=True)`.
Hostile files are written by hand (tests/torch_zip_files.py: every field under the test's control);
`hostile_torch_files` is the list of damaged files the hostile-file matrix runs too.
"""

import os
import pickle
import shutil
import sys
import tracemalloc

import numpy as np
import pytest
from torch_zip_files import (
    TAMPERED_LAYOUTS,
    _code_pickles,
    _tensor,
    axial_deeplab_sample,
    build,
    edge_torch_files,
    hostile_torch_files,
    state_pickle,
    torch_zip_bytes,
    valid_state_file,
)

from keras_vit import CheckpointError, read_checkpoint
from keras_vit.checkpoints.registry import detect_format
from keras_vit.storage.torch_zip import TorchStateFile, TorchZipFile

pytestmark = pytest.mark.backend_independent

sys.modules.setdefault("triton", None)  # see test_checkpoints: triton's LLVM and TensorFlow clash


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


def test_edge_files_read_exactly(tmp_path):
    """Deflated members, a big-endian file (byteswapped to native order: float32, float16,
    bfloat16 and int64) and a tensor ending on its storage's last element read the values they
    were written from."""
    cases = edge_torch_files(tmp_path / "files")
    assert [name for name, _, _ in cases] == ["deflated", "big-endian", "tensor ending on its storage's last element"]
    for name, path, expected in cases:
        got = _read_all(path)
        assert sorted(got) == sorted(expected), name
        for key, value in expected.items():
            assert got[key].dtype == (np.int64 if value.dtype == np.int64 else np.float32), (name, key)
            np.testing.assert_array_equal(got[key], value, err_msg=f"{name} {key}")


def _one_tensor_file(tmp_path, name="w.pt"):
    """A file holding w = arange(12) / 7 as a (3, 4) tensor; the opened archive and its tensor."""
    base = np.arange(12, dtype=np.float32) / 7
    (tmp_path / name).write_bytes(torch_zip_bytes(state_pickle({"w": _tensor("0", 12, (3, 4), (4, 1))}),
                                                  {"0": base.tobytes()}))
    archive = TorchZipFile(tmp_path / name)
    return archive, archive.state_dict()["w"]


def test_rebuilt_tensors_and_storages_cannot_be_changed(tmp_path):
    _, tensor = _one_tensor_file(tmp_path)
    for slot, value in [("offset", 1), ("stride", (1, 1)), ("shape", (4, 4)), ("storage", None), ("name", "x")]:
        with pytest.raises(AttributeError, match="cannot be changed"):
            setattr(tensor, slot, value)
        with pytest.raises(AttributeError, match="cannot be deleted"):
            delattr(tensor, slot)
    for slot, value in [("numel", 10**9), ("key", "1"), ("type", None), ("member", None)]:
        with pytest.raises(AttributeError, match="cannot be changed"):
            setattr(tensor.storage, slot, value)
    with pytest.raises(AttributeError, match="cannot be changed"):
        tensor.storage.type.dtype = np.dtype(np.float64)
    assert tensor.offset == 0 and tensor.stride == (4, 1) and tensor.shape == (3, 4) and tensor.name == "w"


@pytest.mark.parametrize("slot,value,message", [
    ("offset", 1, "reaches element 12 of storage '0', which holds 12"),
    ("offset", 10**9, "starts at element 1000000000 of storage '0', which holds 12"),
    ("stride", (4, 2), "reaches element 14"),
    ("stride", (10**9, 1), "reaches element 2000000003"),
    ("stride", (np.int64(4), np.int64(1)), "is not a tuple of integers"),
    ("stride", (4, -1), "is not a tuple of integers"),
    ("stride", (4,), "2 dimensions but 1 strides"),
    ("shape", (10**5, 10**5, 10**5), "3 dimensions but 2 strides"),
    ("shape", (4, 4), "reaches element 15"),
    ("shape", (2**62, 1), r"is not a tuple of integers in \[0, 281474976710656\]"),
])
def test_layout_is_checked_again_where_it_is_read(tmp_path, slot, value, message):
    """Defence in depth: a layout changed after the unpickler's check (here by going around the
    frozen attributes) is refused when the tensor is read, before any byte is, naming the file."""
    archive, tensor = _one_tensor_file(tmp_path, "layout.pt")
    np.testing.assert_array_equal(tensor.numpy(), np.arange(12, dtype=np.float32).reshape(3, 4) / 7)
    object.__setattr__(tensor, slot, value)
    with pytest.raises(CheckpointError, match=f"layout.pt.*{message}"):
        tensor.numpy()


@pytest.mark.parametrize("slot,value,message", [
    ("numel", 13, "claims 13 elements .52 bytes. but its member holds 48 bytes"),
    ("numel", 2**64 // 4, "claims 4,611,686,018,427,387,904 elements"),
    ("numel", np.int64(12), "has type torch.FloatStorage and 12 elements; the file is malformed"),
    ("type", "FloatStorage", "has type FloatStorage"),
    ("key", "1", "is not the member data/1"),
])
def test_storage_is_checked_again_where_it_is_read(tmp_path, slot, value, message):
    archive, tensor = _one_tensor_file(tmp_path, "storage.pt")
    object.__setattr__(tensor.storage, slot, value)
    with pytest.raises(CheckpointError, match=f"storage.pt.*{message}"):
        tensor.storage.read()


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


def test_torch_agrees_on_the_edge_files_and_refuses_the_tampered_layouts(tmp_path):
    """torch.load(weights_only=True), the reference: it reads the edge files to the same values
    and refuses a BUILD on a rebuilt tensor, whatever the layout it sets."""
    for name, path, expected in edge_torch_files(tmp_path / "edge"):
        reference = torch.load(path, weights_only=True)
        got = _read_all(path)
        for key, value in reference.items():
            value = value.float() if value.dtype == torch.bfloat16 else value
            np.testing.assert_array_equal(got[key], value.numpy(), err_msg=f"{name} {key}")
    tensor = _tensor("0", 12, (1, 3, 4), (12, 4, 1))
    for slot, slots in TAMPERED_LAYOUTS.items():
        path = tmp_path / f"{slot}.pt"
        path.write_bytes(torch_zip_bytes(state_pickle({"w": tensor + build(slots)}), {"0": bytes(48)}))
        with pytest.raises(Exception):
            torch.load(path, weights_only=True)
        with pytest.raises(CheckpointError, match=rf"{slot}.pt: its pickle sets the state \(BUILD\) of a TorchTensor"):
            _read_all(path)


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


def test_hand_written_axial_deeplab_file_reads_back(tmp_path):
    data, tree = axial_deeplab_sample()
    (tmp_path / "model.pth.tar").write_bytes(data)
    assert detect_format(tmp_path / "model.pth.tar").name == "axial_deeplab"
    got, config = read_checkpoint(tmp_path / "model.pth.tar")
    assert config["block_units"] == (1, 1, 1, 1) and config["image_size"] == (32, 32) and config["classes"] == 3
    _same_tree(got, tree)
