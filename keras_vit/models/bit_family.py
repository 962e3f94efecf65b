"""The BiT ResNet-v2 family (the paper's CNN baselines, Kolesnikov et al., 2020): its config class
and architecture table, FLOP count (the ResNet trunk the R+ViT hybrids share), preset rows,
sharding rules and family record."""

import dataclasses
from typing import ClassVar

from keras_vit.geometry import input_size
from keras_vit.models.config import NUMERICS, FieldGroupConfig, config_field
from keras_vit.models.family import ModelFamily, ShardingRules
from keras_vit.models.transfer import Transfer

# === The paper's CNN baselines: BiT ResNet-v2 (Kolesnikov et al., 2020) ===

#: The numerics BiT weights run with (timm's port of big_transfer: weight standardisation with
#: eps 1e-8 inside the square root, GroupNorm eps 1e-5).
BIT_NUMERICS = {k: NUMERICS["timm"][k] for k in ("group_norm_epsilon", "std_conv_epsilon", "std_conv_epsilon_inside_sqrt")}


@dataclasses.dataclass(frozen=True)
class BiTArchitecture:
    """One BiT ResNet-v2: units per stage and the width factor (stage widths 64 * w * 2^i)."""

    name: str  # the constructor's name, e.g. "BiTResNet50x1"
    paper_name: str  # e.g. "ResNet-50x1 (BiT)"
    block_units: tuple
    width_factor: int
    timm_name: str = None  # timm's architecture name, e.g. "resnetv2_50x1_bit"

    def kwargs(self):
        """The BiTResNet keyword arguments of this architecture."""
        return dict(block_units=self.block_units, width_factor=self.width_factor)

    @property
    def stride(self):
        """Input pixels per output-feature position (stem 4, x2 for each later stage)."""
        return 4 * 2 ** (len(self.block_units) - 1)


_R50, _R101, _R152, _R200 = (3, 4, 6, 3), (3, 4, 23, 3), (3, 8, 36, 3), (3, 24, 36, 3)

BIT_ARCHITECTURES = {
    a.name: a
    for a in [
        BiTArchitecture("BiTResNet50x1", "ResNet-50x1 (BiT)", _R50, 1, "resnetv2_50x1_bit"),
        BiTArchitecture("BiTResNet50x3", "ResNet-50x3 (BiT)", _R50, 3, "resnetv2_50x3_bit"),
        BiTArchitecture("BiTResNet101x1", "ResNet-101x1 (BiT)", _R101, 1, "resnetv2_101x1_bit"),
        BiTArchitecture("BiTResNet101x3", "ResNet-101x3 (BiT)", _R101, 3, "resnetv2_101x3_bit"),
        BiTArchitecture("BiTResNet152x2", "ResNet-152x2 (BiT)", _R152, 2, "resnetv2_152x2_bit"),
        BiTArchitecture("BiTResNet152x4", "ResNet-152x4 (BiT)", _R152, 4, "resnetv2_152x4_bit"),
        # Trained for the paper's Table 6 but never released: architecture only.
        BiTArchitecture("BiTResNet200x3", "ResNet-200x3 (BiT)", _R200, 3),
    ]
}

# === The BiT ResNet's configuration ===


@dataclasses.dataclass(frozen=True, kw_only=True)
class BiTConfig(FieldGroupConfig):
    """Every argument of `keras_vit.models.BiTResNet`, normalised and validated once (as
    `ViTConfig` is for the ViTs). `image_size` may hold None dimensions: the network is fully
    convolutional.

    Example:
        >>> BiTConfig(image_size=64, block_units=[1, 1], width_factor=0.5).block_units
        (1, 1)
    """

    family: ClassVar[str] = "bit"

    image_size: tuple = config_field("architecture", (224, 224), doc="int, (height, width) or None (any size)")
    block_units: tuple = config_field("architecture", (3, 4, 6, 3))
    width_factor: float = config_field("architecture", 1)
    classes: int = config_field("architecture", 1000)
    num_channels: int = config_field("architecture", 3)
    group_norm_epsilon: float = config_field("numerics", BIT_NUMERICS["group_norm_epsilon"])
    std_conv_epsilon: float = config_field("numerics", BIT_NUMERICS["std_conv_epsilon"])
    std_conv_epsilon_inside_sqrt: bool = config_field("numerics", BIT_NUMERICS["std_conv_epsilon_inside_sqrt"])
    include_top: bool = config_field("head", True)
    pooling: str = config_field("head", None)
    classifier_activation: object = config_field("head", "softmax")

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("image_size", input_size(self.image_size))
        try:
            units = tuple(int(u) for u in self.block_units)
        except (TypeError, ValueError):
            units = ()
        if not units or any(u < 1 for u in units):
            raise ValueError(
                f"block_units must be one or more positive unit counts, e.g. (3, 4, 6, 3); got {self.block_units!r}."
            )
        set_("block_units", units)
        width = self.width_factor
        if isinstance(width, float) and width.is_integer():
            set_("width_factor", int(width))
        root = 64 * self.width_factor
        if isinstance(self.width_factor, bool) or root != int(root) or int(root) % 32 or root <= 0:
            raise ValueError(
                f"width_factor {self.width_factor} gives a {root}-channel stem; GroupNorm's 32 groups need a multiple "
                "of 32 (width_factor 0.5, 1, 1.5, 2, ...)."
            )
        if self.pooling not in (None, "avg", "gap", "max"):
            raise ValueError(f"pooling must be one of None, 'avg' (alias 'gap') or 'max'; got {self.pooling!r}.")
        if self.include_top and (self.classes is None or int(self.classes) < 1):
            raise ValueError(f"include_top=True needs a positive number of classes; got classes={self.classes!r}.")
        if self.classes is not None:
            set_("classes", int(self.classes))
        set_("num_channels", int(self.num_channels))
        for key in ("group_norm_epsilon", "std_conv_epsilon"):
            set_(key, float(getattr(self, key)))
        for key in ("std_conv_epsilon_inside_sqrt", "include_top"):
            set_(key, bool(getattr(self, key)))

    @property
    def stride(self):
        """Input pixels per position of the final feature map (stem 4, x2 for each later stage)."""
        return 4 * 2 ** (len(self.block_units) - 1)

    def to_dict(self):
        """The fields as JSON-friendly values: `BiTResNet.get_config()`'s."""
        out = {f: getattr(self, f) for f in self.fields()}
        out["image_size"] = list(self.image_size)
        out["block_units"] = list(self.block_units)
        return out


# === FLOPs (the ResNet trunk, also the R+ViT hybrids') ===


def conv_flops(h, w, kernel, c_in, c_out):
    """FLOPs of a convolution producing an (h, w, c_out) map."""
    return 2 * h * w * kernel * kernel * c_in * c_out


def _sym(n, kernel, stride):
    return (n + 2 * ((kernel - 1) // 2) - kernel) // stride + 1


def _same(n, stride):
    return -(-n // stride)


def resnet_flops(h, w, units, width_factor, channels, preact):
    """The ResNet trunk: the 7x7/2 root, the 3x3/2 pool, bottleneck stages (stride on the 3x3).
    `preact` (BiT baselines) pads symmetrically; the hybrids pad TF-SAME. Same convolutions."""
    root = int(64 * width_factor)
    out = (lambda n, k, s: _sym(n, k, s)) if preact else (lambda n, k, s: _same(n, s))
    h, w = out(h, 7, 2), out(w, 7, 2)
    total = conv_flops(h, w, 7, channels, root)
    h, w = (_sym(h, 3, 2), _sym(w, 3, 2)) if preact else (_same(h, 2), _same(w, 2))
    c = root
    for i, n in enumerate(units):
        f = root * 2**i
        for u in range(n):
            stride = 2 if (i > 0 and u == 0) else 1
            ho, wo = out(h, 3, stride), out(w, 3, stride)
            total += conv_flops(h, w, 1, c, f)  # conv1 / a
            total += conv_flops(ho, wo, 3, f, f)  # conv2 / b (the stride)
            total += conv_flops(ho, wo, 1, f, 4 * f)  # conv3 / c
            if c != 4 * f or stride != 1:
                total += conv_flops(ho, wo, 1, c, 4 * f)  # projection
            h, w, c = ho, wo, 4 * f
    return total, (h, w, c)


def bit_flops(config, image_size, classes):
    """Forward FLOPs of a BiT ResNet-v2 `config` (BiTResNet arguments) at `image_size` (h, w)."""
    h, w = image_size
    units, width_factor = tuple(config["block_units"]), config["width_factor"]
    total, (_, _, c) = resnet_flops(h, w, units, width_factor, config.get("num_channels", 3), preact=True)
    return total + (2 * c * classes if classes else 0)


# === Reading a ResNet's weight tree ===


def width_factor(channels):
    """The width factor of a ResNet whose root convolution has `channels` outputs (64 per unit)."""
    width = channels / 64
    return int(width) if float(width).is_integer() else width


def count_units(tree, pattern):
    """{stage: units} from the keys of `tree` that `pattern` matches (groups: stage, unit)."""
    units = {}
    for key in tree:
        m = pattern.match(key)
        if m:
            s, u = int(m.group(1)), int(m.group(2))
            units[s] = max(units.get(s, 0), u)
    return units


# === Preset rows ===

# The paper's CNN baselines: timm's ports of the BiT ResNet-v2 weights (google-research/big_transfer).
# (constructor, tag, resolution, classes, ImageNet-1k top-1 from timm's results-imagenet.csv, Hub repo)
_TIMM_BIT_ROWS = [
    ("BiTResNet50x1", "goog_in21k_ft_in1k", 448, 1000, 80.340, "timm/resnetv2_50x1_bit.goog_in21k_ft_in1k"),
    ("BiTResNet50x1", "goog_distilled_in1k", 224, 1000, 82.820, "timm/resnetv2_50x1_bit.goog_distilled_in1k"),
    ("BiTResNet50x1", "goog_in21k", 224, 21843, None, "timm/resnetv2_50x1_bit.goog_in21k"),
    ("BiTResNet50x3", "goog_in21k_ft_in1k", 448, 1000, 84.020, "timm/resnetv2_50x3_bit.goog_in21k_ft_in1k"),
    ("BiTResNet50x3", "goog_in21k", 224, 21843, None, "timm/resnetv2_50x3_bit.goog_in21k"),
    ("BiTResNet101x1", "goog_in21k_ft_in1k", 448, 1000, 82.342, "timm/resnetv2_101x1_bit.goog_in21k_ft_in1k"),
    ("BiTResNet101x1", "goog_in21k", 224, 21843, None, "timm/resnetv2_101x1_bit.goog_in21k"),
    ("BiTResNet101x3", "goog_in21k_ft_in1k", 448, 1000, 84.438, "timm/resnetv2_101x3_bit.goog_in21k_ft_in1k"),
    ("BiTResNet101x3", "goog_in21k", 224, 21843, None, "timm/resnetv2_101x3_bit.goog_in21k"),
    ("BiTResNet152x2", "goog_in21k_ft_in1k", 448, 1000, 84.510, "timm/resnetv2_152x2_bit.goog_in21k_ft_in1k"),
    ("BiTResNet152x2", "goog_teacher_in21k_ft_in1k", 224, 1000, 82.876,
     "timm/resnetv2_152x2_bit.goog_teacher_in21k_ft_in1k"),
    ("BiTResNet152x2", "goog_teacher_in21k_ft_in1k_384", 384, 1000, 83.834,
     "timm/resnetv2_152x2_bit.goog_teacher_in21k_ft_in1k_384"),
    ("BiTResNet152x2", "goog_in21k", 224, 21843, None, "timm/resnetv2_152x2_bit.goog_in21k"),
    ("BiTResNet152x4", "goog_in21k_ft_in1k", 480, 1000, 84.916, "timm/resnetv2_152x4_bit.goog_in21k_ft_in1k"),
    ("BiTResNet152x4", "goog_in21k", 224, 21843, None, "timm/resnetv2_152x4_bit.goog_in21k"),
]

#: The weights' licence: google-research/big_transfer publishes them under Apache-2.0, as timm's
#: resnetv2.py `_cfg` states for every one of its BiT tags.
BIT_LICENSE = "apache-2.0"

#: Each family's preset rows (`ModelFamily.presets`): (constructor, tag, resolution, classes,
#: top-1, Hub repository, original file or None, source, {further `Preset` fields}).
BIT_PRESET_ROWS = tuple((a, t, r, c, top1, repo, None, "timm", dict(license=BIT_LICENSE))
                        for a, t, r, c, top1, repo in _TIMM_BIT_ROWS)



# === Sharding rules (`keras_vit.get_layout_map`) ===
#
# Every convolution's kernel (kh, kw, in, out) is split along its output channels: each device
# computes its slice of the channels, and the next convolution (whose input channels are whole)
# gathers them. Every stage's widths are multiples of the root's 64 x width_factor channels, so
# one group ("channels") says whether the model axis divides them all. GroupNorm scales and
# biases and the head are replicated (small, needed whole by every device).

_SCOPE = r"(?:.*/)?"


def _sharding_rules(m):
    """(group, regex, axes) of every BiT ResNet variable, with `m` the model axis name."""
    return [
        ("channels", _SCOPE + r"root_block/kernel", (None, None, None, m)),
        ("channels", _SCOPE + r"block\d+/unit\d+/(?:[abc]_standardized_conv2d|a_proj)/kernel", (None, None, None, m)),
        (None, _SCOPE + r"(?:block\d+/unit\d+/[abc]_)?group_norm/(?:scale|bias)", (None,)),
        (None, _SCOPE + r"head/kernel", (None, None, None, None)),
        (None, _SCOPE + r"head/bias", (None,)),
    ]


def _sharding_dims(config):
    """The root's channel count, which divides every convolution's output channels."""
    return {"channels": int(64 * config.get("width_factor", 1))}


BIT_SHARDING = ShardingRules(
    rules=_sharding_rules,
    dims=_sharding_dims,
    groups={"channels": "convolutions (output channels)"},
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
    flops=bit_flops,
    presets=BIT_PRESET_ROWS,
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
    sharding=BIT_SHARDING,
    # BiT-HyperRule (zero head, 128 px below 96x96 images, else 480); fully convolutional
    transfer=Transfer(resolution="keras_vit.models.transfer:bit_hyperrule_resolution", features=("pool",)),
)
