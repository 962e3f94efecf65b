"""keras_vit.data: pipelines, the paper's augmentation, image folders, tfds table and errors.

The pipelines are tf.data whatever the Keras backend: these run once (marker backend_independent);
test_training_fit.py feeds one to `fit` on every backend."""

import os
import warnings

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import keras_vit.data as kd
from keras_vit.data import preprocessing

pytestmark = pytest.mark.backend_independent


def _first_batches(ds, n=2):
    return [tuple(np.asarray(t) for t in b) for b in ds.take(n).as_numpy_iterator()]


# === Pipelines: shapes, dtypes, range ===


@pytest.mark.parametrize("data,classes", [("digits", 10), ("shapes", 4)])
def test_train_and_eval_batches(data, classes):
    for training in (True, False):
        ds, info = kd.load_dataset(data, "train" if training else "test", image_size=(24, 16), batch_size=8,
                                   training=training, seed=3)
        images, labels = _first_batches(ds, 1)[0]
        assert images.shape == (8, 24, 16, 3) and images.dtype == np.float32
        assert labels.shape == (8,) and labels.dtype == np.int32
        assert -1.0 <= images.min() < 0 < images.max() <= 1.0
        assert labels.min() >= 0 and labels.max() < classes
        assert info.num_classes == classes
    ds, _ = kd.load_dataset(data, "test", image_size=16, batch_size=4, one_hot=True)
    _, onehot = _first_batches(ds, 1)[0]
    assert onehot.shape == (4, classes) and onehot.dtype == np.float32
    np.testing.assert_array_equal(onehot.sum(1), 1.0)


def test_eval_split_is_complete_and_ordered():
    x, y, _ = kd.load_embedded("digits", "test")
    images, labels, info = kd.as_arrays("digits", "test", image_size=8)
    assert info.num_examples == len(x) == len(images) == 360
    np.testing.assert_array_equal(labels, y)
    # Same size: the resize is the identity and the scaling is x / 127.5 - 1.
    np.testing.assert_allclose(images, x.astype(np.float32) / 127.5 - 1.0, atol=1e-6)


def test_pipeline_gives_the_input_the_weights_expect():
    x, y, _ = kd.load_embedded("digits", "test")
    clip = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
    images, labels, _ = kd.as_arrays("digits", "test", image_size=8, normalization=clip)
    np.testing.assert_array_equal(labels, y)
    # Same size: the resize is the identity; the pixels become (x / 255 - mean) / std.
    expected = (x.astype(np.float64) / 255.0 - np.array(clip[0])) / np.array(clip[1])
    np.testing.assert_allclose(images, expected, atol=2e-6)
    # Training batches get it too; [-1, 1]'s own statistics change nothing.
    ds, _ = kd.load_dataset("digits", "train", image_size=8, batch_size=4, training=True, seed=1, normalization=clip)
    plain, _ = kd.load_dataset("digits", "train", image_size=8, batch_size=4, training=True, seed=1)
    half, _ = kd.load_dataset("digits", "train", image_size=8, batch_size=4, training=True, seed=1,
                              normalization=((0.5,) * 3, (0.5,) * 3))
    (a, _), (b, _), (c, _) = (_first_batches(d, 1)[0] for d in (ds, plain, half))
    np.testing.assert_allclose(a, ((b + 1) / 2 - np.array(clip[0])) / np.array(clip[1]), atol=2e-6)
    np.testing.assert_array_equal(c, b)


def test_embedded_splits_are_disjoint_slices():
    x_all, _, _ = kd.load_embedded("digits", "train")
    a, _, _ = kd.load_embedded("digits", "train[:1000]")
    b, _, _ = kd.load_embedded("digits", "train[1000:]")
    assert len(a) == 1000 and len(b) == len(x_all) - 1000 == 437
    np.testing.assert_array_equal(np.concatenate([a, b]), x_all)


def test_determinism_with_seeds():
    def batches(seed):
        ds, _ = kd.load_dataset("shapes", "train", image_size=16, batch_size=16, training=True, seed=seed)
        return _first_batches(ds, 3)

    first, again, other = batches(5), batches(5), batches(6)
    for (xa, ya), (xb, yb) in zip(first, again):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    assert not np.array_equal(first[0][0], other[0][0])


def test_augmentation_differs_between_epochs():
    # Two passes over a 16-image split: same images, new crops (the seed folds in the element index).
    ds, _ = kd.load_dataset("digits", "train[:16]", image_size=16, batch_size=16, training=True, seed=0,
                            shuffle_buffer=1)
    (x1, y1), (x2, y2) = _first_batches(ds, 2)
    np.testing.assert_array_equal(y1, y2)
    assert not np.array_equal(x1, x2)


# === The paper's augmentation ===


def test_inception_crop_area_and_aspect_bounds():
    shape = tf.constant([300, 400, 3])
    areas, aspects = [], []
    for i in range(300):
        _, _, h, w = (int(v) for v in preprocessing.inception_crop_box(shape, tf.constant([7, i])))
        areas.append(h * w / (300 * 400))
        aspects.append(w / h)
    areas, aspects = np.array(areas), np.array(aspects)
    assert areas.min() >= 0.05 - 0.005 and areas.max() <= 1.0
    assert aspects.min() >= 0.75 - 0.02 and aspects.max() <= 4 / 3 + 0.02
    # The whole range is used, not a corner of it.
    assert areas.min() < 0.15 and areas.max() > 0.8
    assert aspects.min() < 0.8 and aspects.max() > 1.25


def test_inception_crop_takes_a_window_of_the_image():
    # Pixel (y, x) holds (y, x, 0): a crop resized to its own size must be a contiguous window.
    yy, xx = np.mgrid[0:60, 0:80]
    image = np.stack([yy, xx, np.zeros_like(yy)], -1).astype(np.float32)
    seed = tf.constant([1, 2])
    oy, ox, h, w = (int(v) for v in preprocessing.inception_crop_box(tf.constant([60, 80, 3]), seed))
    crop = preprocessing.inception_crop(image, (h, w), seed).numpy()
    np.testing.assert_allclose(crop, image[oy:oy + h, ox:ox + w], atol=1e-4)


def test_random_flip_is_a_mirror_half_the_time():
    image = np.random.default_rng(0).integers(0, 255, (5, 7, 3)).astype(np.float32)
    flipped = 0
    for i in range(200):
        out = preprocessing.random_flip(image, tf.constant([0, i])).numpy()
        if np.array_equal(out, image[:, ::-1]):
            flipped += 1
        else:
            np.testing.assert_array_equal(out, image)
    assert 70 < flipped < 130


def test_train_preprocess_without_augmentation_equals_eval():
    image = np.random.default_rng(1).integers(0, 256, (20, 30, 3)).astype(np.uint8)
    a = preprocessing.train_preprocess(image, 16, [0, 0], crop=False, flip=False).numpy()
    b = preprocessing.eval_preprocess(image, 16).numpy()
    np.testing.assert_array_equal(a, b)
    assert b.min() >= -1 and b.max() <= 1


# === Image folders ===


def _write_folder(root, with_bad=True):
    rng = np.random.default_rng(0)
    counts = {}
    for c, name in enumerate(["cat", "dog", "eel"]):
        os.makedirs(root / "train" / name)
        os.makedirs(root / "test" / name)
        for i in range(3 + c):
            arr = rng.integers(0, 256, (20 + i, 24, 3)).astype(np.uint8)
            ext = ["png", "jpg", "bmp"][i % 3]
            Image.fromarray(arr).save(root / "train" / name / f"{i}.{ext}")
        Image.fromarray(rng.integers(0, 256, (10, 10), dtype=np.uint8), mode="L").save(root / "test" / name / "g.png")
        counts[name] = 3 + c
    Image.fromarray(rng.integers(0, 256, (9, 9, 4), dtype=np.uint8), mode="RGBA").save(root / "train" / "eel" / "a.png")
    if with_bad:
        (root / "train" / "cat" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
        good = (root / "train" / "dog" / "0.png").read_bytes()
        (root / "train" / "dog" / "truncated.png").write_bytes(good[: len(good) // 2])
        (root / "train" / "dog" / "notes.txt").write_text("not an image")
        (root / "train" / ".DS_Store").write_bytes(b"\0")
    return 3 + 4 + 5 + 1


def test_image_folder_skips_corrupt_and_non_image_files_with_a_counted_warning(tmp_path):
    good = _write_folder(tmp_path)
    with pytest.warns(UserWarning, match=r"3 of 16 files .* 1 non-image file\(s\) .*notes.txt.* 2 corrupt"):
        ds, info = kd.load_dataset(tmp_path, "train", image_size=16, batch_size=4)
    assert info.num_examples == good and info.skipped_files == 3
    assert info.class_names == ["cat", "dog", "eel"] and info.num_classes == 3
    labels = np.concatenate([y for _, y in ds.as_numpy_iterator()])
    np.testing.assert_array_equal(np.bincount(labels), [3, 4, 6])
    # Test split: grey images become RGB; same class list.
    images, labels, info = kd.as_arrays(tmp_path, "test", image_size=8)
    assert images.shape == (3, 8, 8, 3) and list(labels) == [0, 1, 2]
    # Indexed again (unchanged folder: reused), the warning and counts are the same.
    with pytest.warns(UserWarning, match=r"3 of 16 files"):
        _, again = kd.load_dataset(tmp_path, "train", image_size=16, batch_size=4)
    assert again.num_examples == good


def test_image_folder_strict_mode_fails_clearly(tmp_path):
    _write_folder(tmp_path)
    with pytest.raises(ValueError, match="corrupt image.*on_bad_file='skip'"):
        kd.load_dataset(tmp_path, "train", image_size=16, on_bad_file="error")


def test_image_folder_without_split_folders(tmp_path):
    for name in ("a", "b"):
        os.makedirs(tmp_path / name)
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / name / "x.png")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, info = kd.load_dataset(tmp_path, "train", image_size=8)
    assert info.num_examples == 2
    with pytest.raises(ValueError, match="no split folders"):
        kd.load_dataset(tmp_path, "test", image_size=8)


# === Errors: class count, patch size, tfds ===


def test_class_count_contradicting_the_data(tmp_path):
    with pytest.raises(ValueError, match=r"classes=5 contradicts the data.*has 10 classes"):
        kd.load_dataset("digits", "train", image_size=16, classes=5)
    _write_folder(tmp_path, with_bad=False)
    with pytest.raises(ValueError, match=r"classes=4 contradicts.*has 3 classes"):
        kd.load_dataset(tmp_path, "train", image_size=16, classes=4)


def test_image_size_the_patch_does_not_divide():
    import keras_vit

    with pytest.raises(ValueError, match=r"30 is not divisible by the patch size 4.*28 or 32"):
        keras_vit.VisionTransformer(image_size=30, patch_size=4, hidden_size=8, num_layers=1, num_heads=1,
                                    mlp_dim=8, classes=3)


def test_tfds_table():
    assert len(kd.VTAB_TASKS) == 19
    for name in ("cifar10", "cifar100", "oxford_iiit_pet", "oxford_flowers102", "imagenet2012"):
        source = kd.TFDS_DATASETS[name]
        assert {"train", "test"} <= set(source.splits) and source.classes
    for name in kd.VTAB_TASKS:
        splits = kd.TFDS_DATASETS[name].splits
        assert splits["train800"][1] == 800 and splits["val200"][1] == 200
    assert kd.TFDS_DATASETS["vtab/cifar100"].splits["train800"] == ("train[:90%]", 800)
    with pytest.raises(ValueError, match="Did you mean vtab/dtd"):
        kd.get_tfds_source("vtab/dtdd")


def test_tfds_dataset_not_prepared_is_a_clear_error(tmp_path):
    with pytest.raises(kd.DatasetNotPreparedError, match=r"'cifar10' is not prepared.*dataset not prepared; run `tfds"):
        kd.load_dataset("tfds:cifar10", "train", image_size=32, data_dir=str(tmp_path))


def test_tfds_pipeline_on_tfds_mock_data(tmp_path):
    # tfds.testing.mock_data replaces the stored records with random examples that follow the
    # dataset's real feature spec (image shape/dtype, label classes): the decode, label key,
    # VTAB split composition and preprocessing below are ours and run for real.
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=6):
        ds, info = kd.load_dataset("tfds:cifar10", "train", image_size=16, batch_size=4, training=True,
                                   data_dir=str(tmp_path), classes=10)
        images, labels = _first_batches(ds, 1)[0]
        assert images.shape == (4, 16, 16, 3) and -1 <= images.min() and images.max() <= 1
        assert info.num_classes == 10 and len(info.class_names) == 10
        assert labels.max() < 10
        # VTAB-1k train800val200 of a variable-size dataset: 6 (of 800) + 6 (of 200) mock examples.
        ds, info = kd.load_dataset("tfds:vtab/dtd", "train800val200", image_size=16, batch_size=5,
                                   data_dir=str(tmp_path))
        counts = [len(y) for _, y in ds.as_numpy_iterator()]
        assert sum(counts) == 12 and info.num_classes == 47
