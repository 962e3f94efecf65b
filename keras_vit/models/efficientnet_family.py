"""EfficientNet's config, architecture table, block plan, parameter and FLOP counts and sharding
rules, without Keras (the CLI and the preset table read them without a backend).

The networks are timm's TF ports `tf_efficientnet_b0` ... `b7` and `tf_efficientnet_l2` (the
Noisy Student weights of "Self-training with Noisy Student improves ImageNet classification",
Xie et al., CVPR 2020, a column of the ViT paper's Table 2), as timm's `_gen_efficientnet`
builds them: seven stages of blocks

    stage  block                        repeats  kernel  stride  expansion  channels
    1      depthwise-separable          1        3       1       1          16
    2      inverted residual (MBConv)   2        3       2       6          24
    3      inverted residual            2        5       2       6          40
    4      inverted residual            3        3       2       6          80
    5      inverted residual            3        5       1       6          112
    6      inverted residual            4        5       2       6          192
    7      inverted residual            1        3       1       6          320

between a 3x3 stride-2 stem of 32 channels and a 1x1 head convolution of 1280, every one with
squeeze-excitation (reduced channels: a quarter of the block's input channels). The width
multiplier scales every channel count, rounded to a multiple of 8 (`round_channels`: nearest
multiple, never below 90% of the scaled value); the depth multiplier scales each stage's repeats,
rounded up. Every convolution pads as TensorFlow's "SAME" does, from the actual input size.
"""

import dataclasses
import math
from typing import ClassVar

from keras_vit.geometry import as_pair, input_size
from keras_vit.models.config import FieldGroupConfig
from keras_vit.models.family import IMAGENET_NORMALIZATION
from keras_vit.models.transfer import Transfer

#: TensorFlow's BatchNorm epsilon, which the TF ports keep (timm's BN_EPS_TF_DEFAULT).
BATCH_NORM_EPSILON = 1e-3
#: The training-time BatchNorm momentum of the original TensorFlow code (Keras' convention).
BATCH_NORM_MOMENTUM = 0.99
#: timm's default stochastic-depth rate for training EfficientNets (the original's drop_connect_rate).
DROP_PATH_RATE = 0.2
#: Channel rounding: multiples of this many channels.
CHANNEL_DIVISOR = 8

#: (block type, repeats, kernel, stride, expansion, output channels) of the seven stages before
#: scaling; "ds" is the depthwise-separable block, "ir" the inverted residual (MBConv).
BASE_STAGES = (
    ("ds", 1, 3, 1, 1, 16),
    ("ir", 2, 3, 2, 6, 24),
    ("ir", 2, 5, 2, 6, 40),
    ("ir", 3, 3, 2, 6, 80),
    ("ir", 3, 5, 1, 6, 112),
    ("ir", 4, 5, 2, 6, 192),
    ("ir", 1, 3, 1, 6, 320),
)
STEM_CHANNELS = 32
HEAD_CHANNELS = 1280
SE_RATIO = 0.25

#: The preprocessing the Noisy Student weights were evaluated with (timm's pretrained_cfg of the
#: `ns_jft_in1k` tags): ImageNet mean and standard deviation on [0, 1] pixels, a bicubic resize of
#: the shorter side to resolution / crop_pct, then a central crop of the resolution.
IMAGENET_MEAN, IMAGENET_STD = IMAGENET_NORMALIZATION
INTERPOLATION = "bicubic"


# === Scaling rules ===


def round_channels(channels, multiplier=1.0, divisor=CHANNEL_DIVISOR):
    """`channels * multiplier` rounded to the nearest multiple of `divisor` (at least `divisor`),
    one multiple more when rounding would lose over 10%.

    Example:
        >>> round_channels(32, 4.3), round_channels(1280, 1.1), round_channels(16, 1.0)
        (136, 1408, 16)
    """
    value = channels * multiplier
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


def scale_depth(repeats, multiplier):
    """A stage's repeats scaled by `multiplier`, rounded up."""
    return int(math.ceil(repeats * multiplier))


@dataclasses.dataclass(frozen=True)
class BlockPlan:
    """One block: its place (stage, index in the stage), type, channels, kernel, stride,
    expanded (mid) and squeeze-excitation channels, and whether it adds its input back."""

    stage: int
    index: int
    kind: str
    in_channels: int
    out_channels: int
    kernel: int
    stride: int
    mid_channels: int
    se_channels: int

    @property
    def residual(self):
        return self.stride == 1 and self.in_channels == self.out_channels

    @property
    def prefix(self):
        """The block's path in the weight tree (timm's module path)."""
        return f"blocks/{self.stage}/{self.index}/"


def block_plan(width_multiplier, depth_multiplier):
    """[BlockPlan] of every block, in order, for the multipliers."""
    plan = []
    channels = round_channels(STEM_CHANNELS, width_multiplier)
    for stage, (kind, repeats, kernel, stride, expansion, out) in enumerate(BASE_STAGES):
        out = round_channels(out, width_multiplier)
        for index in range(scale_depth(repeats, depth_multiplier)):
            mid = channels if kind == "ds" else round_channels(channels * expansion, 1.0)
            se = int(round(mid * (SE_RATIO / expansion)))  # a quarter of the block's input channels
            plan.append(BlockPlan(stage, index, kind, channels, out, kernel, stride if index == 0 else 1, mid, se))
            channels = out
    return plan


def stem_channels(width_multiplier):
    return round_channels(STEM_CHANNELS, width_multiplier)


def head_channels(width_multiplier):
    return round_channels(HEAD_CHANNELS, width_multiplier)


# === Weight shapes, parameters, FLOPs ===

_BN_LEAVES = ("gamma", "beta", "moving_mean", "moving_variance")


def _bn(tree, prefix, channels):
    for leaf in _BN_LEAVES:
        tree[f"{prefix}/{leaf}"] = (channels,)


def weight_shapes(width_multiplier, depth_multiplier, classes=1000, num_channels=3):
    """{canonical key: shape} of an EfficientNet's weight tree (Keras layouts, timm's module
    paths); `classes` None or 0 leaves out the classifier."""
    stem = stem_channels(width_multiplier)
    tree = {"conv_stem/kernel": (3, 3, num_channels, stem)}
    _bn(tree, "bn1", stem)
    plan = block_plan(width_multiplier, depth_multiplier)
    for b in plan:
        p = b.prefix
        if b.kind == "ir":
            tree[p + "conv_pw/kernel"] = (1, 1, b.in_channels, b.mid_channels)
            _bn(tree, p + "bn1", b.mid_channels)
        tree[p + "conv_dw/kernel"] = (b.kernel, b.kernel, b.mid_channels, 1)
        _bn(tree, p + ("bn2" if b.kind == "ir" else "bn1"), b.mid_channels)
        tree[p + "se/conv_reduce/kernel"] = (1, 1, b.mid_channels, b.se_channels)
        tree[p + "se/conv_reduce/bias"] = (b.se_channels,)
        tree[p + "se/conv_expand/kernel"] = (1, 1, b.se_channels, b.mid_channels)
        tree[p + "se/conv_expand/bias"] = (b.mid_channels,)
        last = "conv_pwl" if b.kind == "ir" else "conv_pw"
        tree[p + last + "/kernel"] = (1, 1, b.mid_channels, b.out_channels)
        _bn(tree, p + ("bn3" if b.kind == "ir" else "bn2"), b.out_channels)
    head = head_channels(width_multiplier)
    tree["conv_head/kernel"] = (1, 1, plan[-1].out_channels, head)
    _bn(tree, "bn2", head)
    if classes:
        tree["classifier/kernel"] = (head, classes)
        tree["classifier/bias"] = (classes,)
    return tree


def params_of(width_multiplier, depth_multiplier, classes=1000, num_channels=3):
    """Trainable parameters of an EfficientNet (BatchNorm: scale and shift; the running
    statistics are not trained)."""
    return sum(math.prod(shape) for key, shape in weight_shapes(width_multiplier, depth_multiplier, classes,
                                                                 num_channels).items()
               if not key.endswith(("moving_mean", "moving_variance")))


def _same(n, stride):
    """Output length of a TF-"SAME" convolution: ceil(n / stride)."""
    return -(-n // stride)


def efficientnet_flops(config, image_size=None, classes=None):
    """Forward FLOPs (one multiply-add = 2) of an EfficientNet: every convolution (depthwise ones
    at k * k per output value, the squeeze-excitation's 1x1 convolutions on the pooled vector)
    and the classifier; norms, activations, pooling, the gating product and additions are not
    counted (the convention of `keras_vit.flops`)."""
    get = config.get  # a dict or a config object (a mapping of its fields)
    size = image_size if image_size is not None else get("image_size", (224, 224))
    h, w = as_pair(size)
    s, d = get("width_multiplier"), get("depth_multiplier")
    classes = classes if classes is not None else get("classes", 1000)
    h, w = _same(h, 2), _same(w, 2)
    stem = stem_channels(s)
    macs = h * w * 9 * get("num_channels", 3) * stem
    for b in block_plan(s, d):
        if b.kind == "ir":
            macs += h * w * b.in_channels * b.mid_channels  # expansion
        h, w = _same(h, b.stride), _same(w, b.stride)
        macs += h * w * b.kernel * b.kernel * b.mid_channels  # depthwise
        macs += 2 * b.mid_channels * b.se_channels  # squeeze-excitation (reduce, expand)
        macs += h * w * b.mid_channels * b.out_channels  # projection
    head = head_channels(s)
    macs += h * w * block_plan(s, d)[-1].out_channels * head
    if classes:
        macs += head * classes
    return 2 * macs


# === Architecture table ===


@dataclasses.dataclass(frozen=True)
class EfficientNetArchitecture:
    """One EfficientNet constructor: timm's (width, depth, resolution, dropout) and its counts."""

    name: str
    paper_name: str
    width_multiplier: float
    depth_multiplier: float
    resolution: int  # the resolution the Noisy Student weights were trained and evaluated at
    dropout: float  # the classifier dropout the original trains with
    params: int  # trainable parameters with the 1000-class head, as timm counts them
    timm_name: str

    stride = 32

    @property
    def default_size(self):
        """The input size the constructor builds when no input_shape is given."""
        return (self.resolution, self.resolution)

    def kwargs(self):
        return {"width_multiplier": self.width_multiplier, "depth_multiplier": self.depth_multiplier,
                "dropout_rate": self.dropout}


#: (constructor, paper name, width, depth, resolution, dropout, trainable parameters, timm name)
_ROWS = (
    ("EfficientNetB0", "EfficientNet-B0", 1.0, 1.0, 224, 0.2, 5_288_548, "tf_efficientnet_b0"),
    ("EfficientNetB1", "EfficientNet-B1", 1.0, 1.1, 240, 0.2, 7_794_184, "tf_efficientnet_b1"),
    ("EfficientNetB2", "EfficientNet-B2", 1.1, 1.2, 260, 0.3, 9_109_994, "tf_efficientnet_b2"),
    ("EfficientNetB3", "EfficientNet-B3", 1.2, 1.4, 300, 0.3, 12_233_232, "tf_efficientnet_b3"),
    ("EfficientNetB4", "EfficientNet-B4", 1.4, 1.8, 380, 0.4, 19_341_616, "tf_efficientnet_b4"),
    ("EfficientNetB5", "EfficientNet-B5", 1.6, 2.2, 456, 0.4, 30_389_784, "tf_efficientnet_b5"),
    ("EfficientNetB6", "EfficientNet-B6", 1.8, 2.6, 528, 0.5, 43_040_704, "tf_efficientnet_b6"),
    ("EfficientNetB7", "EfficientNet-B7", 2.0, 3.1, 600, 0.5, 66_347_960, "tf_efficientnet_b7"),
    ("EfficientNetL2", "EfficientNet-L2", 4.3, 5.3, 800, 0.5, 480_309_308, "tf_efficientnet_l2"),
)
EFFICIENTNET_ARCHITECTURES = {row[0]: EfficientNetArchitecture(*row) for row in _ROWS}

#: timm's TF-ported EfficientNets by architecture name: (width, depth, resolution). B8 has no
#: constructor here, but its files load (`keras_vit.load_checkpoint`).
TIMM_MULTIPLIERS = {a.timm_name: (a.width_multiplier, a.depth_multiplier, a.resolution)
                    for a in EFFICIENTNET_ARCHITECTURES.values()}
TIMM_MULTIPLIERS["tf_efficientnet_b8"] = (2.2, 3.6, 672)


# === Fine-tuning ===


def _architecture_of(config):
    """The constructor row with `config`'s width and depth multipliers, or None."""
    key = (config.get("width_multiplier"), config.get("depth_multiplier"))
    return next((row for row in EFFICIENTNET_ARCHITECTURES.values()
                 if (row.width_multiplier, row.depth_multiplier) == key), None)


def finetune_settings(config):
    """An EfficientNet fine-tunes with its own dropout: the pretrained model's rates, or from a
    checkpoint (which does not record them) its architecture's classifier dropout and drop-path
    rate 0.2."""
    row = _architecture_of(config)
    default = row.dropout if row is not None else EfficientNetConfig.dropout_rate
    return {"dropout_rate": float(config.get("dropout_rate", default)),
            "drop_path_rate": float(config.get("drop_path_rate", DROP_PATH_RATE))}


def finetune_resolution(config, data_size):
    """An EfficientNet fine-tunes at its architecture's resolution (compound scaling ties the
    two), whatever the data; None for multipliers of no constructor (the model's own size)."""
    row = _architecture_of(config)
    return None if row is None else row.default_size


# === Presets ===

#: The Noisy Student weights' licence: timm's efficientnet.py `_cfg` states apache-2.0 for its tags
#: (google's tensorflow/tpu checkpoints they are ported from are Apache-2.0 too).
EFFICIENTNET_LICENSE = "apache-2.0"

#: (constructor, tag, resolution, classes, ImageNet-1k top-1 (timm's results-imagenet.csv), Hub
#: repository, original file, source, {further `Preset` fields}) of the Noisy Student weights timm publishes.
PRESET_ROWS = tuple(
    (name, tag, resolution, 1000, top1, f"timm/{EFFICIENTNET_ARCHITECTURES[name].timm_name}.{tag}", None, "timm",
     dict(license=EFFICIENTNET_LICENSE))
    for name, tag, resolution, top1 in (
        ("EfficientNetB0", "ns_jft_in1k", 224, 78.670),
        ("EfficientNetB1", "ns_jft_in1k", 240, 81.394),
        ("EfficientNetB2", "ns_jft_in1k", 260, 82.378),
        ("EfficientNetB3", "ns_jft_in1k", 300, 84.056),
        ("EfficientNetB4", "ns_jft_in1k", 380, 85.162),
        ("EfficientNetB5", "ns_jft_in1k", 456, 86.088),
        ("EfficientNetB6", "ns_jft_in1k", 528, 86.456),
        ("EfficientNetB7", "ns_jft_in1k", 600, 86.840),
        ("EfficientNetL2", "ns_jft_in1k", 800, 88.352),
        ("EfficientNetL2", "ns_jft_in1k_475", 475, 88.234),
    )
)

#: The central-crop fraction of each preset's evaluation (timm's pretrained_cfg crop_pct), by
#: Hub repository; see IMAGENET_MEAN, IMAGENET_STD and INTERPOLATION for the rest.
CROP_PCT = {
    "timm/tf_efficientnet_b0.ns_jft_in1k": 0.875,
    "timm/tf_efficientnet_b1.ns_jft_in1k": 0.882,
    "timm/tf_efficientnet_b2.ns_jft_in1k": 0.890,
    "timm/tf_efficientnet_b3.ns_jft_in1k": 0.904,
    "timm/tf_efficientnet_b4.ns_jft_in1k": 0.922,
    "timm/tf_efficientnet_b5.ns_jft_in1k": 0.934,
    "timm/tf_efficientnet_b6.ns_jft_in1k": 0.942,
    "timm/tf_efficientnet_b7.ns_jft_in1k": 0.949,
    "timm/tf_efficientnet_l2.ns_jft_in1k": 0.960,
    "timm/tf_efficientnet_l2.ns_jft_in1k_475": 0.936,
}


def preprocessing(repo):
    """The evaluation preprocessing of a preset's Hub repository: mean, std (on [0, 1] pixels),
    interpolation and crop_pct.

    Example:
        >>> preprocessing("timm/tf_efficientnet_l2.ns_jft_in1k_475")["crop_pct"]
        0.936
    """
    if repo not in CROP_PCT:
        raise ValueError(f"{repo!r} is no EfficientNet preset; known: {', '.join(CROP_PCT)}.")
    return dict(mean=IMAGENET_MEAN, std=IMAGENET_STD, interpolation=INTERPOLATION, crop_pct=CROP_PCT[repo])


# === Config ===


def _field(group, default=dataclasses.MISSING):
    return dataclasses.field(default=default, metadata={"group": group})


def _positive_int(value, key):
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 1:
        raise ValueError(f"{key} must be a positive int; got {value!r}.")
    return int(value)


def _multiplier(value, key):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 16 or value != value:
        raise ValueError(f"{key} must be a number in (0, 16] (1.0 for B0, 4.3 / 5.3 for L2); got {value!r}.")
    return float(value)


def _rate(value, key):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"{key} must be in [0, 1); got {value!r}.")
    return float(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EfficientNetConfig(FieldGroupConfig):
    """Every argument of `keras_vit.models.EfficientNet`, normalised and validated once.
    `image_size` may hold None dimensions: the network is fully convolutional.

    Example:
        >>> EfficientNetConfig(width_multiplier=4.3, depth_multiplier=5.3).blocks
        88
    """

    family: ClassVar[str] = "efficientnet"

    image_size: tuple = _field("architecture", (224, 224))
    width_multiplier: float = _field("architecture", 1.0)
    depth_multiplier: float = _field("architecture", 1.0)
    classes: int = _field("architecture", 1000)
    num_channels: int = _field("architecture", 3)
    batch_norm_epsilon: float = _field("numerics", BATCH_NORM_EPSILON)
    dropout_rate: float = _field("training", 0.2)
    drop_path_rate: float = _field("training", DROP_PATH_RATE)
    include_top: bool = _field("head", True)
    pooling: str = _field("head", None)
    classifier_activation: object = _field("head", "softmax")

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("image_size", input_size(self.image_size))
        set_("width_multiplier", _multiplier(self.width_multiplier, "width_multiplier"))
        set_("depth_multiplier", _multiplier(self.depth_multiplier, "depth_multiplier"))
        set_("num_channels", _positive_int(self.num_channels, "num_channels"))
        if self.classes is not None:
            set_("classes", _positive_int(self.classes, "classes"))
        eps = self.batch_norm_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ValueError(f"batch_norm_epsilon must be in (0, 1) (1e-3 for the TF ports); got {eps!r}.")
        set_("batch_norm_epsilon", float(eps))
        set_("dropout_rate", _rate(self.dropout_rate, "dropout_rate"))
        set_("drop_path_rate", _rate(self.drop_path_rate, "drop_path_rate"))
        set_("include_top", bool(self.include_top))
        if self.pooling not in (None, "avg", "gap", "max"):
            raise ValueError(f"pooling must be None, 'avg' (alias 'gap') or 'max'; got {self.pooling!r}.")
        if self.include_top and self.classes is None:
            raise ValueError("include_top=True needs a positive number of classes; got classes=None.")

    @property
    def blocks(self):
        """The number of blocks."""
        return len(block_plan(self.width_multiplier, self.depth_multiplier))

    def to_dict(self):
        out = {f: getattr(self, f) for f in self.fields()}
        out["image_size"] = list(self.image_size)
        return out


# === Sharding rules (`keras_vit.get_layout_map`) ===
#
# Megatron's column/row pair applied to the inverted residual: the 1x1 expansion `conv_pw`
# (C -> 6C, the block's widest kernel) is split along its output channels, and the 1x1
# projection `conv_pwl` (6C -> C') along its input channels, so each device expands, normalises,
# filters depthwise and gates its own slice of the 6C channels and the block ends in one
# all-reduce of the projection's partial sums; the block's output (after `bn3`) is laid out
# (batch, None, None, None): split over the data axis, whole on the model axis. The 1x1 head
# convolution (to 1280 x width channels) and the classifier are the same pair (output channels,
# then input rows: one all-reduce of (batch, classes), any class count). Replicated: the stem,
# the depthwise-separable blocks (narrow), the depthwise kernels (k x k per channel) and the
# squeeze-excitation convolutions (a quarter of the input channels), every BatchNorm. Two
# groups: "expansion" (every block's expanded width; their greatest common divisor says whether
# the model axis divides them all) and "head" (the head convolution's channels).

_SCOPE = r"(?:.*/)?"
_DS_STAGES = "|".join(str(i) for i, stage in enumerate(BASE_STAGES) if stage[0] == "ds")
_IR_STAGES = "|".join(str(i) for i, stage in enumerate(BASE_STAGES) if stage[0] == "ir")
_BLOCK = _SCOPE + r"blocks_\d+_\d+_"
_BATCH_NORM = r"(?:gamma|beta|moving_mean|moving_variance)"
_WHOLE_CONV = (None, None, None, None)


def _sharding_rules(m):
    """(group, regex, axes) of every EfficientNet variable, with `m` the model axis name."""
    return [
        ("expansion", _SCOPE + rf"blocks_(?:{_IR_STAGES})_\d+_conv_pw/kernel", (None, None, None, m)),
        ("expansion", _BLOCK + r"conv_pwl/kernel", (None, None, m, None)),
        (None, _SCOPE + rf"blocks_(?:{_DS_STAGES})_\d+_conv_pw/kernel", _WHOLE_CONV),
        (None, _BLOCK + r"conv_dw/kernel", _WHOLE_CONV),
        (None, _BLOCK + r"se_conv_(?:reduce|expand)/kernel", _WHOLE_CONV),
        (None, _BLOCK + r"se_conv_(?:reduce|expand)/bias", (None,)),
        (None, _SCOPE + r"(?:blocks_\d+_\d+_)?bn\d/" + _BATCH_NORM, (None,)),
        (None, _SCOPE + r"conv_stem/kernel", _WHOLE_CONV),
        ("head", _SCOPE + r"conv_head/kernel", (None, None, None, m)),
        ("head", _SCOPE + r"classifier/kernel", (m, None)),
        (None, _SCOPE + r"classifier/bias", (None,)),
    ]


def _sharding_outputs(data_axis):
    """Each inverted residual's projection, after its BatchNorm: where its all-reduce lands."""
    return [(_BLOCK + r"bn3/output", (data_axis, None, None, None))]


def _sharding_dims(config):
    """{"expansion": gcd of the blocks' expanded widths, "head": the head convolution's channels}."""
    c = EfficientNetConfig.from_dict(config)
    expanded = [b.mid_channels for b in block_plan(c.width_multiplier, c.depth_multiplier) if b.kind == "ir"]
    return {"expansion": math.gcd(*expanded), "head": head_channels(c.width_multiplier)}


SHARDING_GROUPS = {
    "expansion": "inverted residuals (conv_pw output channels, conv_pwl input channels)",
    "head": "head (conv_head output channels, classifier input rows)",
}


# === The family record ===


def _describe(config):
    w, d = config["width_multiplier"], config["depth_multiplier"]
    for arch in EFFICIENTNET_ARCHITECTURES.values():
        if (arch.width_multiplier, arch.depth_multiplier) == (w, d):
            return f"{arch.paper_name} (width x{w:g}, depth x{d:g})"
    return f"EfficientNet, width x{w:g}, depth x{d:g}"


def _weights_lower_bound(config, source):
    """The fewest bytes the weights of `config` take (one byte per parameter); a config that is
    not an EfficientNet's raises a CheckpointError."""
    from keras_vit.errors import CheckpointError

    try:
        c = EfficientNetConfig.from_dict(config)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: {err}") from None
    return params_of(c.width_multiplier, c.depth_multiplier, c.classes if c.include_top else 0, c.num_channels)


def _card(config):
    intro = ("EfficientNet weights for keras_vit (Keras 3: JAX, TensorFlow, PyTorch): timm's TF ports of\n"
             "\"EfficientNet\" (Tan & Le, ICML 2019) with the Noisy Student weights of \"Self-training with Noisy\n"
             "Student improves ImageNet classification\" (Xie et al., CVPR 2020), a baseline of \"An Image is\n"
             "Worth 16x16 Words\" (Dosovitskiy et al., ICLR 2021, Table 2).")
    rows = [("architecture", _describe(config)),
            ("numerics", f"BatchNorm eps {config.get('batch_norm_epsilon', BATCH_NORM_EPSILON):g}, "
                         "TF \"SAME\" padding, SiLU"),
            ("preprocessing", f"RGB in [0, 1] normalised with mean {IMAGENET_MEAN} and std {IMAGENET_STD}; "
                              f"{INTERPOLATION} resize to size / crop_pct, central crop")]
    return ("efficientnet", "noisy-student"), intro, rows


def _doc_fields(row):
    return dict(params=row.params, resolution=row.resolution, dropout=row.dropout)


DOC = """Instantiates the {paper_name} architecture (timm's `{timm_name}`), the Noisy Student baseline
of the paper's Table 2.

Reference: "EfficientNet: Rethinking Model Scaling for Convolutional Neural Networks" (Tan & Le,
ICML 2019); weights of "Self-training with Noisy Student improves ImageNet classification" (Xie et
al., CVPR 2020). Width x{width_multiplier}, depth x{depth_multiplier}; {params:,} parameters with
1000 classes. Convolutions pad as TensorFlow's "SAME" (timm's `tf_` ports), BatchNorm eps 1e-3.

Inputs are channels-last RGB images normalised with the ImageNet mean and standard deviation
(`(x / 255 - (0.485, 0.456, 0.406)) / (0.229, 0.224, 0.225)`), as timm feeds these weights
(`keras_vit.preprocess_input(x, model=model)` applies them; without `model` it maps to [-1, 1]).

Args:
    include_top: whether to end in global average pooling, dropout and the classifier.
    weights: None (random initialisation), a preset tag ("ns_jft_in1k"; alias "imagenet"; see
        `keras_vit.list_presets("{name}")`), a local checkpoint (a timm folder, .safetensors or
        pytorch_model.bin of `{timm_name}`, a Keras preset), or "hf://owner/repo".
    input_tensor: optional Keras tensor to use as the image input.
    input_shape: (height, width, 3); default ({resolution}, {resolution}, 3), the resolution of the Noisy
        Student weights. Any size, also (None, None, 3): the network is fully convolutional.
    pooling: with include_top=False: None returns the (batch, h, w, channels) features after the
        head convolution; "avg" or "max" pool them to (batch, channels).
    classes: classes of the classifier. With pretrained weights, a value other than the
        checkpoint's attaches a fresh zero-initialised classifier.
    classifier_activation: activation of the classifier; None returns logits.
    name: model name.
    **overrides: other `keras_vit.models.EfficientNet` arguments (dropout_rate, default
        {dropout}; drop_path_rate, default 0.2; batch_norm_epsilon; dtype).

Returns:
    A `keras_vit.models.EfficientNet` (a `keras.Model`).

Example:
    >>> model = keras_vit.{name}(weights=None, input_shape=(224, 224, 3))
"""


def _make_record():
    from keras_vit.models.family import ModelFamily, ShardingRules

    return ModelFamily(
        name="efficientnet",
        title="EfficientNet",
        model="keras_vit.models.efficientnet:EfficientNet",
        config_class=EfficientNetConfig,
        architectures=EFFICIENTNET_ARCHITECTURES,
        signature=("width_multiplier", "depth_multiplier"),
        flops=efficientnet_flops,
        presets=PRESET_ROWS,
        head="classifier/",
        optional_weights=("classifier/",),
        resizable_weights=("classifier/",),
        features_pooling="avg",
        patch_resize=False,
        source_grid=None,
        dynamic_size="native",
        describe=_describe,
        card=_card,
        weights_lower_bound=_weights_lower_bound,
        constructor_doc=DOC,
        doc_fields=_doc_fields,
        input_normalization=IMAGENET_NORMALIZATION,
        sharding=ShardingRules(rules=_sharding_rules, dims=_sharding_dims, groups=SHARDING_GROUPS,
                               outputs=_sharding_outputs),
        # Its own dropout and its architecture's resolution.
        transfer=Transfer(settings=finetune_settings, options=("dropout_rate", "drop_path_rate"),
                          resolution=finetune_resolution, features=("global_pool",)),
    )


EFFICIENTNET = _make_record()
