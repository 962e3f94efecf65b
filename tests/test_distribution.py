"""keras_vit.get_layout_map: which rule each real variable path meets, and the fallback rule.

These run on every backend (a LayoutMap is plain Python over a DeviceMesh of device names);
the sharded training itself is tested in test_distribution_jax.py / test_distribution_tf.py.
"""

import re
import warnings

import keras
import pytest
from conftest import TINY, TINY_HYBRID

import keras_vit
from keras_vit.distribution import rule_for
from keras_vit.models.family import families
from keras_vit.models.vit_family import ARCHITECTURES


def mesh(batch, model, names=("batch", "model")):
    # Device names only: the mesh is never handed to a backend in these tests.
    return keras.distribution.DeviceMesh((batch, model), names, [f"cpu:{i}" for i in range(batch * model)])


def axes_of(layout_map, path):
    layout = layout_map[path]
    return None if layout is None else tuple(layout.axes)


# The layout the brief asks for, written out by hand per variable kind (independent of the
# module's rule table): kind -> axes on a ("batch", "model") mesh.
EXPECTED = {
    "MultiHeadDotProductAttention_1/query_kernel": (None, "model", None),
    "MultiHeadDotProductAttention_1/key_kernel": (None, "model", None),
    "MultiHeadDotProductAttention_1/value_kernel": (None, "model", None),
    "MultiHeadDotProductAttention_1/query_bias": ("model", None),
    "MultiHeadDotProductAttention_1/key_bias": ("model", None),
    "MultiHeadDotProductAttention_1/value_bias": ("model", None),
    "MultiHeadDotProductAttention_1/out_kernel": ("model", None, None),
    "MultiHeadDotProductAttention_1/out_bias": (None,),
    "MlpBlock_3/Dense_0/kernel": (None, "model"),
    "MlpBlock_3/Dense_0/bias": ("model",),
    "MlpBlock_3/Dense_1/kernel": ("model", None),
    "MlpBlock_3/Dense_1/bias": (None,),
    "embedding/kernel": (None, None, None, "model"),
    "embedding/bias": ("model",),
    "cls/cls": (None, None, "model"),
    "posembed_input/pos_embedding": (None, None, "model"),
    "pre_logits/kernel": (None, "model"),
    "pre_logits/bias": ("model",),
    "head/kernel": ("model", None),
    "head/bias": (None,),
}


def expected_axes(path, ndim):
    for kind, axes in EXPECTED.items():
        if path == kind or path.endswith("/" + kind):
            return axes
    return (None,) * ndim  # norms and the hybrid ResNet: replicated


MODELS = {
    "tiny_pre_logits": dict(TINY, num_heads=4, hidden_size=32, mlp_dim=64, representation_size=16),
    "tiny_gap": dict(TINY, num_heads=4, hidden_size=32, mlp_dim=64, classifier="gap"),
    "tiny_hybrid": dict(TINY_HYBRID, num_heads=4, hidden_size=32),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_variable_meets_exactly_one_rule_with_the_expected_layout(name):
    model = keras_vit.VisionTransformer(**MODELS[name])
    layout_map = keras_vit.get_layout_map(mesh(2, 4))
    for v in model.weights:
        rule = rule_for(layout_map, v.path)  # raises if two rules match
        assert rule is not None, f"{v.path} {tuple(v.shape)} is matched by no rule (silently replicated)"
        axes = axes_of(layout_map, v.path)
        assert len(axes) == len(v.shape), (v.path, axes, v.shape)
        assert axes == expected_axes(v.path, len(v.shape)), (v.path, axes)
        # No big matrix is left whole: every Transformer kernel and embedding of 2+ dims is split.
        stem = re.match(r"(conv_root|gn_root|block\d+)/", v.path)
        if len(v.shape) >= 2 and not stem:
            assert "model" in axes, f"{v.path} {tuple(v.shape)} is replicated"


def test_split_dimensions_are_the_heads_and_hidden_units():
    """Each split lands on the dimension the Megatron pattern needs, by shape."""
    cfg = MODELS["tiny_pre_logits"]
    model = keras_vit.VisionTransformer(**cfg)
    layout_map = keras_vit.get_layout_map(mesh(2, 4))
    block = model.get_layer("encoderblock_0")
    heads, mlp, hidden = cfg["num_heads"], cfg["mlp_dim"], cfg["hidden_size"]
    for v, size in (
        (block.attention.query_kernel, heads),
        (block.attention.out_kernel, heads),
        (block.mlp.dense_0.kernel, mlp),
        (block.mlp.dense_1.kernel, mlp),
        (model.get_layer("embedding").kernel, hidden),
    ):
        axes = axes_of(layout_map, v.path)
        assert v.shape[axes.index("model")] == size, (v.path, v.shape, axes)


def test_paths_under_a_name_scope_and_of_a_reloaded_model_match(tmp_path):
    cfg = MODELS["tiny_pre_logits"]
    with keras.name_scope("outer"):
        scoped = keras_vit.VisionTransformer(**cfg)
    plain = keras_vit.VisionTransformer(**cfg)
    plain.save(tmp_path / "m.keras")
    reloaded = keras.saving.load_model(tmp_path / "m.keras")
    assert [v.path for v in reloaded.weights] == [v.path for v in plain.weights]
    layout_map = keras_vit.get_layout_map(mesh(1, 4))
    for a, b in zip(scoped.weights, plain.weights):
        assert a.path == "outer/" + b.path
        assert axes_of(layout_map, a.path) == axes_of(layout_map, b.path)


def test_residual_branch_outputs_are_batch_split():
    layout_map = keras_vit.get_layout_map(mesh(2, 4))
    for path in ("encoderblock_0/dropout/output", "encoderblock_11/MlpBlock_3/output"):
        assert axes_of(layout_map, path) == ("batch", None, None)
    # The attention layer itself may return (y, weights): no layout is forced on it.
    assert layout_map["encoderblock_0/MultiHeadDotProductAttention_1/output"] is None
    assert keras_vit.get_layout_map(mesh(1, 4), data_parallel_dim_name=None)[
        "encoderblock_0/MlpBlock_3/output"
    ].axes == (None, None, None)


def test_custom_axis_names():
    layout_map = keras_vit.get_layout_map(mesh(2, 2, ("data", "tp")), "tp", "data")
    assert axes_of(layout_map, "encoderblock_0/MlpBlock_3/Dense_1/kernel") == ("tp", None)
    assert axes_of(layout_map, "encoderblock_0/MlpBlock_3/output") == ("data", None, None)


def test_bad_axis_names_are_clear_errors():
    with pytest.raises(ValueError, match="not the model axis 'model'"):
        keras_vit.get_layout_map(mesh(2, 2, ("data", "tp")))
    with pytest.raises(ValueError, match="not the data axis 'batch'"):
        keras_vit.get_layout_map(mesh(2, 2, ("data", "model")))
    with pytest.raises(ValueError, match="must differ"):
        keras_vit.get_layout_map(mesh(2, 2), "model", "model")


def test_fallback_replicates_a_whole_group_and_says_so():
    cfg = dict(TINY)  # 3 heads, hidden 24, mlp 48
    with pytest.warns(UserWarning, match=r"num_heads|heads=3"):
        layout_map = keras_vit.get_layout_map(mesh(1, 2), config=cfg)
    for kind in ("query_kernel", "query_bias", "out_kernel"):
        axes = axes_of(layout_map, f"encoderblock_0/MultiHeadDotProductAttention_1/{kind}")
        assert "model" not in axes
    assert axes_of(layout_map, "encoderblock_0/MlpBlock_3/Dense_0/kernel") == (None, "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keras_vit.get_layout_map(mesh(1, 3), config=cfg)  # 3 divides 3, 24 and 48: no warning


def _table_shapes(arch, classes=1000):
    """Variable shapes of a table architecture at 224, from REFERENCE.md's layouts."""
    d, h, m, p = arch.hidden_size, arch.num_heads, arch.mlp_dim, arch.patch_size
    k = d // h
    if arch.resnet is None:
        channels_in, grid = 3, 224 // p
    else:
        units, width = arch.resnet
        channels_in = int(64 * width) * 2 ** max(len(units) - 1, 0) * (4 if units else 1)
        grid = 224 // (4 * 2 ** max(len(units) - 1, 0) * p)
    tokens = grid * grid + (arch.classifier == "token")
    shapes = {
        "embedding/kernel": (p, p, channels_in, d),
        "embedding/bias": (d,),
        "posembed_input/pos_embedding": (1, tokens, d),
        "head/kernel": (d, classes),
        "head/bias": (classes,),
    }
    if arch.classifier == "token":
        shapes["cls/cls"] = (1, 1, d)
    for name in ("query", "key", "value"):
        shapes[f"encoderblock_0/MultiHeadDotProductAttention_1/{name}_kernel"] = (d, h, k)
        shapes[f"encoderblock_0/MultiHeadDotProductAttention_1/{name}_bias"] = (h, k)
    shapes["encoderblock_0/MultiHeadDotProductAttention_1/out_kernel"] = (h, k, d)
    shapes["encoderblock_0/MlpBlock_3/Dense_0/kernel"] = (d, m)
    shapes["encoderblock_0/MlpBlock_3/Dense_1/kernel"] = (m, d)
    return shapes


@pytest.mark.parametrize("size", [1, 2, 4, 8, 16])
def test_every_constructor_gets_only_even_splits(size):
    """With config=, no table architecture is asked for a split the model axis does not divide."""
    for name, arch in ARCHITECTURES.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            layout_map = keras_vit.get_layout_map(mesh(1, size), config=name)
        for path, shape in _table_shapes(arch).items():
            axes = axes_of(layout_map, path)
            assert axes is not None and len(axes) == len(shape), (name, path)
            for n, axis in zip(shape, axes):
                assert axis is None or n % size == 0, (name, size, path, shape, axes)
        if size in (2, 4, 8, 16) and arch.num_heads % size == 0:
            assert "model" in axes_of(layout_map, "encoderblock_0/MultiHeadDotProductAttention_1/query_kernel")


def test_config_forms_agree():
    model = keras_vit.VisionTransformer(**MODELS["tiny_pre_logits"])
    forms = [model, model.get_config()]
    maps = [keras_vit.get_layout_map(mesh(1, 4), config=c) for c in forms]
    assert [dict((k, v.axes) for k, v in m.items()) for m in maps[1:]] == [
        dict((k, v.axes) for k, v in maps[0].items())
    ]
    by_name = keras_vit.get_layout_map(mesh(1, 8), config="ViT-L/16")
    assert axes_of(by_name, "encoderblock_0/MultiHeadDotProductAttention_1/query_kernel") == (None, "model", None)
    with pytest.warns(UserWarning, match="heads=12"):
        b16 = keras_vit.get_layout_map(mesh(1, 8), config="ViTB16")
    assert axes_of(b16, "encoderblock_0/MultiHeadDotProductAttention_1/query_kernel") == (None, None, None)
    assert axes_of(b16, "encoderblock_0/MlpBlock_3/Dense_0/kernel") == (None, "model")


def test_a_bit_resnet_gets_its_familys_rules():
    """A BiT ResNet's convolutions split along their output channels, everything else whole; every
    variable meets exactly one rule."""
    model = keras_vit.models.BiTResNet(image_size=32, block_units=[1, 1], width_factor=0.5, classes=3)
    layout_map = keras_vit.get_layout_map(mesh(2, 4), config=model)
    for v in model.weights:
        rule = rule_for(layout_map, v.path)  # raises if two rules match
        assert rule is not None, v.path
        axes = tuple(layout_map[rule].axes)
        assert len(axes) == len(v.shape), (v.path, axes)
        conv = len(v.shape) == 4 and not v.path.startswith("head/")
        assert axes == ((None, None, None, "model") if conv else (None,) * len(v.shape)), (v.path, axes)
        if conv:
            assert v.shape[-1] % 4 == 0


def _family_models():
    """A tiny model of every registered family, each split group divisible by 4."""
    models = {
        "vit": keras_vit.VisionTransformer(**MODELS["tiny_pre_logits"]),
        "bit": keras_vit.models.BiTResNet(image_size=32, block_units=[1, 1], width_factor=0.5, classes=3),
        "axial_vit": keras_vit.models.AxialVisionTransformer(image_size=32, patch_size=8, hidden_size=16, num_layers=1,
                                                             num_heads=4, mlp_dim=32, classes=3, representation_size=8),
        "axial_resnet": keras_vit.models.AxialResNet(image_size=16, block_units=(1, 1), width_multiplier=0.125, groups=4,
                                                     classes=3),
        "efficientnet": keras_vit.models.EfficientNet(image_size=32, width_multiplier=0.1, depth_multiplier=0.1,
                                                      classes=3),
    }
    assert sorted(models) == sorted(f.name for f in families())  # a new family needs a model here
    return models


# The split of each family, by hand from its architecture (regex of the path -> axes); every other
# variable is whole. The Transformers' are EXPECTED's kinds above.
FAMILY_SPLITS = {
    "bit": {r".*/(?:[abc]_standardized_conv2d|a_proj)/kernel|root_block/kernel": (None, None, None, "model")},
    "axial_resnet": {  # expansion and shortcut by output channels, the next reduction by input channels
        r"layer\d_\d/(?:conv_up|downsample_conv)/kernel": (None, None, None, "model"),
        r"layer\d_\d/conv_down/kernel": (None, None, "model", None),
        r"fc/kernel": ("model", None),
    },
    "efficientnet": {  # inverted residuals: expansion by output channels, projection by input channels
        r"blocks_[1-6]_\d+_conv_pw/kernel": (None, None, None, "model"),
        r"blocks_\d_\d+_conv_pwl/kernel": (None, None, "model", None),
        r"conv_head/kernel": (None, None, None, "model"),
        r"classifier/kernel": ("model", None),
    },
}


def _expected_family_axes(family, path, ndim):
    if family in ("vit", "axial_vit"):
        return expected_axes(path, ndim)
    for pattern, axes in FAMILY_SPLITS[family].items():
        if re.fullmatch(pattern, path):
            return axes
    return (None,) * ndim


@pytest.mark.backend_independent
def test_every_variable_of_every_family_meets_exactly_one_rule():
    for family, model in _family_models().items():
        layout_map = keras_vit.get_layout_map(mesh(2, 4), config=model)
        split = 0
        for v in model.weights:
            rule = rule_for(layout_map, v.path)  # raises if two rules match
            assert rule is not None, f"{family}: {v.path} {tuple(v.shape)} is matched by no rule"
            axes = axes_of(layout_map, v.path)
            assert axes == _expected_family_axes(family, v.path, len(v.shape)), (family, v.path, axes)
            for n, axis in zip(v.shape, axes):
                assert axis is None or n % 4 == 0, (family, v.path, v.shape, axes)
            split += "model" in axes
        assert split >= 4, family


def test_fallback_of_the_other_families_names_the_group():
    """A group the model axis does not divide is replicated whole, with a warning naming it; the
    groups it divides stay split."""
    resnet = dict(image_size=16, block_units=(1,), width_multiplier=0.125, classes=3, family="axial_resnet")
    with pytest.warns(UserWarning, match="channels=8"):  # 8 stem channels, 32 block outputs
        layout_map = keras_vit.get_layout_map(mesh(1, 3), config=resnet)
    for path in ("layer1_0/conv_up/kernel", "layer1_0/conv_down/kernel", "layer1_0/downsample_conv/kernel"):
        assert axes_of(layout_map, path) == (None,) * 4, path
    assert axes_of(layout_map, "fc/kernel") == (None, None)

    # B0's expanded widths (96 ... 1152) are multiples of 48, its head has 1280 channels.
    with pytest.warns(UserWarning, match="head=1280") as caught:
        layout_map = keras_vit.get_layout_map(mesh(1, 3), config="EfficientNetB0")
    assert not any("expansion" in str(w.message) for w in caught)
    assert axes_of(layout_map, "blocks_2_1_conv_pw/kernel") == (None, None, None, "model")
    assert axes_of(layout_map, "conv_head/kernel") == (None,) * 4
    assert axes_of(layout_map, "classifier/kernel") == (None, None)

    with pytest.warns(UserWarning, match="heads=12"):
        layout_map = keras_vit.get_layout_map(mesh(1, 8), config="AxialViTB16")
    assert axes_of(layout_map, "encoderblock_3_column/MultiHeadDotProductAttention_1/query_kernel") == (None,) * 3
    assert axes_of(layout_map, "encoderblock_3_column/MlpBlock_3/Dense_0/kernel") == (None, "model")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keras_vit.get_layout_map(mesh(1, 16), config="AxialResNet50L")  # 64 stem channels, blocks of 256 ... 2048
        keras_vit.get_layout_map(mesh(1, 16), config="EfficientNetL2")  # multiples of 48, 5504 = 16 x 344
