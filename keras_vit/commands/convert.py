"""`keras-vit convert SRC DST`: any readable checkpoint -> a Keras preset folder, a .keras file,
or an .npz of any registered format with a writer (original, big_vision, big_transfer)."""

import os
import sys
import time

from keras_vit.commands import arguments, checks

#: DST endings and the formats they are written in, besides a Keras preset folder.
_KERAS_FILE = "keras"
_PRESET = "keras_preset"


def _npz_writers():
    """{name: CheckpointFormat} of the registered formats with a writer."""
    from keras_vit.checkpoints.registry import formats

    return {name: fmt for name, fmt in formats().items() if fmt.write is not None}


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "convert",
        help="convert a checkpoint (file, folder, hf://owner/repo or preset name) to a Keras preset, .keras or .npz",
        description="Convert SRC (an original, big_vision or big_transfer (BiT) .npz, a timm or transformers "
        "folder/.safetensors, a Keras preset or .keras file, hf://owner/repo[@revision], or a preset name such as "
        "ViTB16.augreg2_in21k_ft_in1k) to DST: a .keras file, an .npz (by default the original layout of the "
        "model's family: google-research/vision_transformer for ViTs, big_transfer for BiT ResNets; --to "
        "big_vision for big_vision's), or otherwise a Keras preset folder.",
    )
    parser.add_argument("source", metavar="SRC")
    parser.add_argument("destination", metavar="DST")
    arguments.add_model_args(parser, source=False)
    parser.add_argument(
        "--to", default=None, metavar="FORMAT",
        help="the format of DST: keras, keras_preset, an .npz layout (npz, big_vision, bit_npz) or a timm "
        "EfficientNet folder (timm_efficientnet) (default: from DST's ending: .keras, .npz in the model family's "
        "original layout, else a preset folder)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite DST if it exists")
    parser.set_defaults(func=run)


def _step(message, start):
    print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)


def check_destination(dst, force):
    """Refuse, before any loading, a DST that exists (without --force) or whose folder does not."""
    if os.path.exists(dst) and not force:
        raise ValueError(f"{dst!r} exists; pass --force to overwrite it, or choose another DST.")
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise ValueError(
            f"The folder {os.path.dirname(dst) or parent!r} of DST {dst!r} does not exist; create it first "
            f"(mkdir -p {os.path.dirname(dst) or parent}) or choose another DST."
        )


def destination_format(dst, to, family=None):
    """The name of the format DST is written in ("keras", "keras_preset" or an .npz writer's): a
    .npz is written in the original layout of the model's `family` (`ModelFamily.npz_format`)."""
    writers = _npz_writers()
    if to is not None:
        known = (_KERAS_FILE, _PRESET, *writers)
        if to not in known:
            raise ValueError(f"--to {to!r} is not a format convert writes; choose one of: {', '.join(known)}.")
        return to
    if dst.endswith(".keras"):
        return _KERAS_FILE
    if dst.endswith(".npz"):
        if family is not None and family.npz_format is None:
            raise ValueError(
                f"{family.title} models have no .npz layout of their own; convert to a .keras file or a Keras "
                "preset folder."
            )
        return family.npz_format if family is not None else "npz"
    return _PRESET


def _numerics(config):
    from keras_vit.models.family import family_of

    fields = set(family_of(config).config_class.fields("numerics")) - {"position_embedding_resize"}
    return {k: config[k] for k in sorted(fields) if k in config}


def run(args):
    start = time.monotonic()
    dst = args.destination
    check_destination(dst, args.force)
    checks.check_image_size(args.image_size, weights=args.source)  # SRC a preset name: its patch size
    if args.to is not None:
        destination_format(dst, args.to)  # an unknown --to fails before anything is read
    from keras_vit import loading

    _step(f"resolving {args.source}", start)
    resolved = loading.resolve(args.source, image_size=args.image_size)
    _step(f"reading {resolved.path} ({resolved.format.description})", start)
    model = loading.load(resolved, image_size=args.image_size, include_top=None)
    c = model.config
    h, w = c.image_size
    _step(
        f"built {loading._describe(c)} at {h}x{w}, {model.count_params():,} parameters, "
        f"classes: {c.classes if c.include_top else 'none'}",
        start,
    )
    from keras_vit.models.family import family_of

    to = destination_format(dst, args.to, family_of(model))
    # The weights' licence travels with them (metadata.json), so loading the result warns as the source does.
    license = loading.license_of(resolved)
    if to == _KERAS_FILE:
        from keras_vit.checkpoints.keras_format import save_keras_file

        save_keras_file(model, dst, {"license": license} if license else None)
        kind = ".keras file"
    elif to == _PRESET:
        from keras_vit import save_preset

        save_preset(model, dst, metadata={"source": args.source, **({"license": license} if license else {})})
        kind = "Keras preset folder"
    else:
        fmt = _npz_writers()[to]
        try:
            fmt.write(model, dst)
        except ValueError as err:
            raise ValueError(f"This model cannot be written as {fmt.description}: {err}") from None
        kind = fmt.description
        if license:
            print(f"keras-vit convert: note: {dst} does not record the weights' licence ({license}); convert to .keras "
                  "or a preset folder to keep it with them.", file=sys.stderr)
        # An .npz states no numerics: its reader assumes its framework's. Say so where they differ.
        _, written = fmt.read_at(dst, (h, w))  # a non-square grid: the file alone may not tell it
        differ = {k: (v, written[k]) for k, v in _numerics(c).items() if k in written and written[k] != v}
        if differ:
            listed = ", ".join(f"{k}={a!r} (the file loads with {b!r})" for k, (a, b) in differ.items())
            print(
                f"keras-vit convert: note: {dst} loads with its format's numerics, not this model's: {listed}. "
                "Pass them to load_checkpoint to reproduce these logits, or convert to .keras or a preset folder, "
                "which keep them.",
                file=sys.stderr,
            )
    _step(f"wrote {kind} {dst}", start)
    return 0
