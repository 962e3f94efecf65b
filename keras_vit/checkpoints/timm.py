"""timm's ViT and R+ViT weights (Hub layout: model.safetensors + config.json) -> canonical tree.

timm stacks attention as one qkv matrix (3 * hidden, hidden) and stores PyTorch layouts
(Linear (out, in), Conv2d (out, in, kh, kw)). The number of heads is not in the weights: it comes
from config.json (`model_args.num_heads` when the model was built with overrides), else from the
architecture table's row of the named `architecture` (or, for a bare .safetensors, the row whose
shapes match).

timm's ViT zoo (every architecture of its vision_transformer.py and deit.py, and BEiT's of
beit.py) is read from the table `timm_vit_architectures.json` (written by weights/timm_vit_table.py
from timm's entrypoints): the architecture's switches, overridden by config.json's `model_args` as
timm overrides them, become the VisionTransformer's variant fields; `pretrained_cfg`'s mean and std
become its `input_normalization`. eva.py's Eva models map onto the same fields.
"""

import os
import re

import numpy as np

from keras_vit.checkpoints.registry import CheckpointFormat, reads_config_object, safetensors_flavour
from keras_vit.errors import CheckpointError
from keras_vit.geometry import positive_pair
from keras_vit.models.config import NUMERICS
from keras_vit.models.vit_family import VIT, heads_from_table, infer_config, infer_resnet, timm_zoo_table
from keras_vit.storage.files import describe_keys, looks_like_safetensors, reading
from keras_vit.storage.json_files import read_json_object
from keras_vit.storage.lazy import LazyArray, materialize
from keras_vit.storage.torch_zip import open_weights, weights_in_folder

# === timm's ViT zoo: the architecture table ===

def timm_vit_table():
    """{"timm_version", "modules": {module: {"architectures": {name: entrypoint kwargs},
    "pretrained": {tag: pretrained_cfg}}}} of timm's vision_transformer.py, deit.py, beit.py and
    eva.py (`keras_vit.models.vit_family.timm_zoo_table`)."""
    return timm_zoo_table()


def timm_architecture(architecture):
    """(module, keyword arguments) of timm's entrypoint `architecture` (a name or "name.tag"): the
    module defining it ("vision_transformer", "deit", "beit" or "eva") and the arguments it gives its
    model class; (None, None) when the table does not have it."""
    name = architecture.split(".", 1)[0]
    for module, entry in timm_vit_table()["modules"].items():
        if name in entry["architectures"]:
            return module, dict(entry["architectures"][name])
    return None, None


def timm_vit_arguments(architecture):
    """The keyword arguments timm's entrypoint `architecture` gives its model class (None when the
    name is not in the table)."""
    return timm_architecture(architecture)[1]


#: timm switches this package has no layers for, and the value that means "off".
_UNSUPPORTED = {
    "block_fn": (None, "Block", "ResPostBlock", "ParallelScalingBlock", "DiffParallelScalingBlock"),
    "attn_layer": (None, "attention", "diff"),
    "dual_lambda": (None, False),  # differential attention's two-scalar lambda
    "dynamic_img_pad": (None, False),
    "pos_embed": (None, "learn", "", "none"),
    "fuse_out_proj": (None, False),
}
_ACTIVATIONS = {None: None, "gelu": None, "GELU": None, "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu",
                "silu": "silu", "SiLU": "silu", "swish": "silu"}
_NORMS = {"LayerNorm": "layer_norm", "layernorm": "layer_norm", "RmsNorm": "rms_norm", "rmsnorm": "rms_norm"}


def _layer_name(value):
    """(name, keywords) of a table layer entry: "gelu" or {"name": "LayerNorm", "eps": 1e-5}."""
    if isinstance(value, dict):
        return value.get("name"), {k: v for k, v in value.items() if k != "name"}
    return value, {}


def _refuse_switches(args, unsupported, source, what, supported):
    """A CheckpointError naming the first switch of `unsupported` ({key: values meaning off}) that
    `args` turns on."""
    for key, off in unsupported.items():
        if args.get(key, None) not in off:
            raise CheckpointError(
                f"{source}: timm {what} {key}={args[key]!r} is not supported by keras_vit's VisionTransformer "
                f"(supported: {supported})."
            )


def timm_variant(args, source, module="vision_transformer"):
    """(VisionTransformer variant fields, timm MLP layer name) for the keyword arguments `args` of
    the model class of timm's `module` (VisionTransformer for vision_transformer.py and deit.py,
    Beit for beit.py); a switch this package cannot build raises a CheckpointError naming it."""
    if module == "beit":
        return _beit_variant(args, source)
    if module == "eva":
        return _eva_variant(args, source)
    if module not in ("vision_transformer", "deit"):
        raise CheckpointError(
            f"{source}: timm's {module}.py architectures are not supported by keras_vit's VisionTransformer "
            "(supported: vision_transformer.py, deit.py, beit.py and eva.py's EVA / EVA-02)."
        )
    _refuse_switches(args, _UNSUPPORTED, source, "architecture option",
                     "class/register/distillation tokens, pooling token/avg/map, no_embed_class, pre_norm, fc_norm, "
                     "final_norm, layer scale, qkv/proj bias, LayerNorm/RmsNorm, GELU/tanh-GELU/QuickGELU/SiLU and "
                     "SwiGLU MLPs, ResPostBlock, ParallelScalingBlock, differential attention, qk_norm, scale_attn_norm/scale_mlp_norm, pool_include_prefix with a MAP head")
    pool = args.get("global_pool", "token")
    if pool not in ("token", "avg", "map", ""):
        raise CheckpointError(f"{source}: timm global_pool={pool!r} is not supported (use 'token', 'avg' or 'map').")
    if args.get("pool_include_prefix") and pool != "map":
        raise CheckpointError(f"{source}: timm pool_include_prefix=True with global_pool={pool!r} is not supported "
                              "(only the MAP head attends over the prefix tokens: global_pool='map').")
    # ResPostBlock: x + norm1(attn(x)), then y + norm2(mlp(y)); its init_values only initialise
    # those norms' scales, it has no layer scale.
    post_norm = args.get("block_fn") == "ResPostBlock"
    class_token = bool(args.get("class_token", True))
    classifier = {"token": "token", "avg": "gap", "map": "map", "": "token" if class_token else "gap"}[pool]
    fc_norm = args.get("fc_norm")
    fc_norm = pool == "avg" if fc_norm is None else bool(fc_norm)
    act, _ = _layer_name(args.get("act_layer"))
    if act not in _ACTIVATIONS:
        raise CheckpointError(f"{source}: timm act_layer {act!r} is not supported (gelu, gelu_tanh, quick_gelu, silu).")
    norm, norm_args = _layer_name(args.get("norm_layer") or {"name": "LayerNorm", "eps": 1e-6})
    if norm not in _NORMS:
        raise CheckpointError(f"{source}: timm norm_layer {norm!r} is not supported (LayerNorm, RmsNorm).")
    mlp, mlp_args = _layer_name(args.get("mlp_layer"))
    if mlp not in (None, "Mlp", "SwiGLU", "SwiGLUPacked", "GluMlp") or mlp_args.get("gate_last", False):
        raise CheckpointError(f"{source}: timm mlp_layer {args.get('mlp_layer')!r} is not supported (Mlp, SwiGLU).")
    if mlp in ("SwiGLU", "SwiGLUPacked", "GluMlp"):
        act = _layer_name(mlp_args.get("act_layer", act or "silu"))[0]
        if act in (None, "gelu", "GELU"):
            act = "silu"  # SwiGLU's own default
    variant = dict(
        classifier=classifier,
        class_token=class_token if class_token != (classifier == "token") else None,
        register_tokens=int(args.get("reg_tokens", 0) or 0),
        distillation_token=bool(args.get("distilled", False)),
        class_token_position_embedding=not args.get("no_embed_class", False),
        patch_embedding_norm=args.get("embed_norm_layer") is not None,
        pre_norm=bool(args.get("pre_norm", False)),
        layer_scale=None if post_norm else args.get("init_values") or None,
        final_norm=bool(args.get("final_norm", True)),
        fc_norm=fc_norm and bool(args.get("final_norm", True)),
        norm=_NORMS[norm],
        mlp_activation=_ACTIVATIONS[act],
        glu=mlp is not None and mlp != "Mlp",
        layer_norm_epsilon=float(norm_args.get("eps", 1e-6)),  # timm's LayerNorm and RmsNorm default
        position_embedding="none" if args.get("pos_embed") in ("", "none") else "learned",
        dynamic_image_size=bool(args.get("dynamic_img_size", False)),
        post_norm=post_norm,
        parallel_blocks=args.get("block_fn") in ("ParallelScalingBlock", "DiffParallelScalingBlock"),
        differential_attention=args.get("attn_layer") == "diff" or args.get("block_fn") == "DiffParallelScalingBlock",
        qk_norm=bool(args.get("qk_norm", False)),
        # BEiT-3's sub-LNs: a norm on the attention's output before its projection, one in the MLP.
        attention_norm=bool(args.get("scale_attn_norm", False)),
        mlp_norm=bool(args.get("scale_mlp_norm", False)),
        map_include_prefix=pool == "map" and bool(args.get("pool_include_prefix", False)),
    )
    return variant, mlp


#: Beit keyword arguments keras_vit cannot build, and the values that mean "off".
_BEIT_UNSUPPORTED = {
    "use_shared_rel_pos_bias": (None, False),  # one relative position bias table for every block
    "swiglu_mlp": (None, False),
    "scale_mlp": (None, False),  # a norm inside the MLP
    "attn_head_dim": (None,),
}


def _beit_variant(args, source):
    """VisionTransformer variant fields of timm's Beit keyword arguments `args` (beit.py): a class
    token, BEiT's relative position bias per block (`use_rel_pos_bias`) instead of an absolute
    position embedding (`use_abs_pos_emb`), q and v biases, layer scale (`init_values`), and mean
    pooling of the patches through `fc_norm` (the class token is not pooled)."""
    _refuse_switches(args, _BEIT_UNSUPPORTED, source, "Beit option",
                     "per-block relative position bias, absolute position embedding, layer scale, q/v biases, "
                     "average or token pooling, fc_norm")
    pool = args.get("global_pool", "avg")  # Beit's default
    if pool not in ("avg", "token", ""):
        raise CheckpointError(f"{source}: timm Beit global_pool={pool!r} is not supported (use 'avg' or 'token').")
    classifier = "gap" if pool == "avg" else "token"
    fc_norm = args.get("use_fc_norm")
    norm, norm_args = _layer_name(args.get("norm_layer") or {"name": "LayerNorm", "eps": 1e-6})
    if norm != "LayerNorm":
        raise CheckpointError(f"{source}: timm Beit norm_layer {norm!r} is not supported (LayerNorm).")
    variant = dict(_VARIANT_DEFAULTS, classifier=classifier, class_token=True if classifier == "gap" else None,
                   layer_scale=args.get("init_values") or None,
                   fc_norm=pool == "avg" if fc_norm is None else bool(fc_norm),
                   layer_norm_epsilon=float(norm_args.get("eps", 1e-6)),
                   position_embedding="learned" if args.get("use_abs_pos_emb", True) else "none",
                   relative_position_bias=bool(args.get("use_rel_pos_bias", False)))
    return variant, None


#: Eva keyword arguments keras_vit cannot build, and the values that mean "off".
_EVA_UNSUPPORTED = {
    "attn_type": (None, "eva", "rope"),  # "rope": timm's AttentionRope (qkv biases fused)
    "rope_type": (None, "cat", "dinov3", "mixed"),  # mrope rotary embeddings
    "gated_attn": (None, False),
    "attn_head_dim": (None,),
    "dynamic_img_pad": (None, False),
}
_EVA_SUPPORTED = ("EVA and EVA-02: class and register tokens, absolute and rotary (EVA's 'cat', DINOv3's, mixed) position "
                  "embeddings, fused or separate q/k/v, sub-LN in attention (scale_attn_inner) and MLP (scale_mlp), "
                  "SwiGLU, layer scale (attn_only_layer_scale too), post-norm blocks, average, token or attention "
                  "pooling, fc_norm, pre-norm, q/k norm, grouped-query attention (num_kv_heads)")


def _eva_variant(args, source):
    """(VisionTransformer variant fields, timm MLP layer name) of timm's Eva keyword arguments
    `args` (eva.py): EVA's ViT with q and v biases, and EVA-02's rotary position embedding
    (`use_rot_pos_emb`, RotaryEmbeddingCat; DINOv3's RotaryEmbeddingDinoV3), SwiGLU MLPs
    (`swiglu_mlp`: a packed GluMlp, or SwiGLU with `scale_mlp`'s norm) and sub-LNs
    (`scale_attn_inner`, `scale_mlp`). timm's `dynamic_img_size` models (DINOv3) follow the input
    size at run time, as in timm (`dynamic_image_size=False` builds one fixed size). The rotary
    coordinate augmentations (`rope_rescale_coords`, ...) act in training only and are not built."""
    _refuse_switches(args, _EVA_UNSUPPORTED, source, "Eva option", _EVA_SUPPORTED)
    pool = args.get("global_pool", "avg")  # Eva's default
    if pool not in ("avg", "token", "map", ""):
        raise CheckpointError(f"{source}: timm Eva global_pool={pool!r} is not supported (use 'avg', 'token' or "
                              "'map').")
    class_token = bool(args.get("class_token", True))
    classifier = "map" if pool == "map" else "gap" if pool == "avg" or not class_token else "token"
    fc_norm = args.get("use_fc_norm")
    fc_norm = pool == "avg" if fc_norm is None else bool(fc_norm)
    post_norm = args.get("use_post_transformer_norm")
    post_norm = not fc_norm if post_norm is None else bool(post_norm)
    if fc_norm and post_norm:
        raise CheckpointError(f"{source}: timm Eva with both a final norm and fc_norm is not supported.")
    norm, norm_args = _layer_name(args.get("norm_layer") or {"name": "LayerNorm", "eps": 1e-6})
    if norm not in _NORMS:
        raise CheckpointError(f"{source}: timm Eva norm_layer {norm!r} is not supported (LayerNorm, RmsNorm).")
    swiglu = bool(args.get("swiglu_mlp", False))
    scale_mlp = bool(args.get("scale_mlp", False))
    mlp_layer = ("SwiGLU" if scale_mlp or args.get("swiglu_align_to") else "GluMlp") if swiglu else None
    rope = bool(args.get("use_rot_pos_emb", False))
    dinov3 = args.get("rope_type") == "dinov3"
    reference = None if dinov3 else args.get("ref_feat_shape")  # DINOv3's rotary embedding ignores it
    variant = dict(
        _VARIANT_DEFAULTS, classifier=classifier, class_token=class_token if class_token != (classifier == "token")
        else None, register_tokens=int(args.get("num_reg_tokens", 0) or 0),
        class_token_position_embedding=not args.get("no_embed_class", False),
        pre_norm=bool(args.get("use_pre_transformer_norm", False)), layer_scale=args.get("init_values") or None,
        final_norm=fc_norm or post_norm, fc_norm=fc_norm, norm=_NORMS[norm], mlp_activation="silu" if swiglu else None,
        glu=swiglu, layer_norm_epsilon=float(norm_args.get("eps", 1e-6 if norm == "LayerNorm" else 1e-5)),
        position_embedding="learned" if args.get("use_abs_pos_emb", True) else "none",
        dynamic_image_size=bool(args.get("dynamic_img_size", False)),
        rotary_position_embedding=rope, rope_temperature=float(args.get("rope_temperature", 10000.0)),
        rope_reference_grid=tuple(reference) if rope and reference is not None else None,
        rope_grid_offset=float(args.get("rope_grid_offset", 0.0) or 0.0) if rope else 0.0,
        rope_grid_indexing=args.get("rope_grid_indexing", "ij") if rope else "ij",
        rope_coordinates="centered" if rope and dinov3 else "index",
        rope_rotate_half=rope and bool(args.get("rope_rotate_half", False)),
        rope_learned_frequencies=rope and args.get("rope_type") == "mixed",
        attention_norm=bool(args.get("scale_attn_inner", False)), mlp_norm=scale_mlp,
        post_norm=bool(args.get("use_post_norm", False)),
        qk_norm=bool(args.get("qk_norm", False)), num_kv_heads=_kv_heads(args),
        attention_only_layer_scale=bool(args.get("attn_only_layer_scale", False)) and bool(args.get("init_values")),
        # Eva's attention pool reads every token, its heads and MLP ratio its own (attn_pool_*).
        map_heads=args.get("attn_pool_num_heads") if pool == "map" else None, map_include_prefix=pool == "map")
    return variant, mlp_layer


def _kv_heads(args):
    """Eva's num_kv_heads (None, one count, or one per block) as the num_kv_heads field: None
    when every block has num_heads key/value heads, else a tuple per block (as timm expands it)."""
    value, heads, depth = args.get("num_kv_heads"), args.get("num_heads"), args.get("depth")
    counts = list(value) if isinstance(value, (list, tuple)) else [value] * int(depth or 1)
    counts = [heads if c is None else int(c) for c in counts]
    return None if all(c == heads for c in counts) else tuple(counts)


_VARIANT_DEFAULTS = dict(
    class_token=None, register_tokens=0, distillation_token=False, class_token_position_embedding=True,
    patch_embedding_norm=False, pre_norm=False, layer_scale=None, final_norm=True, fc_norm=False, norm="layer_norm",
    mlp_activation=None, glu=False, position_embedding="learned", dynamic_image_size=False, qkv_bias=True,
    key_bias=True, projection_bias=True, patch_embedding_bias=True, relative_position_bias=False, rotary_position_embedding=False,
    rope_temperature=10000.0, rope_reference_grid=None, rope_grid_offset=0.0, rope_grid_indexing="ij",
    rope_coordinates="index", rope_rotate_half=False, rope_learned_frequencies=False, post_norm=False, map_heads=None, map_mlp_dim=None,
    map_include_prefix=False,
    attention_norm=False, mlp_norm=False, parallel_blocks=False, differential_attention=False, qk_norm=False,
    num_kv_heads=None, attention_only_layer_scale=False,
)

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


def _norm_to_tree(r, src, dst, tree, kind="layer_norm"):
    tree[f"{dst}/scale"] = r.get(f"{src}.weight")
    if kind == "layer_norm":  # RmsNorm has no bias
        tree[f"{dst}/bias"] = r.get(f"{src}.bias")


def _linear_to_tree(r, src, dst, tree, rows=None):
    w = r.get(f"{src}.weight")
    if rows is not None:
        w = w[rows]
    tree[f"{dst}/kernel"] = _linear(w)
    if r.has(f"{src}.bias"):
        b = r.get(f"{src}.bias")
        tree[f"{dst}/bias"] = b if rows is None else b[rows]


def _attention_to_tree(r, src, dst, tree, hidden, num_heads):
    hd = hidden // num_heads
    for timm_name, name in (("q_norm", "query_norm"), ("k_norm", "key_norm")):  # qk_norm, per head
        if r.has(f"{src}{timm_name}.weight"):
            _norm_to_tree(r, src + timm_name, dst + name, tree,
                          "layer_norm" if r.has(f"{src}{timm_name}.bias") else "rms_norm")
    if r.has(src + "q_proj.weight"):  # EVA-02's separate projections (the key's without bias)
        for proj, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            weight = r.get(f"{src}{proj}.weight")
            width = int(weight.shape[0])  # Sapiens2's key/value: fewer heads (grouped-query attention)
            tree[f"{dst}{name}/kernel"] = _linear(weight).reshape(hidden, width // hd, hd)
            if r.has(f"{src}{proj}.bias"):  # the key's has none: a key bias the softmax would cancel
                tree[f"{dst}{name}/bias"] = r.get(f"{src}{proj}.bias").reshape(width // hd, hd)
        _attention_out_to_tree(r, src, dst, tree, hidden, num_heads)
        return
    qkv_w = r.get(src + "qkv.weight")
    if qkv_w.shape != (3 * hidden, hidden):
        raise CheckpointError(f"{r.source}: {src}qkv.weight has shape {qkv_w.shape}; expected {(3 * hidden, hidden)}.")
    biases = None
    if r.has(src + "qkv.bias"):
        qkv_b = r.get(src + "qkv.bias")
        biases = [qkv_b[j * hidden : (j + 1) * hidden] for j in range(3)]
    elif r.has(src + "q_bias"):
        # BEiT's layout: q and v biases, the key's a constant zero buffer (a key bias adds the same
        # q . b to every logit of a query, which the softmax cancels): none here (key_bias=False).
        biases = [r.get(src + "q_bias"), None, r.get(src + "v_bias")]
    for j, name in enumerate(("query", "key", "value")):
        tree[f"{dst}{name}/kernel"] = _linear(qkv_w[j * hidden : (j + 1) * hidden]).reshape(hidden, num_heads, hd)
        if biases is not None and biases[j] is not None:
            tree[f"{dst}{name}/bias"] = biases[j].reshape(num_heads, hd)
    if r.has(src + "relative_position_bias_table"):  # BEiT's, per block
        tree[f"{dst}relative_position_bias_table"] = r.get(src + "relative_position_bias_table")
    if r.has(src + "relative_position_index"):  # a constant of the grid (older files store it)
        r.get(src + "relative_position_index")
    _differential_to_tree(r, src, dst, tree)
    _attention_out_to_tree(r, src, dst, tree, hidden, num_heads)


def _attention_out_to_tree(r, src, dst, tree, hidden, num_heads):
    """The out projection, and EVA-02 CLIP's norm before it (`attn.norm`)."""
    if r.has(src + "norm.weight"):
        _norm_to_tree(r, src + "norm", dst + "norm", tree, "layer_norm" if r.has(src + "norm.bias") else "rms_norm")
    tree[f"{dst}out/kernel"] = _linear(r.get(src + "proj.weight")).reshape(num_heads, hidden // num_heads, hidden)
    if r.has(src + "proj.bias"):
        tree[f"{dst}out/bias"] = r.get(src + "proj.bias")


def _mlp_to_tree(r, src, dst, tree, mlp_layer):
    if mlp_layer == "SwiGLU":  # separate gate (activated) and linear branches
        _linear_to_tree(r, src + "fc1_g", dst + "Dense_0", tree)
        _linear_to_tree(r, src + "fc1_x", dst + "Dense_2", tree)
    elif mlp_layer in ("GluMlp", "SwiGLUPacked"):  # one fc1: activated first half, linear second half
        width = r.files[src + "fc1.weight"].shape(src + "fc1.weight")[0] // 2
        _linear_to_tree(r, src + "fc1", dst + "Dense_0", tree, slice(0, width))
        _linear_to_tree(r, src + "fc1", dst + "Dense_2", tree, slice(width, 2 * width))
    else:
        _linear_to_tree(r, src + "fc1", dst + "Dense_0", tree)
    if r.has(src + "norm.weight"):  # EVA-02's sub-LN before fc2 (scale_mlp)
        _norm_to_tree(r, src + "norm", dst + "norm", tree, "layer_norm" if r.has(src + "norm.bias") else "rms_norm")
    _linear_to_tree(r, src + "fc2", dst + "Dense_1", tree)


def _differential_to_tree(r, src, dst, tree):
    """Differential attention's lambda vectors and sub-norm (timm's DiffAttention), when present."""
    if r.has(src + "sub_norm.weight"):
        tree[dst + "sub_norm/scale"] = r.get(src + "sub_norm.weight")
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            tree[dst + name] = r.get(src + name)


def _parallel_block_to_tree(r, src, dst, tree, hidden, num_heads, norm):
    """timm's ParallelScalingBlock: one norm (`in_norm`), one input projection `in_proj` whose rows
    are [MLP fc1 | q | k | v] (its bias, or the MLP's own `mlp_bias` when qkv_bias=False), the
    attention's and the MLP's output projections, one layer scale `ls`."""
    _norm_to_tree(r, src + "in_norm", dst + "LayerNorm_0", tree, norm)
    weight = r.get(src + "in_proj.weight")
    width = int(weight.shape[0]) - 3 * hidden
    bias = r.get(src + "in_proj.bias") if r.has(src + "in_proj.bias") else None
    att, mlp, hd = dst + "MultiHeadDotProductAttention_1/", dst + "MlpBlock_3/", hidden // num_heads
    tree[mlp + "Dense_0/kernel"] = _linear(weight[:width])
    tree[mlp + "Dense_0/bias"] = bias[:width] if bias is not None else r.get(src + "mlp_bias")
    for j, name in enumerate(("query", "key", "value")):
        rows = slice(width + j * hidden, width + (j + 1) * hidden)
        tree[f"{att}{name}/kernel"] = _linear(weight[rows]).reshape(hidden, num_heads, hd)
        if bias is not None:
            tree[f"{att}{name}/bias"] = bias[rows].reshape(num_heads, hd)
    for timm_name, name in (("q_norm", "query_norm"), ("k_norm", "key_norm")):  # qk_norm, per head
        if r.has(f"{src}{timm_name}.weight"):
            _norm_to_tree(r, src + timm_name, att + name, tree, norm)
    _differential_to_tree(r, src, att, tree)
    if r.has(src + "out_proj.weight"):  # DiffParallelScalingBlock: one out projection of [attention | MLP]
        out = r.get(src + "out_proj.weight")
        tree[att + "out/kernel"] = _linear(out[:, :hidden]).reshape(num_heads, hd, hidden)
        tree[mlp + "Dense_1/kernel"] = _linear(out[:, hidden:])
        if r.has(src + "out_proj.bias"):  # one bias for the sum: the attention's, the MLP's zero
            tree[att + "out/bias"] = r.get(src + "out_proj.bias")
            tree[mlp + "Dense_1/bias"] = LazyArray(lambda: np.zeros(hidden, np.float32), (hidden,))
    else:
        tree[att + "out/kernel"] = _linear(r.get(src + "attn_out_proj.weight")).reshape(num_heads, hd, hidden)
        if r.has(src + "attn_out_proj.bias"):
            tree[att + "out/bias"] = r.get(src + "attn_out_proj.bias")
        _linear_to_tree(r, src + "mlp_out_proj", mlp + "Dense_1", tree)
    if r.has(src + "ls.gamma"):
        tree[dst + "LayerScale_0/scale"] = r.get(src + "ls.gamma")


def _variant_state_to_tree(r, num_heads, variant, mlp_layer, source):
    """Canonical tree of a timm VisionTransformer with the switches `variant` (timm_variant's)."""
    tree = {"embedding/kernel": _conv(r.get("patch_embed.proj.weight"))}
    if r.has("patch_embed.proj.bias"):
        tree["embedding/bias"] = r.get("patch_embed.proj.bias")
    norm = variant["norm"]
    if variant["patch_embedding_norm"]:
        _norm_to_tree(r, "patch_embed.norm", "embedding_norm", tree, norm)
    for timm_name, name in (("cls_token", "cls"), ("dist_token", "dist_token"), ("reg_token", "reg_tokens"),
                            ("pos_embed", "Transformer/posembed_input/pos_embedding")):
        if r.has(timm_name):
            tree[name] = r.get(timm_name)
    if variant["pre_norm"]:
        _norm_to_tree(r, "norm_pre", "norm_pre", tree, norm)
    hidden = tree["embedding/kernel"].shape[-1]
    if num_heads is None or hidden % num_heads:
        raise CheckpointError(f"{source}: hidden size {hidden} is not divisible by {num_heads} heads.")
    blocks = sorted({int(m.group(1)) for m in map(re.compile(r"^blocks\.(\d+)\.").match, r.files) if m})
    for i in blocks:
        src, dst = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        if variant.get("parallel_blocks"):
            _parallel_block_to_tree(r, src, dst, tree, hidden, num_heads, norm)
            continue
        _norm_to_tree(r, src + "norm1", dst + "LayerNorm_0", tree, norm)
        _attention_to_tree(r, src + "attn.", dst + "MultiHeadDotProductAttention_1/", tree, hidden, num_heads)
        _norm_to_tree(r, src + "norm2", dst + "LayerNorm_2", tree, norm)
        _mlp_to_tree(r, src + "mlp.", dst + "MlpBlock_3/", tree, mlp_layer)
        if variant.get("rope_learned_frequencies"):  # RoPE-Mixed: (2, depth, heads, head_dim / 2), block i's
            tree[f"{dst}MultiHeadDotProductAttention_1/rope_frequencies"] = r.get("rope.freqs")[:, i]
        single = variant.get("parallel_blocks") or variant.get("attention_only_layer_scale")
        for k in ((1,) if single else (1, 2)) if variant["layer_scale"] and not variant.get("parallel_blocks") else ():
            gamma = f"{src}ls{k}.gamma" if r.has(f"{src}ls{k}.gamma") else f"{src}gamma_{k}"  # BEiT: gamma_1/2
            tree[f"{dst}LayerScale_{k - 1}/scale"] = r.get(gamma)
    if variant["final_norm"] and not variant["fc_norm"]:
        _norm_to_tree(r, "norm", "Transformer/encoder_norm", tree, norm)
    if variant["classifier"] == "map":
        p, dst = "attn_pool.", "MAPHead_0/"
        num_heads = variant.get("map_heads") or num_heads  # the Perception Encoder's pool has its own
        hd = hidden // num_heads
        tree[dst + "probe"] = r.get(p + "latent")
        att = dst + "MultiHeadDotProductAttention_0/"
        tree[att + "query/kernel"] = _linear(r.get(p + "q.weight")).reshape(hidden, num_heads, hd)
        kv_w = r.get(p + "kv.weight")
        kv_b = r.get(p + "kv.bias") if r.has(p + "kv.bias") else None
        if r.has(p + "q.bias"):
            tree[att + "query/bias"] = r.get(p + "q.bias").reshape(num_heads, hd)
        for j, name in enumerate(("key", "value")):
            tree[f"{att}{name}/kernel"] = _linear(kv_w[j * hidden : (j + 1) * hidden]).reshape(hidden, num_heads, hd)
            if kv_b is not None:
                tree[f"{att}{name}/bias"] = kv_b[j * hidden : (j + 1) * hidden].reshape(num_heads, hd)
        tree[att + "out/kernel"] = _linear(r.get(p + "proj.weight")).reshape(num_heads, hd, hidden)
        tree[att + "out/bias"] = r.get(p + "proj.bias")
        _norm_to_tree(r, p + "norm", dst + "LayerNorm_0", tree, norm)
        _linear_to_tree(r, p + "mlp.fc1", dst + "MlpBlock_0/Dense_0", tree)
        _linear_to_tree(r, p + "mlp.fc2", dst + "MlpBlock_0/Dense_1", tree)
    if variant["fc_norm"]:
        _norm_to_tree(r, "fc_norm", "fc_norm", tree, norm)
    for name in ("head", "head_dist"):
        if r.has(f"{name}.weight"):
            _linear_to_tree(r, name, name, tree)
    unused = r.unused()
    if unused:
        raise CheckpointError(
            f"{source}: unexpected weights {describe_keys(unused)} for timm's architecture as config.json states it."
        )
    return tree


def timm_state_to_tree(files, num_heads=None, *, source="checkpoint", config_hint=None, variant=None, mlp_layer=None):
    """Canonical tree from timm tensors `files` ({timm key: object with .get(key) -> array}).

    `num_heads` None: taken from the architecture table row matching the shapes. `variant` (the
    fields `timm_variant` gives for the architecture) reads every timm ViT switch.
    """
    r = _Reader(files, source)
    if not r.has("patch_embed.proj.weight"):
        raise CheckpointError(f"{source}: no 'patch_embed.proj.weight'; this is not a timm ViT checkpoint.")
    if variant is not None:
        return _variant_state_to_tree(r, num_heads, variant, mlp_layer, source)
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


def _image_size(config, source):
    """(height, width) of config.json's model_args.img_size (an int or a pair), else of
    pretrained_cfg.input_size (C, H, W); None when it states neither."""
    args = config.get("model_args") or {}
    size, name = args.get("img_size"), "model_args.img_size"
    if size is None:
        size, name = (config.get("pretrained_cfg") or {}).get("input_size", [None, None, None]), "input_size"
        if not isinstance(size, (list, tuple)) or len(size) != 3:
            raise CheckpointError(f"{source}: config.json {name} is {str(size)[:40]!r}; expected [channels, height, "
                                  "width].")
        size = list(size[1:])
        if None in size:
            return None
    try:
        return positive_pair(size, name)
    except ValueError:
        raise CheckpointError(f"{source}: config.json {name} is {str(size)[:40]!r}; expected an image size "
                              "(a positive int or [height, width] of positive ints).") from None


@reads_config_object
def read_timm(path, lazy=False):
    """Read a timm Hub folder (model.safetensors + config.json) or a bare timm .safetensors.

    Returns (canonical tree, ViTConfig with timm's numerics). With `lazy=True` the
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
    config = read_json_object(config_path, missing={})
    if config and "architecture" not in config:
        config = {}  # a config.json of another library, not timm's
    if config.get("architecture") is not None and not isinstance(config["architecture"], str):
        raise CheckpointError(f"{config_path}: 'architecture' is not a string.")
    args = config.get("model_args") or {}
    if not isinstance(args, dict):
        raise CheckpointError(f"{config_path}: 'model_args' is not a JSON object.")
    module, table_args = timm_architecture(config["architecture"]) if config.get("architecture") else (None, None)
    if table_args is not None:
        return _read_timm_zoo(weights, config, {**table_args, **args}, config_path, lazy, module)
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
    out = infer_config(tree, NUMERICS["timm"], source=weights, image_size=_image_size(config, config_path))
    pool = args.get("global_pool", config.get("global_pool"))
    expected = "token" if out["classifier"] == "token" else "avg"
    if pool not in (None, "", expected):
        raise CheckpointError(
            f"{path}: timm global_pool={pool!r} with{'' if expected == 'token' else 'out'} a class token; the "
            "original ViT pools the class token when it has one and averages the patches when it has none."
        )
    return (tree if lazy else materialize(tree)), out


def _normalization(pretrained_cfg):
    """(mean, std) of timm's pretrained_cfg, or None for 0.5 / 0.5 ([-1, 1] inputs, the default)."""
    mean, std = pretrained_cfg.get("mean"), pretrained_cfg.get("std")
    if mean is None or std is None:
        return None
    mean, std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
    if all(v == 0.5 for v in mean + std):
        return None
    return mean, std


def _read_timm_zoo(weights, config, args, config_path, lazy, module):
    """A model of timm's ViT zoo: `args` are the entrypoint's keyword arguments overridden by
    config.json's model_args (as timm builds it), for the model class of timm's `module`."""
    # The pooling the saved model had (config.json's global_pool) is the one its head was trained on;
    # null there means the architecture's own, as in the original ViT's reader above.
    if config.get("global_pool") is not None and "global_pool" not in (config.get("model_args") or {}):
        args["global_pool"] = config["global_pool"]
    variant, mlp_layer = timm_variant(args, config_path, module)
    num_heads = _positive_int(args.get("num_heads"), "num_heads", config_path)
    files = open_weights(weights)
    tree = timm_state_to_tree(files, num_heads, source=weights, variant=variant, mlp_layer=mlp_layer)
    embed = tree["embedding/kernel"]
    patch, hidden = int(embed.shape[0]), int(embed.shape[-1])
    prefix = int(variant["classifier"] == "token" if variant["class_token"] is None else variant["class_token"])
    prefix += int(variant["distillation_token"]) + variant["register_tokens"]
    size = _image_size(config, config_path)
    if "Transformer/posembed_input/pos_embedding" in tree:
        tokens = int(tree["Transformer/posembed_input/pos_embedding"].shape[1])
        tokens -= prefix if variant["class_token_position_embedding"] else 0
        if size is None or (size[0] // patch) * (size[1] // patch) != tokens:
            side = int(round(tokens**0.5))
            if side * side != tokens:
                raise CheckpointError(f"{weights}: {tokens} position embeddings are not a square grid of patches.")
            size = (side * patch, side * patch)
    elif size is None:
        size = (224 // patch * patch,) * 2
    variant["qkv_bias"] = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/query/bias" in tree
    variant["key_bias"] = not variant["qkv_bias"] or (
        "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/key/bias" in tree)
    variant["projection_bias"] = "Transformer/encoderblock_0/MultiHeadDotProductAttention_1/out/bias" in tree
    variant["patch_embedding_bias"] = "embedding/bias" in tree
    layers = len({k.split("/")[1] for k in tree if k.startswith("Transformer/encoderblock_")})
    map_mlp = tree.get("MAPHead_0/MlpBlock_0/Dense_0/kernel")
    mlp_dim = int(tree["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"].shape[-1])
    if map_mlp is not None and int(map_mlp.shape[-1]) != mlp_dim:
        variant["map_mlp_dim"] = int(map_mlp.shape[-1])  # a MAP head with its own MLP width
    out = dict(
        image_size=tuple(size),
        patch_size=patch,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=num_heads,
        mlp_dim=mlp_dim,
        classes=int(tree["head/kernel"].shape[-1]) if "head/kernel" in tree else None,
        classifier=variant.pop("classifier"),
        representation_size=None,
        resnet=None,
        num_channels=int(embed.shape[2]),
    )
    out.update(NUMERICS["timm"])
    out["layer_norm_epsilon"] = variant.pop("layer_norm_epsilon")
    out.update({k: v for k, v in variant.items() if v != _VARIANT_DEFAULTS[k]})
    normalization = _normalization(config.get("pretrained_cfg") or {})
    if normalization is not None:
        out["input_normalization"] = normalization
    return (tree if lazy else materialize(tree)), out


# === Format ===


def license_of(path):
    """The licence timm's config.json names for the weights (`pretrained_cfg.license`), or None."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    config = read_json_object(os.path.join(folder, "config.json"), missing={}, malformed={})
    cfg = config.get("pretrained_cfg")
    license = cfg.get("license") if isinstance(cfg, dict) else None
    return license if isinstance(license, str) else None


def detect(path):
    """A folder whose config.json names a timm architecture, or a .safetensors that is not
    transformers' (a bare timm file)."""
    if os.path.isdir(path):
        config_path = os.path.join(path, "config.json")
        return os.path.isfile(config_path) and "architecture" in read_json_object(config_path, missing={}, malformed={})
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
    hub_fallback_files=("pytorch_model.bin",),  # read by storage.torch_zip, which runs nothing from it
    license=license_of,
)
