"""Axial-ViT (keras_vit's reading of the paper's Appendix D.6): parameter counts, the axial
structure (a row block mixes only within rows, a column block only within columns), the forward
pass against an independent NumPy implementation, FLOPs, .keras files, presets and training."""

import math

import keras
import numpy as np
import pytest
from conftest import randomize, rel_err
from reference_numpy import gelu, layer_norm, softmax

import keras_vit
from keras_vit.models import AxialVisionTransformer

TINY_AXIAL = dict(image_size=(32, 48), patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=40, classes=5)


def _images(shape, seed=1):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype("float32")


def _vit_b_axial_params(patch, image=224, classes=1000, channels=3):
    """Axial-ViT-B/patch counted from the architecture: 12 layers x 2 blocks of ViT-B's block."""
    d, m, layers = 768, 3072, 12
    attention = 4 * (d * d + d)  # query, key, value, out: kernels and biases
    mlp = d * m + m + m * d + d
    norms = 2 * 2 * d
    blocks = 2 * layers * (attention + mlp + norms)
    grid = (image // patch) ** 2
    embedding = patch * patch * channels * d + d
    position = grid * d  # no class token
    head = d * classes + classes
    return blocks + embedding + position + 2 * d + head  # + the final LayerNorm


@pytest.mark.parametrize("name,patch", [("AxialViTB16", 16), ("AxialViTB32", 32)])
def test_full_size_parameter_counts(name, patch):
    # Counted on uninitialised variables (keras.StatelessScope): no values are needed.
    expected = _vit_b_axial_params(patch)
    if name == "AxialViTB16":
        assert expected == 171_620_584  # REFERENCE.md's figure
    with keras.StatelessScope(initialize_variables=False):
        model = getattr(keras_vit, name)(weights=None)
    assert isinstance(model, AxialVisionTransformer)
    assert model.output_shape == (None, 1000)
    assert model.count_params() == expected
    keras.utils.clear_session()
    with keras.StatelessScope(initialize_variables=False):
        grid = getattr(keras_vit, name)(weights=None, include_top=False, input_shape=(6 * patch, 4 * patch, 3))
    assert grid.output_shape == (None, 6, 4, 768)
    keras.utils.clear_session()


# === Structure: which tokens a block mixes ===


def _moved(before, after):
    """(rows, cols) boolean map of the grid positions whose features changed, checked to be a
    clean split: the unchanged ones moved less than 1e-5 of the largest change."""
    change = np.abs(after - before).max(axis=-1)
    moved = change > 1e-3 * change.max()
    assert change[~moved].max(initial=0.0) < 1e-5 * change.max()
    return moved


def test_row_block_mixes_within_rows_and_column_block_within_columns():
    # Keras' own initialisation keeps the attention far from one-hot, so a change reaches every
    # token a block lets it reach.
    model = AxialVisionTransformer(**TINY_AXIAL, include_top=False)
    rows, cols = model.grid_size  # 4 x 6
    x = _images((1, 32, 48, 3))
    r, c = 1, 4
    y = x.copy()
    y[0, 8 * r : 8 * (r + 1), 8 * c : 8 * (c + 1)] += 0.5  # perturb one patch
    row_block = model.get_layer("encoderblock_0_row")
    column_block = model.get_layer("encoderblock_0_column")
    after_row = keras.Model(model.inputs[0], row_block.output)
    a, b = (keras.ops.convert_to_numpy(t) for t in (after_row(x), after_row(y)))
    moved = _moved(a[0], b[0])
    expected = np.zeros((rows, cols), bool)
    expected[r, :] = True  # the whole row r, nothing else
    np.testing.assert_array_equal(moved, expected)
    # The column block alone, on a grid perturbed at one position: only that column moves.
    grid = np.random.default_rng(3).standard_normal((1, rows, cols, 24)).astype("float32")
    other = grid.copy()
    other[0, r, c] += np.random.default_rng(4).standard_normal(24).astype("float32")  # not a constant: LN removes one
    a, b = (keras.ops.convert_to_numpy(column_block(g)) for g in (grid, other))
    expected = np.zeros((rows, cols), bool)
    expected[:, c] = True
    np.testing.assert_array_equal(_moved(a[0], b[0]), expected)
    # One layer (row, then column) reaches every position of the grid.
    after_layer = keras.Model(model.inputs[0], column_block.output)
    a, b = (keras.ops.convert_to_numpy(t) for t in (after_layer(x), after_layer(y)))
    assert _moved(a[0], b[0]).all()


# === Forward pass against NumPy ===


def _numpy_block(t, prefix, x, axis, heads, eps=1e-6):
    """One Axial Transformer block in NumPy, float64: x (batch, rows, cols, d)."""
    p = lambda k: np.asarray(t[f"{prefix}/{k}"], np.float64)  # noqa: E731
    if axis == "column":
        x = x.transpose(0, 2, 1, 3)
    y = layer_norm(x, p("LayerNorm_0/scale"), p("LayerNorm_0/bias"), eps)
    a = "MultiHeadDotProductAttention_1"
    q, k, v = (np.einsum("blsd,dhk->blshk", y, p(f"{a}/{n}/kernel")) + p(f"{a}/{n}/bias") for n in ("query", "key", "value"))
    logits = np.einsum("blqhk,blthk->blhqt", q, k) / math.sqrt(q.shape[-1])
    out = np.einsum("blhqt,blthk->blqhk", softmax(logits), v)
    x = x + np.einsum("blqhk,hkd->blqd", out, p(f"{a}/out/kernel")) + p(f"{a}/out/bias")
    y = layer_norm(x, p("LayerNorm_2/scale"), p("LayerNorm_2/bias"), eps)
    h = gelu(y @ p("MlpBlock_3/Dense_0/kernel") + p("MlpBlock_3/Dense_0/bias"), approximate=True)
    x = x + h @ p("MlpBlock_3/Dense_1/kernel") + p("MlpBlock_3/Dense_1/bias")
    return x.transpose(0, 2, 1, 3) if axis == "column" else x


def _numpy_axial_vit(t, images, *, patch, layers, heads, representation=False):
    t = {k: np.asarray(v, np.float64) for k, v in t.items()}
    b, h, w, c = images.shape
    rows, cols = h // patch, w // patch
    patches = images.astype(np.float64).reshape(b, rows, patch, cols, patch, c).transpose(0, 1, 3, 2, 4, 5)
    x = np.einsum("brcijk,ijkd->brcd", patches, t["embedding/kernel"]) + t["embedding/bias"]
    x = x + t["Transformer/posembed_input/pos_embedding"].reshape(rows, cols, -1)
    for i in range(layers):
        for axis in ("row", "column"):
            x = _numpy_block(t, f"Transformer/encoderblock_{i}_{axis}", x, axis, heads)
    x = layer_norm(x, t["Transformer/encoder_norm/scale"], t["Transformer/encoder_norm/bias"], 1e-6)
    x = x.mean(axis=(1, 2))
    if representation:
        x = np.tanh(x @ t["pre_logits/kernel"] + t["pre_logits/bias"])
    return x @ t["head/kernel"] + t["head/bias"]


def test_forward_matches_numpy_on_a_non_square_grid():
    model = randomize(
        AxialVisionTransformer(**TINY_AXIAL, representation_size=16, classifier_activation=None), seed=4, scale=2.0
    )  # weights large enough that the GELU's form shows: the erf form is 1.9e-5 away
    x = _images((2, 32, 48, 3), seed=5)
    ref = _numpy_axial_vit(keras_vit.get_weight_tree(model), x, patch=8, layers=2, heads=3, representation=True)
    # Measured 1.4e-7 (JAX) and 1.5e-7 (TensorFlow), float32; the bound is about 10x that.
    assert rel_err(model.predict(x, verbose=0), ref) < 1.5e-6


def test_row_block_attention_is_keras_multi_head_attention_on_each_row():
    """An independent check: one row of a row block's output, with the block's MLP output zeroed
    (its last Dense), is that row plus `keras.layers.MultiHeadAttention` (the block's weights
    copied in) applied to the row after a `keras.layers.LayerNormalization`; the block's softmax
    weights for that row are the Keras layer's attention scores. Same for a column of a column
    block."""
    model = randomize(AxialVisionTransformer(**TINY_AXIAL, include_top=False), seed=9, scale=1.5)
    tree = keras_vit.get_weight_tree(model)
    grid = np.random.default_rng(10).standard_normal((2, 4, 6, 24)).astype("float32")
    for axis, line in (("row", 2), ("column", 5)):
        prefix = f"Transformer/encoderblock_1_{axis}/"
        tree[prefix + "MlpBlock_3/Dense_1/kernel"] = np.zeros_like(tree[prefix + "MlpBlock_3/Dense_1/kernel"])
        tree[prefix + "MlpBlock_3/Dense_1/bias"] = np.zeros_like(tree[prefix + "MlpBlock_3/Dense_1/bias"])
        for name in ("query", "key"):  # sharper attention than the random scale gives
            tree[prefix + f"MultiHeadDotProductAttention_1/{name}/kernel"] *= 3.0
        keras_vit.set_weight_tree(model, tree)
        block = model.get_layer(f"encoderblock_1_{axis}")
        out, weights = (keras.ops.convert_to_numpy(t) for t in block(grid, return_attention_weights=True))
        sequence = grid[:, line] if axis == "row" else grid[:, :, line]  # (batch, length, 24)
        got = out[:, line] if axis == "row" else out[:, :, line]

        norm = keras.layers.LayerNormalization(epsilon=1e-6)
        norm.build(sequence.shape)
        norm.set_weights([tree[prefix + "LayerNorm_0/scale"], tree[prefix + "LayerNorm_0/bias"]])
        attention = keras.layers.MultiHeadAttention(num_heads=3, key_dim=8)
        y = norm(sequence)
        attention(y, y)  # builds it
        a = prefix + "MultiHeadDotProductAttention_1/"
        for dense, name in ((attention.query_dense, "query"), (attention.key_dense, "key"),
                            (attention.value_dense, "value"), (attention.output_dense, "out")):
            dense.set_weights([tree[a + name + "/kernel"], tree[a + name + "/bias"]])
        attended, scores = attention(y, y, return_attention_scores=True)
        want = sequence + keras.ops.convert_to_numpy(attended)
        # Measured <= 1.8e-7 of the scale (TensorFlow; 0 on JAX and PyTorch); the bounds are about 10x.
        assert rel_err(got, want) < 2e-6, axis
        np.testing.assert_allclose(weights[:, line], keras.ops.convert_to_numpy(scores), rtol=0, atol=3e-6)
        # The call without attention weights takes the fused attention path: the same output.
        plain = keras.ops.convert_to_numpy(block(grid))
        assert rel_err(plain[:, line] if axis == "row" else plain[:, :, line], want) < 2e-6, axis
        # The attention is not near-uniform, and other lines' values differ: the check has teeth.
        assert keras.ops.convert_to_numpy(scores).max() > 0.5


def test_attention_maps_are_per_row_and_per_column():
    model = AxialVisionTransformer(**TINY_AXIAL)
    x = _images((2, 32, 48, 3))
    maps = model.attention_weights(x)
    assert maps["row"].shape == (2, 2, 4, 3, 6, 6)  # (layers, batch, rows, heads, cols, cols)
    assert maps["column"].shape == (2, 2, 6, 3, 4, 4)  # (layers, batch, cols, heads, rows, rows)
    for m in maps.values():
        np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-5)
    # keras_vit.analysis' whole-grid maps do not exist for it, and it says so.
    with pytest.raises(ValueError, match="Axial-ViT.*model.attention_weights"):
        keras_vit.analysis.attention_weights(model, x)


# === FLOPs ===


def test_flops_by_the_table_6_convention():
    # Axial-ViT-B/16 at 224: a 14 x 14 grid; each of the 24 blocks projects all 196 tokens
    # (q, k, v, out) and runs the MLP on them; attention (QK^T and AV) runs within 14 rows (or
    # columns) of 14 tokens. 2 FLOPs per multiply-add.
    d, m, n = 768, 3072, 14
    tokens = n * n
    per_block = 2 * tokens * 4 * d * d + 2 * 2 * tokens * d * m + n * 2 * (2 * n * n * d)
    expected = 24 * per_block + 2 * tokens * 16 * 16 * 3 * d + 2 * d * 1000
    assert keras_vit.flops("AxialViTB16") == expected
    assert round(expected / 1e9, 1) == 67.0
    assert 1.85 < keras_vit.flops("AxialViTB16") / keras_vit.flops("ViTB16") < 1.95  # "about 1.9x" (D.6)
    # A model is counted at its own size, without a head when it has none: TINY_AXIAL's 4 x 6
    # grid of 24 tokens, width 24, MLP 40, two layers.
    model = AxialVisionTransformer(**TINY_AXIAL, include_top=False)
    d, m = 24, 40
    dense = 2 * (2 * 24 * 4 * d * d + 2 * 2 * 24 * d * m)  # both blocks' projections and MLPs
    attention = 4 * 2 * 2 * 6 * 6 * d + 6 * 2 * 2 * 4 * 4 * d  # 4 rows of 6 tokens, 6 columns of 4
    assert keras_vit.flops(model) == 2 * 24 * 8 * 8 * 3 * d + 2 * (dense + attention)


# === Constructors, files, training ===


def test_constructor_errors():
    with pytest.raises(ValueError, match="one input size"):
        keras_vit.AxialViTB32(weights=None, input_shape=(None, None, 3))
    with pytest.raises(ValueError, match="No pretrained weights are published for AxialViTB16"):
        keras_vit.AxialViTB16()
    with pytest.raises(ValueError, match="divisible by the patch size 32"):
        keras_vit.AxialViTB32(weights=None, input_shape=(200, 224, 3))
    with pytest.raises(ValueError, match="attention_axes"):
        keras_vit.AxialViTB32(weights=None, attention_axes=("diagonal",))


def test_keras_file_and_preset_round_trip(tmp_path):
    model = randomize(AxialVisionTransformer(**TINY_AXIAL, classifier_activation=None), seed=6)
    x = _images((2, 32, 48, 3), seed=7)
    expected = model.predict(x, verbose=0)
    model.save(tmp_path / "axial.keras")
    keras.utils.clear_session()
    loaded = keras.saving.load_model(tmp_path / "axial.keras")  # safe_mode, no custom_objects
    assert type(loaded) is AxialVisionTransformer
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), expected)
    # Through keras_vit's own loader, and as a preset folder (config.json + model.weights.h5).
    np.testing.assert_array_equal(keras_vit.load_checkpoint(str(tmp_path / "axial.keras")).predict(x, verbose=0), expected)
    keras_vit.save_preset(model, tmp_path / "preset")
    card = (tmp_path / "preset" / "README.md").read_text()
    assert "Axial-ViT" in card and "row+column" in card
    again = keras_vit.load_checkpoint(str(tmp_path / "preset"))
    assert type(again) is AxialVisionTransformer
    np.testing.assert_array_equal(again.predict(x, verbose=0), expected)
    # Another size: the position embedding is resized to the new grid; a new head replaces the old.
    features = keras_vit.load_checkpoint(str(tmp_path / "preset"), image_size=64, include_top=False, pooling="avg")
    assert features.output_shape == (None, 24)


def test_trains_with_the_fine_tuning_recipe():
    model = AxialVisionTransformer(**TINY_AXIAL, classifier_activation=None)
    optimizer = keras_vit.training.finetune_optimizer(0.01, total_steps=4, warmup_steps=0)
    model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _images((8, 32, 48, 3), seed=8), np.arange(8) % 5
    before = keras_vit.get_weight_tree(model)
    history = model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    after = keras_vit.get_weight_tree(model)
    # The zero head learns in the first step, the blocks behind it in the second.
    assert np.abs(after["head/kernel"] - before["head/kernel"]).max() > 0
    assert np.abs(after["Transformer/encoderblock_0_row/MlpBlock_3/Dense_0/kernel"]
                  - before["Transformer/encoderblock_0_row/MlpBlock_3/Dense_0/kernel"]).max() > 0


def test_layer_decay_groups_each_layer_with_its_row_and_column_blocks():
    from keras_vit.models.weight_tree import weight_variables

    model = randomize(AxialVisionTransformer(**TINY_AXIAL, classifier_activation=None), seed=5)
    variables = weight_variables(model)

    def expected(key):  # 4 groups: the stem, layer 0, layer 1 with the final norm, pre_logits/head
        if key.startswith(("embedding/", "Transformer/posembed_input/")):
            return 0.5**3
        if key.startswith("Transformer/encoderblock_0_"):
            return 0.5**2
        if key.startswith(("Transformer/encoderblock_1_", "Transformer/encoder_norm/")):
            return 0.5
        return 1.0

    scales = keras_vit.training.layer_decay_scales(model, 0.5)
    assert {key: scales[var.path] for key, var in variables.items()} == {key: expected(key) for key in variables}
    # One SGD step from the same weights and gradients, with and without the decay: every variable
    # moves `scale` times as far.
    rng = np.random.default_rng(2)
    trainable = model.trainable_variables
    grads = [rng.normal(size=v.shape).astype("float32") * 0.01 for v in trainable]
    start = [keras.ops.convert_to_numpy(v) for v in trainable]
    moved = {}
    for decay in (None, 0.5):
        for var, value in zip(trainable, start):
            var.assign(value)
        optimizer = keras_vit.training.finetune_optimizer(1.0, total_steps=4, warmup_steps=0, layer_decay=decay,
                                                          model=model if decay else None)
        optimizer.apply_gradients(zip([keras.ops.convert_to_tensor(g) for g in grads], trainable))
        moved[decay] = {v.path: keras.ops.convert_to_numpy(v) - s for v, s in zip(trainable, start)}
    for key, var in variables.items():
        full = moved[None][var.path]
        np.testing.assert_allclose(moved[0.5][var.path], expected(key) * full, rtol=1e-4, atol=1e-6, err_msg=key)
