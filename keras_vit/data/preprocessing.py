"""Image preprocessing of the paper, as tf.data-friendly TensorFlow functions.

Train: an Inception-style random crop (area 5%-100% of the image, aspect ratio 3/4-4/3) resized
to the model's size, then a random horizontal flip. Eval: a plain resize. Both end with pixel
values scaled from [0, 255] to [-1, 1], the range the original models were trained on.

Every random choice is *stateless*: it is a pure function of a (2,) int seed, so a pipeline
built with the same seed yields the same batches on every run and every Keras backend.

    >>> import numpy as np, tensorflow as tf
    >>> image = tf.constant(np.full((40, 60, 3), 255, np.uint8))
    >>> out = train_preprocess(image, (32, 32), seed=(0, 7))
    >>> tuple(out.shape), float(tf.reduce_max(out))
    ((32, 32, 3), 1.0)
"""

import numpy as np
import tensorflow as tf

from keras_vit.data.augmentation import INCEPTION_AREA_RANGE, INCEPTION_ASPECT_RANGE  # noqa: F401
from keras_vit.geometry import as_pair


def scale_to_unit_range(image):
    """Map pixel values in [0, 255] (any dtype) to float32 in [-1, 1]: x / 127.5 - 1."""
    return tf.cast(image, tf.float32) / 127.5 - 1.0


def is_unit_range(normalization):
    """Whether (mean, std) per channel of [0, 1] pixels (or None) maps pixels to [-1, 1]: 0.5 / 0.5."""
    return normalization is None or all(float(v) == 0.5 for part in normalization for v in part)


def from_unit_range(images, normalization):
    """Images in [-1, 1] (what this module's preprocessing gives) as a model whose weights expect
    `normalization` takes them: ((images + 1) / 2 - mean) / std, i.e. (pixels / 255 - mean) / std,
    with (mean, std) per channel of [0, 1] pixels (`keras_vit.models.family.input_normalization_of`).
    None, or [-1, 1]'s own 0.5 / 0.5, returns `images` unchanged. NumPy arrays or tensors.

    Example:
        >>> from_unit_range(np.array([[-1.0, 0.0, 1.0]], np.float32), ((0.5, 0.5, 0.5), (0.25, 0.5, 0.5)))
        array([[-2.,  0.,  1.]], dtype=float32)
    """
    if is_unit_range(normalization):
        return images
    mean, std = (np.asarray(part, np.float32) for part in normalization)
    return ((images + np.float32(1.0)) * np.float32(0.5) - mean) / std


def inception_crop_box(image_shape, seed, area_range=INCEPTION_AREA_RANGE, aspect_range=INCEPTION_ASPECT_RANGE):
    """Sample the Inception crop window of an image of `image_shape` (H, W, C).

    Returns (offset_y, offset_x, height, width) int32 scalars. The window covers `area_range` of
    the image area with an aspect ratio (width / height) in `aspect_range`; after 100 failed
    draws (tiny images) it falls back to the whole image, as the original pipeline does.
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_size=image_shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, shape=(1, 1, 4)),
        seed=seed,
        min_object_covered=0.0,
        aspect_ratio_range=aspect_range,
        area_range=area_range,
        max_attempts=100,
        use_image_if_no_bounding_boxes=True,
    )
    return begin[0], begin[1], size[0], size[1]


def inception_crop(image, image_size, seed, area_range=INCEPTION_AREA_RANGE, aspect_range=INCEPTION_ASPECT_RANGE):
    """Random Inception crop of `image` (H, W, C) resized (bilinear) to `image_size`; float32, same range."""
    oy, ox, h, w = inception_crop_box(tf.shape(image), seed, area_range, aspect_range)
    crop = tf.slice(image, tf.stack([oy, ox, 0]), tf.stack([h, w, -1]))
    return tf.image.resize(tf.cast(crop, tf.float32), as_pair(image_size), method="bilinear")


def random_flip(image, seed):
    """Flip `image` left-right with probability 1/2 (stateless)."""
    return tf.image.stateless_random_flip_left_right(image, seed=seed)


def eval_preprocess(image, image_size):
    """Evaluation preprocessing: resize (bilinear) to `image_size`, scale to [-1, 1]."""
    image = tf.image.resize(tf.cast(image, tf.float32), as_pair(image_size), method="bilinear")
    return scale_to_unit_range(image)


def train_preprocess(
    image,
    image_size,
    seed,
    *,
    area_range=INCEPTION_AREA_RANGE,
    aspect_range=INCEPTION_ASPECT_RANGE,
    flip=True,
    crop=True,
):
    """Training preprocessing: Inception crop + random flip (each optional), scale to [-1, 1].

    `seed` is a (2,) int tensor; crop and flip draw from independent seeds split from it.
    """
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if crop:
        image = inception_crop(image, image_size, crop_seed, area_range, aspect_range)
    else:
        image = tf.image.resize(tf.cast(image, tf.float32), as_pair(image_size), method="bilinear")
    if flip:
        image = random_flip(image, flip_seed)
    return scale_to_unit_range(image)


def ensure_rgb(image):
    """Grey (H, W, 1) -> (H, W, 3); RGBA -> RGB; RGB unchanged."""
    channels = tf.shape(image)[-1]
    image = tf.cond(tf.equal(channels, 1), lambda: tf.tile(image, [1, 1, 3]), lambda: image)
    return image[..., :3]
