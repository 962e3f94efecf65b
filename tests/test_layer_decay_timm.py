"""Layer-wise learning-rate decay scales against timm's `param_groups_layer_decay`, variable by
variable.

A timm model (random weights) is saved as timm saves a Hub repo and read back through
`keras_vit.load_checkpoint`; each keras_vit variable's scale (`training.layer_decay_scales`) must
equal the `lr_scale` timm's parameter groups give the timm parameter it was read from (a qkv
matrix feeds query, key and value; a hybrid's ResNet stem feeds conv_root, gn_root and the
units). The mapping from canonical keys to timm names is written here, from timm's module
names. ViT-B/16 (a head: the head is a group of its own) and DINOv2-S/14 at 518 px (no head: the
final norm and the last block are the last group) at full size; tiny models for the distillation
token, registers, norm_pre, fc_norm, a MAP head, a hybrid stem and RoPE-Mixed's learned rotary
frequencies (Eva's `rope.freqs`, in the last group).

timm's weight-decay rule (`param_groups_weight_decay` with the model's `no_weight_decay()`)
against `training.timm_weight_decay`: timm's decayed parameters are saved as ones, the others as
zeros, and read through the timm reader, so the canonical tree itself maps the names.
"""

import re
import sys

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from keras_vit.models.weight_tree import weight_variables
from tests.conftest import TINY

sys.modules.setdefault("triton", None)
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
from timm.models._hub import save_for_hf  # noqa: E402
from timm.optim._param_groups import param_groups_layer_decay, param_groups_weight_decay  # noqa: E402

from tests.test_timm_zoo import _load  # noqa: E402  (load as keras_vit: with its head, else pooled as timm)

pytestmark = pytest.mark.backend_independent

# canonical key prefix -> timm parameter (or module prefix ending in "."), first match wins
_TIMM_NAMES = [
    (r"^embedding/", "patch_embed.proj."),
    (r"^embedding_norm/", "patch_embed.norm."),
    (r"^cls$", "cls_token"),
    (r"^dist_token$", "dist_token"),
    (r"^reg_tokens$", "reg_token"),
    (r"^Transformer/posembed_input/pos_embedding$", "pos_embed"),
    (r"^norm_pre/", "norm_pre."),
    (r"^(conv_root|gn_root)/", "patch_embed.backbone."),
    (r"^block(\d+)/unit(\d+)/", lambda m: f"patch_embed.backbone.stages.{int(m[1]) - 1}.blocks.{int(m[2]) - 1}."),
    (r"^Transformer/encoderblock_(\d+)/LayerNorm_0/", lambda m: f"blocks.{m[1]}.norm1."),
    (r"^Transformer/encoderblock_(\d+)/LayerNorm_2/", lambda m: f"blocks.{m[1]}.norm2."),
    (r"^Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/(query|key|value)/",
     lambda m: f"blocks.{m[1]}.attn.qkv."),
    (r"^Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/out/", lambda m: f"blocks.{m[1]}.attn.proj."),
    (r"^Transformer/encoderblock_(\d+)/MlpBlock_3/Dense_0/", lambda m: f"blocks.{m[1]}.mlp.fc1."),
    (r"^Transformer/encoderblock_(\d+)/MlpBlock_3/Dense_1/", lambda m: f"blocks.{m[1]}.mlp.fc2."),
    (r"^Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_1/rope_frequencies$", "rope.freqs"),
    (r"^Transformer/encoderblock_(\d+)/LayerScale_0/", lambda m: f"blocks.{m[1]}.ls1."),
    (r"^Transformer/encoderblock_(\d+)/LayerScale_1/", lambda m: f"blocks.{m[1]}.ls2."),
    (r"^Transformer/encoder_norm/", "norm."),
    (r"^fc_norm/", "fc_norm."),
    (r"^MAPHead_0/", "attn_pool."),
    (r"^pre_logits/", "pre_logits.fc."),
    (r"^head_dist/", "head_dist."),
    (r"^head/", "head."),
]


# timm's Eva names its layer scales gamma_1 / gamma_2.
_EVA_NAMES = [
    (r"^Transformer/encoderblock_(\d+)/LayerScale_0/", lambda m: f"blocks.{m[1]}.gamma_1"),
    (r"^Transformer/encoderblock_(\d+)/LayerScale_1/", lambda m: f"blocks.{m[1]}.gamma_2"),
]


def timm_prefix(key, names=()):
    for pattern, name in [*names, *_TIMM_NAMES]:
        m = re.match(pattern, key)
        if m:
            return name(m) if callable(name) else name
    raise AssertionError(f"no timm name for {key}")


def timm_scales(model, decay, min_scale=0.0):
    """{timm parameter name: lr_scale} of timm's own parameter groups."""
    by_id = {id(p): g["lr_scale"] for g in param_groups_layer_decay(model, layer_decay=decay, min_scale=min_scale)
             for p in g["params"]}
    return {name: by_id[id(p)] for name, p in model.named_parameters()}


def compare(keras_model, timm_model, decay, min_scale=0.0, timm_names=()):
    """Every keras_vit variable's scale equals its timm parameter's; every timm parameter is
    matched. Returns the number of distinct scales."""
    want = timm_scales(timm_model, decay, min_scale)
    got = training.layer_decay_scales(keras_model, decay, min_scale=min_scale)
    matched = set()
    for key, var in weight_variables(keras_model).items():
        prefix = timm_prefix(key, timm_names)
        names = [n for n in want if n == prefix or (prefix.endswith(".") and n.startswith(prefix))]
        assert names, (key, prefix)
        for name in names:
            assert got[var.path] == want[name], (key, name, got[var.path], want[name])
        matched.update(names)
    assert matched == set(want), sorted(set(want) - matched)
    assert set(got) == {v.path for v in keras_model.weights}
    return len(set(want.values()))


def _save(tmp_path, arch, **args):
    model = timm.create_model(arch, pretrained=False, **args)
    save_for_hf(model, tmp_path, safe_serialization=True, model_args=args)
    return model


def test_vit_b16_scales_equal_timm():
    with torch.device("meta"):  # the parameters' names and shapes, without initialising 86M values
        timm_model = timm.create_model("vit_base_patch16_224", pretrained=False)
    keras_model = keras_vit.ViTB16(weights=None, classifier_activation=None)
    # 14 groups: stem, 12 blocks (the final norm with the last), the head
    assert compare(keras_model, timm_model, 0.65) == 14


def test_dinov2_small_scales_equal_timm(tmp_path):
    timm_model = _save(tmp_path, "vit_small_patch14_dinov2")  # 518 px, layer scale, no head
    assert timm_model.num_classes == 0
    keras_model = _load(tmp_path, timm_model)
    assert keras_model.config.layer_scale and keras_model.config.image_size == (518, 518)
    # no head: the last block and the final norm train at the full rate
    assert compare(keras_model, timm_model, 0.75) == 13
    assert compare(keras_model, timm_model, 0.5, min_scale=0.01) == 8  # 1 ... 0.5 ** 6, then 0.01


@pytest.mark.parametrize("arch,args", [
    ("deit_small_distilled_patch16_224", dict(img_size=32, depth=2)),  # dist_token, head_dist
    ("vit_small_patch14_reg4_dinov2", dict(img_size=28, depth=2)),  # reg_token
    ("vit_base_patch32_clip_224", dict(img_size=64, depth=2, embed_dim=64, num_heads=4)),  # norm_pre
    ("vit_medium_patch16_gap_256", dict(img_size=32, depth=2)),  # fc_norm
    ("vit_base_patch16_siglip_224", dict(img_size=32, depth=2, embed_dim=64, num_heads=4)),  # MAP head
    ("vit_tiny_r_s16_p8_224", dict(img_size=32, depth=2)),  # hybrid: a ResNet stem in patch_embed
], ids=["distilled", "registers", "norm_pre", "fc_norm", "map_head", "hybrid"])
def test_variant_scales_equal_timm(tmp_path, arch, args):
    timm_model = _save(tmp_path, arch, **args)
    compare(_load(tmp_path, timm_model), timm_model, 0.7)


def test_rope_mixed_scales_equal_timm(tmp_path):
    # RoPE-Mixed's rotary frequencies (timm's one `rope.freqs`, every block's here) are in no group
    # of Eva's group_matcher: timm's layer decay gives them the last group's rate, as the head's.
    timm_model = _save(tmp_path, "vit_small_patch16_rope_mixed_224", img_size=(32, 48), depth=3, embed_dim=32,
                       num_heads=2, num_classes=3)
    keras_model = _load(tmp_path, timm_model)
    assert keras_model.config.rope_learned_frequencies
    assert compare(keras_model, timm_model, 0.7, timm_names=_EVA_NAMES) == 5  # stem, 3 blocks, head and rope.freqs
    scales = training.layer_decay_scales(keras_model, 0.7)
    frequencies = [v.path for v in keras_model.weights if v.path.endswith("rope_frequencies")]
    assert len(frequencies) == 3 and {scales[p] for p in frequencies} == {1.0}


def test_families_without_grouping_refuse():
    model = keras_vit.BiTResNet(image_size=64, block_units=(1,), width_factor=0.5, classes=3)
    with pytest.raises(ValueError, match="BiT.*no layer grouping.*without layer_decay"):
        training.layer_decay_scales(model, 0.75)
    with pytest.raises(ValueError, match=r"layer_decay must be in \(0, 1\]"):
        training.layer_decay_scales(keras_vit.VisionTransformer(**TINY), 1.5)


# === timm's weight-decay rule (param_groups_weight_decay with the model's no_weight_decay()) ===


def timm_decayed_keys(tmp_path, arch, args):
    """(the keras_vit model, the canonical keys of the weights timm's rule decays): every parameter
    timm decays is saved as ones, every other as zeros, and read back through keras_vit's timm
    reader, so each canonical weight says which of its timm parameters it came from."""
    model = timm.create_model(arch, pretrained=False, **args)
    groups = param_groups_weight_decay(model, weight_decay=0.1, no_weight_decay_list=model.no_weight_decay())
    decayed = {id(p) for g in groups if g["weight_decay"] for p in g["params"]}
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0 if id(p) in decayed else 0.0)
    save_for_hf(model, tmp_path, safe_serialization=True, model_args=args)
    tree, _ = keras_vit.read_checkpoint(tmp_path)
    assert all(float(v.min()) == float(v.max()) for v in tree.values())  # no weight mixes the two
    return _load(tmp_path, model), {k for k, v in tree.items() if float(v.max()) == 1.0}


@pytest.mark.parametrize("arch,args", [
    ("vit_base_patch16_224", dict(img_size=32, depth=2, embed_dim=64, num_heads=4)),
    ("deit_small_distilled_patch16_224", dict(img_size=32, depth=2)),  # dist_token, head_dist
    ("vit_small_patch14_reg4_dinov2", dict(img_size=28, depth=2)),  # reg_token, layer scale
    ("vit_base_patch16_siglip_224", dict(img_size=32, depth=2, embed_dim=64, num_heads=4)),  # MAP head
    ("vit_small_patch16_rope_mixed_224", dict(img_size=32, depth=2, embed_dim=32, num_heads=2)),  # rope.freqs
], ids=["vit_b16", "deit_distilled", "registers", "map_head", "rope_mixed"])
def test_weight_decay_rule_equals_timm(tmp_path, arch, args):
    keras_model, want = timm_decayed_keys(tmp_path, arch, args)
    variables = weight_variables(keras_model)
    assert set(variables) == set(keras_vit.read_checkpoint(tmp_path)[0])
    paths = set(training.timm_weight_decay(keras_model))
    assert {k for k, v in variables.items() if v.path in paths} == want
    # big_vision's rule (kernels only, the default) decays the same weights, but for a MAP head's
    # probe, which timm decays.
    kernels = training.pretrain_optimizer(1e-3, total_steps=10, warmup_steps=0)
    by_pattern = {k for k, v in variables.items() if kernels._use_weight_decay(v)}
    assert want - by_pattern == ({"MAPHead_0/probe"} if "siglip" in arch else set())
    assert by_pattern <= want
    # The optimizer decays exactly those.
    optimizer = training.pretrain_optimizer(0.5, total_steps=10, warmup_steps=0, weight_decay_rule="timm",
                                            model=keras_model)
    assert {k for k, v in variables.items() if optimizer._use_weight_decay(v)} == want
    if "siglip" not in arch:
        return
    # One step of zero gradients moves each decayed w by -rate * 0.1 * w, and no other.
    before = {k: np.array(keras.ops.convert_to_numpy(v)) for k, v in variables.items()}
    trainable = keras_model.trainable_variables
    optimizer.apply_gradients([(keras.ops.zeros(v.shape), v) for v in trainable])
    for key, var in variables.items():
        factor = 1.0 - 0.5 * 0.1 if key in want else 1.0
        np.testing.assert_allclose(keras.ops.convert_to_numpy(var), factor * before[key], rtol=1e-6, err_msg=key)


def test_weight_decay_rule_needs_the_model():
    with pytest.raises(ValueError, match="weight_decay_rule='timm'.*model=model"):
        training.pretrain_optimizer(1e-3, total_steps=10, warmup_steps=0, weight_decay_rule="timm")
    with pytest.raises(ValueError, match="weight_decay_rule must be 'kernels' or 'timm'"):
        training.pretrain_optimizer(1e-3, total_steps=10, warmup_steps=0, weight_decay_rule="all")
