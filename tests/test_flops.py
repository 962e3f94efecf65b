"""Forward FLOPs and pre-training exaFLOPs (keras_vit.flops) against the paper's Table 6 and against
an independent count: timm's models run under torch.utils.flop_counter.FlopCounterMode."""

import importlib.util
import json
import os
import re

import pytest
from conftest import run_script

import keras_vit
from keras_vit.models.bit_family import BIT_ARCHITECTURES
from keras_vit.models.vit_family import ARCHITECTURES

pytestmark = pytest.mark.backend_independent

# The paper's Table 6 (v2): pre-training on JFT-300M (303M images) at 224 px, in exaFLOPs.
TABLE_6 = [
    ("BiTResNet50x1", 7, 50),
    ("ViTB32", 7, 55),
    ("R50ViTB32", 7, 106),
    ("ViTB16", 7, 224),
    ("BiTResNet152x2", 7, 563),
    ("ViTL16", 14, 1567),
    ("R50ViTL16", 14, 1668),
    ("BiTResNet200x3", 14, 3306),
    ("ViTH14", 14, 4262),
]


# The README's names of those rows.
README_NAMES = {"BiTResNet50x1": "ResNet-50x1", "ViTB32": "ViT-B/32", "R50ViTB32": "R50+ViT-B/32",
                "ViTB16": "ViT-B/16", "BiTResNet152x2": "ResNet-152x2", "ViTL16": "ViT-L/16",
                "R50ViTL16": "R50+ViT-L/16", "BiTResNet200x3": "ResNet-200x3", "ViTH14": "ViT-H/14"}


def _readme_table_6():
    """The README's Table 6 rows: name -> (epochs, paper, ours, difference) as printed."""
    readme = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
    with open(readme, encoding="utf-8") as f:
        rows = re.findall(r"^\| ([^|]+?) \| (\d+) \| ([\d,]+) \| ([\d,]+) \| ([+-]\d+\.\d%) \|$", f.read(), re.M)
    return {name: (int(epochs), int(paper.replace(",", "")), int(ours.replace(",", "")), difference)
            for name, epochs, paper, ours, difference in rows}


@pytest.mark.parametrize("name,epochs,exaflops", TABLE_6, ids=[r[0] for r in TABLE_6])
def test_table_6_rows_are_the_readme_figures(name, epochs, exaflops):
    # The README prints each row's exaFLOPs (rounded) and its difference from the paper's (0.1%).
    printed = _readme_table_6()[README_NAMES[name]]
    ours = keras_vit.pretraining_exaflops(name, epochs)
    assert printed[:2] == (epochs, exaflops)
    assert printed[2:] == (round(ours), f"{100 * (ours / exaflops - 1):+.1f}%")


def test_the_convention_by_hand():
    # ViT-B/16 at 224: 197 tokens, 12 layers; 2 FLOPs per multiply-add, head 768 x 1000.
    t, d, m = 197, 768, 3072
    layer = 2 * (4 * t * d * d + 2 * t * t * d + 2 * t * d * m)
    expected = 12 * layer + 2 * 196 * 16 * 16 * 3 * d + 2 * d * 1000
    assert keras_vit.flops("ViTB16") == expected
    assert keras_vit.pretraining_exaflops("ViTB16", 7) == pytest.approx(3 * expected * 303e6 * 7 / 1e18)
    # Larger images: more tokens, the same weights; no head without include_top.
    assert keras_vit.flops("ViTB16", 384) > 3 * keras_vit.flops("ViTB16")
    model = keras_vit.ViTTi16(weights=None, include_top=False, input_shape=(64, 64, 3))
    assert keras_vit.flops(model) == keras_vit.flops("ViTTi16", 64, classes=0)
    # Its config object (what the readers return) counts as the model does; a dict is refused.
    assert keras_vit.flops(model.config) == keras_vit.flops(model)
    assert keras_vit.flops(keras_vit.ViTTi16(weights=None, input_shape=(64, 64, 3), classes=7).config) == (
        keras_vit.flops("ViTTi16", 64, classes=7))
    with pytest.raises(TypeError, match="its config object"):
        keras_vit.flops(dict(model.config))
    with pytest.raises(ValueError, match="stride"):
        keras_vit.flops("ViTB16", 200)
    with pytest.raises(TypeError, match="constructor name"):
        keras_vit.flops(3.5)


# timm's definitions of the same computations, at 64 px so that the forward passes are cheap.
_TIMM = """
import json
import torch, timm
from timm.layers import config
from torch.utils.flop_counter import FlopCounterMode
out, fused = {}, config._USE_FUSED_ATTN
config.set_fused_attn(False)  # explicit q @ k^T and attn @ v matmuls, which the counter sees
try:
    for ours, name, kwargs in [("ViTTi16", "vit_tiny_patch16_224", {"img_size": 64}),
                               ("ViTS32", "vit_small_patch32_224", {"img_size": 64}),
                               ("RViTTi16", "vit_tiny_r_s16_p8_224", {"img_size": 64}),
                               ("R26ViTS32", "vit_small_r26_s32_224", {"img_size": 64}),
                               ("BiTResNet50x1", "resnetv2_50x1_bit", {})]:
        with torch.device("meta"):  # shapes only: the counter needs no values
            model = timm.create_model(name, pretrained=False, **kwargs).eval()
            if hasattr(model, "blocks"):  # the setting reached the attention layers
                assert not model.blocks[0].attn.fused_attn
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                model(torch.zeros(1, 3, 64, 64))
        out[ours] = counter.get_total_flops()
finally:
    config._USE_FUSED_ATTN = fused  # timm's setting of this process, as it was
print(json.dumps(out))
"""


def test_agrees_with_torch_flop_counter_on_timm_models():
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    counted = json.loads(run_script(_TIMM).strip().splitlines()[-1])  # in the test process
    for name, reference in counted.items():
        # Both count 2 FLOPs per multiply-add of every matmul and convolution: they agree exactly.
        assert keras_vit.flops(name, 64) == reference, name


def test_every_constructor_has_a_count():
    for name in [*ARCHITECTURES, *BIT_ARCHITECTURES]:
        assert keras_vit.flops(name) > 5e8


def test_map_head_and_relative_logits_are_counted():
    # A tiny ViT at 32 px: 16 patch tokens (patch 8), width 24, MLP 48, 2 layers, 7 classes.
    tiny = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=48, classes=7)
    t, d, m = 16, 24, 48
    embedding = 2 * t * 8 * 8 * 3 * d
    block = 2 * (4 * t * d * d + 2 * t * t * d + 2 * t * d * m)
    gap = keras_vit.VisionTransformer(**tiny, classifier="gap")
    assert keras_vit.flops(gap) == embedding + 2 * block + 2 * d * 7
    # big_vision's MAP head: one probe token's query and out projections, the keys and values of
    # all 16 tokens, the probe's logits over them and its weighted sum, then an MLP on the probe.
    probe = 2 * d * d + 2 * 2 * t * d * d + 2 * t * d + 2 * t * d + 2 * d * d + 2 * 2 * d * m
    map_model = keras_vit.VisionTransformer(**tiny, classifier="map")
    assert keras_vit.flops(map_model) == embedding + 2 * block + probe + 2 * d * 7
    # Headless without pooling: no read-out runs, the MAP head is not built.
    assert keras_vit.flops(keras_vit.VisionTransformer(**tiny, classifier="map", include_top=False)) == embedding + 2 * block
    # Relative attention (class token: 17 tokens): each query's logits against the 2 * 17 - 1
    # offset embeddings, in every layer.
    t = 17
    block = 2 * (4 * t * d * d + 2 * t * t * d + 2 * t * d * m)
    relative = keras_vit.VisionTransformer(**tiny, position_embedding="relative")
    assert keras_vit.flops(relative) == embedding + 2 * (block + 2 * t * (2 * t - 1) * d) + 2 * d * 7


@pytest.mark.parametrize("size", [0, -224, (224, -224), (224, 0), 2.5, "224", (224,), True])
def test_sizes_that_are_not_images_are_refused(size):
    with pytest.raises(ValueError, match="positive int"):
        keras_vit.flops("ViTB16", size)
