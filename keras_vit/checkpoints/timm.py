"""timm's ViT and R+ViT weights (Hub layout: model.safetensors + config.json) -> canonical tree.

timm stacks attention as one qkv matrix (3 * hidden, hidden) and stores PyTorch layouts
(Linear (out, in), Conv2d (out, in, kh, kw)). The number of heads is not in the weights: it comes
from config.json (`model_args.num_heads` when the model was built with overrides), else from the
architecture table's row of the named `architecture` (or, for a bare .safetensors, the row whose
shapes match).
"""

import os
import re

import numpy as np

from keras_vit.checkpoints.common import (
    CheckpointError,
    LazyArray,
    describe_keys,
    materialize,
    looks_like_safetensors,
    read_json,
    read_json_or_empty,
    safetensors_flavour,
    reading,
)
from keras_vit.checkpoints.registry import CheckpointFormat
from keras_vit.checkpoints.torch_zip import open_weights, weights_in_folder
from keras_vit.models.config import NUMERICS
from keras_vit.models.vit_family import VIT, heads_from_table, infer_config, infer_resnet

# === timm's architecture names ===

_PLAIN = re.compile(r"^vit_(tiny|small|base|large|huge)_patch(8|14|16|32)_(224|384|448|518)$")
_RESOLUTION = re.compile(r"_(224|384|448|518)$")


def timm_heads(architecture):
    """Heads of a timm architecture name, from the architecture table (None when no row has it).

    timm names a model once per resolution (`vit_base_patch16_384`); the table keeps the 224 name.
    """
    if architecture is None:
        return None
    name = _RESOLUTION.sub("_224", architecture.split(".", 1)[0])  # drop a pretrained tag
    for arch in VIT.all_architectures().values():
        if arch.timm_name == name:
            return arch.num_heads
    return None


def is_vit_family(architecture):
    """Whether a timm architecture name is one of the original ViT family this reader converts."""
    return timm_heads(architecture) is not None or bool(_PLAIN.match(architecture.split(".", 1)[0]))


# === Key mapping ===


def _linear(w):
    """PyTorch Linear weight (out, in) -> Flax kernel (in, out): a transposed view, copied only
    once, when it is assigned to the model."""
    return w.T


def _conv(w):
    """PyTorch conv weight (out, in, kh, kw) -> Flax/Keras kernel (kh, kw, in, out) (a view)."""
    return w.transpose(2, 3, 1, 0)


class _Reader:
    """Pulls tensors by timm name, remembering which were consumed (the rest are unexpected)."""

    def __init__(self, files, source):
        self.files = files
        self.source = source
        self.used = set()

    def has(self, key):
        return key in self.files

    def get(self, key):
        if key not in self.files:
            raise CheckpointError(f"{self.source}: missing weight {key!r} (timm layout).")
        self.used.add(key)
        return self.files[key].lazy(key)

    def unused(self):
        return [k for k in self.files if k not in self.used]


def _resnet_to_tree(r, tree):
    base = "patch_embed.backbone."
    stem = base + "stem." if r.has(base + "stem.conv.weight") else base
    tree["conv_root/kernel"] = _conv(r.get(stem + "conv.weight"))
    tree["gn_root/scale"] = r.get(stem + "norm.weight")
    tree["gn_root/bias"] = r.get(stem + "norm.bias")
    stages = re.compile(re.escape(base) + r"stages\.(\d+)\.blocks\.(\d+)\.")
    units = sorted({(int(m.group(1)), int(m.group(2))) for m in map(stages.match, r.files) if m})
    for s, u in units:
        src = f"{base}stages.{s}.blocks.{u}."
        dst = f"block{s + 1}/unit{u + 1}/"
        for i in (1, 2, 3):
            tree[f"{dst}conv{i}/kernel"] = _conv(r.get(f"{src}conv{i}.weight"))
            tree[f"{dst}gn{i}/scale"] = r.get(f"{src}norm{i}.weight")
            tree[f"{dst}gn{i}/bias"] = r.get(f"{src}norm{i}.bias")
        if r.has(f"{src}downsample.conv.weight"):
            tree[f"{dst}conv_proj/kernel"] = _conv(r.get(f"{src}downsample.conv.weight"))
            tree[f"{dst}gn_proj/scale"] = r.get(f"{src}downsample.norm.weight")
            tree[f"{dst}gn_proj/bias"] = r.get(f"{src}downsample.norm.bias")


def timm_state_to_tree(files, num_heads=None, *, source="checkpoint", config_hint=None):
    """Canonical tree from timm tensors `files` ({timm key: object with .get(key) -> array}).

    `num_heads` None: taken from the architecture table row matching the shapes.
    """
    r = _Reader(files, source)
    if not r.has("patch_embed.proj.weight"):
        raise CheckpointError(f"{source}: no 'patch_embed.proj.weight'; this is not a timm ViT checkpoint.")
    if r.has("fc_norm.weight") or not r.has("norm.weight"):
        raise CheckpointError(
            f"{source}: this timm model normalises after pooling (fc_norm) instead of before it (norm); "
            "that is not the original ViT layout (build it in timm with fc_norm=False)."
        )
    tree = {}
    if any(k.startswith("patch_embed.backbone.") for k in files):
        _resnet_to_tree(r, tree)
    tree["embedding/kernel"] = _conv(r.get("patch_embed.proj.weight"))
    tree["embedding/bias"] = r.get("patch_embed.proj.bias")
    if r.has("cls_token"):
        tree["cls"] = r.get("cls_token")
    tree["Transformer/posembed_input/pos_embedding"] = r.get("pos_embed")
    hidden = tree["embedding/kernel"].shape[-1]
    blocks = sorted({int(m.group(1)) for m in map(re.compile(r"^blocks\.(\d+)\.").match, files) if m})
    mlp = files["blocks.0.mlp.fc1.weight"].shape("blocks.0.mlp.fc1.weight")[0] if r.has("blocks.0.mlp.fc1.weight") else None
    if num_heads is None:
        num_heads = heads_from_table(
            hidden, len(blocks), mlp, "token" if "cls" in tree else "gap", infer_resnet(tree), source
        )
    if hidden % num_heads:
        raise CheckpointError(f"{source}: hidden size {hidden} is not divisible by {num_heads} heads.")
    hd = hidden // num_heads
    for i in blocks:
        src, dst = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        att = dst + "MultiHeadDotProductAttention_1/"
        tree[dst + "LayerNorm_0/scale"] = r.get(src + "norm1.weight")
        tree[dst + "LayerNorm_0/bias"] = r.get(src + "norm1.bias")
        qkv_w = r.get(src + "attn.qkv.weight")
        qkv_b = r.get(src + "attn.qkv.bias") if r.has(src + "attn.qkv.bias") else LazyArray(
            lambda: np.zeros(3 * hidden, np.float32), (3 * hidden,)
        )
        if qkv_w.shape != (3 * hidden, hidden):
            raise CheckpointError(f"{source}: {src}attn.qkv.weight has shape {qkv_w.shape}; expected {(3 * hidden, hidden)}.")
        for j, name in enumerate(("query", "key", "value")):
            tree[f"{att}{name}/kernel"] = _linear(qkv_w[j * hidden : (j + 1) * hidden]).reshape(hidden, num_heads, hd)
            tree[f"{att}{name}/bias"] = qkv_b[j * hidden : (j + 1) * hidden].reshape(num_heads, hd)
        tree[f"{att}out/kernel"] = _linear(r.get(src + "attn.proj.weight")).reshape(num_heads, hd, hidden)
        tree[f"{att}out/bias"] = r.get(src + "attn.proj.bias")
        tree[dst + "LayerNorm_2/scale"] = r.get(src + "norm2.weight")
        tree[dst + "LayerNorm_2/bias"] = r.get(src + "norm2.bias")
        for k, name in ((0, "fc1"), (1, "fc2")):
            tree[f"{dst}MlpBlock_3/Dense_{k}/kernel"] = _linear(r.get(f"{src}mlp.{name}.weight"))
            tree[f"{dst}MlpBlock_3/Dense_{k}/bias"] = r.get(f"{src}mlp.{name}.bias")
    tree["Transformer/encoder_norm/scale"] = r.get("norm.weight")
    tree["Transformer/encoder_norm/bias"] = r.get("norm.bias")
    if r.has("pre_logits.fc.weight"):
        tree["pre_logits/kernel"] = _linear(r.get("pre_logits.fc.weight"))
        tree["pre_logits/bias"] = r.get("pre_logits.fc.bias")
    if r.has("head.weight"):
        tree["head/kernel"] = _linear(r.get("head.weight"))
        tree["head/bias"] = r.get("head.bias")
    unused = r.unused()
    if unused:
        raise CheckpointError(
            f"{source}: unexpected weights {describe_keys(unused)}; this timm model has parts the original "
            "ViT does not (layer scale, registers, extra norms, ...), so it cannot be converted exactly."
        )
    return tree


def _image_size(config):
    args = config.get("model_args") or {}
    size = args.get("img_size")
    if size is None:
        size = (config.get("pretrained_cfg") or {}).get("input_size", [None, None, None])[1:]
        if None in size:
            return None
    return (size, size) if isinstance(size, int) else tuple(size)


def read_timm(path, lazy=False):
    """Read a timm Hub folder (model.safetensors + config.json) or a bare timm .safetensors.

    Returns (canonical tree, VisionTransformer kwargs with timm's numerics). With `lazy=True` the
    tree holds LazyArrays, read from the file only when converted with np.asarray.

    Example:
        >>> tree, config = read_timm("vit_base_patch16_224.augreg2_in21k_ft_in1k/")   # doctest: +SKIP
    """
    path = os.fspath(path)
    with reading(path):
        return _read_timm(path, lazy)


def _positive_int(value, name, source):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{source}: config.json {name} is {str(value)[:40]!r}; expected a positive integer.")
    return value


def _read_timm(path, lazy):
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    weights = path
    if os.path.isdir(path):
        weights = weights_in_folder(path, "save the model with safe_serialization=True")
    config_path = os.path.join(folder, "config.json")
    config = read_json(config_path) if os.path.exists(config_path) else {}
    if config and "architecture" not in config:
        config = {}  # a config.json of another library, not timm's
    if config.get("architecture") is not None and not isinstance(config["architecture"], str):
        raise CheckpointError(f"{config_path}: 'architecture' is not a string.")
    args = config.get("model_args") or {}
    if not isinstance(args, dict):
        raise CheckpointError(f"{config_path}: 'model_args' is not a JSON object.")
    num_heads = _positive_int(args.get("num_heads"), "model_args.num_heads", config_path) or timm_heads(
        config.get("architecture"))
    if config.get("architecture") and not is_vit_family(config["architecture"]):
        raise CheckpointError(
            f"{path}: timm architecture {config['architecture']!r} is not one of the original ViT family "
            "this package converts (vit_{tiny,small,base,large,huge}_patch*, vit_base_patch16_gap_224, "
            "vit_*_r*_s* hybrids)."
        )
    files = open_weights(weights)  # safetensors, or a PyTorch zip read without pickle
    tree = timm_state_to_tree(files, num_heads, source=weights)
    out = infer_config(tree, NUMERICS["timm"], source=weights, image_size=_image_size(config))
    pool = args.get("global_pool", config.get("global_pool"))
    expected = "token" if out["classifier"] == "token" else "avg"
    if pool not in (None, "", expected):
        raise CheckpointError(
            f"{path}: timm global_pool={pool!r} with{'' if expected == 'token' else 'out'} a class token; the "
            "original ViT pools the class token when it has one and averages the patches when it has none."
        )
    return (tree if lazy else materialize(tree)), out


# === Format ===


def detect(path):
    """A folder whose config.json names a timm architecture, or a .safetensors that is not
    transformers' (a bare timm file)."""
    if os.path.isdir(path):
        config_path = os.path.join(path, "config.json")
        return os.path.isfile(config_path) and "architecture" in read_json_or_empty(config_path)
    if path.endswith((".safetensors", ".safetensors.index.json")) or looks_like_safetensors(path):
        return safetensors_flavour(path) == "timm"
    return False


FORMAT = CheckpointFormat(
    name="timm",
    description="a timm Hub folder (model.safetensors + config.json with 'architecture') or a timm .safetensors",
    detect=detect,
    read=lambda path: read_timm(path, lazy=True),
    numerics="timm",
    hub_files=("*.safetensors", "*.safetensors.index.json"),
    hub_fallback_files=("pytorch_model.bin",),  # read by checkpoints.torch_zip, which runs nothing from it
)
