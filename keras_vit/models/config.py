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
        out = dict(
            patch_size=self.patch_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            classifier=self.classifier,
        )
        if self.resnet is not None:
            out["resnet"] = self.resnet
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
        Architecture("R26ViTB32", "R26+ViT-B/32", patch_size=1, resnet=((2, 2, 2, 2), 1), **_B),
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
    """The Architecture (or BiTArchitecture) row called `name` (constructor name, e.g. "ViTB16")."""
    table = {**ARCHITECTURES, **EXTRA_ARCHITECTURES, **BIT_ARCHITECTURES}
    if name not in table:
        import difflib

        close = difflib.get_close_matches(name, list(table), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"Unknown architecture {name!r}.{hint} Known: {', '.join(table)}.")
    return table[name]
