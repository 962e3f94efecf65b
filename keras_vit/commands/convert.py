"""`keras-vit convert SRC DST`: any readable checkpoint -> a Keras preset folder, .keras or .npz."""

import os
import time


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
    parser.add_argument("--image-size", type=int, default=None, help="resize the position embeddings to this size")
    parser.add_argument("--force", action="store_true", help="overwrite DST if it exists")
    parser.set_defaults(func=run)


def _step(message, start):
    print(f"[{time.monotonic() - start:6.1f}s] {message}", flush=True)


def run(args):
    from keras_vit import loading
    from keras_vit.checkpoints import save_preset, write_npz
    from keras_vit.models.weight_tree import get_weight_tree

    start = time.monotonic()
    dst = args.destination
    if os.path.exists(dst) and not args.force:
        print(f"keras-vit convert: {dst!r} exists; pass --force to overwrite it.")
        return 1
    _step(f"resolving {args.source}", start)
    resolved = loading.resolve(args.source, image_size=args.image_size)
    _step(f"reading {resolved.path} ({resolved.format.description})", start)
    model = loading.load(resolved.path, image_size=args.image_size, include_top=None)
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
        write_npz(get_weight_tree(model), dst)
        kind = "original-layout .npz"
    else:
        save_preset(model, dst, metadata={"source": args.source})
        kind = "Keras preset folder"
    _step(f"wrote {kind} {dst}", start)
    return 0
