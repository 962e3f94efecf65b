"""Deployment exports: a keras_vit model as a TensorFlow SavedModel (TF Serving), ONNX or LiteRT file.

    import keras_vit
    model = keras_vit.ViTB16(weights="augreg2_in21k_ft_in1k")
    keras_vit.export_model(model, "vit_b16_savedmodel")                  # TF Serving
    keras_vit.export_model(model, "vit_b16.onnx", format="onnx")         # onnxruntime
    keras_vit.export_model(model, "vit_b16.tflite", format="litert", int8=True)
    model.export("vit_b16.onnx", format="onnx")                          # the same, Keras' spelling

Every model family exports (ViT and its hybrids, BiT, Axial-ViT, AxialResNet, EfficientNet):
`model.export` of each family's model class comes here (`keras_vit.models.export_method`), and
what differs between families is read off the family record (`keras_vit.models.family`): the
input normalisation `with_preprocessing` applies, whether int8 exists, whether the weights
allow another `image_size`.

Every artefact is produced by TensorFlow: the SavedModel by `tf.saved_model` (through
`keras.export.ExportArchive`), ONNX by tf2onnx from the same traced function, LiteRT by the
TFLite converter from that SavedModel (builtin ops only, so ai-edge-litert's Interpreter runs it
without the Flex delegate). A model that lives on the JAX or PyTorch backend is saved as a
`.keras` file (a backend-neutral format that also carries int8 weights) and rebuilt in a
subprocess with `KERAS_BACKEND=tensorflow`, which writes the artefacts. On TensorFlow the model
is exported in-process.

Artefacts (`images` is the input name everywhere):
- SavedModel: signature `serving_default` takes `images` and returns `probabilities` (batch,
  classes), `top5_classes` (batch, 5) int32 and `top5_probabilities`; a model without a head
  (`include_top=False`) returns `features`. The endpoint `serve` returns exactly what Keras'
  `predict` returns.
- ONNX and LiteRT: one input `images`, one output: what Keras' `predict` returns.
- Inputs: float32 images as the model takes them (ViT, BiT, Axial-ViT: scaled to [-1, 1];
  EfficientNet, AxialResNet: normalised with the ImageNet mean and std) at the model's size, any
  batch size; with `with_preprocessing=True`, uint8 images of any size (batch, height, width, 3),
  resized (bilinear) to the model's size and normalised inside the artefact by the family's
  `input_normalization` ((pixels / 255 - mean) / std; for [-1, 1] that is
  `keras_vit.preprocess_input`, as the evaluation pipeline of `keras_vit.data` does). A
  `dynamic_image_size` model takes float images of any size its stride divides, and with
  preprocessing resizes to the size it was built at (its `image_size`); a fully convolutional
  model built for any size (BiT, EfficientNet with input_shape=(None, None, 3)) needs
  `image_size` for preprocessing.
- `int8=True`: int8 weights, each format in its runtime's own int8 form, applied to the float
  model. SavedModel: keras_vit's int8 (`VisionTransformer.quantize("int8")`: every transformer
  matmul, pre_logits and the head with int8 kernels and per-output-channel scales, inputs
  quantized per token), so it computes what the int8 Keras model computes. ONNX: onnxruntime's
  dynamic quantization (`quantize_dynamic`) of the same weight matmuls: per-channel int8
  weights, MatMulInteger with inputs quantized per call. LiteRT: the TFLite converter's
  dynamic-range quantization: every constant weight tensor of over 1024 elements (the
  converter's rule: also the patch embedding) stored int8, run by hybrid int8 kernels. The
  hybrid's ResNet stays float everywhere (its standardised kernels are computed, not stored).
- A model already quantized in Keras (int8) exports as it is to every format and computes its
  int8 numerics; ONNX and LiteRT fold its int8 kernels into float32 constants (no smaller file).
  int8=True for ONNX or LiteRT needs the float model (ExportError otherwise). int8 is the Vision
  Transformer's (its family's `int8`); other families export float32 only.
"""

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile

from keras_vit.geometry import positive_pair

#: Export formats, with the spellings the CLI and Keras use.
FORMATS = {
    "tf_saved_model": "tf_saved_model",
    "saved_model": "tf_saved_model",
    "savedmodel": "tf_saved_model",
    "onnx": "onnx",
    "litert": "litert",
    "tflite": "litert",
}
#: The Python packages each format needs (module name, pip name) in the TensorFlow process.
REQUIREMENTS = {
    "tf_saved_model": [("tensorflow", "tensorflow")],
    "onnx": [("tensorflow", "tensorflow"), ("tf2onnx", "tf2onnx"), ("onnx", "onnx")],
    "onnx_int8": [("onnxruntime", "onnxruntime")],
    "litert": [("tensorflow", "tensorflow")],
}
TOP_K = 5
INPUT_NAME = "images"
OUTPUT_NAME = "predictions"


class ExportError(ValueError):
    """An export that cannot be made: an unknown format, or options the format or model cannot
    carry."""


# === Public API ===


def export_model(
    model, path, format="tf_saved_model", *, int8=False, image_size=None, with_preprocessing=False, verbose=False
):
    """Export a keras_vit model for serving as a SavedModel, an ONNX file or a LiteRT file.

    Args:
        model: a keras_vit model of any family (VisionTransformer, also int8-quantized; BiTResNet,
            AxialVisionTransformer, AxialResNet, EfficientNet) built on any backend.
        path: the artefact: a folder for "tf_saved_model", a file for "onnx" (`.onnx`) and
            "litert" (`.tflite`).
        format: "tf_saved_model" (alias "saved_model"), "onnx" or "litert" (alias "tflite").
        int8: int8 weights in the format's own int8 form (see the module docstring); the model
            itself is not changed.
        image_size: int or (height, width): export at this input size (position embeddings
            resized by the model's rule; convolutional networks take it as they are; refused
            where the weights fit one size only, AxialResNet). Default: the model's size.
        with_preprocessing: the artefact takes uint8 images of any size and resizes and
            normalises them itself, as the model's family does.
        verbose: print where the artefact was written.

    Returns:
        `path`.

    Raises:
        ExportError: for a format or options that cannot work (see the module docstring).

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...     num_layers=1, num_heads=2, mlp_dim=32, classes=10)  # doctest: +SKIP
        >>> export_model(model, "/tmp/tiny.onnx", format="onnx")  # doctest: +SKIP
        '/tmp/tiny.onnx'
    """
    job = dict(path=os.fspath(path), format=format, int8=int8, image_size=image_size,
               with_preprocessing=with_preprocessing)
    return export_models(model, [job], verbose=verbose)[0]


def export_models(model, jobs, *, verbose=False):
    """Write several artefacts of one model; on JAX or PyTorch with one TensorFlow rebuild.

    Args:
        model: as for `export_model`.
        jobs: a list of dicts of `export_model`'s arguments (`path`, `format`, `int8`,
            `image_size`, `with_preprocessing`).

    Returns:
        The list of paths written.
    """
    return export_many([(model, jobs)], verbose=verbose)[0]


def export_many(models_and_jobs, *, verbose=False):
    """Write the artefacts of several models; on JAX or PyTorch with one TensorFlow process for all.

    Args:
        models_and_jobs: a list of (model, jobs) pairs, each as for `export_models`.

    Returns:
        A list of each model's list of paths written.

    Every model's options are checked before any artefact is written.
    """
    import keras

    checked = [(model, [_checked_job(model, job) for job in jobs]) for model, jobs in models_and_jobs]
    if keras.backend.backend() == "tensorflow":
        for model, jobs in checked:
            for job in jobs:
                _export_on_tensorflow(model, **job)
    else:
        _export_in_subprocess(checked)
    if verbose:
        for _, jobs in checked:
            for job in jobs:
                print(f"Saved {job['format']} artefact at '{job['path']}'.")
    return [[job["path"] for job in jobs] for _, jobs in checked]


# === Checks (any backend, before any work) ===


def _normalise_format(format):
    key = str(format).lower()
    if key not in FORMATS:
        raise ExportError(
            f"Unknown export format {format!r}. Use 'tf_saved_model' (or 'saved_model') for TF Serving, "
            "'onnx' for onnxruntime or 'litert' for LiteRT / TFLite."
        )
    return FORMATS[key]


def _size_pair(image_size):
    if image_size is None:
        return None
    try:
        return positive_pair(image_size)
    except ValueError as err:
        raise ExportError(str(err)) from None


def _model_size(model):
    """(height, width) the model was built for. A dynamic_image_size model takes images of any size
    (its input shape has None) but keeps the size it was built at in its config; a dimension that
    is None in both is None."""
    size = getattr(getattr(model, "config", None), "image_size", None)  # a keras_vit model's config: a pair
    if size is None:
        size = model.input_shape[1:3]
    return tuple(None if s is None else int(s) for s in size)


def _family(model):
    from keras_vit.models.family import family_of

    try:
        return family_of(model)
    except ValueError as error:
        raise ExportError(f"Only keras_vit models export here: {error}") from None


def input_normalization(model):
    """(mean, std) per channel of [0, 1] pixels that the model's inputs are normalised with (its
    family's `input_normalization`): `with_preprocessing` maps uint8 pixels to
    `(pixels / 255 - mean) / std`.

    Example:
        >>> input_normalization(keras_vit.models.EfficientNet(image_size=32, width_multiplier=0.25,
        ...     depth_multiplier=0.1))  # doctest: +SKIP
        ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    """
    from keras_vit.models.family import input_normalization_of

    _family(model)  # a model of no family is an ExportError
    return input_normalization_of(model)


def input_description(model, with_preprocessing=False):
    """What an artefact of `model` takes, in words ("float32 images in [-1, 1] at 32x32", ...)."""
    if with_preprocessing:
        return "uint8 images of any size"
    mean, std = input_normalization(model)
    if all(m == 0.5 for m in mean) and all(s == 0.5 for s in std):
        scaled = "in [-1, 1]"
    else:
        scaled = f"normalised with mean {tuple(mean)} and std {tuple(std)} of [0, 1] pixels"
    size = "x".join("any" if s is None else str(s) for s in model.input_shape[1:3])
    return f"float32 images {scaled} at {size}"


def _quantization_mode(model):
    modes = {
        layer.quantization_mode
        for layer in model._flatten_layers()
        if getattr(layer, "quantization_mode", None) is not None
    }
    return "/".join(sorted(modes)) or None


def check_options(path, format, *, int8=False, image_size=None):
    """The checks that need no model: a known format whose packages are installed, a path that
    suits it, a sane image size. Returns (path, format) normalised.

    Raises:
        ExportError naming the problem and the fix.
    """
    fmt = _normalise_format(format)
    path = os.fspath(path)
    _size_pair(image_size)
    if fmt == "onnx" and not path.endswith(".onnx"):
        raise ExportError(f"An ONNX artefact is a file ending in '.onnx'; got {path!r}.")
    if fmt == "litert" and not path.endswith(".tflite"):
        raise ExportError(f"A LiteRT artefact is a file ending in '.tflite'; got {path!r}.")
    if fmt == "tf_saved_model" and path.endswith((".onnx", ".tflite", ".keras")):
        raise ExportError(f"A SavedModel is a folder; {path!r} looks like a file. Pick a folder name or another format.")
    if fmt == "tf_saved_model" and os.path.isdir(path) and os.listdir(path) and not _is_saved_model(path):
        raise ExportError(f"{path!r} is a folder with other files in it; a SavedModel needs an empty or new folder.")
    if fmt != "tf_saved_model" and os.path.isdir(path):
        raise ExportError(f"{path!r} is a folder; the {fmt} artefact is a file.")
    _check_requirements(fmt)
    if fmt == "onnx" and int8:
        _check_requirements("onnx_int8")
    return path, fmt


def _is_saved_model(path):
    return os.path.isfile(os.path.join(path, "saved_model.pb"))


def _checked_job(model, job):
    job = dict(job)
    unknown = set(job) - {"path", "format", "int8", "image_size", "with_preprocessing"}
    if unknown:
        raise ExportError(f"Unknown export option(s) {sorted(unknown)}: use int8, image_size, with_preprocessing.")
    int8 = bool(job.get("int8", False))
    path, fmt = check_options(job["path"], job.get("format", "tf_saved_model"), int8=int8,
                              image_size=job.get("image_size"))
    size = _size_pair(job.get("image_size"))
    with_preprocessing = bool(job.get("with_preprocessing", False))
    family = _family(model)
    cls = type(model).__name__
    what_model = family.title if family.title == cls else f"{family.title} ({cls})"
    mode = _quantization_mode(model)
    if (int8 or mode is not None) and not family.int8:
        what = "int8=True is not available for" if int8 else f"A {mode}-quantized model cannot be exported for"
        raise ExportError(
            f"{what} this {what_model}: keras_vit's int8 (quantize('int8') remembered in "
            "the model's config, so a saved int8 model reloads int8, and which every format's int8 mirrors) exists "
            f"for the Vision Transformer only. Export the float {family.title} without int8."
        )
    if mode is not None and mode != "int8":
        raise ExportError(
            f"The model is {mode}-quantized; only float and int8 models can be exported. Export the float "
            "model (with int8=True for int8)."
        )
    if int8 and mode is not None and fmt != "tf_saved_model":
        raise ExportError(
            f"int8=True for {fmt} quantizes the float model with the runtime's own int8 "
            f"({'onnxruntime quantize_dynamic' if fmt == 'onnx' else 'the TFLite converter'}), but this model "
            "is already int8-quantized in Keras. Export the float model with int8=True, or this model "
            "without int8 (its int8 numerics, with float32-sized weights)."
        )
    if int8 and fmt == "tf_saved_model" and mode is None and not hasattr(model, "quantize"):
        raise ExportError(f"int8=True needs a model with a quantize() method; got {type(model).__name__}.")
    if size is not None and size == _model_size(model):
        size = None  # the model's own size: nothing to rebuild
    if size is not None:
        if family.dynamic_size is None and family.source_grid is None:
            built = "x".join(str(s) for s in _model_size(model))
            raise ExportError(
                f"image_size cannot change this {what_model}, built at {built}: the shapes of its "
                "weights depend on the image size (AxialResNet: the attention spans' relative embeddings) and nothing "
                "resizes them. Export at the model's own size (image_size=None)."
            )
        if mode is not None:
            raise ExportError(
                "image_size cannot change a quantized model (its float position embeddings are gone). Export "
                "the float model with image_size=... and int8=True instead."
            )
        if "image_size" not in model.get_config():
            raise ExportError(f"image_size is only for models built at a fixed size; {type(model).__name__} is not.")
        stride = getattr(model, "stride", None)
        # Only a patch grid needs a divisible size (convolutional networks pad to any size).
        if family.source_grid is not None and stride and (size[0] % stride or size[1] % stride):
            raise ExportError(
                f"image_size {size[0]}x{size[1]} is not divisible by the model's stride {stride} (patch size "
                "times the ResNet's stride). Pick a multiple of it."
            )
        try:
            family.validate({**model.get_config(), "image_size": list(size)})
        except (TypeError, ValueError) as error:
            raise ExportError(f"image_size {size[0]}x{size[1]} does not suit this {family.title}: {error}") from None
    mean, std = input_normalization(model)
    channels = model.input_shape[-1]
    if with_preprocessing and channels != len(mean):
        raise ExportError(
            f"with_preprocessing=True normalises {len(mean)}-channel (RGB) images, and this model takes {channels} "
            "channels. Export without preprocessing and normalise the inputs yourself."
        )
    if with_preprocessing and size is None and None in _model_size(model):
        raise ExportError(
            f"with_preprocessing=True resizes images to the model's size, and this model has none (input shape "
            f"{model.input_shape}). Pass image_size=(H, W) (--image-size H W), or export without preprocessing."
        )
    return dict(path=path, format=fmt, int8=int8, image_size=size, with_preprocessing=with_preprocessing)


def _check_requirements(fmt):
    import importlib.util

    missing = [pip for module, pip in REQUIREMENTS[fmt] if importlib.util.find_spec(module) is None]
    if missing:
        raise ExportError(
            f"Exporting to {fmt} needs {', '.join(missing)}: pip install {' '.join(missing)} "
            "(or pip install 'keras-vit-zoo[export]')."
        )


# === Rebuilding on TensorFlow ===


def _export_in_subprocess(models_and_jobs):
    """Save each model as a .keras file and let one TensorFlow-backend Python write the artefacts."""
    with tempfile.TemporaryDirectory(prefix="keras_vit_export_") as tmp:
        entries = []
        for number, (model, jobs) in enumerate(models_and_jobs):
            model_file = os.path.join(tmp, f"model_{number}.keras")
            model.save(model_file)
            entries.append({"model": model_file, "jobs": jobs})
        spec = os.path.join(tmp, "jobs.json")
        with open(spec, "w") as f:
            json.dump({"models": entries}, f)
        env = dict(os.environ, KERAS_BACKEND="tensorflow")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        # The child must import this same keras_vit (a source checkout first on sys.path).
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join([here] + [p for p in [env.get("PYTHONPATH")] if p])
        result = subprocess.run(
            [sys.executable, "-m", "keras_vit.export", spec], env=env, capture_output=True, text=True
        )
    if result.returncode != 0:
        lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
        message = lines[-1] if lines else f"exit status {result.returncode}"
        prefix = "ExportError: "
        if message.startswith(prefix):
            raise ExportError(message[len(prefix):])
        raise RuntimeError(
            "The TensorFlow export process failed: " + message + "\n--- its stderr ---\n" + result.stderr[-4000:]
        )


def _subprocess_main(spec_file):
    import keras

    from keras_vit.models.family import import_model_classes

    import_model_classes()  # registers every model class and layer for load_model

    with open(spec_file) as f:
        spec = json.load(f)
    for entry in spec["models"]:
        model = keras.saving.load_model(entry["model"], compile=False)
        for job in entry["jobs"]:
            _export_on_tensorflow(model, **job)


# === Exporting on TensorFlow ===


def _prepared_model(model, int8, image_size):
    """`model` at `image_size`, int8-quantized when asked; a new model whenever it must change."""
    from keras_vit.models.weight_tree import get_weight_tree, set_weight_tree

    changed = model
    if image_size is not None and image_size != model.config.image_size:
        config = dict(model.get_config(), image_size=list(image_size))
        changed = type(model).from_config(config)
        grid = getattr(model, "grid_size", None)
        set_weight_tree(changed, get_weight_tree(model), source_grid=grid)
    if int8 and _quantization_mode(changed) is None:
        if changed is model:
            changed = type(model).from_config(model.get_config())
            changed.set_weights(model.get_weights())
        changed.quantize("int8")
    return changed


def _input_spec(model, with_preprocessing):
    import tensorflow as tf

    height, width, channels = model.input_shape[1:]
    if with_preprocessing:
        return tf.TensorSpec((None, None, None, channels), tf.uint8, name=INPUT_NAME)
    return tf.TensorSpec((None, height, width, channels), tf.float32, name=INPUT_NAME)


def _forward(model, with_preprocessing):
    """The artefact's forward pass: images -> what Keras' predict returns."""
    import numpy as np
    import tensorflow as tf

    height, width = _model_size(model)
    mean, std = input_normalization(model)
    # (pixels / 255 - mean) / std as one multiply and subtract (for [-1, 1]: pixels / 127.5 - 1).
    # NumPy constants: tf2onnx would take an eager tensor captured by the function for an input.
    scale = np.asarray([1.0 / (255.0 * s) for s in std], np.float32)
    offset = np.asarray([m / s for m, s in zip(mean, std)], np.float32)

    def forward(images):
        x = images
        if with_preprocessing:
            # keras_vit.data's evaluation preprocessing: bilinear resize, then the family's normalisation.
            x = tf.image.resize(tf.cast(x, tf.float32), (height, width), method="bilinear")
            x = x * scale - offset
        return model(x, training=False)

    return forward


def _serving_outputs(model, outputs):
    """The `serving_default` outputs: probabilities and the top-5 classes, or the features."""
    import tensorflow as tf

    if not getattr(model, "include_top", True) or len(outputs.shape) != 2:
        return {"features": outputs}
    # VisionTransformer keeps the serialised activation name: "softmax", or "linear" for logits.
    if getattr(model, "classifier_activation", "softmax") == "linear":
        probabilities = tf.nn.softmax(outputs, axis=-1)
    else:
        probabilities = outputs  # softmax (or e.g. sigmoid scores, ranked as they are)
    k = min(TOP_K, int(outputs.shape[-1]))
    top = tf.math.top_k(probabilities, k=k)
    return {
        "probabilities": probabilities,
        f"top{TOP_K}_classes": tf.cast(top.indices, tf.int32),
        f"top{TOP_K}_probabilities": top.values,
    }


def _write_saved_model(model, path, with_preprocessing, for_litert=False):
    import keras

    spec = _input_spec(model, with_preprocessing)
    forward = _forward(model, with_preprocessing)
    archive = keras.export.ExportArchive()
    archive.track(model)
    if for_litert:
        # One signature whose output is named (the converter would call it "output_0").
        archive.add_endpoint("serve", lambda images: {OUTPUT_NAME: forward(images)}, input_signature=[spec])
    else:
        archive.add_endpoint(
            "serving_default", lambda images: _serving_outputs(model, forward(images)), input_signature=[spec]
        )
        archive.add_endpoint("serve", forward, input_signature=[spec])
    archive.write_out(path, verbose=False)


def _write_onnx(model, path, with_preprocessing, int8=False):
    import tensorflow as tf

    spec = _input_spec(model, with_preprocessing)
    forward = tf.function(_forward(model, with_preprocessing), input_signature=[spec])
    with tempfile.TemporaryDirectory(prefix="keras_vit_onnx_") as tmp:
        float_path = os.path.join(tmp, "float.onnx") if int8 else path
        _convert_with_tf2onnx(forward, spec, float_path)
        _name_onnx_output(float_path)
        if int8:
            from onnxruntime.quantization import QuantType, quantize_dynamic

            # The weight matmuls only (as keras_vit's int8): attention's activation products stay float.
            quantize_dynamic(
                float_path, path, weight_type=QuantType.QInt8, per_channel=True,
                op_types_to_quantize=["MatMul", "Gemm"], extra_options={"MatMulConstBOnly": True},
            )


#: tf2onnx's switch for its graph optimizer's error handling (read when a conversion runs).
_TF2ONNX_CATCH_ERRORS = "TF2ONNX_CATCH_ERRORS"


def _convert_with_tf2onnx(forward, spec, path):
    """tf2onnx's conversion of `forward` (NumPy 2 patched: _patch_tf2onnx_for_numpy2), its graph
    optimizer working on the graph itself.

    By default tf2onnx's optimizer deep-copies the whole ONNX graph before each of its passes (about
    20 passes, repeated until none changes the graph), so that a pass that fails can be dropped;
    for keras_vit's models the copies were a third of the conversion's time (a tiny model of each
    family: 13.0 -> 8.4 s for ten artefacts) and no pass failed. So the conversion first runs
    without the copies (tf2onnx 1.17 turns them off whenever TF2ONNX_CATCH_ERRORS is set, whatever
    its value; "FALSE" also says so to a tf2onnx that reads the value), and again with them, as
    tf2onnx runs by default, if it fails. A TF2ONNX_CATCH_ERRORS the user set is left as it is."""
    import tf2onnx

    _patch_tf2onnx_for_numpy2()
    convert = functools.partial(tf2onnx.convert.from_function, forward, input_signature=[spec], output_path=path)
    if _TF2ONNX_CATCH_ERRORS in os.environ:
        convert()
        return
    os.environ[_TF2ONNX_CATCH_ERRORS] = "FALSE"
    try:
        convert()
        return
    except Exception:  # a pass that fails on this graph: tf2onnx's default drops it and goes on
        pass
    finally:
        del os.environ[_TF2ONNX_CATCH_ERRORS]
    convert()


def _patch_tf2onnx_for_numpy2():
    """tf2onnx uses NumPy aliases that NumPy 2 removed (`np.object`, `np.bool`:
    onnx/tensorflow-onnx#2317). Keras' own ONNX export patches tf2onnx for that; so do we, with
    Keras' patch, here and nowhere else."""
    try:
        from keras.src.export.tf2onnx_lib import patch_tf2onnx
    except ImportError:  # a Keras without the patch: tf2onnx as it is
        return
    patch_tf2onnx()


def _name_onnx_output(path):
    """Name the ONNX graph's one output OUTPUT_NAME (tf2onnx names it after a TF tensor)."""
    import onnx

    graph_model = onnx.load(path)
    graph = graph_model.graph
    old = graph.output[0].name
    if old == OUTPUT_NAME:
        return
    for node in graph.node:
        node.output[:] = [OUTPUT_NAME if o == old else o for o in node.output]
        node.input[:] = [OUTPUT_NAME if i == old else i for i in node.input]
    graph.output[0].name = OUTPUT_NAME
    onnx.save(graph_model, path)


def _write_litert(model, path, with_preprocessing, int8=False):
    import tensorflow as tf

    with tempfile.TemporaryDirectory(prefix="keras_vit_litert_") as tmp:
        _write_saved_model(model, tmp, with_preprocessing, for_litert=True)
        converter = tf.lite.TFLiteConverter.from_saved_model(tmp, signature_keys=["serve"])
        # Builtin ops only: ai-edge-litert's Interpreter has no Flex (TensorFlow-op) delegate.
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if int8:  # dynamic-range quantization: int8 weights, hybrid int8 kernels
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        try:
            flatbuffer = converter.convert()
        except Exception as error:  # the converter raises ConverterError and friends
            raise ExportError(f"The LiteRT converter could not convert this model: {error}") from error
    with open(path, "wb") as f:
        f.write(flatbuffer)


def _export_on_tensorflow(model, path, format, int8=False, image_size=None, with_preprocessing=False):
    prepared = _prepared_model(model, int8 and format == "tf_saved_model", image_size)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    if format == "tf_saved_model":
        if _is_saved_model(path):  # an earlier export (check_options refuses other folders)
            shutil.rmtree(path)
        _write_saved_model(prepared, path, with_preprocessing)
    elif format == "onnx":
        _write_onnx(prepared, path, with_preprocessing, int8=int8)
    else:
        _write_litert(prepared, path, with_preprocessing, int8=int8)
    return path


def _subprocess_entry(spec_file):
    try:
        _subprocess_main(spec_file)
    except ExportError as error:
        print(f"ExportError: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # Run through the imported module, so ExportError is keras_vit.export.ExportError.
    from keras_vit.export import _subprocess_entry as _entry

    sys.exit(_entry(sys.argv[1]))
