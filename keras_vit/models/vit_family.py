"""The Vision Transformer family (with the R+ViT hybrids): its config class and architecture
table, FLOP count, preset rows, config inference from a canonical weight tree, sharding rules and
family record.

Every constructor, converter, test and benchmark reads the table here; nothing else states a
ViT's width, depth or head count. A ViT variant (a pooling, register tokens, layer scale) is a
field of `ViTConfig` and a layer of `keras_vit.models.vit`, registered nowhere else.
"""

import dataclasses
import functools
import json
import os
import re
from typing import ClassVar

from keras_vit.choices import MLP_ACTIVATIONS, NORMS
from keras_vit.errors import CheckpointError
from keras_vit.models.bit_family import conv_flops, count_units, resnet_flops, width_factor
from keras_vit.geometry import positive_pair
from keras_vit.models.config import NUMERICS, RESIZE_RULES, FieldGroupConfig, as_pair, config_field, suggest
from keras_vit.models.family import IMAGENET_NORMALIZATION, ModelFamily, ShardingRules, stem_block_head_groups
from keras_vit.models.transfer import Transfer

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
    # ((field, value), ...): further VisionTransformer fields of the row (timm's zoo: its switches
    # and numerics, e.g. DINOv2's layer scale), as timm builds the architecture `timm_name`.
    variant: tuple = ()
    default_size: tuple = (224, 224)  # the input size without input_shape (the weights' resolution)
    default_weights: str = "imagenet"  # the constructors' default `weights=`
    reference: str = None  # the paper and source the constructor's docstring names (None: the ViT paper)

    def kwargs(self):
        """The VisionTransformer keyword arguments of this architecture."""
        out = {f: getattr(self, f) for f in TABLE_FIELDS}
        if out["resnet"] is None:
            del out["resnet"]
        out.update(self.variant)
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


# === timm's ViT zoo: the architectures people load today ===

#: timm's ViT zoo as timm builds it: every architecture of its vision_transformer.py and deit.py
#: with the keyword arguments its entrypoint passes, and every pretrained tag with its
#: pretrained_cfg (resolution, mean/std, licence, Hub repository). Written by
#: weights/timm_vit_table.py from timm itself; the timm reader (keras_vit.checkpoints.timm) reads the
#: architectures, the preset rows below the pretrained_cfgs.
TIMM_ZOO_TABLE_FILE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "checkpoints",
                                   "timm_vit_architectures.json")


@functools.lru_cache(maxsize=None)
def timm_zoo_table():
    """{"timm_version", "modules": {module: {"architectures": {name: entrypoint kwargs},
    "pretrained": {tag: pretrained_cfg}}}} of timm's vision_transformer.py and deit.py."""
    with open(TIMM_ZOO_TABLE_FILE) as f:
        return json.load(f)


def timm_pretrained_cfg(name):
    """timm's pretrained_cfg of "<architecture>.<tag>" (num_classes, input_size, mean, std, license,
    hf_hub_id, ...), or None when the tag is not in the zoo table."""
    for module in timm_zoo_table()["modules"].values():
        if name in module["pretrained"]:
            return dict(module["pretrained"][name])
    return None


#: CLIP's (OpenAI's) mean and std of [0, 1] pixels (timm's OPENAI_CLIP_MEAN / OPENAI_CLIP_STD).
CLIP_NORMALIZATION = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


def _zoo_row(name, paper_name, timm_name, size, *, reference, default_weights, dims, patch_size, classifier="token",
             **variant):
    """A row of timm's zoo: timm's numerics, then the architecture's own switches."""
    fields = {**NUMERICS["timm"], **variant}
    return Architecture(name, paper_name, patch_size=patch_size, classifier=classifier, timm_name=timm_name,
                        variant=tuple(sorted(fields.items())), default_size=(size, size),
                        default_weights=default_weights, reference=reference, **dims)


_G = dict(hidden_size=1536, mlp_dim=4096, num_heads=24, num_layers=40)  # DINOv2-g: SwiGLU, 2 x 4096 wide
_SO400M = dict(hidden_size=1152, mlp_dim=4304, num_heads=16, num_layers=27)
_DINOV2 = "DINOv2 (Oquab et al., 2023: \"DINOv2: Learning Robust Visual Features without Supervision\")"
_DINOV2_REG = "DINOv2 with registers (Darcet et al., 2024: \"Vision Transformers Need Registers\")"
_CLIP = ("CLIP's image tower (Radford et al., 2021: \"Learning Transferable Visual Models From Natural Language "
         "Supervision\")")
_SIGLIP = "SigLIP's image tower (Zhai et al., 2023: \"Sigmoid Loss for Language Image Pre-Training\")"
_DEIT = "DeiT (Touvron et al., 2021: \"Training data-efficient image transformers & distillation through attention\")"
_DEIT3 = "DeiT III (Touvron et al., 2022: \"DeiT III: Revenge of the ViT\")"
_BEIT = "BEiT (Bao et al., 2022: \"BEiT: BERT Pre-Training of Image Transformers\")"
_BEITV2 = ("BEiT v2 (Peng et al., 2022: \"BEiT v2: Masked Image Modeling with Vector-Quantized Visual "
           "Tokenizers\")")
_EVA02 = "EVA-02 (Fang et al., 2024: \"EVA-02: A Visual Representation for Neon Genesis\")"
_IN = dict(input_normalization=IMAGENET_NORMALIZATION)
#: timm's Beit: a class token, no absolute position embedding, a relative position bias per block,
#: layer scale, and the patches' mean through fc_norm.
_BEIT_ARGS = dict(classifier="gap", class_token=True, position_embedding="none", relative_position_bias=True,
                  fc_norm=True, key_bias=False)
#: timm's EVA-02 (Eva): a class token with the absolute embedding, EVA-02's rotary embedding laid out
#: for a 16 x 16 reference grid, SwiGLU (B and L with its sub-LN), the patches' mean through fc_norm.
_EVA02_ARGS = dict(classifier="gap", class_token=True, fc_norm=True, glu=True, mlp_activation="silu", key_bias=False,
                   rotary_position_embedding=True, rope_reference_grid=(16, 16), input_normalization=CLIP_NORMALIZATION)
_EVA02_TI = dict(hidden_size=192, mlp_dim=512, num_heads=3, num_layers=12)  # mlp_ratio 4 * 2 / 3
_EVA02_S = dict(hidden_size=384, mlp_dim=1024, num_heads=6, num_layers=12)
_EVA02_B = dict(hidden_size=768, mlp_dim=2048, num_heads=12, num_layers=12)
_EVA02_L = dict(hidden_size=1024, mlp_dim=2730, num_heads=16, num_layers=24)  # int(1024 * 8 / 3)
_CLIP_ARGS = dict(pre_norm=True, patch_embedding_bias=False, layer_norm_epsilon=1e-5,
                  input_normalization=CLIP_NORMALIZATION)

#: The zoo's constructors, one per timm architecture (at the resolution its weights were trained).
ZOO_ARCHITECTURES = {
    a.name: a
    for a in [
        *(
            _zoo_row(f"DINOv2{s}14{'Reg4' if reg else ''}", f"DINOv2 ViT-{s}/14{' + 4 registers' if reg else ''}",
                     f"vit_{size}_patch14_{'reg4_' if reg else ''}dinov2", 518,
                     reference=_DINOV2_REG if reg else _DINOV2,
                     default_weights="lvd142m", dims=dims, patch_size=14, layer_scale=1e-5, **_IN,
                     **(dict(register_tokens=4, class_token_position_embedding=False) if reg else {}),
                     **(dict(glu=True, mlp_activation="silu") if s == "G" else {}))
            for reg in (False, True)
            for s, size, dims in (("S", "small", _S), ("B", "base", _B), ("L", "large", _L), ("G", "giant", _G))
        ),
        _zoo_row("CLIPB16", "CLIP ViT-B/16", "vit_base_patch16_clip_224", 224, reference=_CLIP,
                 default_weights="laion2b", dims=_B, patch_size=16, **_CLIP_ARGS),
        _zoo_row("CLIPB16QuickGELU", "CLIP ViT-B/16 (QuickGELU)", "vit_base_patch16_clip_quickgelu_224", 224,
                 reference=_CLIP, default_weights="openai", dims=_B, patch_size=16, mlp_activation="quick_gelu",
                 **_CLIP_ARGS),
        _zoo_row("CLIPL14", "CLIP ViT-L/14", "vit_large_patch14_clip_224", 224, reference=_CLIP,
                 default_weights="laion2b", dims=_L, patch_size=14, **_CLIP_ARGS),
        _zoo_row("CLIPL14QuickGELU", "CLIP ViT-L/14 (QuickGELU)", "vit_large_patch14_clip_quickgelu_224", 224,
                 reference=_CLIP, default_weights="openai", dims=_L, patch_size=14, mlp_activation="quick_gelu",
                 **_CLIP_ARGS),
        _zoo_row("SigLIPB16", "SigLIP ViT-B/16", "vit_base_patch16_siglip_224", 224, reference=_SIGLIP,
                 default_weights="webli", dims=_B, patch_size=16, classifier="map"),
        _zoo_row("SigLIPSo400m14", "SigLIP So400m/14", "vit_so400m_patch14_siglip_224", 224, reference=_SIGLIP,
                 default_weights="webli", dims=_SO400M, patch_size=14, classifier="map"),
        _zoo_row("DeiTS16", "DeiT-S/16", "deit_small_patch16_224", 224, reference=_DEIT, default_weights="fb_in1k",
                 dims=_S, patch_size=16, **_IN),
        _zoo_row("DeiTB16", "DeiT-B/16", "deit_base_patch16_224", 224, reference=_DEIT, default_weights="fb_in1k",
                 dims=_B, patch_size=16, **_IN),
        _zoo_row("DeiTS16Distilled", "DeiT-S/16 distilled", "deit_small_distilled_patch16_224", 224, reference=_DEIT,
                 default_weights="fb_in1k", dims=_S, patch_size=16, distillation_token=True, **_IN),
        _zoo_row("DeiTB16Distilled", "DeiT-B/16 distilled", "deit_base_distilled_patch16_224", 224, reference=_DEIT,
                 default_weights="fb_in1k", dims=_B, patch_size=16, distillation_token=True, **_IN),
        *(
            _zoo_row(f"DeiT3{s}16", f"DeiT III ViT-{s}/16", f"deit3_{size}_patch16_224", 224, reference=_DEIT3,
                     default_weights="fb_in22k_ft_in1k", dims=dims, patch_size=16, layer_scale=1e-6,
                     class_token_position_embedding=False, **_IN)
            for s, size, dims in (("S", "small", _S), ("B", "base", _B), ("L", "large", _L))
        ),
        *(
            _zoo_row(f"BEiT{v}{s}16", f"BEiT{' v2' if v else ''} ViT-{s}/16", f"beit{v}_{size}_patch16_224", 224,
                     reference=_BEITV2 if v else _BEIT, default_weights=default, dims=dims, patch_size=16,
                     layer_scale=0.1 if (v, s) == ("", "B") else 1e-5, **_BEIT_ARGS,
                     **(_IN if v else {}))
            for v, default in (("", "in22k_ft_in22k_in1k"), ("v2", "in1k_ft_in22k_in1k"))
            for s, size, dims in (("B", "base", _B), ("L", "large", _L))
        ),
        *(
            _zoo_row(f"EVA02{s}14", f"EVA-02 ViT-{s}/14", f"eva02_{size}_patch14_{res}", res, reference=_EVA02,
                     default_weights=default, dims=dims, patch_size=14, **_EVA02_ARGS,
                     **(dict(mlp_norm=True) if s in ("B", "L") else {}))
            for s, size, res, dims, default in (
                ("Ti", "tiny", 336, _EVA02_TI, "mim_in22k_ft_in1k"), ("S", "small", 336, _EVA02_S, "mim_in22k_ft_in1k"),
                ("B", "base", 448, _EVA02_B, "mim_in22k_ft_in22k_in1k"),
                ("L", "large", 448, _EVA02_L, "mim_in22k_ft_in22k_in1k"))
        ),
    ]
}
ARCHITECTURES.update(ZOO_ARCHITECTURES)


# === The model's configuration ===

#: The position embeddings a VisionTransformer can use (paper, Appendix D.4; big_vision).
POSITION_EMBEDDINGS = ("learned", "none", "learned_2d", "relative", "sincos2d")
#: How the model reads out its tokens: "token" (class token), "gap" (average), "map" (attention
#: pooling), "first" (the first token, no class token: big_vision's pool_type "0") and "none" (no
#: pooling: the head applies to every token, big_vision's pool_type "none").
CLASSIFIERS = ("token", "gap", "map", "first", "none")
POOLINGS = (None, "token", "gap", "avg", "max", "map", "first")


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

    family: ClassVar[str] = "vit"

    image_size: tuple = config_field("architecture", doc="int or (height, width) of the input images")
    patch_size: int = config_field("architecture")
    hidden_size: int = config_field("architecture")
    num_layers: int = config_field("architecture")
    num_heads: int = config_field("architecture")
    mlp_dim: int = config_field("architecture")
    classes: int = config_field("architecture", 1000)
    classifier: str = config_field("architecture", "token")
    representation_size: int = config_field("architecture", None)
    resnet: tuple = config_field("architecture", None)
    position_embedding: str = config_field("architecture", "learned")
    class_token_position_embedding: bool = config_field(
        "architecture", True,
        doc="whether the class token gets a position embedding (the original) or not (big_vision)",
    )
    num_channels: int = config_field("architecture", 3)
    layer_norm_epsilon: float = config_field("numerics", NUMERICS["original"]["layer_norm_epsilon"])
    gelu_approximate: bool = config_field("numerics", NUMERICS["original"]["gelu_approximate"])
    group_norm_epsilon: float = config_field("numerics", NUMERICS["original"]["group_norm_epsilon"])
    std_conv_epsilon: float = config_field("numerics", NUMERICS["original"]["std_conv_epsilon"])
    std_conv_epsilon_inside_sqrt: bool = config_field("numerics", NUMERICS["original"]["std_conv_epsilon_inside_sqrt"])
    position_embedding_resize: str = config_field("numerics", NUMERICS["original"]["position_embedding_resize"])
    include_top: bool = config_field("head", True)
    pooling: str = config_field("head", None)
    classifier_activation: object = config_field("head", "softmax")
    dropout_rate: float = config_field("training", 0.0)
    attention_dropout_rate: float = config_field("training", 0.0)
    patch_drop_rate: float = config_field(
        "training", 0.0, doc="fraction of patch tokens dropped in training (timm's patch_drop_rate; prefix tokens kept)"
    )
    remat: bool = config_field(
        "training", False, doc="recompute each encoder block in the backward pass (less memory, ~1/3 more compute)"
    )
    quantization: object = config_field("state", None)
    dynamic_image_size: bool = config_field(
        "input", False, doc="images of any size at run time; image_size is the one the embeddings are laid out on"
    )
    # --- Variants: timm's VisionTransformer switches. The defaults are the original ViT. ---
    class_token: bool = config_field(
        "architecture", None, doc="whether a class token is prepended; None: exactly when classifier='token'"
    )
    register_tokens: int = config_field("architecture", 0, doc="learned register tokens after the class token (`reg_tokens`)")
    distillation_token: bool = config_field(
        "architecture", False, doc="DeiT's distillation token after the class token, read by a second head `head_dist`"
    )
    distillation_output: str = config_field(
        "head", "mean", doc="with a distillation token: 'mean' of the two heads (inference), or 'both' heads' outputs"
    )
    patch_embedding_bias: bool = config_field("architecture", True, doc="whether the patch embedding has a bias")
    patch_embedding_norm: bool = config_field("architecture", False, doc="a norm on the patch tokens (AIMv2's)")
    pre_norm: bool = config_field("architecture", False, doc="a norm `norm_pre` before the blocks (CLIP's)")
    qkv_bias: bool = config_field("architecture", True, doc="whether query, key and value have biases")
    key_bias: bool = config_field(
        "architecture", True,
        doc="with qkv_bias, whether the key has one too (False: BEiT's and EVA's q and v biases; the softmax cancels it)")
    projection_bias: bool = config_field("architecture", True, doc="biases of the attention output and the MLP")
    layer_scale: float = config_field("architecture", None, doc="init value of per-channel layer scale; None: none")
    final_norm: bool = config_field("architecture", True, doc="a final norm (before pooling, or after it with fc_norm)")
    fc_norm: bool = config_field("architecture", False, doc="the final norm after pooling (`fc_norm`) instead of before")
    norm: str = config_field("architecture", "layer_norm", doc="'layer_norm' or 'rms_norm' (AIMv2)")
    mlp_activation: str = config_field(
        "architecture", None,
        doc="'gelu', 'gelu_tanh', 'quick_gelu', 'silu'; None: GELU in the form gelu_approximate says",
    )
    glu: bool = config_field("architecture", False, doc="gated MLP: Dense_1(act(Dense_0(x)) * Dense_2(x)) (SwiGLU)")
    relative_position_bias: bool = config_field(
        "architecture", False,
        doc="BEiT's learned 2-D relative position bias in every block's attention (one class token, no registers)",
    )
    rotary_position_embedding: bool = config_field(
        "architecture", False, doc="EVA-02's 2-D rotary position embedding of the patch tokens' queries and keys",
    )
    rope_temperature: float = config_field("architecture", 10000.0, doc="the rotary embedding's frequency base")
    rope_reference_grid: tuple = config_field(
        "architecture", None,
        doc="(rows, cols) the rotary positions are rescaled to span (timm's ref_feat_shape); None: patch indices",
    )
    rope_grid_offset: float = config_field("architecture", 0.0, doc="added to the rotary embedding's patch indices")
    rope_grid_indexing: str = config_field(
        "architecture", "ij", doc="'ij': the rotary embedding's first half follows the row, 'xy': the column")
    rope_coordinates: str = config_field(
        "architecture", "index", doc="rotary positions: 'index' (EVA's patch indices) or 'centered' (DINOv3's [-1, 1])")
    rope_learned_frequencies: bool = config_field(
        "architecture", False, doc="rotary frequencies learned per block and head (RoPE-Mixed, timm's 'mixed')")
    rope_rotate_half: bool = config_field(
        "architecture", False, doc="rotary channel pairs (j, j + head_dim / 2) instead of interleaved (2j, 2j + 1)")
    attention_norm: bool = config_field(
        "architecture", False, doc="a norm on the attention's output before its projection (EVA-02 CLIP's sub-LN)")
    mlp_norm: bool = config_field("architecture", False, doc="a norm inside the MLP before Dense_1 (EVA-02's sub-LN)")
    map_heads: int = config_field("architecture", None, doc="heads of the MAP head; None: num_heads")
    map_mlp_dim: int = config_field("architecture", None, doc="MLP width of the MAP head; None: mlp_dim")
    map_include_prefix: bool = config_field(
        "architecture", False, doc="whether the MAP head attends over the prefix tokens too (timm's Eva pool)")
    post_norm: bool = config_field(
        "architecture", False, doc="blocks normalise their branches' outputs, x + LN(MHA(x)) (EVA-02 enormous)")
    qk_norm: bool = config_field("architecture", False, doc="a norm on each head's query and key (timm's qk_norm)")
    num_kv_heads: object = config_field(
        "architecture", None,
        doc="grouped-query attention's key/value heads: one count, or one per block (Sapiens2); None: num_heads")
    attention_only_layer_scale: bool = config_field(
        "architecture", False, doc="layer scale on the attention branch only (Sapiens2's attn_only_layer_scale)")
    differential_attention: bool = config_field(
        "architecture", False,
        doc="differential attention: two softmax maps per head, map1 - lambda map2 (timm's DiffAttention)")
    parallel_blocks: bool = config_field(
        "architecture", False,
        doc="attention and MLP side by side on one norm, x + LS(MHA(LN(x)) + MLP(LN(x))) (timm's ParallelScalingBlock)")
    input_normalization: tuple = config_field(
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
        for key in ("dropout_rate", "attention_dropout_rate", "patch_drop_rate"):
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
        if self.patch_drop_rate and (self.position_embedding == "relative" or self.classifier in ("first", "none")):
            raise ValueError(
                f"patch_drop_rate={self.patch_drop_rate} drops patch tokens in training, which "
                + ("relative position embeddings (learned per offset in the full token sequence)"
                   if self.position_embedding == "relative" else f"classifier={self.classifier!r} (it reads patch tokens "
                   "in place)")
                + " cannot follow; set patch_drop_rate=0 or use a 'learned' position embedding and classifier 'token', "
                "'gap' or 'map'."
            )
        if self.relative_position_bias and (self.dynamic_image_size or self.patch_drop_rate):
            raise ValueError(
                ("dynamic_image_size=True" if self.dynamic_image_size else f"patch_drop_rate={self.patch_drop_rate}")
                + " changes the patch grid at run time, but relative_position_bias=True (BEiT's) learns one bias per "
                "2-D offset of the fixed grid of image_size. Use a fixed image_size and patch_drop_rate=0."
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

    def _check_kv_heads(self):
        """num_kv_heads: None, one divisor of num_heads, or one per block (a tuple)."""
        value = self.num_kv_heads
        if value is None:
            return
        counts = list(value) if isinstance(value, (list, tuple)) else [value]
        if isinstance(value, (list, tuple)) and len(counts) != self.num_layers:
            raise ValueError(f"num_kv_heads has {len(counts)} entries; give one per block ({self.num_layers}) or one "
                             "count for every block.")
        for count in counts:
            if isinstance(count, bool) or not isinstance(count, int) or count < 1 or self.num_heads % count:
                raise ValueError(f"num_kv_heads entries must be positive divisors of num_heads ({self.num_heads}); "
                                 f"got {count!r}.")
        object.__setattr__(self, "num_kv_heads", tuple(counts) if isinstance(value, (list, tuple)) else counts[0])

    def block_kv_heads(self, i):
        """The key/value heads of block `i` (None: num_heads)."""
        value = self.num_kv_heads
        return value[i] if isinstance(value, tuple) else value

    @classmethod
    def head_pooling(cls, arguments):
        """Without a head (`classes=0`), the features as the classifier reads them: the class token,
        the average, the MAP head or the first token ("none": the token sequence itself)."""
        return {"none": None}.get(arguments.get("classifier", "token"), arguments.get("classifier", "token"))

    def _check_variant_fields(self):
        """Normalise and validate the fields of timm's switches (the "Variants" block)."""
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731  (frozen dataclass)
        if self.class_token is not None:
            set_("class_token", bool(self.class_token))
        for key in ("distillation_token", "patch_embedding_bias", "patch_embedding_norm", "pre_norm",
                    "qkv_bias", "key_bias", "projection_bias", "final_norm", "fc_norm", "glu", "relative_position_bias",
                    "rotary_position_embedding", "attention_norm", "mlp_norm", "rope_rotate_half", "post_norm",
                    "map_include_prefix", "rope_learned_frequencies", "parallel_blocks", "differential_attention", "qk_norm", "attention_only_layer_scale"):
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
        clashing = [k for k in ("post_norm", "mlp_norm") if getattr(self, k)]
        if self.parallel_blocks and clashing:
            raise ValueError(
                f"parallel_blocks=True runs attention and MLP on one norm of the block's input; {clashing[0]}=True "
                "has no place in it (timm's ParallelScalingBlock has neither). Set one of them to False.")
        if self.differential_attention and (self.rotary_position_embedding or self.relative_position_bias
                                            or self.position_embedding == "relative"
                                            or (self.hidden_size // self.num_heads) % 2):
            raise ValueError(
                "differential_attention=True splits each head's query and key in two halves: it needs an even head "
                f"size (hidden_size / num_heads = {self.hidden_size // self.num_heads}) and no rotary or relative "
                "position terms in the attention. Change num_heads, or turn those off.")
        self._check_kv_heads()
        for key in ("map_heads", "map_mlp_dim"):
            value = getattr(self, key)
            if value is not None:
                if isinstance(value, bool) or int(value) < 1:
                    raise ValueError(f"{key} must be a positive int or None; got {value!r}.")
                set_(key, int(value))
        if self.map_heads and self.hidden_size % self.map_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by map_heads {self.map_heads}.")
        set_("rope_temperature", float(self.rope_temperature))
        set_("rope_grid_offset", float(self.rope_grid_offset))
        self._check_choice("rope_grid_indexing", ("ij", "xy"))
        self._check_choice("rope_coordinates", ("index", "centered"))
        if self.rope_reference_grid is not None:
            set_("rope_reference_grid", as_pair(self.rope_reference_grid))
        if self.rotary_position_embedding and (self.hidden_size // max(self.num_heads, 1)) % 4:
            raise ValueError(
                f"rotary_position_embedding=True rotates channel pairs of each head by row and by column: the head "
                f"size (hidden_size / num_heads = {self.hidden_size / self.num_heads:g}) must be a multiple of 4."
            )
        if self.relative_position_bias and not (self.has_class_token and self.num_prefix_tokens == 1):
            raise ValueError(
                "relative_position_bias=True (BEiT's) is laid out for one class token in front of the patches; this "
                f"model has {self.num_prefix_tokens} prefix token(s) (class_token={self.class_token!r}, "
                f"register_tokens={self.register_tokens}, distillation_token={self.distillation_token}). Use "
                "class_token=True without register or distillation tokens."
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
        if self.rope_reference_grid is not None:
            out["rope_reference_grid"] = list(self.rope_reference_grid)
        return out

    def architecture(self):
        """{field: value} of `architecture_fields()` (what a checkpoint of this model holds)."""
        return {f: getattr(self, f) for f in self.architecture_fields()}


#: Fields a checkpoint determines (architecture and numerics), and the numerics alone.
ARCHITECTURE_FIELDS = ViTConfig.architecture_fields()
NUMERICS_FIELDS = ViTConfig.numerics_fields()
#: The fields a row of the architecture table fixes (what the constructors own).
TABLE_FIELDS = tuple(f for f in ViTConfig.fields() if f in {a.name for a in dataclasses.fields(Architecture)})

# === Vision Transformers ===


def attention_flops(tokens, hidden, mlp_dim, relative=False):
    """One pre-LN Transformer block over `tokens` tokens: q/k/v and out projections, QK^T, AV and
    the MLP; with `relative`, the logits of every query against the 2 * tokens - 1 offset
    embeddings (the paper's 1-D relative attention)."""
    t, d, m = tokens, hidden, mlp_dim
    total = (
        2 * t * d * 3 * d  # query, key, value
        + 2 * t * t * d  # QK^T
        + 2 * t * t * d  # AV
        + 2 * t * d * d  # out projection
        + 2 * 2 * t * d * m  # MLP
    )
    if relative:
        total += 2 * t * (2 * t - 1) * d  # q . r[offset] for every offset
    return total


def map_head_flops(tokens, hidden, mlp_dim):
    """big_vision's MAP head: one learned probe attends over `tokens` tokens (its query and out
    projections for one token, key and value for all), then an MLP on the probe."""
    t, d, m = tokens, hidden, mlp_dim
    return 2 * d * d + 2 * 2 * t * d * d + 2 * t * d + 2 * t * d + 2 * d * d + 2 * 2 * d * m


def vit_flops(config, image_size, classes):
    """Forward FLOPs of a VisionTransformer `config` (its arguments) at `image_size` (h, w)."""
    h, w = image_size
    stride = config["patch_size"] * resnet_stride(config.get("resnet"))
    if h % stride or w % stride:
        raise ValueError(f"Image size {(h, w)} is not divisible by the architecture's stride {stride}.")
    channels = config.get("num_channels", 3)
    total = 0
    resnet = config.get("resnet")
    if resnet is not None:
        units, width_factor = resnet
        trunk, (h, w, channels) = resnet_flops(h, w, tuple(units), width_factor, channels, preact=False)
        total += trunk
    p, d = config["patch_size"], config["hidden_size"]
    gh, gw = h // p, w // p
    tokens = gh * gw
    total += conv_flops(gh, gw, p, channels, d)  # patch embedding
    classifier = config.get("classifier", "token")
    class_token = config.get("class_token")
    class_token = classifier == "token" if class_token is None else class_token
    distilled = bool(config.get("distillation_token"))
    # The prefix tokens (class, distillation, registers) run through every block with the patches.
    t = tokens + int(bool(class_token)) + int(distilled) + int(config.get("register_tokens") or 0)
    m = config["mlp_dim"]
    relative = config.get("position_embedding") == "relative"
    total += config["num_layers"] * attention_flops(t, d, m, relative)
    if config.get("glu"):  # a gated MLP's second input projection (SwiGLU: Dense_2)
        total += config["num_layers"] * 2 * t * d * m
    # The read-out runs with a head, or when a headless model pools (pooling= given).
    if not (classes or config.get("pooling") is not None):
        return total
    mode = {None: classifier, "avg": "gap"}.get(config.get("pooling"), config.get("pooling"))
    if mode == "map":
        total += map_head_flops(t, d, config.get("map_mlp_dim") or m)
    rep = config.get("representation_size")
    heads = t if mode == "none" else 1  # "none": pre_logits and the head on every token
    if rep:
        total += heads * 2 * d * rep
        d = rep
    if classes:  # DeiT's distilled models run two heads (class and distillation token)
        total += heads * 2 * d * classes * (2 if distilled else 1)
    return total


# === Config inference from a canonical weight tree ===

_BLOCK = re.compile(r"^Transformer/encoderblock_(\d+)/")
_UNIT = re.compile(r"^block(\d+)/unit(\d+)/")
_QUERY = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/kernel"
_POS = "Transformer/posembed_input/pos_embedding"


def _require(tree, key, source):
    if key not in tree:
        raise CheckpointError(f"{source}: missing weight {key!r}; this is not a complete ViT checkpoint.")
    return tree[key]


def infer_resnet(tree, source="checkpoint"):
    """(stage_units, width_factor) of the hybrid ResNet in `tree`, or None for a plain ViT."""
    if "conv_root/kernel" not in tree:
        return None
    width = width_factor(tree["conv_root/kernel"].shape[-1])
    units = count_units(tree, _UNIT)
    if units and sorted(units) != list(range(1, len(units) + 1)):
        raise CheckpointError(f"{source}: ResNet stages {sorted(units)} are not numbered 1..{len(units)}.")
    return tuple(units[s] for s in sorted(units)), width


def infer_config(tree, numerics, *, source="checkpoint", image_size=None, num_heads=None, num_channels=None,
                 class_token_position_embedding=True, position_embedding="learned"):
    """VisionTransformer kwargs of the canonical `tree`, plus the `numerics` (a NUMERICS row or dict).

    `image_size` (height, width) is the checkpoint's resolution when its config states one;
    otherwise the position-embedding grid is taken as square. `num_heads` is needed only when
    the tree cannot tell (it always can: the query kernel is (hidden, heads, head_dim)).
    `class_token_position_embedding=False` says the stored embedding covers the patch grid
    alone (big_vision's layout); a `position_embedding` without weights ("sincos2d") leaves
    the resolution to `image_size` (default: the multiple of the patch nearest 224).
    """
    embed = _require(tree, "embedding/kernel", source)
    if embed.ndim != 4 or embed.shape[0] != embed.shape[1]:
        raise CheckpointError(f"{source}: embedding/kernel has shape {embed.shape}; expected (patch, patch, in, hidden).")
    patch, hidden = int(embed.shape[0]), int(embed.shape[-1])
    layers = sorted({int(m.group(1)) for m in map(_BLOCK.match, tree) if m})
    if not layers or layers != list(range(len(layers))):
        raise CheckpointError(f"{source}: encoder blocks {layers} are not numbered 0..N-1.")
    query = _require(tree, _QUERY, source)
    heads = int(query.shape[1]) if query.ndim == 3 else num_heads
    mlp = int(_require(tree, "Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel", source).shape[-1])
    classifier = "token" if "cls" in tree else "map" if "MAPHead_0/probe" in tree else "gap"
    prefix = 1 if classifier == "token" and class_token_position_embedding else 0
    resnet = infer_resnet(tree, source)
    stride = patch * resnet_stride(resnet)
    tokens = None
    if position_embedding == "learned":
        tokens = int(_require(tree, _POS, source).shape[-2]) - prefix
    if image_size is not None:
        h, w = as_pair(image_size)
        if min(h, w) < stride or (tokens is not None and (h // stride) * (w // stride) != tokens):
            # The stated size does not fit the stored grid: trust the weights.
            image_size = None
    if image_size is None and tokens is None:
        h = w = max(1, round(224 / stride)) * stride
    elif image_size is None:
        side = int(round(tokens**0.5))
        if side * side != tokens:
            raise CheckpointError(
                f"{source}: the position embedding holds {tokens} patch tokens, not a square grid, and the "
                "checkpoint states no image size."
            )
        h = w = side * stride
    config = dict(
        image_size=(h, w),
        patch_size=patch,
        hidden_size=hidden,
        num_layers=len(layers),
        num_heads=heads,
        mlp_dim=mlp,
        classes=int(tree["head/kernel"].shape[-1]) if "head/kernel" in tree else None,
        classifier=classifier,
        representation_size=int(tree["pre_logits/kernel"].shape[-1]) if "pre_logits/kernel" in tree else None,
        resnet=resnet,
        num_channels=int(num_channels or (tree["conv_root/kernel"] if resnet else embed).shape[2]),
    )
    if position_embedding != "learned":
        config["position_embedding"] = position_embedding
    if not class_token_position_embedding:
        config["class_token_position_embedding"] = False
    config.update({k: numerics[k] for k in NUMERICS_FIELDS})
    return config


def source_grid(config):
    """The (rows, cols) position-embedding grid of a checkpoint config."""
    stride = config["patch_size"] * resnet_stride(config.get("resnet"))
    h, w = config["image_size"]  # a config object's: always (height, width)
    return h // stride, w // stride


def heads_from_table(hidden, layers, mlp, classifier, resnet, source="checkpoint"):
    """The head count of the architecture-table row whose shapes match (for files that store
    attention as stacked qkv matrices and carry no config stating it)."""
    rows = [
        a
        for a in {**ARCHITECTURES, **EXTRA_ARCHITECTURES}.values()
        if (a.hidden_size, a.num_layers, a.mlp_dim, a.classifier) == (hidden, layers, mlp, classifier)
        and (a.resnet is None) == (resnet is None)
    ]
    heads = {a.num_heads for a in rows}
    if len(heads) != 1:
        raise CheckpointError(
            f"{source}: the number of attention heads is not stored in the weights (hidden {hidden}, "
            f"{layers} layers, MLP {mlp}, classifier {classifier!r}) and no known architecture matches. "
            "Put a config.json next to the weights naming it (timm: 'architecture' and "
            "'model_args': {'num_heads': ...}; transformers: 'num_attention_heads')."
        )
    return heads.pop()


# === Preset rows ===

_GS = "gs://vit_models/"

# (constructor, tag, resolution, classes, top-1, repository, original .npz under gs://vit_models/)
_TIMM_ROWS = [
    # ViT-Ti/16
    ("ViTTi16", "augreg_in21k_ft_in1k", 224, 1000, 75.454, "timm/vit_tiny_patch16_224.augreg_in21k_ft_in1k",
     'augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_224.npz'),
    ("ViTTi16", "augreg_in21k_ft_in1k", 384, 1000, 78.424, "timm/vit_tiny_patch16_384.augreg_in21k_ft_in1k",
     'augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384.npz'),
    ("ViTTi16", "augreg_in21k", 224, 21843, None, "timm/vit_tiny_patch16_224.augreg_in21k",
     'augreg/Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz'),
    # ViT-S/16
    ("ViTS16", "augreg_in21k_ft_in1k", 224, 1000, 81.384, "timm/vit_small_patch16_224.augreg_in21k_ft_in1k",
     'augreg/S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_224.npz'),
    ("ViTS16", "augreg_in21k_ft_in1k", 384, 1000, 83.802, "timm/vit_small_patch16_384.augreg_in21k_ft_in1k",
     'augreg/S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384.npz'),
    ("ViTS16", "augreg_in1k", 224, 1000, 78.846, "timm/vit_small_patch16_224.augreg_in1k",
     'augreg/S_16-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_224.npz'),
    ("ViTS16", "augreg_in1k", 384, 1000, 81.116, "timm/vit_small_patch16_384.augreg_in1k",
     'augreg/S_16-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_384.npz'),
    ("ViTS16", "augreg_in21k", 224, 21843, None, "timm/vit_small_patch16_224.augreg_in21k",
     'augreg/S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0.npz'),
    # ViT-S/32
    ("ViTS32", "augreg_in21k_ft_in1k", 224, 1000, 75.994, "timm/vit_small_patch32_224.augreg_in21k_ft_in1k",
     'augreg/S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_224.npz'),
    ("ViTS32", "augreg_in21k_ft_in1k", 384, 1000, 80.486, "timm/vit_small_patch32_384.augreg_in21k_ft_in1k",
     'augreg/S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384.npz'),
    ("ViTS32", "augreg_in21k", 224, 21843, None, "timm/vit_small_patch32_224.augreg_in21k",
     'augreg/S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0.npz'),
    # ViT-B/8
    ("ViTB8", "augreg2_in21k_ft_in1k", 224, 1000, 86.218, "timm/vit_base_patch8_224.augreg2_in21k_ft_in1k", None),
    ("ViTB8", "augreg_in21k_ft_in1k", 224, 1000, 85.798, "timm/vit_base_patch8_224.augreg_in21k_ft_in1k",
     'augreg/B_8-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_224.npz'),
    ("ViTB8", "augreg_in21k", 224, 21843, None, "timm/vit_base_patch8_224.augreg_in21k",
     'augreg/B_8-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz'),
    # ViT-B/16
    ("ViTB16", "augreg2_in21k_ft_in1k", 224, 1000, 85.096, "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", None),
    ("ViTB16", "augreg_in21k_ft_in1k", 224, 1000, 84.532, "timm/vit_base_patch16_224.augreg_in21k_ft_in1k",
     'augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_224.npz'),
    ("ViTB16", "augreg_in21k_ft_in1k", 384, 1000, 85.996, "timm/vit_base_patch16_384.augreg_in21k_ft_in1k",
     'augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_384.npz'),
    ("ViTB16", "orig_in21k_ft_in1k", 224, 1000, 81.786, "timm/vit_base_patch16_224.orig_in21k_ft_in1k", 'imagenet21k+imagenet2012/ViT-B_16-224.npz'),
    ("ViTB16", "orig_in21k_ft_in1k", 384, 1000, 84.2, "timm/vit_base_patch16_384.orig_in21k_ft_in1k", 'imagenet21k+imagenet2012/ViT-B_16.npz'),
    ("ViTB16", "augreg_in1k", 224, 1000, 79.154, "timm/vit_base_patch16_224.augreg_in1k",
     'augreg/B_16-i1k-300ep-lr_0.001-aug_strong2-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_224.npz'),
    ("ViTB16", "augreg_in1k", 384, 1000, 81.102, "timm/vit_base_patch16_384.augreg_in1k",
     'augreg/B_16-i1k-300ep-lr_0.001-aug_strong2-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_384.npz'),
    ("ViTB16", "sam_in1k", 224, 1000, 80.244, "timm/vit_base_patch16_224.sam_in1k", 'sam/ViT-B_16.npz'),
    ("ViTB16", "augreg_in21k", 224, 21843, None, "timm/vit_base_patch16_224.augreg_in21k",
     'augreg/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0.npz'),
    ("ViTB16", "orig_in21k", 224, 0, None, "timm/vit_base_patch16_224.orig_in21k", 'imagenet21k/ViT-B_16.npz'),
    # ViT-B/32
    ("ViTB32", "augreg_in21k_ft_in1k", 224, 1000, 80.716, "timm/vit_base_patch32_224.augreg_in21k_ft_in1k",
     'augreg/B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_224.npz'),
    ("ViTB32", "augreg_in21k_ft_in1k", 384, 1000, 83.35, "timm/vit_base_patch32_384.augreg_in21k_ft_in1k",
     'augreg/B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384.npz'),
    ("ViTB32", "augreg_in1k", 224, 1000, 74.894, "timm/vit_base_patch32_224.augreg_in1k",
     'augreg/B_32-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_224.npz'),
    ("ViTB32", "augreg_in1k", 384, 1000, 78.752, "timm/vit_base_patch32_384.augreg_in1k",
     'augreg/B_32-i1k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_384.npz'),
    ("ViTB32", "sam_in1k", 224, 1000, 73.694, "timm/vit_base_patch32_224.sam_in1k", 'sam/ViT-B_32.npz'),
    ("ViTB32", "augreg_in21k", 224, 21843, None, "timm/vit_base_patch32_224.augreg_in21k",
     'augreg/B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0.npz'),
    ("ViTB32", "orig_in21k", 224, 0, None, "timm/vit_base_patch32_224.orig_in21k", 'imagenet21k/ViT-B_32.npz'),
    # ViT-L/16
    ("ViTL16", "augreg_in21k_ft_in1k", 224, 1000, 85.834, "timm/vit_large_patch16_224.augreg_in21k_ft_in1k",
     'augreg/L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_224.npz'),
    ("ViTL16", "augreg_in21k_ft_in1k", 384, 1000, 87.084, "timm/vit_large_patch16_384.augreg_in21k_ft_in1k",
     'augreg/L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_384.npz'),
    ("ViTL16", "augreg_in21k", 224, 21843, None, "timm/vit_large_patch16_224.augreg_in21k",
     'augreg/L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1.npz'),
    ("ViTL16", "orig_in21k", 224, 0, None, "timm/vit_large_patch16_224.orig_in21k", 'imagenet21k/ViT-L_16.npz'),
    # ViT-L/32
    ("ViTL32", "orig_in21k_ft_in1k", 384, 1000, 81.51, "timm/vit_large_patch32_384.orig_in21k_ft_in1k", 'imagenet21k+imagenet2012/ViT-L_32.npz'),
    ("ViTL32", "orig_in21k", 224, 0, None, "timm/vit_large_patch32_224.orig_in21k", 'imagenet21k/ViT-L_32.npz'),
    # ViT-H/14
    ("ViTH14", "orig_in21k", 224, 0, None, "timm/vit_huge_patch14_224.orig_in21k", 'imagenet21k/ViT-H_14.npz'),
    # R+ViT-Ti/16
    ("RViTTi16", "augreg_in21k_ft_in1k", 224, 1000, 71.798, "timm/vit_tiny_r_s16_p8_224.augreg_in21k_ft_in1k",
     'augreg/R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_224.npz'),
    ("RViTTi16", "augreg_in21k_ft_in1k", 384, 1000, 75.962, "timm/vit_tiny_r_s16_p8_384.augreg_in21k_ft_in1k",
     'augreg/R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384.npz'),
    ("RViTTi16", "augreg_in21k", 224, 21843, None, "timm/vit_tiny_r_s16_p8_224.augreg_in21k",
     'augreg/R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0.npz'),
    # R26+ViT-S/32
    ("R26ViTS32", "augreg_in21k_ft_in1k", 224, 1000, 81.864, "timm/vit_small_r26_s32_224.augreg_in21k_ft_in1k",
     'augreg/R26_S_32-i21k-300ep-lr_0.001-aug_light0-wd_0.03-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.03-res_224.npz'),
    ("R26ViTS32", "augreg_in21k_ft_in1k", 384, 1000, 84.048, "timm/vit_small_r26_s32_384.augreg_in21k_ft_in1k",
     'augreg/R26_S_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.03-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.03-res_384.npz'),
    ("R26ViTS32", "augreg_in21k", 224, 21843, None, "timm/vit_small_r26_s32_224.augreg_in21k",
     'augreg/R26_S_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.03-do_0.0-sd_0.0.npz'),
    # R50+ViT-B/16
    ("R50ViTB16", "orig_in21k_ft_in1k", 384, 1000, 84.976, "timm/vit_base_r50_s16_384.orig_in21k_ft_in1k", 'imagenet21k+imagenet2012/R50+ViT-B_16.npz'),
    ("R50ViTB16", "orig_in21k", 224, 0, None, "timm/vit_base_r50_s16_224.orig_in21k", 'imagenet21k/R50+ViT-B_16.npz'),
    # R50+ViT-L/32
    ("R50ViTL32", "augreg_in21k_ft_in1k", 224, 1000, 84.422, "timm/vit_large_r50_s32_224.augreg_in21k_ft_in1k",
     'augreg/R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1--imagenet2012-steps_20k-lr_0.01-res_224.npz'),
    ("R50ViTL32", "augreg_in21k_ft_in1k", 384, 1000, 86.182, "timm/vit_large_r50_s32_384.augreg_in21k_ft_in1k",
     'augreg/R50_L_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_384.npz'),
    ("R50ViTL32", "augreg_in21k", 224, 21843, None, "timm/vit_large_r50_s32_224.augreg_in21k",
     'augreg/R50_L_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0.npz'),
]

# The transformers conversions of the original checkpoints (google/vit-*): the same weights as
# the orig_* rows, in transformers' layout and numerics (LayerNorm epsilon 1e-12). The in21k
# ones keep the original `pre_logits` (transformers' pooler) and have no head.
_TRANSFORMERS_ROWS = [
    ("ViTB16", "google_in21k_ft_in1k", 224, 1000, None, "google/vit-base-patch16-224", "imagenet21k+imagenet2012/ViT-B_16-224.npz"),
    ("ViTB16", "google_in21k_ft_in1k", 384, 1000, None, "google/vit-base-patch16-384", "imagenet21k+imagenet2012/ViT-B_16.npz"),
    ("ViTB16", "google_in21k", 224, 0, None, "google/vit-base-patch16-224-in21k", "imagenet21k/ViT-B_16.npz"),
    ("ViTB32", "google_in21k_ft_in1k", 384, 1000, None, "google/vit-base-patch32-384", "imagenet21k+imagenet2012/ViT-B_32.npz"),
    ("ViTB32", "google_in21k", 224, 0, None, "google/vit-base-patch32-224-in21k", "imagenet21k/ViT-B_32.npz"),
    ("ViTL16", "google_in21k_ft_in1k", 224, 1000, None, "google/vit-large-patch16-224", "imagenet21k+imagenet2012/ViT-L_16-224.npz"),
    ("ViTL16", "google_in21k_ft_in1k", 384, 1000, None, "google/vit-large-patch16-384", "imagenet21k+imagenet2012/ViT-L_16.npz"),
    ("ViTL16", "google_in21k", 224, 0, None, "google/vit-large-patch16-224-in21k", "imagenet21k/ViT-L_16.npz"),
    ("ViTL32", "google_in21k_ft_in1k", 384, 1000, None, "google/vit-large-patch32-384", "imagenet21k+imagenet2012/ViT-L_32.npz"),
    ("ViTL32", "google_in21k", 224, 0, None, "google/vit-large-patch32-224-in21k", "imagenet21k/ViT-L_32.npz"),
    ("ViTH14", "google_in21k", 224, 0, None, "google/vit-huge-patch14-224-in21k", "imagenet21k/ViT-H_14.npz"),
]

# timm's zoo: (constructor, tag, timm architecture). Resolution, head size, mean/std, licence and
# Hub repository are timm's pretrained_cfg of "<architecture>.<tag>" (`timm_zoo_table`).
_ZOO_TAGS = [
    *((f"DINOv2{s}14{r}", "lvd142m", f"vit_{size}_patch14_{r.lower() + '_' if r else ''}dinov2")
      for r in ("", "Reg4") for s, size in (("S", "small"), ("B", "base"), ("L", "large"), ("G", "giant"))),
    ("CLIPB16", "laion2b", "vit_base_patch16_clip_224"),
    ("CLIPB16", "datacompxl", "vit_base_patch16_clip_224"),
    ("CLIPB16", "metaclip_400m", "vit_base_patch16_clip_224"),
    ("CLIPB16", "laion2b_ft_in1k", "vit_base_patch16_clip_224"),
    ("CLIPB16", "laion2b_ft_in12k_in1k", "vit_base_patch16_clip_224"),
    ("CLIPB16QuickGELU", "openai", "vit_base_patch16_clip_quickgelu_224"),
    ("CLIPL14", "laion2b", "vit_large_patch14_clip_224"),
    ("CLIPL14", "datacompxl", "vit_large_patch14_clip_224"),
    ("CLIPL14", "laion2b_ft_in1k", "vit_large_patch14_clip_224"),
    ("CLIPL14QuickGELU", "openai", "vit_large_patch14_clip_quickgelu_224"),
    ("SigLIPB16", "webli", "vit_base_patch16_siglip_224"),
    ("SigLIPB16", "v2_webli", "vit_base_patch16_siglip_224"),
    ("SigLIPSo400m14", "webli", "vit_so400m_patch14_siglip_224"),
    ("SigLIPSo400m14", "v2_webli", "vit_so400m_patch14_siglip_224"),
    ("DeiTS16", "fb_in1k", "deit_small_patch16_224"),
    ("DeiTB16", "fb_in1k", "deit_base_patch16_224"),
    ("DeiTB16", "fb_in1k", "deit_base_patch16_384"),
    ("DeiTS16Distilled", "fb_in1k", "deit_small_distilled_patch16_224"),
    ("DeiTB16Distilled", "fb_in1k", "deit_base_distilled_patch16_224"),
    ("DeiTB16Distilled", "fb_in1k", "deit_base_distilled_patch16_384"),
    *((f"DeiT3{s}16", tag, f"deit3_{size}_patch16_{res}")
      for s, size in (("S", "small"), ("B", "base"), ("L", "large"))
      for tag in ("fb_in22k_ft_in1k", "fb_in1k") for res in (224, 384)),
    *((f"BEiT{s}16", tag, f"beit_{size}_patch16_{res}")
      for s, size, tag, res in (("B", "base", "in22k_ft_in22k", 224), ("B", "base", "in22k_ft_in22k_in1k", 224),
                                ("B", "base", "in22k_ft_in22k_in1k", 384), ("L", "large", "in22k_ft_in22k", 224),
                                ("L", "large", "in22k_ft_in22k_in1k", 224), ("L", "large", "in22k_ft_in22k_in1k", 384),
                                ("L", "large", "in22k_ft_in22k_in1k", 512))),
    *((f"BEiTv2{s}16", tag, f"beitv2_{size}_patch16_224")
      for s, size in (("B", "base"), ("L", "large"))
      for tag in ("in1k_ft_in1k", "in1k_ft_in22k", "in1k_ft_in22k_in1k")),
    *((f"EVA02{s}14", tag, f"eva02_{size}_patch14_{res}")
      for s, size, tag, res in (
          ("Ti", "tiny", "mim_in22k", 224), ("Ti", "tiny", "mim_in22k_ft_in1k", 336),
          ("S", "small", "mim_in22k", 224), ("S", "small", "mim_in22k_ft_in1k", 336),
          *(("B", "base", tag, res) for tag, res in (("mim_in22k", 224), ("mim_in22k_ft_in1k", 448),
                                                     ("mim_in22k_ft_in22k", 448), ("mim_in22k_ft_in22k_in1k", 448))),
          *(("L", "large", tag, res) for tag, res in (
              ("mim_in22k", 224), ("mim_m38m", 224), ("mim_in22k_ft_in1k", 448), ("mim_in22k_ft_in22k", 448),
              ("mim_in22k_ft_in22k_in1k", 448), ("mim_m38m_ft_in1k", 448), ("mim_m38m_ft_in22k", 448),
              ("mim_m38m_ft_in22k_in1k", 448))))),
    # MAE (He et al., 2022): pre-trained encoders of the original architectures, no head.
    ("ViTB16", "mae", "vit_base_patch16_224"),
    ("ViTL16", "mae", "vit_large_patch16_224"),
    ("ViTH14", "mae", "vit_huge_patch14_224"),
]


def _signed_unit(cfg):
    return dict(mean=tuple(cfg.get("mean") or (0.5,) * 3), std=tuple(cfg.get("std") or (0.5,) * 3))


def _zoo_preset_row(constructor, tag, timm_architecture):
    name = f"{timm_architecture}.{tag}"
    cfg = timm_pretrained_cfg(name)
    if cfg is None:
        raise ValueError(f"{name} is not a pretrained tag of timm's zoo table ({TIMM_ZOO_TABLE_FILE}).")
    row = ARCHITECTURES[constructor]
    extra = dict(license=cfg.get("license"), timm_name=name, **_signed_unit(cfg))
    # The repository may be another architecture's (timm's QuickGELU CLIPs read the GELU ones'
    # files): the preset states what its architecture changes in the repository's config.json.
    repo_architecture = cfg["hf_hub_id"].split("/", 1)[-1].split(".", 1)[0]
    if repo_architecture != timm_architecture and "mlp_activation" in dict(row.variant):
        extra["config"] = (("mlp_activation", dict(row.variant)["mlp_activation"]),)
    return (constructor, tag, int(cfg["input_size"][-1]), int(cfg["num_classes"] or 0), None, cfg["hf_hub_id"], None,
            "timm", extra)


#: The licence of the R+ViT hybrids' weights: timm's vision_transformer_hybrid.py, whose tags are
#: not in the zoo table (vision_transformer.py's), states apache-2.0 in its `_cfg` for all of them.
HYBRID_LICENSE = "apache-2.0"


def _timm_preset_row(a, t, r, c, top1, repo, orig):
    cfg = timm_pretrained_cfg(repo.split("/", 1)[-1])
    cfg = cfg if cfg is not None else {"license": HYBRID_LICENSE}
    extra = dict(license=cfg.get("license"), **_signed_unit(cfg))
    return (a, t, r, c, top1, repo, _GS + orig if orig else None, "timm", extra)


#: Each family's preset rows (`ModelFamily.presets`): (constructor, tag, resolution, classes,
#: top-1, Hub repository, original file or None, source, {further `Preset` fields: license, mean,
#: std, timm_name, config}).
VIT_PRESET_ROWS = (
    *(_timm_preset_row(*row) for row in _TIMM_ROWS),
    # google/vit-* on the Hub: Apache-2.0, as the original checkpoints.
    *((a, t, r, c, top1, repo, _GS + orig, "transformers", dict(license="apache-2.0"))
      for a, t, r, c, top1, repo, orig in _TRANSFORMERS_ROWS),
    *(_zoo_preset_row(*row) for row in _ZOO_TAGS),
)


# === Sharding rules (`keras_vit.get_layout_map`) ===
#
# The tensor-parallel ("Megatron") layout on the mesh's model axis. Each sublayer of an encoder
# block costs one all-reduce over the model axis per pass:
#
# - attention: query/key/value kernels (hidden, heads, head_dim) are split along heads (their
#   biases (heads, head_dim) likewise), so every device attends with whole heads of its own; the
#   out kernel (heads, head_dim, hidden) is split along its rows (heads) and its partial sums are
#   all-reduced; the out bias is replicated (added once, after the sum);
# - MLP: Dense_0 (hidden, mlp) by columns with its bias, GELU on the local slice, Dense_1
#   (mlp, hidden) by rows, one all-reduce; Dense_1's bias replicated;
# - embeddings: the patch-embedding kernel and bias, the class token and the position embedding
#   are split along hidden. A conv's output channels are independent, so each device computes its
#   slice of every token with no communication; the sequence is gathered by the first block;
# - pre_logits by columns and head by rows (input features): a column/row pair needs one
#   all-reduce of (batch, classes) and works for any class count (21843 is odd);
# - the hybrids' BiT ResNet (conv_root, gn_root, block*/unit*) is replicated on purpose: it works
#   on large spatial activations with few parameters (ResNet-50 stages are < 8% of R50+ViT-L), and
#   splitting output channels would all-gather (batch, height, width, channels) before every conv;
#   data parallelism over the batch axis scales it instead;
# - LayerNorm / GroupNorm scales and biases are replicated (tiny, needed whole by every device);
# - the output of each block's two residual branches (attention, MLP) is laid out
#   (batch, None, None): split over the data axis, whole on the model axis, which states where the
#   all-reduce of each sublayer lands and keeps the batch on the data axis. (XLA may still choose
#   to do the residual add and LayerNorm split on hidden, adding an all-gather per sublayer; the
#   CPU compiler does, see docs/TPU.md.)
#
# Keys are regular expressions on `Variable.path` (`encoderblock_3/MlpBlock_3/Dense_1/kernel`,
# ...), optionally under any name scope: the paths are the layer names of the original checkpoints.

# Any name scope may precede the model's own paths (a model built inside another scope).
_SCOPE = r"(?:.*/)?"
#: The encoder blocks' path prefix (Axial-ViT passes its row and column blocks').
ENCODER_BLOCK = _SCOPE + r"encoderblock_\d+/"


def transformer_sharding_rules(m, block=ENCODER_BLOCK):
    """(group, regex, axes) of every ViT variable, with `m` the model axis name and `block` the
    regex of an encoder block's path prefix.

    `group` names the dimension a sharded rule needs divisible: the fallback replicates a whole
    group at once so that no sublayer is left half-split.
    """
    attention = block + r"MultiHeadDotProductAttention_1/"
    mlp = block + r"MlpBlock_3/"
    return [
        # Attention: split along heads (columns of q/k/v), rows of out.
        ("heads", attention + r"(?:query|key|value)_kernel", (None, m, None)),
        ("heads", attention + r"(?:query|key|value)_bias", (m, None)),
        ("heads", attention + r"out_kernel", (m, None, None)),
        (None, attention + r"out_bias", (None,)),
        # MLP: Dense_0 by columns, Dense_1 by rows.
        ("mlp_dim", mlp + r"Dense_0/kernel", (None, m)),
        ("mlp_dim", mlp + r"Dense_0/bias", (m,)),
        ("mlp_dim", mlp + r"Dense_1/kernel", (m, None)),
        (None, mlp + r"Dense_1/bias", (None,)),
        # Norms: replicated.
        (None, block + r"LayerNorm_[02]/(?:gamma|beta)", (None,)),
        (None, _SCOPE + r"encoder_norm/(?:gamma|beta)", (None,)),
        # Embeddings: split along hidden (the conv's output channels).
        ("hidden_size", _SCOPE + r"embedding/kernel", (None, None, None, m)),
        ("hidden_size", _SCOPE + r"embedding/bias", (m,)),
        ("hidden_size", _SCOPE + r"cls/cls", (None, None, m)),
        ("hidden_size", _SCOPE + r"posembed_input/pos_embedding", (None, None, m)),
        # Classifier: pre_logits by columns, head by rows.
        ("representation_size", _SCOPE + r"pre_logits/kernel", (None, m)),
        ("representation_size", _SCOPE + r"pre_logits/bias", (m,)),
        ("head_input", _SCOPE + r"head/kernel", (m, None)),
        (None, _SCOPE + r"head/bias", (None,)),
        # Hybrid BiT ResNet: replicated (see above).
        (None, _SCOPE + r"conv_root/kernel", (None, None, None, None)),
        (None, _SCOPE + r"gn_root/(?:scale|bias)", (None,)),
        (None, _SCOPE + r"block\d+/unit\d+/conv(?:1|2|3|_proj)/kernel", (None, None, None, None)),
        (None, _SCOPE + r"block\d+/unit\d+/gn(?:1|2|3|_proj)/(?:scale|bias)", (None,)),
    ]


def transformer_sharding_outputs(data_axis, block=ENCODER_BLOCK):
    """The two residual branches of every block (attention after its dropout layer, the MLP
    block): batch-split, whole on the model axis. This places the sublayers' all-reduce (the
    partial sums of the out / Dense_1 row splits) and keeps the residual stream data-parallel.
    Both are single (batch, tokens, hidden) tensors whatever the call's options."""
    return [(block + branch + "/output", (data_axis, None, None)) for branch in ("dropout", "MlpBlock_3")]


def transformer_sharding_dims(config):
    """The sizes the fallback rule checks: heads, mlp_dim, hidden, representation, head input."""
    missing = [k for k in ("hidden_size", "num_heads", "mlp_dim") if k not in config]
    if missing:
        raise ValueError(f"config lacks {missing}; pass a VisionTransformer config (model.get_config()).")
    hidden = int(config["hidden_size"])
    representation = config.get("representation_size")
    return {
        "heads": int(config["num_heads"]),
        "mlp_dim": int(config["mlp_dim"]),
        "hidden_size": hidden,
        "representation_size": None if representation is None else int(representation),
        "head_input": hidden if representation is None else int(representation),
    }


VIT_SHARDING = ShardingRules(
    rules=transformer_sharding_rules,
    dims=transformer_sharding_dims,
    groups={
        "heads": "attention (query/key/value/out kernels and biases)",
        "mlp_dim": "MLP (Dense_0 and Dense_1)",
        "hidden_size": "embeddings (embedding kernel/bias, class token, position embedding)",
        "representation_size": "pre_logits",
        "head_input": "head kernel",
    },
    outputs=transformer_sharding_outputs,
)


# === ViT (with the R+ViT hybrids) ===


# === Layer groups (layer-wise learning-rate decay) ===

#: Weights of the stem: timm's `group_matcher` stem (cls_token, reg_token, dist_token, pos_embed,
#: patch_embed with its norm and a hybrid's ResNet, norm_pre).
_STEM = re.compile(r"^(embedding|embedding_norm|cls|dist_token|reg_tokens|norm_pre|Transformer/posembed_input|"
                   r"conv_root|gn_root|block\d+/unit\d+)(/|$)")


#: RoPE-Mixed's rotary frequencies, stored per block here, are one parameter `rope.freqs` in timm,
#: which no group of its `group_matcher` names: timm's layer decay puts it in the last group.
_ROPE_FREQUENCIES = "/MultiHeadDotProductAttention_1/rope_frequencies"


def layer_groups(keys):
    """{canonical key: ordinal} as timm's VisionTransformer `group_matcher(coarse=False)` groups
    its parameters: the stem first, then encoder block i, the final norm with the last block
    (timm's `^norm` joins the previous group), then everything else (head, head_dist, fc_norm,
    a MAP head, pre_logits, and RoPE-Mixed's rotary frequencies, timm's `rope.freqs`) after the
    blocks.

    Example:
        >>> layer_groups(["cls", "Transformer/encoderblock_1/LayerNorm_0/scale", "head/bias"])
        {'cls': (0,), 'Transformer/encoderblock_1/LayerNorm_0/scale': (1, 1), 'head/bias': (2,)}
    """
    groups = stem_block_head_groups(keys, _STEM, _BLOCK, "Transformer/encoder_norm/")
    return {key: (2,) if key.endswith(_ROPE_FREQUENCIES) else group for key, group in groups.items()}


def _vit_describe(config):
    text = (f"hidden {config['hidden_size']}, {config['num_layers']} layers, {config['num_heads']} heads, "
            f"patch {config['patch_size']}")
    return text + (f", ResNet {tuple(config['resnet'][0])}" if config.get("resnet") else "")


def _patch_resize_refusal(config):
    """Why `load(patch_size=...)` cannot PI-resize this checkpoint's patch embedding, or None."""
    if config.get("resnet") is None:
        return None
    return ("is an R+ViT hybrid: its patch embedding reads ResNet features, not pixels. "
            "PI-resize keeps a token's response to a resized image patch, but the features of a resized image "
            "are not a resized copy of the features (the ResNet's stride and receptive field are fixed), so the "
            "resized kernel would not approximate the trained model. Change the image size instead (image_size=).")


def _vit_to_checkpoint(model_config):
    normalised = ViTConfig.from_dict(model_config)  # sizes as pairs, the ResNet as tuples
    config = {k: normalised[k] for k in ARCHITECTURE_FIELDS if k in model_config}
    if normalised.input_normalization is not None:  # the weights' own input (timm's zoo)
        config["input_normalization"] = normalised.input_normalization
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

Reference: {reference}. Hidden size {hidden_size}, {num_layers} layers, {num_heads} heads,
MLP {mlp_dim}, {stride}x{stride} input pixels per token.

Inputs are channels-last images {inputs} (see `keras_vit.preprocess_input`).

Args:
    include_top: whether to end in the classification head.
    weights: None (random initialisation), a preset tag ({tags}; see
        `keras_vit.list_presets("{name}")`), a local checkpoint path, or "hf://owner/repo".
        Default {default_weights!r}.
    input_tensor: optional Keras tensor to use as the image input.
    input_shape: (height, width, 3); default ({size}, {size}, 3). Any size that {stride} divides,
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
    >>> model = keras_vit.{name}(weights=None, input_shape=({size}, {size}, 3))
"""


_VIT_PAPER = ('"An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale"\n'
              "(Dosovitskiy et al., ICLR 2021)")


def _vit_doc_fields(row):
    variant = dict(row.variant)
    normalization = variant.get("input_normalization")
    if normalization is None:
        inputs = "scaled to [-1, 1]"
    else:
        inputs = f"normalised with mean {normalization[0]} and std {normalization[1]} (of [0, 1] pixels)"
    row_tags = list(dict.fromkeys(r[1] for r in VIT_PRESET_ROWS if r[0] == row.name))
    if row_tags:
        tags = ", ".join(repr(t) for t in row_tags[:4]) + (", ..." if len(row_tags) > 4 else "")
    else:
        tags = "none published"
    if row.default_weights == "imagenet" and row_tags:
        tags += '; aliases "imagenet" and "imagenet21k"'
    reference = _VIT_PAPER if row.reference is None else f"{row.reference}, timm's `{row.timm_name}`"
    return dict(hybrid=" (ViT on a BiT ResNet)" if row.resnet is not None else "", reference=reference,
                inputs=inputs, tags=tags, size=row.default_size[0])


def _positive_int(config, key, source, default=None):
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{source}: {key} is {str(value)[:40]!r}; expected a positive integer.")
    return value


def _vit_weights_lower_bound(config, source):
    """The fewest bytes the weights of a ViT `config` occupy: the encoder's matmuls, the position
    embedding, the patch embedding and the head at one byte per parameter (int8 kernels are the
    smallest stored form). Malformed sizes raise a CheckpointError."""
    hidden, layers, mlp, patch = (_positive_int(config, k, source)
                                  for k in ("hidden_size", "num_layers", "mlp_dim", "patch_size"))
    _positive_int(config, "num_heads", source)
    channels = _positive_int(config, "num_channels", source, default=3)
    try:
        size = positive_pair(config.get("image_size", 224))
    except ValueError:
        raise CheckpointError(f"{source}: image_size is {str(config.get('image_size'))[:40]!r}; expected a positive "
                              "int or [height, width].") from None
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
    flops=vit_flops,
    presets=VIT_PRESET_ROWS,
    head="head/",
    extra_heads=("head_dist/",),
    # fc_norm: a headless model that returns the token sequence has no norm after pooling (timm's
    # forward_features of a BEiT or GAP model does not normalise either).
    optional_weights=("head/", "head_dist/", "pre_logits/", "fc_norm/"),
    resizable_weights=("Transformer/posembed_input/", "embedding/kernel", "head/", "head_dist/"),
    features_pooling=None,
    patch_resize=True,
    source_grid=source_grid,
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
    sharding=VIT_SHARDING,
    patch_resize_refusal=_patch_resize_refusal,
    layer_groups=layer_groups,
    default_architecture="ViTB16",  # the paper's base model
    # timm's VisionTransformer.no_weight_decay(): pos_embed, cls_token, reg_token, dist_token; and
    # Eva's: rope.freqs of RoPE-Mixed (every block's rotary frequencies here)
    no_weight_decay=("cls", "reg_tokens", "dist_token", "Transformer/posembed_input/", _ROPE_FREQUENCIES),
    # dropout 0, the model's remat; position embeddings follow any input size
    transfer=Transfer(settings="keras_vit.models.transfer:dropout_free_settings",
                      options=("dropout_rate", "attention_dropout_rate", "patch_drop_rate", "remat")),
)
