"""int8 weight quantization (`model.quantize("int8")`) of keras_vit models.

Keras quantizes the Dense layers natively (MlpBlock Dense_0/Dense_1, pre_logits, head): int8
kernels with per-output-channel scales, inputs quantized on the fly. The attention kernels
(query/key/value/out, 4-D einsum kernels of our own layer) stay in float. The quantized output
is compared with the float model's own output and with an independent NumPy forward pass on the
de-quantized weights the quantized model holds.

A quantized model saves and reloads quantized: VisionTransformer.quantize records the mode and
the QuantizationConfig in the model's config, and a model rebuilt from that config quantizes
itself before the saved int8 kernels and scales load.
"""

import warnings

import keras
import numpy as np
from conftest import TINY, randomize, run_python
from reference_numpy import vit_forward

import keras_vit


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
    expected = {f"encoderblock_{i}/MlpBlock_3/Dense_{j}" for i in range(2) for j in range(2)} | {"head"}
    assert quantized == expected
    for path in expected:
        layer = next(layer for layer in model._flatten_layers() if layer.path == path)
        assert keras.backend.standardize_dtype(layer._kernel.dtype) == "int8"
    out = model.predict(x, verbose=0)
    assert out.shape == ref.shape and np.all(np.isfinite(out))
    change = np.abs(out - ref)
    # int8 with per-channel scales: about 1% of the logit range, and the ranking survives.
    assert change.max() < 0.05 * np.abs(ref).max(), (change.max(), np.abs(ref).max())
    assert change.mean() < 0.01 * np.abs(ref).max()
    assert np.all(out.argmax(-1) == ref.argmax(-1))


def test_quantized_model_matches_numpy_on_dequantized_weights():
    """What the int8 layers compute is x @ (q * scale) up to the on-the-fly input quantization:
    a NumPy forward pass on the de-quantized kernels lands closer than the float weights do."""
    model = _logits_model(seed=2)
    x = np.random.default_rng(3).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    tree = keras_vit.get_weight_tree(model)
    model.quantize("int8")
    deq = dict(tree)
    for path in ("Transformer/encoderblock_0/MlpBlock_3/Dense_0", "Transformer/encoderblock_0/MlpBlock_3/Dense_1",
                 "Transformer/encoderblock_1/MlpBlock_3/Dense_0", "Transformer/encoderblock_1/MlpBlock_3/Dense_1",
                 "head"):
        layer_path = path.replace("Transformer/", "")
        layer = next(layer for layer in model._flatten_layers() if layer.path == layer_path)
        q = keras.ops.convert_to_numpy(layer._kernel).astype("float64")
        scale = keras.ops.convert_to_numpy(layer.kernel_scale).astype("float64")
        deq[f"{path}/kernel"] = (q / scale).astype("float32")  # Keras stores kernel = round(w * scale)
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
    assert layers == sorted([f"encoderblock_{i}/MlpBlock_3/Dense_{j}" for i in range(2) for j in range(2)] + ["head"])
    assert np.array_equal(np.load(tmp_path / "out.npy"), out)

    # A float model's config says so, and it reloads float.
    assert keras_vit.VisionTransformer(**TINY).get_config()["quantization"] is None
