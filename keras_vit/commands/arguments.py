"""The commands' arguments: argparse types that check each value as it is parsed (a bad value
fails before anything loads, as one line naming the flag), the argument groups the commands
share, and the defaults they work out. No Keras here."""

import argparse
import math

from keras_vit.geometry import optional_pair
from keras_vit.runs import RunFolder


#: The embedded datasets and the prefix of tfds ones, for --help texts.
DATA_HELP = (
    "data: 'digits' or 'shapes' (embedded, no download), 'tfds:NAME' (a prepared tensorflow-datasets "
    "dataset, e.g. tfds:cifar100, tfds:vtab/dtd), or an image folder (class-per-subfolder, optional "
    "train/ test/ split folders)"
)


def number(kind=int, *, low=None, high=None, low_open=False, high_open=False, what=None, example=None):
    """An argparse `type` for a number in a range: `kind` (int or float) at least `low` (above it
    with `low_open`) and at most `high` (below it with `high_open`). A value outside fails while
    the arguments are parsed, before anything loads, as one line naming the flag:
    `keras-vit finetune: error: argument --steps: -5 is not a whole number of at least 1 (e.g. 500)`."""
    if what is None:
        whole = "a whole number" if kind is int else "a number"
        if low is not None and high is not None:
            what = f"{whole} in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            what = f"{whole} {'above' if low_open else 'of at least'} {low:g}"
        elif high is not None:
            what = f"{whole} {'below' if high_open else 'of at most'} {high:g}"
        else:
            what = whole
    hint = f" (e.g. {example})" if example is not None else ""

    def parse(text):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}{hint}") from None
        if (
            (kind is float and not math.isfinite(value))
            or (low is not None and (value <= low if low_open else value < low))
            or (high is not None and (value >= high if high_open else value > high))
        ):
            raise argparse.ArgumentTypeError(f"{text} is not {what}{hint}")
        return value

    parse.__name__ = kind.__name__  # argparse's fallback message names the type
    return parse


#: --batch-size, --steps, ...: 1 or more.
positive_int = number(int, low=1)


#: --seed: what NumPy's and Keras' seeding accept.
seed_int = number(int, low=0, high=2**32 - 1)


#: The forms --image-size takes, for its help and its errors.
IMAGE_SIZE_FORMS = "one number of pixels for a square input (384) or HEIGHTxWIDTH (384x512, or 384,512)"


def image_size_type(square_reason=None):
    """An argparse `type` for --image-size: `384` -> 384, `384x512` or `384,512` -> (384, 512)
    (height, width; `384x384` -> 384). Anything else fails while the arguments are parsed, as one
    line naming the flag and the accepted forms. With `square_reason`, a command that runs at one
    square resolution refuses HxW with a different height and width, saying why."""

    def parse(text):
        parts = str(text).strip().lower().replace(",", "x").split("x")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = None
        if values is None or len(values) > 2:
            raise argparse.ArgumentTypeError(f"{text!r} is not an image size; pass {IMAGE_SIZE_FORMS}")
        if min(values) < 1:
            raise argparse.ArgumentTypeError(
                f"{text} is not an image size: a side is a whole number of at least 1 pixel; pass {IMAGE_SIZE_FORMS}"
            )
        if len(values) == 1 or values[0] == values[1]:
            return values[0]
        if square_reason:
            raise argparse.ArgumentTypeError(f"{text!r} is not square: {square_reason}; pass one number, e.g. 384")
        return tuple(values)

    parse.__name__ = "image size"  # argparse's fallback message names the type
    return parse


def image_hw(image_size):
    """(height, width) of an --image-size value (an int or a pair), or None."""
    return optional_pair(image_size, "--image-size")


def format_image_size(image_size):
    """An --image-size value as it is typed: `384`, `384x512`."""
    h, w = image_hw(image_size)
    return str(h) if h == w else f"{h}x{w}"


def host_port(text):
    """--coordinator-address: HOST:PORT (a host name or IPv4 address, or [IPv6], and a port 1-65535)."""
    fix = "pass process 0's address as HOST:PORT, e.g. 10.0.0.2:1234"
    host, sep, port = str(text).strip().rpartition(":")
    if not sep or not host or host in ("[]",):
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT; {fix}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{port!r} in {text!r} is not a port number (1-65535); {fix}")
    if host.startswith("[") != host.endswith("]") or (":" in host and not host.startswith("[")):
        raise argparse.ArgumentTypeError(f"{text!r}: write an IPv6 host in brackets, e.g. [::1]:1234")
    return f"{host}:{int(port)}"


def out_folder(text):
    """--out of a command that writes a folder: a path that is not a file and under which a folder
    can be made (no file in the way, permission to write; `RunFolder.check_path`). Checked while
    the arguments are parsed, before anything loads or runs, as one line naming the flag."""
    try:
        return RunFolder.check_path(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def shot_counts(text):
    """--shots: comma-separated positive whole numbers, as a sorted tuple without repeats."""
    fix = "pass shots per class as positive whole numbers separated by commas, e.g. --shots 1,5,10,25"
    items = [item.strip() for item in str(text).split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"no shot count in {text!r}; {fix}")
    counts = set()
    for item in items:
        try:
            count = int(item)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not a whole number; {fix}") from None
        if count < 1:
            raise argparse.ArgumentTypeError(f"{count} is not a positive number of shots; {fix}")
        counts.add(count)
    return tuple(sorted(counts))


def default_warmup(steps):
    """finetune's warm-up when --warmup is not given."""
    return min(500, steps // 5)


def add_model_args(parser, *, source=True, default_arch=None, square_reason=None,
                   image_size_default="the checkpoint's, or 224"):
    """The model arguments every command shares: --arch, --weights, --preset (with `source`)
    and --image-size (square, or HxW unless `square_reason` says why the command cannot run
    at one; `image_size_default` says what it is when not given). Read them back with
    `keras_vit.commands.resolution.load_model(args, ...)`."""
    group = parser.add_argument_group("model")
    if source:
        group.add_argument(
            "--weights", default=None,
            help="weights to start from: a preset tag or alias with --arch (e.g. augreg_in21k, imagenet), a path "
            "(.keras file, run folder, .npz, timm / transformers folder, Keras preset folder), 'hf://owner/repo', "
            "a preset name (ViTB16.augreg_in21k), or 'none' for a randomly initialised --arch",
        )
        group.add_argument("--preset", default=None,
                           help="a preset name, e.g. ViTB16.augreg2_in21k_ft_in1k (keras-vit presets lists them)")
        group.add_argument(
            "--arch", default=default_arch,
            help="architecture: a constructor name (ViTB16, R50ViTB16, BiTResNet50x1, AxialViTB16, AxialResNet26S, "
            "EfficientNetB0, ...) or a model's arguments as JSON (inline or a .json file), e.g. '{\"patch_size\": 4, \"hidden_size\": 64, "
            "\"num_layers\": 4, \"num_heads\": 4, \"mlp_dim\": 128}'"
            + (f" (default: {default_arch})" if default_arch else ""),
        )
    group.add_argument("--image-size", type=image_size_type(square_reason), default=None, metavar="SIZE",
                       help="input resolution: " + (
                           "one number of pixels (a square input)" if square_reason else IMAGE_SIZE_FORMS)
                       + f" (default: {image_size_default}); the patch size must divide it")
    return group


def add_data_args(parser, split="train"):
    group = parser.add_argument_group("data")
    group.add_argument("--data", required=True, help=DATA_HELP)
    group.add_argument("--data-dir", default=None, help="tensorflow-datasets data directory (a folder or a gs:// URL)")
    group.add_argument("--batch-size", type=positive_int, default=64, help="images per batch")
    group.add_argument("--classes", type=number(int, low=2), default=None,
                       help="expected number of classes (checked against the data)")
    group.add_argument("--on-bad-file", choices=("skip", "error"), default="skip",
                       help="image folders and ObjectNet: skip corrupt / non-image files with a counted warning, or "
                       "fail")
    return group


#: The --distribute modes (keras_vit.distribution): "data" replicates the weights on every device.
DISTRIBUTE_MODES = ("data",)


def add_distribution_args(parser):
    """--distribute and the flags of a job of several processes (keras.distribution.initialize)."""
    group = parser.add_argument_group(
        "distribution (JAX)",
        "Data parallelism over every device of every process. In a job of several processes (the hosts of a TPU "
        "pod slice, the nodes of a GPU cluster) start the same command in every process: each reads its rows of "
        "every global batch, and process 0 alone writes the run folder. On a Cloud TPU pod slice (and under "
        "SLURM or Open MPI) the processes find each other: --distribute data is all it takes; elsewhere pass the "
        "three flags below (or set KERAS_DISTRIBUTION_JOB_ADDRESSES, _NUM_PROCESSES, _PROCESS_ID).",
    )
    group.add_argument("--distribute", choices=DISTRIBUTE_MODES, default=None,
                       help="'data': keras.distribution.DataParallel over all devices of all processes, --batch-size "
                       "being the global batch (default: one device)")
    group.add_argument("--coordinator-address", type=host_port, default=None, metavar="HOST:PORT",
                       help="address of process 0, reachable from every process (default: from the environment)")
    group.add_argument("--num-processes", type=positive_int, default=None, metavar="N",
                       help="processes in the job; 1: this process's devices alone (default: from the environment)")
    group.add_argument("--process-id", type=number(int, low=0), default=None, metavar="I",
                       help="this process's index, 0 to N - 1; process 0 writes the run folder (default: from the "
                       "environment)")
    group.add_argument("--join-timeout", type=number(float, low=1), default=300, metavar="SECONDS",
                       help="how long a process waits for every process of the job to join before it ends with an "
                       "error (default: 300)")
    return group
