"""Deployment exports of every model family besides the ViT (tests/test_export.py covers the ViT
and the R+ViT hybrid): a tiny BiT ResNet-v2, EfficientNet, AxialResNet and Axial-ViT as a
SavedModel and ONNX file (and LiteRT for BiT and AxialResNet), run by their own runtimes against Keras' predict; the
artefacts with preprocessing against the family's documented normalisation computed here; a
BiT exported at another size against the model built at that size; `model.export` and the CLI
for a non-ViT model; what cannot be exported, refused up front.

All four models' artefacts, `model.export`'s and the CLI's come from one TensorFlow process on JAX
and PyTorch (conftest.OneExportProcess), shared by the tests; there only the ONNX artefacts are
written and checked (conftest.ONNX_ONLY_EXPORTS says why)."""

import contextlib
import io
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.export import ExportError, export_many, export_model
from keras_vit.models import AxialResNet, AxialVisionTransformer, BiTResNet, EfficientNet
from tests.conftest import BACKEND, ONNX_ONLY_EXPORTS, OneExportProcess

tf = pytest.importorskip("tensorflow")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tf2onnx")
litert = pytest.importorskip("ai_edge_litert.interpreter")

# The bars of tests/test_export.py: about 10x the largest error measured there. Measured here
# (relative to the largest output): see each assertion.
SAVED_MODEL_BAR = 1e-7 if BACKEND == "tensorflow" else 2e-6
BAR = 2e-6

# The smallest configs the config classes allow (one stage or block per stage, fewest channels).
TINY = {
    "bit": lambda: BiTResNet(image_size=32, block_units=(1,), width_factor=0.5, classes=5, classifier_activation=None),
    "efficientnet": lambda: EfficientNet(image_size=32, width_multiplier=0.1, depth_multiplier=0.1, classes=5,
                                         classifier_activation=None),
    "axial_resnet": lambda: AxialResNet(image_size=16, block_units=(1,), width_multiplier=0.125, groups=2, classes=5,
                                        classifier_activation=None),
    "axial_vit": lambda: AxialVisionTransformer(image_size=(16, 24), patch_size=8, hidden_size=16, num_layers=1,
                                                num_heads=2, mlp_dim=32, classes=5, classifier_activation=None),
}
# What each family's weights take, as its documentation states it: [-1, 1] (x / 127.5 - 1) or
# timm's / torchvision's ImageNet normalisation of [0, 1] pixels.
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
SIGNED_UNIT = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
NORMALIZATION = {"bit": SIGNED_UNIT, "efficientnet": IMAGENET, "axial_resnet": IMAGENET, "axial_vit": SIGNED_UNIT}
FAMILIES = list(TINY)
# EfficientNet's blocks shrink a random signal about 8x each (SiLU near 0 halves it twice, the
# squeeze-excitation gate halves it): with unit-gain kernels its output is the same for every
# image, with twice that gain per kernel the images stay apart (and float32 rounding grows
# with the signal: its bar, below).
GAIN = {"efficientnet": 2.0}
# Its seven blocks at that gain carry float32 rounding to the output as they carry the image
# (measured up to 4.5e-6); its bar is 4x that.
BAR_FOR = {"efficientnet": 2e-5}
BIT_OTHER_SIZE = (48, 40)


def tiny_model(family, seed):
    """A tiny model with every weight random (zero-initialised heads and norms would hide bugs):
    kernels of about unit gain, norms and biases near their initial values, so the signal
    survives every layer (the tests check that the outputs differ from image to image)."""
    model = TINY[family]()
    r = np.random.default_rng(seed)
    for variable in model.weights:
        shape, value = tuple(variable.shape), keras.ops.convert_to_numpy(variable)
        noise = r.standard_normal(shape)
        name = variable.path.rsplit("/", 1)[-1]
        if name in ("gamma", "scale", "moving_variance"):
            value = 1.0 + 0.2 * np.abs(noise) if name == "moving_variance" else 1.0 + 0.2 * noise
        elif name in ("beta", "bias", "moving_mean"):
            value = 0.2 * noise
        elif len(shape) >= 2:  # kernels of about unit gain: the signal neither fades nor saturates
            depthwise = len(shape) == 4 and shape[-1] == 1
            value = GAIN.get(family, 1.0) * noise / np.sqrt(np.prod(shape[:2] if depthwise else shape[:-1]))
        elif not np.any(value):
            value = 0.2 * noise
        variable.assign(np.asarray(value, dtype=variable.dtype))
    return model


def spread(outputs):
    """How much the outputs differ between the images of a batch, relative to their size."""
    outputs = np.asarray(outputs, np.float64)
    return float(np.abs(outputs - outputs[:1]).max() / np.abs(outputs).max())


def relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def run_onnx(path, images):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    return session.run(["predictions"], {"images": images})[0]


def run_litert(path, images):
    return litert.Interpreter(model_path=path).get_signature_runner("serve")(images=images)["predictions"]


def float_images(n, size, seed):
    """Noise around a colour of each image's own: i.i.d. noise alone averages out in the global
    pooling of a tiny network, and every image would give nearly the same output."""
    r = np.random.default_rng(seed)
    return (r.uniform(-0.5, 0.5, (n, 1, 1, 3)) + r.uniform(-0.5, 0.5, (n, *size, 3))).astype("float32")


def uint8_images(n, size, seed):
    r = np.random.default_rng(seed)
    return (r.integers(0, 128, (n, 1, 1, 3)) + r.integers(0, 128, (n, *size, 3))).astype("uint8")


def normalised(pixels, size, family):
    """The documented preprocessing, computed here: bilinear resize to the model's size, then
    (pixels / 255 - mean) / std in float64."""
    resized = tf.image.resize(pixels.astype("float32"), size, method="bilinear").numpy().astype("float64")
    mean, std = (np.asarray(v, np.float64) for v in NORMALIZATION[family])
    return ((resized / 255.0 - mean) / std).astype("float32")


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """{family: (model, {artefact: path})}: every family's artefacts, written in one call; and
    what `model.export` and `keras-vit export` returned and printed ("model.export", "cli"), their
    artefacts written by the same TensorFlow process."""
    out = tmp_path_factory.mktemp("families")
    models, pairs = {}, []
    for seed, family in enumerate(FAMILIES):
        models[family] = tiny_model(family, seed)
        paths = {
            "saved_model": str(out / f"{family}_sm"),
            "onnx": str(out / f"{family}.onnx"),
            "litert": str(out / f"{family}.tflite"),
            "onnx_pre": str(out / f"{family}_pre.onnx"),
        }
        jobs = {
            "saved_model": dict(format="tf_saved_model"),
            "onnx": dict(format="onnx"),
            "litert": dict(format="litert"),
            "onnx_pre": dict(format="onnx", with_preprocessing=True),
        }
        if family == "axial_vit":  # its preprocessing is ViT's and BiT's, checked with those
            del paths["onnx_pre"], jobs["onnx_pre"]
        if family in ("efficientnet", "axial_vit"):  # LiteRT: the converter's slowest model and the ViT's ops
            del paths["litert"], jobs["litert"]
        if family == "bit":  # a convolutional network at another size: the same weights
            paths["onnx_resized"] = str(out / "bit_resized.onnx")
            jobs["onnx_resized"] = dict(format="onnx", image_size=BIT_OTHER_SIZE)
        if ONNX_ONLY_EXPORTS:
            paths = {k: v for k, v in paths.items() if k not in ("saved_model", "litert")}
        pairs.append((models[family], [dict(jobs[k], path=paths[k]) for k in paths]))
        models[family] = (models[family], paths)
    # Keras' spelling, and the CLI on a .keras file of a non-ViT model.
    efficientnet, model_export_path = models["efficientnet"][0], str(out / "e.onnx")
    axial = tiny_model("axial_resnet", seed=22)
    axial.save(str(out / "axial.keras"))
    cli_path, printed = str(out / "axial.onnx"), io.StringIO()
    with OneExportProcess():
        export_many(pairs)
        returned = efficientnet.export(model_export_path, format="onnx", with_preprocessing=True)
        from keras_vit import cli

        with contextlib.redirect_stdout(printed):
            status = cli.main(["export", str(out / "axial.keras"), cli_path, "--format", "onnx"])
    models["model.export"] = (efficientnet, model_export_path, returned)
    models["cli"] = (axial, cli_path, status, printed.getvalue())
    return models


# === Parity with Keras' predict ===


@pytest.mark.parametrize("family", FAMILIES)
def test_artefacts_match_keras_predict(family, exports):
    model, paths = exports[family]
    images = float_images(3, model.input_shape[1:3], seed=11)
    expected = model.predict(images, verbose=0)
    assert spread(expected) > 0.05  # the images reach the output
    errors = {"onnx": relative_error(run_onnx(paths["onnx"], images), expected)}
    if "saved_model" in paths:
        loaded = tf.saved_model.load(paths["saved_model"])
        errors["saved_model"] = relative_error(loaded.serve(tf.constant(images)).numpy(), expected)
    if "litert" in paths:
        errors["litert"] = relative_error(run_litert(paths["litert"], images), expected)
    print(family, {k: f"{v:.1e}" for k, v in errors.items()})
    # Measured (JAX, TensorFlow, PyTorch): BiT, AxialResNet, Axial-ViT at most 8.6e-7 (SavedModel
    # built on TensorFlow: 0, AxialResNet 7.1e-8); EfficientNet 4.5e-6 (see GAIN).
    bar = BAR_FOR.get(family, BAR)
    assert errors.get("saved_model", 0.0) <= (SAVED_MODEL_BAR if BACKEND == "tensorflow" else bar)
    assert errors["onnx"] <= bar
    assert errors.get("litert", 0.0) <= bar
    if ONNX_ONLY_EXPORTS:
        return
    # serving_default: the probabilities (the softmax of the logits, computed here) and the top-5
    # classes.
    signature = loaded.signatures["serving_default"](images=tf.constant(images))
    e = np.exp(expected - expected.max(-1, keepdims=True))
    probabilities = e / e.sum(-1, keepdims=True)
    np.testing.assert_allclose(signature["probabilities"].numpy(), probabilities, rtol=2e-6, atol=1e-7)
    np.testing.assert_array_equal(signature["top5_classes"].numpy(), np.argsort(-probabilities, -1)[:, :5])


@pytest.mark.parametrize("family", ["bit", "efficientnet", "axial_resnet"])
def test_with_preprocessing_uses_the_familys_normalisation(family, exports):
    # uint8 images of another size in; the reference resizes and normalises them as the family's
    # documentation says (EfficientNet and AxialResNet: ImageNet mean and std; BiT, Axial-ViT:
    # [-1, 1]) and runs Keras' predict.
    model, paths = exports[family]
    size = model.input_shape[1:3]
    pixels = uint8_images(2, (27, 35), seed=12)
    expected = model.predict(normalised(pixels, size, family), verbose=0)
    error = relative_error(run_onnx(paths["onnx_pre"], pixels), expected)
    print(family, f"with preprocessing: {error:.1e}")  # measured: at most 3.9e-7; EfficientNet 2.0e-6
    assert error <= BAR_FOR.get(family, BAR)
    # The other normalisation is far off: the test tells them apart.
    other = "bit" if NORMALIZATION[family] is IMAGENET else "efficientnet"
    assert relative_error(model.predict(normalised(pixels, size, other), verbose=0), expected) > 1e-2


def test_bit_exports_at_another_size(exports):
    model, paths = exports["bit"]
    resized = BiTResNet(**dict(model.get_config(), image_size=BIT_OTHER_SIZE))
    resized.set_weights(model.get_weights())
    images = float_images(2, BIT_OTHER_SIZE, seed=13)
    assert relative_error(run_onnx(paths["onnx_resized"], images), resized.predict(images, verbose=0)) <= BAR


# === model.export and the CLI ===


def test_model_export_of_an_efficientnet(exports):
    # Keras' spelling reaches keras_vit.export on every backend (Keras' own export of this model
    # fails on PyTorch).
    model, asked, path = exports["model.export"]
    assert path == asked
    pixels = uint8_images(2, (40, 24), seed=14)
    expected = model.predict(normalised(pixels, (32, 32), "efficientnet"), verbose=0)
    assert spread(expected) > 0.05
    assert relative_error(run_onnx(path, pixels), expected) <= BAR_FOR["efficientnet"]


def test_cli_exports_a_non_vit_keras_file(exports):
    model, out, status, printed = exports["cli"]
    assert status == 0
    assert "wrote onnx artefact" in printed and "normalised with mean (0.485, 0.456, 0.406)" in printed
    images = float_images(2, (16, 16), seed=15)
    expected = model.predict(images, verbose=0)
    assert spread(expected) > 0.05
    assert relative_error(run_onnx(out, images), expected) <= BAR


# === What cannot be exported: refused before any work ===


@pytest.mark.parametrize("family", FAMILIES)
def test_model_export_routes_through_keras_vit_and_refuses_int8(family, tmp_path):
    model = TINY[family]()
    title = keras_vit.family_of(model).title
    with pytest.raises(ExportError, match="ending in '.onnx'"):  # keras_vit's check, not Keras'
        model.export(str(tmp_path / "m.tflite"), format="onnx")
    for fmt, name in [("tf_saved_model", "sm"), ("onnx", "m.onnx"), ("litert", "m.tflite")]:
        with pytest.raises(ExportError, match=f"int8=True is not available for this {title}.*Vision Transformer only"):
            model.export(str(tmp_path / name), format=fmt, int8=True)
    assert not os.listdir(tmp_path)


def test_sizes_that_cannot_work_are_refused(tmp_path):
    axial = TINY["axial_resnet"]()
    with pytest.raises(ExportError, match="cannot change this AxialResNet, built at 16x16.*relative embeddings"):
        export_model(axial, tmp_path / "m.onnx", format="onnx", image_size=32)
    with pytest.raises(ExportError, match="image_size 36x36 is not divisible by the model's stride 8"):
        export_model(TINY["axial_vit"](), tmp_path / "m.onnx", format="onnx", image_size=36)
    any_size = EfficientNet(image_size=None, width_multiplier=0.1, depth_multiplier=0.1, classes=5)
    with pytest.raises(ExportError, match="with_preprocessing=True resizes images to the model's size"):
        export_model(any_size, tmp_path / "m.onnx", format="onnx", with_preprocessing=True)
    any_size.quantize("int8")  # Keras' own int8 of the classifier, which a .keras file does not remember
    with pytest.raises(ExportError, match="int8-quantized model cannot be exported for this EfficientNet"):
        export_model(any_size, tmp_path / "m.onnx", format="onnx")
    assert not os.listdir(tmp_path)
