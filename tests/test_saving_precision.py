"""Saving and reloading, mixed precision, compiled execution."""

import json

import keras
import numpy as np
import pytest
from conftest import BACKEND, TINY, TINY_HYBRID, randomize, run_python

import keras_vit


def _data(n, size, classes, seed=0):
    r = np.random.default_rng(seed)
    return r.uniform(-1, 1, (n, size, size, 3)).astype("float32"), r.integers(0, classes, n)


# === Saving ===


def test_keras_files_reload_in_a_fresh_process(tmp_path):
    """A ViT and an R+ViT hybrid, saved here, reload in one fresh process (safe mode, no
    custom_objects) with the same config and the same predictions."""
    saved = {}
    for name, config in (("vit", TINY), ("hybrid", TINY_HYBRID)):
        model = keras_vit.VisionTransformer(**config, representation_size=6, dropout_rate=0.1)
        randomize(model, seed=11)
        x, _ = _data(2, config["image_size"], 1)
        saved[name] = str(tmp_path / f"{name}.keras")
        model.save(saved[name])
        np.save(tmp_path / f"{name}_x.npy", x)
        np.save(tmp_path / f"{name}_y.npy", model.predict(x, verbose=0))
    out = run_python(
        f"""
import numpy as np, keras, keras_vit
for name, path in {saved!r}.items():
    m = keras.saving.load_model(path)  # safe_mode on, no custom_objects
    x, y = np.load({str(tmp_path)!r} + f"/{{name}}_x.npy"), np.load({str(tmp_path)!r} + f"/{{name}}_y.npy")
    print(name, type(m).__name__, m.get_config()["representation_size"], float(np.abs(m.predict(x, verbose=0) - y).max()))
"""
    )
    lines = [line.split() for line in out.strip().splitlines()[-2:]]
    assert [line[0] for line in lines] == ["vit", "hybrid"], out[-2000:]
    for name, class_name, rep, diff in lines:
        assert class_name == "VisionTransformer" and rep == "6", name
        assert float(diff) == 0.0, name


def test_every_layer_config_round_trips():
    model = keras_vit.VisionTransformer(**TINY_HYBRID, representation_size=4)
    for layer in model.layers:
        config = layer.get_config()
        json.dumps(config)  # serialisable
        clone = type(layer).from_config(config)
        assert clone.get_config() == config, layer.name
    assert not any(isinstance(layer, keras.layers.Lambda) for layer in model.layers)
    rebuilt = keras_vit.VisionTransformer.from_config(model.get_config())
    assert rebuilt.count_params() == model.count_params()


def test_weights_file_round_trip(tmp_path):
    model = randomize(keras_vit.VisionTransformer(**TINY), seed=12)
    model.save_weights(tmp_path / "w.weights.h5")
    other = keras_vit.VisionTransformer(**TINY)
    other.load_weights(tmp_path / "w.weights.h5")
    for k, v in keras_vit.get_weight_tree(model).items():
        np.testing.assert_array_equal(keras_vit.get_weight_tree(other)[k], v)


# === Mixed precision ===


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("config", [TINY, TINY_HYBRID], ids=["vit", "hybrid"])
def test_mixed_precision_build_predict_fit(policy, config):
    keras.config.set_dtype_policy(policy)
    model = keras_vit.VisionTransformer(**config)
    assert model.get_layer("posembed_input").pos_embedding.dtype == "float32"
    if config.get("resnet") is None:
        assert model.get_layer("cls").cls.dtype == "float32"
    assert model.get_layer("encoderblock_0").compute_dtype == policy.split("_")[1]
    size, classes = config["image_size"], config["classes"]
    x, y = _data(16, size, classes)
    probs = model.predict(x, verbose=0)
    assert probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-3)
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


#: Largest |logit difference| / max |float32 logit| allowed under a mixed policy, for the tiny
#: 2-layer ViT below: about 5-10 units of the compute dtype's roundoff (bfloat16 2^-8 = 3.9e-3,
#: float16 2^-11 = 4.9e-4). Measured on JAX CPU: bfloat16 2.5e-3, float16 5.2e-4.
MIXED_TOLERANCE = {"mixed_bfloat16": 0.02, "mixed_float16": 0.005}


@pytest.mark.parametrize("policy", sorted(MIXED_TOLERANCE))
def test_mixed_precision_close_to_float32(policy):
    model = randomize(keras_vit.VisionTransformer(**TINY, classifier_activation=None), seed=13, scale=0.2)
    tree = keras_vit.get_weight_tree(model)
    x, _ = _data(4, 32, 1)
    ref = model.predict(x, verbose=0)
    keras.config.set_dtype_policy(policy)
    half = keras_vit.VisionTransformer(**TINY, classifier_activation=None)
    keras_vit.set_weight_tree(half, tree)
    out = half.predict(x, verbose=0)
    assert out.dtype == np.float32 and np.isfinite(out).all()
    error = np.abs(out - ref).max() / np.abs(ref).max()
    assert error < MIXED_TOLERANCE[policy], f"{policy}: relative logit error {error:.2e}"
    assert error > 0  # the half-precision path really ran
    np.testing.assert_array_equal(out.argmax(-1), ref.argmax(-1))


# === Compiled execution ===


def test_compiled_fit_and_predict():
    """JAX always traces with jit; TensorFlow runs with jit_compile=True (XLA, as on TPU)."""
    model = keras_vit.VisionTransformer(**TINY, dropout_rate=0.1, attention_dropout_rate=0.1)
    x, y = _data(16, 32, 7)
    model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy", jit_compile=BACKEND != "torch")
    before = model.predict(x, verbose=0)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    after = model.predict(x, verbose=0)
    assert after.shape == (16, 7) and not np.allclose(before, after)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        fn = tf.function(lambda t: model(t, training=False), jit_compile=True)
        np.testing.assert_allclose(fn(x).numpy(), after, rtol=1e-4, atol=1e-6)
    if BACKEND == "jax":
        import jax

        fn = jax.jit(lambda v, nv, t: model.stateless_call(v, nv, t)[0])
        out = fn([w.value for w in model.trainable_variables], [w.value for w in model.non_trainable_variables], x)
        np.testing.assert_allclose(np.asarray(out), after, rtol=1e-4, atol=1e-6)


def test_attention_weights_path_and_dropout():
    model = randomize(keras_vit.VisionTransformer(**TINY, attention_dropout_rate=0.5), seed=14)
    block = model.get_layer("encoderblock_0")
    tokens = np.random.default_rng(0).standard_normal((2, 17, 24)).astype("float32")
    y, w = block(tokens, return_attention_weights=True)
    w = keras.ops.convert_to_numpy(w)
    assert w.shape == (2, 3, 17, 17)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(block(tokens)), keras.ops.convert_to_numpy(y), rtol=1e-5, atol=1e-5)
    # Attention dropout only acts in training.
    t1 = keras.ops.convert_to_numpy(block(tokens, training=True))
    assert not np.allclose(t1, keras.ops.convert_to_numpy(y))
