"""One table of every architecture: the paper's ViTs, the released R+ViT hybrids and the paper's
CNN baselines, the BiT ResNet-v2s.

Every constructor, converter, test and benchmark reads this table; nothing else states a width,
a depth or a head count.
"""

import dataclasses

# === Numerics per source ===

#: The numerics each upstream framework computes with. Carried into the model as config fields
#: (never global constants) so a converted model reproduces its source exactly.
NUMERICS = {
    "original": dict(
        layer_norm_epsilon=1e-6,
        gelu_approximate=True,
        group_norm_epsilon=1e-6,
        std_conv_epsilon=1e-5,
        std_conv_epsilon_inside_sqrt=False,
        position_embedding_resize="original",
    ),
    "timm": dict(
        layer_norm_epsilon=1e-6,
        gelu_approximate=False,
        group_norm_epsilon=1e-5,
        std_conv_epsilon=1e-8,
        std_conv_epsilon_inside_sqrt=True,
        position_embedding_resize="bicubic_antialias",
    ),
    "transformers": dict(
        layer_norm_epsilon=1e-12,
        gelu_approximate=False,
        group_norm_epsilon=1e-6,
        std_conv_epsilon=1e-5,
        std_conv_epsilon_inside_sqrt=False,
        position_embedding_resize="bicubic",
    ),
}
#: google-research/big_vision computes with the original Flax numerics (flax.linen defaults) and
#: resizes position embeddings by the original's rule (`resample_posemb`: scipy.ndimage.zoom, order=1).
NUMERICS["big_vision"] = dict(NUMERICS["original"])


# === Architectures ===


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One row of the table. `resnet` is (stage_units, width_factor) for hybrids."""

    name: str  # the constructor's name, e.g. "ViTB16"
    paper_name: str  # e.g. "ViT-B/16"
    hidden_size: int
    mlp_dim: int
    num_heads: int
    num_layers: int
    patch_size: int
    resnet: tuple = None
    classifier: str = "token"
    timm_name: str = None  # timm's architecture name at 224, e.g. "vit_base_patch16_224"

    def kwargs(self):
        """The VisionTransformer keyword arguments of this architecture."""
        out = {f: getattr(self, f) for f in TABLE_FIELDS}
        if out["resnet"] is None:
            del out["resnet"]
        return out

    @property
    def stride(self):
        """Input pixels per token along each axis (patch times the ResNet's stride)."""
        return self.patch_size * resnet_stride(self.resnet)


def resnet_stride(resnet):
    """Total downsampling of the hybrid ResNet: 4 for the root, x2 for every stage after the first."""
    if resnet is None:
        return 1
    stages = tuple(resnet[0])
    return 4 * 2 ** max(len(stages) - 1, 0)


_TI = dict(hidden_size=192, mlp_dim=768, num_heads=3, num_layers=12)
_S = dict(hidden_size=384, mlp_dim=1536, num_heads=6, num_layers=12)
_B = dict(hidden_size=768, mlp_dim=3072, num_heads=12, num_layers=12)
_L = dict(hidden_size=1024, mlp_dim=4096, num_heads=16, num_layers=24)
_H = dict(hidden_size=1280, mlp_dim=5120, num_heads=16, num_layers=32)

ARCHITECTURES = {
    a.name: a
    for a in [
        Architecture("ViTTi16", "ViT-Ti/16", patch_size=16, timm_name="vit_tiny_patch16_224", **_TI),
        Architecture("ViTS16", "ViT-S/16", patch_size=16, timm_name="vit_small_patch16_224", **_S),
        Architecture("ViTS32", "ViT-S/32", patch_size=32, timm_name="vit_small_patch32_224", **_S),
        Architecture("ViTB8", "ViT-B/8", patch_size=8, timm_name="vit_base_patch8_224", **_B),
        Architecture("ViTB16", "ViT-B/16", patch_size=16, timm_name="vit_base_patch16_224", **_B),
        Architecture("ViTB32", "ViT-B/32", patch_size=32, timm_name="vit_base_patch32_224", **_B),
        Architecture("ViTL16", "ViT-L/16", patch_size=16, timm_name="vit_large_patch16_224", **_L),
        Architecture("ViTL32", "ViT-L/32", patch_size=32, timm_name="vit_large_patch32_224", **_L),
        Architecture("ViTH14", "ViT-H/14", patch_size=14, timm_name="vit_huge_patch14_224", **_H),
        Architecture(
            "RViTTi16", "R+ViT-Ti/16", patch_size=8, resnet=((), 1), timm_name="vit_tiny_r_s16_p8_224", **_TI
        ),
        Architecture(
            "R26ViTS32", "R26+ViT-S/32", patch_size=1, resnet=((2, 2, 2, 2), 1),
            timm_name="vit_small_r26_s32_224", **_S,
        ),
        Architecture(
            "R26ViTB32", "R26+ViT-B/32", patch_size=1, resnet=((2, 2, 2, 2), 1), timm_name="vit_base_r26_s32_224", **_B
        ),
        Architecture(
            "R50ViTB16", "R50+ViT-B/16", patch_size=1, resnet=((3, 4, 9), 1), timm_name="vit_base_r50_s16_224", **_B
        ),
        Architecture("R50ViTB32", "R50+ViT-B/32", patch_size=1, resnet=((3, 4, 6, 3), 1), **_B),
        Architecture("R50ViTL16", "R50+ViT-L/16", patch_size=1, resnet=((3, 4, 9), 1), **_L),
        Architecture(
            "R50ViTL32", "R50+ViT-L/32", patch_size=1, resnet=((3, 4, 6, 3), 1), timm_name="vit_large_r50_s32_224", **_L
        ),
    ]
}

#: Architectures that exist upstream but have no constructor of their own (built with
#: VisionTransformer(**architecture.kwargs())).
EXTRA_ARCHITECTURES = {
    "ViTB16Gap": Architecture(
        "ViTB16Gap", "ViT-B/16 (gap)", patch_size=16, classifier="gap", timm_name="vit_base_patch16_gap_224",
        hidden_size=768, mlp_dim=3072, num_heads=16, num_layers=12,
    ),
}


def all_architectures():
    """{name: Architecture} of the constructors' rows and the extra ones."""
    return {**ARCHITECTURES, **EXTRA_ARCHITECTURES}


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


def get_architecture(name):
    """The architecture row called `name` (constructor name, e.g. "ViTB16", "BiTResNet50x1"), of any
    model family."""
    from keras_vit.models.family import all_architectures as every_family

    table = every_family()
    if name not in table:
        import difflib

        close = difflib.get_close_matches(name, list(table), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"Unknown architecture {name!r}.{hint} Known: {', '.join(table)}.")
    return table[name]


# === The model's configuration ===

#: The position embeddings a VisionTransformer can use (paper, Appendix D.4; big_vision).
POSITION_EMBEDDINGS = ("learned", "none", "learned_2d", "relative", "sincos2d")

#: The rules that resize a position embedding to another grid (`keras_vit.layers.resize`), each an
#: upstream framework's: a converted model uses its source's rule to reproduce it.
RESIZE_RULES = (
    "original",  # google-research/vision_transformer: linear, corners aligned (ndimage.zoom order=1)
    "bilinear",  # half-pixel bilinear (timm's .npz loader, align_corners=False)
    "bicubic",  # half-pixel bicubic, a=-0.75 (transformers' interpolate_pos_encoding)
    "bicubic_antialias",  # half-pixel bicubic with antialias, a=-0.5 (timm's resample_abs_pos_embed)
)
#: How the model reads out its tokens: "token" (class token), "gap" (average), "map" (attention
#: pooling), "first" (the first token, no class token: big_vision's pool_type "0") and "none" (no
#: pooling: the head applies to every token, big_vision's pool_type "none").
CLASSIFIERS = ("token", "gap", "map", "first", "none")
POOLINGS = (None, "token", "gap", "avg", "max", "map", "first")
#: keras.Model keyword arguments VisionTransformer passes on to Keras (not config fields).
KERAS_MODEL_ARGS = ("name", "dtype", "trainable")


def _field(group, default=dataclasses.MISSING, doc=""):
    return dataclasses.field(default=default, metadata={"group": group, "doc": doc})


def as_pair(size, what="image_size"):
    """An int or (height, width) as a (height, width) tuple of ints: the one place sizes are normalised.

    Example:
        >>> as_pair(224), as_pair([160, 320])
        ((224, 224), (160, 320))
    """
    if isinstance(size, bool):
        raise ValueError(f"{what} must be an int or (height, width); got {size!r}.")
    if isinstance(size, int) or (hasattr(size, "__index__") and not hasattr(size, "__len__")):
        return int(size), int(size)
    try:
        pair = tuple(int(s) for s in size)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an int or (height, width); got {size!r}.") from None
    if len(pair) != 2:
        raise ValueError(f"{what} must be an int or (height, width); got {size!r}.")
    return pair


def normalise_resnet(resnet):
    """None, or (stage_units, width_factor) as (tuple of ints, int-or-float)."""
    if resnet is None:
        return None
    try:
        units, width = resnet
        units = tuple(int(u) for u in units)
    except (TypeError, ValueError):
        raise ValueError(
            f"resnet must be (stage_units, width_factor), e.g. ((3, 4, 9), 1) or ((), 1); got {resnet!r}."
        ) from None
    if isinstance(width, float) and width.is_integer():
        width = int(width)
    if not width > 0 or any(u < 1 for u in units):
        raise ValueError(f"resnet needs positive stage units and width factor; got {resnet!r}.")
    return units, width


def suggest(name, known):
    """" (did you mean 'x'?)" for the closest of `known` to `name`, or ""."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not close:  # typos that drop a suffix: "dropout" for "dropout_rate"
        close = [k for k in known if k.startswith(name) or name.startswith(k)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownArgumentError(TypeError, ValueError):
    """An unknown keyword argument (a TypeError as Python raises for one; also a ValueError)."""


def check_keywords(given, known, what):
    """Raise UnknownArgumentError naming every key of `given` not in `known`, with suggestions.

    Example:
        >>> check_keywords({"dropout": 0.1}, ("dropout_rate",), "f")
        Traceback (most recent call last):
        ...
        keras_vit.models.config.UnknownArgumentError: f got unknown keyword argument(s): 'dropout' (did you mean 'dropout_rate'?). Valid: dropout_rate.
    """
    unknown = [k for k in given if k not in known]
    if unknown:
        listed = "; ".join(f"{k!r}{suggest(k, known)}" for k in unknown)
        raise UnknownArgumentError(
            f"{what} got unknown keyword argument(s): {listed}. Valid: {', '.join(sorted(known))}."
        )


class FieldGroupConfig:
    """What every model's frozen config dataclass shares: its fields grouped by each field's
    `metadata["group"]` ("architecture", "numerics", ...), built from a dict and copied with
    changes, unknown names refused with a suggestion."""

    @classmethod
    def fields(cls, *groups):
        """Names of the fields in `groups` (all fields when none is given), in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls) if not groups or f.metadata["group"] in groups)

    @classmethod
    def architecture_fields(cls):
        """The fields a checkpoint determines: its architecture and its numerics."""
        return cls.fields("architecture", "numerics")

    @classmethod
    def from_dict(cls, config, *, ignore=KERAS_MODEL_ARGS):
        """A config from a dict (the model's `get_config()`, a checkpoint config).

        Keys in `ignore` (Keras' own model arguments by default) are dropped; any other key that
        is not a field raises a TypeError with a suggestion.

        Example:
            >>> ViTConfig.from_dict({"image_size": [32, 48], "patch_size": 8, "hidden_size": 16,
            ...                      "num_layers": 1, "num_heads": 2, "mlp_dim": 32}).grid_size
            (4, 6)
        """
        config = {k: v for k, v in dict(config).items() if k not in ignore}
        check_keywords(config, cls.fields(), cls.__name__)
        return cls(**config)

    def replace(self, **changes):
        """A copy with `changes` applied (validated again); unknown names raise with a suggestion."""
        check_keywords(changes, self.fields(), f"{type(self).__name__}.replace")
        return dataclasses.replace(self, **changes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ViTConfig(FieldGroupConfig):
    """Every argument of `keras_vit.VisionTransformer`, normalised and validated once.

    Sizes are normalised here (an int `image_size` becomes (height, width), `resnet` becomes
    (tuple(stage_units), width_factor)) and impossible combinations raise a ValueError that
    names the problem and the fix. `VisionTransformer`, its `get_config`, the constructors and
    the checkpoint code all derive from this class.

    Field groups (`ViTConfig.fields(group)`):
        "architecture": what a checkpoint determines besides the numerics (image_size is the
            grid the weights were laid out on);
        "numerics": the weights' source framework's numerics (see NUMERICS);
        "head": the caller's choices about the top of the model;
        "training": regularisation, and `remat` (encoder blocks recomputed in the backward pass);
        "state": quantization (set by `VisionTransformer.quantize`);
        "input": dynamic_image_size (images of any size at run time; `image_size` is then the
            size the position embeddings are laid out on, and they follow each batch's grid).

    Example:
        >>> config = ViTConfig(image_size=32, patch_size=8, hidden_size=16, num_layers=2,
        ...                    num_heads=2, mlp_dim=32)
        >>> config.image_size, config.grid_size
        ((32, 32), (4, 4))
    """

    image_size: tuple = _field("architecture", doc="int or (height, width) of the input images")
    patch_size: int = _field("architecture")
    hidden_size: int = _field("architecture")
    num_layers: int = _field("architecture")
    num_heads: int = _field("architecture")
    mlp_dim: int = _field("architecture")
    classes: int = _field("architecture", 1000)
    classifier: str = _field("architecture", "token")
    representation_size: int = _field("architecture", None)
    resnet: tuple = _field("architecture", None)
    position_embedding: str = _field("architecture", "learned")
    class_token_position_embedding: bool = _field(
        "architecture", True,
        doc="whether the class token gets a position embedding (the original) or not (big_vision)",
    )
    num_channels: int = _field("architecture", 3)
    layer_norm_epsilon: float = _field("numerics", NUMERICS["original"]["layer_norm_epsilon"])
    gelu_approximate: bool = _field("numerics", NUMERICS["original"]["gelu_approximate"])
    group_norm_epsilon: float = _field("numerics", NUMERICS["original"]["group_norm_epsilon"])
    std_conv_epsilon: float = _field("numerics", NUMERICS["original"]["std_conv_epsilon"])
    std_conv_epsilon_inside_sqrt: bool = _field("numerics", NUMERICS["original"]["std_conv_epsilon_inside_sqrt"])
    position_embedding_resize: str = _field("numerics", NUMERICS["original"]["position_embedding_resize"])
    include_top: bool = _field("head", True)
    pooling: str = _field("head", None)
    classifier_activation: object = _field("head", "softmax")
    dropout_rate: float = _field("training", 0.0)
    attention_dropout_rate: float = _field("training", 0.0)
    remat: bool = _field(
        "training", False, doc="recompute each encoder block in the backward pass (less memory, ~1/3 more compute)"
    )
    quantization: object = _field("state", None)
    dynamic_image_size: bool = _field(
        "input", False, doc="images of any size at run time; image_size is the one the embeddings are laid out on"
    )
    # --- Variants: timm's VisionTransformer switches. The defaults are the original ViT. ---
    class_token: bool = _field(
        "architecture", None, doc="whether a class token is prepended; None: exactly when classifier='token'"
    )
    register_tokens: int = _field("architecture", 0, doc="learned register tokens after the class token (`reg_tokens`)")
    distillation_token: bool = _field(
        "architecture", False, doc="DeiT's distillation token after the class token, read by a second head `head_dist`"
    )
    distillation_output: str = _field(
        "head", "mean", doc="with a distillation token: 'mean' of the two heads (inference), or 'both' heads' outputs"
    )
    patch_embedding_bias: bool = _field("architecture", True, doc="whether the patch embedding has a bias")
    patch_embedding_norm: bool = _field("architecture", False, doc="a norm on the patch tokens (AIMv2's)")
    pre_norm: bool = _field("architecture", False, doc="a norm `norm_pre` before the blocks (CLIP's)")
    qkv_bias: bool = _field("architecture", True, doc="whether query, key and value have biases")
    projection_bias: bool = _field("architecture", True, doc="biases of the attention output and the MLP")
    layer_scale: float = _field("architecture", None, doc="init value of per-channel layer scale; None: none")
    final_norm: bool = _field("architecture", True, doc="a final norm (before pooling, or after it with fc_norm)")
    fc_norm: bool = _field("architecture", False, doc="the final norm after pooling (`fc_norm`) instead of before")
    norm: str = _field("architecture", "layer_norm", doc="'layer_norm' or 'rms_norm' (AIMv2)")
    mlp_activation: str = _field(
        "architecture", None,
        doc="'gelu', 'gelu_tanh', 'quick_gelu', 'silu'; None: GELU in the form gelu_approximate says",
    )
    glu: bool = _field("architecture", False, doc="gated MLP: Dense_1(act(Dense_0(x)) * Dense_2(x)) (SwiGLU)")
    input_normalization: tuple = _field(
        "input", None, doc="(mean, std) per channel of [0, 1] pixels the weights expect; None: [-1, 1] inputs"
    )

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("image_size", as_pair(self.image_size))
        set_("resnet", normalise_resnet(self.resnet))
        for key in ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim", "num_channels"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int,)) and not hasattr(value, "__index__"):
                raise ValueError(f"{key} must be a positive int; got {value!r}.")
            if int(value) < 1:
                raise ValueError(f"{key} must be a positive int; got {value!r}.")
            set_(key, int(value))
        for key in ("classes", "representation_size"):
            value = getattr(self, key)
            if value is not None:
                if int(value) < 1:
                    raise ValueError(f"{key} must be a positive int or None; got {value!r}.")
                set_(key, int(value))
        for key in ("dropout_rate", "attention_dropout_rate"):
            value = float(getattr(self, key))
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{key} must be in [0, 1); got {value!r}.")
            set_(key, value)
        for key in ("layer_norm_epsilon", "group_norm_epsilon", "std_conv_epsilon"):
            set_(key, float(getattr(self, key)))
        flags = ("gelu_approximate", "std_conv_epsilon_inside_sqrt", "include_top", "class_token_position_embedding",
                 "dynamic_image_size", "remat")
        for key in flags:
            set_(key, bool(getattr(self, key)))
        self._check_choice(
            "classifier", CLASSIFIERS,
            "'token' (class token), 'gap' (global average pooling), 'map' (attention pooling), 'first' (the "
            "first token, no class token) or 'none' (no pooling: the head applies to every token)",
        )
        self._check_choice("position_embedding", POSITION_EMBEDDINGS)
        self._check_variant_fields()
        self._check_choice("position_embedding_resize", RESIZE_RULES)
        if self.pooling not in POOLINGS:
            raise ValueError(
                f"pooling must be one of None, 'token', 'gap', 'avg', 'max', 'map' or 'first'; got {self.pooling!r}."
            )
        if self.pooling == "token" and not self.has_class_token:
            raise ValueError(
                f"pooling='token' needs a class token, but this model has classifier={self.classifier!r} (no class "
                "token). Use pooling='gap'."
            )
        if self.pooling == "map" and self.classifier != "map":
            raise ValueError("pooling='map' uses the MAP head of a classifier='map' model; use 'token' or 'gap'.")
        if self.include_top and self.classes is None:
            raise ValueError("include_top=True needs a positive number of classes; got classes=None.")
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}; choose a head "
                "count that divides the hidden size."
            )
        need = {"learned_2d": 2, "sincos2d": 4}.get(self.position_embedding)
        if need and (self.hidden_size % need or (need == 4 and self.hidden_size < 8)):
            raise ValueError(
                f"position_embedding={self.position_embedding!r} splits the hidden size into {need} equal parts"
                + (" of at least 2 frequencies" if need == 4 else "")
                + f"; hidden_size {self.hidden_size} does not allow it. Use a multiple of {need}"
                + (" (at least 8)" if need == 4 else "")
                + "."
            )
        if self.dynamic_image_size and self.position_embedding == "relative":
            raise ValueError(
                "dynamic_image_size=True needs position embeddings that follow the patch grid; relative ones "
                "cannot: they are learned per offset in the flattened token sequence, and on another grid the same "
                "offset joins other patch pairs. Use a fixed image_size, or a 'learned', 'learned_2d' or "
                "'sincos2d' position embedding."
            )
        stride = self.stride
        for axis, size in zip(("height", "width"), self.image_size):
            if size % stride or size < stride:
                lower, upper = (size // stride) * stride, (size // stride + 1) * stride
                what = f"patch size {self.patch_size}" + (
                    f" times the ResNet stride {resnet_stride(self.resnet)}" if self.resnet is not None else ""
                )
                examples = f"{lower} or {upper}" if lower else f"{upper}"
                raise ValueError(
                    f"Image {axis} {size} is not divisible by the {what} (= {stride}). "
                    f"Resize the images to a multiple of {stride}, e.g. {examples}."
                )

    def _check_variant_fields(self):
        """Normalise and validate the fields of timm's switches (the "Variants" block)."""
        from keras_vit.layers.transformer import MLP_ACTIVATIONS, NORMS

        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        if self.class_token is not None:
            set_("class_token", bool(self.class_token))
        for key in ("distillation_token", "patch_embedding_bias", "patch_embedding_norm", "pre_norm",
                    "qkv_bias", "projection_bias", "final_norm", "fc_norm", "glu"):
            set_(key, bool(getattr(self, key)))
        registers = self.register_tokens
        if isinstance(registers, bool) or not isinstance(registers, int) and not hasattr(registers, "__index__") or (
            int(registers) < 0
        ):
            raise ValueError(f"register_tokens must be an int >= 0; got {registers!r}.")
        set_("register_tokens", int(registers))
        if self.layer_scale is not None:
            set_("layer_scale", float(self.layer_scale))
        self._check_choice("norm", NORMS)
        self._check_choice("mlp_activation", MLP_ACTIVATIONS)
        self._check_choice("distillation_output", ("mean", "both"))
        if self.classifier == "token" and not self.has_class_token:
            raise ValueError("classifier='token' reads the class token; set class_token=True or use classifier='gap'.")
        if self.classifier in ("first", "none") and (self.has_class_token or self.register_tokens):
            raise ValueError(
                f"classifier={self.classifier!r} reads the token sequence itself; it takes no class or register "
                "tokens. Use classifier='token' or 'gap'."
            )
        if self.distillation_token and self.classifier != "token":
            raise ValueError(
                "distillation_token=True reads the class and distillation tokens (DeiT); it needs classifier='token'."
            )
        if self.fc_norm and not self.final_norm:
            raise ValueError("fc_norm=True moves the final norm after pooling; it needs final_norm=True.")
        if self.fc_norm and self.classifier == "none":
            raise ValueError("fc_norm=True normalises the pooled features; classifier='none' pools nothing.")
        if self.input_normalization is not None:
            try:
                mean, std = (tuple(float(v) for v in part) for part in self.input_normalization)
            except (TypeError, ValueError):
                mean = std = ()
            if len(mean) != self.num_channels or len(std) != self.num_channels or min(std, default=0) <= 0:
                raise ValueError(
                    f"input_normalization must be (mean, std), each {self.num_channels} values (std > 0) per channel "
                    f"of [0, 1] pixels, e.g. ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)); got "
                    f"{self.input_normalization!r}."
                )
            set_("input_normalization", (mean, std))

    def _check_choice(self, key, choices, described=None):
        value = getattr(self, key)
        if value not in choices:
            described = described or "one of " + ", ".join(repr(c) for c in choices)
            raise ValueError(f"{key} must be {described}; got {value!r}{suggest(str(value), choices)}.")

    # --- derived sizes --------------------------------------------------------------------------

    @property
    def stride(self):
        """Input pixels per token along each axis (patch times the hybrid ResNet's stride)."""
        return self.patch_size * resnet_stride(self.resnet)

    @property
    def grid_size(self):
        """(rows, cols) of the patch grid."""
        return self.image_size[0] // self.stride, self.image_size[1] // self.stride

    @property
    def num_prefix_tokens(self):
        """Tokens in front of the patch tokens: the class token, DeiT's distillation token and the
        register tokens, in that order."""
        return int(self.has_class_token) + int(self.distillation_token) + self.register_tokens

    @property
    def has_class_token(self):
        """Whether a class token is prepended (`class_token`, or by default exactly when classifier='token')."""
        return self.classifier == "token" if self.class_token is None else self.class_token

    @property
    def num_position_prefix_tokens(self):
        """Prefix tokens the position embedding covers: the class token's row exists only with
        `class_token_position_embedding` (big_vision adds the embedding to the patch grid alone)."""
        return self.num_prefix_tokens if self.class_token_position_embedding else 0

    @property
    def num_tokens(self):
        return self.num_prefix_tokens + self.grid_size[0] * self.grid_size[1]

    # --- field lists ----------------------------------------------------------------------------

    @classmethod
    def numerics_fields(cls):
        """The fields that hold a source's numerics (the keys of NUMERICS[source])."""
        return cls.fields("numerics")

    # --- conversion -----------------------------------------------------------------------------

    def to_dict(self):
        """The fields as JSON-friendly values (lists for tuples): `VisionTransformer.get_config()`'s."""
        out = {f: getattr(self, f) for f in self.fields()}
        out["image_size"] = list(self.image_size)
        if self.resnet is not None:
            out["resnet"] = [list(self.resnet[0]), self.resnet[1]]
        if self.input_normalization is not None:
            out["input_normalization"] = [list(part) for part in self.input_normalization]
        return out

    def architecture(self):
        """{field: value} of `architecture_fields()` (what a checkpoint of this model holds)."""
        return {f: getattr(self, f) for f in self.architecture_fields()}


#: Fields a checkpoint determines (architecture and numerics), and the numerics alone.
ARCHITECTURE_FIELDS = ViTConfig.architecture_fields()
NUMERICS_FIELDS = ViTConfig.numerics_fields()
#: The fields a row of the architecture table fixes (what the constructors own).
TABLE_FIELDS = tuple(f for f in ViTConfig.fields() if f in {a.name for a in dataclasses.fields(Architecture)})


# === The BiT ResNet's configuration ===


def _bit_image_size(size):
    if size is None:
        return None, None
    if isinstance(size, bool):
        raise ValueError(f"image_size must be an int, (height, width) or None; got {size!r}.")
    if isinstance(size, int):
        return size, size
    try:
        pair = tuple(None if s is None else int(s) for s in size)
    except (TypeError, ValueError):
        raise ValueError(f"image_size must be an int, (height, width) or None; got {size!r}.") from None
    if len(pair) != 2 or any(s is not None and s < 1 for s in pair):
        raise ValueError(f"image_size must be an int, (height, width) or None; got {size!r}.")
    return pair


@dataclasses.dataclass(frozen=True, kw_only=True)
class BiTConfig(FieldGroupConfig):
    """Every argument of `keras_vit.models.BiTResNet`, normalised and validated once (as
    `ViTConfig` is for the ViTs). `image_size` may hold None dimensions: the network is fully
    convolutional.

    Example:
        >>> BiTConfig(image_size=64, block_units=[1, 1], width_factor=0.5).block_units
        (1, 1)
    """

    image_size: tuple = _field("architecture", (224, 224), doc="int, (height, width) or None (any size)")
    block_units: tuple = _field("architecture", (3, 4, 6, 3))
    width_factor: float = _field("architecture", 1)
    classes: int = _field("architecture", 1000)
    num_channels: int = _field("architecture", 3)
    group_norm_epsilon: float = _field("numerics", BIT_NUMERICS["group_norm_epsilon"])
    std_conv_epsilon: float = _field("numerics", BIT_NUMERICS["std_conv_epsilon"])
    std_conv_epsilon_inside_sqrt: bool = _field("numerics", BIT_NUMERICS["std_conv_epsilon_inside_sqrt"])
    include_top: bool = _field("head", True)
    pooling: str = _field("head", None)
    classifier_activation: object = _field("head", "softmax")

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        set_("image_size", _bit_image_size(self.image_size))
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

