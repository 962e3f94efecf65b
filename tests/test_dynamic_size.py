"""Models whose input size is known only at run time (`dynamic_image_size=True`, the
constructors' `input_shape=(None, None, 3)`).

The reference is a fixed-size model built at each size and given the same weights: its position
embeddings are resized once, in NumPy, by `resize_position_embedding` (which test_resize.py checks
against scipy and torch). The dynamic model resamples inside the graph, per batch. Sizes are the
issue's 224, 288 and 160x320 scaled to a 32-pixel layout with patch 8: grids 4x4, 5x5 and 3x6.
"""

import numpy as np
import pytest
from conftest import BACKEND, TINY, randomize, rel_err

import keras
import keras_vit
from keras_vit import analysis
from keras_vit.layers.resize import interpolation_matrix, interpolation_matrix_tensor
from keras_vit.models import ViTConfig

SIZES = [(32, 32), (40, 40), (24, 48)]
RULES = ["original", "bilinear", "bicubic", "bicubic_antialias"]
# XLA on JAX (always) and TensorFlow; the PyTorch backend runs eagerly here.
JIT = BACKEND != "torch"
# Relative errors against the fixed-size models, about 10x the largest measured on JAX, TensorFlow
# and PyTorch (float32 rounding of the in-graph resampling): logits 9.7e-8, token sequences 1.8e-7,
# the hybrid 2.3e-7. A wrong resampling rule moves the logits by 1e-2.
LOGITS_BAR = 1e-6


def _images(size, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, (2, *size, 3)).astype("float32")


def _dynamic(**extra):
    kw = dict(TINY, num_layers=1, classes=5, classifier_activation=None, **extra)
    model = randomize(keras_vit.VisionTransformer(**kw, dynamic_image_size=True))
    model.compile(jit_compile=JIT)
    return model, kw


def _fixed(kw, tree, size):
    """The fixed-size reference: built at `size`, weights resized by set_weight_tree (NumPy)."""
    model = keras_vit.VisionTransformer(**dict(kw, image_size=size))
    keras_vit.set_weight_tree(model, tree, source_grid=ViTConfig(**kw).grid_size)
    return model


def test_in_graph_matrices_are_the_numpy_ones():
    cases = [(rule, n_in, n_out) for rule in RULES for n_in, n_out in [(4, 6), (5, 3)]] + [("original", 1, 2)]
    for rule, n_in, n_out in cases:  # up, down, and the one-cell grid the original handles apart
        got = keras.ops.convert_to_numpy(interpolation_matrix_tensor(n_in, n_out, rule))
        want = interpolation_matrix(n_in, n_out, rule)
        np.testing.assert_allclose(got, want, rtol=0, atol=2e-6, err_msg=f"{rule} {n_in} -> {n_out}")


@pytest.mark.filterwarnings("ignore:Skipping variable loading for optimizer")  # compiled, never trained
def test_logits_saving_analysis_and_features_equal_fixed_size_models(tmp_path):
    # "gap": the logits average every patch token, so each position embedding reaches them (a
    # one-block model's class token sees them only through attention: weakly).
    model, kw = _dynamic(position_embedding_resize="bicubic_antialias", classifier="gap")  # timm's rule
    tree = keras_vit.get_weight_tree(model)
    assert model.input_shape == (None, None, None, 3) and model.output_shape == (None, 5)
    for size in SIZES:  # one compiled function sees every size (TensorFlow relaxes the shape)
        x = _images(size)
        fixed = _fixed(kw, tree, size)
        ref = fixed.predict(x, verbose=0)
        assert rel_err(model.predict(x, verbose=0), ref) < LOGITS_BAR, size
    # The check tells the rules apart: resized with the original's rule instead, logits move by >1e-4.
    other = _fixed(dict(kw, position_embedding_resize="original"), tree, size)
    assert rel_err(other.predict(x, verbose=0), ref) > 1e-4

    # Saved and reloaded, it still takes any size (here the last, non-square one).
    model.save(tmp_path / "dynamic.keras")
    reloaded = keras.saving.load_model(tmp_path / "dynamic.keras")
    assert reloaded.dynamic_image_size and reloaded.input_shape == (None, None, None, 3)
    assert rel_err(reloaded.predict(x, verbose=0), ref) < LOGITS_BAR

    # Attention analysis reads the grid off the images.
    weights = analysis.attention_weights(model, x)
    assert weights.shape == (1, 2, 3, 3 * 6, 3 * 6)
    np.testing.assert_allclose(weights, analysis.attention_weights(fixed, x), rtol=0, atol=1e-7)  # 1.1e-8
    rollout = analysis.attention_rollout(model, x)
    assert rollout.shape == (2, 3, 6)
    np.testing.assert_allclose(rollout, analysis.attention_rollout(fixed, x), rtol=0, atol=1e-8)  # 6.8e-10
    np.testing.assert_allclose(
        analysis.attention_distance(model, x), analysis.attention_distance(fixed, x), rtol=0, atol=2e-7
    )  # 1.8e-8 pixels

    # Feature maps on the batch's grid.
    features = keras_vit.feature_extractor(model, [0, "encoder_norm"])
    reference = keras_vit.feature_extractor(fixed, [0, "encoder_norm"])
    for got, want in zip(features.predict(x, verbose=0), reference.predict(x, verbose=0)):
        assert got.shape == (2, 3, 6, 24)
        np.testing.assert_allclose(got, want, rtol=0, atol=7e-6)  # 7.2e-7 (values up to 5.4)


@pytest.mark.parametrize(
    "extra",
    [
        dict(position_embedding_resize="original", position_embedding="learned_2d"),
        dict(position_embedding="sincos2d"),
        # big_vision's layout: the embedding covers the patch grid only, added before the class token.
        dict(position_embedding_resize="original", class_token_position_embedding=False),
    ],
    ids=["learned_2d-original", "sincos2d", "big_vision-original"],
)
def test_other_position_embeddings_follow_the_grid(extra):
    # The token sequence (class token first), where every position embedding shows.
    model, kw = _dynamic(include_top=False, **extra)
    x = _images(SIZES[2], seed=4)
    ref = _fixed(kw, keras_vit.get_weight_tree(model), SIZES[2]).predict(x, verbose=0)
    assert rel_err(model.predict(x, verbose=0), ref) < 2e-6  # 1.8e-7


def test_hybrid_follows_the_input_size():
    # Stem-only hybrid (ResNet root, stride 4) with patch 2: 8 input pixels per token.
    model, kw = _dynamic(resnet=((), 1), patch_size=2, position_embedding_resize="bicubic", include_top=False)
    tree = keras_vit.get_weight_tree(model)
    for size in [(32, 32), (24, 48)]:
        x = _images(size, seed=1)
        assert rel_err(model.predict(x, verbose=0), _fixed(kw, tree, size).predict(x, verbose=0)) < 2.5e-6, size  # 2.3e-7
    with pytest.raises(ValueError, match="Image width 30 is not divisible by the model's stride 8"):
        model(_images((32, 30)))  # ResNet features 8 wide: the patch divides them, the stride not the image
    with pytest.raises(ValueError, match=r"input width 7 is not divisible by the patch size 2.*model\.stride"):
        model(_images((32, 28)))


def test_constructors_and_loading(tmp_path):
    model = keras_vit.ViTTi16(weights=None, input_shape=(None, None, 3), classes=3)
    assert model.input_shape == (None, None, None, 3) and model.dynamic_image_size
    assert model.image_size == (224, 224)  # the grid a new model's position embeddings are laid out on
    with pytest.raises(ValueError, match=r"\(None, None, 3\) for any size"):
        keras_vit.ViTTi16(weights=None, input_shape=(None, None, None))

    # A checkpoint loaded for any size keeps its own grid and resamples it per batch.
    base = randomize(keras_vit.VisionTransformer(**TINY, position_embedding_resize="bicubic"))
    keras_vit.save_preset(base, tmp_path / "preset")
    loaded = keras_vit.load_checkpoint(tmp_path / "preset", dynamic_image_size=True)
    assert loaded.grid_size == (4, 4) and loaded.input_shape == (None, None, None, 3)
    at_size = keras_vit.load_checkpoint(tmp_path / "preset", image_size=SIZES[2])
    x = _images(SIZES[2], seed=3)
    assert rel_err(loaded.predict(x, verbose=0), at_size.predict(x, verbose=0)) < LOGITS_BAR  # 8.7e-8


def test_refusals():
    with pytest.raises(ValueError, match="relative ones cannot"):
        keras_vit.VisionTransformer(**TINY, position_embedding="relative", dynamic_image_size=True)
    model = keras_vit.VisionTransformer(**TINY, dynamic_image_size=True)
    with pytest.raises(ValueError, match=r"input height 30 is not divisible by the patch size 8.*e\.g\. 24 or 32"):
        model(_images((30, 32)))
