"""Compute, counted from the config: forward FLOPs per image and the paper's pre-training exaFLOPs.

The convention of the paper's Table 6: every matmul and convolution counts 2 FLOPs per
multiply-add, attention's QK^T and AV included; norms, activations, softmax, pooling and
additions are left out. Pre-training costs 3x the forward pass (forward + backward) per image
per epoch, at 224 px, with JFT-300M's 303M images.

    >>> round(flops("ViTB16") / 1e9, 1)
    35.1
    >>> round(pretraining_exaflops("ViTB16", epochs=7))
    224
"""

from keras_vit.models.config import get_architecture, resnet_stride
from keras_vit.models.family import constructor_names, family_of

#: Images in JFT-300M as the paper counts them for Table 6.
JFT_IMAGES = 303e6


def _pair(image_size):
    if isinstance(image_size, int):
        return image_size, image_size
    h, w = (int(s) for s in image_size)
    return h, w


def _conv(h, w, kernel, c_in, c_out):
    """FLOPs of a convolution producing an (h, w, c_out) map."""
    return 2 * h * w * kernel * kernel * c_in * c_out


# === BiT ResNets ===


def _sym(n, kernel, stride):
    return (n + 2 * ((kernel - 1) // 2) - kernel) // stride + 1


def _same(n, stride):
    return -(-n // stride)


def _resnet_flops(h, w, units, width_factor, channels, preact):
    """The ResNet trunk: the 7x7/2 root, the 3x3/2 pool, bottleneck stages (stride on the 3x3).
    `preact` (BiT baselines) pads symmetrically; the hybrids pad TF-SAME. Same convolutions."""
    root = int(64 * width_factor)
    out = (lambda n, k, s: _sym(n, k, s)) if preact else (lambda n, k, s: _same(n, s))
    h, w = out(h, 7, 2), out(w, 7, 2)
    total = _conv(h, w, 7, channels, root)
    h, w = (_sym(h, 3, 2), _sym(w, 3, 2)) if preact else (_same(h, 2), _same(w, 2))
    c = root
    for i, n in enumerate(units):
        f = root * 2**i
        for u in range(n):
            stride = 2 if (i > 0 and u == 0) else 1
            ho, wo = out(h, 3, stride), out(w, 3, stride)
            total += _conv(h, w, 1, c, f)  # conv1 / a
            total += _conv(ho, wo, 3, f, f)  # conv2 / b (the stride)
            total += _conv(ho, wo, 1, f, 4 * f)  # conv3 / c
            if c != 4 * f or stride != 1:
                total += _conv(ho, wo, 1, c, 4 * f)  # projection
            h, w, c = ho, wo, 4 * f
    return total, (h, w, c)


def bit_flops(config, image_size, classes):
    """Forward FLOPs of a BiT ResNet-v2 `config` (BiTResNet arguments) at `image_size` (h, w)."""
    h, w = image_size
    units, width_factor = tuple(config["block_units"]), config["width_factor"]
    total, (_, _, c) = _resnet_flops(h, w, units, width_factor, config.get("num_channels", 3), preact=True)
    return total + (2 * c * classes if classes else 0)


# === Vision Transformers ===


def attention_flops(tokens, hidden, mlp_dim, relative=False):
    """One pre-LN Transformer block over `tokens` tokens: q/k/v and out projections, QK^T, AV and
    the MLP; with `relative`, the logits of every query against the 2 * tokens - 1 offset
    embeddings (the paper's 1-D relative attention)."""
    t, d, m = tokens, hidden, mlp_dim
    total = (
        2 * t * d * 3 * d  # query, key, value
        + 2 * t * t * d  # QK^T
        + 2 * t * t * d  # AV
        + 2 * t * d * d  # out projection
        + 2 * 2 * t * d * m  # MLP
    )
    if relative:
        total += 2 * t * (2 * t - 1) * d  # q . r[offset] for every offset
    return total


def map_head_flops(tokens, hidden, mlp_dim):
    """big_vision's MAP head: one learned probe attends over `tokens` tokens (its query and out
    projections for one token, key and value for all), then an MLP on the probe."""
    t, d, m = tokens, hidden, mlp_dim
    return 2 * d * d + 2 * 2 * t * d * d + 2 * t * d + 2 * t * d + 2 * d * d + 2 * 2 * d * m


def vit_flops(config, image_size, classes):
    """Forward FLOPs of a VisionTransformer `config` (its arguments) at `image_size` (h, w)."""
    h, w = image_size
    stride = config["patch_size"] * resnet_stride(config.get("resnet"))
    if h % stride or w % stride:
        raise ValueError(f"Image size {(h, w)} is not divisible by the architecture's stride {stride}.")
    channels = config.get("num_channels", 3)
    total = 0
    resnet = config.get("resnet")
    if resnet is not None:
        units, width_factor = resnet
        trunk, (h, w, channels) = _resnet_flops(h, w, tuple(units), width_factor, channels, preact=False)
        total += trunk
    p, d = config["patch_size"], config["hidden_size"]
    gh, gw = h // p, w // p
    tokens = gh * gw
    total += _conv(gh, gw, p, channels, d)  # patch embedding
    classifier = config.get("classifier", "token")
    t = tokens + (1 if classifier == "token" else 0)
    m = config["mlp_dim"]
    relative = config.get("position_embedding") == "relative"
    total += config["num_layers"] * attention_flops(t, d, m, relative)
    # The read-out runs with a head, or when a headless model pools (pooling= given).
    if not (classes or config.get("pooling") is not None):
        return total
    mode = {None: classifier, "avg": "gap"}.get(config.get("pooling"), config.get("pooling"))
    if mode == "map":
        total += map_head_flops(t, d, m)
    rep = config.get("representation_size")
    heads = t if mode == "none" else 1  # "none": pre_logits and the head on every token
    if rep:
        total += heads * 2 * d * rep
        d = rep
    if classes:
        total += heads * 2 * d * classes
    return total


# === Public API ===


def _describe(model_or_architecture):
    """(family, config, default image size) of a constructor name, a table row or a keras_vit model."""
    obj = model_or_architecture
    if isinstance(obj, str):
        obj = get_architecture(obj)
    try:
        family = family_of(obj)
    except ValueError:
        family = None
    if family is None or isinstance(obj, dict):
        raise TypeError(
            f"flops() takes a constructor name (e.g. 'ViTB16', 'BiTResNet50x1'), an architecture row or a keras_vit "
            f"model; got {type(model_or_architecture).__name__}."
        )
    if hasattr(obj, "kwargs") and not hasattr(obj, "get_config"):  # an architecture row
        return family, obj.kwargs(), None
    if not hasattr(obj, "get_config") or family.class_name not in {c.__name__ for c in type(obj).__mro__}:
        raise TypeError(
            f"flops() counts keras_vit models themselves; a {type(obj).__name__} wrapping one is not counted. "
            "Pass the wrapped model or its constructor name."
        )
    config = obj.get_config()
    size = config.get("image_size")
    size = None if size is None or None in tuple(size) else tuple(size)
    classes = config["classes"] if config.get("include_top", True) else 0
    return family, dict(config, classes=classes), size


def _check_size(image_size):
    """(height, width) of positive ints, or a ValueError that says what is wrong."""
    pair = (image_size, image_size) if isinstance(image_size, int) and not isinstance(image_size, bool) else image_size
    try:
        ok = len(pair) == 2 and all(
            isinstance(s, int) and not isinstance(s, bool) or hasattr(s, "__index__") and not isinstance(s, bool)
            for s in pair
        )
    except TypeError:
        ok = False
    if not ok or any(int(s) < 1 for s in pair):
        raise ValueError(
            f"image_size must be a positive int or (height, width) of positive ints, e.g. 224 or (224, 384); got "
            f"{image_size!r}."
        )
    return int(pair[0]), int(pair[1])


def flops(model_or_architecture, image_size=None, classes=None):
    """Forward FLOPs per image (2 per multiply-add; matmuls, attention and convolutions).

    Args:
        model_or_architecture: a constructor name ("ViTB16", "R50ViTB32", "BiTResNet152x2",
            "AxialViTB16", ...), a row of an architecture table, or a keras_vit model.
        image_size: int or (height, width), positive; default the model's input size, 224 for
            a name.
        classes: head size; default the model's (none when include_top=False), 1000 for a name.

    Example:
        >>> round(flops("ViTL16") / 1e9, 1), round(flops("BiTResNet50x1") / 1e9, 2)
        (123.1, 8.18)
    """
    family, config, own_size = _describe(model_or_architecture)
    size = _check_size(image_size if image_size is not None else own_size or 224)
    if classes is None:
        classes = config.get("classes", 1000)
    return family.count_flops(config, size, classes)


def pretraining_exaflops(architecture, epochs, images=JFT_IMAGES, image_size=224):
    """Pre-training compute in exaFLOPs as the paper's Table 6 counts it: 3 x forward FLOPs per
    image x images x epochs (JFT-300M: 303M images, at 224 px).

    Example:
        >>> round(pretraining_exaflops("ViTH14", epochs=14))
        4262
    """
    return 3 * flops(architecture, image_size) * images * epochs / 1e18


def constructor_table():
    """Markdown table of every constructor: parameters (1000 classes, 224 px) and forward GFLOPs.
    Builds each model once (without random initialisation) to count its parameters."""
    import keras

    from keras_vit import applications
    from keras_vit.layers.init_scope import skip_random_init

    lines = ["| constructor | model | parameters | GFLOPs (224 px) |", "|---|---|---:|---:|"]
    for name in constructor_names():
        with skip_random_init():
            params = getattr(applications, name)(weights=None).count_params()
        keras.utils.clear_session(free_memory=True)
        lines.append(f"| `{name}` | {get_architecture(name).paper_name} | {params:,} | {flops(name) / 1e9:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m keras_vit.flops: the README's table of constructors
    print(constructor_table())
