"""The commands' checks before anything loads: each refuses, in one line naming the flags and the
fix, what cannot work (a combination of model arguments, an image size the model cannot take,
data or splits that cannot be read, impossible training or distribution flags, a resumed run
started with other arguments). They read the architecture and preset tables and the file
system, never a checkpoint, and import no Keras."""

import os
import re

from keras_vit.commands.arguments import default_warmup, format_image_size, image_hw
from keras_vit.commands.resolution import is_json_arch, model_description, run_config, weights_argument
from keras_vit.runs import RunFolder, setting_name


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
    described = model_description(arch, weights)
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
    if arch and not is_json_arch(arch):
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
    if weights is not None and arch and is_json_arch(arch):
        from keras_vit.models.family import default_family

        raise ValueError(
            "--arch as JSON describes a randomly initialised model: use it with --weights none, or name a "
            f"constructor (e.g. --arch {default_family().default_constructor()}) to load weights."
        )
    # The default --arch builds the model only without weights; with them, the weights name it.
    size = getattr(args, "image_size", None)
    check_image_size(size if size is not None else default_image_size, default=size is None,
                     arch=getattr(args, "arch", None) or (default_arch if weights is None else None), weights=weights)


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


def check_training_args(args):
    """Refuse finetune's impossible flag combinations before anything loads (each flag alone is
    checked by its argparse type)."""
    if args.warmup is not None and args.warmup >= args.steps:
        raise ValueError(
            f"--warmup {args.warmup} must be smaller than --steps {args.steps}: pass a --warmup below {args.steps}, "
            "omit it (default: min(500, steps // 5)), or train more --steps."
        )


def check_distribution_args(args):
    """Refuse impossible --distribute / --coordinator-address / --num-processes / --process-id
    combinations before anything loads (each flag alone is checked by its argparse type)."""
    given = [f for f in ("coordinator_address", "num_processes", "process_id") if getattr(args, f, None) is not None]
    if not getattr(args, "distribute", None):
        if given:
            raise ValueError(f"{setting_name(given[0])} describes a job of several processes: add --distribute data.")
        return
    count, index = args.num_processes, args.process_id
    if count is None and given:
        raise ValueError(
            f"{setting_name(given[0])} needs --num-processes N too (the three flags go together), or pass none of them on "
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
                f"--num-processes {count} needs {' and '.join(setting_name(f) for f in missing)}: the coordinator's "
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


#: The recorded settings that the command works out when a flag is not given.
_RESUME_DERIVED = {"image_size", "classes"}


def check_resume(args, config=None):
    """With --resume, refuse to continue a run folder that was started with other arguments
    (`RunFolder.check_resume`).

    Without `config`, before anything loads: the arguments as typed (with finetune's warm-up
    worked out), except --image-size and --classes when they are not given now (the run
    records the values it derived). With `config` (what the run is about to record, once the
    model and the data are known): every recorded setting."""
    if not getattr(args, "resume", False):
        return
    if config is None:
        config = run_config(args, warmup=args.warmup if args.warmup is not None else default_warmup(args.steps))
        config = {k: v for k, v in config.items() if not (k in _RESUME_DERIVED and v is None)}
        if config.get("image_size") is not None:
            config["image_size"] = list(image_hw(config["image_size"]))
    RunFolder.check_resume(args.out, config)
