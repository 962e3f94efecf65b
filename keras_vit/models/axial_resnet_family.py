"""AxialResNet's config, architecture table, spans and sharding rules, without Keras (the CLI and
the preset table read them without a backend).

The original (csrhddlam/axial-deeplab `lib/models/axialnet.py`) fixes each stage's attention
span for 224-px inputs: 56, 56, 28, 14 for the first block of each stage (the span of the
blocks after a strided one is half). Its relative-embedding tables have one column per offset
of the span, so a network runs only at the size its spans were made for; keras_vit derives the
spans from `image_size` (the stem's output grid, ceil(size / 4), then halved per strided stage),
which gives the original's at 224 (and at 221-223, which reach the same 56x56 grid), and other
networks at other sizes. A checkpoint's weights fit only the spans it was trained with, so
the original's checkpoints load at 224 px; other sizes are refused when the weights are loaded.
"""

import dataclasses
import math
from typing import ClassVar

from keras_vit.geometry import input_size
from keras_vit.models.config import FieldGroupConfig
from keras_vit.models.transfer import Transfer

#: PyTorch's BatchNorm epsilon, which every norm of the original uses.
BATCH_NORM_EPSILON = 1e-5

# === Architecture table ===


@dataclasses.dataclass(frozen=True)
class AxialResNetArchitecture:
    """One AxialResNet constructor: blocks per stage and the width multiplier `s`."""

    name: str
    paper_name: str
    block_units: tuple
    width_multiplier: float
    params: int  # trainable parameters with the 1000-class head, counted from the original's modules

    stride = 32

    def kwargs(self):
        return {"block_units": self.block_units, "width_multiplier": self.width_multiplier}


AXIAL_RESNET_ARCHITECTURES = {
    a.name: a
    for a in (
        AxialResNetArchitecture("AxialResNet26S", "Axial-ResNet-26-S", (1, 2, 4, 1), 0.5, 5_944_936),
        AxialResNetArchitecture("AxialResNet50S", "Axial-ResNet-50-S", (3, 4, 6, 3), 0.5, 11_586_216),
        AxialResNetArchitecture("AxialResNet50M", "Axial-ResNet-50-M", (3, 4, 6, 3), 0.75, 25_179_400),
        AxialResNetArchitecture("AxialResNet50L", "Axial-ResNet-50-L", (3, 4, 6, 3), 1.0, 43_973_480),
    )
}

# === Spans ===


def stem_grid(size):
    """The side of the stem's output (7x7 stride-2 conv, pad 3; 3x3 stride-2 max pool, pad 1)."""
    return ((size - 1) // 2) // 2 + 1


def axial_spans(image_size, block_units):
    """[(span, stride) for each block] of an AxialResNet at `image_size`, or a ValueError that
    says why the size cannot work and which sizes do."""
    image_size = input_size(image_size)
    if None in image_size:
        raise ValueError(
            "AxialResNet needs a fixed image size: the attention's relative embeddings have one entry per offset of "
            "a fixed span (input_shape=(None, None, 3) cannot be built). Pass image_size=224, the size of the "
            "original's checkpoints."
        )
    h, w = (int(s) for s in image_size)
    strided = len(block_units) - 1
    multiple = 4 * 2**strided
    if h != w:
        raise ValueError(
            f"AxialResNet needs a square image: each block attends along the height and the width with one span "
            f"(the original's kernel_size); got {h}x{w}. Resize or crop to a square, e.g. {max(h, w)}x{max(h, w)} "
            "rounded to a multiple of {multiple}."
        )
    grid = stem_grid(h)
    if grid < 2**strided or grid % 2**strided:
        options = sorted({max(1, round(h / multiple)) * multiple, max(1, h // multiple) * multiple,
                          (h // multiple + 1) * multiple})
        raise ValueError(
            f"AxialResNet with {len(block_units)} stages cannot run at {h}x{w}: the stem's {grid}x{grid} grid must "
            f"halve evenly {strided} times (each strided block pools 2x2 and its shortcut is a stride-2 conv, which "
            f"disagree on odd sizes). Use a multiple of {multiple}, e.g. image_size={options[0]}"
            + (f" or {options[-1]}" if options[-1] != options[0] else "") + "."
        )
    spans = []
    for stage, units in enumerate(block_units):
        stride = 1 if stage == 0 else 2
        for unit in range(units):
            spans.append((grid, stride if unit == 0 else 1))
            if unit == 0:
                grid //= stride
    return spans


# === Config ===


def _field(group, default=dataclasses.MISSING):
    return dataclasses.field(default=default, metadata={"group": group})


def _positive_int(value, key):
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 1:
        raise ValueError(f"{key} must be a positive int; got {value!r}.")
    return int(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AxialResNetConfig(FieldGroupConfig):
    """Every argument of `keras_vit.models.AxialResNet`, normalised and validated once.

    Example:
        >>> AxialResNetConfig(block_units=(1, 2, 4, 1)).spans[:3]
        [(56, 1), (56, 2), (28, 1)]
    """

    family: ClassVar[str] = "axial_resnet"

    image_size: tuple = _field("architecture", (224, 224))
    block_units: tuple = _field("architecture", (3, 4, 6, 3))
    width_multiplier: float = _field("architecture", 0.5)
    groups: int = _field("architecture", 8)
    classes: int = _field("architecture", 1000)
    num_channels: int = _field("architecture", 3)
    batch_norm_epsilon: float = _field("numerics", BATCH_NORM_EPSILON)
    include_top: bool = _field("head", True)
    pooling: str = _field("head", None)
    classifier_activation: object = _field("head", "softmax")

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("image_size", input_size(self.image_size))
        units = self.block_units
        if isinstance(units, (str, bytes)) or not hasattr(units, "__iter__") or not tuple(units) or any(
            isinstance(u, bool) or not hasattr(u, "__index__") or int(u) < 1 for u in units
        ):
            raise ValueError(f"block_units must be one or more positive unit counts, e.g. (3, 4, 6, 3); got {units!r}.")
        set_("block_units", tuple(int(u) for u in units))
        s = self.width_multiplier
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 64:
            raise ValueError(f"width_multiplier must be a positive number (0.5, 0.75, 1); got {s!r}.")
        if int(64 * s) < 1:
            raise ValueError(f"width_multiplier {s} leaves the stem without channels.")
        set_("groups", _positive_int(self.groups, "groups"))
        set_("num_channels", _positive_int(self.num_channels, "num_channels"))
        if self.classes is not None:
            set_("classes", _positive_int(self.classes, "classes"))
        for stage in range(len(self.block_units)):
            planes = int(128 * 2**stage * s)
            if planes % self.groups or (planes // self.groups) % 2:
                raise ValueError(
                    f"width_multiplier {s} gives stage {stage + 1} {planes} channels, which {self.groups} heads do not "
                    "split into even head widths (queries and keys take half of each)."
                )
        eps = self.batch_norm_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ValueError(f"batch_norm_epsilon must be in (0, 1); got {eps!r}.")
        set_("batch_norm_epsilon", float(eps))
        set_("include_top", bool(self.include_top))
        if self.pooling not in (None, "avg", "gap", "max"):
            raise ValueError(f"pooling must be None, 'avg' (alias 'gap') or 'max'; got {self.pooling!r}.")
        if self.include_top and self.classes is None:
            raise ValueError("include_top=True needs a positive number of classes; got classes=None.")
        axial_spans(self.image_size, self.block_units)

    @property
    def spans(self):
        """[(span, stride)] of every block."""
        return axial_spans(self.image_size, self.block_units)

    def to_dict(self):
        out = {f: getattr(self, f) for f in self.fields()}
        out["image_size"] = list(self.image_size)
        out["block_units"] = list(self.block_units)
        return out


def axial_resnet_flops(config, image_size=None, classes=None):
    """Forward FLOPs (one multiply-add = 2) of an AxialResNet: convolutions, the attention's
    projections, similarities (q.k, q.r, k.r), weighted sums (values and value embeddings) and
    the head; norms, softmax and pooling are not counted (the Table-6 convention)."""
    get = config.get  # a dict or a config object (a mapping of its fields)
    size = image_size if image_size is not None else get("image_size", (224, 224))
    units = tuple(get("block_units"))
    s = get("width_multiplier")
    groups = get("groups", 8) or 8
    classes = classes if classes is not None else get("classes", 1000)
    side = input_size(size)[0]
    stem = int(64 * s)
    conv1 = ((side - 1) // 2 + 1) ** 2 * 7 * 7 * get("num_channels", 3) * stem
    macs = conv1
    inplanes = stem
    spans = axial_spans(size, units)
    index = 0
    for stage, n in enumerate(units):
        planes = int(128 * 2**stage * s)
        for unit in range(n):
            span, stride = spans[index]
            index += 1
            pixels = span * span
            d = planes // groups
            macs += pixels * inplanes * planes  # conv_down
            for axis in range(2):
                macs += pixels * planes * 2 * planes  # qkv projection
                # per sequence: q.k, q.r_q, k.r_k (d/2 each), then weights x (v, v_emb) (d each)
                macs += pixels * span * groups * (3 * (d // 2) + 2 * d)
            out_side = span // stride
            macs += out_side * out_side * planes * 2 * planes  # conv_up
            if unit == 0 and (stride != 1 or inplanes != 2 * planes):
                macs += out_side * out_side * inplanes * 2 * planes  # downsample
            inplanes = 2 * planes
    if classes:
        macs += inplanes * classes
    return 2 * macs


def params_of(block_units, width_multiplier, groups=8, classes=1000, image_size=224, num_channels=3):
    """Trainable parameters of an AxialResNet, from its structure (BatchNorm: scale and shift)."""
    spans = axial_spans(image_size, block_units)
    stem = int(64 * width_multiplier)
    total = 7 * 7 * num_channels * stem + 2 * stem
    inplanes, index = stem, 0
    for stage, n in enumerate(block_units):
        planes = int(128 * 2**stage * width_multiplier)
        d = planes // groups
        for unit in range(n):
            span, stride = spans[index]
            index += 1
            total += inplanes * planes + 2 * planes  # conv_down, bn1
            for _ in range(2):
                total += planes * 2 * planes + 2 * (2 * planes)  # qkv, bn_qkv
                total += 2 * 3 * groups + 2 * (2 * planes)  # bn_similarity, bn_output
                total += 2 * d * (2 * span - 1)  # relative
            total += planes * 2 * planes + 2 * 2 * planes  # conv_up, bn2
            if unit == 0 and (stride != 1 or inplanes != 2 * planes):
                total += inplanes * 2 * planes + 2 * 2 * planes
            inplanes = 2 * planes
    if classes:
        total += inplanes * classes + classes
    return total



# === Sharding rules (`keras_vit.get_layout_map`) ===
#
# The bottleneck's 1x1 convolutions as Megatron's column/row pair across blocks: `conv_up`
# (planes -> 2 x planes, the expansion) and the shortcut's projection split along their output
# channels, so the residual stream between blocks lies split along its channels; the next
# block's `conv_down` (2 x planes -> planes) along its input channels, one all-reduce of its
# partial sums per block; the classifier `fc` along its input rows (one all-reduce of (batch,
# classes), any class count). The axial attentions stay replicated: their similarities are
# BatchNormed as 3 x heads channels concatenated (q.k, q.r, k.r), which a split by heads cannot
# keep split, so XLA all-gathers the (sequences, 3 x heads, span, span) similarity map of every
# attention (at 224 px, 4.2 million values per image in a first-stage attention, 10 to 21 times
# its (56, 56, planes) input). Replicated too: the stem, the relative embedding tables and every
# BatchNorm. One group, "channels": the stem's and every stage's output channels, whose greatest
# common divisor the model axis must divide.

_SCOPE = r"(?:.*/)?"
_BLOCK = _SCOPE + r"layer\d+_\d+/"


def _sharding_rules(m):
    """(group, regex, axes) of every AxialResNet variable, with `m` the model axis name."""
    attention = _BLOCK + r"(?:hight|width)_block/"
    batch_norm = r"/(?:gamma|beta|moving_mean|moving_variance)"
    return [
        ("channels", _BLOCK + r"(?:conv_up|downsample_conv)/kernel", (None, None, None, m)),
        ("channels", _BLOCK + r"conv_down/kernel", (None, None, m, None)),
        ("channels", _SCOPE + r"fc/kernel", (m, None)),
        (None, _SCOPE + r"fc/bias", (None,)),
        (None, attention + r"qkv_transform", (None, None)),
        (None, attention + r"relative", (None, None)),
        (None, attention + r"bn_(?:qkv|similarity|output)" + batch_norm, (None,)),
        (None, _SCOPE + r"(?:layer\d+_\d+/)?(?:bn1|bn2|downsample_bn)" + batch_norm, (None,)),
        (None, _SCOPE + r"conv1/kernel", (None, None, None, None)),
    ]


def _sharding_dims(config):
    """{"channels": the gcd of the stem's and every stage's output channels}."""
    c = AxialResNetConfig.from_dict(config)
    widths = [int(64 * c.width_multiplier)]
    widths += [2 * int(128 * 2**stage * c.width_multiplier) for stage in range(len(c.block_units))]
    return {"channels": math.gcd(*widths)}


SHARDING_GROUPS = {"channels": "1x1 convolutions (conv_up and shortcut outputs, conv_down inputs) and fc rows"}


# === The family record ===


def _describe(config):
    return (f"AxialResNet, blocks {tuple(config['block_units'])}, width x{config['width_multiplier']}, "
            f"{config.get('groups', 8)} heads")


def _weights_lower_bound(config, source):
    """The fewest bytes the weights of `config` take (one byte per parameter); a config that is
    not an AxialResNet's raises a CheckpointError."""
    from keras_vit.errors import CheckpointError

    try:
        c = AxialResNetConfig.from_dict(config)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: {err}") from None
    return params_of(c.block_units, c.width_multiplier, c.groups, c.classes if c.include_top else 0, c.image_size[0],
                     c.num_channels)


def _card(config):
    intro = ("AxialResNet weights for keras_vit (Keras 3: JAX, TensorFlow, PyTorch): the axial-attention ResNet of\n"
             "\"Axial-DeepLab\" (Wang et al., ECCV 2020), a baseline of \"An Image is Worth 16x16 Words\"\n"
             "(Dosovitskiy et al., ICLR 2021, Appendix D.6), as csrhddlam/axial-deeplab builds it.")
    size = config["image_size"][0]
    rows = [("architecture", _describe(config)),
            ("input size", f"{size}x{size} px only (attention spans fixed per stage)"),
            ("numerics", f"BatchNorm eps {config.get('batch_norm_epsilon', BATCH_NORM_EPSILON):g}")]
    return ("axial-resnet", "axial-attention"), intro, rows


DOC = """Instantiates the {paper_name} architecture, the paper's AxialResNet baseline (Appendix D.6).

Reference: "Axial-DeepLab: Stand-Alone Axial-Attention for Panoptic Segmentation" (Wang et al.,
ECCV 2020), as csrhddlam/axial-deeplab's `axialnet.py` builds it: a ResNet-50 layout whose 3x3
convolutions are a height then a width position-sensitive axial attention (8 heads, relative
query/key/value embeddings, BatchNorm on the similarities and outputs, the stride as 2x2 average
pooling), blocks per stage {block_units}, width x{width_multiplier}; {params:,} parameters with
1000 classes.

Inputs are channels-last images. The original normalises them with the ImageNet mean and
standard deviation (`keras_vit.preprocess_input(x, model=model)` applies them; without `model` it maps to [-1, 1]).

Args:
    include_top: whether to end in global average pooling and the linear head.
    weights: None (random initialisation), or a local checkpoint: the original's `.pth.tar`
        (its training script's {{"epoch", "state_dict", ...}}) or a bare state dict, a `.keras`
        file or a Keras preset folder saved from an AxialResNet.
    input_tensor: optional Keras tensor to use as the image input.
    input_shape: (size, size, 3), square; default (224, 224, 3), the size of the original's
        checkpoints. Each stage's attention span is fixed by it (56, 56, 28, 14 at 224 px); other
        square sizes whose stem grid (ceil(size / 4)) halves evenly at each strided stage (a
        multiple of {stride}) build another network, which the original's weights do not fit.
        Sizes that cannot work, and sizes known only at run time, are refused with the reason.
    pooling: with include_top=False: None returns the (batch, h, w, channels) features of the
        last stage; "avg" or "max" pool them to (batch, channels).
    classes: classes of the head.
    classifier_activation: activation of the head; None returns logits.
    name: model name.
    **overrides: other `keras_vit.models.AxialResNet` arguments (groups, batch_norm_epsilon,
        dtype).

Returns:
    A `keras_vit.models.AxialResNet` (a `keras.Model`).

Example:
    >>> model = keras_vit.{name}(weights=None, input_shape=(224, 224, 3))
"""


def _make_record():
    from keras_vit.models.family import IMAGENET_NORMALIZATION, ModelFamily, ShardingRules

    return ModelFamily(
        name="axial_resnet",
        title="AxialResNet",
        model="keras_vit.models.axial_resnet:AxialResNet",
        config_class=AxialResNetConfig,
        architectures=AXIAL_RESNET_ARCHITECTURES,
        signature=("width_multiplier", "groups"),
        flops=axial_resnet_flops,
        head="fc/",
        optional_weights=("fc/",),
        resizable_weights=("fc/",),
        features_pooling="avg",
        patch_resize=False,
        source_grid=None,
        dynamic_size=None,
        describe=_describe,
        card=_card,
        weights_lower_bound=_weights_lower_bound,
        constructor_doc=DOC,
        input_normalization=IMAGENET_NORMALIZATION,  # the original's (torchvision's) ImageNet mean and std
        sharding=ShardingRules(rules=_sharding_rules, dims=_sharding_dims, groups=SHARDING_GROUPS),
        # Its attention spans (and their relative embeddings) are fixed by the image size: it
        # fine-tunes at its checkpoint's resolution.
        transfer=Transfer(resizable=False, features=("avgpool",)),
    )


AXIAL_RESNET = _make_record()
