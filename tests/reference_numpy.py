"""An independent NumPy implementation of the original ViT / R+ViT forward pass.

Written from the formulas of the paper and the original Flax modules, in float64, reading the
canonical weight tree (original names and shapes). It shares no code with keras_vit.
"""

import math

import numpy as np
from scipy.special import erf


def gelu(x, approximate):
    if approximate:
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def layer_norm(x, scale, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def softmax(x):
    x = x - x.max(-1, keepdims=True)
    e = np.exp(x)
    return e / e.sum(-1, keepdims=True)


def conv2d(x, w, stride, padding):
    """x (B,H,W,C), w (kh,kw,C,O); padding "VALID" or "SAME" (TF-style: extra pixel after)."""
    kh, kw = w.shape[:2]
    if padding == "SAME":
        pads = []
        for size, k in ((x.shape[1], kh), (x.shape[2], kw)):
            out = -(-size // stride)
            total = max((out - 1) * stride + k - size, 0)
            pads.append((total // 2, total - total // 2))
        x = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
    b, h, wd, c = x.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((b, oh, ow, w.shape[-1]))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, i : i + stride * oh : stride, j : j + stride * ow : stride, :]
            out += patch @ w[i, j]
    return out


def max_pool_same(x, k=3, s=2):
    pads = []
    for size in x.shape[1:3]:
        out = -(-size // s)
        total = max((out - 1) * s + k - size, 0)
        pads.append((total // 2, total - total // 2))
    x = np.pad(x, ((0, 0), pads[0], pads[1], (0, 0)), constant_values=-np.inf)
    oh, ow = (x.shape[1] - k) // s + 1, (x.shape[2] - k) // s + 1
    out = np.full((x.shape[0], oh, ow, x.shape[3]), -np.inf)
    for i in range(k):
        for j in range(k):
            out = np.maximum(out, x[:, i : i + s * oh : s, j : j + s * ow : s, :])
    return out


def std_conv(x, w, stride, eps, inside_sqrt):
    mean = w.mean(axis=(0, 1, 2), keepdims=True)
    var = w.var(axis=(0, 1, 2), keepdims=True)
    w = (w - mean) / (np.sqrt(var + eps) if inside_sqrt else np.sqrt(var) + eps)
    return conv2d(x, w, stride, "SAME")


def group_norm(x, scale, bias, eps, groups=32):
    b, h, w, c = x.shape
    g = x.reshape(b, h, w, groups, c // groups)
    mean = g.mean(axis=(1, 2, 4), keepdims=True)
    var = g.var(axis=(1, 2, 4), keepdims=True)
    g = (g - mean) / np.sqrt(var + eps)
    return g.reshape(b, h, w, c) * scale.reshape(-1) + bias.reshape(-1)


def resnet(x, t, units, width_factor, gn_eps, ws_eps, ws_inside):
    conv = lambda x, key, s: std_conv(x, t[key + "/kernel"], s, ws_eps, ws_inside)  # noqa: E731
    gn = lambda x, key: group_norm(x, t[key + "/scale"], t[key + "/bias"], gn_eps)  # noqa: E731
    relu = lambda x: np.maximum(x, 0)  # noqa: E731
    width = int(64 * width_factor)
    x = relu(gn(conv(x, "conv_root", 2), "gn_root"))
    x = max_pool_same(x)
    for s, n in enumerate(units):
        features = width * 2**s
        for u in range(n):
            p = f"block{s + 1}/unit{u + 1}"
            stride = (1 if s == 0 else 2) if u == 0 else 1
            residual = x
            if x.shape[-1] != 4 * features or stride != 1:
                residual = gn(conv(x, p + "/conv_proj", stride), p + "/gn_proj")
            y = relu(gn(conv(x, p + "/conv1", 1), p + "/gn1"))
            y = relu(gn(conv(y, p + "/conv2", stride), p + "/gn2"))
            y = gn(conv(y, p + "/conv3", 1), p + "/gn3")
            x = relu(residual + y)
    return x


def vit_forward(
    tree,
    images,
    *,
    patch_size,
    num_layers,
    classifier="token",
    gelu_approximate=True,
    layer_norm_epsilon=1e-6,
    resnet_units=None,
    width_factor=1,
    group_norm_epsilon=1e-6,
    std_conv_epsilon=1e-5,
    std_conv_epsilon_inside_sqrt=False,
    include_top=True,
    return_attention=False,
    position_embedding="learned",
):
    """Logits (or the final token sequence when include_top=False) of the original model.

    `position_embedding` picks the paper's Appendix D.4 variants: "learned" (the original),
    "none", "learned_2d", "relative" (1-D relative attention) or "sincos2d" (big_vision's)."""
    t = {k: np.asarray(v, np.float64) for k, v in tree.items()}
    x = np.asarray(images, np.float64)
    if resnet_units is not None:
        x = resnet(
            x, t, resnet_units, width_factor, group_norm_epsilon, std_conv_epsilon, std_conv_epsilon_inside_sqrt
        )
    x = conv2d(x, t["embedding/kernel"], patch_size, "VALID") + t["embedding/bias"]
    b, gh, gw, d = x.shape
    x = x.reshape(b, gh * gw, d)
    prefix = 1 if classifier == "token" else 0
    if prefix:
        x = np.concatenate([np.broadcast_to(t["cls"], (b, 1, d)), x], axis=1)
    x = x + position_embeddings(t, position_embedding, gh, gw, d, prefix)
    n = x.shape[1]
    attentions = []
    for i in range(num_layers):
        p = f"Transformer/encoderblock_{i}/"
        y = layer_norm(x, t[p + "LayerNorm_0/scale"], t[p + "LayerNorm_0/bias"], layer_norm_epsilon)
        a = p + "MultiHeadDotProductAttention_1/"
        q = np.einsum("btd,dhk->bhtk", y, t[a + "query/kernel"]) + t[a + "query/bias"][None, :, None, :]
        k = np.einsum("btd,dhk->bhtk", y, t[a + "key/kernel"]) + t[a + "key/bias"][None, :, None, :]
        v = np.einsum("btd,dhk->bhtk", y, t[a + "value/kernel"]) + t[a + "value/bias"][None, :, None, :]
        logits = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])
        if position_embedding == "relative":
            # Appendix D.4: the offset's embedding is the key of the content query.
            r = t[a + "relative_embedding"]  # (2n - 1, heads, head_dim)
            for i in range(n):
                for j in range(n):
                    logits[:, :, i, j] += np.einsum("bhk,hk->bh", q[:, :, i], r[i - j + n - 1]) / math.sqrt(q.shape[-1])
        w = softmax(logits)
        attentions.append(w)
        o = np.einsum("bhtk,hkd->btd", w @ v, t[a + "out/kernel"]) + t[a + "out/bias"]
        x = x + o
        y = layer_norm(x, t[p + "LayerNorm_2/scale"], t[p + "LayerNorm_2/bias"], layer_norm_epsilon)
        m = p + "MlpBlock_3/"
        y = gelu(y @ t[m + "Dense_0/kernel"] + t[m + "Dense_0/bias"], gelu_approximate)
        x = x + y @ t[m + "Dense_1/kernel"] + t[m + "Dense_1/bias"]
    x = layer_norm(x, t["Transformer/encoder_norm/scale"], t["Transformer/encoder_norm/bias"], layer_norm_epsilon)
    if include_top:
        if classifier == "map":
            x = map_head(t, x, layer_norm_epsilon, gelu_approximate)
        else:
            x = x[:, 0] if classifier == "token" else x.mean(axis=1)
        if "pre_logits/kernel" in t:
            x = np.tanh(x @ t["pre_logits/kernel"] + t["pre_logits/bias"])
        x = x @ t["head/kernel"] + t["head/bias"]
    return (x, np.stack(attentions)) if return_attention else x


def sincos2d(rows, cols, width, temperature=10000.0):
    """big_vision's posemb_sincos_2d, written per patch: (rows * cols, width)."""
    quarter = width // 4
    out = np.zeros((rows * cols, width))
    for r in range(rows):
        for c in range(cols):
            for i in range(quarter):
                omega = temperature ** (-i / (quarter - 1))
                out[r * cols + c, [i, quarter + i, 2 * quarter + i, 3 * quarter + i]] = (
                    math.sin(c * omega), math.cos(c * omega), math.sin(r * omega), math.cos(r * omega)
                )
    return out


def position_embeddings(t, kind, rows, cols, width, prefix):
    """The (1, prefix + rows * cols, width) embedding added to the tokens (0 when there is none)."""
    key = "Transformer/posembed_input/"
    if kind == "learned":
        return t[key + "pos_embedding"]
    if kind in ("none", "relative"):
        return 0.0
    if kind == "sincos2d":  # the class token gets none (big_vision adds it before concatenating)
        return np.concatenate([np.zeros((prefix, width)), sincos2d(rows, cols, width)])[None]
    if kind == "learned_2d":
        x, y = t[key + "x_embedding"], t[key + "y_embedding"]
        grid = [np.concatenate([x[c], y[r]]) for r in range(rows) for c in range(cols)]
        head = [t[key + "prefix_embedding"]] if prefix else []
        return np.concatenate(head + [np.stack(grid)])[None]
    raise ValueError(kind)


def map_head(t, x, layer_norm_epsilon, gelu_approximate):
    """big_vision's MAPHead: a learned probe attends over the tokens, then x + MLP(LN(x))."""
    m = "MAPHead_0/"
    a = m + "MultiHeadDotProductAttention_0/"
    probe = np.broadcast_to(t[m + "probe"], (x.shape[0], 1, x.shape[-1]))
    q = np.einsum("btd,dhk->bhtk", probe, t[a + "query/kernel"]) + t[a + "query/bias"][None, :, None, :]
    k = np.einsum("btd,dhk->bhtk", x, t[a + "key/kernel"]) + t[a + "key/bias"][None, :, None, :]
    v = np.einsum("btd,dhk->bhtk", x, t[a + "value/kernel"]) + t[a + "value/bias"][None, :, None, :]
    w = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]))
    y = np.einsum("bhtk,hkd->btd", w @ v, t[a + "out/kernel"]) + t[a + "out/bias"]
    z = layer_norm(y, t[m + "LayerNorm_0/scale"], t[m + "LayerNorm_0/bias"], layer_norm_epsilon)
    z = gelu(z @ t[m + "MlpBlock_0/Dense_0/kernel"] + t[m + "MlpBlock_0/Dense_0/bias"], gelu_approximate)
    y = y + z @ t[m + "MlpBlock_0/Dense_1/kernel"] + t[m + "MlpBlock_0/Dense_1/bias"]
    return y[:, 0]


# === big_vision (google-research/big_vision, models/vit.py) ===


def _flax_attention(p, queries, tokens):
    """flax.linen.MultiHeadDotProductAttention under prefix `p` (big_vision's weight names)."""
    q = np.einsum("btd,dhk->bhtk", queries, p["query/kernel"]) + p["query/bias"][None, :, None, :]
    k = np.einsum("btd,dhk->bhtk", tokens, p["key/kernel"]) + p["key/bias"][None, :, None, :]
    v = np.einsum("btd,dhk->bhtk", tokens, p["value/kernel"]) + p["value/bias"][None, :, None, :]
    w = softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]))
    return np.einsum("bhtk,hkd->btd", w @ v, p["out/kernel"]) + p["out/bias"]


def _flax_mlp(p, x):
    return gelu(x @ p["Dense_0/kernel"] + p["Dense_0/bias"], True) @ p["Dense_1/kernel"] + p["Dense_1/bias"]


def _sub(params, prefix):
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def big_vision_forward(params, images, *, pool_type, include_head=True):
    """big_vision's `_Model.__call__` (posemb "learn" when `pos_embedding` is present, else
    "sincos2d") on its own flat '/'-joined parameters (per-layer blocks), in float64: patch
    embedding, position embedding on the patch grid, then the class token ("tok"), the encoder
    (Flax counters per class: LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1,
    MlpBlock_0), pooling ("tok", "gap", "map", "0", "none"), `pre_logits` (Dense + tanh) and
    `head`. LayerNorm eps 1e-6 and flax.linen's tanh GELU, as flax's defaults are."""
    t = {k: np.asarray(v, np.float64) for k, v in params.items()}
    x = conv2d(np.asarray(images, np.float64), t["embedding/kernel"], t["embedding/kernel"].shape[0], "VALID")
    x = x + t["embedding/bias"]
    b, h, w, d = x.shape
    x = x.reshape(b, h * w, d)
    x = x + (t["pos_embedding"] if "pos_embedding" in t else sincos2d(h, w, d)[None])
    if pool_type == "tok":
        x = np.concatenate([np.broadcast_to(t["cls"], (b, 1, d)), x], axis=1)
    depth = len({k.split("/")[1] for k in t if k.startswith("Transformer/encoderblock_")})
    for i in range(depth):
        p = _sub(t, f"Transformer/encoderblock_{i}/")
        y = layer_norm(x, p["LayerNorm_0/scale"], p["LayerNorm_0/bias"], 1e-6)
        x = x + _flax_attention(_sub(p, "MultiHeadDotProductAttention_0/"), y, y)
        y = layer_norm(x, p["LayerNorm_1/scale"], p["LayerNorm_1/bias"], 1e-6)
        x = x + _flax_mlp(_sub(p, "MlpBlock_0/"), y)
    x = layer_norm(x, t["Transformer/encoder_norm/scale"], t["Transformer/encoder_norm/bias"], 1e-6)
    if pool_type == "map":
        m = _sub(t, "MAPHead_0/")
        probe = np.broadcast_to(m["probe"], (b, 1, d))
        x = _flax_attention(_sub(m, "MultiHeadDotProductAttention_0/"), probe, x)
        y = layer_norm(x, m["LayerNorm_0/scale"], m["LayerNorm_0/bias"], 1e-6)
        x = (x + _flax_mlp(_sub(m, "MlpBlock_0/"), y))[:, 0]
    elif pool_type == "gap":
        x = x.mean(axis=1)
    elif pool_type in ("0", "tok"):
        x = x[:, 0]
    elif pool_type != "none":
        raise ValueError(pool_type)
    if "pre_logits/kernel" in t:
        x = np.tanh(x @ t["pre_logits/kernel"] + t["pre_logits/bias"])
    if include_head:
        x = x @ t["head/kernel"] + t["head/bias"]
    return x
