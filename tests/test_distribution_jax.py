"""keras.distribution on 8 virtual CPU devices (JAX): sharded weights, fit, save and reload.

XLA_FLAGS=--xla_force_host_platform_device_count=8 only takes effect before jax is imported, so
each scenario runs in a fresh process (conftest.run_python); the test process checks what it
reports. A model trained with DataParallel or with ModelParallel on a (2, 4) / (4, 2) mesh must
give the single-device loss (same initial weights, same batches, no dropout); an Axial-ViT, an
AxialResNet and an EfficientNet laid out by their families' rules give the single-device logits.
"""

import json

import numpy as np
import pytest
from conftest import BACKEND, run_python

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution runs on the JAX backend")

ENV = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}

# Shared head of every scenario: data, deterministic weights, a loss that records the sharding
# of the predictions it receives (jax.debug.inspect_array_sharding runs while tracing fit).
PRELUDE = r"""
import json, warnings
import numpy as np, jax, keras, tensorflow as tf
import keras_vit
assert jax.device_count() == 8, jax.devices()
keras.utils.set_random_seed(0)
r = np.random.default_rng(0)
x = r.uniform(-1, 1, (64, 32, 32, 3)).astype("float32")
y = r.integers(0, 8, 64).astype("int32")

def dataset():
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)

SEEN = {}
def batch_axis(sharding):  # the mesh axis dimension 0 is split on (None: whole)
    spec = tuple(getattr(sharding, "spec", ()))
    return spec[0] if spec else None

def recording_loss(y_true, y_pred):
    jax.debug.inspect_array_sharding(y_pred, callback=lambda s: SEEN.__setitem__("y_pred", batch_axis(s)))
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred)

def build(cfg):
    model = keras_vit.VisionTransformer(**cfg)
    w = np.random.default_rng(1)
    for v in model.weights:
        v.assign((w.standard_normal(tuple(v.shape)) * 0.3).astype("float32"))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=recording_loss)
    return model

def fit(cfg):
    model = build(cfg)
    return model, model.fit(dataset(), epochs=1, verbose=0).history["loss"][0]

def spec(v):
    return [str(a) if a is not None else None for a in v.value.sharding.spec] + [None] * (
        len(v.shape) - len(v.value.sharding.spec))

def shardings(model):
    return {v.path: dict(spec=spec(v), shard=list(v.value.addressable_shards[0].data.shape))
            for v in model.weights}
"""


def run(code):
    out = run_python(PRELUDE + code, env=ENV)
    return json.loads(out.strip().splitlines()[-1])


# Two scenarios on 8 devices, run in one process (module fixture `scenarios`): DataParallel and
# ModelParallel on a (2, 4) mesh against one device, with a save and a reload under the
# distribution; an R+ViT hybrid with 3 heads on a (4, 2) mesh.
PARALLEL_SCENARIO = r"""
CFG = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64,
           classes=8, representation_size=16)
out = {}
_, out["single"] = fit(CFG)
out["single_pred"] = SEEN.pop("y_pred")

data_parallel = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
with data_parallel.scope():
    _, out["data_parallel"] = fit(CFG)
out["data_parallel_pred"] = SEEN.pop("y_pred")

mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
layout_map = keras_vit.get_layout_map(mesh, config=CFG)
model_parallel = keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch")
with model_parallel.scope():
    model, out["model_parallel"] = fit(CFG)
    out["model_parallel_pred"] = SEEN.pop("y_pred")
    out["weights"] = shardings(model)
    out["optimizer"] = {v.path: spec(v) for v in model.optimizer.variables}
    out["layout"] = {v.path: list(layout_map[v.path].axes) for v in model.weights}
    # Saved from the sharded model (Keras gathers the shards).
    model.save_weights(TMP + "/mp.weights.h5")
    model.save(TMP + "/mp.keras")
    np.save(TMP + "/mp_pred.npy", np.asarray(model.predict(x[:16], batch_size=16, verbose=0)))
    # A checkpoint loaded under the distribution is laid out by the same rules.
    reloaded = keras.saving.load_model(TMP + "/mp.keras", compile=False)
    out["reloaded"] = {v.path: spec(v) for v in reloaded.weights}
REPORT["parallel"] = out
"""

HYBRID_SCENARIO = r"""
CFG = dict(image_size=32, patch_size=1, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=32, classes=8,
           resnet=((1, 1), 0.5))
out = {}
_, out["single"] = fit(CFG)
mesh = keras.distribution.DeviceMesh((4, 2), ("batch", "model"), keras.distribution.list_devices())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    layout_map = keras_vit.get_layout_map(mesh, config=CFG)
out["warnings"] = [str(w.message) for w in caught]
with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
    model, out["model_parallel"] = fit(CFG)
    out["weights"] = shardings(model)
REPORT["hybrid"] = out
"""


# The other families on a (2, 4) mesh, each at a tiny size whose split groups 4 divides: the
# logits of a model built under ModelParallel(get_layout_map(mesh, config=...)) against the same
# weights on one device, a fit step under the distribution, and every variable's sharding.
FAMILIES_SCENARIO = r"""
FAMILIES = {
    "axial_vit": ("AxialVisionTransformer", dict(image_size=32, patch_size=8, hidden_size=16, num_layers=1,
                  num_heads=4, mlp_dim=32, classes=8, representation_size=8)),
    "axial_resnet": ("AxialResNet", dict(image_size=32, block_units=(1,), width_multiplier=0.125, groups=4,
                     classes=8)),
    "efficientnet": ("EfficientNet", dict(image_size=32, width_multiplier=0.1, depth_multiplier=0.1, classes=8,
                     dropout_rate=0.0, drop_path_rate=0.0)),
}

def family_model(cls, cfg):
    model = getattr(keras_vit.models, cls)(**cfg, classifier_activation=None)
    w = np.random.default_rng(2)
    for v in model.weights:  # every weight random (BatchNorm variances positive), so every branch counts
        shape = tuple(v.shape)
        value = w.uniform(0.5, 1.5, shape) if "moving_variance" in v.path else w.standard_normal(shape) * 0.3
        v.assign(value.astype("float32"))
    return model

mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
out = {}
for family, (cls, cfg) in FAMILIES.items():
    single = np.asarray(family_model(cls, cfg).predict_on_batch(x[:16]))
    layout_map = keras_vit.get_layout_map(mesh, config=dict(cfg, family=family))
    with keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch").scope():
        model = family_model(cls, cfg)
        sharded = np.asarray(model.predict_on_batch(x[:16]))
        model.compile(optimizer=keras.optimizers.SGD(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        loss = model.fit(dataset().take(1), verbose=0).history["loss"][0]
        out[family] = dict(error=float(np.max(np.abs(sharded - single)) / np.max(np.abs(single))),
                           loss=float(loss), weights=shardings(model),
                           layout={v.path: list(layout_map[v.path].axes) for v in model.weights})
REPORT["families"] = out
"""


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("distribution"))
    report = run("REPORT = {}\n" + PARALLEL_SCENARIO.replace("TMP", repr(tmp)) + HYBRID_SCENARIO
                 + FAMILIES_SCENARIO + "print(json.dumps(REPORT))\n")
    return dict(report, tmp=tmp)


@pytest.mark.slow
def test_data_and_model_parallel_fit_match_one_device_and_reload_on_one_device(scenarios):
    report = scenarios["parallel"]
    # Same loss on one device, DataParallel over 8 devices and ModelParallel on (2, 4).
    single = report["single"]
    print("single", single, "data_parallel", report["data_parallel"], "model_parallel", report["model_parallel"])
    # Measured: equal losses (2-core CPU); the bound is a few float32 roundings.
    np.testing.assert_allclose(report["data_parallel"], single, rtol=1e-6)
    np.testing.assert_allclose(report["model_parallel"], single, rtol=1e-6)
    # Keras split the batch over the data axis (the predictions reach the loss batch-sharded).
    assert report["single_pred"] is None
    assert report["data_parallel_pred"] == report["model_parallel_pred"] == "batch", report

    weights = report["weights"]
    attention = "encoderblock_0/MultiHeadDotProductAttention_1/"
    # Query kernel (hidden 32, heads 4, head_dim 8): one head per device of the model axis.
    assert weights[attention + "query_kernel"] == {"spec": [None, "model", None], "shard": [32, 1, 8]}
    assert weights[attention + "value_bias"] == {"spec": ["model", None], "shard": [1, 8]}
    assert weights[attention + "out_kernel"] == {"spec": ["model", None, None], "shard": [1, 8, 32]}
    # MLP: Dense_0 (32, 64) by columns, Dense_1 (64, 32) by rows.
    assert weights["encoderblock_1/MlpBlock_3/Dense_0/kernel"] == {"spec": [None, "model"], "shard": [32, 16]}
    assert weights["encoderblock_1/MlpBlock_3/Dense_1/kernel"] == {"spec": ["model", None], "shard": [16, 32]}
    assert weights["embedding/kernel"]["shard"] == [8, 8, 3, 8]
    assert weights["head/kernel"] == {"spec": ["model", None], "shard": [4, 8]}
    assert weights["encoder_norm/gamma"] == {"spec": [None], "shard": [32]}
    # Every variable carries exactly the layout the map gives its path; so do its Adam slots
    # and the variables of a model loaded under the distribution.
    for path, axes in report["layout"].items():
        assert weights[path]["spec"] == axes, path
        assert report["reloaded"][path] == axes, path
        slot = path.replace("/", "_")
        slots = [s for p, s in report["optimizer"].items() if p.endswith(slot + "_momentum")]
        assert slots == [axes], (path, slots)

    # The weights saved by the sharded process reload in a single-device process: this one (the
    # suite's JAX has one CPU device), else a fresh one.
    import jax

    if jax.device_count() == 1:
        namespace = {}
        exec(RELOAD, namespace)
        errors = namespace["reload_on_one_device"](scenarios["tmp"])
    else:
        single_device = run_python(RELOAD + f"print(json.dumps(reload_on_one_device({scenarios['tmp']!r})))\n",
                                   env={"JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""})
        errors = json.loads(single_device.strip().splitlines()[-1])
    print("reload max abs error (.keras, .weights.h5):", errors)
    assert max(errors) < 1e-6, errors  # measured 8.9e-8


# The model saved under ModelParallel (.keras and .weights.h5) on one device: the largest absolute
# difference of each one's predictions from the sharded model's.
RELOAD = r"""
import json, numpy as np, jax, keras, keras_vit

def reload_on_one_device(tmp):
    assert jax.device_count() == 1
    x = np.random.default_rng(0).uniform(-1, 1, (64, 32, 32, 3)).astype("float32")[:16]
    want = np.load(tmp + "/mp_pred.npy")
    model = keras.saving.load_model(tmp + "/mp.keras", compile=False)
    fresh = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=4,
                                        mlp_dim=64, classes=8, representation_size=16)
    fresh.load_weights(tmp + "/mp.weights.h5")
    return [float(np.max(np.abs(np.asarray(m.predict(x, verbose=0)) - want))) for m in (model, fresh)]
"""


@pytest.mark.slow
def test_hybrid_with_indivisible_heads_falls_back_and_matches_one_device(scenarios):
    """R+ViT on a (4, 2) mesh with 3 heads: attention replicated by the fallback rule, the MLP and
    embeddings split, the ResNet stem replicated; the loss is the single-device loss."""
    report = scenarios["hybrid"]
    print("single", report["single"], "model_parallel", report["model_parallel"])
    np.testing.assert_allclose(report["model_parallel"], report["single"], rtol=1e-6)  # measured: equal
    assert any("num_heads" in w or "heads=3" in w for w in report["warnings"]), report["warnings"]
    weights = report["weights"]
    assert weights["encoderblock_0/MultiHeadDotProductAttention_1/query_kernel"]["spec"] == [None, None, None]
    assert weights["encoderblock_0/MlpBlock_3/Dense_0/kernel"] == {"spec": [None, "model"], "shard": [24, 16]}
    assert weights["embedding/kernel"]["spec"] == [None, None, None, "model"]
    assert weights["conv_root/kernel"]["spec"] == [None, None, None, None]
    assert weights["block2/unit1/conv3/kernel"]["spec"] == [None, None, None, None]


def _replicated(*shape):
    return {"spec": [None] * len(shape), "shard": list(shape)}


# A few variables of each family's tiny model, laid out by hand from the family's split (model
# axis 4): whole heads, a quarter of the channels or of the classifier's rows per device; the rest whole.
FAMILY_LAYOUTS = {
    "axial_vit": {  # hidden 16, 4 heads of 4, MLP 32, pre_logits 8
        "encoderblock_0_row/MultiHeadDotProductAttention_1/query_kernel": {"spec": [None, "model", None],
                                                                           "shard": [16, 1, 4]},
        "encoderblock_0_column/MultiHeadDotProductAttention_1/out_kernel": {"spec": ["model", None, None],
                                                                            "shard": [1, 4, 16]},
        "encoderblock_0_column/MlpBlock_3/Dense_1/kernel": {"spec": ["model", None], "shard": [8, 16]},
        "embedding/kernel": {"spec": [None, None, None, "model"], "shard": [8, 8, 3, 4]},
        "head/kernel": {"spec": ["model", None], "shard": [2, 8]},
        "encoderblock_0_row/LayerNorm_0/gamma": _replicated(16),
    },
    "axial_resnet": {  # stem 8 channels, 16 attention channels, block output 32
        "layer1_0/conv_up/kernel": {"spec": [None, None, None, "model"], "shard": [1, 1, 16, 8]},
        "layer1_0/downsample_conv/kernel": {"spec": [None, None, None, "model"], "shard": [1, 1, 8, 8]},
        "layer1_0/conv_down/kernel": {"spec": [None, None, "model", None], "shard": [1, 1, 2, 16]},
        "fc/kernel": {"spec": ["model", None], "shard": [8, 8]},
        "layer1_0/hight_block/qkv_transform": _replicated(16, 32),
        "layer1_0/width_block/relative": _replicated(8, 15),
        "conv1/kernel": _replicated(7, 7, 3, 8),
    },
    "efficientnet": {  # stem 8 channels, first inverted residual 8 -> 48 -> 8, head 128
        "blocks_1_0_conv_pw/kernel": {"spec": [None, None, None, "model"], "shard": [1, 1, 8, 12]},
        "blocks_1_0_conv_pwl/kernel": {"spec": [None, None, "model", None], "shard": [1, 1, 12, 8]},
        "conv_head/kernel": {"spec": [None, None, None, "model"], "shard": [1, 1, 32, 32]},
        "classifier/kernel": {"spec": ["model", None], "shard": [32, 8]},
        "blocks_1_0_conv_dw/kernel": _replicated(3, 3, 48, 1),
        "blocks_1_0_se_conv_reduce/kernel": _replicated(1, 1, 48, 2),
        "blocks_0_0_conv_pw/kernel": _replicated(1, 1, 8, 8),
        "blocks_1_0_bn1/moving_variance": _replicated(48),
    },
}


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILY_LAYOUTS))
def test_every_family_model_parallel_matches_one_device(scenarios, family):
    report = scenarios["families"][family]
    print(family, "relative logit error", report["error"], "loss", report["loss"])
    assert report["error"] < 1e-6  # measured 8e-8 to 2.8e-7 (2-core CPU)
    assert np.isfinite(report["loss"])
    weights = report["weights"]
    for path, layout in FAMILY_LAYOUTS[family].items():
        assert weights[path] == layout, path
    # Every variable carries exactly the layout the map gives its path.
    for path, axes in report["layout"].items():
        assert weights[path]["spec"] == axes, path


MULTI_HOST_WORKER = r"""
import json, sys
import jax
jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across processes
import keras
process_id = int(sys.argv[1])
keras.distribution.initialize(job_addresses=sys.argv[2], num_processes=2, process_id=process_id)
import numpy as np, tensorflow as tf, keras_vit
assert (jax.process_count(), jax.device_count(), jax.local_device_count()) == (2, 4, 2)
r = np.random.default_rng(0)
x = r.uniform(-1, 1, (64, 32, 32, 3)).astype("float32")
y = r.integers(0, 8, 64).astype("int32")
CFG = dict(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=4, mlp_dim=64, classes=8)

def build():
    model = keras_vit.VisionTransformer(**CFG)
    w = np.random.default_rng(1)
    for v in model.weights:
        v.assign((w.standard_normal(tuple(v.shape)) * 0.3).astype("float32"))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return model

def dataset():  # the GLOBAL batch stream, identical on both processes
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)

single = build().fit(dataset(), verbose=0).history["loss"][0]  # this process's first device only
distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
with distribution.scope():
    local = next(iter(distribution.distribute_dataset(dataset())))[0].numpy()
    loss = build().fit(dataset(), verbose=0).history["loss"][0]
half = slice(8 * process_id, 8 * process_id + 8)
print(json.dumps(dict(single=single, loss=loss, local_is_own_half=bool(np.array_equal(local, x[half])))))
"""


@pytest.mark.slow
def test_two_processes_initialize_and_shard_the_dataset(tmp_path):
    """keras.distribution.initialize with 2 processes x 2 CPU devices (a 2-host slice in small):
    Keras gives each process its half of every global batch, and the loss is the one-device loss."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:  # a free port for the coordinator, never a fixed one
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    script = tmp_path / "worker.py"
    script.write_text(MULTI_HOST_WORKER)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    workers = [
        subprocess.Popen([sys.executable, str(script), str(i), address], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for i in range(2)
    ]
    reports = []
    try:
        for w in workers:
            out, err = w.communicate(timeout=600)
            assert w.returncode == 0, f"worker failed ({w.returncode}):\n{out}\n{err[-4000:]}"
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
    print(reports)
    for report in reports:
        assert report["local_is_own_half"]
        np.testing.assert_allclose(report["loss"], report["single"], rtol=1.5e-6)  # measured 1.2e-7
