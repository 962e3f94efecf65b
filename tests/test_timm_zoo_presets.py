"""The named presets and constructors of timm's ViT zoo (DINOv2, CLIP, SigLIP, DeiT, DeiT III, MAE,
BEiT, BEiT v2, EVA-02) against timm itself: each preset row against timm's live pretrained_cfg (resolution, head size,
mean/std, licence, Hub repository), each constructor's parameter count against timm's model built
on PyTorch's meta device, FLOPs against torch's flop counter, and the licence column of
`keras-vit presets`."""

import dataclasses
import importlib.util
import inspect
import json

import keras
import pytest
from conftest import run_script

import keras_vit
from keras_vit import presets
from keras_vit.cli import main
from keras_vit.models.family import get_architecture
from keras_vit.models.vit_family import ZOO_ARCHITECTURES

pytestmark = pytest.mark.backend_independent


def _need_timm():
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")


# timm's own registry, read in the test process (conftest imports timm before TensorFlow).
_TIMM_CFGS = """
import json, sys
import timm
out = {}
for name in json.loads(sys.argv[1]):
    cfg = timm.models.get_pretrained_cfg(name)
    out[name] = dict(hf_hub_id=cfg.hf_hub_id, input_size=list(cfg.input_size), num_classes=cfg.num_classes,
                     mean=list(cfg.mean), std=list(cfg.std), license=cfg.license,
                     architecture=cfg.architecture)
print(json.dumps(out))
"""

ZOO_PRESETS = [p for p in presets.PRESETS.values() if p.timm_name is not None]


def test_the_checkpoints_people_reach_for_are_presets():
    names = {p.name for p in ZOO_PRESETS}
    for arch in ("DINOv2S14", "DINOv2B14", "DINOv2L14", "DINOv2G14"):
        assert f"{arch}.lvd142m" in names and f"{arch}Reg4.lvd142m" in names
    assert {"CLIPB16.laion2b", "CLIPB16QuickGELU.openai", "CLIPL14.laion2b", "CLIPL14QuickGELU.openai",
            "SigLIPB16.webli", "SigLIPSo400m14.webli", "DeiT3B16.fb_in22k_ft_in1k", "DeiT3B16.fb_in1k",
            "ViTB16.mae", "DeiTS16Distilled.fb_in1k", "DeiTB16Distilled.fb_in1k"} <= names


def test_zoo_presets_are_timms_pretrained_cfgs():
    _need_timm()
    cfgs = json.loads(run_script(_TIMM_CFGS, json.dumps([p.timm_name for p in ZOO_PRESETS])).strip().splitlines()[-1])
    for p in ZOO_PRESETS:
        cfg = cfgs[p.timm_name]
        assert p.repo == cfg["hf_hub_id"].rstrip("/"), p.name
        assert p.resolution == cfg["input_size"][-1], p.name
        assert p.classes == cfg["num_classes"], p.name
        assert (list(p.mean), list(p.std)) == (cfg["mean"], cfg["std"]), p.name
        assert p.license == cfg["license"], p.name
        # The constructor is the architecture timm builds the tag with (at another resolution where
        # the tag's name says so: deit_base_patch16_384 for DeiTB16's 384 row).
        row = get_architecture(p.architecture)
        timm_architecture = p.timm_name.split(".")[0]
        assert timm_architecture.rsplit("_", 1)[0] == row.timm_name.rsplit("_", 1)[0] or (
            timm_architecture == row.timm_name), p.name
    # The licences in the table (one non-commercial, the rest open).
    assert presets.preset_by_name("ViTB16.mae").license == "cc-by-nc-4.0"
    assert presets.preset_by_name("ViTB16.mae").non_commercial
    assert not presets.preset_by_name("DINOv2S14.lvd142m").non_commercial
    # Every preset of the original ViTs carries its licence too.
    assert presets.preset_by_name("ViTB16.augreg2_in21k_ft_in1k").license == "apache-2.0"


def test_every_timm_preset_has_timms_licence():
    # The presets of every family that timm publishes (ViTs, R+ViT hybrids, BiT, EfficientNet),
    # against the licence of timm's own pretrained_cfg of each repository's tag.
    _need_timm()
    rows = [p for p in presets.PRESETS.values() if p.repo.startswith("timm/")]
    assert {p.architecture[:3] for p in rows} >= {"ViT", "R50", "BiT", "Eff"}
    names = sorted({p.repo.split("/", 1)[1] for p in rows})
    cfgs = json.loads(run_script(_TIMM_CFGS, json.dumps(names)).strip().splitlines()[-1])
    for p in rows:
        assert p.license == cfgs[p.repo.split("/", 1)[1]]["license"], p.name
    # Every preset names its licence; `keras-vit presets` shows no "-".
    assert all(p.license for p in presets.PRESETS.values())


def test_normalisation_travels_with_each_preset():
    dinov2 = presets.preset_by_name("DINOv2S14.lvd142m")
    assert dinov2.normalization == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    assert presets.preset_by_name("CLIPB16.laion2b").normalization == (
        (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
    assert presets.preset_by_name("SigLIPB16.webli").normalization is None  # 0.5 / 0.5: [-1, 1]
    # The constructor built without weights normalises as its weights do.
    with keras.StatelessScope(initialize_variables=False):
        model = keras_vit.DINOv2S14(weights=None, input_shape=(28, 28, 3))
    assert model.config.input_normalization == dinov2.normalization
    keras.utils.clear_session()


def test_quickgelu_clip_reads_the_gelu_repository_as_timm_builds_it():
    # timm builds vit_base_patch16_clip_quickgelu_224.openai from the GELU model's repository: the
    # preset states the activation its config.json does not.
    p = presets.preset_by_name("vit_base_patch16_clip_quickgelu_224.openai")
    assert p.name == "CLIPB16QuickGELU.openai" and p.repo == "timm/vit_base_patch16_clip_224.openai"
    assert dict(p.config) == {"mlp_activation": "quick_gelu"}


def test_constructors_default_to_their_weights_and_name_them():
    assert inspect.signature(keras_vit.DINOv2S14).parameters["weights"].default == "lvd142m"
    assert inspect.signature(keras_vit.SigLIPB16).parameters["weights"].default == "webli"
    assert inspect.signature(keras_vit.ViTB16).parameters["weights"].default == "imagenet"
    doc = keras_vit.DINOv2S14Reg4.__doc__
    assert "vit_small_patch14_reg4_dinov2" in doc and "(518, 518, 3)" in doc and "0.485" in doc
    with pytest.raises(ValueError, match="No ImageNet.*lvd142m"):
        keras_vit.DINOv2S14(weights="imagenet")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZOO_ARCHITECTURES))
def test_constructor_parameter_counts_equal_timms(name):
    # timm's model on the meta device (shapes only); keras_vit's without initialising variables.
    _need_timm()
    import torch
    import timm

    row = ZOO_ARCHITECTURES[name]
    with torch.device("meta"):
        reference = timm.create_model(row.timm_name, pretrained=False, num_classes=1000)
    with keras.StatelessScope(initialize_variables=False):
        model = getattr(keras_vit, name)(weights=None)
    assert model.input_shape == (None, *row.default_size, 3)
    assert model.count_params() == sum(p.numel() for p in reference.parameters())
    keras.utils.clear_session()


# timm's models under torch's flop counter, on the meta device, at small sizes.
_TIMM_FLOPS = """
import json
import torch, timm
from timm.layers import config
from torch.utils.flop_counter import FlopCounterMode
out, fused = {}, config._USE_FUSED_ATTN
config.set_fused_attn(False)  # explicit attention matmuls, which the counter sees
try:
    for ours, name, size, depth in [("DINOv2S14Reg4", "vit_small_patch14_reg4_dinov2", 56, 12),
                                    ("DINOv2G14", "vit_giant_patch14_dinov2", 28, 2),
                                    ("DeiTS16Distilled", "deit_small_distilled_patch16_224", 64, 12),
                                    ("SigLIPB16", "vit_base_patch16_siglip_224", 64, 12),
                                    ("CLIPB16", "vit_base_patch16_clip_224", 64, 12)]:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, img_size=size, num_classes=1000, depth=depth).eval()
            model.requires_grad_(False)
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                model(torch.zeros(1, 3, size, size))
        out[ours] = [size, depth, counter.get_total_flops()]
finally:
    config._USE_FUSED_ATTN = fused
print(json.dumps(out))
"""


def test_flops_count_registers_distillation_and_gated_mlps_as_torch_does():
    _need_timm()
    counted = json.loads(run_script(_TIMM_FLOPS).strip().splitlines()[-1])
    for name, (size, depth, reference) in counted.items():
        row = dataclasses.replace(ZOO_ARCHITECTURES[name], num_layers=depth)  # DINOv2-g: 2 of its 40 blocks
        assert keras_vit.flops(row, size) == reference, name


def test_presets_command_shows_licence_and_input(capsys):
    assert main(["presets", "ViTB16"]) == 0
    out = capsys.readouterr().out
    assert "LICENSE" in out and "INPUT" in out
    mae = next(ln for ln in out.splitlines() if " mae " in ln)
    assert "cc-by-nc-4.0 (non-commercial)" in mae and "imagenet" in mae and "timm/vit_base_patch16_224.mae" in mae
    augreg = next(ln for ln in out.splitlines() if "augreg2_in21k_ft_in1k" in ln)
    assert "apache-2.0" in augreg and "[-1,1]" in augreg and "non-commercial" not in augreg
    assert main(["presets", "CLIPL14"]) == 0
    out = capsys.readouterr().out
    laion = next(ln for ln in out.splitlines() if " laion2b " in ln)
    assert "[-1,1]" in laion  # open_clip's LAION-2B L/14 takes [-1, 1] inputs (timm's cfg), not CLIP's mean/std
    assert main(["presets", "DINOv2G14Reg4", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["resolution"], row["license"], row["mean"]) == (518, "apache-2.0", [0.485, 0.456, 0.406])
