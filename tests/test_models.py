"""Core models: forward pass against an independent NumPy implementation, shapes, errors."""

import re

import keras
import numpy as np
import pytest
from conftest import TINY, TINY_HYBRID, randomize, rel_err
from reference_numpy import vit_forward

import keras_vit
from keras_vit.models.config import NUMERICS
from keras_vit.models.vit_family import ZOO_ARCHITECTURES


def images(shape, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype("float32")


@pytest.mark.parametrize("gelu_approximate", [True, False], ids=["tanh", "erf"])
@pytest.mark.parametrize("classifier", ["token", "gap"])
def test_vit_forward_matches_numpy(gelu_approximate, classifier):
    model = keras_vit.VisionTransformer(
        **TINY, classifier=classifier, gelu_approximate=gelu_approximate, classifier_activation=None
    )
    randomize(model)
    x = images((2, 32, 32, 3))
    ref = vit_forward(
        keras_vit.get_weight_tree(model), x, patch_size=8, num_layers=2, classifier=classifier,
        gelu_approximate=gelu_approximate,
    )
    out = model.predict(x, verbose=0)
    assert out.shape == (2, 7)
    assert rel_err(out, ref) < 2e-5


def test_representation_layer_and_non_square_input():
    model = keras_vit.VisionTransformer(
        **{**TINY, "image_size": (16, 40)}, representation_size=10, classifier_activation=None,
        layer_norm_epsilon=1e-12,
    )
    randomize(model, seed=3)
    x = images((3, 16, 40, 3))
    ref = vit_forward(keras_vit.get_weight_tree(model), x, patch_size=8, num_layers=2, layer_norm_epsilon=1e-12)
    assert rel_err(model.predict(x, verbose=0), ref) < 2e-5


def test_token_sequence_without_top_matches_numpy():
    model = keras_vit.VisionTransformer(**TINY, include_top=False)
    randomize(model, seed=4)
    x = images((2, 32, 32, 3))
    ref = vit_forward(keras_vit.get_weight_tree(model), x, patch_size=8, num_layers=2, include_top=False)
    out = model.predict(x, verbose=0)
    assert out.shape == (2, 17, 24)
    assert rel_err(out, ref) < 2e-5


@pytest.mark.parametrize("numerics", ["original", "timm"])
def test_hybrid_forward_matches_numpy(numerics):
    n = NUMERICS[numerics]
    kw = {k: n[k] for k in ("gelu_approximate", "group_norm_epsilon", "std_conv_epsilon", "std_conv_epsilon_inside_sqrt")}
    model = keras_vit.VisionTransformer(**TINY_HYBRID, classifier_activation=None, **kw)
    randomize(model, seed=5)
    x = images((2, 64, 64, 3))
    ref = vit_forward(
        keras_vit.get_weight_tree(model), x, patch_size=1, num_layers=2, resnet_units=(1, 1), width_factor=0.5, **kw
    )
    assert rel_err(model.predict(x, verbose=0), ref) < 2e-5


def test_stem_only_hybrid_with_odd_sizes_matches_numpy():
    # 56x72: SAME padding is asymmetric at the stride-2 root conv and pool of odd-sized maps.
    model = keras_vit.VisionTransformer(
        image_size=(56, 72), patch_size=2, hidden_size=24, num_layers=1, num_heads=2, mlp_dim=16, classes=3,
        resnet=((), 0.5), classifier_activation=None,
    )
    randomize(model, seed=6)
    x = images((2, 56, 72, 3))
    ref = vit_forward(keras_vit.get_weight_tree(model), x, patch_size=2, num_layers=1, resnet_units=(), width_factor=0.5)
    assert rel_err(model.predict(x, verbose=0), ref) < 2e-5


@pytest.mark.slow
@pytest.mark.parity
@pytest.mark.parametrize(
    "units,image_size,numerics",
    [((3, 4, 9), (48, 32), "original"), ((2, 2, 2, 2), (96, 64), "timm")],
    ids=["R50-3-4-9", "R26"],
)
def test_r50_and_r26_hybrids_at_a_non_square_size_match_numpy(units, image_size, numerics):
    """The R50 (3,4,9) and R26 (2,2,2,2) ResNets in full depth (narrow: width factor 0.5) at a
    non-square size: every stage's stride and projection, TF-style SAME padding on both axes."""
    n = NUMERICS[numerics]
    kw = {k: n[k] for k in ("gelu_approximate", "group_norm_epsilon", "std_conv_epsilon", "std_conv_epsilon_inside_sqrt")}
    model = keras_vit.VisionTransformer(
        image_size=image_size, patch_size=1, hidden_size=32, num_layers=1, num_heads=2, mlp_dim=32, classes=5,
        resnet=(units, 0.5), classifier_activation=None, **kw,
    )
    randomize(model, seed=8)
    stride = 4 * 2 ** (len(units) - 1)
    assert model.grid_size == (image_size[0] // stride, image_size[1] // stride)
    x = images((2, *image_size, 3), seed=3)
    ref = vit_forward(keras_vit.get_weight_tree(model), x, patch_size=1, num_layers=1, resnet_units=units,
                      width_factor=0.5, **kw)
    assert rel_err(model.predict(x, verbose=0), ref) < 2e-5


def test_pooling_modes():
    x = images((2, 32, 32, 3))
    base = keras_vit.VisionTransformer(**TINY, include_top=False)
    randomize(base, seed=7)
    tokens = base.predict(x, verbose=0)
    tree = keras_vit.get_weight_tree(base)
    for pooling, expected in (("token", tokens[:, 0]), ("gap", tokens[:, 1:].mean(1)), ("max", tokens[:, 1:].max(1))):
        m = keras_vit.VisionTransformer(**TINY, include_top=False, pooling=pooling)
        keras_vit.set_weight_tree(m, tree)
        np.testing.assert_allclose(m.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-5)


def test_head_is_zero_initialised_and_softmax_output():
    model = keras_vit.VisionTransformer(**TINY)
    head = model.get_layer("head")
    assert not np.any(head.kernel.numpy()) and not np.any(head.bias.numpy())
    out = model.predict(images((1, 32, 32, 3)), verbose=0)
    np.testing.assert_allclose(out, np.full((1, 7), 1 / 7), rtol=1e-6)


# === Full-size constructors ===

PARAMS_224 = {  # REFERENCE.md, 1000 classes
    "ViTTi16": 5_717_416, "ViTS16": 22_050_664, "ViTS32": 22_878_952, "ViTB8": 86_576_872,
    "ViTB16": 86_567_656, "ViTB32": 88_224_232, "ViTL16": 304_326_632, "ViTL32": 306_535_400,
    "ViTH14": 632_045_800, "RViTTi16": 6_337_704, "R26ViTS32": 36_431_912, "R26ViTB32": 101_383_976,
    "R50ViTB16": 98_659_112, "R50ViTL32": 328_994_856,
}
STRIDE = {"ViTTi16": 16, "ViTS16": 16, "ViTS32": 32, "ViTB8": 8, "ViTB16": 16, "ViTB32": 32, "ViTL16": 16,
          "ViTL32": 32, "ViTH14": 14, "RViTTi16": 32, "R26ViTS32": 32, "R26ViTB32": 32, "R50ViTB16": 16,
          "R50ViTB32": 32, "R50ViTL16": 16, "R50ViTL32": 32}
HIDDEN = {"Ti": 192, "S": 384, "B": 768, "L": 1024, "H": 1280}
# The paper's R50+ViT-B/32 and R50+ViT-L/16 have no published weights and no REFERENCE.md row. timm
# builds them from its own parts: its R50 backbone (ResNetV2, StdConv, GroupNorm) with the stages
# (3, 4, 6, 3) or (3, 4, 9), patch 1, under ViT-B or ViT-L (as it builds R50+ViT-L/32 and B/16).
TIMM_HYBRIDS = {"R50ViTB16": ((3, 4, 9), 768, 12, 12), "R50ViTB32": ((3, 4, 6, 3), 768, 12, 12),
                "R50ViTL16": ((3, 4, 9), 1024, 24, 16), "R50ViTL32": ((3, 4, 6, 3), 1024, 24, 16)}


def _timm_hybrid_count(layers, width, depth, heads):
    """timm's parameter count of a ResNetV2-`layers` + ViT hybrid at 224, 1000 classes, built on
    PyTorch's meta device (shapes only: no memory, no initialisation)."""
    torch = pytest.importorskip("torch")
    hybrid = pytest.importorskip("timm.models.vision_transformer_hybrid")
    with torch.device("meta"):
        model = hybrid._create_vision_transformer_hybrid(
            "vit_base_r50_s16_224", backbone=hybrid._resnetv2(layers), embed_dim=width, depth=depth,
            num_heads=heads, img_size=224, num_classes=1000,
        )
    return sum(p.numel() for p in model.parameters())


def _hidden(name):
    return HIDDEN[re.search(r"ViT(Ti|S|B|L|H)\d+$", name).group(1)]


def test_every_constructor_is_tabled():
    # timm's zoo constructors (DINOv2, CLIP, SigLIP, DeiT): tests/test_timm_zoo_presets.py
    zoo = set(ZOO_ARCHITECTURES)
    assert set(STRIDE) == set(keras_vit.applications.CONSTRUCTORS_BY_FAMILY["vit"]) - zoo
    # Every constructor's count is checked: against REFERENCE.md or timm.
    assert set(PARAMS_224) | set(TIMM_HYBRIDS) == set(STRIDE)


@pytest.mark.slow
def test_timm_hybrid_counts_reproduce_the_reference_rows():
    # The timm builder behind the counts of R50ViTB32 and R50ViTL16 gives REFERENCE.md's counts of
    # the two R50 hybrids that have a row.
    for name in ("R50ViTB16", "R50ViTL32"):
        assert _timm_hybrid_count(*TIMM_HYBRIDS[name]) == PARAMS_224[name], name


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STRIDE))
def test_constructor_shapes_and_parameter_counts(name):
    # Shapes and counts need no values: variables are left uninitialised (keras.StatelessScope),
    # which keeps the full-size builds cheap.
    ctor = getattr(keras_vit, name)
    with keras.StatelessScope(initialize_variables=False):
        model = ctor(weights=None)
    assert model.output_shape == (None, 1000)
    expected = PARAMS_224[name] if name in PARAMS_224 else _timm_hybrid_count(*TIMM_HYBRIDS[name])
    assert model.count_params() == expected  # R50ViTB32: 110,945,832; R50ViTL16: 316,483,624
    keras.utils.clear_session()
    # Non-square input, no top: the token sequence of the grid the stride gives.
    s = STRIDE[name]
    h, w = 6 * s if s > 14 else 12 * s, 4 * s if s > 14 else 8 * s
    with keras.StatelessScope(initialize_variables=False):
        feats = ctor(weights=None, include_top=False, input_shape=(h, w, 3))
    assert feats.output_shape == (None, 1 + (h // s) * (w // s), _hidden(name))
    keras.utils.clear_session()


def test_gap_architecture_parameter_count():
    from keras_vit.models.family import get_architecture

    model = keras_vit.VisionTransformer(image_size=224, **get_architecture("ViTB16Gap").kwargs())
    assert model.count_params() == 86_566_120


def test_small_model_predicts_at_224_and_non_square():
    m = keras_vit.ViTTi16(weights=None, input_shape=(160, 96, 3), classes=4, dropout_rate=0.1)
    assert m.predict(images((1, 160, 96, 3)), verbose=0).shape == (1, 4)
    assert m.get_layer("posembed_input").pos_embedding.shape == (1, 1 + 10 * 6, 192)


# === Errors ===


def test_error_image_size_not_divisible():
    with pytest.raises(ValueError, match=r"Image height 230 is not divisible by the patch size 16.*224 or 240"):
        keras_vit.ViTB16(weights=None, input_shape=(230, 224, 3))
    with pytest.raises(ValueError, match=r"width 200 .* ResNet stride 16 \(= 16\)"):
        keras_vit.R50ViTB16(weights=None, input_shape=(224, 200, 3))


def test_error_unknown_override_suggests():
    with pytest.raises(ValueError, match=r"'dropout' \(did you mean 'dropout_rate'\?\)"):
        keras_vit.ViTTi16(weights=None, dropout=0.1)
    with pytest.raises(ValueError, match="Unknown override"):
        keras_vit.ViTTi16(weights=None, hidden_size=10)


def test_error_classifier_and_pooling():
    with pytest.raises(ValueError, match=r"classifier must be 'token' .* got 'avg'"):
        keras_vit.VisionTransformer(**{**TINY, "classifier": "avg"})
    with pytest.raises(ValueError, match=r"pooling must be one of .* got 'mean'"):
        keras_vit.ViTTi16(weights=None, include_top=False, pooling="mean")
    with pytest.raises(ValueError, match="needs a class token"):
        keras_vit.VisionTransformer(**{**TINY, "classifier": "gap"}, include_top=False, pooling="token")


def test_error_bad_input_shape_and_heads():
    with pytest.raises(ValueError, match=r"input_shape must be \(height, width, channels\)"):
        keras_vit.ViTTi16(weights=None, input_shape=(224, 224, 3, 1))  # (None, None, 3): tests/test_dynamic_size.py
    with pytest.raises(ValueError, match="not divisible by num_heads 5"):
        keras_vit.VisionTransformer(**{**TINY, "num_heads": 5})


def test_symbolic_attention_weights_outputs():
    """A functional model can expose a block's attention weights: the symbolic call with
    return_attention_weights=True yields (tokens, weights) specs, and the model's weights are
    softmax rows over the tokens, equal to an eager call's."""
    from keras_vit.layers import EncoderBlock, MultiHeadDotProductAttention

    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 24)).astype("float32")
    for layer in (MultiHeadDotProductAttention(3), EncoderBlock(3, 48)):
        inputs = keras.Input((5, 24))
        tokens, weights = layer(inputs, return_attention_weights=True)
        assert tuple(tokens.shape) == (None, 5, 24) and tuple(weights.shape) == (None, 3, 5, 5)
        assert tuple(layer(inputs).shape) == (None, 5, 24)  # the plain call still gives one output
        out_tokens, out_weights = keras.Model(inputs, [tokens, weights]).predict(x, verbose=0)
        eager_tokens, eager_weights = layer(x, return_attention_weights=True)
        np.testing.assert_allclose(out_weights.sum(-1), 1.0, rtol=1e-5)
        np.testing.assert_allclose(out_weights, keras.ops.convert_to_numpy(eager_weights), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(out_tokens, keras.ops.convert_to_numpy(eager_tokens), rtol=1e-5, atol=1e-5)
