"""int8 weight quantization (`model.quantize("int8")`) of keras_vit models.

Keras quantizes the Dense layers natively (MlpBlock Dense_0/Dense_1, pre_logits, head); our
attention layer quantizes its projections itself (query/key/value fused into one int8 kernel,
and out): int8 kernels with per-output-channel scales, inputs quantized on the fly. The
quantized output is compared with the float model's own output and with an independent NumPy
forward pass on the de-quantized weights the quantized model holds.

A quantized model saves and reloads quantized: VisionTransformer.quantize records the mode and
the QuantizationConfig in the model's config, and a model rebuilt from that config quantizes
itself before the saved int8 kernels and scales load.
"""

import warnings

import keras
import numpy as np
import pytest
from conftest import TINY, randomize, run_python
from reference_numpy import vit_forward

import keras_vit


INT8_LAYERS = sorted(
    [f"encoderblock_{i}/MlpBlock_3/Dense_{j}" for i in range(2) for j in range(2)]
    + [f"encoderblock_{i}/MultiHeadDotProductAttention_1" for i in range(2)]
    + ["head"]
)


def _layer(model, path):
    return next(layer for layer in model._flatten_layers() if layer.path == path)


def _logits_model(seed=0):
    model = keras_vit.VisionTransformer(**TINY, classifier_activation=None)
    randomize(model, seed=seed)
    return model


def test_quantize_int8_quantizes_dense_layers_and_keeps_outputs_close():
    model = _logits_model()
    x = np.random.default_rng(1).uniform(-1, 1, (4, 32, 32, 3)).astype("float32")
    ref = model.predict(x, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize("int8")
    # The norms and tokens have no quantize method; VisionTransformer.quantize expects that quietly.
    assert not [w for w in caught if "does not have a `quantize` method" in str(w.message)]
    quantized = {layer.path for layer in model._flatten_layers() if "int8" in layer.dtype_policy.name}
    expected = set(INT8_LAYERS)
    assert quantized == expected
    for path in expected:
        layer = _layer(model, path)
        kernels = [layer._kernel] if hasattr(layer, "_kernel") else [layer.qkv_kernel, layer.out_kernel]
        assert all(keras.backend.standardize_dtype(k.dtype) == "int8" for k in kernels)
    # No float copy of a quantized kernel is left behind: every kernel variable is int8.
    float_kernels = [v.path for v in model.weights if "kernel" in v.path and "scale" not in v.path
                     and "embedding" not in v.path and keras.backend.standardize_dtype(v.dtype) != "int8"]
    assert float_kernels == []
    out = model.predict(x, verbose=0)
    assert out.shape == ref.shape and np.all(np.isfinite(out))
    change = np.abs(out - ref)
    # int8 with per-channel scales: about 1% of the logit range, and the ranking survives.
    assert change.max() < 0.05 * np.abs(ref).max(), (change.max(), np.abs(ref).max())
    assert change.mean() < 0.01 * np.abs(ref).max()
    assert np.all(out.argmax(-1) == ref.argmax(-1))


def _dequantized_tree(model, tree):
    """The float weight tree with every quantized kernel replaced by kernel / scale, read from
    the int8 variables the quantized model holds."""
    deq = dict(tree)
    for path in ("Transformer/encoderblock_0/MlpBlock_3/Dense_0", "Transformer/encoderblock_0/MlpBlock_3/Dense_1",
                 "Transformer/encoderblock_1/MlpBlock_3/Dense_0", "Transformer/encoderblock_1/MlpBlock_3/Dense_1",
                 "head"):
        layer_path = path.replace("Transformer/", "")
        layer = _layer(model, layer_path)
        q = keras.ops.convert_to_numpy(layer._kernel).astype("float64")
        scale = keras.ops.convert_to_numpy(layer.kernel_scale).astype("float64")
        deq[f"{path}/kernel"] = (q / scale).astype("float32")  # Keras stores kernel = round(w * scale)
    for i in range(2):
        layer = _layer(model, f"encoderblock_{i}/MultiHeadDotProductAttention_1")
        prefix = f"Transformer/encoderblock_{i}/MultiHeadDotProductAttention_1"
        qkv = keras.ops.convert_to_numpy(layer.qkv_kernel).astype("float64")
        qkv = qkv / keras.ops.convert_to_numpy(layer.qkv_kernel_scale).astype("float64")
        hidden, heads = qkv.shape[0], tree[f"{prefix}/query/kernel"].shape[1]
        for j, name in enumerate(("query", "key", "value")):
            part = qkv[:, j * hidden : (j + 1) * hidden]
            deq[f"{prefix}/{name}/kernel"] = part.reshape(hidden, heads, -1).astype("float32")
        out = keras.ops.convert_to_numpy(layer.out_kernel).astype("float64")
        out = out / keras.ops.convert_to_numpy(layer.out_kernel_scale).astype("float64")
        deq[f"{prefix}/out/kernel"] = out.reshape(heads, -1, hidden).astype("float32")
        # The de-quantized kernels are the float ones to within half a quantization step.
        step = np.abs(tree[f"{prefix}/query/kernel"]).max(axis=0) / 127
        assert np.all(np.abs(deq[f"{prefix}/query/kernel"] - tree[f"{prefix}/query/kernel"]) <= step / 2 + 1e-7)
    return deq


def test_quantized_model_matches_numpy_on_dequantized_weights():
    """What the int8 layers compute is x @ (q * scale) up to the on-the-fly input quantization:
    a NumPy forward pass on the de-quantized kernels lands closer than the float weights do."""
    model = _logits_model(seed=2)
    x = np.random.default_rng(3).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    tree = keras_vit.get_weight_tree(model)
    model.quantize("int8")
    deq = _dequantized_tree(model, tree)
    out = model.predict(x, verbose=0)
    ref_deq = vit_forward(deq, x, patch_size=8, num_layers=2)
    ref_float = vit_forward(tree, x, patch_size=8, num_layers=2)
    err_deq = np.abs(out - ref_deq).max()
    assert err_deq < 0.02 * np.abs(ref_float).max()
    assert err_deq <= np.abs(out - ref_float).max() + 1e-6


def test_quantized_model_saves_and_reloads_quantized_in_a_fresh_process(tmp_path):
    model = _logits_model(seed=4)
    x = np.random.default_rng(5).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    float_out = model.predict(x, verbose=0)
    model.quantize("int8")
    assert model.get_config()["quantization"]["mode"] == "int8"
    out = model.predict(x, verbose=0)
    assert np.abs(out - float_out).max() > 0  # int8 really changed the computation
    model.save(tmp_path / "q.keras")
    np.save(tmp_path / "x.npy", x)
    code = f"""
import numpy as np, keras
import keras_vit  # registers the classes; load_model runs in safe mode, no custom_objects
m = keras.saving.load_model({str(tmp_path / "q.keras")!r})
int8 = sorted(l.path for l in m._flatten_layers()
              if getattr(l, "dtype_policy", None) is not None and "int8" in l.dtype_policy.name)
print(",".join(int8))
np.save({str(tmp_path / "out.npy")!r}, m.predict(np.load({str(tmp_path / "x.npy")!r}), verbose=0))
"""
    layers = run_python(code).strip().splitlines()[-1].split(",")
    assert layers == INT8_LAYERS
    assert np.array_equal(np.load(tmp_path / "out.npy"), out)

    # A float model's config says so, and it reloads float.
    assert keras_vit.VisionTransformer(**TINY).get_config()["quantization"] is None


def test_int8_filters_reach_attention_and_dense_layers_separately():
    x = np.random.default_rng(6).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    attention_only = _logits_model(seed=7)
    attention_only.quantize("int8", filters="MultiHeadDotProductAttention")
    quantized = sorted(layer.path for layer in attention_only._flatten_layers() if layer.quantization_mode)
    assert quantized == [f"encoderblock_{i}/MultiHeadDotProductAttention_1" for i in range(2)]
    dense_only = _logits_model(seed=7)
    dense_only.quantize("int8", filters=["Dense_", "head"])
    quantized = sorted(layer.path for layer in dense_only._flatten_layers() if layer.quantization_mode)
    assert not any("Attention" in p for p in quantized) and len(quantized) == 5
    # The string filter is remembered: the rebuilt model quantizes the same layers.
    rebuilt = keras_vit.VisionTransformer.from_config(attention_only.get_config())
    assert sorted(layer.path for layer in rebuilt._flatten_layers() if layer.quantization_mode) == [
        f"encoderblock_{i}/MultiHeadDotProductAttention_1" for i in range(2)
    ]
    float_out = _logits_model(seed=7).predict(x, verbose=0)
    for model in (attention_only, dense_only):
        change = np.abs(model.predict(x, verbose=0) - float_out)
        assert 0 < change.max() < 0.05 * np.abs(float_out).max()


def test_quantized_model_trains_its_float_weights_through_int8_attention():
    """The int8 kernels are frozen; the biases and everything else train, with the gradient
    reaching below each int8 matmul through its de-quantized kernel."""
    model = _logits_model(seed=8)
    model.quantize("int8")
    rng = np.random.default_rng(9)
    x = rng.uniform(-1, 1, (8, 32, 32, 3)).astype("float32")
    y = rng.normal(size=(8, TINY["classes"])).astype("float32")
    attention = _layer(model, "encoderblock_0/MultiHeadDotProductAttention_1")
    query_bias = keras.ops.convert_to_numpy(attention.query_bias).copy()
    patch = keras.ops.convert_to_numpy(_layer(model, "embedding").kernel).copy()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    before = model.evaluate(x, y, verbose=0)
    model.fit(x, y, epochs=5, batch_size=8, verbose=0)
    after = model.evaluate(x, y, verbose=0)
    assert after < before
    # The query bias only gets a gradient through the int8 out projection.
    assert np.abs(keras.ops.convert_to_numpy(attention.query_bias) - query_bias).max() > 0
    assert np.abs(keras.ops.convert_to_numpy(_layer(model, "embedding").kernel) - patch).max() > 0
    assert all(keras.backend.standardize_dtype(v.dtype) != "int8" for v in model.trainable_weights)


def test_quantized_model_has_no_float_weight_tree():
    model = _logits_model(seed=10)
    model.quantize("int8")
    with pytest.raises(keras_vit.models.WeightTreeError, match="int8-quantized.*then quantize"):
        keras_vit.get_weight_tree(model)


def test_int4_quantizes_dense_layers_and_leaves_attention_float():
    model = _logits_model(seed=11)
    x = np.random.default_rng(12).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    ref = model.predict(x, verbose=0)
    model.quantize("int4")
    modes = {layer.path: layer.quantization_mode for layer in model._flatten_layers() if layer.quantization_mode}
    assert set(modes.values()) == {"int4"} and not any("Attention" in p for p in modes)
    out = model.predict(x, verbose=0)
    assert np.all(np.isfinite(out)) and np.abs(out - ref).max() < 0.2 * np.abs(ref).max()


def test_integer_matmul_is_the_exact_integer_product():
    """On every backend (int32 kernel on JAX, float32 of the int8 values elsewhere) the product of
    int8 matrices equals NumPy's int64 product, at ViT-H's widest fan-in (1280) too."""
    from keras_vit.layers import integer_matmul

    rng = np.random.default_rng(13)
    for k in (24, 768, 1280):
        a = rng.integers(-127, 128, (37, k)).astype("int8")
        b = rng.integers(-127, 128, (k, 19)).astype("int8")
        a[0] = 127  # a worst-case row: every product at the maximum
        b[:, 0] = 127
        out = keras.ops.convert_to_numpy(integer_matmul(keras.ops.convert_to_tensor(a), keras.ops.convert_to_tensor(b)))
        np.testing.assert_array_equal(out.astype("int64"), a.astype("int64") @ b.astype("int64"))


def test_quantized_dense_subclass_matches_keras_dense_int8():
    """keras_vit's Dense (the MLP, pre_logits and head layers) computes what Keras' own int8 Dense
    computes from the same float kernel, on the faster matmul."""
    from keras_vit.layers import Dense

    rng = np.random.default_rng(14)
    kernel = rng.normal(0, 0.05, (48, 16)).astype("float32")
    bias = rng.normal(0, 0.1, (16,)).astype("float32")
    x = rng.normal(0, 1, (5, 48)).astype("float32")
    ours, theirs = Dense(16, activation="gelu"), keras.layers.Dense(16, activation="gelu")
    for layer in (ours, theirs):
        layer.build((None, 48))
        layer.set_weights([kernel, bias])
        layer.quantize("int8")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ours._kernel), keras.ops.convert_to_numpy(theirs._kernel))
    out, ref = (keras.ops.convert_to_numpy(layer(x)) for layer in (ours, theirs))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


def test_weight_only_int8_is_the_float_model_on_dequantized_weights():
    """With no activation quantizer the int8 layers compute x @ (int8 / scale) exactly: the
    model equals an independent NumPy forward pass on the de-quantized kernels to float32
    round-off, and it saves and reloads with that config."""
    model = _logits_model(seed=15)
    x = np.random.default_rng(16).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    tree = keras_vit.get_weight_tree(model)
    config = keras.quantizers.Int8QuantizationConfig(
        weight_quantizer=keras.quantizers.AbsMaxQuantizer(axis=0), activation_quantizer=None
    )
    model.quantize(config=config)
    out = model.predict(x, verbose=0)
    ref = vit_forward(_dequantized_tree(model, tree), x, patch_size=8, num_layers=2)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * np.abs(ref).max())
    rebuilt = keras_vit.VisionTransformer.from_config(model.get_config())
    rebuilt.set_weights(model.get_weights())
    np.testing.assert_array_equal(rebuilt.predict(x, verbose=0), out)


def test_standalone_quantized_attention_layer_round_trips_through_its_config():
    """An int8 attention layer's config carries its int8 dtype policy; a layer built from it
    has the int8 variables in the same order, so the saved values load and compute the same."""
    from keras_vit.layers import MultiHeadDotProductAttention

    layer = MultiHeadDotProductAttention(3)
    layer.build((None, 5, 24))
    rng = np.random.default_rng(17)
    layer.set_weights([rng.normal(0, 0.2, w.shape).astype("float32") for w in layer.get_weights()])
    layer.quantize("int8")
    x = rng.normal(size=(2, 5, 24)).astype("float32")
    restored = MultiHeadDotProductAttention.from_config(layer.get_config())
    restored.build((None, 5, 24))
    assert restored.quantization_mode == "int8"
    assert [v.name for v in restored.weights] == [v.name for v in layer.weights]
    restored.set_weights(layer.get_weights())
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(restored(x)), keras.ops.convert_to_numpy(layer(x)))
