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

from keras_vit.geometry import positive_pair
from keras_vit.models.config import FieldGroupConfig
from keras_vit.models.family import constructor_names, family_of, get_architecture

#: Images in JFT-300M as the paper counts them for Table 6.
JFT_IMAGES = 303e6


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
            f"flops() takes a constructor name (e.g. 'ViTB16', 'BiTResNet50x1'), an architecture row, a keras_vit "
            f"model or its config object; got {type(model_or_architecture).__name__}."
        )
    if hasattr(obj, "kwargs") and not hasattr(obj, "get_config"):  # an architecture row
        return family, obj.kwargs(), None
    if isinstance(obj, FieldGroupConfig):  # a model's config object (what the readers give)
        return _from_config(family, obj)
    if not hasattr(obj, "get_config") or family.class_name not in {c.__name__ for c in type(obj).__mro__}:
        raise TypeError(
            f"flops() counts keras_vit models themselves; a {type(obj).__name__} wrapping one is not counted. "
            "Pass the wrapped model or its constructor name."
        )
    return _from_config(family, obj.config)


def _from_config(family, config):
    """(family, config, default image size) of a config object: sizes are (height, width) pairs,
    a None dimension takes any size; a headless config counts no head."""
    size = None if None in config.image_size else config.image_size
    return family, dict(config, classes=(config.classes or 0) if config.include_top else 0), size


def flops(model_or_architecture, image_size=None, classes=None):
    """Forward FLOPs per image (2 per multiply-add; matmuls, attention and convolutions).

    Args:
        model_or_architecture: a constructor name ("ViTB16", "R50ViTB32", "BiTResNet152x2",
            "AxialViTB16", ...), a row of an architecture table, a keras_vit model or its config
            object (`model.config`, `read_checkpoint(path)[1]`).
        image_size: int or (height, width), positive; default the model's input size, 224 for
            a name.
        classes: head size; default the model's (none when include_top=False), 1000 for a name.

    Example:
        >>> round(flops("ViTL16") / 1e9, 1), round(flops("BiTResNet50x1") / 1e9, 2)
        (123.1, 8.18)
    """
    family, config, own_size = _describe(model_or_architecture)
    size = positive_pair(image_size if image_size is not None else own_size or 224)
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
