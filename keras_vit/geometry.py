"""Image geometry every layer of the package shares, free of Keras and TensorFlow: the one
normalisation of a size to (height, width), and the names of the position-embedding resize rules
(`keras_vit.layers.resize` implements them; model configs name them and are checked without Keras)."""

#: The rules that resize a position embedding to another grid (`keras_vit.layers.resize`), each an
#: upstream framework's: a converted model uses its source's rule to reproduce it.
RESIZE_RULES = (
    "original",  # google-research/vision_transformer: linear, corners aligned (ndimage.zoom order=1)
    "bilinear",  # half-pixel bilinear (timm's .npz loader, align_corners=False)
    "bicubic",  # half-pixel bicubic, a=-0.75 (transformers' interpolate_pos_encoding)
    "bicubic_antialias",  # half-pixel bicubic with antialias, a=-0.5 (timm's resample_abs_pos_embed)
)


def as_pair(size, what="image_size"):
    """An int or (height, width) as a (height, width) tuple of ints: the one place sizes are normalised.

    Example:
        >>> as_pair(224), as_pair([160, 320])
        ((224, 224), (160, 320))
    """
    if isinstance(size, bool):
        raise ValueError(f"{what} must be an int or (height, width); got {size!r}.")
    if isinstance(size, int) or getattr(size, "ndim", None) == 0 or (
            hasattr(size, "__index__") and not hasattr(size, "__len__")):
        return int(size), int(size)
    try:
        pair = tuple(int(s) for s in size)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be an int or (height, width); got {size!r}.") from None
    if len(pair) != 2:
        raise ValueError(f"{what} must be an int or (height, width); got {size!r}.")
    return pair


def positive_pair(size, what="image_size"):
    """`as_pair(size)` whose sides are positive ints, else a ValueError naming `what`.

    Example:
        >>> positive_pair(224), positive_pair((160, 320))
        ((224, 224), (160, 320))
    """
    try:
        pair = as_pair(size, what)
        sides = size if hasattr(size, "__len__") else [size]
        exact = all(hasattr(s, "__index__") and not isinstance(s, bool) for s in sides)
    except (TypeError, ValueError):
        pair, exact = None, False
    if pair is None or not exact or min(pair) < 1:
        raise ValueError(f"{what} must be a positive int or (height, width) of positive ints, e.g. 224 or (224, 384); "
                         f"got {size!r}.")
    return pair


def input_size(size, what="image_size"):
    """An input size as (height, width), where None (a dimension, or the whole size) is any size: the
    one normalisation of the image size of a model that takes any size (convolutional ones).

    Example:
        >>> input_size(64), input_size(None), input_size([None, 96])
        ((64, 64), (None, None), (None, 96))
    """
    if size is None:
        return None, None
    try:
        if hasattr(size, "__len__") and not isinstance(size, (str, bytes)) and len(size) == 2 and None in tuple(size):
            return tuple(None if s is None else positive_pair(s, what)[0] for s in size)
        return positive_pair(size, what)
    except ValueError:
        raise ValueError(f"{what} must be an int, (height, width) of positive ints or None (any size); "
                         f"got {size!r}.") from None


def optional_pair(size, what="image_size"):
    """`as_pair(size)`, or None for None (a size left to the model or the checkpoint).

    Example:
        >>> optional_pair(None), optional_pair(384)
        (None, (384, 384))
    """
    return None if size is None else as_pair(size, what)
