"""tf.distribute (TensorFlow backend) on logical CPU devices, and TPU constraints a CPU can check.

Logical devices must be configured before TensorFlow initialises its runtime, so the scenarios
run in a fresh process (conftest.run_python) that splits the CPU into two logical devices
before anything else touches TensorFlow.
"""

import json

import numpy as np
import pytest
from conftest import BACKEND, run_python

pytestmark = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute needs the TensorFlow backend")

PRELUDE = r"""
import json
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import numpy as np, keras, keras_vit
assert len(tf.config.list_logical_devices("CPU")) == 2
keras.utils.set_random_seed(0)
r = np.random.default_rng(0)
x = r.uniform(-1, 1, (64, 32, 32, 3)).astype("float32")
y = r.integers(0, 8, 64).astype("int32")
CFG = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, classes=8,
           representation_size=16)

def dataset():
    # A static batch shape (drop_remainder) divisible by the replica count, as TPUs require.
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)

def build(cfg=CFG, **compile_kw):
    model = keras_vit.VisionTransformer(**cfg)
    w = np.random.default_rng(1)
    for v in model.weights:
        v.assign((w.standard_normal(tuple(v.shape)) * 0.3).astype("float32"))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy", **compile_kw)
    return model

def fit(**compile_kw):
    model = build(**compile_kw)
    return model, model.fit(dataset(), epochs=1, verbose=0).history["loss"][0]

strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
assert strategy.num_replicas_in_sync == 2
"""


def run(code, tmp_path=None):
    if tmp_path is not None:
        code = code.replace("TMP", repr(str(tmp_path)))
    out = run_python(PRELUDE + code)
    return json.loads(out.strip().splitlines()[-1])


# Two scenarios in one process (module fixture `scenarios`), after one single-device fit that both
# compare against: MirroredStrategy over the two logical devices, with a save and a one-device
# reload; the TPU constraints (XLA train step, the hybrid under XLA, mixed_bfloat16 under a strategy).
SINGLE = r"""
_, SINGLE_LOSS = fit()
REPORT = {}
"""

MIRRORED_SCENARIO = r"""
out = {"single": SINGLE_LOSS}
with strategy.scope():
    model, out["mirrored"] = fit()
out["mirrored_variable"] = type(model.weights[0].value).__name__
pred = np.asarray(model.predict(x[:16], verbose=0))
model.save_weights(TMP + "/mirrored.weights.h5")
plain = keras_vit.VisionTransformer(**CFG)  # outside the strategy: one device
plain.load_weights(TMP + "/mirrored.weights.h5")
out["reload_error"] = float(np.max(np.abs(np.asarray(plain.predict(x[:16], verbose=0)) - pred)))
REPORT["mirrored"] = out
"""

TPU_SCENARIO = r"""
out = {"single": SINGLE_LOSS}
model, out["xla_steps_per_execution"] = fit(jit_compile=True, steps_per_execution=2)
out["jit_compile"] = bool(model.jit_compile)

hybrid = keras_vit.VisionTransformer(image_size=32, patch_size=1, hidden_size=24, num_layers=1, num_heads=2,
                                     mlp_dim=32, classes=8, resnet=((1, 1), 0.5), classifier_activation=None)
w = np.random.default_rng(2)
for v in hybrid.weights:
    v.assign((w.standard_normal(tuple(v.shape)) * 0.3).astype("float32"))
eager = np.asarray(hybrid(x[:4], training=False))
compiled = tf.function(lambda t: hybrid(t, training=False), jit_compile=True)
out["hybrid_xla_error"] = float(np.max(np.abs(np.asarray(compiled(tf.constant(x[:4]))) - eager)))
out["hybrid_logit_scale"] = float(np.max(np.abs(eager)))

keras.config.set_dtype_policy("mixed_bfloat16")
with strategy.scope():
    model, out["bfloat16"] = fit()
out["bfloat16_variable_dtype"] = model.weights[0].dtype
out["bfloat16_output_dtype"] = str(model.predict(x[:16], verbose=0).dtype)
REPORT["tpu"] = out
"""


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distribution")
    return run(SINGLE + MIRRORED_SCENARIO + TPU_SCENARIO + "print(json.dumps(REPORT))\n", tmp)


@pytest.mark.slow
def test_mirrored_strategy_fit_matches_one_device_and_reloads(scenarios):
    report = scenarios["mirrored"]
    print(report)
    # Variables are mirrored, one copy per logical device.
    assert "Mirrored" in report["mirrored_variable"], report["mirrored_variable"]
    # Measured: equal losses, reload error 0 (2-core CPU); the bounds are a few float32 roundings.
    np.testing.assert_allclose(report["mirrored"], report["single"], rtol=1e-6)
    assert report["reload_error"] < 1e-6


@pytest.mark.slow
def test_tpu_constraints_xla_train_step_and_bfloat16(scenarios):
    """What TPUStrategy imposes, checked on CPU: the whole train step (and the hybrid's stem)
    compiles with XLA at static shapes, several steps per execution give the same loss, and the
    mixed_bfloat16 policy trains under a strategy with float32 variables and outputs."""
    report = scenarios["tpu"]
    print(report)
    assert report["jit_compile"]
    np.testing.assert_allclose(report["xla_steps_per_execution"], report["single"], rtol=1e-6)  # measured: equal
    assert report["hybrid_logit_scale"] > 0.1
    assert report["hybrid_xla_error"] < 3e-6 * max(1.0, report["hybrid_logit_scale"])  # measured 2.4e-7
    assert report["bfloat16_variable_dtype"] == "float32" and report["bfloat16_output_dtype"] == "float32"
    # bfloat16 has 8 mantissa bits: the epoch loss measured 1.8e-4 (relative) from float32's.
    np.testing.assert_allclose(report["bfloat16"], report["single"], rtol=2e-3)
