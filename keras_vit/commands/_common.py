"""What the training commands (finetune, evaluate, fewshot) and the demo share: model and data
arguments, building a model from them, and access to keras_vit.training."""

import argparse
import json
import math
import os
import re

from keras_vit.geometry import optional_pair
from keras_vit.storage.json_files import read_json_object

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


def _model_description(arch=None, weights=None):
    """(what, family, config) of the model that --arch / --weights / --preset / SOURCE name, read
    from the architecture and preset tables without building anything; None when only reading
    the checkpoint could tell (a file, a folder, hf://owner/repo) or the name is unknown (the
    loading path then names the problem)."""
    from keras_vit.models.family import all_architectures, default_family, family_of

    if isinstance(arch, str) and arch.strip():
        arch = arch.strip()
        if _is_json_arch(arch):
            try:
                config = dict(_load_json_arch(arch))
            except (OSError, ValueError, TypeError):
                return None
            try:
                family = family_of(config)
            except ValueError:
                family = default_family()
            return "the --arch JSON model", family, config
        row = all_architectures().get(arch)
        return None if row is None else (arch, family_of(arch), row.kwargs())
    if not isinstance(weights, str) or not weights.strip() or os.path.exists(os.path.expanduser(weights)):
        return None
    from keras_vit.loading import describe

    try:
        described = describe(weights.strip())
    except ValueError:  # a known constructor with an unknown tag: resolving the weights says which exist
        return None
    preset = described.preset
    if described.kind != "preset":
        return None
    row = all_architectures().get(preset.architecture)
    return None if row is None else (f"{preset.name} ({preset.architecture})", family_of(row), row.kwargs())


def _size_error(family, config, hw):
    """The config's error at (height, width), or None when the family takes that size."""
    try:
        family.validate({**config, "image_size": tuple(hw)})
    except (ValueError, TypeError) as error:
        return error
    return None


def _nearest_sides(family, config, side, reach=1024):
    """The nearest square sizes below and above `side` that the model takes (None where there is none
    within `reach` pixels)."""
    lower = next((s for s in range(side - 1, max(side - reach, 0), -1) if _size_error(family, config, (s, s)) is None),
                 None)
    upper = next((s for s in range(side + 1, side + reach) if _size_error(family, config, (s, s)) is None), None)
    return lower, upper


def check_image_size(image_size, *, arch=None, weights=None, flag="--image-size", default=False):
    """Refuse, before anything loads, an --image-size the model cannot take (a side that is not a
    multiple of its patch size, or below one patch), in one line naming the flag, the model's patch
    size and the nearest sizes it takes. The model is read from `arch` (a constructor name or
    VisionTransformer JSON) or `weights` (a preset name) in the architecture and preset tables,
    without Keras; for a checkpoint file or folder nothing is known before it is read, and the
    model's own check applies when it is built. `default`: the size is the command's default, not
    typed.

    Example:
        >>> check_image_size(30, arch="ViTB16")
        Traceback (most recent call last):
        ...
        ValueError: --image-size 30 does not fit ViTB16: its patch size is 16 pixels, ...
    """
    if image_size is None:
        return
    described = _model_description(arch, weights)
    if described is None:
        return
    what, family, config = described
    hw = image_hw(image_size)
    error = _size_error(family, config, hw)
    if error is None:
        return
    fits = {side: _size_error(family, config, (side, side)) is None for side in set(hw)}
    nearest = {side: _nearest_sides(family, config, side) for side in fits if not fits[side]}
    if not nearest or any(lower is None and upper is None for lower, upper in nearest.values()):
        return  # not a matter of size (or of square sizes): the model's own check says what is wrong

    def best(side):
        if fits[side]:
            return side
        lower, upper = nearest[side]
        if lower is None or (upper is not None and upper - side <= side - lower):
            return upper
        return lower

    suggestion = (best(hw[0]), best(hw[1]))
    try:  # a size it takes: read its patch size and stride there
        sample = family.config_class.from_dict({**config, "image_size": suggestion})
    except (ValueError, TypeError):
        sample = None
    patch, stride = getattr(sample, "patch_size", None), getattr(sample, "stride", None)
    if patch and stride == patch:
        why = f"its patch size is {patch} pixels, and each side must be a multiple of it (at least one patch)"
    elif patch and stride:
        why = (f"its patch size is {patch} on a ResNet of stride {stride // patch}, so each token covers {stride} "
               f"pixels, and each side must be a multiple of {stride} (at least {stride})")
    else:
        why = str(error).split(". ")[0].rstrip(".")

    def around(side):
        return " and ".join(str(s) for s in nearest[side] if s is not None)

    if hw[0] == hw[1]:
        several = None not in nearest[hw[0]]
        sides = f"the nearest size{'s' if several else ''} it takes {'are' if several else 'is'} {around(hw[0])}"
    else:
        sides = "the nearest sides it takes: " + ", ".join(
            f"{axis} {side} -> {around(side)}" for axis, side in zip(("height", "width"), hw) if not fits[side])
    given = f"{flag} {format_image_size(image_size)}" + (" (the default)" if default else "")
    raise ValueError(
        f"{given} does not fit {what}: {why}; {sides}. Pass e.g. {flag} {format_image_size(suggestion)}."
    )


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
    can be made (no file in the way, permission to write). Checked while the arguments are parsed,
    before anything loads or runs, as one line naming the flag."""
    path = str(text)
    if not path.strip():
        raise argparse.ArgumentTypeError("an empty path; pass the folder to write into, e.g. --out runs/eval")
    full = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(full) and not os.path.isdir(full):
        raise argparse.ArgumentTypeError(
            f"{path!r} is a file, not a folder; pass a folder path (it is created), or move the file away"
        )
    parent = os.path.dirname(full)
    while not os.path.exists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(
            f"{path!r} cannot be made: {parent!r} is a file, not a folder; pass a folder path elsewhere"
        )
    if not os.path.isdir(full) and not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(
            f"{path!r} cannot be made: no permission to write in {parent!r}; pass a folder you can write to"
        )
    return path


def check_data_dir(data_dir):
    """--data-dir, when given, must be an existing folder (tensorflow-datasets' data directory) or
    a remote URL such as gs://bucket/tensorflow_datasets, which tensorflow-datasets reads itself
    (as `finetune` does; whether it holds the data is known when it is read)."""
    if data_dir is not None and re.match(r"[A-Za-z][A-Za-z0-9+.-]*://.", str(data_dir)):
        return
    if data_dir is not None and not os.path.isdir(os.path.expanduser(data_dir)):
        what = "is a file" if os.path.exists(os.path.expanduser(data_dir)) else "does not exist"
        raise ValueError(
            f"--data-dir {data_dir} {what}: pass the tensorflow-datasets data directory that holds the prepared data "
            "(`tfds build NAME --data_dir DIR` writes it), or leave the flag out for ~/tensorflow_datasets."
        )


def check_data_args(data, splits, data_dir=None):
    """Refuse, before anything loads, --data and split values that cannot be read: an unknown
    embedded, tfds (of keras_vit's table) or VTAB name, a split such data lacks, a folder that does
    not exist or lacks the split's folder, an ObjectNet path without ObjectNet's class folders.
    `splits`: {flag: split}, e.g. {"--split": "test"}; `data_dir`: --data-dir. Needs neither Keras nor TensorFlow; what
    can only be known by reading the data (a tfds dataset that is not prepared, unreadable images)
    is found when it is read."""
    data = os.fspath(data)
    if data.startswith("tfds:"):
        check_data_dir(data_dir)
    if data.startswith("objectnet:"):
        from keras_vit.evaluation.objectnet import index_objectnet_folder

        path = data[len("objectnet:"):]
        if not path:
            raise ValueError("--data objectnet: needs the ObjectNet folder after the colon, e.g. "
                             "--data objectnet:/data/objectnet-1.0")
        index_objectnet_folder(path, check_files=False)
        return
    from keras_vit.data.embedded import EMBEDDED_DATASETS
    from keras_vit.data.tfds_sources import get_tfds_source

    if data.startswith("tfds:") and not data[len("tfds:"):]:
        raise ValueError("--data tfds: needs a dataset name after the colon, e.g. --data tfds:cifar100")
    if data.startswith("tfds:"):
        get_tfds_source(data[len("tfds:"):])  # an unknown VTAB task is an error that lists the tasks
    elif not (data in EMBEDDED_DATASETS or data.startswith("embedded:") or os.path.isdir(data)):
        what = "is a file" if os.path.exists(data) else "does not exist"
        raise ValueError(
            f"--data {data!r} {what}: pass an image folder (one sub-folder per class), 'tfds:NAME' (a prepared "
            f"tensorflow-datasets dataset) or embedded data ({', '.join(EMBEDDED_DATASETS)})."
        )
    for flag, split in splits.items():
        try:
            _check_split(data, split)
        except ValueError as error:
            raise ValueError(f"{flag} {split!r} of --data {data}: {error}") from None


def _check_split(data, split):
    from keras_vit.data.embedded import parse_split
    from keras_vit.data.folder import _class_folders, resolve_split_folder
    from keras_vit.data.tfds_sources import TFDS_DATASETS

    if data.startswith("tfds:"):
        name = data[len("tfds:"):]
        source = TFDS_DATASETS.get(name)
        if source is not None and split not in source.splits:
            raise ValueError(f"{name!r} has the splits {', '.join(sorted(source.splits))}; pass one of them.")
    elif os.path.isdir(data):
        _, classes_from = resolve_split_folder(data, split)
        if not _class_folders(classes_from):
            raise ValueError(f"the image folder {classes_from!r} has no class sub-folders: put the images under "
                             f"{os.path.join(classes_from, '<class name>', '')}.")
    else:
        part, _ = parse_split(split)
        if part not in ("train", "test"):
            raise ValueError("the embedded data has the splits 'train' and 'test' (and slices of them, e.g. "
                             "'test[:100]'); pass one of them.")


def check_out_is_own(args):
    """Refuse, before anything loads, an --out that holds the run of another command (a finetune
    run's config.json and metrics would be replaced); a folder of the same command is rewritten."""
    saved = read_json_object(os.path.join(args.out, "config.json"), missing={}, malformed={})
    other = saved.get("command")
    if isinstance(other, str) and other != args.command:
        raise ValueError(
            f"--out {args.out} holds a `keras-vit {other}` run; its config.json and metrics would be replaced. Write "
            f"the {args.command} results to another folder, e.g. --out {os.path.join(args.out, args.command)}."
        )


def new_run_folder(path, config):
    """The RunFolder at `path` with `config` saved and the result files of an earlier run there
    removed (metrics.json merges what it is given: stale keys of another run would stay)."""
    from keras_vit.runs import RunFolder

    run = RunFolder(path)
    if run.writes:
        for name in ("metrics.json", "metrics.csv"):
            if os.path.isfile(run.file(name)):
                os.remove(run.file(name))
    run.save_config(config)
    return run


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


def training_api():
    """keras_vit.training, imported when a command runs."""
    from keras_vit import training

    return training


def add_model_args(parser, *, source=True, default_arch=None, square_reason=None,
                   image_size_default="the checkpoint's, or 224"):
    """The model arguments every command shares: --arch, --weights, --preset (with `source`)
    and --image-size (square, or HxW unless `square_reason` says why the command cannot run
    at one; `image_size_default` says what it is when not given). Read them back with
    `load_model(args, ...)`."""
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


def check_distribution_args(args):
    """Refuse impossible --distribute / --coordinator-address / --num-processes / --process-id
    combinations before anything loads (each flag alone is checked by its argparse type)."""
    given = [f for f in ("coordinator_address", "num_processes", "process_id") if getattr(args, f, None) is not None]
    if not getattr(args, "distribute", None):
        if given:
            raise ValueError(f"{_flag(given[0])} describes a job of several processes: add --distribute data.")
        return
    count, index = args.num_processes, args.process_id
    if count is None and given:
        raise ValueError(
            f"{_flag(given[0])} needs --num-processes N too (the three flags go together), or pass none of them on "
            "a TPU pod slice, where the processes find each other."
        )
    if count == 1:
        if args.coordinator_address is not None or index not in (None, 0):
            raise ValueError(
                "--num-processes 1 runs one process on this machine's devices: drop --coordinator-address and "
                "--process-id, or give --num-processes the job's process count."
            )
    elif count is not None:
        missing = [f for f in ("coordinator_address", "process_id") if getattr(args, f) is None]
        if missing:
            raise ValueError(
                f"--num-processes {count} needs {' and '.join(_flag(f) for f in missing)}: the coordinator's "
                "HOST:PORT (process 0's address) and this process's index, the same address in every process."
            )
        if index >= count:
            raise ValueError(
                f"--process-id {index} is not below --num-processes {count}: number the processes 0 to {count - 1}."
            )
    if args.batch_size % (count or 1):
        raise ValueError(
            f"--batch-size {args.batch_size} (the global batch) does not split evenly over --num-processes {count}: "
            f"pass a multiple of {count}."
        )


def start_distribution(args):
    """With --distribute data: join the job's processes and set a data-parallel distribution
    over all their devices (keras_vit.distribution). Returns the process shard for
    keras_vit.data.load_dataset (None in one process), after saying what runs where."""
    if not getattr(args, "distribute", None):
        return None
    import keras

    from keras_vit import distribution

    if keras.backend.backend() != "jax":
        raise ValueError(
            f"--distribute data runs on the JAX backend (keras.distribution); Keras runs on "
            f"{keras.backend.backend()!r} here. Set KERAS_BACKEND=jax, or leave out --distribute."
        )
    count = args.num_processes
    if count != 1 and (count or args.coordinator_address):
        timeout = getattr(args, "join_timeout", distribution.JOIN_TIMEOUT)
        print(f"process {args.process_id}: waiting up to {timeout:g} s for the job's {count or ''} processes to join at "
              f"the coordinator {args.coordinator_address or '(from the environment)'}".replace("  ", " "), flush=True)
    try:
        distribution.join_processes(args.coordinator_address, args.num_processes, args.process_id,
                                    timeout=getattr(args, "join_timeout", distribution.JOIN_TIMEOUT),
                                    program=f"keras-vit {args.command}")
    except distribution.NoJobFoundError:
        raise ValueError(
            "--distribute data found no job of several processes in the environment (a Cloud TPU pod slice, SLURM, "
            "Open MPI, KERAS_DISTRIBUTION_JOB_ADDRESSES): pass --coordinator-address HOST:PORT --num-processes N "
            "--process-id I in every process, or --num-processes 1 for this machine's devices alone."
        ) from None
    data_parallel = distribution.data_parallel()
    devices = int(data_parallel.device_mesh.devices.size)
    processes = distribution.process_count()
    if args.batch_size % devices:
        raise ValueError(
            f"--batch-size {args.batch_size} (the global batch) does not split evenly over the {devices} devices of "
            f"--distribute data ({processes} process{'es' if processes > 1 else ''}): pass a multiple of {devices}."
        )
    keras.distribution.set_distribution(data_parallel)
    print(f"data-parallel over {devices} devices in {processes} process{'es' if processes > 1 else ''} (this is "
          f"process {distribution.process_index()}): each process reads {args.batch_size // processes} of every "
          f"{args.batch_size} examples of a batch")
    return distribution.process_shard()


def _load_json_arch(text):
    if os.path.isfile(text):
        with open(text) as f:
            return json.load(f)
    return json.loads(text)


def _is_json_arch(arch):
    text = arch.strip()
    return text.startswith("{") or text.endswith(".json")


def constructor(name):
    """The keras_vit constructor called `name` (ViTB16, R50ViTB16, ...)."""
    import difflib

    from keras_vit.applications import ALL_CONSTRUCTORS as CONSTRUCTORS

    if name not in CONSTRUCTORS:
        close = difflib.get_close_matches(name, list(CONSTRUCTORS), n=3)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(
            f"Unknown --arch {name!r}.{hint} Choose a constructor ({', '.join(CONSTRUCTORS)}) or pass "
            "VisionTransformer arguments as JSON."
        )
    return CONSTRUCTORS[name]


def weights_argument(args):
    """--preset or --weights (as `resolve_weights` resolved them, once it has), None for 'none'
    (or neither)."""
    resolved = getattr(args, "_resolved_weights", None)
    if resolved is not None:
        return resolved
    weights = getattr(args, "preset", None) or getattr(args, "weights", None)
    if isinstance(weights, str) and weights.strip().lower() == "none":
        return None
    return weights


def resolve_weights(args, *, image_size=None):
    """Resolve --weights / --preset to local files (downloading them if needed) before a Keras
    backend loads: keras_vit.loading needs none, so a missing file, an unknown preset or a
    download that cannot happen offline fails in a fraction of a second. `load_model` and
    `load_as_is` then build the model from these files; `image_size` must be the one they get
    (it picks the 224 or 384 repository). Returns the `keras_vit.loading.ResolvedWeights`, or
    None for --weights none."""
    weights = weights_argument(args)
    if weights is None:
        return None
    from keras_vit import loading

    arch = getattr(args, "arch", None)
    architecture = arch.strip() if arch and not _is_json_arch(arch) else None
    args._resolved_weights = loading.resolve(weights, architecture=architecture, image_size=image_size)
    return args._resolved_weights


def weights_id(args):
    """What the weights of a run are, wherever it is read from: the preset's name, hf://owner/repo
    (@ the commit downloaded), or the absolute path of a local checkpoint; None for --weights none.
    `keras-vit report` gives runs of the same weights one column."""
    resolved = getattr(args, "_resolved_weights", None)
    if resolved is None:
        return None
    if resolved.preset is not None:
        return resolved.preset.name
    if resolved.repo:
        return f"hf://{resolved.repo}" + (f"@{resolved.commit}" if resolved.commit else "")
    return os.path.realpath(resolved.path)


def run_config(args, **extra):
    """The arguments of a run as its config.json records them (as typed, with `extra`), and the
    weights it ran (`weights_id`)."""
    config = {k: v for k, v in vars(args).items() if not k.startswith("_")}
    return dict(config, func=None, weights_id=weights_id(args), **extra)


def default_warmup(steps):
    """finetune's warm-up when --warmup is not given."""
    return min(500, steps // 5)


def check_training_args(args):
    """Refuse finetune's impossible flag combinations before anything loads (each flag alone is
    checked by its argparse type)."""
    if args.warmup is not None and args.warmup >= args.steps:
        raise ValueError(
            f"--warmup {args.warmup} must be smaller than --steps {args.steps}: pass a --warmup below {args.steps}, "
            "omit it (default: min(500, steps // 5)), or train more --steps."
        )


#: Arguments that do not change what a resumed run computes.
#: How many processes compute a step does not change what it computes (the global batch is the same).
_RESUME_IGNORES = ("command", "func", "out", "resume", "verbose", "data_dir", "distribute", "coordinator_address",
                   "num_processes", "process_id", "join_timeout", "weights_id")
#: The recorded settings that the command works out when a flag is not given.
_RESUME_DERIVED = {"image_size", "classes"}


def _flag(key):
    return {"train_examples": "the training examples", "eval_examples": "the evaluation examples"}.get(
        key, "--" + key.replace("_", "-"))


def _shown(key, value):
    if isinstance(value, bool):
        return "given" if value else "not given"
    if key == "image_size" and isinstance(value, list) and len(value) == 2:
        return format_image_size(value)
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "not given" if value is None else str(value)


def check_resume(args, config=None):
    """With --resume, refuse to continue a run folder that was started with other arguments.

    Without `config`, before anything loads: the arguments as typed (with finetune's warm-up
    worked out), except --image-size and --classes when they are not given now (the run
    records the values it derived). With `config` (what the run is about to record, once the
    model and the data are known): every recorded setting."""
    if not getattr(args, "resume", False):
        return
    path = os.path.join(args.out, "config.json")
    saved = read_json_object(path, missing=None, malformed=None)
    if saved is None:
        return  # nothing recorded to resume from: a new run
    if config is None:
        config = run_config(args, warmup=args.warmup if args.warmup is not None else default_warmup(args.steps))
        config = {k: v for k, v in config.items() if not (k in _RESUME_DERIVED and v is None)}
        if config.get("image_size") is not None:
            config["image_size"] = list(image_hw(config["image_size"]))
    now = json.loads(json.dumps({k: v for k, v in config.items() if k not in _RESUME_IGNORES}, default=str))
    changed = [k for k in sorted(now) if k in saved and saved[k] != now[k]]
    if changed:
        differences = ", ".join(f"{_flag(k)} {_shown(k, saved[k])} (now {_shown(k, now[k])})" for k in changed)
        raise ValueError(
            f"--resume: {args.out} holds a run started with other arguments: {differences}. Resume it with the "
            f"arguments it was started with (its config.json), or start a new run in another --out folder "
            f"(or delete {args.out} first)."
        )


def check_model_args(args, *, needs_weights=False, default_arch=None, default_image_size=None):
    """Refuse impossible --weights / --preset / --arch combinations, and an --image-size the model
    cannot take (`default_image_size`: the size the command runs at without the flag), before
    anything loads."""
    if getattr(args, "preset", None) and getattr(args, "weights", None):
        raise ValueError("Pass either --preset or --weights, not both (--weights takes preset names too).")
    weights, arch = weights_argument(args), getattr(args, "arch", None) or default_arch
    if weights is None and needs_weights:
        raise ValueError(
            f"{args.command} needs trained weights: --weights PATH (a .keras file, run folder or checkpoint), "
            "--weights hf://owner/repo, or --preset NAME."
        )
    if weights is None and not arch:
        raise ValueError(
            "Say which model: --arch NAME with --weights none (random initialisation) or a preset tag, "
            "--weights PATH (a checkpoint or run folder), or --preset NAME."
        )
    if arch and not _is_json_arch(arch):
        from keras_vit.models.family import constructor_names  # the tables only: no Keras

        names = constructor_names()
        if arch.strip() not in names:
            import difflib

            close = difflib.get_close_matches(arch.strip(), names, n=3)
            hint = f" Did you mean {' or '.join(close)}?" if close else ""
            raise ValueError(
                f"Unknown --arch {arch!r}.{hint} Choose a constructor ({', '.join(names)}) or pass "
                "a model's arguments as JSON."
            )
    if weights is not None and arch and _is_json_arch(arch):
        from keras_vit.models.family import default_family

        raise ValueError(
            "--arch as JSON describes a randomly initialised model: use it with --weights none, or name a "
            f"constructor (e.g. --arch {default_family().default_constructor()}) to load weights."
        )
    # The default --arch builds the model only without weights; with them, the weights name it.
    size = getattr(args, "image_size", None)
    check_image_size(size if size is not None else default_image_size, default=size is None,
                     arch=getattr(args, "arch", None) or (default_arch if weights is None else None), weights=weights)


def load_model(args, *, image_size=None, include_top=True, classes=None, pooling=None, fresh_classes=1000):
    """The model named by --weights / --preset / --arch, through the public loading API.

    With weights: `keras_vit.<Arch>(weights=...)` when --arch names a constructor (a tag or
    alias is then that architecture's), else `keras_vit.load_checkpoint(...)`. Without
    (`--weights none`): a randomly initialised --arch with `fresh_classes` outputs.
    `image_size` (int or (height, width)) resizes the position embeddings; None keeps the
    checkpoint's.
    """
    from keras_vit.loading import load_checkpoint  # keras_vit.load_checkpoint, without data/training

    check_model_args(args)
    weights = weights_argument(args)
    arch = getattr(args, "arch", None)
    if weights is None:
        return build_fresh_model(arch, image_size or 224, fresh_classes)
    if arch:
        shape = None if image_size is None else (*image_hw(image_size), 3)
        kwargs = {} if classes is None else {"classes": classes}
        return constructor(arch)(weights=weights, input_shape=shape, include_top=include_top, pooling=pooling,
                                 **kwargs)
    return load_checkpoint(weights, image_size=image_size, include_top=include_top, classes=classes,
                                     pooling=pooling)


def load_as_is(args, *, image_size=None):
    """The model as its checkpoint holds it: with its head when it has one, else its features
    (pooled as its classifier pools them); --arch, when given, must be the checkpoint's. With
    --weights none, a randomly initialised --arch."""
    from keras_vit import loading

    check_model_args(args)
    weights = weights_argument(args)
    if weights is None:  # --weights none: a randomly initialised --arch
        return load_model(args, image_size=image_size)
    return loading.load(weights, architecture=getattr(args, "arch", None) or None, image_size=image_size,
                        include_top=None)


def build_fresh_model(arch, image_size, classes):
    """A randomly initialised model of `arch` (constructor name or JSON) at `image_size` (int
    or (height, width))."""
    from keras_vit.models.family import default_family, family_of

    if _is_json_arch(arch):
        try:
            config = dict(_load_json_arch(arch.strip()))
        except (OSError, ValueError) as error:
            raise ValueError(f"--arch {arch!r} is neither a constructor name nor valid JSON: {error}") from None
        config.update(image_size=image_size, classes=classes)
        try:
            family = family_of(config)  # JSON of any family's arguments
        except ValueError:
            family = default_family()  # its model's own error names what is missing
        return family.build(**config)
    return constructor(arch.strip())(weights=None, input_shape=(*image_hw(image_size), 3), classes=classes)


def model_for_task(args, image_size, classes, data_size=None):
    """The model to fine-tune: --weights/--preset re-made by for_finetuning (resized to
    `image_size`, a zero head of `classes`), or a fresh --arch model. Without `image_size`, the
    family's fine-tuning resolution for images of `data_size` (height, width), else the
    checkpoint's."""
    from keras_vit.models.family import family_of

    if weights_argument(args) is None:
        return load_model(args, image_size=image_size, fresh_classes=classes), None
    base = load_model(args, include_top=False)  # for_finetuning attaches the new head
    if image_size is None:
        image_size = family_of(base).transfer.default_resolution(base.get_config(), data_size)
    image_size = image_size or tuple(base.image_size)
    return training_api().for_finetuning(base, image_size=image_size, classes=classes), base


def load_trained_model(args):
    """The model to evaluate as it is (its own head): --weights / --preset."""
    check_model_args(args, needs_weights=True)
    return load_model(args)
