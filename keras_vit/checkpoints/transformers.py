"""Hugging Face transformers ViT repos (config.json + model.safetensors) -> canonical tree.

ViTForImageClassification saves its encoder under `vit.` and the head as `classifier`; ViTModel
saves (the in21k repos) have no prefix and keep `pooler.dense`, which is the original
`pre_logits` (Dense + tanh on the class token). The number of heads, the LayerNorm epsilon and
the GELU form come from config.json.
"""

import os

import numpy as np

from keras_vit.checkpoints.registry import CheckpointFormat, reads_config_object, safetensors_flavour
from keras_vit.errors import CheckpointError
from keras_vit.geometry import as_pair
from keras_vit.models.config import NUMERICS
from keras_vit.models.vit_family import infer_config
from keras_vit.storage.files import describe_keys, looks_like_safetensors, reading
from keras_vit.storage.json_files import read_json_object
from keras_vit.storage.lazy import LazyArray, materialize
from keras_vit.storage.torch_zip import open_weights, weights_in_folder

#: transformers `hidden_act` -> gelu_approximate (tanh form) of VisionTransformer.
_GELU = {"gelu": False, "gelu_python": False, "gelu_new": True, "gelu_pytorch_tanh": True}
_IGNORED = ("embeddings.mask_token",)  # used only for masked image modelling, never in a forward pass


def _linear(w):
    return w.T  # a view; copied once, when assigned to the model


@reads_config_object
def read_transformers(path, lazy=False):
    """Read a transformers ViT folder (config.json + model.safetensors [or a sharded index]).

    Returns (canonical tree, ViTConfig with transformers' numerics, the LayerNorm
    epsilon and GELU form taken from config.json). With `lazy=True` the tree holds LazyArrays.

    Example:
        >>> tree, config = read_transformers("vit-base-patch16-224/")   # doctest: +SKIP
    """
    path = os.fspath(path)
    with reading(path):
        return _read_transformers(path, lazy)


def _read_transformers(path, lazy):
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    config_path = os.path.join(folder, "config.json")
    if not os.path.exists(config_path):
        raise CheckpointError(f"{path}: a transformers checkpoint needs its config.json next to the weights.")
    hf = read_json_object(config_path)
    if hf.get("model_type", "vit") != "vit":
        raise CheckpointError(
            f"{path}: transformers model_type {hf.get('model_type')!r} is not 'vit'; only ViTModel and "
            "ViTForImageClassification checkpoints are converted."
        )
    if os.path.isdir(path):
        weights = weights_in_folder(path, "save with save_pretrained(..., safe_serialization=True)")
    else:
        weights = path
    act = hf.get("hidden_act", "gelu")
    if act not in _GELU:
        raise CheckpointError(f"{path}: hidden_act {act!r} is not a GELU form this package computes ({sorted(_GELU)}).")
    if hf.get("pooler_act", "tanh") != "tanh":
        raise CheckpointError(f"{path}: pooler_act {hf['pooler_act']!r}; the original pre_logits layer uses tanh.")
    heads = hf.get("num_attention_heads")
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise CheckpointError(f"{config_path}: num_attention_heads is {str(heads)[:40]!r}; expected a positive integer.")
    files = open_weights(weights)  # safetensors, or a PyTorch zip read without pickle
    tree = transformers_state_to_tree(files, heads, source=weights)
    eps = hf.get("layer_norm_eps", 1e-12)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise CheckpointError(f"{config_path}: layer_norm_eps is {str(eps)[:40]!r}; expected a number in (0, 1).")
    numerics = dict(NUMERICS["transformers"], layer_norm_epsilon=float(eps),
                    gelu_approximate=_GELU[act])
    size = hf.get("image_size")
    size = as_pair(size) if size else None
    config = infer_config(tree, numerics, source=weights, image_size=size)
    return (tree if lazy else materialize(tree)), config


def transformers_state_to_tree(files, num_heads, *, source="checkpoint"):
    """Canonical tree from transformers ViT tensors ({key: object with .get(key) -> array})."""
    keys = set(files)
    p = "vit." if any(k.startswith("vit.") for k in keys) else ""
    used = set()

    def get(key):
        if key not in files:
            raise CheckpointError(f"{source}: missing weight {key!r} (transformers ViT layout).")
        used.add(key)
        return files[key].lazy(key)

    if p + "embeddings.patch_embeddings.projection.weight" not in keys:
        raise CheckpointError(f"{source}: no '{p}embeddings.patch_embeddings.projection.weight'; not a transformers ViT.")
    tree = {}
    e = p + "embeddings."
    tree["embedding/kernel"] = get(e + "patch_embeddings.projection.weight").transpose(2, 3, 1, 0)
    tree["embedding/bias"] = get(e + "patch_embeddings.projection.bias")
    tree["cls"] = get(e + "cls_token")
    tree["Transformer/posembed_input/pos_embedding"] = get(e + "position_embeddings")
    hidden = tree["embedding/kernel"].shape[-1]
    if hidden % num_heads:
        raise CheckpointError(f"{source}: hidden size {hidden} is not divisible by {num_heads} heads.")
    hd = hidden // num_heads
    i = 0
    while f"{p}encoder.layer.{i}.layernorm_before.weight" in keys:
        src, dst = f"{p}encoder.layer.{i}.", f"Transformer/encoderblock_{i}/"
        att = dst + "MultiHeadDotProductAttention_1/"
        tree[dst + "LayerNorm_0/scale"] = get(src + "layernorm_before.weight")
        tree[dst + "LayerNorm_0/bias"] = get(src + "layernorm_before.bias")
        for name in ("query", "key", "value"):
            w = src + f"attention.attention.{name}."
            tree[f"{att}{name}/kernel"] = _linear(get(w + "weight")).reshape(hidden, num_heads, hd)
            bias = get(w + "bias") if w + "bias" in keys else LazyArray(  # qkv_bias=False
                lambda: np.zeros(hidden, np.float32), (hidden,)
            )
            tree[f"{att}{name}/bias"] = bias.reshape(num_heads, hd)
        tree[f"{att}out/kernel"] = _linear(get(src + "attention.output.dense.weight")).reshape(num_heads, hd, hidden)
        tree[f"{att}out/bias"] = get(src + "attention.output.dense.bias")
        tree[dst + "LayerNorm_2/scale"] = get(src + "layernorm_after.weight")
        tree[dst + "LayerNorm_2/bias"] = get(src + "layernorm_after.bias")
        tree[dst + "MlpBlock_3/Dense_0/kernel"] = _linear(get(src + "intermediate.dense.weight"))
        tree[dst + "MlpBlock_3/Dense_0/bias"] = get(src + "intermediate.dense.bias")
        tree[dst + "MlpBlock_3/Dense_1/kernel"] = _linear(get(src + "output.dense.weight"))
        tree[dst + "MlpBlock_3/Dense_1/bias"] = get(src + "output.dense.bias")
        i += 1
    tree["Transformer/encoder_norm/scale"] = get(p + "layernorm.weight")
    tree["Transformer/encoder_norm/bias"] = get(p + "layernorm.bias")
    if p + "pooler.dense.weight" in keys and "classifier.weight" in keys:
        # ViTForImageClassification reads its head from the class token, not the pooler.
        used.update({p + "pooler.dense.weight", p + "pooler.dense.bias"})
    elif p + "pooler.dense.weight" in keys:
        tree["pre_logits/kernel"] = _linear(get(p + "pooler.dense.weight"))
        tree["pre_logits/bias"] = get(p + "pooler.dense.bias")
    if "classifier.weight" in keys:
        tree["head/kernel"] = _linear(get("classifier.weight"))
        tree["head/bias"] = get("classifier.bias")
    unused = [k for k in keys - used if not k.endswith(_IGNORED)]
    if unused:
        raise CheckpointError(
            f"{source}: unexpected weights {describe_keys(unused)}; this is not a plain transformers ViT."
        )
    return tree


# === Format ===


def detect(path):
    """A folder whose config.json is transformers' (`model_type` / `architectures`), or a
    .safetensors holding transformers' tensor names."""
    if os.path.isdir(path):
        config = read_json_object(os.path.join(path, "config.json"), missing={}, malformed={})
        return "architecture" not in config and bool(config.get("model_type") or "architectures" in config)
    if path.endswith((".safetensors", ".safetensors.index.json")) or looks_like_safetensors(path):
        return safetensors_flavour(path) == "transformers"
    return False


FORMAT = CheckpointFormat(
    name="transformers",
    description="a transformers ViT folder (config.json + model.safetensors)",
    detect=detect,
    read=lambda path: read_transformers(path, lazy=True),
    numerics="transformers",
    hub_files=("*.safetensors", "*.safetensors.index.json"),
    hub_fallback_files=("pytorch_model.bin",),  # read by storage.torch_zip, which runs nothing from it
)
