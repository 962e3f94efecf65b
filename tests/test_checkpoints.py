"""Checkpoint readers and writers against the real upstream libraries.

Random timm and transformers models are saved with those libraries' own savers (timm's
save_for_hf, transformers' save_pretrained), read by keras_vit, and their logits compared with
the upstream torch forward on the same images (NCHW there, NHWC here, values in [-1, 1]). Our
.npz writer is checked by timm's own .npz loader. Numerics: relative error of logits < 2e-5.

Sizes: vit_tiny_patch16_224 runs at full size; the gap model is timm's vit_base_patch16_gap_224
built with embed_dim=64, depth=2, img_size=64 (its 16 heads still come from timm's definition, as
config.json then only records the overrides); the hybrids vit_tiny_r_s16_p8_224 and
vit_small_r26_s32_224 keep their full ResNets with depth=2 and a small image size.
"""

import json
import os
import shutil
import sys

import keras
import numpy as np
import pytest
from conftest import TINY, TINY_HYBRID, randomize, rel_err
from reference_numpy import vit_forward

import keras_vit
from keras_vit import CheckpointError, build_model, read_checkpoint, write_npz
from keras_vit.models.weight_tree import WeightTreeError

# TensorFlow and triton's bundled LLVM clash in one process (a segfault when triton loads after
# TensorFlow); the torch references here run on CPU and never need triton.
sys.modules.setdefault("triton", None)
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")


def images(shape, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype("float32")


def randomize_torch(module, seed=0):
    """Random values everywhere: norms around 1, biases, cls and position embeddings non-zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1 and "norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.ndim > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
    return module.eval()


def torch_forward(module, x, **kwargs):
    with torch.no_grad():
        out = module(torch.from_numpy(x.transpose(0, 3, 1, 2)).contiguous(), **kwargs)
    return out


def save_timm(arch, folder, seed=0, **kwargs):
    from timm.models._hub import save_for_hf

    model = randomize_torch(timm.create_model(arch, pretrained=False, **kwargs), seed)
    save_for_hf(model, folder, safe_serialization=True)
    return model


# === timm ===


@pytest.mark.slow
def test_timm_vit_tiny_full_size(tmp_path):
    ref_model = save_timm("vit_tiny_patch16_224", tmp_path / "timm")
    tree, config = read_checkpoint(tmp_path / "timm")
    assert config["num_heads"] == 3 and config["image_size"] == (224, 224) and config["classes"] == 1000
    assert config["gelu_approximate"] is False and config["position_embedding_resize"] == "bicubic_antialias"
    x = images((2, 224, 224, 3))
    model = keras_vit.load_checkpoint(tmp_path / "timm")
    assert rel_err(model.predict(x, verbose=0), torch_forward(ref_model, x).numpy()) < 2e-5

    # A bare .safetensors (no config.json): heads from the architecture table row matching the shapes.
    shutil.copy(tmp_path / "timm" / "model.safetensors", tmp_path / "bare.safetensors")
    bare_tree, bare_config = read_checkpoint(tmp_path / "bare.safetensors")
    assert bare_config == config
    assert all(np.array_equal(bare_tree[k], tree[k]) for k in tree)


def test_timm_gap_model_heads_from_timm_definition(tmp_path):
    ref_model = save_timm("vit_base_patch16_gap_224", tmp_path / "gap", embed_dim=64, depth=2, img_size=64)
    tree, config = read_checkpoint(tmp_path / "gap")
    assert "cls" not in tree and config["classifier"] == "gap" and config["num_heads"] == 16
    x = images((2, 64, 64, 3))
    model = build_model(tree, config)
    assert rel_err(model.predict(x, verbose=0), torch_forward(ref_model, x).numpy()) < 2e-5
    features = build_model(tree, config, include_top=False, pooling="gap")
    with torch.no_grad():
        ref = ref_model.forward_head(ref_model.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2)).contiguous()), pre_logits=True)
    assert rel_err(features.predict(x, verbose=0), ref.numpy()) < 2e-5

    # Without config.json the shapes match no table row (shrunk model): a clear error, no guess.
    shutil.copy(tmp_path / "gap" / "model.safetensors", tmp_path / "gap.safetensors")
    with pytest.raises(CheckpointError, match="number of attention heads"):
        read_checkpoint(tmp_path / "gap.safetensors")


@pytest.mark.parametrize(
    "arch,size,resnet",
    [
        ("vit_tiny_r_s16_p8_224", 64, ((), 1)),
        pytest.param("vit_small_r26_s32_224", 64, ((2, 2, 2, 2), 1), marks=[pytest.mark.slow, pytest.mark.parity]),
    ],
)
def test_timm_hybrids(tmp_path, arch, size, resnet):
    ref_model = save_timm(arch, tmp_path / arch, depth=2, img_size=size)
    tree, config = read_checkpoint(tmp_path / arch)
    assert config["resnet"] == resnet and config["image_size"] == (size, size)
    assert config["group_norm_epsilon"] == 1e-5 and config["std_conv_epsilon_inside_sqrt"] is True
    x = images((2, size, size, 3), seed=2)
    model = build_model(tree, config)
    assert rel_err(model.predict(x, verbose=0), torch_forward(ref_model, x).numpy()) < 2e-5


def test_timm_load_at_new_resolution_matches_timm_resample(tmp_path):
    from timm.models.vision_transformer import checkpoint_filter_fn

    save_timm("vit_tiny_patch16_224", tmp_path / "t", depth=2, img_size=64)
    state = {k: torch.from_numpy(v.copy()) for k, v in _timm_state(tmp_path / "t").items()}
    for new_size in [(96, 64), 48]:
        ref_model = timm.create_model("vit_tiny_patch16_224", pretrained=False, depth=2, img_size=new_size).eval()
        ref_model.load_state_dict(checkpoint_filter_fn(dict(state), ref_model))
        hw = (new_size, new_size) if isinstance(new_size, int) else new_size
        x = images((2, *hw, 3), seed=3)
        model = keras_vit.load_checkpoint(tmp_path / "t", image_size=new_size)
        assert model.grid_size == (hw[0] // 16, hw[1] // 16)
        assert rel_err(model.predict(x, verbose=0), torch_forward(ref_model, x).numpy()) < 2e-5


def _timm_state(folder):
    from safetensors.numpy import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


# === transformers ===


def _hf_config(**overrides):
    from transformers import ViTConfig

    kw = dict(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, image_size=32,
        patch_size=8, num_labels=5,
    )
    kw.update(overrides)
    return ViTConfig(**kw)


def test_transformers_image_classification(tmp_path):
    from transformers import ViTForImageClassification

    ref_model = randomize_torch(ViTForImageClassification(_hf_config()), seed=4)
    ref_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    tree, config = read_checkpoint(tmp_path / "hf")
    assert config["layer_norm_epsilon"] == 1e-12 and config["num_heads"] == 4 and config["classes"] == 5
    x = images((2, 32, 32, 3), seed=5)
    model = build_model(tree, config)
    ref = torch_forward(ref_model, x).logits.numpy()
    assert rel_err(model.predict(x, verbose=0), ref) < 2e-5

    # Another resolution: transformers' interpolate_pos_encoding (bicubic, align_corners=False).
    x = images((2, 48, 40, 3), seed=6)
    model = keras_vit.load_checkpoint(tmp_path / "hf", image_size=(48, 40))
    ref = torch_forward(ref_model, x, interpolate_pos_encoding=True).logits.numpy()
    assert rel_err(model.predict(x, verbose=0), ref) < 2e-5


def test_transformers_vit_model_pooler_is_pre_logits(tmp_path):
    from transformers import ViTModel

    ref_model = randomize_torch(ViTModel(_hf_config(layer_norm_eps=1e-6, hidden_act="gelu_new")), seed=7)
    ref_model.save_pretrained(tmp_path / "hf", safe_serialization=True)
    tree, config = read_checkpoint(tmp_path / "hf")
    assert config["representation_size"] == 48 and config["classes"] is None
    assert config["gelu_approximate"] is True and config["layer_norm_epsilon"] == 1e-6
    x = images((2, 32, 32, 3), seed=8)
    ref = torch_forward(ref_model, x)
    tokens = build_model(tree, config, include_top=False)
    assert rel_err(tokens.predict(x, verbose=0), ref.last_hidden_state.numpy()) < 2e-5
    pooled = build_model(tree, config, include_top=False, pooling="token")
    assert rel_err(pooled.predict(x, verbose=0), ref.pooler_output.numpy()) < 2e-5
    with pytest.raises(ValueError, match="no classification head"):
        build_model(tree, config)
    # A new head on top of pre_logits starts at zero.
    fresh = build_model(tree, config, classes=3)
    assert np.all(fresh.predict(x, verbose=0) == 0)
    np.testing.assert_array_equal(fresh.get_layer("pre_logits").kernel.numpy(), tree["pre_logits/kernel"])


# === Original .npz ===


@pytest.mark.parametrize("arch,size", [("vit_tiny_patch16_224", 64), ("vit_tiny_r_s16_p8_224", 64)])
def test_npz_writer_read_by_timm_npz_loader(tmp_path, arch, size):
    save_timm(arch, tmp_path / "src", depth=2, img_size=size, seed=9)
    tree, config = read_checkpoint(tmp_path / "src")
    write_npz(tree, tmp_path / "w.npz", prefix="opt/target/", group_norm_shape="legacy")
    # timm's own .npz loader, into a model with different random weights; then again at another
    # resolution, which timm's .npz loader resamples bilinearly.
    for new_size, rule in [(size, None), (size + 32, "bilinear")]:
        ref_model = randomize_torch(timm.create_model(arch, pretrained=False, depth=2, img_size=new_size), seed=10)
        ref_model.load_pretrained(str(tmp_path / "w.npz"))
        x = images((2, new_size, new_size, 3), seed=11)
        cfg = dict(config, position_embedding_resize=rule or config["position_embedding_resize"])
        model = build_model(tree, cfg, image_size=new_size)
        assert rel_err(model.predict(x, verbose=0), torch_forward(ref_model, x).numpy()) < 2e-5


def test_npz_original_layout_round_trip_and_numerics(tmp_path):
    import scipy.ndimage

    model = keras_vit.VisionTransformer(**TINY_HYBRID, representation_size=12)
    randomize(model, seed=12)
    write_npz(model, tmp_path / "h.npz", prefix="opt/target/", group_norm_shape="legacy")
    with np.load(tmp_path / "h.npz") as f:
        assert f["opt/target/gn_root/scale"].shape == (1, 1, 1, 32)
    tree, config = read_checkpoint(tmp_path / "h.npz")
    expected = keras_vit.get_weight_tree(model)
    assert sorted(tree) == sorted(expected) and all(np.array_equal(tree[k], expected[k]) for k in tree)
    assert config["resnet"] == ((1, 1), 0.5) and config["num_heads"] == 2 and config["representation_size"] == 12
    assert config["gelu_approximate"] is True and config["std_conv_epsilon_inside_sqrt"] is False

    # Loaded at 96x96 with the original rule, compared with the independent NumPy forward on a
    # tree whose position embedding scipy.ndimage.zoom(order=1) resized, as the original code does.
    x = images((2, 96, 96, 3), seed=13)
    out = keras_vit.load_checkpoint(tmp_path / "h.npz", image_size=96).predict(x, verbose=0)
    pe = tree["Transformer/posembed_input/pos_embedding"]  # 8x8 grid (stride 8) -> 12x12
    grid = scipy.ndimage.zoom(pe[0, 1:].reshape(8, 8, -1), (12 / 8, 12 / 8, 1), order=1)
    ref_tree = dict(tree)
    ref_tree["Transformer/posembed_input/pos_embedding"] = np.concatenate([pe[:, :1], grid.reshape(1, 144, -1)], 1)
    ref = vit_forward(ref_tree, x, patch_size=1, num_layers=2, resnet_units=(1, 1), width_factor=0.5)
    assert rel_err(out, ref) < 2e-5


# === Keras formats ===


def test_keras_preset_keras_file_and_weights_h5(tmp_path):
    model = keras_vit.VisionTransformer(**{**TINY, "image_size": (32, 40)}, classifier="gap", classifier_activation=None)
    randomize(model, seed=14)
    x = images((2, 32, 40, 3), seed=15)
    expected = model.predict(x, verbose=0)
    keras_vit.save_preset(model, tmp_path / "preset", metadata={"source": "random", "license": "apache-2.0"})
    names = sorted(os.listdir(tmp_path / "preset"))
    assert names == ["README.md", "config.json", "metadata.json", "model.weights.h5"]
    meta = json.loads((tmp_path / "preset" / "metadata.json").read_text())
    assert meta["source"] == "random" and meta["parameter_count"] == model.count_params()
    assert "apache-2.0" in (tmp_path / "preset" / "README.md").read_text()
    loaded = keras_vit.load_checkpoint(tmp_path / "preset")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, rtol=1e-6, atol=1e-6)
    assert loaded.image_size == (32, 40)

    model.save(tmp_path / "m.keras")
    np.testing.assert_allclose(
        keras_vit.load_checkpoint(tmp_path / "m.keras").predict(x, verbose=0), expected, rtol=1e-6, atol=1e-6
    )
    os.makedirs(tmp_path / "w")
    model.save_weights(tmp_path / "w" / "vit.weights.h5")
    with pytest.raises(CheckpointError, match="config.json"):
        read_checkpoint(tmp_path / "w" / "vit.weights.h5")
    shutil.copy(tmp_path / "preset" / "config.json", tmp_path / "w" / "config.json")
    tree, config = read_checkpoint(tmp_path / "w" / "vit.weights.h5")
    assert config["image_size"] == (32, 40) and config["classifier"] == "gap"

    # Non-square source grid (4, 5) resized to (6, 6); without the top the features come out.
    features = build_model(tree, config, include_top=False, pooling="gap", image_size=48)
    assert features.output_shape == (None, 24)


# === Errors ===


def test_errors_truncated_corrupt_unknown_and_pickle(tmp_path):
    model = keras_vit.VisionTransformer(**TINY)
    write_npz(model, tmp_path / "ok.npz")
    data = (tmp_path / "ok.npz").read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="cut.npz.*truncated or corrupt.*download or convert it again"):
        read_checkpoint(tmp_path / "cut.npz")

    save_timm("vit_tiny_patch16_224", tmp_path / "t", depth=1, img_size=32)
    st = (tmp_path / "t" / "model.safetensors").read_bytes()
    (tmp_path / "t" / "model.safetensors").write_bytes(st[:-100])
    with pytest.raises(CheckpointError, match="model.safetensors.*truncated or corrupt"):
        keras_vit.load_checkpoint(tmp_path / "t")
    (tmp_path / "t" / "model.safetensors").write_bytes(b"\xff" * 8 + st[8:])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_checkpoint(tmp_path / "t")

    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(CheckpointError, match="Unknown checkpoint format"):
        read_checkpoint(tmp_path / "notes.txt")
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x02")
    with pytest.raises(CheckpointError, match="never unpickles"):
        read_checkpoint(tmp_path / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        keras_vit.load_checkpoint(str(tmp_path / "missing.npz"))


def test_errors_missing_unexpected_and_mismatched_weights(tmp_path):
    from safetensors.numpy import save_file

    save_timm("vit_tiny_patch16_224", tmp_path / "t", depth=1, img_size=32)
    state = _timm_state(tmp_path / "t")
    for name, edit, message in [
        ("missing", lambda s: s.pop("blocks.0.norm2.bias"), "missing weight 'blocks.0.norm2.bias'"),
        ("unexpected", lambda s: s.update({"blocks.0.ls1.gamma": np.ones(192, "float32")}), "unexpected weights blocks.0.ls1.gamma"),
    ]:
        folder = tmp_path / name
        shutil.copytree(tmp_path / "t", folder)
        edited = dict(state)
        edit(edited)
        save_file(edited, str(folder / "model.safetensors"))
        with pytest.raises(CheckpointError, match=message):
            read_checkpoint(folder)

    # A tree that does not fit a given model: nothing is assigned.
    model = keras_vit.VisionTransformer(**TINY)
    randomize(model, seed=16)
    before = keras_vit.get_weight_tree(model)
    tree = dict(before)
    tree["Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias"] = np.zeros(49, "float32")
    tree.pop("Transformer/encoder_norm/bias")
    tree["extra/kernel"] = np.zeros(3, "float32")
    tree = {k: (v + 1.0) for k, v in tree.items()}
    with pytest.raises(WeightTreeError) as info:
        keras_vit.set_weight_tree(model, tree)
    message = str(info.value)
    assert "missing weights: Transformer/encoder_norm/bias" in message
    assert "unexpected weights: extra/kernel" in message
    assert "shape mismatch for Transformer/encoderblock_1/MlpBlock_3/Dense_0/bias" in message
    after = keras_vit.get_weight_tree(model)
    assert all(np.array_equal(before[k], after[k]) for k in before)

    # A Keras preset whose weights do not fit its config.json.
    keras_vit.save_preset(model, tmp_path / "p")
    config = json.loads((tmp_path / "p" / "config.json").read_text())
    (tmp_path / "p" / "config.json").write_text(json.dumps(dict(config, mlp_dim=50)))
    with pytest.raises(CheckpointError, match="do not fit its config.json"):
        read_checkpoint(tmp_path / "p")


def test_timm_heads_from_model_args_and_bf16_weights(tmp_path):
    from safetensors.torch import save_file

    ref_model = save_timm("vit_tiny_patch16_224", tmp_path / "t", embed_dim=64, num_heads=4, depth=1, img_size=32)
    tree, config = read_checkpoint(tmp_path / "t")
    assert config["num_heads"] == 4 and config["hidden_size"] == 64 and config["num_layers"] == 1
    assert tree["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"].shape == (64, 4, 16)

    # bfloat16 tensors (numpy has no bfloat16) are widened exactly to float32.
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in ref_model.state_dict().items()}
    save_file(state, str(tmp_path / "t" / "model.safetensors"))
    tree16, _ = read_checkpoint(tmp_path / "t")
    expected = state["blocks.0.attn.proj.weight"].float().numpy().T.reshape(4, 16, 64)
    np.testing.assert_array_equal(tree16["Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/kernel"], expected)


def test_loading_builds_without_random_init_and_stays_strict(tmp_path):
    """Checkpoint loading builds inside skip_random_init (zero-filled variables instead of random
    draws: on JAX each variable shape would compile a random program); every weight is then
    assigned, and a tree missing one is still refused before anything is assigned."""
    from keras_vit.layers.init_scope import HostRandom, initializer, skip_random_init

    with skip_random_init():
        assert initializer("glorot_uniform") == "zeros"
        zero = keras_vit.VisionTransformer(**TINY_HYBRID, representation_size=12)
    outside = initializer("glorot_uniform")  # the initialiser itself; on JAX drawn on the host
    if keras.backend.backend() == "jax":
        assert isinstance(outside, HostRandom) and isinstance(outside.initializer, keras.initializers.GlorotUniform)
    else:
        assert outside == "glorot_uniform"
    # Norm scales start at their fixed one (or BiT's zero for a unit's last GroupNorm) either way;
    # everything else is zero inside the scope.
    values = {v.path: np.asarray(v) for v in zero.weights}
    scales = [p for p in values if p.endswith(("gamma", "scale"))]
    assert scales and all(set(np.unique(values[p])) <= {0.0, 1.0} for p in scales)
    assert all(not np.any(values[p]) for p in values if p not in scales)
    # Outside the scope the same model draws random kernels and position embeddings.
    fresh = keras_vit.VisionTransformer(**TINY_HYBRID, representation_size=12)
    drawn = [v.path for v in fresh.weights if np.any(np.asarray(v)) and not v.path.endswith(("gamma", "scale"))]
    assert any("pos_embedding" in p for p in drawn) and any("query_kernel" in p for p in drawn)
    assert any("conv_root" in p for p in drawn) and any("pre_logits" in p for p in drawn)

    # A load gives exactly the saved weights and the independent NumPy forward pass.
    model = randomize(keras_vit.VisionTransformer(**TINY_HYBRID, representation_size=12), seed=21)
    write_npz(model, tmp_path / "h.npz")
    loaded = keras_vit.load_checkpoint(tmp_path / "h.npz")
    expected, got = keras_vit.get_weight_tree(model), keras_vit.get_weight_tree(loaded)
    assert sorted(expected) == sorted(got) and all(np.array_equal(expected[k], got[k]) for k in expected)
    x = images((2, 64, 64, 3), seed=22)
    ref = vit_forward(expected, x, patch_size=1, num_layers=2, resnet_units=(1, 1), width_factor=0.5)
    assert rel_err(loaded.predict(x, verbose=0), ref) < 2e-5

    # A checkpoint lacking a weight: refused (not silently left at zero).
    with np.load(tmp_path / "h.npz") as f:
        partial = {k: f[k] for k in f.files if not k.endswith("encoderblock_1/LayerNorm_2/bias")}
    assert len(partial) == len(expected) - 1
    np.savez(tmp_path / "partial.npz", **partial)
    with pytest.raises(WeightTreeError, match="missing weights: .*encoderblock_1/LayerNorm_2/bias"):
        keras_vit.load_checkpoint(tmp_path / "partial.npz")


def test_a_loaded_model_owns_its_weights(tmp_path):
    # On JAX the float32 tensors are copied from a memory map of the file; the model must hold
    # copies of its own: overwriting the file in place afterwards changes nothing, also in training.
    save_timm("vit_tiny_patch16_224", tmp_path / "t", depth=1, img_size=32, num_classes=5)
    model = keras_vit.load_checkpoint(tmp_path / "t", classifier_activation=None)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    before = model.predict(x, verbose=0)
    path = tmp_path / "t" / "model.safetensors"
    data = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(data[:8], "little")
    with open(path, "r+b") as f:  # in place: the same inode, as a memory map would see it
        f.seek(header)
        f.write(b"\x00" * (len(data) - header))
    np.testing.assert_array_equal(model.predict(x, verbose=0), before)
    model.compile(optimizer="sgd", loss=keras_vit.training.classification_loss(from_logits=True))
    model.fit(x, np.eye(5, dtype="float32")[[0, 1]], epochs=1, verbose=0)  # updates in place where allowed
    assert np.all(np.isfinite(model.predict(x, verbose=0)))
