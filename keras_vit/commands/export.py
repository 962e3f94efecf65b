"""`keras-vit export SOURCE OUT`: a deployable SavedModel (TF Serving), ONNX or LiteRT artefact.

    keras-vit export ViTB16.augreg2_in21k_ft_in1k vit_b16 --format saved_model --with-preprocessing
    keras-vit export hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k vit_b16.onnx --format onnx
    keras-vit export runs/cifar10/model.keras vit.tflite --format litert --int8 --image-size 224 224

SOURCE is any weights source `keras_vit.load_checkpoint` reads (a preset name, hf://owner/repo, a
Keras preset folder or .keras file, an original .npz, a timm or transformers folder), of any model
family (ViT, BiT, Axial-ViT, AxialResNet, EfficientNet). The
artefacts and their signatures are described in keras_vit/export.py and docs/deploy.md.
"""

import os
import sys

from keras_vit.commands import arguments, checks


FORMATS = ("saved_model", "onnx", "litert")


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "export",
        help="export a model as a TF Serving SavedModel, an ONNX file or a LiteRT (.tflite) file",
        description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("source", metavar="SOURCE", help="any weights source keras_vit.load_checkpoint reads")
    parser.add_argument("out", metavar="OUT", help="the artefact: a folder (saved_model), a .onnx or a .tflite file")
    parser.add_argument("--format", choices=FORMATS, default="saved_model", help="default: saved_model")
    parser.add_argument("--int8", action="store_true", help="export the int8-quantized model")
    parser.add_argument("--image-size", type=arguments.image_size_type(), nargs="+", metavar="SIZE", default=None,
                        help="input size: " + arguments.IMAGE_SIZE_FORMS + ", or H W (default: the checkpoint's); "
                        "position embeddings are resized")
    parser.add_argument("--with-preprocessing", action="store_true",
                        help="the artefact takes uint8 images of any size and resizes and scales them itself")
    parser.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    parser.set_defaults(func=run)
    return parser


def run(args):
    # Every artefact is written by TensorFlow: load the model there unless Keras already runs
    # on another backend (then keras_vit.export rebuilds it on TensorFlow in a subprocess).
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = "tensorflow"
    return export(args)  # keras_vit.cli turns bad input into one "keras-vit export: error: ..." line


def _image_size(values):
    """(height, width) of --image-size: SIZE (384, 384x512) or H W (384 512)."""
    if values is None:
        return None
    if len(values) == 1:
        return arguments.image_hw(values[0])
    if len(values) == 2 and all(isinstance(v, int) for v in values):
        return tuple(values)
    shown = " ".join(arguments.format_image_size(v) for v in values)
    raise ValueError(f"--image-size takes {arguments.IMAGE_SIZE_FORMS}, or H W; got {shown}.")


def export(args):
    image_size = _image_size(args.image_size)
    checks.check_image_size(image_size, weights=args.source)  # SOURCE a preset name: its patch size
    if os.path.exists(args.out) and not args.force:
        raise ValueError(f"{args.out!r} exists; pass --force to overwrite it.")
    from keras_vit import export as exports
    from keras_vit import load_checkpoint

    # Impossible options fail here, before the checkpoint is read.
    exports.check_options(args.out, args.format, int8=args.int8, image_size=image_size)
    model = load_checkpoint(args.source, image_size=image_size)
    exports.export_model(
        model, args.out, args.format, int8=args.int8, with_preprocessing=args.with_preprocessing
    )
    print(f"wrote {args.format}{' int8' if args.int8 else ''} artefact {args.out} "
          f"(input: {exports.input_description(model, args.with_preprocessing)})")
    return 0
