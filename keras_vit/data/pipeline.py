"""One entry point from a data name to batches for `model.fit` / `evaluate` / `predict`.

    train_ds, info = keras_vit.data.load_dataset("digits", "train", image_size=32, batch_size=64,
                                                 training=True, seed=0)
    model.fit(train_ds, steps_per_epoch=100, epochs=5)

`data` is one of:
  * "tfds:NAME" — a tensorflow-datasets dataset of `keras_vit.data.TFDS_DATASETS` (cifar10,
    cifar100, oxford_iiit_pet, oxford_flowers102, imagenet2012, vtab/<task>, ...) or any other
    tfds name with "image"/"label" features; it must be prepared already (no downloads);
  * "digits" or "shapes" — embedded data (see keras_vit.data.embedded);
  * a path to an image folder (see keras_vit.data.folder).

The result is a tf.data.Dataset of (images float32 (B, H, W, 3) in [-1, 1], labels int32 (B,)
or one-hot float32 (B, classes)); Keras feeds tf.data to fit on the JAX, TensorFlow and PyTorch
backends alike. Training pipelines shuffle, repeat and augment (Inception crop + flip);
evaluation pipelines resize, keep the order and every example (last batch may be short).
Randomness is derived from `seed` only: the same seed gives the same batches.
"""

import dataclasses
import os

from keras_vit.data.augmentation import INCEPTION_AREA_RANGE, INCEPTION_ASPECT_RANGE
from keras_vit.data.embedded import EMBEDDED_DATASETS, load_embedded
from keras_vit.data.tfds_sources import TFDS_DATASETS
from keras_vit.errors import DataError, data_error


@dataclasses.dataclass
class DatasetInfo:
    """What a pipeline was built from: name, split, number of classes and examples, class names."""

    name: str
    split: str
    num_classes: int
    num_examples: int = None
    class_names: list = None
    skipped_files: int = 0


def _check_classes(classes, info):
    if classes is None:
        return
    if info.num_classes is not None and int(classes) != info.num_classes:
        raise ValueError(
            f"classes={classes} contradicts the data: {info.name!r} split {info.split!r} has {info.num_classes} "
            f"classes. Use classes={info.num_classes} (a model head of {info.num_classes} outputs), or other data."
        )


def _label_check(data, split, num_classes):
    """A tf.data map that stops the pipeline at a label outside [0, num_classes) with a DataError
    naming the label, the data and the class count (keras_vit.errors.data_error)."""
    import tensorflow as tf

    from keras_vit.errors import pipeline_check

    bound = tf.constant(num_classes, tf.int64)
    message = (f"label {{}} of {data!r} split {split!r} is outside [0, {num_classes}) ({num_classes} classes): the "
               "class count contradicts the data, or the labels are not class indices")

    def check(image, label):
        label = tf.cast(label, tf.int64)
        with tf.control_dependencies([pipeline_check((label >= 0) & (label < bound), message, label)]):
            return image, tf.identity(label)

    return check


def _source_tfds(name, split, data_dir):
    import tensorflow as tf

    from keras_vit.data import preprocessing

    from keras_vit.data.tfds_sources import get_tfds_source, read_tfds_split, tfds_builder

    source = get_tfds_source(name)
    builder = tfds_builder(source, data_dir)
    if split not in source.splits:
        # A raw tfds split string ("train[:10%]") is passed through for non-table datasets.
        if name in TFDS_DATASETS:
            raise ValueError(f"{name!r} has splits {sorted(source.splits)}; got {split!r}.")
        spec = split
    else:
        spec = source.splits[split]

    def read(spec):
        if isinstance(spec, tuple) and isinstance(spec[1], int):  # (tfds split, first n)
            return read(spec[0]).take(spec[1])
        if isinstance(spec, tuple):
            first, *rest = spec
            ds = read(first)
            for part in rest:
                ds = ds.concatenate(read(part))
            return ds
        return read_tfds_split(source, builder, spec)

    ds = read(spec)
    label_fn = source.label if callable(source.label) else (lambda ex, key=source.label: ex[key])
    scale = source.pixel_scale

    def to_pair(example):
        image = example[source.image]
        if scale != 1:
            image = image * tf.cast(scale, image.dtype)
        return preprocessing.ensure_rgb(image), tf.cast(label_fn(example), tf.int64)

    ds = ds.map(to_pair, num_parallel_calls=tf.data.AUTOTUNE)
    classes = source.classes
    names = None
    if isinstance(source.label, str):
        try:
            feature = builder.info.features[source.label]
            classes = classes or feature.num_classes
            names = list(feature.names)
        except (KeyError, AttributeError):
            pass
    cardinality = int(ds.cardinality())
    count = cardinality if cardinality >= 0 else None
    return ds, DatasetInfo(f"tfds:{name}", split, classes, count, names)


def _source_folder(path, split, on_bad_file):
    import tensorflow as tf

    from keras_vit.data.folder import index_image_folder

    index = index_image_folder(path, split, on_bad_file=on_bad_file, reuse=True)
    ds = tf.data.Dataset.from_tensor_slices((index.paths, tf.constant(index.labels, tf.int64)))

    def decode(path, label):
        image = tf.io.decode_image(tf.io.read_file(path), channels=3, expand_animations=False)
        return image, label

    ds = ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
    info = DatasetInfo(
        os.fspath(path), split, len(index.class_names), len(index.paths), index.class_names,
        skipped_files=len(index.non_images) + len(index.corrupt),
    )
    return ds, info


def _source_arrays(name, split):
    import tensorflow as tf

    images, labels, class_names = load_embedded(name, split)
    ds = tf.data.Dataset.from_tensor_slices((images, labels))
    return ds, DatasetInfo(name, split, len(class_names), len(images), class_names)


def load_source(data, split="train", *, data_dir=None, on_bad_file="skip"):
    """(tf.data.Dataset of (uint8 image (H, W, 3), int64 label), DatasetInfo) before preprocessing."""
    data = os.fspath(data)
    if data.startswith("tfds:"):
        return _source_tfds(data[len("tfds:"):], split, data_dir)
    if data in EMBEDDED_DATASETS or data.startswith("embedded:"):
        return _source_arrays(data.split(":")[-1], split)
    if os.path.isdir(data):
        return _source_folder(data, split, on_bad_file)
    raise ValueError(
        f"Cannot tell what data {data!r} is: use 'tfds:NAME' (a prepared tensorflow-datasets dataset), "
        f"{' or '.join(repr(n) for n in EMBEDDED_DATASETS)} (embedded), or an existing image folder path."
    )


def _check_shard(shard, batch_size, drop_remainder):
    """(num_processes, process_index) of `load_dataset(shard=...)`, (1, 0) for None."""
    if shard is None:
        return 1, 0
    try:
        count, index = (int(v) for v in shard)
    except (TypeError, ValueError):
        raise ValueError(
            f"shard={shard!r} is not (num_processes, process_index): pass keras_vit.distribution.process_shard(), "
            "e.g. (2, 0) for the first of two processes, or None."
        ) from None
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"shard={shard!r}: the process index must be 0 to num_processes - 1 = {count - 1}.")
    if batch_size % count:
        raise ValueError(
            f"batch_size={batch_size} (the global batch) does not split evenly over {count} processes: pass a "
            f"multiple of {count}."
        )
    if count > 1 and drop_remainder is False:
        raise ValueError(
            "drop_remainder=False with shard: every process must get the same number of rows per step, so a "
            "sharded pipeline keeps whole global batches only; leave drop_remainder unset."
        )
    return count, index


def shuffle_repeated(ds, buffer_size, seed):
    """`ds` repeated forever, then shuffled through a buffer of `buffer_size` with `seed` (as the
    original vision_transformer and big_vision input pipelines do): every iterator yields the same
    batches.

    tf.data's `shuffle(..., reshuffle_each_iteration=True).repeat()` draws each epoch's seed from a
    generator that all iterators of the dataset share. Keras' `fit` opens one iterator to build the
    model and drops it: its prefetching has by then read ahead a number of epochs that depends on
    timing, and the batches of the iterator that trains differ from run to run (with small data,
    where an epoch is a batch or two).
    """
    return ds.repeat().shuffle(buffer_size, seed=int(seed), reshuffle_each_iteration=False)


def load_dataset(
    data,
    split="train",
    *,
    image_size,
    batch_size=32,
    training=False,
    seed=0,
    repeat=None,
    classes=None,
    one_hot=False,
    crop=True,
    flip=True,
    area_range=INCEPTION_AREA_RANGE,
    aspect_range=INCEPTION_ASPECT_RANGE,
    shuffle_buffer=10_000,
    drop_remainder=None,
    cache=None,
    data_dir=None,
    on_bad_file="skip",
    shard=None,
    normalization=None,
):
    """Build the input pipeline of `data`/`split` for a model at `image_size`.

    Args:
        data: "tfds:NAME", "digits", "shapes" or an image folder path (see module docstring).
        split: "train", "test", "val", VTAB's "train800" / "val200" / "train800val200", or a
            slice of an embedded split such as "train[:1000]".
        image_size: int or (height, width) of the model input.
        batch_size: examples per batch.
        training: True -> shuffle, repeat (by default), Inception crop + flip, full batches only.
        seed: int; all shuffling and augmentation derive from it.
        repeat: repeat forever (default: `training`).
        classes: expected number of classes; a different count in the data raises ValueError.
        one_hot: labels as one-hot float32 (for label smoothing) instead of int32 indices.
        crop, flip, area_range, aspect_range: the training augmentation (defaults: the paper's).
        shuffle_buffer: shuffle buffer size (training).
        drop_remainder: drop the last short batch (default: `training`).
        cache: cache decoded images in memory (default: True for embedded data and folders
            under 20k images).
        data_dir: tensorflow-datasets data directory.
        on_bad_file: image folders: "skip" (counted warning) or "error".
        shard: (num_processes, process_index) in a job of several processes
            (`keras_vit.distribution.process_shard()`), or None. `batch_size` stays the GLOBAL
            batch size; the pipeline yields this process's rows of every global batch of the
            one-process pipeline, rows [index * b, (index + 1) * b) with b = batch_size //
            num_processes, in the same order (so the processes together train on exactly the
            batches one process would). A repeated training pipeline crops and flips only this
            process's examples (every process still reads and shuffles the whole source, which
            is what keeps the global batches those of one process); any other pipeline keeps
            whole global batches only (the last short one, if any, is left out), since a step
            needs the same number of rows in every process.

        normalization: (mean, std) per channel of [0, 1] pixels the model's weights expect
            (`keras_vit.models.family.input_normalization_of(model)`: CLIP's, ImageNet's); None:
            images in [-1, 1], the original ViT's input.

    Returns:
        (tf.data.Dataset, DatasetInfo).

    Example:
        >>> ds, info = load_dataset("shapes", "test", image_size=32, batch_size=8)
        >>> images, labels = next(iter(ds))
        >>> tuple(images.shape), info.num_classes
        ((8, 32, 32, 3), 4)
    """
    import tensorflow as tf

    from keras_vit.data import preprocessing

    data = os.fspath(data)
    shards, shard_index = _check_shard(shard, batch_size, drop_remainder)
    ds, info = load_source(data, split, data_dir=data_dir, on_bad_file=on_bad_file)
    _check_classes(classes, info)
    num_classes = info.num_classes if info.num_classes is not None else classes
    if one_hot and num_classes is None:
        raise ValueError(f"one_hot=True needs the number of classes of {data!r}; pass classes=.")
    if info.num_examples == 0:
        raise DataError(f"{data!r} split {split!r} has no examples: nothing to train or evaluate on. Check the split "
                        "name and the data (a folder of images per class, or a prepared tfds dataset).")
    if num_classes is not None:
        ds = ds.map(_label_check(data, split, num_classes))
    if cache is None:
        cache = info.num_examples is not None and info.num_examples <= 20_000 and not data.startswith("tfds:")
    if cache:
        ds = ds.cache()
    repeat = training if repeat is None else repeat
    drop_remainder = training if drop_remainder is None else drop_remainder
    base_seed = tf.constant(int(seed), tf.int64)
    if training:
        buffer = min(shuffle_buffer, info.num_examples or shuffle_buffer)
        if repeat:
            ds = shuffle_repeated(ds, buffer, seed)
        else:  # one pass per iterator: each draws one seed, in the order the iterators are made
            ds = ds.shuffle(buffer, seed=int(seed), reshuffle_each_iteration=True)
    elif repeat:
        ds = ds.repeat()
    local_batch = batch_size // shards
    # A repeated training stream has no last batch: each process keeps its rows of every global
    # batch before the augmentation (the expensive part). Other pipelines are sliced after
    # batching (below), which also drops a short last global batch.
    filter_first = shards > 1 and training and repeat
    if training:
        # The element index (across epochs) and the seed give each example its own stateless seed.
        def augment(index, pair):
            image, label = pair
            image = preprocessing.train_preprocess(
                image, image_size, tf.stack([base_seed, index]), area_range=area_range,
                aspect_range=aspect_range, flip=flip, crop=crop,
            )
            return image, label

        ds = ds.enumerate()
        if filter_first:
            ds = ds.filter(lambda index, pair: (index // local_batch) % shards == shard_index)
        ds = ds.map(augment, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
        ds = ds.map(
            lambda image, label: (preprocessing.eval_preprocess(image, image_size), label),
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
        )
    if not preprocessing.is_unit_range(normalization):  # the weights expect another input than [-1, 1]
        ds = ds.map(lambda image, label: (preprocessing.from_unit_range(image, normalization), label),
                    num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if one_hot:
        ds = ds.map(lambda image, label: (image, tf.one_hot(label, num_classes, dtype=tf.float32)))
    else:
        ds = ds.map(lambda image, label: (image, tf.cast(label, tf.int32)))
    if filter_first:
        ds = ds.batch(local_batch, drop_remainder=True)
    elif shards > 1:
        rows = slice(shard_index * local_batch, (shard_index + 1) * local_batch)
        ds = ds.batch(batch_size, drop_remainder=True).map(lambda image, label: (image[rows], label[rows]))
    else:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    options = tf.data.Options()
    options.deterministic = True
    ds = ds.with_options(options).prefetch(tf.data.AUTOTUNE)
    return ds, dataclasses.replace(info, num_classes=num_classes)


def numpy_batches(ds):
    """The batches of a tf.data pipeline as NumPy; a failed keras_vit check inside it (a label
    outside the classes, ...) is its one-line DataError, not TensorFlow's traceback."""
    import tensorflow as tf

    iterator = ds.as_numpy_iterator()
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except tf.errors.OpError as error:
            found = data_error(error)
            if found is None:
                raise
            raise found from None
        yield batch


def as_arrays(data, split="test", *, image_size, **kwargs):
    """The whole (eval-preprocessed) split as numpy arrays (images, labels): for small data."""
    import numpy as np

    ds, info = load_dataset(data, split, image_size=image_size, batch_size=256, training=False, **kwargs)
    images, labels = [], []
    for x, y in numpy_batches(ds):
        images.append(x)
        labels.append(y)
    return np.concatenate(images), np.concatenate(labels), info
