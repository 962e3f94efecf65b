"""Named weights: the preset table (tag -> upstream Hub repository), `list_presets`,
`resolve_source` and the constructors' `weights=` argument.

Every published checkpoint of every constructor is one row of `_TABLE` below: the constructor,
timm's tag, the resolution, the head size, the ImageNet-1k top-1 its source reports (timm's
results-imagenet.csv; None where none is reported, e.g. for ImageNet-21k heads), the Hub
repository, and the original Flax .npz in the `gs://vit_models/` bucket it came from.

`weights=` and `load_checkpoint` accept:
- a tag of the constructor ("augreg_in21k_ft_in1k", "orig_in21k", ...; `list_presets("ViTB16")`);
- an alias: "imagenet" (the best ImageNet-1k fine-tuned weights published for the architecture,
  at the requested resolution when published there; "imagenet21k" where no fine-tuned ones
  exist) and "imagenet21k" (the ImageNet-21k pre-trained weights: AugReg's, with their trained
  21,843-class head, where published, else the original ones, which have no head);
- a preset name "<Constructor>.<tag>" (e.g. "ViTB16.augreg2_in21k_ft_in1k"), or a timm name
  "<timm_architecture>.<tag>" (e.g. "vit_base_patch16_384.augreg_in21k_ft_in1k");
- "hf://owner/repo[@revision]" or a local path.
Where a tag is published at several resolutions, the repository whose resolution is closest to
the requested input size is used (224 vs 384); position embeddings are resized for any other.
"""

import dataclasses
import difflib
import os
import warnings

from keras_vit import hub
from keras_vit.checkpoints.bit import TIMM_BIT_ROWS
from keras_vit.models.config import ARCHITECTURES, BIT_ARCHITECTURES, EXTRA_ARCHITECTURES


def _known(architecture):
    return architecture in ARCHITECTURES or architecture in EXTRA_ARCHITECTURES or architecture in BIT_ARCHITECTURES

_GS = "gs://vit_models/"


@dataclasses.dataclass(frozen=True)
class Preset:
    """One published checkpoint: `architecture` (constructor name) + `tag` at `resolution`."""

    architecture: str
    tag: str
    resolution: int
    classes: int  # 0: no classification head (features, or pre_logits only)
    top1: float  # ImageNet-1k top-1 (%) reported by the source; None when not reported
    repo: str  # Hub repository "owner/name"
    original: str = None  # the original Flax .npz this was converted from, if any
    revision: str = None  # a pinned revision (branch, tag or commit); None: main
    sha256: str = None  # sha256 of the weights file, where known
    weights_file: str = None  # the file `sha256` refers to (default: the largest weights file)
    source: str = "timm"  # "timm", "transformers", "keras" (the repository's layout)

    @property
    def name(self):
        return f"{self.architecture}.{self.tag}"

    @property
    def dataset(self):
        return "ImageNet-21k" if self.classes != 1000 else "ImageNet-1k"


# === The table ===
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

#: Every preset, in table order. Extend it with `register_preset`.
PRESETS = [
    Preset(a, t, r, c, top1, repo, _GS + orig if orig else None, source=source)
    for rows, source in ((_TIMM_ROWS, "timm"), (_TRANSFORMERS_ROWS, "transformers"))
    for a, t, r, c, top1, repo, orig in rows
] + [Preset(a, t, r, c, top1, repo, source="timm") for a, t, r, c, top1, repo in TIMM_BIT_ROWS]

#: The aliases every constructor accepts besides its tags.
ALIASES = ("imagenet", "imagenet21k")


def register_preset(architecture, tag, resolution, repo, *, classes, top1=None, **fields):
    """Add a row to the preset table (e.g. your own fine-tuned weights on the Hub).

    Example:
        >>> register_preset("ViTB16", "my_pets", 384, "me/vit-b16-pets", classes=37)  # doctest: +SKIP
        >>> model = keras_vit.ViTB16(weights="my_pets", input_shape=(384, 384, 3), classes=37)  # doctest: +SKIP
    """
    if not _known(architecture):
        raise ValueError(f"Unknown architecture {architecture!r}; known: {', '.join([*ARCHITECTURES, *BIT_ARCHITECTURES])}.")
    if tag in ALIASES:
        raise ValueError(f"{tag!r} is an alias ({', '.join(ALIASES)}); choose another tag.")
    preset = Preset(architecture, tag, int(resolution), int(classes), top1, repo, **fields)
    PRESETS[:] = [p for p in PRESETS if (p.architecture, p.tag, p.resolution) != (architecture, tag, preset.resolution)]
    PRESETS.append(preset)
    return preset


def list_presets(architecture=None):
    """The published weights, as `Preset` rows (architecture, tag, resolution, classes, top1, repo, ...).

    Args:
        architecture: a constructor name ("ViTB16") to list only its presets.

    Example:
        >>> [(p.tag, p.resolution) for p in list_presets("ViTL32")]
        [('orig_in21k_ft_in1k', 384), ('orig_in21k', 224), ('google_in21k_ft_in1k', 384), ('google_in21k', 224)]
    """
    if architecture is not None and not _known(architecture):
        known = [*ARCHITECTURES, *BIT_ARCHITECTURES]
        close = difflib.get_close_matches(str(architecture), known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"Unknown architecture {architecture!r}.{hint} Known: {', '.join(known)}.")
    return [p for p in PRESETS if architecture is None or p.architecture == architecture]


def tags(architecture):
    """The tags (without aliases) published for `architecture`, in table order."""
    return list(dict.fromkeys(p.tag for p in list_presets(architecture)))


# === Choosing a row ===


def _side(image_size):
    if image_size is None:
        return None
    if isinstance(image_size, int):
        return image_size
    return max(int(s) for s in image_size)


def _closest(rows, image_size):
    """The row whose resolution is nearest to `image_size` (None: prefer 224, the default input)."""
    side = _side(image_size) or 224
    return min(rows, key=lambda p: (abs(p.resolution - side), -p.resolution))


def _alias_rows(architecture, alias, image_size):
    rows = list_presets(architecture)
    in1k = [p for p in rows if p.classes == 1000 and "in1k" in p.tag]
    in21k = [p for p in rows if p.tag.endswith("in21k")]
    if alias == "imagenet" and in1k:
        side = _side(image_size) or 224
        at_size = [p for p in in1k if p.resolution == side] or in1k
        best = max(at_size, key=lambda p: (p.top1 or 0.0, p.source == "timm"))
        return [p for p in in1k if p.tag == best.tag]
    # "imagenet21k" (and "imagenet" where nothing was fine-tuned): AugReg's trained 21k head first.
    for tag in ("augreg_in21k", "orig_in21k", "google_in21k", "goog_in21k"):
        chosen = [p for p in in21k if p.tag == tag]
        if chosen:
            return chosen
    return []


def find_preset(architecture, weights, image_size=None):
    """The `Preset` row for `weights` (a tag or an alias) of `architecture` at `image_size`.

    Raises:
        ValueError for an unknown tag, naming the valid ones and the closest matches.
    """
    rows = _alias_rows(architecture, weights, image_size) if weights in ALIASES else [
        p for p in list_presets(architecture) if p.tag == weights
    ]
    if rows:
        return _closest(rows, image_size)
    valid = tags(architecture)
    if not valid:
        raise ValueError(
            f"No pretrained weights are published for {architecture}, so weights={weights!r} cannot be loaded. "
            "Pass weights=None for a randomly initialised model, or a local checkpoint path / 'hf://owner/repo'."
        )
    close = difflib.get_close_matches(str(weights), valid + list(ALIASES), n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"Unknown weights {weights!r} for {architecture}.{hint} Valid: None, {', '.join(ALIASES)}, "
        f"{', '.join(valid)}, a local checkpoint path or 'hf://owner/repo'. See keras_vit.list_presets({architecture!r})."
    )


def _preset_by_name(name, image_size):
    arch, _, tag = name.partition(".")
    if _known(arch):
        return find_preset(arch, tag, image_size)
    by_repo = [p for p in PRESETS if p.repo.split("/", 1)[-1] == name]
    if by_repo:
        return by_repo[0]
    return None


def _fetch(preset, what):
    return hub.fetch_preset(
        preset.repo,
        preset.revision,
        sha256=preset.sha256,
        weights_file=preset.weights_file,
        what=what,
        metadata={"preset": preset.name, "tag": preset.tag, "top1": preset.top1, "original": preset.original},
    )


# === Resolving sources ===


def resolve_source(source, *, image_size=None):
    """A local checkpoint path for `source`: itself if it exists; else the Keras preset folder that
    a preset name or "hf://owner/repo[@revision]" resolves to (downloaded through huggingface_hub,
    verified, converted once and cached; see keras_vit.hub).

    Args:
        source: a local path, "hf://owner/repo[@revision]", "<Constructor>.<tag>" (e.g.
            "ViTB16.imagenet") or "<timm_architecture>.<tag>".
        image_size: the resolution the model will run at: picks the 224 or 384 repository.

    Example:
        >>> path = resolve_source("ViTB16.augreg2_in21k_ft_in1k")  # doctest: +SKIP
    """
    source = os.fspath(source)
    if os.path.exists(source):
        return source
    if source.startswith("hf://"):
        repo, revision = hub.parse_hf_handle(source)
        return hub.fetch_preset(repo, revision, what=source)
    preset = _preset_by_name(source, image_size)
    if preset is None:
        names = [p.name for p in PRESETS] + [p.repo.split("/", 1)[-1] for p in PRESETS]
        close = difflib.get_close_matches(source, names, n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"{source!r} is neither an existing path, nor 'hf://owner/repo', nor a preset name.{hint} "
            "Preset names are '<Constructor>.<tag>' (e.g. 'ViTB16.augreg2_in21k_ft_in1k', 'ViTB16.imagenet') or "
            "timm names ('vit_base_patch16_224.augreg2_in21k_ft_in1k'); see keras_vit.list_presets()."
        )
    return _fetch(preset, what=source)


# === weights= of the constructors ===

_ARCH_FIELDS = ("patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim", "classifier", "resnet")
_MODEL_ARGS = ("image_size", "include_top", "classes", "pooling", "classifier_activation")
_BIT_ARCH_FIELDS = ("block_units", "width_factor")


def _describe(config):
    text = f"hidden {config['hidden_size']}, {config['num_layers']} layers, {config['num_heads']} heads, patch {config['patch_size']}"
    return text + (f", ResNet {tuple(config['resnet'][0])}" if config.get("resnet") else "")


def _check_bit_architecture(architecture, config, weights):
    expected = (tuple(architecture.block_units), architecture.width_factor)
    got = (tuple(config.get("block_units") or ()), config.get("width_factor"))
    if "block_units" not in config or got != expected:
        held = f"BiT ResNet {got[0]} x{got[1]}" if "block_units" in config else "a Vision Transformer"
        raise ValueError(
            f"weights={weights!r} hold {held}, not {architecture.name} (units {expected[0]}, width x{expected[1]}). "
            "Use the matching constructor, or keras_vit.load_checkpoint(), which builds whatever architecture the "
            "checkpoint holds."
        )


def _check_architecture(architecture, config, weights):
    if architecture.name in BIT_ARCHITECTURES:
        return _check_bit_architecture(architecture, config, weights)
    if "block_units" in config:
        raise ValueError(
            f"weights={weights!r} hold a BiT ResNet, not {architecture.name}. Use the matching BiTResNet constructor, "
            "or keras_vit.load_checkpoint()."
        )
    expected = architecture.kwargs()
    expected.setdefault("resnet", None)
    got = {k: config.get(k) for k in _ARCH_FIELDS}
    if got.get("resnet") is not None:
        got["resnet"] = (tuple(got["resnet"][0]), got["resnet"][1])
    if expected.get("resnet") is not None:
        expected["resnet"] = (tuple(expected["resnet"][0]), expected["resnet"][1])
    if any(got[k] != expected[k] for k in _ARCH_FIELDS):
        raise ValueError(
            f"weights={weights!r} hold a different architecture ({_describe(got)}) than {architecture.name} "
            f"({_describe(expected)}). Use the matching constructor, or keras_vit.load_checkpoint(), which builds "
            "whatever architecture the checkpoint holds."
        )


def build_with_weights(architecture, weights, kwargs):
    """Build `architecture` (a models.config.Architecture) with VisionTransformer `kwargs` and load
    `weights` (a tag, an alias, a local path or "hf://owner/repo") into it.

    Head semantics (as keras.applications, plus fine-tuning):
    - include_top=False: the head is dropped (`pooling` as usual).
    - include_top=True and `classes` equal to the checkpoint's: the trained head is kept.
    - include_top=True and another `classes` (or a checkpoint without a head, e.g. "orig_in21k"):
      a fresh zero-initialised head (the original fine-tuning recipe) is attached; when that
      discards a trained head (e.g. the 21,843-class "augreg_in21k" head with the default
      classes=1000), a warning says so: pass classes=21843 to keep it.
    The numerics (LayerNorm epsilon, GELU, ...) and `pre_logits` come from the checkpoint; the
    position embeddings are resized to `input_shape` with the checkpoint's own rule.

    Raises:
        ValueError (unknown tag, other architecture), keras_vit.hub.HubError (not found, offline,
        corrupt download), WeightTreeError / CheckpointError (unreadable or mismatched file).
    """
    from keras_vit import checkpoints

    weights = os.fspath(weights)
    image_size = kwargs.get("image_size")
    if os.path.exists(weights):
        path = weights
    elif weights.startswith("hf://"):
        path = resolve_source(weights, image_size=image_size)
    elif os.sep in weights or weights.endswith((".npz", ".keras", ".h5", ".safetensors")):
        raise FileNotFoundError(
            f"weights={weights!r} looks like a path, but nothing exists there. Pass an existing checkpoint file or "
            f"folder, a tag (keras_vit.list_presets({architecture.name!r})), 'hf://owner/repo', or weights=None."
        )
    else:
        preset = find_preset(architecture.name, weights, image_size)
        if weights == "imagenet" and preset.classes != 1000:
            warnings.warn(
                f"No ImageNet-1k fine-tuned weights are published for {architecture.name}; weights='imagenet' loads "
                f"{preset.tag!r} (pre-trained on ImageNet-21k) instead.",
                stacklevel=4,
            )
        path = _fetch(preset, what=f"weights={weights!r} of {architecture.name}")
    tree, config = checkpoints.read_checkpoint(path)
    _check_architecture(architecture, config, weights)
    ckpt_classes = config.get("classes")
    classes = kwargs.get("classes")
    if kwargs.get("include_top", True) and ckpt_classes and classes != ckpt_classes:
        warnings.warn(
            f"weights={weights!r} have a trained {ckpt_classes}-class head; classes={classes} attaches a fresh "
            f"zero-initialised {classes}-class head instead (to be fine-tuned). Pass classes={ckpt_classes} to keep "
            "the trained head.",
            stacklevel=4,
        )
    overrides = {
        k: v for k, v in kwargs.items() if k not in _MODEL_ARGS and k not in _ARCH_FIELDS + _BIT_ARCH_FIELDS
    }
    return checkpoints.build_model(tree, config, **{k: kwargs.get(k) for k in _MODEL_ARGS}, **overrides)
