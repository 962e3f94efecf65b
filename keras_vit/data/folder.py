"""Image folders: one sub-folder per class, optionally under split folders.

    root/
      train/cat/001.jpg  train/dog/002.png ...     (split folders; class list from train/)
      test/cat/...
    or
    root/cat/001.jpg  root/dog/002.png ...        (no split folders: the whole folder is "train")

Files are checked once, when the folder is indexed, by fully decoding them with Pillow:

* a file whose extension is not one TensorFlow decodes (.jpg .jpeg .png .gif .bmp) is a
  *non-image* file (README.txt, labels.csv, .tiff, ...);
* an image file Pillow cannot decode (truncated, garbage bytes) is *corrupt*.

With `on_bad_file="skip"` (the default) both kinds are left out and ONE warning counts them and
names the first few; with `on_bad_file="error"` the first scan raises ValueError listing them.
Hidden files (.DS_Store, ._foo.jpg) are ignored silently. tf.data then never meets a bad file.
"""

import dataclasses
import os
import warnings

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
_SPLIT_FOLDERS = ("train", "val", "validation", "test")


@dataclasses.dataclass
class FolderIndex:
    paths: list
    labels: list
    class_names: list
    non_images: list
    corrupt: list


def _is_decodable(path):
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
        return True
    except Exception:  # Pillow raises OSError, SyntaxError, ValueError... for bad data
        return False


def _class_folders(folder):
    return sorted(
        name for name in os.listdir(folder) if not name.startswith(".") and os.path.isdir(os.path.join(folder, name))
    )


def resolve_split_folder(root, split):
    """(folder of `split`, folder whose sub-folders define the classes)."""
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"Image folder {root!r} does not exist.")
    split_dirs = [name for name in _SPLIT_FOLDERS if os.path.isdir(os.path.join(root, name))]
    if split_dirs:
        if split not in split_dirs:
            alias = {"val": "validation", "validation": "val"}.get(split)
            if alias in split_dirs:
                split = alias
            else:
                raise ValueError(f"Image folder {root!r} has split folders {split_dirs} but no {split!r}.")
        classes_from = os.path.join(root, "train") if "train" in split_dirs else os.path.join(root, split)
        return os.path.join(root, split), classes_from
    if split not in ("train", None):
        raise ValueError(
            f"Image folder {root!r} has no split folders ({'/'.join(_SPLIT_FOLDERS)}), so it only has the split "
            f"'train'; got split={split!r}. Put the images under {root}/train/<class>/ and {root}/{split}/<class>/."
        )
    return root, root


_INDEX_CACHE = {}


def _tree_signature(folder):
    return tuple(
        (dirpath, os.stat(dirpath).st_mtime_ns, len(filenames)) for dirpath, _, filenames in sorted(os.walk(folder))
    )


def index_image_folder(root, split="train", on_bad_file="skip", reuse=False):
    """List the images of `split` under `root` with their labels (class-per-subfolder).

    Returns a FolderIndex; see the module docstring for what is skipped and how it is reported.
    With `reuse=True` an unchanged folder indexed before in this process is not decoded again
    (its warning is repeated once per call site, as Python's warnings do).
    """
    if on_bad_file not in ("skip", "error"):
        raise ValueError(f"on_bad_file must be 'skip' or 'error'; got {on_bad_file!r}.")
    folder, classes_from = resolve_split_folder(root, split)
    key = (os.path.realpath(folder), os.path.realpath(classes_from), on_bad_file)
    if reuse and key in _INDEX_CACHE and _INDEX_CACHE[key][0] == _tree_signature(folder):
        index, message = _INDEX_CACHE[key][1]
        if message:
            warnings.warn(message, stacklevel=3)
        return index
    index, message = _index(root, folder, classes_from, on_bad_file)
    _INDEX_CACHE[key] = (_tree_signature(folder), (index, message))
    if message:
        warnings.warn(message, stacklevel=3)
    return index


def _index(root, folder, classes_from, on_bad_file):
    class_names = _class_folders(classes_from)
    if not class_names:
        raise ValueError(
            f"Image folder {classes_from!r} has no class sub-folders: expected {classes_from}/<class name>/<image>."
        )
    present = _class_folders(folder)
    unknown = sorted(set(present) - set(class_names))
    if unknown:
        raise ValueError(
            f"Split folder {folder!r} has classes {unknown} that {classes_from!r} does not: every split must use "
            f"the same class folders ({len(class_names)} classes: {class_names[:10]}...)."
        )
    paths, labels, non_images, corrupt = [], [], [], []
    for label, name in enumerate(class_names):
        class_dir = os.path.join(folder, name)
        if not os.path.isdir(class_dir):
            continue
        for dirpath, dirnames, filenames in os.walk(class_dir):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                if filename.startswith("."):
                    continue
                path = os.path.join(dirpath, filename)
                if not filename.lower().endswith(IMAGE_EXTENSIONS):
                    non_images.append(path)
                elif not _is_decodable(path):
                    corrupt.append(path)
                else:
                    paths.append(path)
                    labels.append(label)
    bad = len(non_images) + len(corrupt)
    if bad:
        def names(files):
            shown = ", ".join(os.path.relpath(f, root) for f in files[:3])
            return shown + (", ..." if len(files) > 3 else "")

        message = (
            f"{bad} of {bad + len(paths)} files under {folder!r} are not usable images: "
            f"{len(non_images)} non-image file(s) ({names(non_images) or '-'}), "
            f"{len(corrupt)} corrupt image(s) ({names(corrupt) or '-'})."
        )
        if on_bad_file == "error":
            raise ValueError(message + " Remove them or pass on_bad_file='skip'.")
        message += " Skipped them."
    if not paths:
        raise ValueError(f"Image folder {folder!r} has no readable images (extensions {IMAGE_EXTENSIONS}).")
    return FolderIndex(paths, labels, class_names, non_images, corrupt), (message if bad else None)
