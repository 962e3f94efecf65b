"""The preset table against timm's own registry, alias choice, and tag errors (no network)."""

import importlib.util
import json
import os

import pytest
from conftest import run_script

pytestmark = pytest.mark.backend_independent

import keras_vit
from keras_vit import loading, presets
from keras_vit.models.bit_family import BIT_ARCHITECTURES
from keras_vit.models.vit_family import ARCHITECTURES
from keras_vit.models.family import all_architectures

#: The timm tags of the original family that keras_vit publishes.
TIMM_TAGS = [
    "augreg_in21k", "augreg_in21k_ft_in1k", "augreg2_in21k_ft_in1k", "orig_in21k", "orig_in21k_ft_in1k",
    "augreg_in1k", "sam_in1k",
]

# timm's registry, read in the test process (conftest imports timm before TensorFlow; conftest.run_script).
_TIMM_REGISTRY = """
import json, sys, timm
from timm.models import get_pretrained_cfg
out = []
for name in timm.list_pretrained("vit_*"):
    cfg = get_pretrained_cfg(name)
    out.append([name, cfg.hf_hub_id, cfg.num_classes])
print(json.dumps(out))
"""


def _timm_pretrained():
    """{(keras_vit constructor, tag, resolution): (hub repo, classes)} from timm's own default_cfgs."""
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    out = run_script(_TIMM_REGISTRY)
    by_base = {a.timm_name[: -len("_224")]: a.name for a in ARCHITECTURES.values() if a.timm_name}
    result = {}
    for name, hf_hub_id, classes in json.loads(out.strip().splitlines()[-1]):
        arch, tag = name.split(".", 1)
        base, _, res = arch.rpartition("_")
        if base in by_base and tag in TIMM_TAGS and res in ("224", "384"):
            hub_id = hf_hub_id if hf_hub_id and "/" in hf_hub_id.rstrip("/") else f"timm/{name}"
            result[(by_base[base], tag, int(res))] = (hub_id, classes)
    return result


def test_every_timm_checkpoint_of_every_constructor_is_in_the_table():
    expected = _timm_pretrained()
    ours = {
        (p.architecture, p.tag, p.resolution): (p.repo, p.classes)
        for p in presets.PRESETS.values()
        # BiT rows: tests/test_bit.py; timm's zoo rows (DINOv2, CLIP, MAE, ...): tests/test_timm_zoo_presets.py
        if p.source == "timm" and p.architecture in ARCHITECTURES and p.tag in TIMM_TAGS
    }
    assert len(expected) > 40
    assert ours == expected


def test_table_rows_are_consistent():
    names = [(p.architecture, p.tag, p.resolution) for p in presets.PRESETS.values()]
    assert len(names) == len(set(names))
    for p in presets.PRESETS.values():
        if p.timm_name is not None:  # timm's zoo rows: tests/test_timm_zoo_presets.py
            continue
        family = keras_vit.family_of(p.architecture).name
        assert family in ("vit", "bit", "efficientnet"), p
        if family == "efficientnet":  # at the resolution it was trained at (L2 also at 475 px)
            assert p.resolution in (all_architectures()[p.architecture].resolution, 475), p
        else:
            assert p.resolution in ((224, 384) if family == "vit" else (224, 384, 448, 480)), p
        assert p.classes in (0, 1000, 21843)
        assert (p.top1 is not None) == (p.source == "timm" and p.classes == 1000)
        if p.original:
            assert p.original.startswith("gs://vit_models/") and p.original.endswith(".npz")
        if p.source == "transformers":
            assert p.repo.startswith("google/vit-")


def test_imagenet_alias_is_the_best_in1k_weights_at_the_requested_size():
    assert presets.find_preset("ViTB16", "imagenet").name == "ViTB16.augreg2_in21k_ft_in1k"
    at384 = presets.find_preset("ViTB16", "imagenet", (384, 384))
    assert (at384.tag, at384.resolution) == ("augreg_in21k_ft_in1k", 384)
    assert presets.find_preset("ViTL16", "imagenet", 384).top1 == 87.084
    # Only a 384 fine-tune exists for L/32: used (and resized) at 224.
    assert (presets.find_preset("ViTL32", "imagenet", 224).resolution) == 384
    # No fine-tuned H/14: "imagenet" falls back to the ImageNet-21k weights.
    assert presets.find_preset("ViTH14", "imagenet").tag == "orig_in21k"
    for arch in ARCHITECTURES:
        rows = presets.list_presets(arch)
        in1k = [p for p in rows if p.classes == 1000 and p.top1]
        if in1k:
            best = presets.find_preset(arch, "imagenet", 224)
            same_size = [p for p in in1k if p.resolution == 224] or in1k
            assert best.top1 == max(p.top1 for p in same_size)


def test_imagenet21k_alias_prefers_the_trained_21k_head():
    assert presets.find_preset("ViTB16", "imagenet21k").tag == "augreg_in21k"
    assert presets.find_preset("ViTB16", "imagenet21k").classes == 21843
    assert presets.find_preset("ViTL32", "imagenet21k").tag == "orig_in21k"


def test_closest_resolution_is_chosen():
    assert presets.find_preset("ViTS16", "augreg_in21k_ft_in1k", 224).resolution == 224
    assert presets.find_preset("ViTS16", "augreg_in21k_ft_in1k", (384, 384)).resolution == 384
    assert presets.find_preset("ViTS16", "augreg_in21k_ft_in1k", (448, 448)).resolution == 384
    assert presets.find_preset("ViTS16", "augreg_in21k_ft_in1k", 256).resolution == 224


def test_unknown_tag_lists_valid_tags_and_suggestions():
    with pytest.raises(ValueError) as info:
        keras_vit.ViTB16(weights="augreg_in21k_ft_in1")
    message = str(info.value)
    assert "Did you mean 'augreg_in21k_ft_in1k'" in message
    for tag in ("augreg2_in21k_ft_in1k", "orig_in21k", "sam_in1k", "imagenet", "imagenet21k"):
        assert tag in message
    assert "list_presets('ViTB16')" in message


def test_architecture_without_published_weights_says_so():
    with pytest.raises(ValueError, match="No pretrained weights are published for R50ViTB32.*weights=None"):
        keras_vit.R50ViTB32(weights="imagenet")


def test_list_presets_and_resolve_errors():
    assert {p.architecture for p in keras_vit.list_presets()} >= {"ViTB16", "ViTH14", "R50ViTL32"}
    assert all(p.architecture == "ViTS32" for p in keras_vit.list_presets("ViTS32"))
    with pytest.raises(ValueError, match="Did you mean ViTB16"):
        keras_vit.list_presets("ViTB61")
    with pytest.raises(ValueError, match="neither an existing path"):
        loading.resolve("vit_base_patch16_224.augreg2_in21k_ft_in1")
    with pytest.raises(ValueError, match="not a Hub handle"):
        loading.resolve("hf://not a repo")


def test_local_paths_resolve_to_themselves(tmp_path):
    keras_vit.write_npz(keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=8, num_layers=1,
                                                    num_heads=2, mlp_dim=8, classes=2), tmp_path / "m.npz")
    resolved = loading.resolve(str(tmp_path / "m.npz"))
    assert resolved.path == str(tmp_path / "m.npz") and resolved.format.name == "npz" and resolved.preset is None


def test_weights_manifest_lists_every_preset():
    path = os.path.join(os.path.dirname(__file__), "..", "weights", "manifest.json")
    with open(path) as f:
        manifest = json.load(f)
    rows = {(m["architecture"], m["tag"], m["resolution"]): m for m in manifest["checkpoints"]}
    assert len(rows) == len(presets.PRESETS)
    for p in presets.PRESETS.values():
        m = rows[(p.architecture, p.tag, p.resolution)]
        assert (m["repo"], m["classes"], m["top1"], m["original"], m["license"]) == (
            p.repo, p.classes, p.top1, p.original, p.license)


def test_missing_local_path_is_reported_as_a_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="No checkpoint at .*missing.npz.*weights=None"):
        keras_vit.ViTTi16(weights=str(tmp_path / "missing.npz"))
