"""Which model the commands' arguments name, and the model itself: --arch / --weights / --preset
read from the architecture and preset tables (nothing built), the weights resolved before a
backend loads (`keras_vit.loading`, the one resolver), and the model loaded through the public
loading API. The checks before loading are `keras_vit.commands.checks`'."""

import json
import os

from keras_vit.commands.arguments import image_hw


def model_description(arch=None, weights=None):
    """(what, family, config) of the model that --arch / --weights / --preset / SOURCE name, read
    from the architecture and preset tables without building anything; None when only reading
    the checkpoint could tell (a file, a folder, hf://owner/repo) or the name is unknown (the
    loading path then names the problem)."""
    from keras_vit.models.family import all_architectures, default_family, family_of

    if isinstance(arch, str) and arch.strip():
        arch = arch.strip()
        if is_json_arch(arch):
            try:
                config = dict(load_json_arch(arch))
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


def load_json_arch(text):
    """The model arguments of an --arch JSON value: inline JSON, or a .json file's."""
    if os.path.isfile(text):
        with open(text) as f:
            return json.load(f)
    return json.loads(text)


def is_json_arch(arch):
    """Whether --arch holds model arguments as JSON (inline or a .json file), not a constructor name."""
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
    architecture = arch.strip() if arch and not is_json_arch(arch) else None
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


def load_model(args, *, image_size=None, include_top=True, classes=None, pooling=None, fresh_classes=1000):
    """The model named by --weights / --preset / --arch (checked by `checks.check_model_args`
    before), through the public loading API.

    With weights: `keras_vit.<Arch>(weights=...)` when --arch names a constructor (a tag or
    alias is then that architecture's), else `keras_vit.load_checkpoint(...)`. Without
    (`--weights none`): a randomly initialised --arch with `fresh_classes` outputs.
    `image_size` (int or (height, width)) resizes the position embeddings; None keeps the
    checkpoint's.
    """
    from keras_vit.loading import load_checkpoint  # keras_vit.load_checkpoint, without data/training

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

    weights = weights_argument(args)
    if weights is None:  # --weights none: a randomly initialised --arch
        return load_model(args, image_size=image_size)
    return loading.load(weights, architecture=getattr(args, "arch", None) or None, image_size=image_size,
                        include_top=None)


def build_fresh_model(arch, image_size, classes):
    """A randomly initialised model of `arch` (constructor name or JSON) at `image_size` (int
    or (height, width))."""
    from keras_vit.models.family import default_family, family_of

    if is_json_arch(arch):
        try:
            config = dict(load_json_arch(arch.strip()))
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
    image_size = image_size or base.image_size
    from keras_vit.training import for_finetuning

    return for_finetuning(base, image_size=image_size, classes=classes), base


def load_trained_model(args):
    """The model to evaluate as it is (its own head): --weights / --preset (checked by
    `checks.check_model_args(args, needs_weights=True)` before)."""
    return load_model(args)
