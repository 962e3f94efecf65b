"""keras_vit.analysis: attention read off models vs an independent NumPy forward pass, rollout and
attention distance vs hand computations and the reference numbers, embeddings vs scipy/sklearn,
written pictures, and the `keras-vit explain` command."""

import os

import numpy as np
import pytest
from conftest import TINY, TINY_HYBRID, randomize
from reference_numpy import vit_forward

import keras
import keras_vit
from keras_vit import analysis


def peaked(model, seed=0):
    """Random weights large enough that attention is far from uniform (max weights near 1)."""
    return randomize(model, seed=seed, scale=2.0)


def images(shape, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype("float32")


def numpy_attention(model, x, **kw):
    _, att = vit_forward(
        keras_vit.get_weight_tree(model), x, num_layers=model.num_layers, patch_size=model.patch_size,
        include_top=False, return_attention=True, **kw,
    )
    return att


# === attention_weights ===


@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_attention_weights_match_numpy(classifier):
    model = peaked(keras_vit.VisionTransformer(**TINY, classifier=classifier))
    x = images((3, 32, 32, 3))
    att = analysis.attention_weights(model, x, batch_size=2)  # two batches, concatenated
    tokens = 16 + (classifier == "token")
    assert att.shape == (2, 3, 3, tokens, tokens) and att.dtype == np.float32
    ref = numpy_attention(model, x, classifier=classifier)
    np.testing.assert_allclose(att, ref, atol=1e-5, rtol=1e-4)
    np.testing.assert_allclose(att.sum(-1), 1.0, atol=1e-5)
    # Peaked attention that differs between layers: a real check, not near-uniform rows.
    assert att.max() > 0.5 and np.abs(att[0] - att[1]).max() > 0.1


def test_attention_weights_hybrid_match_numpy():
    model = peaked(keras_vit.VisionTransformer(**TINY_HYBRID, classifier_activation=None))
    x = images((2, 64, 64, 3))
    att = analysis.attention_weights(model, x)
    assert att.shape == (2, 2, 2, 65, 65)
    ref = numpy_attention(model, x, resnet_units=(1, 1), width_factor=0.5)
    np.testing.assert_allclose(att, ref, atol=1e-5, rtol=1e-4)
    info = analysis.anatomy(model)
    assert info.hybrid and info.grid_size == (8, 8) and info.stride == (8, 8)

    # Attention distance is in input pixels: 8 per token here (ResNet stride 8, patch 1).
    d = analysis.attention_distance(model, x, batch_size=2)
    pos = (np.stack(np.meshgrid(np.arange(8), np.arange(8), indexing="ij"), -1).reshape(-1, 2) + 0.5) * 8
    dist = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    a = ref[..., 1:, 1:] / ref[..., 1:, 1:].sum(-1, keepdims=True)
    np.testing.assert_allclose(d, (a * dist).sum(-1).mean(axis=(1, 3)), rtol=1e-4)


def test_headless_wrapped_and_reloaded_models(tmp_path):
    vit = peaked(keras_vit.VisionTransformer(**TINY, include_top=False, pooling="gap"))
    x = images((2, 32, 32, 3))
    ref = numpy_attention(vit, x)
    np.testing.assert_allclose(analysis.attention_weights(vit, x), ref, atol=1e-5, rtol=1e-4)

    # A keras.Model around the ViT with preprocessing in front (uint8-range input).
    raw = keras.Input((32, 32, 3), name="raw")
    scaled = keras.layers.Rescaling(1 / 127.5, offset=-1.0, name="to_unit")(raw)
    wrapped = keras.Model(raw, keras.layers.Dense(4, name="probe")(vit(scaled)))
    pixels = (x + 1.0) * 127.5
    np.testing.assert_allclose(analysis.attention_weights(wrapped, pixels), ref, atol=1e-4)
    assert analysis.anatomy(wrapped).owner is vit

    # The same after a .keras round trip (no rebuilding by the user).
    path = str(tmp_path / "wrapped.keras")
    wrapped.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(analysis.attention_weights(loaded, pixels), ref, atol=1e-4)


def test_attention_model_is_cached_and_shares_weights():
    model = peaked(keras_vit.VisionTransformer(**TINY))
    sub = analysis.attention_model(model)
    assert analysis.attention_model(model) is sub
    model_vars = {id(v) for v in model.weights}
    assert {id(v) for v in sub.weights} <= model_vars  # no copies
    x = images((1, 32, 32, 3))
    before = analysis.attention_weights(model, x)
    peaked(model, seed=5)
    after = analysis.attention_weights(model, x)
    np.testing.assert_allclose(after, numpy_attention(model, x), atol=1e-5, rtol=1e-4)
    assert np.abs(after - before).max() > 1e-3


def test_clear_errors():
    with pytest.raises(ValueError, match="EncoderBlock"):
        analysis.attention_weights(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), np.zeros((1, 4)))
    model = keras_vit.VisionTransformer(**TINY)
    with pytest.raises(ValueError, match=r"\(32, 32, 3\)"):
        analysis.attention_weights(model, np.zeros((1, 40, 40, 3)))


# === rollout ===


def test_rollout_matches_hand_computation():
    # 2 layers, 1 image, 2 heads, 3 tokens: class token + a 1x2 patch grid.
    eye = np.eye(3)
    shift = np.array([[0, 1, 0], [0, 0, 1], [1, 0, 0]], float)
    m2 = np.array([[0, 1, 0], [0, 1, 0], [0, 0, 1]], float)
    att = np.stack([np.stack([eye, shift]), np.stack([m2, m2])])[:, None]  # (2, 1, 2, 3, 3)
    # By hand: A1 = ((I + S)/2 + I)/2 = [[.75,.25,0],[0,.75,.25],[.25,0,.75]],
    # A2 = (M2 + I)/2 = [[.5,.5,0],[0,1,0],[0,0,1]]; R = A2 @ A1.
    expected = np.array([[0.375, 0.5, 0.125], [0.0, 0.75, 0.25], [0.25, 0.0, 0.75]])
    joint = analysis.rollout(att)
    np.testing.assert_allclose(joint[0], expected, atol=1e-12)
    np.testing.assert_allclose(analysis.rollout_map(joint, (1, 2)), [[[0.5, 0.125]]], atol=1e-12)
    # No class token ("gap"): the mean of all rows over a 1x3 grid.
    np.testing.assert_allclose(analysis.rollout_map(joint, (1, 3)), [[[0.625 / 3, 1.25 / 3, 1.125 / 3]]], atol=1e-12)
    # Max fusion: A1 = ([[1,1,0],[0,1,1],[1,0,1]] + I)/3, row 0 of A2 @ A1 = [1/3, 1/2, 1/6].
    np.testing.assert_allclose(analysis.rollout(att, head_fusion="max")[0, 0], [1 / 3, 1 / 2, 1 / 6], atol=1e-12)


def test_rollout_discard_ratio_by_hand():
    """discard_ratio: per layer the smallest fraction of the head-fused matrix's entries set to 0
    before the identity is added, written out here with a sorted threshold."""
    att = np.random.default_rng(0).dirichlet(np.ones(4), size=(2, 1, 2, 4))  # (layers, 1, heads, 4, 4)
    expected = np.eye(4)
    for layer in att[:, 0]:
        fused = layer.mean(0)
        threshold = np.sort(fused.ravel())[3]  # int(16 * 0.3) = 4 entries dropped
        a = np.where(fused <= threshold, 0.0, fused) + np.eye(4)
        expected = (a / a.sum(-1, keepdims=True)) @ expected
    np.testing.assert_allclose(analysis.rollout(att, discard_ratio=0.3)[0], expected, atol=1e-12)
    assert np.abs(analysis.rollout(att)[0] - expected).max() > 1e-3


def test_attention_rollout_on_models():
    x = images((2, 32, 32, 3))
    for classifier in ("token", "gap"):
        model = randomize(keras_vit.VisionTransformer(**TINY, classifier=classifier))
        maps = analysis.attention_rollout(model, x)
        assert maps.shape == (2, 4, 4)
        assert np.all(maps >= 0)
        # A gap map is a mean of rows that each sum to one: it sums to one over the patches.
        if classifier == "gap":
            np.testing.assert_allclose(maps.sum((1, 2)), 1.0, atol=1e-6)
        else:
            assert np.all(maps.sum((1, 2)) < 1.0)


# === mean attention distance ===


def _synthetic_heads(rows=14, cols=14):
    ys, xs = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    pos = np.stack([ys.ravel(), xs.ravel()], 1).astype(float)
    sq = ((pos[:, None] - pos[None]) ** 2).sum(-1)  # squared distance in patches
    heads = [np.eye(rows * cols)]
    for sigma in (1.0, 3.0):
        g = np.exp(-sq / (2 * sigma**2))
        heads.append(g / g.sum(1, keepdims=True))
    heads.append(np.full((rows * cols, rows * cols), 1.0 / (rows * cols)))
    return np.stack(heads)  # (4, N, N)


def test_mean_attention_distance_reference_values():
    heads = _synthetic_heads()
    expected = [0.0, 18.4, 52.9, 116.5]  # REFERENCE.md, 224 image, 16-px patches
    d = analysis.mean_attention_distance(heads[None, None], (14, 14), 16)
    assert d.shape == (1, 4)
    np.testing.assert_allclose(d[0], expected, atol=0.1)
    # Single layer input, batch of two identical images.
    np.testing.assert_allclose(analysis.mean_attention_distance(np.stack([heads, heads]), 14, 16), expected, atol=0.1)
    # A class token is left out (as query and key; the remaining weights renormalised).
    n = heads.shape[-1]
    with_cls = np.zeros((4, n + 1, n + 1))
    with_cls[:, 0] = 1.0 / (n + 1)
    with_cls[:, 1:, 0] = 0.3
    with_cls[:, 1:, 1:] = 0.7 * heads
    np.testing.assert_allclose(analysis.mean_attention_distance(with_cls[None, None], 14, 16)[0], expected, atol=0.1)
    # Non-square patches and grids: a uniform head on a 1x2 grid of 10x30 px patches -> 15 px.
    uniform = np.full((1, 1, 1, 2, 2), 0.5)
    np.testing.assert_allclose(analysis.mean_attention_distance(uniform, (1, 2), (10, 30)), [[15.0]])


def test_attention_distance_over_uneven_batches_matches_numpy():
    """3 images in batches of 2 and 1: the mean over images, not over batches."""
    model = peaked(keras_vit.VisionTransformer(**TINY))
    x = images((3, 32, 32, 3))
    d = analysis.attention_distance(model, x, batch_size=2)
    ref = numpy_attention(model, x)
    pos = (np.stack(np.meshgrid(np.arange(4), np.arange(4), indexing="ij"), -1).reshape(-1, 2) + 0.5) * 8
    dist = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    a = ref[..., 1:, 1:] / ref[..., 1:, 1:].sum(-1, keepdims=True)
    per_image = (a * dist).sum(-1).mean(axis=3)  # (layers, images, heads)
    np.testing.assert_allclose(d, per_image.mean(axis=1), rtol=1e-4)
    assert np.abs(per_image[:, :2].mean(1) - per_image[:, 2]).max() > 1e-2  # the images differ


# === embeddings ===


def test_position_embedding_similarity_against_scipy():
    from scipy.spatial.distance import cdist

    model = randomize(keras_vit.VisionTransformer(**TINY))
    sim = analysis.position_embedding_similarity(model)
    assert sim.shape == (4, 4, 4, 4)
    pe = keras_vit.get_weight_tree(model)["Transformer/posembed_input/pos_embedding"][0, 1:]
    ref = 1.0 - cdist(pe, pe, metric="cosine")
    np.testing.assert_allclose(sim.reshape(16, 16), ref, atol=1e-6)
    np.testing.assert_allclose(sim[2, 3, 2, 3], 1.0, atol=1e-6)


def test_patch_embedding_components_against_sklearn():
    from sklearn.decomposition import PCA

    model = randomize(keras_vit.VisionTransformer(**TINY))
    comps, ratio = analysis.patch_embedding_components(model, n=5, return_variance=True)
    assert comps.shape == (5, 8, 8, 3)
    kernel = keras_vit.get_weight_tree(model)["embedding/kernel"]
    pca = PCA(n_components=5).fit(kernel.reshape(-1, 24).T.astype(np.float64))
    # Components agree up to sign.
    dots = np.abs(np.sum(comps.reshape(5, -1) * pca.components_, axis=1))
    np.testing.assert_allclose(dots, 1.0, atol=1e-5)
    np.testing.assert_allclose(ratio, pca.explained_variance_ratio_, rtol=1e-5)
    # Only as many components as the 24 filters span.
    assert analysis.patch_embedding_components(model, n=28).shape[0] == 24


def test_patch_embedding_components_refuse_hybrids():
    model = keras_vit.VisionTransformer(**TINY_HYBRID)
    with pytest.raises(ValueError, match="hybrid.*ResNet features"):
        analysis.patch_embedding_components(model)


# === pictures ===


def _check_png(path, min_size):
    from PIL import Image

    with Image.open(path) as img:
        assert img.format == "PNG"
        rgb = np.asarray(img.convert("RGB"))
    assert rgb.shape[0] >= min_size[0] and rgb.shape[1] >= min_size[1], rgb.shape
    assert rgb.astype(float).var() > 0
    assert len(np.unique(rgb.reshape(-1, 3), axis=0)) >= 8
    return rgb


def test_overlay_and_plots_written(tmp_path):
    from PIL import Image

    image = np.random.default_rng(0).integers(0, 256, (40, 56, 3), dtype=np.uint8)
    attention_map = np.arange(12, dtype=float).reshape(3, 4)
    rgb = analysis.overlay_attention(image, attention_map)
    assert rgb.shape == (40, 56, 3) and rgb.dtype == np.uint8
    # Colour follows the map: with the image black, the low corner is blue, the high corner red.
    black = analysis.overlay_attention(np.zeros((40, 56, 3), np.uint8), attention_map, alpha=1.0)
    assert black[0, 0, 2] > black[0, 0, 0] and black[-1, -1, 0] > black[-1, -1, 2]
    path = analysis.save_png(str(tmp_path / "overlay.png"), rgb)
    with Image.open(path) as img:
        assert img.size == (56, 40)
    _check_png(path, (40, 56))

    d = analysis.mean_attention_distance(_synthetic_heads()[None, None], 14, 16)
    analysis.plot_attention_distance(np.repeat(d, 3, axis=0), tmp_path / "distance.png")
    _check_png(tmp_path / "distance.png", (200, 200))

    model = randomize(keras_vit.VisionTransformer(**TINY))
    analysis.plot_position_embedding_similarity(analysis.position_embedding_similarity(model), tmp_path / "pe.png")
    _check_png(tmp_path / "pe.png", (200, 200))
    analysis.plot_patch_embedding_components(analysis.patch_embedding_components(model, 10), tmp_path / "pcs.png")
    _check_png(tmp_path / "pcs.png", (100, 200))
    analysis.plot_rollout(image, attention_map, tmp_path / "panel.png")
    _check_png(tmp_path / "panel.png", (150, 400))


def test_analysis_imports_no_plotting_at_module_level():
    """matplotlib (and other heavy packages) are imported inside the plotting functions only."""
    import ast
    import pathlib

    heavy = ("matplotlib", "PIL", "tensorflow", "torch", "tensorflow_datasets", "sklearn")
    for path in pathlib.Path(analysis.__file__).parent.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] in heavy], (path.name, names)


# === CLI ===


def test_cli_explain_writes_pngs(tmp_path, capsys):
    import json

    from keras_vit import cli
    from keras_vit.commands.explain import sample_image_path

    assert sample_image_path("grace_hopper")  # ships with matplotlib
    model = randomize(keras_vit.VisionTransformer(**TINY_HYBRID))
    path = str(tmp_path / "hybrid.keras")
    model.save(path)
    out = tmp_path / "out"
    assert cli.main(["explain", "sample:grace_hopper", "--weights", path, "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["hybrid"] and summary["grid_size"] == [8, 8]
    assert np.array(summary["mean_attention_distance_px"]).shape == (2, 2)
    assert "hybrid" in summary["notes"][0]  # no patch-embedding components for hybrids
    names = sorted(p.name for p in out.iterdir())
    assert names == [
        "attention_distance.png", "position_embedding_similarity.png", "rollout_grace_hopper.png",
        "rollout_grace_hopper_panel.png", "summary.json",
    ]
    overlay = _check_png(out / "rollout_grace_hopper.png", (100, 100))
    assert overlay.shape[:2] == (512, 437)  # grace_hopper.jpg (512 wide, 600 high) shrunk to 512 high
    for name in names:
        if name.endswith(".png"):
            _check_png(out / name, (100, 100))
    assert "wrote" in capsys.readouterr().out


def test_explain_batches_and_shows_progress(tmp_path, capsys):
    """explain runs the images a batch at a time under a progress bar counting images (as evaluate
    shows its own); the mean attention distance over batches equals the one over all images at once."""
    import re

    from keras_vit.commands import explain

    model = randomize(keras_vit.VisionTransformer(**dict(TINY, classes=1000)))
    rng = np.random.default_rng(1)
    paths = [explain.sample_image_path("grace_hopper")]
    for k in range(2):
        paths.append(str(tmp_path / f"noise{k}.png"))
        analysis.save_png(paths[-1], rng.integers(0, 256, (40 + 8 * k, 36, 3), dtype=np.uint8))
    summary = explain.explain(model, paths, str(tmp_path / "out"), components=4, log=lambda *_: None, batch_size=2)
    printed = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().out)
    assert "3/3" in printed and "/image" in printed, printed  # the bar reached every image
    batch = np.stack([explain._read_image(p, (32, 32))[1] for p in paths])
    whole = analysis.mean_attention_distance(analysis.attention_weights(model, batch), (4, 4), (8, 8))
    np.testing.assert_allclose(summary["mean_attention_distance_px"], np.round(whole, 2), atol=0.011)
    assert len(summary["top5"]) == 3  # one row per image, over both batches
    assert len([f for f in summary["files"] if os.path.basename(f).startswith("rollout_")]) == 6

    explain.explain(model, paths[:1], str(tmp_path / "quiet"), components=4, log=lambda *_: None, verbose=0)
    assert capsys.readouterr().out == ""


def test_cli_random_model_warns():
    from keras_vit.commands import explain

    with pytest.warns(UserWarning, match="randomly initialised"):
        model = explain.load_model(None, "ViTTi16", 64)
    assert model.input_shape == (None, 64, 64, 3)
    assert analysis.anatomy(model).grid_size == (4, 4)


def test_explain_greyscale_imagenet_head(tmp_path):
    from keras_vit.commands import explain

    model = randomize(keras_vit.VisionTransformer(**dict(TINY, classes=1000), num_channels=1))
    image = tmp_path / "odd size.png"
    analysis.save_png(str(image), np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8))
    paths = [explain.sample_image_path("grace_hopper"), str(image)]
    summary = explain.explain(model, paths, str(tmp_path / "out"), components=4, log=lambda *_: None)
    assert summary["grid_size"] == [4, 4] and not summary["hybrid"]
    assert len(summary["top5"]) == 2 and len(summary["top5"][0]) == 5  # ImageNet names for a 1000-way head
    _check_png(tmp_path / "out" / "rollout_odd_size.png", (70, 90))
    pcs = _check_png(tmp_path / "out" / "patch_embedding_components.png", (100, 100))
    # One channel: components drawn in grey (R = G = B).
    grey = (pcs[..., 0] == pcs[..., 1]) & (pcs[..., 1] == pcs[..., 2])
    assert grey.mean() > 0.95
