"""keras.applications-style constructors: `keras_vit.ViTB16(weights="imagenet")`.

A thin face over models/ (the architecture tables, the model families) and checkpoints/
(weights), so that `weights=` can load while models/ stays below checkpoints/. One factory,
`build_application`, serves every family: what differs (the model class, the arguments a
constructor may override, how a size known only at run time is built, the docstring) is asked
of the family record (`keras_vit.models.family`).
"""

import keras

from keras_vit import imagenet
from keras_vit.models.config import UnknownArgumentError, suggest, without_head
from keras_vit.models.family import families, family_of, get_architecture, input_normalization_of


def preprocess_input(images, data_format=None, *, model=None):
    """Scale uint8 / [0, 255] images to the input a model takes: [-1, 1] (the original ViT
    checkpoints' range) without `model`; with `model`, the normalisation its weights expect:
    its own (`config.input_normalization`: CLIP's, DINOv2's ImageNet statistics from timm's
    pretrained_cfg), else its family's (ImageNet's mean and std for EfficientNet and
    AxialResNet, [-1, 1] for ViT and BiT).

    Args:
        images: array or tensor of pixel values in [0, 255] (any shape, channels last).
        data_format: accepted for keras.applications compatibility; scaling is per pixel, so the
            layout does not matter.
        model: a keras_vit model (any family), or None. A model of no keras_vit family is scaled by
            its `config.input_normalization` if it has one, else to [-1, 1].

    Returns:
        float32 values (a NumPy array for NumPy input, else a backend tensor).

    Example:
        >>> import numpy as np
        >>> preprocess_input(np.array([0, 127.5, 255]))
        array([-1.,  0.,  1.], dtype=float32)
    """
    normalization = None
    if model is not None:
        try:
            normalization = input_normalization_of(model)
        except ValueError:  # not a keras_vit model: its config's normalisation, if any
            normalization = None
    return imagenet.preprocess_input(images, data_format, model=model, normalization=normalization)


def _image_size(input_shape, input_tensor, default=(224, 224)):
    """((height, width) or None for a size known only at run time, channels); `default` without
    an input shape."""
    if input_tensor is not None and input_shape is None:
        input_shape = tuple(input_tensor.shape[1:])
    if input_shape is None:
        return tuple(default), 3
    shape = tuple(input_shape)
    if len(shape) == 2:
        shape = shape + (3,)
    if len(shape) != 3 or shape[2] is None:
        raise ValueError(
            f"input_shape must be (height, width, channels), e.g. (224, 224, 3), or (None, None, 3) for any "
            f"size at run time; got {input_shape!r}."
        )
    return tuple(None if s is None else int(s) for s in shape[:2]), int(shape[2])


def _size_arguments(family, arch, image_size, weights):
    """The model arguments that set the input size (`image_size` may hold None dimensions)."""
    if image_size is not None and None not in image_size:
        return dict(image_size=image_size)
    if family.dynamic_size == "native":  # fully convolutional: None dimensions as they are
        return dict(image_size=image_size)
    if family.dynamic_size == "flag":
        # Any size at run time: the position embeddings stay laid out on the weights' grid (the
        # checkpoint's, or 224 for a new model) and follow each batch's grid in the graph.
        return dict(dynamic_image_size=True, image_size=None if weights is not None else (224, 224))
    raise ValueError(
        f"{arch.name} ({family.title}) is built for one input size: pass input_shape=(height, width, 3) with both "
        f"sizes, e.g. (224, 224, 3). Sizes known only at run time are not supported by this family."
    )


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
    """Build the constructor `architecture` (a constructor name of any family) as
    keras.applications does."""
    arch = get_architecture(architecture)
    family = family_of(arch)
    allowed = family.overrides()
    unknown = [k for k in overrides if k not in allowed]
    if unknown:
        fields = set(family.config_class.fields())
        hint = "; ".join(
            f"{u!r} (the constructor sets it)" if u in fields else f"{u!r}{suggest(u, allowed)}" for u in unknown
        )
        raise UnknownArgumentError(
            f"Unknown override(s) for {architecture}: {hint}. Valid overrides: {', '.join(sorted(allowed))}."
        )
    # A row may name its own default input size (`default_size`, e.g. the resolution its weights
    # were trained at); otherwise 224.
    image_size, channels = _image_size(input_shape, input_tensor, getattr(arch, "default_size", (224, 224)))
    kwargs = dict(arch.kwargs())
    kwargs.update(overrides)
    kwargs.update(_size_arguments(family, arch, image_size, weights))
    kwargs.update(
        num_channels=channels,
        include_top=include_top,
        pooling=pooling,
        classes=classes,
        classifier_activation=classifier_activation,
        name=name or arch.name.lower(),
    )
    kwargs = without_head(family.config_class, kwargs)  # classes=0: no head, pooled features
    if weights is None:
        model = family.build(**kwargs)
    else:
        from keras_vit.loading import load

        if kwargs.get("image_size") is None:
            kwargs.pop("image_size", None)
        # What the weights state (the row's variant too: timm's zoo rows' switches, numerics and input
        # normalisation) is read from the checkpoint.
        stated = set(family.checkpoint_fields) | {k for k, _ in getattr(arch, "variant", ())}
        for key in arch.kwargs():
            if key not in stated:  # a training default of the row (dropout): kept
                continue
            if key != "patch_size" or "patch_size" not in overrides:  # patch_size=: run at another patch size
                kwargs.pop(key, None)  # the checkpoint states the architecture; load() checks it is `arch`
        model = load(weights, architecture=arch, **kwargs)
    if input_tensor is not None:
        inputs = keras.utils.get_source_inputs(input_tensor)
        outputs = model(input_tensor)
        return keras.Model(inputs, outputs, name=model.name)
    return model


def _make_constructor(family, arch):
    # A row may name its own default weights (timm's zoo: DINOv2's "lvd142m"); otherwise "imagenet".
    default_weights = getattr(arch, "default_weights", "imagenet")

    def constructor(
        include_top=True,
        weights=default_weights,
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
    constructor.__doc__ = family.constructor_docstring(arch)
    return constructor


def constructor_of(name):
    """The `keras_vit.<name>` constructor of any registered family, also one that
    `register_family` added after keras_vit was imported (`keras_vit.<Name>` finds those here).

    Raises:
        AttributeError when no registered family has a constructor called `name`.
    """
    for family in families():
        if name in family.architectures:
            made = CONSTRUCTORS_BY_FAMILY.get(family.name, {}).get(name)
            return made if made is not None else _make_constructor(family, family.architectures[name])
    raise AttributeError(f"No registered family has a constructor {name!r}.")


#: {family name: {constructor name: constructor}} of every family registered when keras_vit is imported.
CONSTRUCTORS_BY_FAMILY = {
    family.name: {name: _make_constructor(family, arch) for name, arch in family.architectures.items()}
    for family in families()
}
#: Every constructor of every family. (A family's own: `CONSTRUCTORS_BY_FAMILY[family.name]`; the
#: arguments its constructors' `**overrides` may set: `family.overrides()`.)
ALL_CONSTRUCTORS = {name: c for table in CONSTRUCTORS_BY_FAMILY.values() for name, c in table.items()}
globals().update(ALL_CONSTRUCTORS)

__all__ = ["build_application", "constructor_of", *ALL_CONSTRUCTORS]
