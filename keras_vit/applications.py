"""keras.applications-style constructors: `keras_vit.ViTB16(weights="imagenet")`.

A thin face over models/ (the architecture table and builder) and checkpoints/ (weights), so
that `weights=` can load while models/ stays below checkpoints/.
"""

import keras

from keras_vit.models.bit import BiTResNet
from keras_vit.models.config import ARCHITECTURES, BIT_ARCHITECTURES, TABLE_FIELDS, UnknownArgumentError, ViTConfig, get_architecture, suggest
from keras_vit.models.vit import VisionTransformer

_DOC = """Instantiates the {paper_name} architecture{hybrid}.

Reference: "An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale"
(Dosovitskiy et al., ICLR 2021). Hidden size {hidden_size}, {num_layers} layers, {num_heads} heads,
MLP {mlp_dim}, {stride}x{stride} input pixels per token.

Inputs are channels-last images scaled to [-1, 1] (see `keras_vit.preprocess_input`).

Args:
    include_top: whether to end in the classification head.
    weights: None (random initialisation), a preset tag (e.g. "augreg_in21k_ft_in1k",
        "augreg_in21k", "orig_in21k"; aliases "imagenet" and "imagenet21k"; see
        `keras_vit.list_presets("{name}")`), a local checkpoint path, or "hf://owner/repo".
    input_tensor: optional Keras tensor to use as the image input.
    input_shape: (height, width, 3); default (224, 224, 3). Any size that {stride} divides,
        square or not; pretrained position embeddings are resized to it. (None, None, 3)
        builds a model for any such size at run time: its position embeddings are
        interpolated inside the graph to each batch's grid, with the weights' own rule.
    pooling: with include_top=False: None returns the token sequence after the final
        LayerNorm; "token", "gap"/"avg" or "max" pool it to (batch, {hidden_size}).
    classes: classes of the head. With pretrained weights, a value other than the checkpoint's
        attaches a fresh zero-initialised head.
    classifier_activation: activation of the head; None returns logits.
    name: model name.
    **overrides: other `keras_vit.VisionTransformer` arguments (dropout_rate,
        attention_dropout_rate, representation_size, numerics fields, ...). `patch_size`
        with pretrained weights runs them at another patch size (FlexiViT's PI-resize of the
        patch embedding; see `keras_vit.load_checkpoint`).

Returns:
    A `keras_vit.VisionTransformer` (a `keras.Model`).

Example:
    >>> model = keras_vit.{name}(weights=None, input_shape=(224, 224, 3))
"""

# Arguments an override may not set: the constructor owns them (its table row and input shape)
# or takes them as its own arguments. `classifier` stays overridable (e.g. a gap variant).
_OWNED = (*(f for f in TABLE_FIELDS if f not in ("classifier", "patch_size")), "image_size", "num_channels",
          "dynamic_image_size")
_OWN_ARGUMENTS = ("include_top", "pooling", "classes", "classifier_activation", "name")
#: The VisionTransformer arguments `**overrides` may set.
OVERRIDES = tuple(f for f in (*ViTConfig.fields(), "dtype", "trainable") if f not in _OWNED + _OWN_ARGUMENTS)


def _image_size(input_shape, input_tensor):
    """(image_size, channels): image_size None for a size known only at run time."""
    if input_tensor is not None and input_shape is None:
        input_shape = tuple(input_tensor.shape[1:])
    if input_shape is None:
        return (224, 224), 3
    shape = tuple(input_shape)
    if len(shape) == 2:
        shape = shape + (3,)
    if len(shape) != 3 or shape[2] is None:
        raise ValueError(
            f"input_shape must be (height, width, channels), e.g. (224, 224, 3), or (None, None, 3) for any "
            f"size at run time; got {input_shape!r}."
        )
    if any(s is None for s in shape[:2]):
        return None, int(shape[2])
    return (int(shape[0]), int(shape[1])), int(shape[2])


def build_application(
    architecture,
    include_top=True,
    weights="imagenet",
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=1000,
    classifier_activation="softmax",
    name=None,
    **overrides,
):
    """Build the constructor `architecture` (a name of the config table) as keras.applications does."""
    arch = get_architecture(architecture)
    unknown = [k for k in overrides if k not in OVERRIDES]
    if unknown:
        hint = "; ".join(
            f"{u!r} (the constructor sets it)" if u in _OWNED else f"{u!r}{suggest(u, OVERRIDES)}" for u in unknown
        )
        raise UnknownArgumentError(
            f"Unknown override(s) for {architecture}: {hint}. Valid overrides: {', '.join(sorted(OVERRIDES))}."
        )
    image_size, channels = _image_size(input_shape, input_tensor)
    kwargs = dict(arch.kwargs())
    kwargs.update(overrides)
    if image_size is None:
        # Any size at run time: the position embeddings stay laid out on the weights' grid (the
        # checkpoint's, or 224 for a new model) and follow each batch's grid in the graph.
        kwargs.update(dynamic_image_size=True)
    kwargs.update(
        image_size=image_size if image_size is not None or weights is not None else (224, 224),
        num_channels=channels,
        include_top=include_top,
        pooling=pooling,
        classes=classes,
        classifier_activation=classifier_activation,
        name=name or arch.name.lower(),
    )
    if weights is None:
        model = VisionTransformer(**kwargs)
    else:
        from keras_vit.loading import load

        for key in arch.kwargs():
            if key != "patch_size" or "patch_size" not in overrides:  # patch_size=: run at another patch size
                kwargs.pop(key, None)  # the checkpoint states the architecture; load() checks it is `arch`
        model = load(weights, architecture=arch, **kwargs)
    if input_tensor is not None:
        inputs = keras.utils.get_source_inputs(input_tensor)
        outputs = model(input_tensor)
        return keras.Model(inputs, outputs, name=model.name)
    return model


def _make_constructor(arch):
    def constructor(
        include_top=True,
        weights="imagenet",
        input_tensor=None,
        input_shape=None,
        pooling=None,
        classes=1000,
        classifier_activation="softmax",
        name=None,
        **overrides,
    ):
        return build_application(
            arch.name,
            include_top=include_top,
            weights=weights,
            input_tensor=input_tensor,
            input_shape=input_shape,
            pooling=pooling,
            classes=classes,
            classifier_activation=classifier_activation,
            name=name,
            **overrides,
        )

    constructor.__name__ = constructor.__qualname__ = arch.name
    constructor.__doc__ = _DOC.format(
        paper_name=arch.paper_name,
        hybrid=" (ViT on a BiT ResNet)" if arch.resnet is not None else "",
        stride=arch.stride,
        **{k: getattr(arch, k) for k in ("name", "hidden_size", "num_layers", "num_heads", "mlp_dim")},
    )
    return constructor


CONSTRUCTORS = {name: _make_constructor(arch) for name, arch in ARCHITECTURES.items()}
globals().update(CONSTRUCTORS)


# === The paper's CNN baselines: BiT ResNet-v2 ===

_BIT_DOC = """Instantiates the BiT {paper_name} architecture, one of the paper's CNN baselines.

Reference: "Big Transfer (BiT): General Visual Representation Learning" (Kolesnikov et al.,
ECCV 2020), compared against in "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021).
A pre-activation ResNet-v2 with GroupNorm and weight-standardised convolutions: units per stage
{block_units}, width x{width_factor}.{unreleased}

Inputs are channels-last images scaled to [-1, 1] (see `keras_vit.preprocess_input`).

Args:
    include_top: whether to end in the classification head (GN+ReLU, average pool, 1x1 conv).
    weights: None (random initialisation), a preset tag (see `keras_vit.list_presets("{name}")`;
        aliases "imagenet" and "imagenet21k"), a local checkpoint path (a timm folder or
        .safetensors, a BiT .npz, a Keras preset), or "hf://owner/repo".
    input_tensor: optional Keras tensor to use as the image input.
    input_shape: (height, width, 3); default (224, 224, 3). Any size, also (None, None, 3): the
        network is fully convolutional.
    pooling: with include_top=False: None returns the (batch, h, w, channels) features; "avg" or
        "max" pool them to (batch, channels).
    classes: classes of the head. With pretrained weights, a value other than the checkpoint's
        attaches a fresh zero-initialised head.
    classifier_activation: activation of the head; None returns logits.
    name: model name.
    **overrides: other `keras_vit.models.BiTResNet` arguments (numerics fields, dtype).

Returns:
    A `keras_vit.models.BiTResNet` (a `keras.Model`).

Example:
    >>> model = keras_vit.{name}(weights=None, input_shape=(224, 224, 3))
"""


def _bit_image_size(input_shape, input_tensor):
    if input_tensor is not None and input_shape is None:
        input_shape = tuple(input_tensor.shape[1:])
    if input_shape is None:
        return (224, 224), 3
    shape = tuple(input_shape)
    if len(shape) == 2:
        shape = shape + (3,)
    if len(shape) != 3 or shape[2] is None:
        raise ValueError(f"input_shape must be (height, width, channels); got {input_shape!r}.")
    return tuple(None if s is None else int(s) for s in shape[:2]), int(shape[2])


def build_bit_application(
    architecture,
    include_top=True,
    weights="imagenet",
    input_tensor=None,
    input_shape=None,
    pooling=None,
    classes=1000,
    classifier_activation="softmax",
    name=None,
    **overrides,
):
    """Build the BiT constructor `architecture` (a name of the BiT table) as keras.applications does."""
    arch = BIT_ARCHITECTURES[architecture]
    allowed = set(BiTResNet.__init__.__kwdefaults__) - {
        "block_units", "width_factor", "image_size", "include_top", "pooling", "classes", "classifier_activation", "name"
    }
    unknown = sorted(set(overrides) - allowed)
    if unknown:
        raise ValueError(
            f"Unknown override(s) for {architecture}: {', '.join(map(repr, unknown))}. "
            f"Valid overrides: {', '.join(sorted(allowed))}."
        )
    image_size, channels = _bit_image_size(input_shape, input_tensor)
    kwargs = dict(arch.kwargs())
    kwargs.update(overrides)
    kwargs.update(
        image_size=image_size,
        num_channels=channels,
        include_top=include_top,
        pooling=pooling,
        classes=classes,
        classifier_activation=classifier_activation,
        name=name or arch.name.lower(),
    )
    if weights is None:
        model = BiTResNet(**kwargs)
    else:
        from keras_vit.loading import load

        for key in arch.kwargs():
            kwargs.pop(key, None)  # the checkpoint states the architecture; load() checks it is `arch`
        model = load(weights, architecture=arch, **kwargs)
    if input_tensor is not None:
        inputs = keras.utils.get_source_inputs(input_tensor)
        outputs = model(input_tensor)
        return keras.Model(inputs, outputs, name=model.name)
    return model


def _make_bit_constructor(arch):
    def constructor(
        include_top=True,
        weights="imagenet",
        input_tensor=None,
        input_shape=None,
        pooling=None,
        classes=1000,
        classifier_activation="softmax",
        name=None,
        **overrides,
    ):
        return build_bit_application(
            arch.name,
            include_top=include_top,
            weights=weights,
            input_tensor=input_tensor,
            input_shape=input_shape,
            pooling=pooling,
            classes=classes,
            classifier_activation=classifier_activation,
            name=name,
            **overrides,
        )

    constructor.__name__ = constructor.__qualname__ = arch.name
    constructor.__doc__ = _BIT_DOC.format(
        name=arch.name,
        paper_name=arch.paper_name.replace(" (BiT)", ""),
        block_units=arch.block_units,
        width_factor=arch.width_factor,
        unreleased="" if arch.timm_name else " Its weights were never released: weights=None only.",
    )
    return constructor


BIT_CONSTRUCTORS = {name: _make_bit_constructor(arch) for name, arch in BIT_ARCHITECTURES.items()}
globals().update(BIT_CONSTRUCTORS)

__all__ = ["build_application", "build_bit_application", *CONSTRUCTORS, *BIT_CONSTRUCTORS]
