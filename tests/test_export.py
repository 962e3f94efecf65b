"""Deployment exports: SavedModel, ONNX and LiteRT artefacts of a tiny ViT and a tiny R+ViT
hybrid, run by their own runtimes (tf.saved_model, onnxruntime, ai-edge-litert) against Keras'
predict on the same inputs; int8 artefacts against the float model; the CLI; clear errors.

On JAX and PyTorch the artefacts come from a TensorFlow subprocess, so the three models'
artefacts are written in one `export_many` call, and the CLI's artefact by the same process
(conftest.OneExportProcess: one process, one rebuild each); there only the ONNX artefacts are
written and checked (conftest.ONNX_ONLY_EXPORTS says why)."""

import contextlib
import io
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.export import ExportError, export_many, export_model
from tests.conftest import BACKEND, ONNX_ONLY_EXPORTS, TINY, TINY_HYBRID, OneExportProcess, randomize

tf = pytest.importorskip("tensorflow")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("tf2onnx")
litert = pytest.importorskip("ai_edge_litert.interpreter")

# Relative errors against Keras' predict, about 10x the largest measured (JAX, TensorFlow):
# the SavedModel of a model built on TensorFlow runs the same graph (measured 0); from JAX 1.4e-7.
# ONNX 1.4e-7, LiteRT 2.1e-7 (float32 rounding: a wrong resize or preprocessing moves them by 1e-2).
SAVED_MODEL_BAR = 1e-7 if BACKEND == "tensorflow" else 2e-6
BAR = 2e-6

# The ViT: class token, pre_logits, logits out. The hybrid: ResNet stem + stages, gap.
# Wide enough that every transformer kernel has over 1024 elements, the least the TFLite
# converter quantizes.
VIT = dict(TINY, hidden_size=48, mlp_dim=96, representation_size=32, classifier_activation=None)
HYBRID = dict(TINY_HYBRID, classifier="gap")


def relative_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def run_saved_model(path, images):
    loaded = tf.saved_model.load(path)
    return loaded.serve(tf.constant(images)).numpy(), {
        k: v.numpy() for k, v in loaded.signatures["serving_default"](images=tf.constant(images)).items()
    }


def run_onnx(path, images):
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    return session.run(["predictions"], {"images": images})[0]


def run_litert(path, images):
    interpreter = litert.Interpreter(model_path=path)
    runner = interpreter.get_signature_runner("serve")
    return runner(images=images)["predictions"]


def float_images(n, size, seed):
    return np.random.default_rng(seed).uniform(-1, 1, (n, *size, 3)).astype("float32")


@pytest.fixture(scope="module")
def exports(tmp_path_factory, tiny_preset):
    """The artefacts of the module's three models, written by one `export_many` call (on JAX and
    PyTorch one TensorFlow process): {name: (model, {artefact: path})}; and under "cli", the
    `keras-vit export` of `tiny_preset` at 48x40 with preprocessing (its artefact written by the
    same process): (path, exit status, what it printed)."""
    out = tmp_path_factory.mktemp("exports")
    vit = randomize(keras_vit.VisionTransformer(**VIT), seed=1)
    vit_jobs = {
        "saved_model": dict(path=str(out / "sm"), format="tf_saved_model"),
        "onnx": dict(path=str(out / "vit.onnx"), format="onnx"),
        "litert": dict(path=str(out / "vit.tflite"), format="litert"),
        "saved_model_int8": dict(path=str(out / "sm_int8"), format="saved_model", int8=True),
        "onnx_int8": dict(path=str(out / "vit_int8.onnx"), format="onnx", int8=True),
        "litert_int8": dict(path=str(out / "vit_int8.tflite"), format="litert", int8=True),
        # LiteRT on TensorFlow; ONNX where only ONNX artefacts are written.
        "with_preprocessing": (dict(path=str(out / "vit_pre.onnx"), format="onnx", with_preprocessing=True)
                               if ONNX_ONLY_EXPORTS else
                               dict(path=str(out / "vit_pre.tflite"), format="litert", with_preprocessing=True)),
    }
    hybrid = randomize(keras_vit.VisionTransformer(**HYBRID), seed=2, scale=0.3)
    hybrid_jobs = {f: dict(path=str(out / p), format=f) for f, p in
                   (("saved_model", "hybrid_sm"), ("onnx", "hybrid.onnx"), ("litert", "hybrid.tflite"))}
    # A model that takes images of any size: with preprocessing, the artefact resizes uint8 images
    # of any size to the size the model was built at (as keras_vit.data does); without, it takes
    # float images of any size the patch divides.
    dynamic = randomize(keras_vit.VisionTransformer(**dict(VIT, dynamic_image_size=True)), seed=9)
    dynamic_jobs = {"pre": dict(path=str(out / "pre.onnx"), format="onnx", with_preprocessing=True),
                    "plain": dict(path=str(out / "any.onnx"), format="onnx")}
    models = {"vit": (vit, vit_jobs), "hybrid": (hybrid, hybrid_jobs), "dynamic": (dynamic, dynamic_jobs)}
    if ONNX_ONLY_EXPORTS:
        for jobs in (vit_jobs, hybrid_jobs):
            for name in [name for name, job in jobs.items() if job["format"] != "onnx"]:
                del jobs[name]
    cli_path, printed, errors = str(out / "tiny.onnx"), io.StringIO(), io.StringIO()
    with OneExportProcess():
        export_many([(model, list(jobs.values())) for model, jobs in models.values()])
        from keras_vit import cli

        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
            status = cli.main(["export", tiny_preset, cli_path, "--format", "onnx", "--image-size", "48", "40",
                               "--with-preprocessing"])
    written = {name: (model, {k: v["path"] for k, v in jobs.items()}) for name, (model, jobs) in models.items()}
    return dict(written, cli=(cli_path, status, printed.getvalue(), errors.getvalue()))


@pytest.fixture(scope="module")
def vit_exports(exports):
    return exports["vit"]


@pytest.fixture(scope="module")
def hybrid_exports(exports):
    return exports["hybrid"]


# === Float parity ===


@pytest.mark.parametrize("which", ["vit", "hybrid"])
def test_float_artefacts_match_keras_predict(which, vit_exports, hybrid_exports):
    model, paths = vit_exports if which == "vit" else hybrid_exports
    images = float_images(4, model.image_size, seed=3)
    expected = model.predict(images, verbose=0)

    assert relative_error(run_onnx(paths["onnx"], images), expected) <= BAR
    if ONNX_ONLY_EXPORTS:
        return
    served, signature = run_saved_model(paths["saved_model"], images)
    assert relative_error(served, expected) <= SAVED_MODEL_BAR
    assert relative_error(run_litert(paths["litert"], images), expected) <= BAR

    # serving_default: probabilities (softmax of the ViT's logits; the hybrid's own softmax) and
    # the top-5 classes, checked with NumPy.
    probabilities = softmax(expected) if which == "vit" else expected
    np.testing.assert_allclose(signature["probabilities"], probabilities, rtol=2e-6, atol=1e-8)  # 1.8e-7
    top5 = np.argsort(-probabilities, axis=-1)[:, :5]
    np.testing.assert_array_equal(signature["top5_classes"], top5)
    np.testing.assert_allclose(
        signature["top5_probabilities"], np.take_along_axis(probabilities, top5, -1), rtol=2e-6, atol=1e-8
    )
    assert signature["top5_classes"].dtype == np.int32


def test_with_preprocessing_takes_uint8_images_of_any_size(vit_exports):
    model, paths = vit_exports
    path = paths["with_preprocessing"]  # LiteRT on TensorFlow, ONNX on JAX and PyTorch
    if path.endswith(".onnx"):
        run = run_onnx
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        assert session.get_inputs()[0].type == "tensor(uint8)"
    else:
        run = run_litert
        interpreter = litert.Interpreter(model_path=path)
        assert interpreter.get_signature_runner("serve").get_input_details()["images"]["dtype"] == np.uint8
    pixels = np.random.default_rng(4).integers(0, 256, (3, 45, 37, 3)).astype("uint8")
    # The reference: keras_vit.data's evaluation resize (bilinear), preprocess_input, predict.
    resized = tf.image.resize(pixels.astype("float32"), model.image_size, method="bilinear").numpy()
    expected = model.predict(keras_vit.preprocess_input(resized), verbose=0)
    assert relative_error(run(path, pixels), expected) <= BAR  # measured 2.1e-7 (LiteRT)
    other = np.random.default_rng(5).integers(0, 256, (1, 64, 80, 3)).astype("uint8")
    resized = tf.image.resize(other.astype("float32"), model.image_size, method="bilinear").numpy()
    expected = model.predict(keras_vit.preprocess_input(resized), verbose=0)
    assert relative_error(run(path, other), expected) <= BAR


def test_dynamic_image_size_model_exports_with_and_without_preprocessing(exports):
    model, paths = exports["dynamic"]
    assert model.input_shape == (None, None, None, 3) and model.image_size == (32, 32)
    pre, plain = paths["pre"], paths["plain"]
    pixels = np.random.default_rng(4).integers(0, 256, (3, 45, 37, 3)).astype("uint8")
    resized = tf.image.resize(pixels.astype("float32"), (32, 32), method="bilinear").numpy()
    expected = model.predict(keras_vit.preprocess_input(resized), verbose=0)
    assert relative_error(run_onnx(pre, pixels), expected) <= BAR  # measured 4e-8
    for size in [(32, 32), (48, 40)]:
        images = float_images(2, size, seed=10)
        assert relative_error(run_onnx(plain, images), model.predict(images, verbose=0)) <= BAR, size  # 8e-8


# === int8 ===


def test_int8_artefacts(vit_exports):
    model, paths = vit_exports
    images = float_images(256, model.image_size, seed=6)  # the fixed synthetic set
    float_logits = model.predict(images, verbose=0, batch_size=64)
    artefacts = {"onnx": run_onnx(paths["onnx_int8"], images)}
    if not ONNX_ONLY_EXPORTS:
        artefacts["saved_model"] = run_saved_model(paths["saved_model_int8"], images)[0]
        artefacts["litert"] = run_litert(paths["litert_int8"], images)
        # The SavedModel computes the int8 Keras model, to float32 rounding (largest per-image
        # error, relative to the largest logit: 0 built on TensorFlow, 5.7e-7 from JAX, 1.1e-6
        # from PyTorch; an input element rounded to the neighbouring int8 step would move an
        # image by about 1e-3).
        quantized = keras_vit.VisionTransformer.from_config(model.get_config())
        quantized.set_weights(model.get_weights())
        quantized.quantize("int8")
        int8_logits = quantized.predict(images, verbose=0, batch_size=64)
        per_image = np.abs(artefacts["saved_model"] - int8_logits).max(-1) / np.abs(int8_logits).max()
        assert np.median(per_image) <= 1e-6 and per_image.max() <= 1e-5

    # Every artefact keeps the float model's top-1 class on every image: the float logits' top-1
    # margins are at least 0.0103, and int8 moves a logit by at most 0.0015 (SavedModel), 0.0013
    # (ONNX) and 0.0011 (LiteRT) on every backend; bounded at 10x the largest.
    margins = np.diff(np.sort(float_logits, -1)[:, -2:], axis=-1)
    assert margins.min() > 0.01
    for name, logits in artefacts.items():
        agreement = float(np.mean(logits.argmax(-1) == float_logits.argmax(-1)))
        change = float(np.abs(logits - float_logits).max())
        print(f"int8 {name}: top-1 agreement {agreement:.3f}, largest logit change {change:.4f}")
        assert agreement == 1.0, name
        assert change <= 0.015, name
    # ONNX: every weight matmul (the block kernels q, k, v, out, Dense_0, Dense_1, pre_logits and
    # the head) runs as MatMulInteger on int8 weights (at this tiny size the scales and zero points
    # outweigh the saving in bytes). LiteRT: the block kernels and pre_logits are int8 (the head has
    # under 1024 weights), in a smaller file.
    import onnx

    graph = onnx.load(paths["onnx_int8"]).graph
    assert sum(node.op_type == "MatMulInteger" for node in graph.node) == 6 * VIT["num_layers"] + 2
    int8_weights = [i for i in graph.initializer if i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 2]
    assert len(int8_weights) == 6 * VIT["num_layers"] + 2
    if not ONNX_ONLY_EXPORTS:
        interpreter = litert.Interpreter(model_path=paths["litert_int8"])
        int8_kernels = [t for t in interpreter.get_tensor_details() if t["dtype"] == np.int8 and len(t["shape"]) == 2]
        assert len(int8_kernels) == 6 * VIT["num_layers"] + 1
        assert os.path.getsize(paths["litert_int8"]) < 0.6 * os.path.getsize(paths["litert"])


# === CLI ===


@pytest.fixture(scope="module")
def tiny_preset(tmp_path_factory):
    folder = tmp_path_factory.mktemp("preset") / "tiny"
    model = randomize(keras_vit.VisionTransformer(**TINY), seed=7)
    keras_vit.save_preset(model, folder, metadata={"source": "random"})
    return str(folder)


def test_cli_exports_onnx_with_preprocessing_at_a_new_size(tiny_preset, exports):
    out, status, printed, errors = exports["cli"]
    assert status == 0, errors[-3000:]
    assert "wrote onnx artefact" in printed
    model = keras_vit.load_checkpoint(tiny_preset, image_size=(48, 40))
    pixels = np.random.default_rng(8).integers(0, 256, (2, 30, 50, 3)).astype("uint8")
    resized = tf.image.resize(pixels.astype("float32"), (48, 40), method="bilinear").numpy()
    expected = model.predict(keras_vit.preprocess_input(resized), verbose=0)
    assert relative_error(run_onnx(out, pixels), expected) <= BAR


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--format", "litert"], "A LiteRT artefact is a file ending in '.tflite'"),
        (["--format", "saved_model"], "looks like a file"),
        (["--format", "onnx", "--image-size", "30"], "not divisible by the patch size 8"),
        (["--format", "onnx", "--image-size", "32", "32", "32"], "--image-size takes one number of pixels for a square input (384) or HEIGHTxWIDTH (384x512, or 384,512), or H W; got 32 32 32."),
    ],
)
def test_cli_errors_are_one_line(argv, message, tiny_preset, tmp_path, capsys):
    from keras_vit import cli

    assert cli.main(["export", tiny_preset, str(tmp_path / "out.onnx"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("keras-vit export: error: ") and message in err
    assert "Traceback" not in err
    assert not os.path.exists(tmp_path / "out.onnx")


def test_cli_rejects_an_unknown_format(tiny_preset, tmp_path, capsys):
    from keras_vit import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["export", tiny_preset, str(tmp_path / "m"), "--format", "openvino"])
    assert exit_info.value.code == 2
    assert "keras-vit export: error: argument --format: invalid choice: 'openvino'" in capsys.readouterr().err


# === API errors (raised before any export work) ===


@pytest.fixture
def tiny_model():
    return keras_vit.VisionTransformer(**TINY)


def test_model_export_refuses_what_cannot_work(tiny_model, tmp_path):
    with pytest.raises(ExportError, match="Unknown export format 'torchscript'"):
        export_model(tiny_model, tmp_path / "m", format="torchscript")
    with pytest.raises(ExportError, match="ending in '.onnx'"):
        tiny_model.export(str(tmp_path / "m.tflite"), format="onnx")
    with pytest.raises(ExportError, match="own input signature"):
        tiny_model.export(str(tmp_path / "m.onnx"), format="onnx", input_signature=[keras.InputSpec(shape=(1, 32, 32, 3))])
    with pytest.raises(ExportError, match="not divisible by the model's stride 8"):
        export_model(tiny_model, tmp_path / "m.onnx", format="onnx", image_size=(40, 36))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="a folder with other files in it"):
        tiny_model.export(str(tmp_path / "taken"), format="tf_saved_model")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_quantized_models_export_only_as_int8_at_their_size(tiny_model, tmp_path):
    int4 = keras_vit.VisionTransformer(**TINY)
    int4.quantize("int4")
    with pytest.raises(ExportError, match="int4-quantized; only float and int8"):
        export_model(int4, tmp_path / "m.onnx", format="onnx")
    tiny_model.quantize("int8")
    with pytest.raises(ExportError, match="image_size cannot change a quantized model"):
        export_model(tiny_model, tmp_path / "m.onnx", format="onnx", image_size=64)
    with pytest.raises(ExportError, match="already int8-quantized in Keras"):
        tiny_model.export(str(tmp_path / "m.tflite"), format="litert", int8=True)


@pytest.mark.backend_independent  # tf2onnx on a tf.function: no Keras backend involved
@pytest.mark.parametrize("user_setting", [None, "TRUE"])
def test_onnx_conversion_without_graph_copies_falls_back_to_tf2onnx_default(user_setting, tmp_path, monkeypatch):
    """keras_vit converts with tf2onnx's optimizer working on the graph itself (no deep copy per
    pass); a pass that fails then fails the conversion, and keras_vit converts again as tf2onnx
    does by default (the failing pass dropped). A TF2ONNX_CATCH_ERRORS set by the user is left
    alone, and the variable is as it was afterwards. The failing pass is a real tf2onnx optimizer
    pass registered for this test."""
    from tf2onnx import optimizer
    from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase

    from keras_vit import export

    seen = []  # TF2ONNX_CATCH_ERRORS as each run of the failing pass saw it

    class FailingPass(GraphOptimizerBase):
        def _optimize(self, graph):
            seen.append(os.environ.get("TF2ONNX_CATCH_ERRORS"))
            raise RuntimeError("this pass fails")

    monkeypatch.setitem(optimizer._optimizers, "keras_vit_test_failing_pass", FailingPass)
    if user_setting is None:
        monkeypatch.delenv("TF2ONNX_CATCH_ERRORS", raising=False)
    else:
        monkeypatch.setenv("TF2ONNX_CATCH_ERRORS", user_setting)
    spec = tf.TensorSpec((None, 3), tf.float32, name="x")
    forward = tf.function(lambda x: tf.nn.relu(x) * 2.0 + 1.0, input_signature=[spec])
    path = str(tmp_path / "m.onnx")
    if user_setting is None:
        export._convert_with_tf2onnx(forward, spec, path)
        # First without the copies (the failing pass ends that conversion), then tf2onnx's default,
        # which runs each pass on a copy, drops the failing one and goes on (several rounds).
        assert seen[0] == "FALSE" and len(seen) >= 2 and set(seen[1:]) == {None}
        assert "TF2ONNX_CATCH_ERRORS" not in os.environ
        x = np.array([[-1.0, 0.5, 2.0]], "float32")
        (y,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})
        np.testing.assert_allclose(y, np.maximum(x, 0) * 2 + 1)
    else:
        # Whether the conversion then fails is tf2onnx's to decide (1.17 reads any value as "no
        # copies", so the failing pass fails it): keras_vit neither changes the variable nor retries.
        with contextlib.suppress(RuntimeError):
            export._convert_with_tf2onnx(forward, spec, path)
        assert seen and set(seen) == {user_setting}
        assert os.environ["TF2ONNX_CATCH_ERRORS"] == user_setting
