"""Random initialisation drawn on the host (keras_vit.layers.init_scope.HostRandom, used by the
layers on JAX): the same distributions as Keras' own initialisers, reproducible as Keras' are,
recorded in configs as the Keras initialiser, and no random-number program compiled on JAX."""

import math

import keras
import numpy as np
import pytest
from conftest import BACKEND, TINY, TINY_HYBRID
from scipy import stats

import keras_vit
from keras_vit.layers.init_scope import HostRandom, host_random, initializer, skip_random_init
from keras_vit.layers.transformer import SplitFanXavierUniform

SHAPE = (300, 400)  # 120,000 draws: sample moments within a few tenths of a percent


def host(init, shape=SHAPE):
    return np.asarray(HostRandom(init)(shape, dtype="float32"), np.float64)


def native(init, shape=SHAPE):
    return keras.ops.convert_to_numpy(init(shape, dtype="float32")).astype(np.float64)


@pytest.mark.parametrize(
    "make, low, high, std",
    [
        # Glorot uniform on (300, 400): bound sqrt(6 / 700), standard deviation bound / sqrt(3).
        (lambda: keras.initializers.GlorotUniform(seed=1), -math.sqrt(6 / 700), math.sqrt(6 / 700), math.sqrt(2 / 700)),
        # LeCun normal: truncated at two standard deviations of the underlying normal, whose
        # deviation Keras raises by 1/0.8796 so that the variance is 1/fan_in.
        (lambda: keras.initializers.LecunNormal(seed=2), -2 * math.sqrt(1 / 300) / 0.87962566103423978,
         2 * math.sqrt(1 / 300) / 0.87962566103423978, math.sqrt(1 / 300)),
        (lambda: keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal", seed=3), -np.inf, np.inf,
         math.sqrt(2 / 400)),
        (lambda: keras.initializers.RandomNormal(stddev=0.02, seed=4), -np.inf, np.inf, 0.02),
        (lambda: keras.initializers.RandomUniform(-0.3, 0.1, seed=5), -0.3, 0.1, 0.4 / math.sqrt(12)),
        (lambda: keras.initializers.TruncatedNormal(mean=1.0, stddev=0.5, seed=6), 0.0, 2.0, None),
    ],
    ids=["glorot_uniform", "lecun_normal", "variance_scaling_normal", "random_normal", "random_uniform",
         "truncated_normal"],
)
def test_draws_follow_the_initialisers_formulas_and_keras_own_draws(make, low, high, std):
    ours, keras_own = host(make()), native(make())
    assert ours.shape == SHAPE and ours.dtype == np.float64
    assert low <= ours.min() and ours.max() <= high
    if std is not None:
        np.testing.assert_allclose(ours.std(), std, rtol=0.01)
    assert abs(ours.mean() - keras_own.mean()) < 0.02 * keras_own.std()
    # The same distribution as Keras' own draws: a two-sample Kolmogorov-Smirnov test.
    assert stats.ks_2samp(ours.ravel(), keras_own.ravel()).pvalue > 1e-4


def test_split_fan_xavier_counts_the_leading_axes_as_fan_in():
    shape = (48, 3, 16)  # attention query kernel: hidden 48, 3 heads of 16
    limit = math.sqrt(6 / (48 + 3 * 16))
    draws = host(SplitFanXavierUniform(in_axes=1), shape)
    assert -limit <= draws.min() and draws.max() <= limit and draws.max() > 0.98 * limit
    np.testing.assert_allclose(draws.std(), limit / math.sqrt(3), rtol=0.05)
    out = host(SplitFanXavierUniform(in_axes=2), (3, 16, 48))
    assert np.abs(out).max() <= limit


def test_seeds_behave_as_in_keras():
    glorot = keras.initializers.GlorotUniform(seed=7)
    # An integer seed: the same values for the same shape, at every call.
    np.testing.assert_array_equal(host(glorot, (5, 6)), host(glorot, (5, 6)))
    assert not np.array_equal(host(glorot, (5, 6)).ravel()[:20], host(glorot, (6, 5)).ravel()[:20])
    assert not np.array_equal(host(glorot, (5, 6)), host(keras.initializers.GlorotUniform(seed=8), (5, 6)))
    # A SeedGenerator or no seed: new values at each call.
    generator = keras.initializers.RandomNormal(seed=keras.random.SeedGenerator(3))
    assert not np.array_equal(host(generator, (5, 6)), host(generator, (5, 6)))
    split = SplitFanXavierUniform()
    assert not np.array_equal(host(split, (5, 6)), host(split, (5, 6)))


@pytest.mark.parametrize("config", [TINY, TINY_HYBRID], ids=["vit", "hybrid"])
def test_models_are_reproducible_under_set_random_seed(config):
    def weights(seed):
        keras.utils.set_random_seed(seed)
        return [keras.ops.convert_to_numpy(v) for v in keras_vit.VisionTransformer(**config).weights]

    first, again, other = weights(0), weights(0), weights(1)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    random = [i for i, w in enumerate(first) if w.size > 1 and np.unique(w).size > 1]
    assert len(random) >= 10  # kernels, position embeddings, MLP biases (normal, 1e-6)
    assert all(not np.array_equal(first[i], other[i]) for i in random)


def test_configs_record_the_keras_initialiser():
    model = keras_vit.VisionTransformer(**dict(TINY, representation_size=16))
    dense = model.get_layer("pre_logits")
    config = dense.get_config()
    assert config["kernel_initializer"]["class_name"] == "GlorotUniform", config["kernel_initializer"]
    assert keras.layers.Dense.from_config(config).kernel_initializer.__class__ is keras.initializers.GlorotUniform
    wrapped = HostRandom(keras.initializers.RandomNormal(stddev=0.3, seed=2))
    again = keras.initializers.deserialize(keras.initializers.serialize(wrapped))
    assert isinstance(again, HostRandom) and again.initializer.stddev == 0.3
    np.testing.assert_array_equal(again((4, 4)), wrapped((4, 4)))


def test_unknown_initialisers_run_as_they_are():
    class Halves(keras.initializers.Initializer):
        def __call__(self, shape, dtype=None):
            return keras.ops.full(shape, 0.5, dtype=dtype)

    class Shifted(keras.initializers.RandomNormal):  # a subclass that changes how it draws
        def __call__(self, shape, dtype=None):
            return super().__call__(shape, dtype) + 10.0

    halves, shifted = Halves(), Shifted(seed=0)
    assert host_random(halves) is halves and host_random(shifted) is shifted
    assert host_random("zeros") == "zeros"
    with pytest.raises(ValueError, match="cannot draw for Halves"):
        HostRandom(halves)
    layer = keras_vit.layers.PatchEmbedding(8, 4, kernel_initializer=shifted)
    layer.build((None, 8, 8, 3))
    assert keras.ops.convert_to_numpy(layer.kernel).min() > 5.0
    with skip_random_init():
        assert initializer(keras.initializers.GlorotUniform()) == "zeros"


@pytest.mark.skipif(BACKEND != "jax", reason="on TensorFlow and PyTorch Keras draws eagerly, without compiling")
def test_jax_builds_compile_no_random_number_program():
    import jax

    compiled = []

    def listener(event, duration, **kw):
        if "backend_compile" in event:
            compiled.append(kw.get("fun_name", ""))

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        # A configuration no other test builds: every shape is new to this process.
        keras_vit.VisionTransformer(image_size=24, patch_size=6, hidden_size=20, num_layers=2, num_heads=5,
                                    mlp_dim=44, classes=3, representation_size=12)
        keras_vit.VisionTransformer(**dict(TINY_HYBRID, hidden_size=20, num_heads=5, mlp_dim=28))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert compiled, "the listener saw no compilation at all (zeros still compile)"
    rng = [name for name in compiled if any(s in name for s in ("uniform", "normal", "threefry", "random_bits"))]
    assert not rng, rng


def test_variance_scaling_with_explicit_axes():
    # Fan-in from the axes given: (20, 30) -> 600 inputs, uniform bound sqrt(3 / 600).
    init = keras.initializers.VarianceScaling(1.0, "fan_in", "uniform", seed=3, input_axes=(0, 1), output_axes=(2,))
    draws = host(init, (20, 30, 40))
    limit = math.sqrt(3 / 600)
    assert -limit <= draws.min() and draws.max() <= limit
    np.testing.assert_allclose(draws.std(), limit / math.sqrt(3), rtol=0.02)
    assert stats.ks_2samp(draws.ravel(), native(init, (20, 30, 40)).ravel()).pvalue > 1e-4
