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
    _code_pickles,
    axial_deeplab_sample,
    hostile_torch_files,
    torch_zip_bytes,
    valid_state_file,
)

from keras_vit import CheckpointError, read_checkpoint
from keras_vit.checkpoints.registry import detect_format
from keras_vit.checkpoints.torch_zip import TorchStateFile, TorchZipFile

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


def test_hand_written_axial_deeplab_file_reads_back(tmp_path):
    data, tree = axial_deeplab_sample()
    (tmp_path / "model.pth.tar").write_bytes(data)
    assert detect_format(tmp_path / "model.pth.tar").name == "axial_deeplab"
    got, config = read_checkpoint(tmp_path / "model.pth.tar")
    assert config["block_units"] == (1, 1, 1, 1) and config["image_size"] == (32, 32) and config["classes"] == 3
    _same_tree(got, tree)
