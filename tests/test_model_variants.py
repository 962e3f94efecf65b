"""Model variants: the position embeddings of the paper's Appendix D.4 (and big_vision's sin-cos),
big_vision's MAP head, and feature maps: parameter counts from their formulas, forward passes
against the NumPy reference, fit, save/reload and resize."""

import keras
import numpy as np
import pytest
from conftest import randomize
from reference_numpy import vit_forward

import keras_vit
from keras_vit.training import for_finetuning

KINDS = ("learned", "none", "learned_2d", "relative", "sincos2d")
# A non-square 4x6 grid so that a swapped row/column shows.
CONFIG = dict(image_size=(32, 48), patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=32, classes=5)


def _model(kind, classifier="token", **kw):
    return keras_vit.VisionTransformer(
        **{**CONFIG, **kw}, classifier=classifier, position_embedding=kind, classifier_activation=None
    )


def _images(shape, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype("float32")


def _rel_err(a, b):
    return np.abs(np.asarray(a, np.float64) - b).max() / np.abs(b).max()


def test_parameter_counts_follow_the_formulas():
    d, rows, cols, layers, prefix = 24, 4, 6, 2, 1
    tokens = prefix + rows * cols
    extra = {
        "learned": tokens * d,
        "none": 0,
        "learned_2d": cols * d // 2 + rows * d // 2 + prefix * d,
        "relative": layers * (2 * tokens - 1) * d,
        "sincos2d": 0,
    }
    counts = {kind: _model(kind).count_params() for kind in KINDS}
    for kind in KINDS:
        assert counts[kind] - counts["none"] == extra[kind], kind


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_forward_matches_numpy(classifier):
    x = _images((2, 32, 48, 3))
    for kind in KINDS:
        model = randomize(_model(kind, classifier), seed=KINDS.index(kind))
        ref = vit_forward(
            keras_vit.get_weight_tree(model), x, patch_size=8, num_layers=2, classifier=classifier,
            position_embedding=kind,
        )
        assert _rel_err(model.predict(x, verbose=0), ref) < 2e-5, kind


def test_sincos2d_is_big_vision_formula_and_has_no_weights():
    from reference_numpy import sincos2d

    from keras_vit.layers import sincos2d_position_embedding

    np.testing.assert_allclose(sincos2d_position_embedding((3, 5), 16), sincos2d(3, 5, 16), atol=1e-6)
    assert not _model("sincos2d").get_layer("posembed_input").weights


def test_each_trains_saves_and_reloads(tmp_path):
    x = _images((16, 32, 48, 3), seed=2)
    y = np.arange(16) % 5
    for kind in KINDS:
        model = _model(kind)
        model.compile(keras.optimizers.Adam(1e-2), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        before = {k: v.copy() for k, v in keras_vit.get_weight_tree(model).items()}
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        after = keras_vit.get_weight_tree(model)
        position = [k for k in after if "posembed_input" in k or "relative_embedding" in k]
        assert len(position) == {"learned": 1, "none": 0, "learned_2d": 3, "relative": 2, "sincos2d": 0}[kind]
        for key in position:  # gradients reach the embeddings
            assert np.abs(after[key] - before[key]).max() > 0, key
        path = tmp_path / f"{kind}.keras"
        model.save(path)
        loaded = keras.saving.load_model(path)
        assert loaded.position_embedding == kind
        # Called eagerly (the same forward pass as predict, without compiling a predict step per model).
        np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x, training=False)),
                                   keras.ops.convert_to_numpy(model(x, training=False)), rtol=1e-5, atol=1e-6)


def _linear_corners(values, n_out):
    """scipy.ndimage.zoom(order=1)'s rule along axis 0, with np.interp."""
    pos = np.linspace(0, len(values) - 1, n_out)
    return np.stack([np.interp(pos, np.arange(len(values)), values[:, j]) for j in range(values.shape[1])], axis=1)


def test_resize():
    x = _images((2, 48, 32, 3), seed=3)
    # learned_2d: each axis on its own (4x6 -> 6x4 grid), class token vector unchanged.
    model = randomize(_model("learned_2d"), seed=7)
    big = for_finetuning(model, image_size=(48, 32), classes=5)
    old, new = keras_vit.get_weight_tree(model), keras_vit.get_weight_tree(big)
    key = "Transformer/posembed_input/"
    np.testing.assert_allclose(new[key + "x_embedding"], _linear_corners(old[key + "x_embedding"], 4), atol=1e-6)
    np.testing.assert_allclose(new[key + "y_embedding"], _linear_corners(old[key + "y_embedding"], 6), atol=1e-6)
    np.testing.assert_allclose(new[key + "prefix_embedding"], old[key + "prefix_embedding"])
    # sincos2d and none: nothing to resize; the new model is the formula at the new grid.
    for kind in ("sincos2d", "none", "learned_2d"):
        model = randomize(_model(kind), seed=8)
        big = for_finetuning(model, image_size=(48, 32), classes=5, classifier_activation=None)
        tree = keras_vit.get_weight_tree(big)
        tree.update({k: v for k, v in keras_vit.get_weight_tree(model).items() if k.startswith("head/")})
        keras_vit.set_weight_tree(big, tree)
        ref = vit_forward(tree, x, patch_size=8, num_layers=2, position_embedding=kind)
        assert _rel_err(big.predict(x, verbose=0), ref) < 2e-5, kind
    # relative: offsets in the flattened sequence mean other patch pairs on another grid.
    with pytest.raises(ValueError, match="relative position embeddings cannot be resized"):
        for_finetuning(_model("relative"), image_size=(48, 32), classes=5)


def test_bad_position_embedding_settings():
    with pytest.raises(ValueError, match=r"position_embedding must be one of .*got 'learned2d' \(did you mean 'learned_2d'\?\)"):
        _model("learned2d")
    with pytest.raises(ValueError, match="hidden_size 26 does not allow it"):
        _model("sincos2d", hidden_size=26, num_heads=2)


def test_map_head_matches_numpy_saves_and_counts(tmp_path):
    """classifier="map": big_vision's MAPHead_0 (probe, its own attention, LayerNorm, MLP)."""
    model = randomize(_model("sincos2d", classifier="map"), seed=11)
    d, mlp = 24, 32
    head = model.get_layer("MAPHead_0")
    assert head.count_params() == d + 4 * (d * d + d) + 2 * d + (d * mlp + mlp + mlp * d + d)
    x = _images((2, 32, 48, 3), seed=4)
    tree = keras_vit.get_weight_tree(model)
    assert "MAPHead_0/MultiHeadDotProductAttention_0/query/kernel" in tree and "MAPHead_0/probe" in tree
    ref = vit_forward(tree, x, patch_size=8, num_layers=2, classifier="map", position_embedding="sincos2d")
    out = model.predict(x, verbose=0)
    assert _rel_err(out, ref) < 2e-5
    model.save(tmp_path / "map.keras")
    np.testing.assert_allclose(keras.saving.load_model(tmp_path / "map.keras").predict(x, verbose=0), out, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="needs a class token"):
        _model("learned", classifier="map", include_top=False, pooling="token")


@pytest.mark.parametrize("hybrid", [False, True], ids=["vit", "hybrid"])
def test_feature_extractor_grids(hybrid):
    """feature_extractor: chosen blocks as (batch, rows, cols, C) grids, prefix tokens removed; the
    final LayerNorm's grid equals the NumPy reference's token sequence laid out row-major."""
    from keras_vit.models import feature_extractor

    kw = dict(resnet=((1,), 0.5), patch_size=1, image_size=(32, 64)) if hybrid else dict(image_size=(32, 48))
    model = randomize(_model("learned", **kw), seed=12)
    rows, cols = model.grid_size
    x = _images((2, *model.image_size, 3), seed=5)
    features = feature_extractor(model, [0, -1, "encoder_norm"])
    grids = features.predict(x, verbose=0)
    assert [g.shape for g in grids] == [(2, rows, cols, 24)] * 3
    ref_kw = dict(resnet_units=(1,), width_factor=0.5) if hybrid else {}
    ref = vit_forward(
        keras_vit.get_weight_tree(model), x, patch_size=model.patch_size, num_layers=2, include_top=False, **ref_kw
    )
    np.testing.assert_allclose(grids[2], ref[:, 1:].reshape(2, rows, cols, 24), rtol=2e-4, atol=2e-5)
    tokens, prefix = feature_extractor(model, [-1], output="tokens", return_prefix_tokens=True).predict(x, verbose=0)
    np.testing.assert_allclose(tokens.reshape(2, rows, cols, 24), grids[1], rtol=1e-5, atol=1e-6)
    assert prefix.shape == (2, 1, 24)
    with pytest.raises(ValueError, match=r"no layer 'encoder_nrom' \(did you mean 'encoder_norm'\?\)"):
        feature_extractor(model, ["encoder_nrom"])


def test_analysis_on_other_position_embeddings():
    from keras_vit import analysis

    x = _images((2, 32, 48, 3), seed=6)
    model = randomize(_model("relative"), seed=13)
    weights = analysis.attention_weights(model, x)
    ref = vit_forward(keras_vit.get_weight_tree(model), x, patch_size=8, num_layers=2, position_embedding="relative",
                      return_attention=True)[1]
    np.testing.assert_allclose(weights, ref, atol=2e-5)
    sim = analysis.position_embedding_similarity(randomize(_model("learned_2d"), seed=14))
    assert sim.shape == (4, 6, 4, 6)
    np.testing.assert_allclose(sim[1, 2, 1, 2], 1.0, rtol=1e-6)
