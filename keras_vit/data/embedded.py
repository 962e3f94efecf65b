"""Datasets that need no download: scikit-learn's handwritten digits, and generated shapes.

Both return uint8 RGB images (N, H, W, 3) and int64 labels; the tf.data pipeline resizes them
to the model's resolution like any other image.

* ``digits``: the 1,797 8x8 digits shipped inside scikit-learn (UCI optical digits), 10
  classes; pixel values 0-16 mapped to 0-255. A fixed permutation (seed 0) splits them into
  ``train`` (1,437) and ``test`` (360).
* ``shapes``: 32x32 images of a filled circle, square, triangle or cross on a random
  background, random position, size and colours, light noise; ``train`` 1,000 and ``test`` 300
  by default, drawn from different seeds.

Splits accept a slice, e.g. ``"train[:1000]"``, ``"train[1000:]"``.
"""

import re

import numpy as np

DIGITS_TEST_SIZE = 360
SHAPE_CLASSES = ("circle", "square", "triangle", "cross")
EMBEDDED_DATASETS = ("digits", "shapes")


def parse_split(split):
    """"train[100:200]" -> ("train", slice(100, 200)); "test" -> ("test", slice(None))."""
    match = re.fullmatch(r"\s*(\w+)\s*(?:\[\s*(-?\d*)\s*:\s*(-?\d*)\s*\])?\s*", split or "train")
    if not match:
        raise ValueError(f"Cannot read split {split!r}; expected e.g. 'train', 'test' or 'train[:1000]'.")
    name, start, stop = match.groups()
    return name, slice(int(start) if start else None, int(stop) if stop else None)


def load_digits():
    """(train_images, train_labels, test_images, test_labels) of scikit-learn's digits, uint8 RGB 8x8."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise ImportError(
            "The embedded 'digits' dataset comes with scikit-learn: pip install scikit-learn "
            "(or use data='shapes', which needs nothing)."
        ) from None
    digits = sklearn_digits()
    images = np.round(digits.images * (255.0 / 16.0)).astype("uint8")[..., None].repeat(3, axis=-1)
    labels = digits.target.astype("int64")
    order = np.random.default_rng(0).permutation(len(images))
    images, labels = images[order], labels[order]
    n = len(images) - DIGITS_TEST_SIZE
    return images[:n], labels[:n], images[n:], labels[n:]


def make_shapes(num_images, seed=0, size=32, return_masks=False):
    """`num_images` generated images (uint8, (N, size, size, 3)) of SHAPE_CLASSES and their labels.

    With `return_masks=True` also the segmentation of each image, uint8 (N, size, size): 0 for
    the background and 1 + the shape's class index on the shape's pixels (the same images and
    labels as without).
    """
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype("float32") + 0.5
    images = np.empty((num_images, size, size, 3), "uint8")
    masks = np.zeros((num_images, size, size), "uint8") if return_masks else None
    labels = rng.integers(0, len(SHAPE_CLASSES), num_images).astype("int64")
    for i, label in enumerate(labels):
        radius = rng.uniform(0.18, 0.32) * size
        cy, cx = rng.uniform(radius, size - radius, 2)
        dy, dx = (yy - cy) / radius, (xx - cx) / radius
        if label == 0:
            mask = dy**2 + dx**2 <= 1.0
        elif label == 1:
            mask = (np.abs(dy) <= 0.8) & (np.abs(dx) <= 0.8)
        elif label == 2:
            mask = (dy <= 0.8) & (dy >= -1.0 + 2 * np.abs(dx))
        else:
            mask = ((np.abs(dy) <= 0.3) & (np.abs(dx) <= 1.0)) | ((np.abs(dx) <= 0.3) & (np.abs(dy) <= 1.0))
        background = rng.uniform(0, 255, 3)
        foreground = (background + rng.uniform(90, 165, 3) * rng.choice([-1, 1], 3)) % 256
        image = np.where(mask[..., None], foreground, background) + rng.normal(0, 8, (size, size, 3))
        images[i] = np.clip(image, 0, 255).astype("uint8")
        if return_masks:
            masks[i][mask] = label + 1
    return (images, labels, masks) if return_masks else (images, labels)


def load_embedded(name, split="train", *, num_train=1000, num_test=300):
    """(images uint8 (N, H, W, 3), labels int64 (N,), class_names) of an embedded dataset split."""
    split_name, index = parse_split(split)
    if name == "digits":
        x_train, y_train, x_test, y_test = load_digits()
        class_names = [str(d) for d in range(10)]
    elif name == "shapes":
        class_names = list(SHAPE_CLASSES)
        if split_name == "train":
            x_train, y_train = make_shapes(num_train, seed=0)
        else:
            x_test, y_test = make_shapes(num_test, seed=1)
    else:
        raise ValueError(f"Unknown embedded dataset {name!r}; known: {', '.join(EMBEDDED_DATASETS)}.")
    if split_name == "train":
        x, y = x_train, y_train
    elif split_name == "test":
        x, y = x_test, y_test
    else:
        raise ValueError(f"Embedded dataset {name!r} has splits 'train' and 'test'; got {split!r}.")
    x, y = x[index], y[index]
    if not len(x):
        raise ValueError(f"Split {split!r} of {name!r} is empty.")
    return x, y, class_names
