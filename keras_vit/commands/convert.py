"""`keras-vit convert SRC DST`: any readable checkpoint -> a Keras preset folder, .keras or .npz."""

import os
import time

from keras_vit.commands import _common


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "convert",
        help="convert a checkpoint (file, folder, hf://owner/repo or preset name) to a Keras preset, .keras or .npz",
        description="Convert SRC (an original .npz, a timm or transformers folder/.safetensors, a Keras preset or "
        ".keras file, hf://owner/repo[@revision], or a preset name such as ViTB16.augreg2_in21k_ft_in1k) to DST: "
        "a .keras file, an original-layout .npz, or otherwise a Keras preset folder.",
    )
    parser.add_argument("source", metavar="SRC")
    parser.add_argument("destination", metavar="DST")
    _common.add_model_args(parser, source=False)
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


def run(args):
    start = time.monotonic()
    dst = args.destination
    check_destination(dst, args.force)
    from keras_vit import loading

    _step(f"resolving {args.source}", start)
    resolved = loading.resolve(args.source, image_size=args.image_size)
    _step(f"reading {resolved.path} ({resolved.format.description})", start)
    model = loading.load(resolved, image_size=args.image_size, include_top=None)
    c = model.get_config()
    _step(
        f"built {c['hidden_size']}-wide, {c['num_layers']}-layer model at {c['image_size'][0]}x{c['image_size'][1]}, "
        f"{model.count_params():,} parameters, classes: {c['classes'] if c['include_top'] else 'none'}",
        start,
    )
    if dst.endswith(".keras"):
        model.save(dst)
        kind = ".keras file"
    elif dst.endswith(".npz"):
        from keras_vit import get_weight_tree, write_npz

        write_npz(get_weight_tree(model), dst)
        kind = "original-layout .npz"
    else:
        from keras_vit import save_preset

        save_preset(model, dst, metadata={"source": args.source})
        kind = "Keras preset folder"
    _step(f"wrote {kind} {dst}", start)
    return 0
