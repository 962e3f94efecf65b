"""Model families: one record per family, which the loading path, `.keras` files, presets, the
constructors, the CLI, export and `keras_vit.flops` ask. Nothing outside this module looks at a
config's keys to tell the families apart: it calls `family_of(...)`.

    >>> family_of("BiTResNet50x1").name, family_of({"block_units": [3, 4, 6, 3]}).name
    ('bit', 'bit')
    >>> family_of("ViTB16").head
    'head/'

How a family registers
----------------------
A new family is one model file, one family record and its reader modules, plus one registry
line each:

1. The model file, `keras_vit/models/<family>.py`: a `keras.Model` subclass registered with
   `keras.saving.register_keras_serializable(package="keras_vit")`, whose keyword arguments are
   the fields of the family's config class, and which either names its layers so that
   `weight_tree.weight_variables` walks them or states its own tree with
   `weight_tree_variables()` ({canonical key: variable}). `keras_vit.models.config_model` is the
   plumbing every family's model uses: the constructor reads its config with
   `config_from_arguments` and keeps it as `self._model_config`, which the `ConfigModel` mixin
   gives as `model.config` and writes as `get_config()` (`{"family": ..., **model.config.to_dict(),
   "name": ..., "trainable": ...}`), and `expose_config_fields` makes every field a read-only
   model attribute. A convolutional model's head and pooling are `layers.heads.pooled_classifier`.
2. The record, a `ModelFamily(...)` instance in a module that does not import Keras (the CLI
   and the preset table read it without a backend), e.g. `keras_vit/models/<family>_family.py`
   beside a frozen config dataclass. Required fields: `name`, `title`, `model`
   ("module:Class", imported on first use), `config_class`, `architectures` ({constructor
   name: row}; a row has `name`, `paper_name`, `kwargs()` (the model arguments it fixes) and
   `stride`), `signature` (config keys that only this family's configs hold: how a config dict
   without a `family` key, written before configs named their family, is told apart; see
   `guess_family`) and `flops` (a function or "module:function",
   `flops(config, (height, width), classes) -> int`). The rest have defaults; see `ModelFamily`.
   The config class is a frozen dataclass with `fields()` and `from_dict(dict)` (validating,
   raising ValueError/TypeError naming the problem) and a class attribute `family` (the record's
   `name`), like `ViTConfig` (keras_vit/models/vit_family.py) and `BiTConfig`
   (keras_vit/models/bit_family.py). The model's `get_config()` (`config_model.model_config`)
   writes `family`, so its .keras files and presets name it.
3. One registry line: the record's "module:ATTRIBUTE" appended to `REGISTRY` below (a family
   defined outside keras_vit registers at run time instead: `register_family(record)`).
4. Its reader modules in `keras_vit/checkpoints/`, registered as before (one line each in
   `checkpoints/registry.py`); a reader's config dict holds the family's `signature` keys.

The constructors (`keras_vit.<Name>(weights=...)`), `keras_vit.models.<Class>`, presets,
`load_checkpoint`, `.keras` files, preset folders, model cards, the CLI and `flops` then work
for it without further edits.
"""

import dataclasses
import importlib
import sys
from collections.abc import Mapping
from typing import Any, Callable, Optional

from keras_vit.models.config import FAMILY_KEY
from keras_vit.models.transfer import Transfer


#: (mean, std) per channel of [0, 1] pixels that map them to [-1, 1], the original ViT's input.
SIGNED_UNIT_NORMALIZATION = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
#: (mean, std) of ImageNet, torchvision's normalisation (and timm's default).
IMAGENET_NORMALIZATION = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _resolve(reference):
    """A callable or object named "module:attribute" (imported now), or `reference` itself."""
    if isinstance(reference, str) and ":" in reference:
        module, attribute = reference.split(":", 1)
        return getattr(importlib.import_module(module), attribute)
    return reference


def _as_tuple(value):
    return tuple(value) if isinstance(value, (list, tuple)) else value


def stem_block_head_groups(keys, stem, block, final_norm):
    """{canonical key: ordinal} of a Transformer's weights for layer-wise learning-rate decay, as
    timm's `group_matcher(coarse=False)` orders a VisionTransformer's: the keys `stem` (a compiled
    regex) matches first, (0,); then the block whose index `block`'s first group captures, (1, i);
    the final norm (keys starting with `final_norm`) with the last block; everything else (heads,
    pooling, pre_logits) after the blocks, (2,)."""
    blocks = [int(m.group(1)) for m in map(block.match, keys) if m]
    out = {}
    for key in keys:
        match = block.match(key)
        if stem.match(key):
            out[key] = (0,)
        elif match:
            out[key] = (1, int(match.group(1)))
        elif key.startswith(final_norm) and blocks:
            out[key] = (1, max(blocks))
        else:
            out[key] = (2,)
    return out


# === The record ===


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """How a family's variables lie on a device mesh (`keras_vit.get_layout_map`).

    Attributes:
        rules: `rules(model_axis) -> [(group, regex, axes), ...]`: every variable's path
            (`Variable.path`, under any name scope) is matched by exactly one regex, whose `axes`
            name the mesh axis of each dimension (None: whole). `group` (or None for a replicated
            variable) names the size the model axis must divide for the split.
        dims: `dims(config) -> {group: size or None}` of a model config, for the fallback that
            replicates a whole group whose size the model axis does not divide.
        groups: {group: what it covers}, for the warning that names a replicated group.
        outputs: `outputs(data_axis) -> [(regex, axes), ...]` of layer outputs to lay out.
    """

    rules: Callable
    dims: Callable
    groups: Mapping
    outputs: Callable = lambda data_axis: []



@dataclasses.dataclass(frozen=True)
class ModelFamily:
    """What the rest of keras_vit knows about one model family.

    Attributes:
        name: short id ("vit", "bit", "axial_vit").
        title: what messages call it ("Vision Transformer", "BiT ResNet-v2").
        model: "module:Class" of the keras.Model (imported on first use: `model_class()`).
        config_class: the frozen dataclass of the model's arguments (`fields()`, `from_dict`).
        architectures: {constructor name: architecture row} of the family's constructors.
        signature: config keys only this family's configs hold (see `family_of`).
        flops: forward FLOPs, `flops(config, (height, width), classes) -> int` (or "module:name").
        extra_architectures: rows with no constructor of their own (e.g. "ViTB16Gap").
        presets: preset rows (constructor, tag, resolution, classes, top-1, Hub repo, original
            file or None, source), added to `keras_vit.presets`' table.
        head: prefix of the classification head's weights in the canonical tree.
        extra_heads: prefixes of further heads replaced or dropped with it (DeiT's `head_dist/`).
        optional_weights: tree prefixes a saved file may lack (head, pre_logits).
        resizable_weights: tree prefixes whose shape a load may change (resized or replaced).
        features_pooling: how a headless model "as the checkpoint is" pools (None: its classifier).
        patch_resize: whether `load(patch_size=...)` (FlexiViT's PI-resize) applies.
        source_grid: `source_grid(config) -> (rows, cols)` of the position embedding the weights
            are laid out on, or None when nothing is resized by grid.
        dynamic_size: how `input_shape=(None, None, 3)` is built: "flag" (the config's
            `dynamic_image_size`), "native" (image_size with None dimensions) or None (refused).
        describe: `describe(config) -> str`, a short architecture text for messages.
        card: `card(config) -> (tags, introduction, [(row, value), ...])` of the model card.
        weights_lower_bound: `(config, source) -> int`, the fewest bytes weights of `config`
            occupy (refuses a config.json claiming a huge model before it is built), or None.
        to_checkpoint: `(model_config) -> checkpoint config`: what a saved model's config says
            about its file (default: `checkpoint_fields`, classes None without a head).
        from_checkpoint: `(checkpoint config) -> model kwargs` that rebuild the saved model.
        constructor_doc: the constructors' docstring template (formatted with the row's fields,
            `stride` and what `doc_fields(row)` adds).
        doc_fields: `doc_fields(row) -> dict` of further fields for `constructor_doc`.
        constructor_owned: model arguments besides the row's that the constructors set.
        row_overridable: fields of a row that a constructor's `**overrides` may still change.
        npz_format: the checkpoint format (a `checkpoints.registry` name) that writes the
            family's original .npz layout, or None when it has none.
        input_normalization: (mean, std) per channel of [0, 1] pixels: the model takes
            `(pixels / 255 - mean) / std` (default ViT's [-1, 1]: mean = std = 0.5). Export's
            `with_preprocessing` applies it inside the artefact.
        int8: whether the model has keras_vit's int8 (`quantize("int8")`, remembered in its
            config so a saved int8 model reloads int8), which `export_model(..., int8=True)`
            needs.
        sharding: the family's `ShardingRules` (or "module:NAME") for `keras_vit.get_layout_map`.
        patch_resize_refusal: `(checkpoint config) -> str or None`: why `load(patch_size=...)`
            cannot PI-resize this checkpoint although the family allows it (completing "The
            checkpoint ..."), or None when it can.
        transfer: what fine-tuning and few-shot features mean for the family (a
            `keras_vit.models.transfer.Transfer`: the fine-tuned model's settings, whether its
            input may change size, its default resolution, its feature layers).
        layer_groups: `(canonical keys) -> {key: ordinal}` ordering the weights from input to
            output for layer-wise learning-rate decay (equal ordinals share a group; timm's
            `group_matcher`), or None when the family has no grouping (layer decay is refused).
        default_architecture: the constructor that stands for the family where a model is needed
            and none is named (the default family's is what `keras-vit explain` inspects without
            --arch and weights); None: the first of `architectures`.
        no_weight_decay: canonical keys (or prefixes ending in "/", or suffixes starting with
            "/": a weight of every block) of the weights timm's `no_weight_decay()` names (a ViT's
            class, register and distillation tokens and position embedding, RoPE-Mixed's rotary
            frequencies), which its weight-decay rule leaves undecayed besides biases and norms.
    """

    name: str
    title: str
    model: str
    config_class: type
    architectures: Mapping
    signature: tuple
    flops: Any
    extra_architectures: Mapping = dataclasses.field(default_factory=dict)
    presets: tuple = ()
    head: str = "head/"
    extra_heads: tuple = ()
    optional_weights: tuple = ("head/", "pre_logits/")
    resizable_weights: tuple = ("head/",)
    features_pooling: Optional[str] = None
    patch_resize: bool = False
    source_grid: Optional[Callable] = None
    dynamic_size: Optional[str] = None
    describe: Any = None
    card: Any = None
    weights_lower_bound: Any = None
    to_checkpoint: Any = None
    from_checkpoint: Any = None
    constructor_doc: str = ""
    doc_fields: Any = None
    constructor_owned: tuple = ()
    row_overridable: tuple = ()
    npz_format: Optional[str] = None
    input_normalization: tuple = SIGNED_UNIT_NORMALIZATION
    int8: bool = False
    sharding: Any = None
    patch_resize_refusal: Any = None
    transfer: Transfer = Transfer()
    layer_groups: Any = None
    default_architecture: Optional[str] = None
    no_weight_decay: tuple = ()

    # --- the model --------------------------------------------------------------------------

    def model_class(self):
        """The keras.Model subclass (imports Keras and the model module)."""
        return _resolve(self.model)

    @property
    def class_name(self):
        return self.model.split(":", 1)[1]

    def build(self, **kwargs):
        """A model of this family from its keyword arguments."""
        return self.model_class()(**kwargs)

    def default_constructor(self):
        """The name of the constructor that stands for the family (`default_architecture`)."""
        return self.default_architecture or next(iter(self.architectures))

    def all_architectures(self):
        """{name: row} of the constructors' rows and the extra ones."""
        return {**self.architectures, **self.extra_architectures}

    def overrides(self):
        """The model arguments a constructor's `**overrides` may set: every config field the row,
        the input shape and the constructor's own arguments do not set."""
        fields = set(self.config_class.fields())
        owned = {f.name for row in self.architectures.values() for f in dataclasses.fields(row)} & fields
        owned -= set(self.row_overridable)
        owned |= {"image_size", "num_channels", "include_top", "pooling", "classes", "classifier_activation", "name"}
        owned |= set(self.constructor_owned)
        return tuple(f for f in (*self.config_class.fields(), "dtype", "trainable") if f not in owned)

    # --- checkpoints ------------------------------------------------------------------------

    @property
    def checkpoint_fields(self):
        """The fields a checkpoint determines: the config class's architecture and numerics."""
        return self.config_class.architecture_fields()

    def checkpoint_config(self, model_config):
        """The checkpoint config (architecture + numerics, as a reader infers it) of a model's
        `get_config()`: `classes` None when the model has no head."""
        if self.to_checkpoint is not None:
            return _resolve(self.to_checkpoint)(model_config)
        normalised = self.config_class.from_dict(model_config)  # sizes as pairs
        config = {k: _as_tuple(normalised[k]) for k in self.checkpoint_fields if k in model_config}
        if not model_config.get("include_top", True):
            config["classes"] = None
        return config

    def model_kwargs(self, config):
        """The model keyword arguments that rebuild the saved model of a checkpoint `config`."""
        if self.from_checkpoint is not None:
            return _resolve(self.from_checkpoint)(config)
        kwargs = dict(config)
        kwargs["include_top"] = config.get("classes") is not None
        kwargs["classes"] = config.get("classes") or 1000
        kwargs["pooling"] = None
        return kwargs

    def config_object(self, config):
        """The family's config object of a checkpoint config (a reader's dict: architecture and
        numerics, `classes` None or absent when the weights have no head), or `config` itself
        when it is one already. A headless checkpoint's object has `include_top=False` and
        `classes` None, as the dict said.

        Example:
            >>> get_family("bit").config_object({"block_units": [1], "width_factor": 1, "classes": None}).include_top
            False
        """
        if isinstance(config, self.config_class):
            return config
        kwargs = dict(config)
        if kwargs.get("classes") is None:
            kwargs.update(classes=None, include_top=False)
        return self.config_class.from_dict(kwargs)

    def validate(self, config):
        """Raise (ValueError / TypeError) when `config` is not a valid config of this family."""
        self.config_class.from_dict(config)

    def grid(self, config):
        """(rows, cols) the checkpoint's position embedding is laid out on, or None."""
        return None if self.source_grid is None else _resolve(self.source_grid)(config)

    def minimum_weight_bytes(self, config, source):
        return None if self.weights_lower_bound is None else _resolve(self.weights_lower_bound)(config, source)

    def description(self, config):
        return _resolve(self.describe)(config) if self.describe is not None else self.title

    def model_card(self, config):
        """(tags, introduction, [(row, value), ...]) of a saved model's card."""
        if self.card is None:
            return (self.name,), f"{self.title} weights for keras_vit.", [("architecture", self.description(config))]
        return _resolve(self.card)(config)

    def count_flops(self, config, image_size, classes):
        return int(_resolve(self.flops)(config, image_size, classes))

    def sharding_rules(self):
        """The family's `ShardingRules`; a ValueError when it has none."""
        if self.sharding is None:
            raise ValueError(f"{self.title} models have no sharding rules; get_layout_map cannot lay them out.")
        return _resolve(self.sharding)

    @property
    def head_prefixes(self):
        """The prefixes of every head's weights: `head` and `extra_heads`."""
        return (self.head, *self.extra_heads)

    def layer_group_ordinals(self, keys):
        """{canonical key: ordinal} of `layer_groups`, or None when the family has none."""
        return None if self.layer_groups is None else _resolve(self.layer_groups)(tuple(keys))

    def patch_resize_refused(self, config):
        """Why `load(patch_size=...)` cannot PI-resize the checkpoint of `config` (a family that has
        `patch_resize`), or None."""
        return None if self.patch_resize_refusal is None else _resolve(self.patch_resize_refusal)(config)

    def preset_rows(self):
        """The family's preset rows (see `presets`)."""
        return tuple(_resolve(self.presets))

    def constructor_docstring(self, row):
        """The docstring of the constructor of `row`."""
        if not self.constructor_doc:
            return f"Instantiates {row.paper_name} ({self.title}).\n\nExample:\n    >>> model = keras_vit.{row.name}(weights=None)\n"
        fields = {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}
        fields["stride"] = row.stride
        if self.doc_fields is not None:
            fields.update(_resolve(self.doc_fields)(row))
        return self.constructor_doc.format(**fields)


# === The registry ===

#: Every family's record, "module:ATTRIBUTE". A new family appends its line. The first line is the
#: default family (`default_family`): what the CLI builds from JSON arguments that name no family,
#: and what `get_layout_map` lays out without a config.
REGISTRY = (
    "keras_vit.models.vit_family:VIT",
    "keras_vit.models.bit_family:BIT",
    "keras_vit.models.axial_vit_family:AXIAL_VIT",
    "keras_vit.models.axial_resnet_family:AXIAL_RESNET",
    "keras_vit.models.efficientnet_family:EFFICIENTNET",
)

_LOADED = []


def families():
    """The registered `ModelFamily` records, in registry order."""
    if not _LOADED:
        _LOADED.extend(_resolve(r) for r in REGISTRY)
    return tuple(_LOADED)


def register_family(record):
    """Add a family record at run time, after the `REGISTRY` ones (a family defined outside
    keras_vit, e.g. in a plugin or a test); `unregister_family(record.name)` takes it away. Its
    constructors are `keras_vit.<Name>` (looked up on access, so they come and go with the
    record) and `keras_vit.applications.build_application(name, ...)`; its model class is
    `keras_vit.<ClassName>`; its preset rows join `keras_vit.presets`'.

    Raises:
        ValueError when a registered family already has its name, model class or a constructor name.
    """
    known = families()
    for family in known:
        clash = ({family.name} & {record.name}) or ({family.class_name} & {record.class_name}) or (
            set(family.all_architectures()) & set(record.all_architectures()))
        if clash:
            raise ValueError(f"The {record.title} family clashes with the registered {family.title} family: both "
                             f"name {', '.join(sorted(clash))}. Give the new family its own names.")
    _LOADED.append(record)
    return record


def unregister_family(name):
    """Remove the family called `name` that `register_family` added (the `REGISTRY` ones stay)."""
    base = len(REGISTRY)
    for index, family in enumerate(families()):
        if family.name == name:
            if index < base:
                raise ValueError(f"{name!r} is a family of keras_vit's REGISTRY; only register_family's are removed.")
            del _LOADED[index]
            return family
    raise ValueError(f"No family {name!r} was added with register_family.")


def import_model_classes():
    """{class name: class} of every family's model class, imported: importing them registers each
    model class and every keras_vit layer with keras.saving, which `keras.saving.load_model` needs
    to load a saved model of any family."""
    return {family.class_name: family.model_class() for family in families()}


def get_family(name):
    """The family called `name` ("vit", "bit", ...)."""
    for family in families():
        if family.name == name:
            return family
    raise ValueError(f"Unknown model family {name!r}; known: {', '.join(f.name for f in families())}.")


def default_family():
    """The first registered family: the one used where nothing names a family (see REGISTRY)."""
    return families()[0]


def all_architectures():
    """{constructor name: row} of every family (and the rows without a constructor)."""
    out = {}
    for family in families():
        out.update(family.all_architectures())
    return out


def get_architecture(name):
    """The architecture row called `name` (constructor name, e.g. "ViTB16", "BiTResNet50x1"), of any
    model family."""
    table = all_architectures()
    if name not in table:
        import difflib

        close = difflib.get_close_matches(name, list(table), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"Unknown architecture {name!r}.{hint} Known: {', '.join(table)}.")
    return table[name]


def constructor_names():
    """Every constructor name, family by family in registry order."""
    return [name for f in families() for name in f.architectures]


def guess_family(config):
    """The family of a config dict that does not name one (a file written before configs named
    their family, or a checkpoint reader's config): matched by the families' `signature` keys,
    from the last registered family up, so the first family takes any dict no other family's
    signature matches.

    Raises:
        ValueError when no family's signature matches.
    """
    for family in reversed(families()):
        if all(key in config for key in family.signature):
            return family
    raise ValueError("The config matches no keras_vit model family.")


def config_object(config):
    """The config object (`ViTConfig`, `BiTConfig`, ...) of a checkpoint config dict of any family,
    or `config` itself when it is one already (see `ModelFamily.config_object`)."""
    return family_of(config).config_object(config)


def family_of(thing):
    """The `ModelFamily` of a model, a config, an architecture row or a name.

    Args:
        thing: a keras_vit model (or a keras.Model wrapping one), a config dict (a model's
            `get_config()`, a checkpoint reader's config, or Keras' serialised
            {"class_name", "config"} form), a config object (ViTConfig, BiTConfig, ...), an
            architecture row, a constructor name ("ViTB16"), a model class name
            ("VisionTransformer") or a family name ("vit").

    A config dict names its family in its `family` key (every model's `get_config()` writes
    it); one without it (a file written before the key existed, a checkpoint reader's config) is
    matched by `guess_family`.

    Raises:
        ValueError for a name, dict or object of no known family.
    """
    if isinstance(thing, ModelFamily):
        return thing
    if isinstance(thing, str):
        for family in families():
            if thing in (family.name, family.class_name) or thing in family.all_architectures():
                return family
        import difflib

        known = [n for f in families() for n in (f.name, f.class_name, *f.all_architectures())]
        close = difflib.get_close_matches(thing, known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"{thing!r} names no model family, constructor or model class.{hint}")
    for family in families():  # a config object (also a Mapping of its fields)
        if isinstance(thing, family.config_class):
            return family
    if isinstance(thing, Mapping):
        if isinstance(thing.get("class_name"), str) and isinstance(thing.get("config"), Mapping):
            for family in families():
                if thing["class_name"] == family.class_name:
                    return family
            raise ValueError(
                f"A {thing['class_name']} is no keras_vit model (known: "
                f"{', '.join(f.class_name for f in families())})."
            )
        if FAMILY_KEY in thing:
            name = thing[FAMILY_KEY]
            for family in families():
                if family.name == name:
                    return family
            raise ValueError(
                f"The config names family {name!r}, which is no keras_vit model family (known: "
                f"{', '.join(f.name for f in families())})."
            )
        return guess_family(thing)
    for family in families():
        if isinstance(thing, type) and thing.__name__ in (family.class_name, family.config_class.__name__):
            return family
        if any(type(thing) is type(row) for row in family.all_architectures().values()):
            return family
    # A model: an instance of a family's model class (a class not imported yet has no instances).
    for family in families():
        module, _, name = family.model.partition(":")
        model_class = getattr(sys.modules.get(module), name, None)
        if isinstance(model_class, type) and isinstance(thing, model_class):
            return family
    for layer in getattr(thing, "layers", ()):  # a keras.Model wrapping one (input_tensor=, preprocessing)
        try:
            return family_of(layer)
        except ValueError:
            continue
    raise ValueError(f"A {type(thing).__name__} belongs to no keras_vit model family.")


def input_normalization_of(model):
    """(mean, std) per channel of [0, 1] pixels that `model` takes its images normalised with: its
    weights' own (`config.input_normalization`: CLIP's, DINOv2's ImageNet statistics from timm's
    pretrained_cfg), else its family's (`ModelFamily.input_normalization`: [-1, 1] for ViTs).

    Raises:
        ValueError for a model of no keras_vit family.

    Example:
        >>> import keras_vit
        >>> input_normalization_of(keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...     num_layers=1, num_heads=2, mlp_dim=32, classes=3))
        ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
    """
    own = getattr(getattr(model, "config", None), "input_normalization", None)
    if own is not None:
        return tuple(tuple(float(v) for v in part) for part in own)
    return family_of(model).input_normalization
