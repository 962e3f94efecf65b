"""ObjectNet (Barbu et al. 2019) evaluated by its protocol, as the paper does (appendix D.9).

ObjectNet is a test set only. Its download (objectnet.dev, a manual download) holds one folder
per class, `images/<class folder>/*.png`. Of its 313 classes, 113 overlap ImageNet-1k; the
mapping published with ObjectNet assigns each of them one or more ImageNet classes (125 in all,
none shared). keras_vit/resources/objectnet_imagenet_mapping.json holds, per class, its name,
its folder and its ImageNet-1k indices. It was checked against the release's
`mappings/objectnet_to_imagenet_1k.json` (class -> ImageNet class names) and
`mappings/folder_to_objectnet_label.json` (folder -> class), as copied in the
mlfoundations/wise-ft repository (src/datasets/objectnet_metadata/), with the ImageNet names
looked up in keras_vit/resources/imagenet1k_classes.txt. Three folders are not their class's
name: full_sized_towel (Bath towel), hand_towel_or_rag (Dishrag or hand towel) and
drying_rack_for_dishes (Drying rack for plates). The protocol, as in ObjectNet's own evaluation
template (abarbu/objectnet-template-pytorch objectnet_pytorch_dataloader.py) and
modestyachts/imagenet-testbed (src/eval_settings/objectnet.py):

- only images of the 113 overlapping classes count;
- each image carries a red border; 2 pixels are cropped off each side before the model's
  preprocessing;
- an ImageNet model's scores become ObjectNet scores: each ObjectNet class scores the best of
  its ImageNet classes (ImageNet classes outside the mapping take no part). Top-1 is then the
  testbed's rule: the argmax of the 1000-way scores restricted to the 125 mapped ImageNet
  classes, right when it is one of the image's class's ImageNet classes;
- top-1 and top-5 accuracy over the 113 classes.
"""

import functools
import json
import os
import re
import warnings

import numpy as np

from keras_vit.data.folder import IMAGE_EXTENSIONS

MAPPING_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "resources",
                            "objectnet_imagenet_mapping.json")

#: Pixels cropped off each side of an ObjectNet image (its red border), as ObjectNet's evaluation
#: template and imagenet-testbed crop them.
BORDER = 2


def normalise_class_name(name):
    """A class or folder name without case, spaces or punctuation: 'Binder (closed)' and
    'binder_closed' are both 'binderclosed'."""
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


@functools.lru_cache(maxsize=None)
def load_mapping(path=None):
    """((ObjectNet class names, ...), (ImageNet index tuples, ...)) of the published mapping."""
    with open(path or MAPPING_FILE) as f:
        classes = json.load(f)["classes"]
    return tuple(c["name"] for c in classes), tuple(tuple(c["imagenet"]) for c in classes)


@functools.lru_cache(maxsize=None)
def load_folders(path=None):
    """(folder names, ...) of the published mapping's classes, in load_mapping's order: the
    folder under `images/` that holds each class in the ObjectNet download."""
    with open(path or MAPPING_FILE) as f:
        return tuple(c["folder"] for c in json.load(f)["classes"])


def objectnet_scores(imagenet_scores, mapping=None):
    """(N, 113) ObjectNet scores from (N, 1000) ImageNet scores: each ObjectNet class takes the
    maximum over its ImageNet classes.

    Example:
        >>> scores = np.zeros((1, 1000)); scores[0, 530] = 0.9   # digital clock
        >>> int(objectnet_scores(scores).argmax())                # Alarm clock
        0
    """
    imagenet_scores = np.asarray(imagenet_scores)
    if imagenet_scores.ndim != 2 or imagenet_scores.shape[1] != 1000:
        raise ValueError(
            f"ObjectNet's mapping reads ImageNet-1k predictions: scores of shape (batch, 1000), got "
            f"{imagenet_scores.shape}. Evaluate a model with a 1000-class ImageNet head."
        )
    _, members = mapping or load_mapping()
    return np.stack([imagenet_scores[:, list(m)].max(1) for m in members], axis=1)


#: The first bytes of the image formats TensorFlow decodes (ObjectNet ships PNGs).
_IMAGE_SIGNATURES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a", b"BM")


def _looks_like_an_image(path):
    """Whether the file starts as a PNG, JPEG, GIF or BMP does (one short read: an ObjectNet
    download holds 50 000 large images, too many to decode twice)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return False
    return any(head.startswith(signature) for signature in _IMAGE_SIGNATURES)


def index_objectnet_folder(path, mapping=None, *, check_files=True, on_bad_file="skip"):
    """(image paths, ObjectNet class indices, class names found) of an ObjectNet download.

    `path` is the download's root (holding `images/`) or its `images/` folder. Folders are
    matched to the mapping's classes by the published folder names (`full_sized_towel` is
    "Bath towel"), or by the class name, ignoring case and punctuation in both; folders of the
    200 non-overlapping classes are skipped. A folder where no class of the mapping is found
    is an error that says which names were expected.

    With `check_files`, each image's first bytes are read: a file that is no PNG, JPEG, GIF or
    BMP (whatever its name ends with) is left out with one warning that counts them
    (`on_bad_file="skip"`) or is an error that lists them (`"error"`). A damaged image with a
    valid start is found when it is decoded.
    """
    if on_bad_file not in ("skip", "error"):
        raise ValueError(f"on_bad_file must be 'skip' or 'error'; got {on_bad_file!r}.")
    names, _ = mapping or load_mapping()
    folders = load_folders() if mapping is None else ()
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise NotADirectoryError(
            f"ObjectNet folder {path!r} is a file: unpack the ObjectNet download and pass the folder that holds "
            "images/ (e.g. objectnet-1.0)."
        )
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"ObjectNet folder {path!r} does not exist. Download ObjectNet (objectnet.dev, a manual download), "
            "unpack it and pass the folder that holds images/ (e.g. objectnet-1.0)."
        )
    root = os.path.join(path, "images") if os.path.isdir(os.path.join(path, "images")) else path
    wanted = {normalise_class_name(n): i for i, n in enumerate(names)}
    wanted.update({normalise_class_name(n): i for i, n in enumerate(folders)})
    found = {}
    for entry in sorted(os.listdir(root)):
        full = os.path.join(root, entry)
        key = normalise_class_name(entry)
        if os.path.isdir(full) and key in wanted:
            found[wanted[key]] = full
    if not found:
        sample = ", ".join(sorted(os.listdir(root))[:5]) or "nothing"
        raise ValueError(
            f"{root!r} holds none of ObjectNet's {len(names)} classes that overlap ImageNet (found: {sample}). "
            f"Pass the unpacked ObjectNet download (its images/ folder has one folder per class, e.g. "
            f"{', '.join(sorted(folders or names)[:3])}, ...)."
        )
    paths, labels, bad = [], [], []
    for index in sorted(found):
        for dirpath, _, files in sorted(os.walk(found[index])):
            for name in sorted(files):
                if name.lower().endswith(IMAGE_EXTENSIONS) and not name.startswith("."):
                    file = os.path.join(dirpath, name)
                    if check_files and not _looks_like_an_image(file):
                        bad.append(file)
                        continue
                    paths.append(file)
                    labels.append(index)
    if bad:
        shown = ", ".join(os.path.relpath(f, root) for f in bad[:3]) + (", ..." if len(bad) > 3 else "")
        message = (f"{len(bad)} of {len(bad) + len(paths)} image files under {root!r} are not PNG, JPEG, GIF or BMP "
                   f"images ({shown}).")
        if not paths:
            raise ValueError(message + " No image is left to evaluate: pass the unpacked ObjectNet download.")
        if on_bad_file == "error":
            raise ValueError(message + " Remove them (or replace them with the download's files), or pass "
                             "--on-bad-file skip (on_bad_file='skip') to leave them out.")
        warnings.warn(message + " Left them out.", stacklevel=2)
    if not paths:
        raise ValueError(f"The ObjectNet class folders in {root!r} hold no images ({', '.join(IMAGE_EXTENSIONS)}): "
                         "pass the unpacked ObjectNet download.")
    return paths, np.asarray(labels, np.int64), [names[i] for i in sorted(found)]


def crop_border(image, border=BORDER):
    """`image` (H, W, C) without its outer `border` pixels on every side (tf)."""
    return image[border:-border, border:-border, :]


def objectnet_dataset(path, image_size, batch_size=64, mapping=None, on_bad_file="skip", return_paths=False):
    """(tf.data of (images in [-1, 1], ObjectNet labels), number of images, class names found):
    each image decoded, its border cropped, then the evaluation preprocessing (resize).
    `on_bad_file`: as index_objectnet_folder. With `return_paths`, a fourth item: the image
    paths in the dataset's order."""
    import tensorflow as tf

    paths, labels, found = index_objectnet_folder(path, mapping, on_bad_file=on_bad_file)

    def load(file, label):
        return load_image(file, image_size), label

    ds = tf.data.Dataset.from_tensor_slices((paths, labels))
    ds = ds.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(batch_size)
    ds = ds.prefetch(tf.data.AUTOTUNE)
    return (ds, len(paths), found, paths) if return_paths else (ds, len(paths), found)


def load_image(file, image_size):
    """One ObjectNet image, as the evaluation reads it: decoded, its border cropped, resized to
    `image_size` with pixels in [-1, 1] (tf; `file` a path tensor or string). An image too small
    for the crop stops the pipeline with a DataError naming it."""
    import tensorflow as tf

    from keras_vit.data import preprocessing
    from keras_vit.errors import pipeline_check

    image = tf.io.decode_image(tf.io.read_file(file), channels=3, expand_animations=False)
    side = 2 * BORDER + 1
    small = pipeline_check(
        tf.reduce_min(tf.shape(image)[:2]) >= side,
        f"The image {{}} is too small for ObjectNet's {BORDER}-pixel border crop (it needs at least {side}x{side} "
        "pixels): replace it with the download's file, or remove it.", file)
    with tf.control_dependencies([small]):
        image = crop_border(tf.identity(image))
    return preprocessing.eval_preprocess(image, image_size)


def failing_image(paths, image_size):
    """(path, problem) of the first of `paths` whose reading (`load_image`) fails: the DataError of
    a failed check, or TensorFlow's message; (None, None) when each reads on its own."""
    import tensorflow as tf

    from keras_vit.errors import data_error

    for path in paths:
        try:
            load_image(tf.constant(path), image_size)
        except tf.errors.OpError as error:
            return path, data_error(error) or (error.message or str(error))
    return None, None
