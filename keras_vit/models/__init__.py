"""The architecture table, the VisionTransformer and BiTResNet builders and the canonical weight tree."""

from keras_vit.models.config import (
    ARCHITECTURES,
    BIT_ARCHITECTURES,
    BIT_NUMERICS,
    EXTRA_ARCHITECTURES,
    NUMERICS,
    POSITION_EMBEDDINGS,
    Architecture,
    BiTArchitecture,
    ViTConfig,
    get_architecture,
)

#: Names imported on first use, so that reading the architecture table does not load Keras.
_LAZY = {
    "BiTResNet": "keras_vit.models.bit",
    "VisionTransformer": "keras_vit.models.vit",
    "WeightTreeError": "keras_vit.models.weight_tree",
    "get_weight_tree": "keras_vit.models.weight_tree",
    "set_weight_tree": "keras_vit.models.weight_tree",
    "weight_variables": "keras_vit.models.weight_tree",
    "TokensToGrid": "keras_vit.models.features",
    "feature_extractor": "keras_vit.models.features",
}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
