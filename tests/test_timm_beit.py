"""timm's BEiT (beit.py: relative position bias per block, q/v biases, layer scale, mean pooling
through fc_norm) read through `keras_vit.load_checkpoint`, against timm itself.

Each case is a random-weight timm Beit at a tiny size, saved as timm saves a Hub repo
(`save_for_hf`). Logits (or, headless, the pooled pre-logits features) and the intermediates
equal timm's within max(2e-5, twice timm's own float32 error against float64), relative to the
output's scale.
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

from keras_vit.layers.position import relative_position_entries, relative_position_index  # noqa: E402

# (case, timm architecture, create_model overrides). A 2x3 grid: a non-square window.
CASES = [
    ("beit_nonsquare", "beit_base_patch16_224", dict(img_size=(32, 48), embed_dim=32, num_heads=4)),
    ("beitv2_token_headless", "beitv2_large_patch16_224",
     dict(img_size=48, embed_dim=32, num_heads=4, global_pool="token", num_classes=0)),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """{case: (folder, timm model)} saved once with timm's own Hub saver."""
    from timm.models._hub import save_for_hf

    out = {}
    for seed, (case, arch, overrides) in enumerate(CASES):
        args = dict(depth=2, **overrides)
        model = randomize_torch(timm.create_model(arch, pretrained=False, **args), seed=seed)
        folder = tmp_path_factory.mktemp(case)
        save_for_hf(model, folder, safe_serialization=True, model_args=args)
        out[case] = (folder, model)
    return out


def _load(folder, ref, **kwargs):
    if ref.num_classes:
        return keras_vit.load_checkpoint(folder, classifier_activation=None, **kwargs)
    return keras_vit.load_checkpoint(folder, include_top=False, pooling={"avg": "gap"}.get(ref.global_pool, "token"),
                                     **kwargs)


def _relative_error(ours, ref32, ref64):
    scale = np.abs(ref64).max()
    return np.abs(np.asarray(ours, np.float64) - ref64).max() / scale, np.abs(ref32 - ref64).max() / scale


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_beit_equals_timm(saved, case):
    folder, ref = saved[case]
    model = _load(folder, ref)
    assert model.config.relative_position_bias and model.config.position_embedding == "none"
    # q and v biases as timm's (its key bias is a zero buffer): no key bias weight.
    assert not model.config.key_bias and not [v for v in model.weights if v.path.endswith("key_bias")]
    x = np.random.default_rng(1).uniform(-1, 1, (2, *model.config.image_size, 3)).astype("float32")
    ref32, ref64 = _timm_outputs(ref, x)
    ours = model.predict(x, verbose=0)
    assert ours.shape == ref32.shape
    error, timm_error = _relative_error(ours, ref32, ref64)
    assert error <= max(2e-5, 2 * timm_error), (case, error, timm_error)


def test_beit_intermediates_equal_timm(saved):
    folder, ref = saved["beit_nonsquare"]
    model = keras_vit.load_checkpoint(folder, include_top=False)
    x = np.random.default_rng(3).uniform(-1, 1, (2, 32, 48, 3)).astype("float32")
    with torch.no_grad():
        want = {}
        for dtype in (torch.float32, torch.float64):
            images = torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(dtype)
            _, inter = ref.to(dtype).forward_intermediates(images, indices=2, output_fmt="NCHW")
            want[dtype] = [t.double().numpy().transpose(0, 2, 3, 1) for t in inter]
    ref.to(torch.float32)
    _, ours = model.forward_intermediates(x, 2)
    assert [tuple(o.shape) for o in ours] == [w.shape for w in want[torch.float64]] == [(2, 2, 3, 32)] * 2
    for got, w32, w64 in zip(ours, want[torch.float32], want[torch.float64]):
        error, timm_error = _relative_error(keras.ops.convert_to_numpy(got), w32, w64)
        assert error <= max(2e-5, 2 * timm_error), (error, timm_error)


def test_beit_keras_round_trip(saved, tmp_path):
    folder, ref = saved["beit_nonsquare"]
    model = _load(folder, ref)
    path = str(tmp_path / "beit.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.config.relative_position_bias
    x = np.random.default_rng(2).uniform(-1, 1, (1, 32, 48, 3)).astype("float32")
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_beit_int8_keeps_its_outputs(saved):
    # The fused int8 q/k/v projection takes a zero key bias in place of the one BEiT has not.
    folder, ref = saved["beit_nonsquare"]
    model = _load(folder, ref)
    x = np.random.default_rng(5).uniform(-1, 1, (2, 32, 48, 3)).astype("float32")
    before = model.predict(x, verbose=0)
    model.quantize("int8")
    assert np.abs(model.predict(x, verbose=0) - before).max() < 0.05 * np.abs(before).max()


@pytest.mark.parametrize("case, size", [("beit_nonsquare", (48, 48)), ("beitv2_token_headless", (32, 64))])
def test_beit_at_another_size_equals_timm(saved, case, size):
    """Loaded at another image size, every block's relative position bias table is resampled to the
    new grid as timm's checkpoint_filter_fn resamples it (resize_rel_pos_bias_table). timm's
    filter takes a checkpoint's table for a square grid: the non-square one's tables are resampled
    with timm's function told their grid first."""
    from timm.layers.pos_embed_rel import resize_rel_pos_bias_table
    from timm.models.beit import checkpoint_filter_fn

    folder, ref = saved[case]
    arch, overrides = next((a, o) for c, a, o in CASES if c == case)
    bigger = timm.create_model(arch, pretrained=False, **dict(overrides, depth=2, img_size=size)).eval()
    state = ref.state_dict()
    source, target = ref.patch_embed.grid_size, bigger.patch_embed.grid_size
    if source[0] != source[1]:
        state = {k: resize_rel_pos_bias_table(v, target, (relative_position_entries(target), v.shape[1]),
                                              old_window_size=source)
                 if k.endswith("relative_position_bias_table") else v for k, v in state.items()}
    bigger.load_state_dict(checkpoint_filter_fn(state, bigger))
    model = _load(folder, ref, image_size=size)
    x = np.random.default_rng(4).uniform(-1, 1, (2, *size, 3)).astype("float32")
    ref32, ref64 = _timm_outputs(bigger, x)
    ours = model.predict(x, verbose=0)
    assert ours.shape == ref32.shape
    error, timm_error = _relative_error(ours, ref32, ref64)
    assert error <= max(2e-5, 2 * timm_error), (case, error, timm_error)


@pytest.mark.backend_independent
@pytest.mark.parametrize("source, target", [((14, 14), (24, 24)), ((14, 14), (7, 7)), ((2, 3), (3, 3)),
                                            ((3, 3), (2, 4))])
def test_relative_position_bias_resize_equals_timm(source, target):
    from timm.layers.pos_embed_rel import resize_rel_pos_bias_table

    from keras_vit.layers.resize import resize_relative_position_bias

    table = np.random.default_rng(0).normal(size=(relative_position_entries(source), 4)).astype("float32")
    shape = (relative_position_entries(target), 4)
    want = resize_rel_pos_bias_table(torch.from_numpy(table), target, shape, old_window_size=source).numpy()
    got = resize_relative_position_bias(table, target, source_grid=source)
    np.testing.assert_allclose(got, want, atol=2e-6)  # timm interpolates in float32
    if source[0] == source[1]:  # a square source is the one a checkpoint's table size tells
        np.testing.assert_array_equal(resize_relative_position_bias(table, target), got)


def test_beit_refuses_a_grid_at_run_time(saved):
    with pytest.raises(ValueError, match="relative_position_bias=True"):
        keras_vit.VisionTransformer(image_size=32, patch_size=16, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=8,
                                    classifier="gap", class_token=True, relative_position_bias=True,
                                    dynamic_image_size=True)


@pytest.mark.backend_independent
@pytest.mark.parametrize("grid", [(2, 3), (3, 3), (1, 4)])
def test_relative_position_index_equals_timm(grid):
    from timm.models.beit import gen_relative_position_index

    np.testing.assert_array_equal(relative_position_index(grid), gen_relative_position_index(grid).numpy())
