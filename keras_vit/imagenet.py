"""ImageNet helpers that work offline: `preprocess_input` and `decode_predictions`.

The class names ship with the package (keras_vit/resources): the ImageNet-1k classes in their
standard order (sorted WordNet ids) and the 21,843 classes of Google's ImageNet-21k release in the
label order of the original in21k checkpoints (also sorted WordNet ids). Each line is
`wnid<TAB>lemmas` with the WordNet lemmas of the synset.
"""

import functools
import gzip
import importlib.resources

import numpy as np

#: Class-name files per head size.
_CLASS_FILES = {1000: "imagenet1k_classes.txt", 21843: "imagenet21k_classes.txt.gz"}


@functools.lru_cache(maxsize=None)
def imagenet_classes(num_classes=1000):
    """[(wnid, lemmas), ...] of the 1000-way or 21843-way ImageNet head, in label order.

    Example:
        >>> imagenet_classes(1000)[0]
        ('n01440764', 'tench, Tinca tinca')
    """
    if num_classes not in _CLASS_FILES:
        raise ValueError(
            f"No ImageNet class names for a {num_classes}-way head; keras_vit ships names for "
            f"{' and '.join(str(k) for k in _CLASS_FILES)} classes (ImageNet-1k and Google's ImageNet-21k)."
        )
    data = importlib.resources.files("keras_vit").joinpath("resources", _CLASS_FILES[num_classes]).read_bytes()
    if _CLASS_FILES[num_classes].endswith(".gz"):
        data = gzip.decompress(data)
    rows = [tuple(line.split("\t", 1)) for line in data.decode("utf-8").splitlines() if line]
    if len(rows) != num_classes:
        raise RuntimeError(f"Corrupt class-name file {_CLASS_FILES[num_classes]}: {len(rows)} rows, expected {num_classes}.")
    return tuple(rows)


def _short_name(lemmas):
    # keras.applications' style: the first lemma, words joined by underscores ("great_white_shark").
    return lemmas.split(",")[0].strip().replace(" ", "_")


def decode_predictions(preds, top=5):
    """Decode a batch of ImageNet predictions, as `keras.applications.*.decode_predictions` does.

    Works offline for 1000-way (ImageNet-1k) and 21843-way (ImageNet-21k) heads.

    Args:
        preds: array (batch, 1000) or (batch, 21843) of probabilities or logits.
        top: how many classes to return per image.

    Returns:
        One list per image of (wnid, class_name, score) tuples, best first.

    Example:
        >>> preds = np.zeros((1, 1000)); preds[0, 1] = 1.0
        >>> decode_predictions(preds, top=1)
        [[('n01443537', 'goldfish', 1.0)]]
    """
    preds = np.asarray(preds)
    if preds.ndim != 2:
        raise ValueError(
            f"decode_predictions expects a batch of predictions of shape (batch, classes); got shape {preds.shape}."
        )
    classes = imagenet_classes(int(preds.shape[1]))
    top = max(1, min(int(top), preds.shape[1]))
    results = []
    for row in preds:
        best = np.argsort(-row, kind="stable")[:top]
        results.append([(classes[i][0], _short_name(classes[i][1]), float(row[i])) for i in best])
    return results


def preprocess_input(images, data_format=None, *, model=None, normalization=None):
    """Scale uint8 / [0, 255] images to [-1, 1], the input range of the original ViT checkpoints;
    with `normalization` (or a `model` whose `config.input_normalization` is set), to
    `(images / 255 - mean) / std`. `keras_vit.preprocess_input` is the model-aware face of this
    function: with `model=` it also applies the normalisation of the model's family.

    Args:
        images: array or tensor of pixel values in [0, 255] (any shape, channels last).
        data_format: accepted for keras.applications compatibility; scaling is per pixel, so the
            layout does not matter.
        model: a model whose `config.input_normalization` is (mean, std) per channel of [0, 1]
            pixels: images become (images / 255 - mean) / std. None, or a model without one: [-1, 1].
        normalization: (mean, std) per channel of [0, 1] pixels; it takes precedence over `model`.

    Returns:
        float32 values (a NumPy array for NumPy input, else a backend tensor).

    Example:
        >>> preprocess_input(np.array([0, 127.5, 255]))
        array([-1.,  0.,  1.], dtype=float32)
    """
    del data_format
    if normalization is None:
        normalization = getattr(getattr(model, "config", None), "input_normalization", None)
    if normalization is not None:
        mean, std = (np.asarray(v, dtype="float32") for v in normalization)
        if isinstance(images, (np.ndarray, list, tuple, int, float)):
            return ((np.asarray(images, dtype="float32") / np.float32(255.0) - mean) / std).astype("float32")
        import keras

        return (keras.ops.cast(images, "float32") / 255.0 - mean) / std
    if isinstance(images, (np.ndarray, list, tuple, int, float)):
        return (np.asarray(images, dtype="float32") / np.float32(127.5) - np.float32(1.0)).astype("float32")
    import keras

    return keras.ops.cast(images, "float32") / 127.5 - 1.0
