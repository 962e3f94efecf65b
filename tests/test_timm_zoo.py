"""timm's ViT zoo (vision_transformer.py and deit.py) read through `keras_vit.load_checkpoint`.

Each case is a random-weight timm model at a tiny size, saved exactly as timm saves a Hub repo
(`save_for_hf`: config.json with architecture, model_args and pretrained_cfg, plus
model.safetensors), one per feature of the zoo: DeiT (token), DeiT distilled (two heads
averaged), DeiT-III (layer scale, no_embed_class), DINOv2 S/14 with and without registers, DINOv2
giant (SwiGLU packed), CLIP B/32 (pre-norm, no patch bias, eps 1e-5) and its QuickGELU form,
TinyCLIP, SigLIP B/16 MAP and GAP (tanh-GELU), SO150M reg4 MAP (MAP past register tokens), medium GAP 256 (fc_norm), little / betwixt reg4 GAP,
FlexiViT-S, AIMv2 (RmsNorm, SwiGLU, no qkv/proj bias), the qkv-bias-free vit_*_gap models,
the residual post-norm ViT (ResPostBlock), BEiT-3 (sub-LNs in attention and MLP) and test_vit3 (a
MAP head over the register token too), and the parallel ViT (ParallelScalingBlock: attention
and MLP on one norm, with and without qkv biases), and differential attention in plain and parallel
blocks (vit_dwee, vit_dpwee: lambda_init per block, the fused out projection), q/k norm in plain
and parallel blocks (the ViT-22B-style vit_*_xp with RmsNorm), and test_vit4 (RmsNorm named without
eps: timm's default 1e-6).
Logits (or, for headless models, the pooled pre-logits features) equal timm's within
max(2e-5, twice timm's own float32 error against float64), relative to the output's scale.
"""

import sys

import numpy as np
import pytest

import keras_vit

sys.modules.setdefault("triton", None)
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

from keras_vit.checkpoints.timm import timm_architecture, timm_variant, timm_vit_table  # noqa: E402
from keras_vit.models.vit_family import ViTConfig  # noqa: E402

# (case, timm architecture, create_model overrides: tiny sizes, depth 2)
CASES = [
    ("deit_small", "deit_small_patch16_224", dict(img_size=32)),
    ("deit_small_distilled", "deit_small_distilled_patch16_224", dict(img_size=32)),
    ("deit3_small", "deit3_small_patch16_224", dict(img_size=32)),
    ("dinov2_small", "vit_small_patch14_dinov2", dict(img_size=28)),
    ("dinov2_small_reg4", "vit_small_patch14_reg4_dinov2", dict(img_size=28)),
    ("dinov2_giant_swiglu", "vit_giant_patch14_dinov2", dict(img_size=28, embed_dim=96, num_heads=4)),
    ("clip_b32", "vit_base_patch32_clip_224", dict(img_size=64, embed_dim=64, num_heads=4)),
    ("clip_b32_quickgelu", "vit_base_patch32_clip_quickgelu_224", dict(img_size=64, embed_dim=64, num_heads=4)),
    ("tinyclip_xsmall", "vit_xsmall_patch16_clip_224", dict(img_size=32)),
    ("siglip_b16_map", "vit_base_patch16_siglip_224", dict(img_size=32, embed_dim=64, num_heads=4)),
    ("siglip_b16_gap", "vit_base_patch16_siglip_gap_224", dict(img_size=32, embed_dim=64, num_heads=4)),
    ("so150m_reg4_map", "vit_so150m_patch16_reg4_map_256", dict(img_size=32, embed_dim=64, num_heads=4)),
    ("medium_gap_256", "vit_medium_patch16_gap_256", dict(img_size=32)),
    ("little_reg4_gap", "vit_little_patch16_reg4_gap_256", dict(img_size=32)),
    ("betwixt_reg4_gap", "vit_betwixt_patch16_reg4_gap_256", dict(img_size=32)),
    ("flexivit_small", "flexivit_small", dict(img_size=32)),
    ("aimv2_large", "aimv2_large_patch14_224", dict(img_size=28, embed_dim=64, num_heads=4)),
    ("res_post_norm", "vit_base_patch16_rpn_224", dict(img_size=32, embed_dim=64, num_heads=4)),
    ("beit3_sub_ln", "beit3_base_patch16_224", dict(img_size=32, embed_dim=64, num_heads=4)),
    ("map_over_prefix", "test_vit3", dict(img_size=32)),
    ("parallel_scaling", "vit_pwee_patch16_reg1_gap_256", dict(img_size=32, embed_dim=64)),
    ("parallel_scaling_no_qkv_bias", "vit_pwee_patch16_reg1_gap_256", dict(img_size=32, embed_dim=64, qkv_bias=False)),
    ("differential", "vit_dwee_patch16_reg1_gap_256", dict(img_size=32, embed_dim=64, depth=3)),
    ("differential_parallel", "vit_dpwee_patch16_reg1_gap_256", dict(img_size=32, embed_dim=64, depth=3)),
    ("qk_norm", "vit_base_patch16_224", dict(img_size=32, embed_dim=64, num_heads=4, qk_norm=True)),
    ("parallel_qk_norm_rms", "vit_base_patch16_xp_224", dict(img_size=32, embed_dim=64, num_heads=4)),
    ("rms_norm_default_eps", "test_vit4", dict(img_size=32)),
]


def randomize_torch(module, seed=0):
    """Random values everywhere: norm scales around 1, biases, tokens, layer scales and position
    embeddings non-zero."""
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


def _timm_outputs(model, x):
    """timm's logits (pooled pre-logits features for a headless model), in float32 and float64."""
    out = {}
    for dtype in (torch.float32, torch.float64):
        m = model.to(dtype)
        with torch.no_grad():
            t = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(dtype)
            out[dtype] = m.forward_head(m.forward_features(t), pre_logits=not m.num_classes).double().numpy()
    model.to(torch.float32)
    return out[torch.float32], out[torch.float64]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{case: (folder, timm model)} saved once per module with timm's own Hub saver."""
    from timm.models._hub import save_for_hf

    out = {}
    for case, arch, overrides in CASES:
        args = dict(dict(depth=2), **overrides)
        model = randomize_torch(timm.create_model(arch, pretrained=False, **args), seed=len(out))
        folder = tmp_path_factory.mktemp(case)
        save_for_hf(model, folder, safe_serialization=True, model_args=args)
        out[case] = (folder, model)
    return out


def _load(folder, model):
    if model.num_classes:
        return keras_vit.load_checkpoint(folder, classifier_activation=None)
    pooling = {"token": "token", "avg": "gap", "map": "map"}[model.global_pool]
    return keras_vit.load_checkpoint(folder, include_top=False, pooling=pooling)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_zoo_model_equals_timm(saved, case):
    folder, ref = saved[case]
    model = _load(folder, ref)
    size = model.config.image_size
    x = np.random.default_rng(1).uniform(-1, 1, (2, *size, 3)).astype("float32")
    ref32, ref64 = _timm_outputs(ref, x)
    ours = np.asarray(model.predict(x, verbose=0), dtype=np.float64)
    assert ours.shape == ref32.shape
    scale = np.abs(ref64).max()
    timm_error = np.abs(ref32 - ref64).max() / scale
    error = np.abs(ours - ref64).max() / scale
    assert error <= max(2e-5, 2 * timm_error), (case, error, timm_error)


def test_distilled_model_exposes_both_heads(saved):
    folder, ref = saved["deit_small_distilled"]
    model = keras_vit.load_checkpoint(folder, classifier_activation=None, distillation_output="both")
    x = np.random.default_rng(2).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    ref.set_distilled_training(True)
    ref.train()
    try:
        with torch.no_grad():
            cls_logits, dist_logits = ref(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()))
    finally:
        ref.set_distilled_training(False)
        ref.eval()
    ours = model.predict(x, verbose=0)
    np.testing.assert_allclose(ours[0], cls_logits.numpy(), atol=2e-5 * np.abs(cls_logits.numpy()).max())
    np.testing.assert_allclose(ours[1], dist_logits.numpy(), atol=2e-5 * np.abs(dist_logits.numpy()).max())


def test_normalisation_travels_with_the_model(saved):
    clip = _load(*saved["clip_b32"])
    assert clip.config.input_normalization == (
        (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
    dinov2 = _load(*saved["dinov2_small"])
    assert dinov2.config.input_normalization == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    siglip = _load(*saved["siglip_b16_map"])
    assert siglip.config.input_normalization is None  # 0.5 / 0.5: [-1, 1], the default
    pixels = np.array([[[[0, 128, 255]]]], dtype="uint8")
    expected = (pixels / 255.0 - np.array(clip.config.input_normalization[0])) / np.array(
        clip.config.input_normalization[1])
    np.testing.assert_allclose(keras_vit.preprocess_input(pixels, model=clip), expected, rtol=1e-6)
    np.testing.assert_allclose(keras_vit.preprocess_input(pixels, model=siglip), pixels / 127.5 - 1, atol=1e-6)


def test_every_pretrained_tag_maps_to_a_config(capsys):
    """Every pretrained tag of the table (vision_transformer.py, deit.py, beit.py, eva.py) maps to a
    ViTConfig keras_vit accepts, or to the one error naming the unsupported switch; the
    loaded/total count per module is reported."""
    table = timm_vit_table()
    counts = {}
    for module, entry in table["modules"].items():
        loaded, refused = 0, []
        for tag in entry["pretrained"]:
            arch_module, args = timm_architecture(tag)
            assert arch_module == module, tag
            try:
                variant, _ = timm_variant(args, tag, module)
            except keras_vit.errors.CheckpointError as e:
                assert "not supported" in str(e)
                refused.append(tag)
                continue
            variant.pop("layer_norm_epsilon")
            size = args.get("img_size", 224)
            patch = args.get("patch_size", 16)
            size = tuple(side // patch * patch for side in (size if isinstance(size, (list, tuple)) else (size, size)))
            ViTConfig(image_size=size, patch_size=patch, hidden_size=args["embed_dim"], num_layers=args["depth"],
                      num_heads=args["num_heads"], mlp_dim=4 * args["embed_dim"], classes=1000, **variant)
            loaded += 1
        counts[module] = (loaded, len(entry["pretrained"]), sorted({t.split(".")[0] for t in refused}))
    with capsys.disabled():
        for module, (loaded, total, refused) in counts.items():
            print(f"\ntimm {module}.py: {loaded}/{total} pretrained tags load; refused architectures: {refused}")
    assert counts["deit"][0] == counts["deit"][1] == 24
    assert counts["vision_transformer"][1] == 309 and counts["vision_transformer"][0] == 309
    assert counts["beit"][0] == counts["beit"][1] == 13
    assert counts["eva"][0] == counts["eva"][1] == 83


@pytest.mark.parametrize("case, field, block_field", [("parallel_scaling", "parallel_blocks", "parallel"),
                                                       ("differential", "differential_attention", "differential")])
def test_block_forms_keras_round_trip(saved, tmp_path, case, field, block_field):
    """A .keras file keeps the block form: the reloaded model has the field and the same outputs,
    and the encoder block's own config keeps it."""
    import keras

    from keras_vit.layers.transformer import EncoderBlock

    model = _load(*saved[case])
    assert getattr(model.config, field)
    block = next(layer for layer in model._flatten_layers() if isinstance(layer, EncoderBlock))
    assert getattr(EncoderBlock.from_config(block.get_config()), block_field) == getattr(block, block_field)
    path = str(tmp_path / f"{case}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert getattr(loaded.config, field)
    x = np.random.default_rng(3).uniform(-1, 1, (1, *model.config.image_size, 3)).astype("float32")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.backend_independent
def test_block_forms_refuse_what_they_cannot_hold():
    size = dict(image_size=32, patch_size=16, num_layers=1, mlp_dim=8)
    with pytest.raises(ValueError, match="parallel_blocks=True .* post_norm=True"):
        ViTConfig(hidden_size=8, num_heads=2, parallel_blocks=True, post_norm=True, **size)
    with pytest.raises(ValueError, match="differential_attention=True .* even head size .* = 3"):
        ViTConfig(hidden_size=6, num_heads=2, differential_attention=True, **size)
    with pytest.raises(ValueError, match="differential_attention=True .* no rotary"):
        ViTConfig(hidden_size=16, num_heads=2, differential_attention=True, rotary_position_embedding=True, **size)
    with pytest.raises(ValueError, match="num_kv_heads entries must be positive divisors of num_heads"):
        ViTConfig(hidden_size=12, num_heads=4, num_kv_heads=3, **size)
    with pytest.raises(ValueError, match="num_kv_heads has 2 entries; give one per block"):
        ViTConfig(hidden_size=8, num_heads=2, num_kv_heads=(2, 1), **size)
