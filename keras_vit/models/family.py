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
   `config_from_arguments` and keeps it as `model.config`, `get_config()` is
   `{**model.config.to_dict(), "name": ..., "trainable": ...}`, and `expose_config_fields`
   makes every field a read-only model attribute.
2. The record, a `ModelFamily(...)` instance in a module that does not import Keras (the CLI
   and the preset table read it without a backend), e.g. `keras_vit/models/<family>_family.py`
   beside a frozen config dataclass. Required fields: `name`, `title`, `model`
   ("module:Class", imported on first use), `config_class`, `architectures` ({constructor
   name: row}; a row has `name`, `paper_name`, `kwargs()` (the model arguments it fixes) and
   `stride`), `signature` (config keys that only this family's configs hold; a plain config
   dict holding all of them is this family's) and `flops` (a function or "module:function",
   `flops(config, (height, width), classes) -> int`). The rest have defaults; see `ModelFamily`.
   The config class is a frozen dataclass with `fields()` and `from_dict(dict)` (validating,
   raising ValueError/TypeError naming the problem), like `ViTConfig` and `BiTConfig`.
3. One registry line: the record's "module:ATTRIBUTE" appended to `REGISTRY` below (ViT, the
   first line, is the fallback for plain dicts that hold no other family's signature).
4. Its reader modules in `keras_vit/checkpoints/`, registered as before (one line each in
   `checkpoints/registry.py`); a reader's config dict holds the family's `signature` keys.

The constructors (`keras_vit.<Name>(weights=...)`), `keras_vit.models.<Class>`, presets,
`load_checkpoint`, `.keras` files, preset folders, model cards, the CLI and `flops` then work
for it without further edits.
"""

import dataclasses
import importlib
from collections.abc import Mapping
from typing import Any, Callable, Optional

from keras_vit.models.config import (
    ARCHITECTURE_FIELDS,
    BIT_ARCHITECTURES,
    EXTRA_ARCHITECTURES,
    ARCHITECTURES,
    BiTConfig,
    ViTConfig,
)
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


# === The record ===


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
        transfer: what fine-tuning and few-shot features mean for the family (a
            `keras_vit.models.transfer.Transfer`: the fine-tuned model's settings, whether its
            input may change size, its default resolution, its feature layers).
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
    transfer: Transfer = Transfer()

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
        config = {k: _as_tuple(model_config[k]) for k in self.checkpoint_fields if k in model_config}
        size = config.get("image_size")
        if size is not None:
            config["image_size"] = (size, size) if isinstance(size, int) else tuple(size)
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

#: Every family's record, "module:ATTRIBUTE". A new family appends its line. Plain config dicts
#: are matched against the signatures from the last line up, so ViT, first, takes any config that
#: holds no other family's signature.
REGISTRY = (
    "keras_vit.models.family:VIT",
    "keras_vit.models.family:BIT",
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


def get_family(name):
    """The family called `name` ("vit", "bit", ...)."""
    for family in families():
        if family.name == name:
            return family
    raise ValueError(f"Unknown model family {name!r}; known: {', '.join(f.name for f in families())}.")


def all_architectures():
    """{constructor name: row} of every family (and the rows without a constructor)."""
    out = {}
    for family in families():
        out.update(family.all_architectures())
    return out


def constructor_names():
    """Every constructor name, family by family in registry order."""
    return [name for f in families() for name in f.architectures]


def family_of(thing):
    """The `ModelFamily` of a model, a config, an architecture row or a name.

    Args:
        thing: a keras_vit model (or a keras.Model wrapping one), a config dict (a model's
            `get_config()`, a checkpoint reader's config, or Keras' serialised
            {"class_name", "config"} form), a config object (ViTConfig, BiTConfig, ...), an
            architecture row, a constructor name ("ViTB16"), a model class name
            ("VisionTransformer") or a family name ("vit").

    A plain dict is matched by the families' `signature` keys, from the last registered family
    up; the ViT family, first, takes any dict no other family's signature matches.

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
    if isinstance(thing, Mapping):
        if isinstance(thing.get("class_name"), str) and isinstance(thing.get("config"), Mapping):
            for family in families():
                if thing["class_name"] == family.class_name:
                    return family
            raise ValueError(
                f"A {thing['class_name']} is no keras_vit model (known: "
                f"{', '.join(f.class_name for f in families())})."
            )
        for family in reversed(families()):
            if all(key in thing for key in family.signature):
                return family
        raise ValueError("The config matches no keras_vit model family.")
    for family in families():
        if isinstance(thing, type) and thing.__name__ in (family.class_name, family.config_class.__name__):
            return family
        if isinstance(thing, family.config_class):
            return family
        if any(type(thing) is type(row) for row in family.all_architectures().values()):
            return family
    # A model: its class (or a base class) is a family's model class.
    names = {cls.__name__ for cls in type(thing).__mro__}
    for family in families():
        if family.class_name in names and type(thing).__module__.startswith("keras_vit"):
            return family
    for layer in getattr(thing, "layers", ()):  # a keras.Model wrapping one (input_tensor=, preprocessing)
        try:
            return family_of(layer)
        except ValueError:
            continue
    raise ValueError(f"A {type(thing).__name__} belongs to no keras_vit model family.")


# === ViT (with the R+ViT hybrids) ===


def _vit_source_grid(config):
    from keras_vit.models.config import resnet_stride

    stride = config["patch_size"] * resnet_stride(config.get("resnet"))
    size = config["image_size"]
    h, w = (size, size) if isinstance(size, int) else size
    return h // stride, w // stride


def _vit_describe(config):
    text = (f"hidden {config['hidden_size']}, {config['num_layers']} layers, {config['num_heads']} heads, "
            f"patch {config['patch_size']}")
    return text + (f", ResNet {tuple(config['resnet'][0])}" if config.get("resnet") else "")


def _vit_to_checkpoint(model_config):
    config = {k: model_config[k] for k in ARCHITECTURE_FIELDS if k in model_config}
    size = config["image_size"]
    config["image_size"] = (size, size) if isinstance(size, int) else tuple(size)
    if config.get("resnet") is not None:
        config["resnet"] = (tuple(config["resnet"][0]), config["resnet"][1])
    include_top = model_config.get("include_top", True)
    if not include_top:
        config["classes"] = None
    if not (include_top or model_config.get("pooling") is not None):
        config["representation_size"] = None
    return config


def _vit_from_checkpoint(config):
    kwargs = dict(config)
    kwargs["include_top"] = config.get("classes") is not None
    kwargs["classes"] = config.get("classes") or 1000
    kwargs["pooling"] = None if kwargs["include_top"] else (
        config["classifier"] if config.get("representation_size") else None)
    return kwargs


def _vit_card(config):
    arch = (f"hidden {config['hidden_size']}, {config['num_layers']} layers, {config['num_heads']} heads, "
            f"MLP {config['mlp_dim']}, patch {config['patch_size']}")
    if config.get("resnet"):
        arch += f", BiT ResNet stages {tuple(config['resnet'][0])} width x{config['resnet'][1]}"
    if config.get("classifier") == "gap":
        arch += ", global average pooling"
    numerics = (f"LayerNorm eps {config['layer_norm_epsilon']:g}, GELU "
                f"{'tanh approximation' if config['gelu_approximate'] else 'exact (erf)'}, position-embedding "
                f"resize \"{config['position_embedding_resize']}\"")
    intro = ("Vision Transformer weights for [keras_vit](https://github.com/) (Keras 3: JAX, TensorFlow,\n"
             "PyTorch), from \"An Image is Worth 16x16 Words\" (Dosovitskiy et al., ICLR 2021).")
    return ("vision-transformer",), intro, [("architecture", arch), ("numerics", numerics)]


VIT_DOC = """Instantiates the {paper_name} architecture{hybrid}.

Reference: "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale"
(Dosovitskiy et al., ICLR 2021). Hidden size {hidden_size}, {num_layers} layers, {num_heads} heads,
MLP {mlp_dim}, {stride}x{stride} input pixels per token.

Inputs are channels-last images scaled to [-1, 1] (see `keras_vit.preprocess_input`).

Args:
    include_top: whether to end in the classification head.
    weights: None (random initialisation), a preset tag (e.g. "augreg_in21k_ft_in1k",
        "augreg_in21k", "orig_in21k"; aliases "imagenet" and "imagenet21k"; see
        `keras_vit.list_presets("{name}")`), a local checkpoint path, or "hf://owner/repo".
    input_tensor: optional Keras tensor to use as the image input.
    input_shape: (height, width, 3); default (224, 224, 3). Any size that {stride} divides,
        square or not; pretrained position embeddings are resized to it. (None, None, 3)
        builds a model for any such size at run time: its position embeddings are
        interpolated inside the graph to each batch's grid, with the weights' own rule.
    pooling: with include_top=False: None returns the token sequence after the final
        LayerNorm; "token", "gap"/"avg" or "max" pool it to (batch, {hidden_size}).
    classes: classes of the head. With pretrained weights, a value other than the checkpoint's
        attaches a fresh zero-initialised head.
    classifier_activation: activation of the head; None returns logits.
    name: model name.
    **overrides: other `keras_vit.VisionTransformer` arguments (dropout_rate,
        attention_dropout_rate, representation_size, numerics fields, ...). `patch_size`
        with pretrained weights runs them at another patch size (FlexiViT's PI-resize of the
        patch embedding; see `keras_vit.load_checkpoint`).

Returns:
    A `keras_vit.VisionTransformer` (a `keras.Model`).

Example:
    >>> model = keras_vit.{name}(weights=None, input_shape=(224, 224, 3))
"""


def _vit_doc_fields(row):
    return dict(hybrid=" (ViT on a BiT ResNet)" if row.resnet is not None else "")


def _positive_int(config, key, source, default=None):
    from keras_vit.errors import CheckpointError

    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{source}: {key} is {str(value)[:40]!r}; expected a positive integer.")
    return value


def _vit_weights_lower_bound(config, source):
    """The fewest bytes the weights of a ViT `config` occupy: the encoder's matmuls, the position
    embedding, the patch embedding and the head at one byte per parameter (int8 kernels are the
    smallest stored form). Malformed sizes raise a CheckpointError."""
    from keras_vit.errors import CheckpointError
    from keras_vit.models.config import resnet_stride

    hidden, layers, mlp, patch = (_positive_int(config, k, source)
                                  for k in ("hidden_size", "num_layers", "mlp_dim", "patch_size"))
    _positive_int(config, "num_heads", source)
    channels = _positive_int(config, "num_channels", source, default=3)
    size = config.get("image_size", 224)
    size = [size, size] if isinstance(size, int) and not isinstance(size, bool) else size
    if not isinstance(size, (list, tuple)) or len(size) != 2 or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in size
    ):
        raise CheckpointError(f"{source}: image_size is {str(size)[:40]!r}; expected a positive int or [height, width].")
    resnet = config.get("resnet")
    if resnet is not None:
        if not (isinstance(resnet, (list, tuple)) and len(resnet) == 2 and isinstance(resnet[0], (list, tuple))
                and all(isinstance(u, int) and not isinstance(u, bool) and 0 <= u <= 64 for u in resnet[0])
                and len(resnet[0]) <= 8 and isinstance(resnet[1], (int, float)) and not isinstance(resnet[1], bool)
                and 0 < resnet[1] <= 16):
            raise CheckpointError(f"{source}: resnet is {str(resnet)[:60]!r}; expected [[units per stage], width].")
    stride = patch * resnet_stride(resnet)
    tokens = (size[0] // stride) * (size[1] // stride) + 1
    params = layers * (4 * hidden * hidden + 2 * hidden * mlp) + tokens * hidden + patch * patch * channels * hidden
    if config.get("include_top", True):
        params += _positive_int(config, "classes", source, default=1000) * hidden
    return params


VIT = ModelFamily(
    name="vit",
    title="Vision Transformer",
    model="keras_vit.models.vit:VisionTransformer",
    config_class=ViTConfig,
    architectures=ARCHITECTURES,
    extra_architectures=EXTRA_ARCHITECTURES,
    signature=("patch_size", "hidden_size"),
    flops="keras_vit.flops:vit_flops",
    presets="keras_vit.presets:VIT_PRESET_ROWS",
    head="head/",
    optional_weights=("head/", "pre_logits/"),
    resizable_weights=("Transformer/posembed_input/", "embedding/kernel", "head/"),
    features_pooling=None,
    patch_resize=True,
    source_grid=_vit_source_grid,
    dynamic_size="flag",
    describe=_vit_describe,
    card=_vit_card,
    weights_lower_bound=_vit_weights_lower_bound,
    to_checkpoint=_vit_to_checkpoint,
    from_checkpoint=_vit_from_checkpoint,
    constructor_doc=VIT_DOC,
    doc_fields=_vit_doc_fields,
    constructor_owned=("dynamic_image_size",),
    row_overridable=("classifier", "patch_size"),  # a gap variant; FlexiViT's other patch sizes
    npz_format="npz",
    int8=True,
    # --- transfer: dropout 0, the model's remat; position embeddings follow any input size ---
    transfer=Transfer(settings="keras_vit.models.transfer:dropout_free_settings",
                      options=("dropout_rate", "attention_dropout_rate", "remat")),
    # --- end of transfer ---
)


# === BiT ResNet-v2 (the paper's CNN baselines) ===


def _bit_describe(config):
    return f"BiT ResNet units {tuple(config['block_units'])}, width x{config.get('width_factor')}"


def _bit_card(config):
    intro = ("BiT ResNet-v2 weights for keras_vit (Keras 3: JAX, TensorFlow, PyTorch), the CNN baselines of\n"
             "\"An Image is Worth 16x16 Words\" (Dosovitskiy et al., ICLR 2021) from \"Big Transfer (BiT)\"\n"
             "(Kolesnikov et al., 2020).")
    rows = [
        ("architecture", f"BiT ResNet-v2, units per stage {tuple(config['block_units'])}, width x{config['width_factor']}"),
        ("numerics", f"GroupNorm eps {config['group_norm_epsilon']:g}, weight standardisation eps "
                     f"{config['std_conv_epsilon']:g}"),
    ]
    return ("bit", "resnet"), intro, rows


def _bit_doc_fields(row):
    return dict(paper_name=row.paper_name.replace(" (BiT)", ""),
                unreleased="" if row.timm_name else " Its weights were never released: weights=None only.")


BIT_DOC = """Instantiates the BiT {paper_name} architecture, one of the paper's CNN baselines.

Reference: "Big Transfer (BiT): General Visual Representation Learning" (Kolesnikov et al.,
ECCV 2020), compared against in "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021).
A pre-activation ResNet-v2 with GroupNorm and weight-standardised convolutions: units per stage
{block_units}, width x{width_factor}.{unreleased}

Inputs are channels-last images scaled to [-1, 1] (see `keras_vit.preprocess_input`).

Args:
    include_top: whether to end in the classification head (GN+ReLU, average pool, 1x1 conv).
    weights: None (random initialisation), a preset tag (see `keras_vit.list_presets("{name}")`;
        aliases "imagenet" and "imagenet21k"), a local checkpoint path (a timm folder or
        .safetensors, a BiT .npz, a Keras preset), or "hf://owner/repo".
    input_tensor: optional Keras tensor to use as the image input.
    input_shape: (height, width, 3); default (224, 224, 3). Any size, also (None, None, 3): the
        network is fully convolutional.
    pooling: with include_top=False: None returns the (batch, h, w, channels) features; "avg" or
        "max" pool them to (batch, channels).
    classes: classes of the head. With pretrained weights, a value other than the checkpoint's
        attaches a fresh zero-initialised head.
    classifier_activation: activation of the head; None returns logits.
    name: model name.
    **overrides: other `keras_vit.models.BiTResNet` arguments (numerics fields, dtype).

Returns:
    A `keras_vit.models.BiTResNet` (a `keras.Model`).

Example:
    >>> model = keras_vit.{name}(weights=None, input_shape=(224, 224, 3))
"""

BIT = ModelFamily(
    name="bit",
    title="BiT ResNet-v2",
    model="keras_vit.models.bit:BiTResNet",
    config_class=BiTConfig,
    architectures=BIT_ARCHITECTURES,
    signature=("block_units",),
    flops="keras_vit.flops:bit_flops",
    presets="keras_vit.presets:BIT_PRESET_ROWS",
    head="resnet/head/",
    optional_weights=("resnet/head/",),
    resizable_weights=("resnet/head/",),
    features_pooling="avg",
    patch_resize=False,
    source_grid=None,
    dynamic_size="native",
    describe=_bit_describe,
    card=_bit_card,
    constructor_doc=BIT_DOC,
    doc_fields=_bit_doc_fields,
    npz_format="bit_npz",
    # --- transfer: BiT-HyperRule (zero head, 128 px below 96x96 images, else 480); fully convolutional ---
    transfer=Transfer(resolution="keras_vit.models.transfer:bit_hyperrule_resolution", features=("pool",)),
    # --- end of transfer ---
)
