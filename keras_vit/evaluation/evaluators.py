"""Evaluate a classifier on a dataset by that dataset's protocol.

    result = evaluate_classifier(model, "tfds:imagenet2012_real")
    result.metrics   # {"top1": ..., "real_top1": ..., "top5": ..., "examples": ..., ...}

`data`:
  * "tfds:imagenet2012_real": top-1 / top-5 on the original labels and the ReaL top-1;
  * "tfds:imagenet_v2" (matched-frequency), "tfds:imagenet_v2/threshold-0.7",
    "tfds:imagenet_v2/topimages": ImageNet-V2's test images, ImageNet's 1000 classes;
  * "objectnet:PATH": the ObjectNet download at PATH, by ObjectNet's protocol
    (keras_vit.evaluation.objectnet);
  * anything `keras_vit.data.load_dataset` reads (tfds:cifar100, an image folder, digits, ...).

Images get the evaluation preprocessing of the paper (resize to the model's resolution, pixels
in [-1, 1]), then the normalisation the model's weights expect where it is another
(`keras_vit.models.family.input_normalization_of`: timm's DINOv2 and CLIP weights state theirs,
EfficientNet and AxialResNet take ImageNet's). When the model's optimizer keeps an
EMA of the weights (a .keras file saved with its optimizer, use_ema=True), the averages are
evaluated (`keras_vit.evaluation.load_for_evaluation`).
"""

import dataclasses
import os
import re
import zipfile

import numpy as np

from keras_vit.errors import DataError
from keras_vit.evaluation.metrics import ClassificationMetrics
from keras_vit.evaluation.objectnet import load_mapping, objectnet_dataset, objectnet_scores

#: The tfds datasets whose labels are ImageNet-1k's.
IMAGENET_1K_DATA = ("imagenet2012", "imagenet2012_real", "imagenet_v2")


@dataclasses.dataclass
class EvaluationResult:
    """metrics (dict of fractions and counts), per_class rows, confusion matrix, class names."""

    metrics: dict
    per_class: list
    confusion: np.ndarray
    class_names: list


def _progress(total, verbose):
    import keras

    return keras.utils.Progbar(total, unit_name="image") if verbose else None


def _normalization(model):
    """(mean, std) the model's weights expect of [0, 1] pixels; None ([-1, 1]) for a model of no
    keras_vit family."""
    from keras_vit.models.family import input_normalization_of

    try:
        return input_normalization_of(model)
    except ValueError:
        return None


def _predict(model, images, normalization=None):
    """The model's outputs for a batch of images in [-1, 1], given to it as its weights expect them
    (`normalization`: DINOv2's ImageNet statistics, CLIP's)."""
    import keras

    from keras_vit.data.preprocessing import from_unit_range

    images = from_unit_range(np.asarray(images, np.float32), normalization)
    return np.asarray(keras.ops.convert_to_numpy(model.predict_on_batch(images)), np.float64)


def _check_head(model, classes, data):
    head = model.output_shape[-1]
    if classes is not None and head != classes:
        raise ValueError(
            f"The model's head has {head} classes but {data!r} has {classes}: evaluate a model with a "
            f"{classes}-class head (for ImageNet data: an ImageNet-1k fine-tuned checkpoint such as "
            "ViTB16.augreg2_in21k_ft_in1k, not an ImageNet-21k one), or fine-tune it for these classes first "
            "(keras-vit finetune)."
        )


def _result(metrics, data, split):
    """metrics.result(), with an empty split an error that names it."""
    if not metrics.examples:
        raise DataError(f"{data!r} split {split!r} has no examples: there is no accuracy to report. Check the split "
                        "name and the data.")
    return metrics.result()


def _batches_of_files(ds, paths, batch_size, image_size):
    """The batches of `ds` (read from `paths` in order, `batch_size` a batch); an image that
    cannot be read is a DataError naming that file, not TensorFlow's error."""
    import tensorflow as tf

    from keras_vit.data.pipeline import numpy_batches
    from keras_vit.evaluation.objectnet import failing_image

    seen = 0
    try:
        for batch in numpy_batches(ds):  # keras_vit's own checks end in their DataError there
            yield batch
            seen += len(batch[0])
    except tf.errors.OpError as error:
        window = paths[seen: seen + 2 * batch_size]  # prefetching may fail on the batch after this one
        bad, problem = failing_image(window, image_size)
        if isinstance(problem, DataError):
            raise problem from None
        if bad is None:  # each image reads on its own: name the window
            bad, problem = f"among images {seen}-{seen + len(window) - 1}", error.message or str(error)
        reason = re.sub(r"\{\{[^}]*\}\}", "", problem).strip().splitlines()[0].strip()
        raise DataError(f"Cannot decode the image {bad} ({reason}): replace it with the download's file, or "
                        "remove it.") from None


def _is_real(data):
    return data.split(":", 1)[-1] in ("imagenet2012_real",)


def _real_dataset(image_size, batch_size, data_dir, split="validation"):
    """(tf.data of (images, original labels, ReaL labels as (B, 1000) 0/1), examples)."""
    import tensorflow as tf

    from keras_vit.data import preprocessing
    from keras_vit.data.tfds_sources import get_tfds_source, read_tfds_split, tfds_builder

    source = get_tfds_source("imagenet2012_real")
    builder = tfds_builder(source, data_dir)
    if split not in source.splits:
        raise ValueError(f"'imagenet2012_real' has splits {sorted(source.splits)}; got {split!r}.")
    ds = read_tfds_split(source, builder, source.splits[split])

    def prepare(example):
        image = preprocessing.eval_preprocess(preprocessing.ensure_rgb(example["image"]), image_size)
        real = tf.cast(example["real_label"], tf.int32)
        multi_hot = tf.reduce_max(tf.one_hot(real, 1000, dtype=tf.uint8), axis=0)
        multi_hot = tf.reshape(multi_hot, [1000])  # an image without ReaL labels: a row of zeros
        return image, tf.cast(example["original_label"], tf.int32), multi_hot

    ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(batch_size)
    examples = None
    try:
        examples = builder.info.splits[source.splits[split]].num_examples or None
    except Exception:  # not prepared metadata (mock data, ...)
        pass
    return ds.prefetch(tf.data.AUTOTUNE), examples


def evaluate_classifier(model, data, split="test", *, batch_size=64, data_dir=None, on_bad_file="skip", verbose=1):
    """Evaluate `model` (a Keras classifier) on `data` / `split` by the data's protocol.

    Returns an EvaluationResult; its metrics hold `top1`, `top5`, `loss`, `examples`,
    `mean_per_class_accuracy` (fractions), plus `real_top1` / `real_examples` on ReaL, and
    `protocol` ("imagenet_real", "objectnet" or "standard").
    """
    from keras_vit.data.pipeline import numpy_batches

    data = os.fspath(data)
    image_size = tuple(model.image_size) if hasattr(model, "image_size") else tuple(model.input_shape[1:3])
    normalization = _normalization(model)
    if data.startswith("objectnet:"):
        names, _ = load_mapping()
        _check_head(model, 1000, data)
        ds, total, found, paths = objectnet_dataset(data[len("objectnet:"):], image_size, batch_size,
                                                    on_bad_file=on_bad_file, return_paths=True)
        metrics = ClassificationMetrics(len(names))
        bar = _progress(total, verbose)
        for images, labels in _batches_of_files(ds, paths, batch_size, image_size):
            metrics.update(objectnet_scores(_predict(model, images, normalization)), labels)
            if bar:
                bar.update(metrics.examples)
        result = _result(metrics, data, "all images")
        result.update(protocol="objectnet", classes_found=len(found))
        per_class = [r for r in metrics.per_class(list(names)) if r["examples"]]
        return EvaluationResult(result, per_class, metrics.confusion, list(names))
    if _is_real(data):
        _check_head(model, 1000, data)
        split = "validation" if split in ("test", "validation") else split
        ds, total = _real_dataset(image_size, batch_size, data_dir, split)
        metrics = ClassificationMetrics(1000, real=True)
        bar = _progress(total, verbose)
        for images, labels, real in numpy_batches(ds):
            metrics.update(_predict(model, images, normalization), labels, real=real)
            if bar:
                bar.update(metrics.examples)
        names = _imagenet_names()
        result = _result(metrics, data, split)
        result.update(protocol="imagenet_real", split=split)  # the images scored: ReaL labels the validation split
        return EvaluationResult(result, metrics.per_class(names), metrics.confusion, names)

    import keras_vit.data as kd

    ds, info = kd.load_dataset(data, split, image_size=image_size, batch_size=batch_size, data_dir=data_dir,
                               on_bad_file=on_bad_file)
    classes = info.num_classes
    if data.startswith("tfds:") and data[5:].split("/")[0] in IMAGENET_1K_DATA:
        classes = 1000
    _check_head(model, classes, data)
    k = model.output_shape[-1]
    metrics = ClassificationMetrics(k)
    bar = _progress(info.num_examples, verbose)
    for images, labels in numpy_batches(ds):
        metrics.update(_predict(model, images, normalization), np.argmax(labels, -1) if labels.ndim == 2 else labels)
        if bar:
            bar.update(metrics.examples)
    names = info.class_names if info.class_names and len(info.class_names) == k else None
    if names is None and k == 1000:
        names = _imagenet_names()
    names = names or [str(c) for c in range(k)]
    result = _result(metrics, data, split)
    result.update(protocol="standard", split=split)
    return EvaluationResult(result, metrics.per_class(names), metrics.confusion, names)


def _imagenet_names():
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "resources", "imagenet1k_classes.txt")
    with open(path) as f:
        return [line.rstrip("\n").split("\t", 1)[-1].split(",")[0] for line in f if line.strip()]


def _keras_file_uses_ema(path):
    """Whether a .keras archive was saved with an optimizer that keeps an EMA of the weights."""
    import json

    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return False
    optimizer = (config.get("compile_config") or {}).get("optimizer") or {}
    return bool(isinstance(optimizer, dict) and (optimizer.get("config") or {}).get("use_ema"))


def load_for_evaluation(path):
    """The model of a .keras file (or a run folder's model.keras) with its EMA weights in place
    when it was saved with an optimizer that keeps them; None when `path` is no such file (the
    caller then loads it the ordinary way)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "model.keras")
    if not (path.endswith(".keras") and os.path.isfile(path) and _keras_file_uses_ema(path)):
        return None
    import keras

    from keras_vit.models.family import import_model_classes
    from keras_vit.training import callbacks

    import_model_classes()  # registers every model class and layer for load_model
    model = keras.saving.load_model(path)
    pairs = callbacks._ema_pairs(model)
    if not pairs:
        return None
    for variable, average in pairs:
        variable.assign(keras.ops.copy(average.value))
    return model
