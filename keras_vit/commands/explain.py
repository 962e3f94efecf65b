"""`keras-vit explain IMAGE... --weights W --out DIR`: the paper's inspection pictures (§4.5).

For each image: its attention-rollout map over the image. For the model: the mean attention
distance of every head (Figure 7 right), the position-embedding similarity (Figure 10) and the
principal components of the patch-embedding filters (Figure 7 left; not for hybrids). With no
IMAGE, the sample pictures that ship with the installed packages are used (matplotlib's
grace_hopper.jpg, and scikit-learn's china.jpg / flower.jpg where scikit-learn is installed).
"""

import json
import os
import warnings

from keras_vit.commands import arguments, checks, resolution

#: name -> (module, file) of sample images shipped with dependencies; no network needed.
SAMPLE_IMAGES = {
    "grace_hopper": ("matplotlib", "mpl-data/sample_data/grace_hopper.jpg"),
    "china": ("sklearn.datasets", "images/china.jpg"),
    "flower": ("sklearn.datasets", "images/flower.jpg"),
}


def sample_image_path(name):
    """Local path of a shipped sample image ("grace_hopper", "china", "flower"), or None."""
    import importlib

    module_name, relative = SAMPLE_IMAGES[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(module.__file__), relative)
    return path if os.path.exists(path) else None


def _resolve_images(names):
    if not names:
        paths = [p for p in (sample_image_path(n) for n in SAMPLE_IMAGES) if p]
        if not paths:
            raise FileNotFoundError("No IMAGE given and no shipped sample image found; pass image files.")
        return paths
    paths = []
    for name in names:
        if name.startswith("sample:"):
            key = name[len("sample:") :]
            if key not in SAMPLE_IMAGES:
                raise ValueError(f"Unknown sample {key!r}; choose from {', '.join('sample:' + k for k in SAMPLE_IMAGES)}.")
            path = sample_image_path(key)
            if path is None:
                raise FileNotFoundError(
                    f"Sample {key!r} ships with {SAMPLE_IMAGES[key][0]}, which is not installed; pass image files."
                )
            paths.append(path)
        elif os.path.isdir(name):
            raise ValueError(
                f"IMAGE {name!r} is a folder, not an image file; pass the images in it "
                f"(e.g. {os.path.join(name, '*.jpg')}) or sample:NAME."
            )
        elif not os.path.isfile(name):
            raise FileNotFoundError(f"Image file {name!r} does not exist; pass image files or sample:NAME.")
        else:
            _check_image(name)
            paths.append(name)
    return paths


def _check_image(path):
    """Refuse a file that Pillow cannot read as an image (before any model loads)."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.verify()  # reads the whole file: a truncated or damaged image fails here
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        reason = "not an image file Pillow can read" if isinstance(error, UnidentifiedImageError) else \
            f"a damaged image ({error})"
        raise ValueError(
            f"IMAGE {path!r} is {reason}; pass JPEG, PNG, GIF, BMP, ... image files or sample:NAME."
        ) from None


def add_parser(subparsers):
    p = subparsers.add_parser(
        "explain",
        help="attention rollout, attention distance, embedding plots as PNGs",
        description=__doc__,
    )
    p.add_argument(
        "images",
        nargs="*",
        metavar="IMAGE",
        help="image files, or sample:grace_hopper / sample:china / sample:flower (default: all shipped samples)",
    )
    arguments.add_model_args(p)
    p.add_argument("--out", type=arguments.out_folder, default="explain", help="output directory (created)")
    p.add_argument("--head-fusion", default="mean", choices=("mean", "max", "min"), help="rollout head fusion")
    p.add_argument("--discard-ratio", type=arguments.number(float, low=0, high=1, high_open=True), default=0.0,
                   help="rollout: drop this fraction of weakest attention")
    p.add_argument("--components", type=arguments.positive_int, default=28,
                   help="patch-embedding principal components to draw")
    p.add_argument("--verbose", type=int, choices=(0, 1), default=1, help="1: a progress bar, 0: quiet")
    p.set_defaults(func=run)
    return p


def load_model(weights=None, arch=None, image_size=None, preset=None):
    """The model `explain` inspects (see `keras-vit explain --help`): `weights` / `preset` as
    --weights / --preset (or weights already resolved by `keras_vit.loading.resolve`); with no
    weights ("none" or None), a randomly initialised `arch` (default: the default family's
    constructor, `default_family().default_constructor()`: ViTB16), with a warning."""
    import argparse

    args = argparse.Namespace(weights=weights, preset=preset, arch=arch, image_size=image_size)
    if resolution.weights_argument(args) is None:
        args.arch = arch or _default_arch()
        warnings.warn(
            f"explain: no trained weights given; inspecting a randomly initialised {args.arch}. Its attention and "
            "embeddings carry no learned structure.",
            stacklevel=2,
        )
    checks.check_model_args(args)
    return resolution.load_as_is(args, image_size=image_size)


def _read_image(path, size, channels=3):
    """(original uint8 RGB, model input in [-1, 1] resized to `size` = (height, width), with
    `channels` channels: 3 for RGB models, 1 for greyscale ones)."""
    import numpy as np
    from PIL import Image

    if channels not in (1, 3):
        raise ValueError(f"explain reads RGB or greyscale images; the model takes {channels} channels.")
    try:
        with Image.open(path) as img:
            rgb = img.convert("RGB")
            original = rgb.copy()
            original.thumbnail((512, 512), Image.BICUBIC)  # pictures need not be larger
            resized = rgb.resize((size[1], size[0]), Image.BICUBIC)
    except (OSError, SyntaxError) as error:  # FileNotFoundError passes through as it is
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(f"IMAGE {path!r} cannot be decoded ({error}); pass an undamaged image file.") from None
    if channels == 1:
        resized = resized.convert("L")
    x = np.asarray(resized, dtype=np.float32).reshape(size[0], size[1], channels)
    return np.asarray(original), x / np.float32(127.5) - np.float32(1.0)


def _imagenet_top5(model, batch):
    """Top-5 ImageNet classes per image when the model ends in a 1000- or 21843-way head."""
    shape = model.output_shape
    if not (isinstance(shape, tuple) and len(shape) == 2 and shape[-1] in (1000, 21843)):
        return None
    try:
        from keras_vit import decode_predictions
    except ImportError:
        return None
    decoded = decode_predictions(model.predict(batch, verbose=0), top=5)
    return [[[name, round(score, 4)] for _, name, score in row] for row in decoded]


def _progress(total, verbose):
    """A progress bar over `total` images (Keras', as `keras-vit evaluate` shows), None when quiet."""
    import keras

    return keras.utils.Progbar(total, unit_name="image") if verbose else None


def _stem(path, used):
    stem = os.path.splitext(os.path.basename(path))[0]
    stem = "".join(c if c.isalnum() or c in "-_" else "_" for c in stem) or "image"
    name, k = stem, 1
    while name in used:
        k += 1
        name = f"{stem}_{k}"
    used.add(name)
    return name


def explain(model, image_paths, out_dir, head_fusion="mean", discard_ratio=0.0, components=28, log=print,
            batch_size=8, verbose=1):
    """Write the inspection PNGs of `model` on `image_paths` to `out_dir`; returns the summary dict.

    The images are read and run `batch_size` at a time (their attention maps, rollouts and
    pictures), with a progress bar (`verbose` 1; 0 quiet) counting the images done."""
    import numpy as np

    from keras_vit import analysis
    from keras_vit.analysis import plots

    os.makedirs(out_dir, exist_ok=True)
    info = analysis.anatomy(model)
    channels = int(info.chain[0].inputs[0].shape[-1])
    bar = _progress(len(image_paths), verbose)
    written, used, top5 = [], set(), []
    distance_sum = None
    for start in range(0, len(image_paths), batch_size):
        paths = image_paths[start: start + batch_size]
        images = [_read_image(p, info.image_size, channels) for p in paths]
        batch = np.stack([x for _, x in images])
        attentions = analysis.attention_weights(model, batch, batch_size=batch_size)
        joint = analysis.rollout(attentions, head_fusion=head_fusion, discard_ratio=discard_ratio)
        maps = analysis.rollout_map(joint, info.grid_size)
        for path, (original, _), m in zip(paths, images, maps):
            stem = _stem(path, used)
            overlay_path = os.path.join(out_dir, f"rollout_{stem}.png")
            plots.save_png(overlay_path, plots.overlay_attention(original, m))
            panel_path = os.path.join(out_dir, f"rollout_{stem}_panel.png")
            plots.plot_rollout(original, m, panel_path,
                               title=f"{os.path.basename(path)}: attention rollout ({head_fusion})")
            written += [overlay_path, panel_path]
        # The mean over all images' query patches: each batch weighs by its image count.
        distance = analysis.mean_attention_distance(attentions, info.grid_size, info.stride) * len(paths)
        distance_sum = distance if distance_sum is None else distance_sum + distance
        if top5 is not None:  # None once the head is no ImageNet one
            rows = _imagenet_top5(model, batch)
            top5 = None if rows is None else top5 + rows
        if bar:
            bar.update(start + len(paths))

    distances = distance_sum / len(image_paths)
    distance_path = os.path.join(out_dir, "attention_distance.png")
    plots.plot_attention_distance(
        distances,
        distance_path,
        title=f"{model.name}: mean attention distance ({len(image_paths)} image{'s' * (len(image_paths) > 1)})",
        image_size=info.image_size,
    )
    written.append(distance_path)

    similarity_path = os.path.join(out_dir, "position_embedding_similarity.png")
    plots.plot_position_embedding_similarity(
        analysis.position_embedding_similarity(model), similarity_path, title=f"{model.name}: position embedding similarity"
    )
    written.append(similarity_path)

    notes = []
    try:
        comps, variance = analysis.patch_embedding_components(model, n=components, return_variance=True)
    except ValueError as err:  # hybrids: the embedding does not see pixels
        notes.append(str(err))
        log(f"explain: skipping patch-embedding components: {err}")
    else:
        pcs_path = os.path.join(out_dir, "patch_embedding_components.png")
        plots.plot_patch_embedding_components(comps, pcs_path)
        written.append(pcs_path)

    summary = {
        "model": model.name,
        "image_size": list(info.image_size),
        "grid_size": list(info.grid_size),
        "pixels_per_token": list(info.stride),
        "class_token": bool(info.num_prefix_tokens),
        "hybrid": info.hybrid,
        "images": list(image_paths),
        "mean_attention_distance_px": np.round(distances, 2).tolist(),
        "top5": top5,
        "files": written,
        "notes": notes,
    }
    summary_path = os.path.join(out_dir, "summary.json")
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=1)
    for path in written + [summary_path]:
        log(f"wrote {path}")
    return summary


def _default_arch():
    """The constructor explain inspects without --arch and weights: the default family's."""
    from keras_vit.models.family import default_family  # the records only: no Keras

    return default_family().default_constructor()


def run(args):
    checks.check_model_args(args, default_arch=_default_arch())
    paths = _resolve_images(args.images)  # before loading anything: a typo fails fast
    resolved = resolution.resolve_weights(args, image_size=args.image_size)  # None for --weights none
    model = load_model(resolved, args.arch, args.image_size)
    explain(model, paths, args.out, args.head_fusion, args.discard_ratio, args.components, verbose=args.verbose)
    return 0
