"""EfficientNet against timm's TF ports (`tf_efficientnet_*`, torch on CPU): parameter counts of
every constructor (timm's models on the meta device, the Keras models built without allocating
their weights), FLOPs against PyTorch's FLOP counter, logits through timm's own saved folders
(`save_for_hf`: model.safetensors / pytorch_model.bin + config.json) with random weights and
BatchNorm statistics at 224 px and at an odd, non-square size, the `.keras` round trip, the
preset table and the errors for checkpoints of other architectures.
"""

import contextlib
import json
import math
import os
import shutil
import sys

import keras
import numpy as np
import pytest
from conftest import randomize_torch_batch_norm, rel_err

import keras_vit
from keras_vit import CheckpointError
from keras_vit.models.efficientnet_family import EFFICIENTNET_ARCHITECTURES, params_of

sys.modules.setdefault("triton", None)  # see test_checkpoints: triton's LLVM and TensorFlow clash
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

#: Logits against timm's, relative to their largest magnitude: float32 rounding. Measured at
#: 224 px / 193x257 px: 5.6e-7 / 4.9e-7 (JAX), 4.3e-7 / 4.9e-7 (TensorFlow), 8.6e-7 / 1.3e-6
#: (PyTorch); the bound is about 10x the worst.
PARITY_BOUND = 1e-5


@contextlib.contextmanager
def shapes_only():
    """Build Keras models whose variables are never allocated (their shapes are all that is
    read); the variables are taken off Keras' list of pending initialisations afterwards."""
    from keras.src.backend.common import global_state

    before = list(global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True))
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        global_state.set_global_attribute("uninitialized_variables", before)


def _trainable_count(model):
    return sum(math.prod(v.shape) for v in model.trainable_weights)


# === Parameter counts and FLOPs ===


@pytest.mark.backend_independent  # graph construction only
def test_l2_builds_from_a_deep_caller():
    """L2's functional graph is about 1,050 layers deep, and Keras maps it by recursing once per
    layer: from a caller already 600 frames deep (a notebook, a test runner's thread) that passed
    Python's default limit of 1,000 frames. The model raises the limit while it builds, and
    restores it."""
    import sys

    limit = sys.getrecursionlimit()

    def build_at_depth(depth):
        if depth:
            return build_at_depth(depth - 1)
        with shapes_only():
            return keras_vit.EfficientNetL2(weights=None, input_shape=(64, 64, 3))

    model = build_at_depth(600)
    assert _trainable_count(model) == EFFICIENTNET_ARCHITECTURES["EfficientNetL2"].params
    assert sys.getrecursionlimit() == limit


@pytest.mark.backend_independent  # shapes only
@pytest.mark.parametrize("name", sorted(EFFICIENTNET_ARCHITECTURES))
def test_parameter_counts_equal_timm(name):
    arch = EFFICIENTNET_ARCHITECTURES[name]
    with torch.device("meta"):  # shapes only
        reference = timm.create_model(arch.timm_name, pretrained=False)
    expected = sum(p.numel() for p in reference.parameters() if p.requires_grad)
    assert arch.params == expected  # the table
    assert params_of(arch.width_multiplier, arch.depth_multiplier) == expected  # the family's count
    with shapes_only():
        model = getattr(keras_vit, name)(weights=None)
    assert _trainable_count(model) == expected  # the Keras model
    assert model.input_shape == (None, arch.resolution, arch.resolution, 3) and model.output_shape == (None, 1000)
    running = sum(b.numel() for n, b in reference.named_buffers() if n.endswith(("running_mean", "running_var")))
    assert sum(math.prod(v.shape) for v in model.non_trainable_weights) == running
    # timm's full-size state dict, mapped by the reader, is the Keras model's weight tree: same
    # keys, same shapes (nothing read: the tensors are on the meta device).
    from keras_vit.storage.lazy import LazyArray
    from keras_vit.checkpoints.timm_efficientnet import efficientnet_state_to_tree

    state = reference.state_dict()

    class Shapes:
        def lazy(self, key):
            return LazyArray(lambda: None, tuple(state[key].shape))

    tree = efficientnet_state_to_tree(dict.fromkeys(state, Shapes()))
    assert {k: tuple(v.shape) for k, v in tree.items()} == {
        k: tuple(v.shape) for k, v in model.weight_tree_variables().items()}
    if name == "EfficientNetL2":
        assert expected == 480_309_308


@pytest.mark.backend_independent
@pytest.mark.parametrize("name, size", [(n, None) for n in sorted(EFFICIENTNET_ARCHITECTURES)]
                         + [("EfficientNetB0", (193, 257))])
def test_flops_equal_torch_flop_counter(name, size):
    """keras_vit.flops' convention (one multiply-add = 2; convolutions, the squeeze-excitation's
    1x1 convolutions and the classifier), against PyTorch's own FLOP counter on timm's model at
    the architecture's resolution (shapes only, nothing computed)."""
    from torch.utils.flop_counter import FlopCounterMode

    arch = EFFICIENTNET_ARCHITECTURES[name]
    h, w = size or (arch.resolution, arch.resolution)
    with torch.device("meta"):
        reference = timm.create_model(arch.timm_name, pretrained=False).eval()
        with FlopCounterMode(display=False) as counter:
            reference(torch.empty(1, 3, h, w))
    assert keras_vit.flops(name, image_size=(h, w)) == counter.get_total_flops()


# === Logits through timm's saved folders ===


def _is_batch_norm_scale(name):
    return ".bn" in f".{name}" and name.endswith("weight")  # timm's bn1, bn2, bn3


def images(shape, seed=1):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def torch_logits(module, x):
    with torch.no_grad():
        return module(torch.from_numpy(x.transpose(0, 3, 1, 2))).numpy()


@pytest.fixture(scope="module")
def b0(tmp_path_factory):
    """timm's tf_efficientnet_b0 with random weights and statistics, saved by timm as its Hub
    layout with both weight files, and its logits at 224 px and 193x257 px."""
    from timm.models import save_for_hf

    torch.manual_seed(0)
    reference = randomize_torch_batch_norm(
        timm.create_model("tf_efficientnet_b0", pretrained=False), seed=3, is_batch_norm_scale=_is_batch_norm_scale
    )
    folder = tmp_path_factory.mktemp("effnet") / "tf_efficientnet_b0"
    save_for_hf(reference, folder, safe_serialization="both")
    inputs = {size: images((2, *size, 3)) for size in ((224, 224), (193, 257))}
    return dict(reference=reference, folder=folder, inputs=inputs,
                logits={size: torch_logits(reference, x) for size, x in inputs.items()})


@pytest.mark.parity
def test_logits_equal_timm_through_its_folder(b0, tmp_path):
    # The constructor with timm's folder as weights, at any size (None, None): 224 px and an odd,
    # non-square size, where TF "SAME" pads one pixel more at the bottom and right.
    model = keras_vit.EfficientNetB0(weights=str(b0["folder"]), input_shape=(None, None, 3),
                                     classifier_activation=None, dropout_rate=0.3)
    assert keras_vit.family_of(model).name == "efficientnet"
    assert model.dropout_rate == 0.3  # an override of the row's training default survives the load
    for size, x in b0["inputs"].items():
        err = rel_err(model.predict(x, verbose=0), b0["logits"][size])
        print(f"EfficientNet-B0 logits vs timm at {size}: relative error {err:.2e}")
        assert err < PARITY_BOUND, (size, err)

    # load_checkpoint at the folder's own size (pretrained_cfg.input_size), and the .keras round
    # trip of what it loaded (safe mode, no custom objects).
    loaded = keras_vit.load_checkpoint(b0["folder"])
    config = loaded.get_config()
    assert config["image_size"] == [224, 224] and config["width_multiplier"] == 1.0
    assert config["depth_multiplier"] == 1.0 and config["batch_norm_epsilon"] == 1e-3
    x, expected = b0["inputs"][(224, 224)], b0["logits"][(224, 224)]
    assert rel_err(loaded.predict(x, verbose=0), expected) < PARITY_BOUND
    # Written back as a timm folder, it is timm's state dict, and timm loads it (strictly).
    from keras_vit.checkpoints.timm_efficientnet import write_timm_efficientnet

    write_timm_efficientnet(loaded, tmp_path / "written")
    import safetensors.torch

    written = safetensors.torch.load_file(tmp_path / "written" / "model.safetensors")
    original = b0["reference"].state_dict()
    assert sorted(written) == sorted(original)
    for key, value in original.items():
        assert torch.equal(written[key], value), key
    again = timm.create_model("tf_efficientnet_b0", pretrained=True,
                              pretrained_cfg_overlay=dict(file=str(tmp_path / "written" / "model.safetensors")))
    np.testing.assert_array_equal(torch_logits(again.eval(), x), expected)
    assert json.loads((tmp_path / "written" / "config.json").read_text())["architecture"] == "tf_efficientnet_b0"

    loaded.save(tmp_path / "b0.keras")
    reloaded = keras.saving.load_model(tmp_path / "b0.keras")
    assert type(reloaded) is type(loaded) and reloaded.get_config() == loaded.get_config()
    assert rel_err(reloaded.predict(x, verbose=0), expected) < PARITY_BOUND


@pytest.mark.backend_independent  # the reader only
def test_every_file_layout_reads_the_same(b0, tmp_path):
    """The folder's safetensors, its pytorch_model.bin alone, a bare .safetensors and a bare
    torch.save state dict (no config.json: the architecture found from the shapes) give one tree
    and one config."""
    from keras_vit.checkpoints import detect_format, read_checkpoint

    folder = b0["folder"]
    only_bin = tmp_path / "bin"
    only_bin.mkdir()
    for name in ("pytorch_model.bin", "config.json"):
        shutil.copy(folder / name, only_bin / name)
    assert detect_format(folder).name == detect_format(only_bin).name == "timm_efficientnet"
    assert detect_format(folder / "model.safetensors").name == "timm_efficientnet"
    torch.save(b0["reference"].state_dict(), tmp_path / "b0.pth")  # a bare state dict (PyTorch zip)
    assert detect_format(tmp_path / "b0.pth").name == "timm_efficientnet"
    tree, config = read_checkpoint(folder)
    for other in (only_bin, folder / "model.safetensors", tmp_path / "b0.pth"):
        other_tree, other_config = read_checkpoint(other)
        assert other_config == config and sorted(other_tree) == sorted(tree)
        for key in tree:
            np.testing.assert_array_equal(other_tree[key], tree[key])
    # Layouts: PyTorch (out, in, kh, kw) -> (kh, kw, in, out); depthwise (C, 1, k, k) -> (k, k, C, 1).
    ref = b0["reference"]
    np.testing.assert_array_equal(tree["conv_stem/kernel"], ref.conv_stem.weight.detach().numpy().transpose(2, 3, 1, 0))
    np.testing.assert_array_equal(tree["blocks/2/1/conv_dw/kernel"],
                                  ref.blocks[2][1].conv_dw.weight.detach().numpy().transpose(2, 3, 0, 1))
    np.testing.assert_array_equal(tree["blocks/0/0/se/conv_reduce/bias"], ref.blocks[0][0].se.conv_reduce.bias.detach())
    np.testing.assert_array_equal(tree["bn2/moving_variance"], ref.bn2.running_var.numpy())
    np.testing.assert_array_equal(tree["classifier/kernel"], ref.classifier.weight.detach().numpy().T)


@pytest.mark.backend_independent  # shapes only
def test_drop_path_and_dropout_rates_follow_timm():
    """Stochastic depth as timm's `drop_path_rate` spreads it (block i of n: rate * i / n, only on
    blocks that add their input back); the classifier dropout the original trains B2 with."""
    with torch.device("meta"):
        reference = timm.create_model("tf_efficientnet_b2", pretrained=False, drop_path_rate=0.2)
    expected = {f"blocks_{i}_{j}_drop_path": block.drop_path.drop_prob
                for i, stage in enumerate(reference.blocks) for j, block in enumerate(stage) if block.has_skip}
    with shapes_only():
        model = keras_vit.EfficientNetB2(weights=None)
    got = {layer.name: layer.rate for layer in model.layers if layer.name.endswith("drop_path")}
    assert sorted(got) == sorted(expected) and len(got) == 16
    for name, rate in expected.items():
        assert got[name] == pytest.approx(rate, abs=1e-12), name
    assert model.get_layer("dropout").rate == 0.3


# === Presets and refused checkpoints ===


@pytest.mark.backend_independent
def test_presets_resolve_to_timms_noisy_student_repos():
    from keras_vit.presets import find_preset, preset_by_name

    for name, arch in EFFICIENTNET_ARCHITECTURES.items():
        preset = find_preset(name, "ns_jft_in1k")
        assert preset.repo == f"timm/{arch.timm_name}.ns_jft_in1k" and preset.classes == 1000
        assert preset.resolution == arch.resolution
        assert find_preset(name, "imagenet") == preset  # the best ImageNet-1k weights
    l2_475 = find_preset("EfficientNetL2", "ns_jft_in1k_475")
    assert (l2_475.repo, l2_475.resolution) == ("timm/tf_efficientnet_l2.ns_jft_in1k_475", 475)
    assert find_preset("EfficientNetL2", "imagenet").resolution == 800  # 88.35% over 88.23%
    assert preset_by_name("tf_efficientnet_b3.ns_jft_in1k").architecture == "EfficientNetB3"
    assert preset_by_name("EfficientNetL2.ns_jft_in1k_475") == l2_475
    with pytest.raises(ValueError, match="Did you mean 'ns_jft_in1k'.*Valid: None, imagenet, ns_jft_in1k, ns_jft_in1k_475,"):
        find_preset("EfficientNetL2", "ns_jft")
    # no ImageNet-21k weights exist for EfficientNet: the alias is refused as such, and not offered
    with pytest.raises(ValueError, match="No ImageNet-21k weights are published for EfficientNetL2.*Valid: None, imagenet, ns_jft"):
        find_preset("EfficientNetL2", "imagenet21k")
    # timm's own table says the same (repos, sizes, crop and normalisation)
    for preset in (p for p in keras_vit.list_presets() if p.architecture.startswith("EfficientNet")):
        cfg = timm.models.get_pretrained_cfg(preset.repo.split("/", 1)[1])
        assert cfg.hf_hub_id == preset.repo and tuple(cfg.input_size) == (3, preset.resolution, preset.resolution)
        from keras_vit.models.efficientnet_family import preprocessing

        assert preprocessing(preset.repo) == dict(mean=cfg.mean, std=cfg.std, interpolation=cfg.interpolation,
                                                  crop_pct=cfg.crop_pct)


def test_checkpoints_of_other_architectures_are_refused(b0, tmp_path):
    # An EfficientNet-B0 file given to the B1 constructor names both architectures.
    with pytest.raises(ValueError, match=r"different architecture \(EfficientNet-B0 \(width x1, depth x1\)\) than "
                                         r"EfficientNetB1 \(EfficientNet-B1 \(width x1, depth x1.1\)\)"):
        keras_vit.EfficientNetB1(weights=str(b0["folder"]))
    # A config.json that names another architecture than the weights hold.
    lying = tmp_path / "lying"
    shutil.copytree(b0["folder"], lying)
    config = json.loads((lying / "config.json").read_text())
    (lying / "config.json").write_text(json.dumps(dict(config, architecture="tf_efficientnet_b2")))
    with pytest.raises(CheckpointError, match=r"not those of timm's tf_efficientnet_b2 \(stem 32, blocks per stage "
                                              r"\(2, 3, 3, 4, 4, 5, 2\), head 1408; the file: stem 32, blocks per stage "
                                              r"\(1, 2, 2, 3, 3, 4, 1\), head 1280\): missing weights "
                                              r"blocks/0/1/bn1/beta.*shape mismatches blocks/2/0/conv_pwl/kernel "
                                              r"\(1, 1, 144, 40\) \(expected \(1, 1, 144, 48\)\)"):
        keras_vit.load_checkpoint(lying)
    # timm's PyTorch-native EfficientNet pads and normalises otherwise: refused by name.
    (lying / "config.json").write_text(json.dumps(dict(config, architecture="efficientnet_b0")))
    with pytest.raises(CheckpointError, match=r"'efficientnet_b0' is timm's PyTorch-native EfficientNet"):
        keras_vit.load_checkpoint(lying)
    # timm builds its EfficientNets by name: other multipliers cannot be written as a timm folder.
    from keras_vit.checkpoints.timm_efficientnet import write_timm_efficientnet

    tiny = keras_vit.models.EfficientNet(image_size=32, width_multiplier=0.25, depth_multiplier=0.3, classes=3)
    with pytest.raises(ValueError, match=r"timm builds its EfficientNets by name .*Save them as a \.keras file"):
        write_timm_efficientnet(tiny, tmp_path / "tiny")
    # A ViT checkpoint for an EfficientNet constructor, and the other way round.
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=5, depth=1)
    from timm.models import save_for_hf

    save_for_hf(vit, tmp_path / "vit", safe_serialization=True, model_args=dict(img_size=32, num_classes=5, depth=1))
    with pytest.raises(ValueError, match=r"different architecture \(hidden 192, 1 layers.*than EfficientNetB0"):
        keras_vit.EfficientNetB0(weights=str(tmp_path / "vit"))
    with pytest.raises(ValueError, match=r"different architecture \(EfficientNet-B0 .*than ViTTi16"):
        keras_vit.ViTTi16(weights=str(b0["folder"]))


@pytest.mark.backend_independent  # the reader only
def test_a_bare_file_with_wrong_tensors_names_them(b0, tmp_path):
    """A bare timm state dict (no config.json: the architecture is found from the shapes) with a
    tensor removed, added or of another shape: the error names the nearest architecture and the
    tensors that do not fit it, not only that no multipliers match."""
    from safetensors.numpy import save_file

    state = {k: v.numpy() for k, v in b0["reference"].state_dict().items()}
    cases = [
        ("missing", lambda s: s.pop("blocks.2.1.bn1.weight"), r"missing weights blocks/2/1/bn1/gamma\."),
        ("extra", lambda s: s.update({"blocks.1.0.extra.bias": np.zeros(3, np.float32)}),
         r"unexpected weights blocks/1/0/extra/bias\."),
        ("shape", lambda s: s.update({"bn2.weight": np.ones(640, np.float32)}),
         r"shape mismatches bn2/gamma \(640,\) \(expected \(1280,\)\)\."),
    ]
    for name, edit, message in cases:
        edited = dict(state)
        edit(edited)
        save_file(edited, str(tmp_path / f"{name}.safetensors"))
        with pytest.raises(CheckpointError, match=rf"{name}.safetensors: the weights are not those of the EfficientNet "
                                                  rf"whose stem and blocks per stage it has \(nearest: width x1, depth "
                                                  rf"x1\): {message} The file is incomplete or altered"):
            keras_vit.read_checkpoint(tmp_path / f"{name}.safetensors")
