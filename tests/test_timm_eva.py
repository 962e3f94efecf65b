"""timm's EVA and EVA-02 (eva.py: 2-D rotary position embedding, SwiGLU, sub-LN, q/v biases)
read through `keras_vit.load_checkpoint`, against timm itself.

Each case is a random-weight timm Eva at a tiny size, saved as timm saves a Hub repo
(`save_for_hf`): EVA-02 Ti (RoPE, packed SwiGLU, headless), EVA-02 B (separate q/k/v, SwiGLU with
its sub-LN, a reference grid other than the grid), EVA-02 CLIP B (the attention's sub-LN, token
pooling), EVA-g (no RoPE, q/v biases, fc_norm), the RoPE register GAP ViT (a register token, no
class token, layer scale), timm's RoPE ViT with an absolute embedding on the patches
(AttentionRope, "xy" rotary axes, temperature 100), a Perception Encoder language tower (pre-norm,
no final norm, rotary offset 1) and DINOv3 S and S+ (centred rotary positions in the half-rotation
layout, four registers, layer scale, no q/k/v bias or q/v biases, split SwiGLU), EVA-02 E
(post-norm blocks) and a Perception Encoder core tower (a MAP head over every token with its own
heads and MLP width), and
the RoPE-Mixed ViT (rotary frequencies learned per block and head), and Sapiens2 (q/k norm,
grouped-query attention with 4, 2 and 1 key/value heads in its three blocks, layer scale on the
attention only, DINOv3's rotary embedding). Logits (or the pooled pre-logits features) equal timm's within
max(2e-5, twice timm's own float32 error against float64), relative to the output's scale.
"""

import sys

import keras
import numpy as np
import pytest

import keras_vit

sys.modules.setdefault("triton", None)
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

from test_timm_zoo import _timm_outputs, randomize_torch  # noqa: E402

from keras_vit.layers.position import rotary_embedding_tables  # noqa: E402

# (case, timm architecture, create_model overrides: depth 2, hidden 32, 2 heads)
CASES = [
    ("eva02_tiny", "eva02_tiny_patch14_224", dict(img_size=28)),
    ("eva02_base_448", "eva02_base_patch14_448", dict(img_size=42)),
    ("eva02_base_clip", "eva02_base_patch16_clip_224", dict(img_size=32)),
    ("eva_giant", "eva_giant_patch14_224", dict(img_size=28)),
    ("rope_reg1_gap", "vit_medium_patch16_rope_reg1_gap_256", dict(img_size=(32, 48))),
    ("rope_ape_xy", "vit_small_patch16_rope_ape_224", dict(img_size=(48, 32))),
    ("pe_lang", "vit_pe_lang_large_patch14_448", dict(img_size=(28, 42))),
    ("dinov3_small", "vit_small_patch16_dinov3", dict(img_size=(32, 48))),
    ("dinov3_splus_qkvb", "vit_small_plus_patch16_dinov3_qkvb", dict(img_size=32)),
    ("eva02_enormous_post_norm", "eva02_enormous_patch14_clip_224", dict(img_size=28)),
    ("rope_mixed", "vit_small_patch16_rope_mixed_224", dict(img_size=(32, 48))),
    ("pe_core_map", "vit_pe_core_tiny_patch16_384", dict(img_size=32, attn_pool_num_heads=4, attn_pool_mlp_ratio=2.0)),
    ("sapiens2_gqa", "vit_base_patch16_sapiens2", dict(img_size=(32, 48), embed_dim=64, num_heads=4, depth=3,
                                                      num_kv_heads=[4, 2, 1])),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{case: (folder, timm model, create_model arguments)} saved once with timm's own Hub saver."""
    from timm.models._hub import save_for_hf

    out = {}
    for seed, (case, arch, overrides) in enumerate(CASES):
        args = dict(dict(depth=2, embed_dim=32, num_heads=2), **overrides)
        model = randomize_torch(timm.create_model(arch, pretrained=False, **args), seed=seed)
        folder = tmp_path_factory.mktemp(case)
        save_for_hf(model, folder, safe_serialization=True, model_args=args)
        out[case] = (folder, model, args)
    return out


def _load(folder, ref, **kwargs):
    if ref.num_classes:
        return keras_vit.load_checkpoint(folder, classifier_activation=None, **kwargs)
    return keras_vit.load_checkpoint(folder, include_top=False, pooling={"avg": "gap"}.get(ref.global_pool, "token"),
                                     **kwargs)


def _assert_equal(ours, ref, x, case):
    ref32, ref64 = _timm_outputs(ref, x)
    assert ours.shape == ref32.shape
    scale = np.abs(ref64).max()
    error = np.abs(np.asarray(ours, np.float64) - ref64).max() / scale
    timm_error = np.abs(ref32 - ref64).max() / scale
    assert error <= max(2e-5, 2 * timm_error), (case, error, timm_error)


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_eva_equals_timm(saved, case):
    folder, ref, _ = saved[case]
    model = _load(folder, ref)
    x = np.random.default_rng(1).uniform(-1, 1, (2, *model.config.image_size, 3)).astype("float32")
    _assert_equal(model.predict(x, verbose=0), ref, x, case)
    # timm's dynamic_img_size models (DINOv3) load as models that follow the input size, as in timm.
    assert model.config.dynamic_image_size == ref.dynamic_img_size
    if ref.dynamic_img_size:
        patch = ref.patch_embed.patch_size[0]
        x = np.random.default_rng(2).uniform(-1, 1, (1, 2 * patch, 5 * patch, 3)).astype("float32")
        _assert_equal(model.predict(x, verbose=0), ref, x, f"{case} at {x.shape[1:3]}")


def test_eva02_at_another_size_equals_timm(saved):
    """Loaded at another image size, the rotary positions follow the new grid (rescaled to the
    reference grid) and the position embedding is resized as timm resizes it."""
    from timm.models.eva import checkpoint_filter_fn

    folder, ref, args = saved["eva02_base_448"]
    bigger = timm.create_model("eva02_base_patch14_448", pretrained=False, **dict(args, img_size=56)).eval()
    bigger.load_state_dict(checkpoint_filter_fn(ref.state_dict(), bigger))
    model = _load(folder, ref, image_size=56)
    x = np.random.default_rng(4).uniform(-1, 1, (2, 56, 56, 3)).astype("float32")
    _assert_equal(model.predict(x, verbose=0), bigger, x, "eva02_base_448 at 56")


@pytest.mark.parametrize("case, fields", [
    ("eva02_base_clip", ("rotary_position_embedding", "attention_norm", "mlp_norm")),
    ("sapiens2_gqa", ("qk_norm", "num_kv_heads", "attention_only_layer_scale"))])
def test_eva_keras_round_trip(saved, tmp_path, case, fields):
    from keras_vit.layers.transformer import EncoderBlock

    folder, ref, _ = saved[case]
    model = _load(folder, ref)
    assert all(getattr(model.config, field) for field in fields)
    path = str(tmp_path / f"{case}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert all(getattr(loaded.config, f) == getattr(model.config, f) for f in fields)
    blocks = [layer for layer in model._flatten_layers() if isinstance(layer, EncoderBlock)]
    keys = ("qk_norm", "num_kv_heads", "attention_only_layer_scale", "attention_norm", "mlp_norm", "rotary")
    for block in blocks:  # the block's own config keeps them too
        rebuilt = EncoderBlock.from_config(block.get_config())
        assert [getattr(rebuilt, k) for k in keys] == [getattr(block, k) for k in keys]
    x = np.random.default_rng(2).uniform(-1, 1, (1, *model.config.image_size, 3)).astype("float32")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


# timm's Eva with dynamic_img_size: the rotary embedding (EVA-02's, rescaled to its reference grid;
# RoPE-Mixed's learned frequencies; DINOv3's centred one) and the absolute position embedding are
# computed for each batch's grid.
DYNAMIC = [("eva02_tiny_patch14_224", 14), ("vit_small_patch16_rope_mixed_224", 16), ("vit_small_patch16_dinov3", 16)]


@pytest.mark.parametrize("arch, patch", DYNAMIC, ids=["eva02", "rope_mixed", "dinov3"])
def test_rotary_models_follow_the_input_size_as_timm(tmp_path, arch, patch):
    from timm.models._hub import save_for_hf

    args = dict(depth=2, embed_dim=32, num_heads=2, img_size=2 * patch, dynamic_img_size=True, num_classes=5)
    ref = randomize_torch(timm.create_model(arch, pretrained=False, **args), seed=5)
    save_for_hf(ref, tmp_path, safe_serialization=True, model_args=args)
    model = keras_vit.load_checkpoint(tmp_path, dynamic_image_size=True, classifier_activation=None)
    assert model.input_shape == (None, None, None, 3) and model.config.rotary_position_embedding
    for size in [(3 * patch, 3 * patch), (2 * patch, 4 * patch)]:  # a larger grid, and a non-square one
        x = np.random.default_rng(1).uniform(-1, 1, (2, *size, 3)).astype("float32")
        _assert_equal(model.predict(x, verbose=0), ref, x, f"{arch} at {size}")
    if arch.startswith("eva02"):  # the .keras file keeps the run-time grid
        path = str(tmp_path / "dynamic.keras")
        model.save(path)
        np.testing.assert_array_equal(keras.saving.load_model(path).predict(x, verbose=0), model.predict(x, verbose=0))
        # The attention analysis runs the blocks on each batch's grid: the fixed-size model's weights.
        fixed = keras_vit.load_checkpoint(tmp_path, image_size=x.shape[1:3], classifier_activation=None)
        np.testing.assert_allclose(np.asarray(keras_vit.analysis.attention_weights(model, x)),
                                   np.asarray(keras_vit.analysis.attention_weights(fixed, x)), atol=1e-6)


@pytest.mark.backend_independent
@pytest.mark.parametrize("grid, head_dim, temperature, reference, offset, indexing, coordinates, rotate_half", [
    ((2, 3), 16, 10000.0, (16, 16), 0.0, "ij", "index", False), ((3, 2), 8, 10000.0, (5, 7), 1.0, "xy", "index", True),
    ((3, 5), 8, 100.0, None, 1.0, "xy", "centered", False)])
def test_run_time_rotary_tables_equal_the_numpy_ones(grid, head_dim, temperature, reference, offset, indexing,
                                                     coordinates, rotate_half):
    from keras_vit.layers.position import (rotary_embedding_tensors, rotary_positions, rotary_positions_tensor)

    args = (grid, head_dim, temperature, reference, offset, indexing, coordinates, rotate_half)
    for ours, numpy in zip(rotary_embedding_tensors(*args), rotary_embedding_tables(*args)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours), numpy, atol=2e-6)  # XLA's sin: 1.6e-6
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(rotary_positions_tensor(grid, indexing)),
                                  rotary_positions(grid, indexing))


def test_rotary_refusals():
    with pytest.raises(ValueError, match="multiple of 4"):
        keras_vit.VisionTransformer(image_size=32, patch_size=16, hidden_size=12, num_layers=1, num_heads=2,
                                    mlp_dim=8, rotary_position_embedding=True)


@pytest.mark.backend_independent
@pytest.mark.parametrize("grid, head_dim, temperature, reference, offset, indexing", [
    ((2, 3), 16, 10000.0, (16, 16), 0.0, "ij"), ((4, 4), 8, 100.0, None, 0.0, "xy"),
    ((3, 2), 8, 10000.0, (5, 7), 1.0, "xy"), ((2, 3), 8, 10000.0, None, 1.0, "ij")])
def test_rotary_tables_equal_timm(grid, head_dim, temperature, reference, offset, indexing):
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat

    rope = RotaryEmbeddingCat(dim=head_dim, temperature=temperature, in_pixels=False, feat_shape=list(grid),
                              ref_feat_shape=reference, grid_offset=offset, grid_indexing=indexing)
    sin, cos = np.split(rope.get_embed().numpy(), 2, axis=-1)
    ours = rotary_embedding_tables(grid, head_dim, temperature, reference, offset, indexing)
    np.testing.assert_allclose(ours[0], sin, atol=2e-7)
    np.testing.assert_allclose(ours[1], cos, atol=2e-7)


@pytest.mark.backend_independent
@pytest.mark.parametrize("grid, head_dim, offset, indexing", [((2, 3), 16, 0.0, "ij"), ((3, 2), 8, 1.0, "xy")])
def test_dinov3_rotary_tables_equal_timm(grid, head_dim, offset, indexing):
    from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3

    rope = RotaryEmbeddingDinoV3(dim=head_dim, temperature=100.0, feat_shape=list(grid), grid_offset=offset,
                                 grid_indexing=indexing)
    sin, cos = np.split(rope.pos_embed_cached.numpy(), 2, axis=-1)
    ours = rotary_embedding_tables(grid, head_dim, 100.0, None, offset, indexing, "centered", True)
    np.testing.assert_allclose(ours[0], sin, atol=2e-7)
    np.testing.assert_allclose(ours[1], cos, atol=2e-7)


def test_unsupported_eva_is_refused(tmp_path):
    """An Eva switch keras_vit does not build (padding images to a multiple of the patch) is refused by name."""
    from timm.models._hub import save_for_hf

    args = dict(depth=1, embed_dim=32, num_heads=2, img_size=28, dynamic_img_pad=True)
    save_for_hf(timm.create_model("eva02_tiny_patch14_224", pretrained=False, **args), tmp_path,
                safe_serialization=True, model_args=args)
    with pytest.raises(keras_vit.errors.CheckpointError, match="dynamic_img_pad=True is not supported"):
        keras_vit.load_checkpoint(tmp_path)


def test_grouped_query_attention_refuses_int8(saved):
    folder, ref, _ = saved["sapiens2_gqa"]
    model = _load(folder, ref)
    with pytest.raises(NotImplementedError, match="grouped-query attention .* is not quantized"):
        model.quantize("int8")


class _FixedPatchDrop(torch.nn.Module):
    """timm's `PatchDropoutWithIndices` with the kept patches given: (tokens, keep indices), or
    with other `positions` reported for them."""

    def __init__(self, keep, prefix, positions=None):
        super().__init__()
        self.keep, self.prefix = torch.from_numpy(keep).long(), prefix
        self.positions = self.keep if positions is None else torch.from_numpy(positions).long()

    def forward(self, x):
        patches = x[:, self.prefix:]
        index = self.keep[:, :, None].expand(-1, -1, x.shape[-1])
        return torch.cat([x[:, :self.prefix], torch.gather(patches, 1, index)], dim=1), self.positions


@pytest.mark.parametrize("arch, size", [("eva02_tiny_patch14_224", 42), ("vit_small_patch16_rope_mixed_224", 48),
                                        ("vit_small_patch16_dinov3", 48)], ids=["eva02", "rope_mixed", "dinov3"])
def test_patch_dropout_rotates_the_kept_patches_as_timm(tmp_path, arch, size):
    """In training, a rotary model rotates each patch that patch dropout kept by its own grid
    position (timm's EVA: `apply_keep_indices_nlc`). Both sides keep the same patches (a fixed
    draw, in a shuffled order) and their logits agree. For DINOv3 (a grid read from the input at
    run time), inference equals the model without patch dropout, the attention analysis runs, and
    a fit step and the .keras round trip keep the layer's indices: the same layer and code path as
    for the other two, which leave out these compiled steps."""
    from timm.models._hub import save_for_hf

    args = dict(depth=2, embed_dim=32, num_heads=2, img_size=size, num_classes=5, patch_drop_rate=0.5)
    ref = randomize_torch(timm.create_model(arch, pretrained=False, **args), seed=7)
    save_for_hf(ref, tmp_path, safe_serialization=True, model_args=args)
    model = keras_vit.load_checkpoint(tmp_path, classifier_activation=None, patch_drop_rate=0.5)
    layer = model.get_layer("patch_dropout")
    prefix, patches = layer.num_prefix_tokens, int(np.prod(model.config.grid_size))
    assert layer.return_indices and prefix == ref.num_prefix_tokens
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (2, size, size, 3)).astype("float32")
    keep = np.stack([rng.permutation(patches)[:layer.kept(patches)] for _ in range(2)]).astype("int32")
    assert keep.shape[1] < patches and (keep[0] != keep[1]).any()

    # The kept patches of a random draw, as timm's PatchDropoutWithIndices returns them.
    def fixed(tokens, training=None):
        ids = keras.ops.convert_to_tensor(keep)
        kept = keras.ops.take_along_axis(tokens[:, prefix:], ids[:, :, None], axis=1)
        return keras.ops.concatenate([tokens[:, :prefix], kept], axis=1), ids

    ref.patch_drop = _FixedPatchDrop(keep, prefix)
    drawn = layer.call
    layer.call = fixed
    try:
        ours = keras.ops.convert_to_numpy(model(x, training=True))
    finally:
        layer.call = drawn
    _assert_equal(ours, ref, x, f"{arch} with patch dropout")
    # The same patches rotated as if they were the first of the grid: the logits move.
    ref.patch_drop = _FixedPatchDrop(keep, prefix, np.broadcast_to(np.arange(keep.shape[1]), keep.shape).copy())
    moved = np.abs(_timm_outputs(ref, x)[1] - ours).max()
    assert moved > 1e-4 * np.abs(ours).max()
    if arch != "vit_small_patch16_dinov3":
        return
    # At inference nothing is dropped: the logits of the model without patch dropout.
    plain = keras_vit.load_checkpoint(tmp_path, classifier_activation=None)
    np.testing.assert_allclose(model.predict(x, verbose=0), plain.predict(x, verbose=0), rtol=1e-6, atol=1e-6)
    # The attention analysis runs at inference, past the layer's indices.
    np.testing.assert_allclose(np.asarray(keras_vit.analysis.attention_weights(model, x)),
                               np.asarray(keras_vit.analysis.attention_weights(plain, x)), atol=1e-6)
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert np.isfinite(model.fit(x, np.arange(2), epochs=1, verbose=0).history["loss"]).all()
    path = str(tmp_path / "dropped.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.get_layer("patch_dropout").return_indices
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
