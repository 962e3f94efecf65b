"""Naming and loading: what a `weights=` value means, and the one way a model is loaded.

Every entry point (the constructors' `weights=`, `load_checkpoint`, every CLI command,
`training.for_finetuning`, weights/publish.py) goes through `resolve` and `load` here; `describe`
is the decision `resolve` starts from (what kind of value it is, which preset row), which the CLI
also asks before anything loads:

    resolved = resolve("ViTB16.augreg2_in21k_ft_in1k")   # -> local files, their format, the preset
    model = load("hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", image_size=384)

Layering, bottom up: keras_vit.hub (downloads, verification) <- keras_vit.checkpoints (one
module per format, in a registry) <- this module <- constructors, CLI, training.

A load builds the model once, without random initialisation, and streams the weights from the
file (lazily, one tensor at a time) into its variables; nothing is converted or cached besides
huggingface_hub's own copy of the downloaded files.
"""

import contextlib
import dataclasses
import os
import warnings
from typing import Optional

from keras_vit import hub, names, presets
from keras_vit.checkpoints.registry import CheckpointFormat, detect_format, hub_fallback_patterns, hub_file_patterns
from keras_vit.errors import CheckpointError
from keras_vit.geometry import as_pair

#: File endings that make a string a path rather than a name.
_PATH_ENDINGS = (".npz", ".keras", ".h5", ".safetensors", ".json")
#: The model arguments a load decides itself (the rest of a checkpoint's config is its own).
_HEAD_ARGS = ("include_top", "classes", "pooling", "classifier_activation")


# === Resolution ===


@dataclasses.dataclass(frozen=True)
class ResolvedWeights:
    """Where a weights source lives locally and what is known about it.

    Attributes:
        source: the value the user passed.
        path: the local checkpoint file or folder.
        format: its `CheckpointFormat`.
        preset: the preset-table row it came from, if any.
        repo, revision, commit: the Hub repository it was downloaded from, if any.
    """

    source: str
    path: str
    format: CheckpointFormat
    preset: Optional[presets.Preset] = None
    repo: Optional[str] = None
    revision: Optional[str] = None
    commit: Optional[str] = None


def _run_folder_model(path):
    # A training run folder (keras-vit finetune --out DIR) holds its model as model.keras.
    candidate = os.path.join(path, "model.keras")
    return candidate if os.path.isdir(path) and os.path.isfile(candidate) else path


def _looks_like_path(source):
    return (
        os.sep in source
        or (os.altsep and os.altsep in source)
        or source.startswith((".", "~"))
        or source.endswith(_PATH_ENDINGS)
    )


def _unknown_name_error(source, architecture):
    if architecture is not None:
        # find_preset names the valid tags and the closest matches.
        presets.find_preset(architecture, source)
    close = presets.suggest(source)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ValueError(
        f"{source!r} is neither an existing path, nor 'hf://owner/repo', nor a preset name.{hint} "
        "Preset names are '<Constructor>.<tag>' (e.g. 'ViTB16.augreg2_in21k_ft_in1k', 'ViTB16.imagenet') or "
        "timm names ('vit_base_patch16_224.augreg2_in21k_ft_in1k'); see keras_vit.list_presets()."
    )


def _fetch_preset(preset, source, what):
    folder, commit = hub.fetch(
        preset.repo,
        preset.revision,
        sha256=preset.sha256,
        weights_file=preset.weights_file,
        what=what,
        allow_patterns=hub_file_patterns(),
        fallback_patterns=hub_fallback_patterns(),
    )
    return ResolvedWeights(source, folder, detect_format(folder), preset, preset.repo, preset.revision, commit)


@dataclasses.dataclass(frozen=True)
class Description:
    """What a weights value names, told from the names and the preset table alone (nothing is
    downloaded and no checkpoint is read).

    Attributes:
        source: the value the user passed.
        kind: "resolved" (an already `ResolvedWeights`), "path" (an existing local file or folder:
            its checkpoint tells the model), "hub" ("hf://owner/repo[@revision]": its files tell),
            "preset" (a row of the preset table), "missing" (a path that does not exist) or
            "unknown" (no preset of that name).
        preset: the preset row, for kind "preset".
        what: how errors and download messages name the weights.
    """

    source: object
    kind: str
    preset: Optional[presets.Preset] = None
    what: str = ""


def describe(source, *, architecture=None, image_size=None):
    """What the weights value `source` means (with `architecture`, the constructor name its tags
    and aliases refer to; `image_size` picks the 224 or 384 repository), without downloading or
    reading anything: the one decision that `resolve` and the CLI's checks before loading share.

    Raises:
        TypeError for a value that is no path or name; ValueError (keras_vit.names'
        InvalidNameError) for a name that cannot be one, and for a tag `architecture` does not have.

    Example:
        >>> describe("ViTTi16.augreg_in21k").preset.repo
        'timm/vit_tiny_patch16_224.augreg_in21k'
        >>> describe("hf://timm/vit_tiny_patch16_224.augreg_in21k").kind
        'hub'
    """
    if isinstance(source, ResolvedWeights):
        return Description(source, "resolved", source.preset, source.source)
    if isinstance(source, presets.Preset):
        return Description(source, "preset", source, source.name)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"weights must be None, a path or a string; got {type(source).__name__}.")
    source = os.fspath(source)
    if os.path.exists(source):
        return Description(source, "path", what=source)
    if source.startswith("hf://"):
        return Description(source, "hub", what=source)
    if _looks_like_path(source):
        return Description(source, "missing", what=source)
    names.check_name(source, "weights name")
    if architecture is not None and "." not in source:
        preset = presets.find_preset(architecture, source, image_size)
        return Description(source, "preset", preset, f"weights={source!r} of {architecture}")
    preset = presets.preset_by_name(source, image_size)
    return Description(source, "unknown" if preset is None else "preset", preset, source)


def resolve(source, *, architecture=None, image_size=None):
    """Resolve any way of naming weights to local files: the one place that decides what a
    `weights=` value means.

    Args:
        source: a local file or folder (.npz, .safetensors, .keras, .weights.h5, a timm /
            transformers / Keras preset folder, a training run folder), "hf://owner/repo[@revision]",
            a `presets.Preset` row, an already `ResolvedWeights`, a preset name ("ViTB16.augreg_in21k", a timm name "vit_base_patch16_224.augreg_in21k"),
            or, with `architecture`, one of its tags or the aliases "imagenet" / "imagenet21k".
        architecture: a constructor name ("ViTB16") that tags and aliases refer to.
        image_size: the resolution the model will run at: picks the 224 or 384 repository.

    Returns:
        A `ResolvedWeights` (downloads and verifies Hub files first; see keras_vit.hub.fetch).

    Raises:
        FileNotFoundError for a path that does not exist; ValueError for an unknown name (with
        the closest valid ones); keras_vit.hub.HubError subclasses for Hub failures (offline
        without a cache, missing repository, corrupt download); CheckpointError for a file of
        no known format.

    Example:
        >>> resolve("ViTTi16.augreg_in21k", image_size=224).preset.repo   # doctest: +SKIP
        'timm/vit_tiny_patch16_224.augreg_in21k'
    """
    described = describe(source, architecture=architecture, image_size=image_size)
    source = described.source
    if described.kind == "resolved":
        return source
    if described.kind == "path":
        path = _run_folder_model(source)
        return ResolvedWeights(source, path, detect_format(path))
    if described.kind == "hub":
        repo, revision = hub.parse_hf_handle(source)
        folder, commit = hub.fetch(repo, revision, what=source, allow_patterns=hub_file_patterns(),
                                   fallback_patterns=hub_fallback_patterns())
        return ResolvedWeights(source, folder, detect_format(folder), None, repo, revision, commit)
    if described.kind == "missing":
        raise FileNotFoundError(
            f"No checkpoint at {source!r}. Pass an existing checkpoint file or folder, 'hf://owner/repo' or a preset "
            "name (keras_vit.list_presets()); or weights=None for a randomly initialised model."
        )
    if described.kind == "unknown":
        raise _unknown_name_error(source, architecture)
    preset = described.preset
    if source == "imagenet" and architecture is not None and preset.classes != 1000:
        warnings.warn(
            f"No ImageNet-1k fine-tuned weights are published for {architecture}; weights='imagenet' loads "
            f"{preset.tag!r} (pre-trained on ImageNet-21k) instead.",
            stacklevel=4,
        )
    name = preset.name if isinstance(source, presets.Preset) else source
    return _fetch_preset(preset, name, described.what)


# === The head policy ===


@dataclasses.dataclass(frozen=True)
class HeadPlan:
    """What a load does with the checkpoint's head: the model arguments it decides, and which
    weights of the checkpoint are skipped or may be missing."""

    model_args: dict
    skip: tuple
    allow_missing: tuple


def plan_head(config, *, include_top=True, classes=None, pooling=None, keep_representation=True, fresh_head=False,
              source=None, warn=True, head="head/", features_pooling=None):
    """The one head policy of every load.

    - include_top=None: the model as the checkpoint is: its head when it has one, otherwise
      its features pooled as its classifier pools them (through `pre_logits` if it has one).
    - include_top=False: no head (`pooling` as usual; `pre_logits` kept when pooling is set).
    - include_top=True, `classes` None or equal to the checkpoint's: the trained head is kept.
    - include_top=True, other `classes` (or a checkpoint without a head): a fresh
      zero-initialised head (the paper's fine-tuning recipe). Discarding a trained head warns
      (unless `warn=False`): pass the checkpoint's classes to keep it.
    - fresh_head=True: a fresh head whatever the classes (training.for_finetuning).
    - keep_representation=False drops `pre_logits` (the paper drops it for fine-tuning).
    `head` is the prefix of the head's weights in the tree (or a tuple of prefixes: every head,
    e.g. DeiT's `head/` and `head_dist/`); `features_pooling` how a headless
    model is pooled "as it is" (default: its classifier's pooling).
    """
    ckpt_classes = config.get("classes")
    what = f" {source!r}" if source else ""
    if include_top is None:
        include_top = ckpt_classes is not None
        if not include_top and pooling is None:
            pooling = features_pooling or config.get("classifier", "token")
            pooling = None if pooling == "none" else pooling  # no pooling: the token sequence
    skip, allow_missing = [], []
    heads = (head,) if isinstance(head, str) else tuple(head)
    if include_top:
        if classes is None:
            if ckpt_classes is None:
                raise ValueError(
                    f"The checkpoint{what} has no classification head. Pass classes=N to attach a fresh one "
                    "(zero-initialised, to be fine-tuned), or include_top=False for features."
                )
            classes = ckpt_classes
        if fresh_head or classes != ckpt_classes:
            if ckpt_classes and warn and classes != ckpt_classes:
                warnings.warn(
                    f"The checkpoint{what} has a trained {ckpt_classes}-class head; classes={classes} attaches a "
                    f"fresh zero-initialised {classes}-class head instead (to be fine-tuned). Pass "
                    f"classes={ckpt_classes} to keep the trained head.",
                    stacklevel=5,
                )
            skip.extend(heads)
            allow_missing.extend(heads)
    else:
        skip.extend(heads)
    args = dict(include_top=bool(include_top), classes=int(classes or ckpt_classes or 1000), pooling=pooling)
    if not keep_representation and "representation_size" in config:
        args["representation_size"] = None
        skip.append("pre_logits/")
    return HeadPlan(args, tuple(skip), tuple(allow_missing))


# === Loading ===


def _describe(config):
    from keras_vit.models.family import family_of

    try:
        family = family_of(config)
    except ValueError:
        return "another model family"
    return family.description(config)


def _comparable(value):
    if isinstance(value, (list, tuple)):
        return tuple(_comparable(v) for v in value)
    return value


def check_architecture(architecture, config, source):
    """Raise a ValueError when the checkpoint `config` is not the architecture-table row
    `architecture` (a row of any family's table)."""
    from keras_vit.models.family import family_of

    family = family_of(architecture)
    # Every config field the row states (one the row leaves None too). A row with a `variant`
    # (timm's zoo: layer scale, registers, numerics, ...) states the whole architecture: every
    # checkpoint field but the size and the head, the config class's default where neither the row
    # nor the checkpoint config (which leaves defaults out) names it.
    fields = [f.name for f in dataclasses.fields(architecture) if f.name in family.config_class.fields()]
    expected = {k: _comparable(getattr(architecture, k)) for k in fields}
    defaults = {f.name: f.default for f in dataclasses.fields(family.config_class)}
    if getattr(architecture, "variant", ()):
        stated = architecture.kwargs()
        expected.update({k: _comparable(stated.get(k, defaults[k])) for k in family.checkpoint_fields
                         if k not in ("image_size", "classes")})
    got = {k: _comparable(config.get(k, defaults.get(k))) for k in expected}
    try:
        same_family = family_of(config) is family
    except ValueError:
        same_family = False
    if got != expected or not same_family:
        raise ValueError(
            f"weights={source!r} hold a different architecture ({_describe(config)}) than {architecture.name} "
            f"({family.description(dict(architecture.kwargs()))}). Use the matching constructor, or keras_vit.load_checkpoint(), "
            "which builds whatever architecture the checkpoint holds."
        )


def _architecture_mismatch(architecture, resolved):
    """The ValueError of `check_architecture` for the checkpoint as read at its own size, or None
    (also when it cannot be read at its own size either: its own error then stands)."""
    if resolved.format.read_sized is None:
        return None
    try:
        _, config = resolved.format.read_at(resolved.path)
        check_architecture(architecture, config, resolved.source)
    except CheckpointError:
        return None
    except ValueError as err:
        return err
    return None


#: The pixel resize a load at another patch size inverts: timm's `resample_patch_embed` default.
PATCH_RESIZE_RULE = "bicubic_antialias"


def _patch_resize(config, patch_size, image_size, source, rule=None):
    """The rule to PI-resize the checkpoint's patch embedding with (`rule`, by default timm's), or
    None when `patch_size` is the checkpoint's own; raises a ValueError for what cannot be resized."""
    if patch_size is None or patch_size == config.get("patch_size"):
        return None
    from keras_vit.models.family import family_of

    what = f" {source!r}" if source else ""
    family = family_of(config)
    if not family.patch_resize:
        raise ValueError(f"patch_size= applies to Vision Transformers; the checkpoint{what} is {_describe(config)}.")
    if isinstance(patch_size, bool) or not isinstance(patch_size, int) and not hasattr(patch_size, "__index__"):
        raise ValueError(
            f"patch_size must be a positive int (keras_vit models use square patches); got {patch_size!r}. "
            "keras_vit.resize_patch_embedding resizes a kernel to non-square patches."
        )
    if int(patch_size) < 1:
        raise ValueError(f"patch_size must be a positive int; got {patch_size!r}.")
    refusal = family.patch_resize_refused(config)
    if refusal is not None:
        raise ValueError(f"The checkpoint{what} {refusal}")
    stride = int(patch_size)
    size = image_size if image_size is not None else config.get("image_size")
    size = as_pair(size)
    if any(s % stride for s in size):
        options = sorted({max(s // stride, 1) * stride for s in size} | {(s // stride + 1) * stride for s in size})
        whose = "" if image_size is not None else " (the checkpoint's)"
        raise ValueError(
            f"patch_size={stride} does not divide the image size {size[0]}x{size[1]}{whose}. "
            f"Pass an image_size that it divides as well, e.g. image_size={options[0]} or {options[-1]}."
        )
    return rule or PATCH_RESIZE_RULE


@contextlib.contextmanager
def _deferred_variables():
    """A `keras.StatelessScope` whose variables are initialised when it ends: those it created,
    and only those.

    Keras keeps every variable created in a stateless scope on one process-wide list and, when
    the outermost scope ends, initialises the whole list and only then empties it. A value that
    fails as it is read (a NaN found in a lazily read tensor, a file truncated under the load)
    would leave the list full of this build's variables, some initialised, and every later build
    in the process would fail on them ("Variable ... is already initialized"). Here the variables
    this build created are taken off the list whatever happens, and variables that others left
    there (a `keras.StatelessScope(initialize_variables=False)` of the caller's) are not touched.
    """
    import keras
    from keras.src.backend.common import global_state

    def pending():
        return global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)

    before = {id(v) for v in pending()}
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
        for variable in [v for v in pending() if id(v) not in before]:
            if variable._value is None:
                variable._deferred_initialize()
    finally:  # the list as it was before this build
        global_state.set_global_attribute("uninitialized_variables", [v for v in pending() if id(v) in before])


def build_from_checkpoint(tree, config, *, image_size=None, include_top=True, classes=None, pooling=None,
                          classifier_activation=None, keep_representation=True, fresh_head=False, source=None,
                          warn=True, patch_resize_rule=None, **overrides):
    """Build the model a checkpoint's (tree, config) describes, once and without random
    initialisation, and stream the weights into it.

    Args:
        tree, config: what a format's `read_at` returns (lazy trees are read one tensor at a time;
            the config object, or a checkpoint config dict, which is made one).
        image_size: int or (height, width); position embeddings are resized from the
            checkpoint's grid with the source's rule.
        include_top, classes, pooling, keep_representation: the head policy (`plan_head`).
        classifier_activation: activation of the head; None returns logits.
        **overrides: other VisionTransformer arguments (dropout_rate, dtype, name, ...).
            `patch_size` other than the checkpoint's runs the weights at that patch size: the
            patch-embedding kernel is PI-resized (`keras_vit.resize_patch_embedding`, timm's
            bicubic antialiased rule) and the position embeddings follow the new grid.
        patch_resize_rule: the pixel resize that PI-resize inverts (`layers.resize.PATCH_RESIZE_RULES`);
            default timm's "bicubic_antialias" (`load` passes the source format's own).

    Raises:
        WeightTreeError when the tree does not fit (nothing is assigned then).
    """
    import keras

    from keras_vit.layers.init_scope import skip_random_init
    from keras_vit.models.family import family_of
    from keras_vit.models.weight_tree import WeightTreeError, set_weight_tree, weight_variables

    family = family_of(config)
    config = family.config_object(config)  # a reader's config object, or a checkpoint config dict
    patch_resize = _patch_resize(config, overrides.get("patch_size"), image_size, source, patch_resize_rule)
    # A classifier named by the caller (big_vision's "0" and "none" look like "gap" in the file)
    # also decides how a headless model is pooled.
    head_config = dict(config, **{k: v for k, v in overrides.items() if k == "classifier"})
    plan = plan_head(head_config, include_top=include_top, classes=classes, pooling=pooling,
                     keep_representation=keep_representation, fresh_head=fresh_head, source=source, warn=warn,
                     head=family.head_prefixes, features_pooling=family.features_pooling)
    kwargs = dict(config)
    kwargs.update(plan.model_args, classifier_activation=classifier_activation)
    if image_size is not None:
        kwargs["image_size"] = image_size
    kwargs.update(overrides)
    # Variables are created uninitialised (`_deferred_variables`); set_weight_tree makes each
    # checkpoint tensor its variable's initial value, read from the file when the scope ends, one
    # at a time. A fresh head starts at zero; nothing random is drawn.
    with skip_random_init(), _deferred_variables():
        model = family.model_class()(**kwargs)
        if hasattr(tree, "bind"):
            tree = tree.bind(model)
        present = {k.split("/", 1)[0] for k in weight_variables(model)}
        # Weights the model does not have (a headless model's head and pre_logits) are not loaded.
        skip = plan.skip + tuple(p for p in family.optional_weights if p.split("/", 1)[0] not in present)
        try:
            set_weight_tree(
                model,
                tree,
                source_grid=family.grid(config),
                resize_rule=config.get("position_embedding_resize"),
                patch_resize_rule=patch_resize,
                skip=skip,
                allow_missing=plan.allow_missing,
            )
        except WeightTreeError as err:
            if source is None:
                raise
            raise WeightTreeError(f"{source}: {err}") from None  # which checkpoint did not fit
    # A fresh head is zero in every family, also where its layers are plain Keras ones that
    # skip_random_init does not reach (an AxialResNet's `fc`).
    for key, variable in weight_variables(model).items():
        if key.startswith(plan.allow_missing):
            variable.assign(keras.ops.zeros(variable.shape, variable.dtype))
    return model


#: The (licence, weights) pairs a non-commercial licence was already reported for in this process.
_LICENSES_REPORTED = set()


class LicenseWarning(UserWarning):
    """Weights whose licence restricts their use (non-commercial licences)."""


def license_of(resolved):
    """The licence of resolved weights: the preset row's, else the one the files name (timm's
    config.json), else None."""
    if resolved.preset is not None and resolved.preset.license:
        return resolved.preset.license
    reader = resolved.format.license
    return reader(resolved.path) if reader is not None else None


def _warn_license(resolved):
    """One line, once per weights per process, when the licence allows no commercial use."""
    license = license_of(resolved)
    if not presets.is_non_commercial(license):
        return
    what = resolved.repo or resolved.path
    if (license, what) in _LICENSES_REPORTED:
        return
    _LICENSES_REPORTED.add((license, what))
    warnings.warn(f"{resolved.source}: these weights are licensed {license}, which allows non-commercial use only.",
                  LicenseWarning, stacklevel=4)


def load(source, *, architecture=None, image_size=None, include_top=True, classes=None, pooling=None,
         classifier_activation=None, keep_representation=True, fresh_head=False, warn=True, **overrides):
    """Load weights named in any accepted way into a model: `resolve`, read, build once, assign.

    Args:
        source: anything `resolve` accepts.
        architecture: an architecture-table row (or its name) the checkpoint must hold; tags and
            aliases refer to it.
        image_size, include_top, classes, pooling, classifier_activation, keep_representation:
            see `build_from_checkpoint` and `plan_head`.
        **overrides: other VisionTransformer arguments.

    Example:
        >>> model = load("ViT-B_16.npz", image_size=384)   # doctest: +SKIP
    """
    from keras_vit.models.family import get_architecture

    if isinstance(architecture, str):
        architecture = get_architecture(architecture)
    arch_name = architecture.name if architecture is not None else None
    resolved = resolve(source, architecture=arch_name, image_size=image_size)
    try:
        tree, config = resolved.format.read_at(resolved.path, image_size)
    except CheckpointError:
        # A format whose grid the size decides (an AxialResNet's spans) refuses another size; when
        # the file holds another architecture altogether, that is the error to give.
        mismatch = _architecture_mismatch(architecture, resolved) if architecture is not None else None
        if mismatch is not None:
            raise mismatch from None
        raise
    source = resolved.source
    if resolved.preset is not None and resolved.preset.config:
        # The preset's architecture differs from its repository's config.json (timm's QuickGELU
        # CLIPs read the GELU ones' files).
        config = config.replace(**dict(resolved.preset.config))
    _warn_license(resolved)
    # The PI-resize of the source's framework (big_vision's FlexiViT: bilinear), unless named.
    overrides.setdefault("patch_resize_rule", resolved.format.patch_resize_rule)
    if architecture is not None:
        check_architecture(architecture, config, source)
    return build_from_checkpoint(
        tree,
        config,
        image_size=image_size,
        include_top=include_top,
        classes=classes,
        pooling=pooling,
        classifier_activation=classifier_activation,
        keep_representation=keep_representation,
        fresh_head=fresh_head,
        source=source,
        warn=warn,
        **overrides,
    )


def load_checkpoint(source, *, image_size=None, patch_size=None, include_top=True, classes=None, pooling=None,
                    classifier_activation=None, **overrides):
    """Load any supported checkpoint as a keras_vit model; the architecture and the source
    framework's numerics are read from the checkpoint itself.

    Args:
        source: an original .npz, a big_vision .npz, a timm folder or .safetensors, a
            transformers folder, a Keras preset folder, a .keras or .weights.h5 file, a training
            run folder;
            "hf://owner/repo[@revision]"; or a preset name ("ViTB16.augreg_in21k",
            "vit_base_patch16_224.augreg2_in21k_ft_in1k").
        image_size: int or (height, width) to run at; position embeddings are resized with the
            source's own rule. Default: the checkpoint's resolution.
        patch_size: run the weights at another patch size (FlexiViT): the patch-embedding kernel
            is PI-resized (`keras_vit.resize_patch_embedding`) and the position embeddings are
            resized to the new grid. Plain ViTs lose accuracy away from the patch size they were
            trained at (FlexiViT-trained weights do not); hybrids are refused. The kernel inverts
            the pixel resize of the checkpoint's framework (big_vision: "bilinear", as its
            FlexiViT does; otherwise timm's "bicubic_antialias"); pass `patch_resize_rule=` to
            choose another of `keras_vit.layers.PATCH_RESIZE_RULES`.
        include_top: True (a head), False (features), or None (as the checkpoint is: its head if
            it has one, else pooled features).
        classes: None keeps the checkpoint's head; another number attaches a fresh
            zero-initialised head (with a warning when that discards a trained one).
        pooling: with include_top=False: None, "token", "gap", "max" or "first" (see VisionTransformer).
        classifier_activation: activation of the head; None (default) returns logits.
        **overrides: other VisionTransformer arguments (dropout_rate, dtype, name, ...). Where
            the weights cannot tell the read-out apart, name it: a big_vision file without a
            class token or MAP head loads as classifier="gap"; pass classifier="first" or
            "none" for its pool_type "0" or "none".

    Example:
        >>> model = keras_vit.load_checkpoint("ViT-B_16.npz", image_size=384)   # doctest: +SKIP
    """
    if patch_size is not None:
        overrides["patch_size"] = patch_size
    return load(source, image_size=image_size, include_top=include_top, classes=classes, pooling=pooling,
                classifier_activation=classifier_activation, **overrides)


__all__ = ["PATCH_RESIZE_RULE", "HeadPlan", "LicenseWarning", "ResolvedWeights", "build_from_checkpoint",
           "check_architecture", "license_of", "load", "load_checkpoint", "plan_head", "resolve"]
