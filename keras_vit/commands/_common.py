"""What the training commands (finetune, evaluate, fewshot) and the demo share: model and data
arguments, building a model from them, and access to keras_vit.training."""

import json
import os
import sys

#: The embedded datasets and the prefix of tfds ones, for --help texts.
DATA_HELP = (
    "data: 'digits' or 'shapes' (embedded, no download), 'tfds:NAME' (a prepared tensorflow-datasets "
    "dataset, e.g. tfds:cifar100, tfds:vtab/dtd), or an image folder (class-per-subfolder, optional "
    "train/ test/ split folders)"
)


def training_api():
    """keras_vit.training, imported when a command runs."""
    from keras_vit import training

    return training


def add_model_args(parser, required=False):
    group = parser.add_argument_group("model")
    group.add_argument(
        "--weights", default=None,
        help="weights to start from: a preset tag (with --arch, e.g. augreg_in21k), a path (.keras file, run "
        "folder, .npz, timm/transformers folder), 'hf://owner/repo', or 'none' (random init, needs --arch)",
    )
    group.add_argument("--preset", default=None, help="a named preset (see keras_vit.list_presets())")
    group.add_argument(
        "--arch", default=None,
        help="architecture: a constructor name (ViTB16, ViTTi16, R50ViTB16, ...) or VisionTransformer "
        "arguments as JSON (inline or a .json file), e.g. '{\"patch_size\": 4, \"hidden_size\": 64, "
        "\"num_layers\": 4, \"num_heads\": 4, \"mlp_dim\": 128}'",
    )
    return group


def add_data_args(parser, split="train"):
    group = parser.add_argument_group("data")
    group.add_argument("--data", required=True, help=DATA_HELP)
    group.add_argument("--data-dir", default=None, help="tensorflow-datasets data directory")
    group.add_argument("--image-size", type=int, default=None,
                       help="input resolution (default: the model's); the patch size must divide it")
    group.add_argument("--batch-size", type=int, default=64)
    group.add_argument("--classes", type=int, default=None,
                       help="expected number of classes (checked against the data)")
    group.add_argument("--on-bad-file", choices=("skip", "error"), default="skip",
                       help="image folders: skip corrupt / non-image files with a counted warning, or fail")
    return group


def _load_json_arch(text):
    if os.path.isfile(text):
        with open(text) as f:
            return json.load(f)
    return json.loads(text)


def _model_file(path):
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, "model.keras")):
        return os.path.join(path, "model.keras")  # a run folder
    return path


def load_base_model(args):
    """The starting model named by --weights / --preset / --arch, or None when the model must be
    built fresh (random init) at the target size."""
    import keras

    import keras_vit

    weights = args.weights
    if weights is not None and weights.lower() == "none":
        weights = None
    if args.preset:
        return keras_vit.load_checkpoint(args.preset)
    if weights is None:
        if not args.arch:
            raise ValueError("Say which model: --arch (with --weights none or a tag), --weights PATH, or --preset.")
        return None
    path = _model_file(weights)
    if path.endswith(".keras") and os.path.isfile(path):
        return keras.saving.load_model(path, compile=False)
    if args.arch and not (os.path.exists(path) or "://" in path):
        if args.arch.lstrip().startswith("{") or args.arch.endswith(".json"):
            raise ValueError("--weights with a tag needs a constructor name for --arch (e.g. ViTB16), not JSON.")
        from keras_vit.applications import build_application

        return build_application(args.arch, weights=weights)
    if not hasattr(keras_vit, "load_checkpoint"):
        raise ValueError(f"Cannot load {weights!r}: checkpoint loading is not available in this version.")
    return keras_vit.load_checkpoint(path)


def build_fresh_model(arch, image_size, classes):
    """A randomly initialised model of `arch` (constructor name or JSON) at `image_size`."""
    from keras_vit.applications import build_application
    from keras_vit.models import VisionTransformer

    text = arch.strip()
    if text.startswith("{") or text.endswith(".json"):
        config = dict(_load_json_arch(text))
        config.update(image_size=image_size, classes=classes)
        return VisionTransformer(**config)
    return build_application(text, weights=None, input_shape=(image_size, image_size, 3), classes=classes)


def model_for_task(args, image_size, classes):
    """The model to fine-tune: --weights/--preset re-made by for_finetuning (position embeddings
    resized to `image_size`, a zero head of `classes`), or a fresh --arch model."""
    base = load_base_model(args)
    if base is None:
        return build_fresh_model(args.arch, image_size or 224, classes), None
    image_size = image_size or tuple(base.image_size)
    return training_api().for_finetuning(base, image_size=image_size, classes=classes), base


def load_trained_model(args):
    """The model to evaluate as it is (its own head): --weights / --preset / fresh --arch."""
    base = load_base_model(args)
    if base is None:
        raise ValueError("evaluate needs trained weights: --weights PATH (a .keras file or run folder) or --preset.")
    return base


def run_command(func, args):
    """Run `func(args)`, turning the errors users cause (bad data, sizes, missing datasets) into a
    one-line message and exit status 2."""
    from keras_vit.data import DatasetNotPreparedError

    try:
        return func(args)
    except (ValueError, FileNotFoundError, DatasetNotPreparedError, ImportError) as error:
        print(f"keras-vit {args.command}: error: {error}", file=sys.stderr)
        return 2
