"""Axial-ViT (the paper's Appendix D.6): its config, architecture table, FLOPs, sharding rules and
family record, without Keras (the CLI and the preset table read them without a backend).

The paper gives no code; keras_vit builds this reading of D.6. The patches stay a 2-D grid
instead of a 1-D sequence: the ViT patch embedding, no class token, a learned position
embedding over the (rows, cols) grid. Each of the `num_layers` Transformer layers becomes two
Axial Transformer blocks: a row block (x + MHA(LN(x)) along the width, within each row; then
x + MLP(LN(x))) and a column block (the same along the height). A final LayerNorm, global
average pooling over the grid, the optional `pre_logits` (`representation_size`, Dense + tanh)
and the head end it. With ViT-B's widths and patch 16 at 224 px that is 171,620,584 parameters
(1000 classes) and about 67 forward GFLOPs, 1.9x ViT-B/16.
"""

import dataclasses
import re
from typing import ClassVar

from keras_vit.models.config import NUMERICS, RESIZE_RULES, FieldGroupConfig, as_pair, suggest
from keras_vit.models.family import ModelFamily, ShardingRules, stem_block_head_groups
from keras_vit.models.transfer import Transfer
from keras_vit.models.vit_family import (
    VIT_SHARDING,
    transformer_sharding_dims,
    transformer_sharding_outputs,
    transformer_sharding_rules,
)

#: The axes an Axial Transformer block can attend along: "row" (along the width, within each row
#: of the grid) and "column" (along the height, within each column).
AXES = ("row", "column")


# === Architectures ===


@dataclasses.dataclass(frozen=True)
class AxialViTArchitecture:
    """One Axial-ViT constructor: ViT widths and a patch size."""

    name: str  # e.g. "AxialViTB16"
    paper_name: str  # e.g. "Axial-ViT-B/16"
    hidden_size: int
    mlp_dim: int
    num_heads: int
    num_layers: int
    patch_size: int

    def kwargs(self):
        """The AxialVisionTransformer keyword arguments of this architecture."""
        return {f: getattr(self, f) for f in ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim")}

    @property
    def stride(self):
        return self.patch_size


_B = dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12)

AXIAL_VIT_ARCHITECTURES = {
    a.name: a
    for a in (
        AxialViTArchitecture("AxialViTB16", "Axial-ViT-B/16", patch_size=16, **_B),
        AxialViTArchitecture("AxialViTB32", "Axial-ViT-B/32", patch_size=32, **_B),
    )
}


# === Config ===


def _field(group, default=dataclasses.MISSING):
    return dataclasses.field(default=default, metadata={"group": group})


_ORIGINAL = NUMERICS["original"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class AxialViTConfig(FieldGroupConfig):
    """Every argument of `keras_vit.models.AxialVisionTransformer`, normalised and validated.

    `attention_axes` are the blocks of one layer in order: ("row", "column") is D.6's, a row
    block followed by a column block.

    Example:
        >>> AxialViTConfig(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
        ...                mlp_dim=32).grid_size
        (4, 4)
    """

    family: ClassVar[str] = "axial_vit"

    image_size: tuple = _field("architecture")
    patch_size: int = _field("architecture")
    hidden_size: int = _field("architecture")
    num_layers: int = _field("architecture")
    num_heads: int = _field("architecture")
    mlp_dim: int = _field("architecture")
    classes: int = _field("architecture", 1000)
    representation_size: int = _field("architecture", None)
    attention_axes: tuple = _field("architecture", AXES)
    num_channels: int = _field("architecture", 3)
    layer_norm_epsilon: float = _field("numerics", _ORIGINAL["layer_norm_epsilon"])
    gelu_approximate: bool = _field("numerics", _ORIGINAL["gelu_approximate"])
    position_embedding_resize: str = _field("numerics", _ORIGINAL["position_embedding_resize"])
    include_top: bool = _field("head", True)
    pooling: str = _field("head", None)
    classifier_activation: object = _field("head", "softmax")
    dropout_rate: float = _field("training", 0.0)
    attention_dropout_rate: float = _field("training", 0.0)
    remat: bool = _field("training", False)

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("image_size", as_pair(self.image_size))
        for key in ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim", "num_channels"):
            value = getattr(self, key)
            if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 1:
                raise ValueError(f"{key} must be a positive int; got {value!r}.")
            set_(key, int(value))
        for key in ("classes", "representation_size"):
            value = getattr(self, key)
            if value is not None:
                if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 1:
                    raise ValueError(f"{key} must be a positive int or None; got {value!r}.")
                set_(key, int(value))
        axes = (self.attention_axes,) if isinstance(self.attention_axes, str) else tuple(self.attention_axes)
        if not axes or any(a not in AXES for a in axes):
            raise ValueError(
                f"attention_axes must be a sequence of 'row' and 'column' (the blocks of one layer, in order; D.6: "
                f"('row', 'column')); got {self.attention_axes!r}."
            )
        set_("attention_axes", axes)
        for key in ("dropout_rate", "attention_dropout_rate"):
            value = float(getattr(self, key))
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{key} must be in [0, 1); got {value!r}.")
            set_(key, value)
        set_("layer_norm_epsilon", float(self.layer_norm_epsilon))
        for key in ("gelu_approximate", "include_top", "remat"):
            set_(key, bool(getattr(self, key)))
        if self.position_embedding_resize not in RESIZE_RULES:
            raise ValueError(
                f"position_embedding_resize must be one of {', '.join(map(repr, RESIZE_RULES))}; got "
                f"{self.position_embedding_resize!r}{suggest(str(self.position_embedding_resize), RESIZE_RULES)}."
            )
        if self.pooling not in (None, "avg", "gap", "max"):
            raise ValueError(
                f"pooling must be None (the (rows, cols, hidden) grid), 'avg' (alias 'gap') or 'max'; got "
                f"{self.pooling!r}."
            )
        if self.include_top and self.classes is None:
            raise ValueError("include_top=True needs a positive number of classes; got classes=None.")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; choose a head "
                "count that divides the hidden size."
            )
        p = self.patch_size
        for axis, size in zip(("height", "width"), self.image_size):
            if size % p or size < p:
                lower, upper = (size // p) * p, (size // p + 1) * p
                examples = f"{lower} or {upper}" if lower else f"{upper}"
                raise ValueError(
                    f"Image {axis} {size} is not divisible by the patch size {p}. Resize the images to a multiple "
                    f"of {p}, e.g. {examples}."
                )

    @property
    def stride(self):
        return self.patch_size

    @property
    def grid_size(self):
        """(rows, cols) of the patch grid."""
        return self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size

    def to_dict(self):
        out = {f: getattr(self, f) for f in self.fields()}
        out["image_size"] = list(self.image_size)
        out["attention_axes"] = list(self.attention_axes)
        return out


# === FLOPs (the Table 6 convention, keras_vit.flops) ===


def axial_vit_flops(config, image_size, classes):
    """Forward FLOPs of an Axial-ViT `config` at `image_size` (h, w): the patch embedding; per
    block the q/k/v/out projections and the MLP of every token, and QK^T and AV within each row
    (or column); the head. 2 FLOPs per multiply-add."""
    from keras_vit.models.vit_family import attention_flops

    h, w = image_size
    p, d, m = config["patch_size"], config["hidden_size"], config["mlp_dim"]
    if h % p or w % p:
        raise ValueError(f"Image size {(h, w)} is not divisible by the patch size {p}.")
    rows, cols = h // p, w // p
    total = 2 * rows * cols * p * p * config.get("num_channels", 3) * d  # patch embedding
    for axis in config.get("attention_axes", AXES):
        # A row block runs `rows` sequences of `cols` tokens; a column block the transpose.
        sequences, length = (rows, cols) if axis == "row" else (cols, rows)
        total += config["num_layers"] * sequences * attention_flops(length, d, m)
    if not (classes or config.get("pooling") is not None):
        return total
    rep = config.get("representation_size")
    if rep:
        total += 2 * d * rep
        d = rep
    if classes:
        total += 2 * d * classes
    return total


# === The family record ===


def _describe(config):
    axes = "+".join(config.get("attention_axes", AXES))
    return (f"Axial-ViT, hidden {config['hidden_size']}, {config['num_layers']} layers of {axes} blocks, "
            f"{config['num_heads']} heads, patch {config['patch_size']}")


def _to_checkpoint(model_config):
    normalised = AxialViTConfig.from_dict(model_config)  # sizes as pairs
    config = {k: normalised[k] for k in AxialViTConfig.architecture_fields() if k in model_config}
    config["attention_axes"] = tuple(config.get("attention_axes", AXES))
    include_top = model_config.get("include_top", True)
    if not include_top:
        config["classes"] = None
    if not (include_top or model_config.get("pooling") is not None):
        config["representation_size"] = None  # no pre_logits layer without pooling
    return config


def _from_checkpoint(config):
    kwargs = dict(config)
    kwargs["include_top"] = config.get("classes") is not None
    kwargs["classes"] = config.get("classes") or 1000
    kwargs["pooling"] = None if kwargs["include_top"] or not config.get("representation_size") else "avg"
    return kwargs


def _source_grid(config):
    h, w = config["image_size"]  # a config object's: always (height, width)
    return h // config["patch_size"], w // config["patch_size"]


def _weights_lower_bound(config, source):
    """The fewest bytes weights of `config` take at one byte per parameter: the blocks' matmuls,
    the position and patch embeddings and the head."""
    from keras_vit.errors import CheckpointError

    try:
        c = AxialViTConfig.from_dict(config)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: {err}") from None
    blocks = c.num_layers * len(c.attention_axes)
    rows, cols = c.grid_size
    params = blocks * (4 * c.hidden_size**2 + 2 * c.hidden_size * c.mlp_dim) + rows * cols * c.hidden_size
    params += c.patch_size**2 * c.num_channels * c.hidden_size
    if config.get("include_top", True) and c.classes:
        params += c.classes * c.hidden_size
    return params


def _card(config):
    intro = ("Axial-ViT weights for keras_vit (Keras 3: JAX, TensorFlow, PyTorch): keras_vit's reading of\n"
             "Appendix D.6 of \"An Image is Worth 16x16 Words\" (Dosovitskiy et al., ICLR 2021), row and column\n"
             "Axial Transformer blocks over the patch grid.")
    numerics = (f"LayerNorm eps {config['layer_norm_epsilon']:g}, GELU "
                f"{'tanh approximation' if config['gelu_approximate'] else 'exact (erf)'}")
    return ("axial-vit",), intro, [("architecture", _describe(config)), ("numerics", numerics)]


DOC = """Instantiates the {paper_name} architecture (Axial-ViT, the paper's Appendix D.6).

keras_vit's reading of D.6 (the paper gives no code): ViT-B widths (hidden {hidden_size}, MLP
{mlp_dim}, {num_heads} heads), the ViT patch embedding ({stride}x{stride} pixels per token), no class
token, a learned position embedding over the (rows, cols) grid; each of the {num_layers} layers is a
row Axial Transformer block (attention along the width within each row, then an MLP) followed
by a column one; a final LayerNorm, global average pooling over the grid, then the head.

Inputs are channels-last images scaled to [-1, 1] (see `keras_vit.preprocess_input`).

Args:
    include_top: whether to end in the classification head.
    weights: None (random initialisation; no Axial-ViT weights are published), or a local
        .keras file / Keras preset folder saved from an Axial-ViT.
    input_tensor: optional Keras tensor to use as the image input.
    input_shape: (height, width, 3); default (224, 224, 3). Any size that {stride} divides,
        square or not (loaded position embeddings are resized to its grid).
    pooling: with include_top=False: None returns the (batch, rows, cols, {hidden_size}) grid after
        the final LayerNorm; "avg" (alias "gap") or "max" pool it to (batch, {hidden_size}).
    classes: classes of the head.
    classifier_activation: activation of the head; None returns logits.
    name: model name.
    **overrides: other `keras_vit.models.AxialVisionTransformer` arguments (dropout_rate,
        attention_dropout_rate, representation_size, attention_axes, remat, numerics fields).

Returns:
    A `keras_vit.models.AxialVisionTransformer` (a `keras.Model`).

Example:
    >>> model = keras_vit.{name}(weights=None, input_shape=(224, 224, 3))
"""

# === Layer groups (layer-wise learning-rate decay) ===

#: The stem: the patch embedding and the position embedding (no class token).
_STEM = re.compile(r"^(embedding|Transformer/posembed_input)(/|$)")
#: Transformer layer i: its row block and its column block, one group (the unit that takes the
#: place of ViT block i, so a decay tuned for a ViT of the same depth scales the same way).
_LAYER = re.compile(r"^Transformer/encoderblock_(\d+)_(?:row|column)/")


def layer_groups(keys):
    """{canonical key: ordinal} for layer-wise learning-rate decay, ordered as a ViT's (timm's
    `param_groups_layer_decay`): the stem, then Transformer layer i (its row and column blocks
    together), the final norm with the last layer, then pre_logits and the head.

    Example:
        >>> layer_groups(["embedding/kernel", "Transformer/encoderblock_1_column/LayerNorm_0/scale", "head/bias"])
        {'embedding/kernel': (0,), 'Transformer/encoderblock_1_column/LayerNorm_0/scale': (1, 1), 'head/bias': (2,)}
    """
    return stem_block_head_groups(keys, _STEM, _LAYER, "Transformer/encoder_norm/")


# === Sharding rules (`keras_vit.get_layout_map`) ===
#
# A ViT's tensor-parallel layout (keras_vit.models.vit_family explains it), block by block: every
# row and column block splits its attention along heads (q/k/v by columns, out by rows) and its
# MLP along the hidden units (Dense_0 by columns, Dense_1 by rows), one all-reduce per sublayer;
# the patch and position embeddings are split along hidden, pre_logits by columns, the head by
# rows; LayerNorms and the out / Dense_1 / head biases are replicated. A block attends within
# each row (or column) of the grid, which it runs as (batch * rows, cols, hidden) sequences; the
# outputs of its two residual branches are laid out (batch, None, None) on that batch-major
# first dimension, as a ViT block's. The fallback groups are the ViT's: heads, mlp_dim,
# hidden_size, representation_size and the head's input.

#: An Axial-ViT block's path prefix: `encoderblock_{i}_row/`, `encoderblock_{i}_column/`.
_AXIAL_BLOCK = r"(?:.*/)?encoderblock_\d+_(?:row|column)/"


def _sharding_rules(m):
    return transformer_sharding_rules(m, block=_AXIAL_BLOCK)


def _sharding_outputs(data_axis):
    return transformer_sharding_outputs(data_axis, block=_AXIAL_BLOCK)


AXIAL_VIT_SHARDING = ShardingRules(
    rules=_sharding_rules,
    dims=transformer_sharding_dims,
    groups=VIT_SHARDING.groups,
    outputs=_sharding_outputs,
)


AXIAL_VIT = ModelFamily(
    name="axial_vit",
    title="Axial-ViT",
    model="keras_vit.models.axial_vit:AxialVisionTransformer",
    config_class=AxialViTConfig,
    architectures=AXIAL_VIT_ARCHITECTURES,
    signature=("attention_axes",),
    flops=axial_vit_flops,
    head="head/",
    optional_weights=("head/", "pre_logits/"),
    resizable_weights=("Transformer/posembed_input/", "head/"),
    features_pooling="avg",
    patch_resize=False,
    source_grid=_source_grid,
    dynamic_size=None,
    describe=_describe,
    card=_card,
    weights_lower_bound=_weights_lower_bound,
    to_checkpoint=_to_checkpoint,
    from_checkpoint=_from_checkpoint,
    constructor_doc=DOC,
    layer_groups=layer_groups,
    sharding=AXIAL_VIT_SHARDING,
    no_weight_decay=("Transformer/posembed_input/",),  # the position embedding, as a ViT's
    # Dropout 0 and the model's remat, as the ViT; the position embedding follows any input size.
    transfer=Transfer(settings="keras_vit.models.transfer:dropout_free_settings",
                      options=("dropout_rate", "attention_dropout_rate", "remat")),
)
