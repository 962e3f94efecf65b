"""The architecture tables, the model families (`family_of`), every family's model class
(VisionTransformer, BiTResNet, AxialVisionTransformer, ...) and the canonical weight tree."""

from keras_vit.models.bit_family import BIT_ARCHITECTURES, BIT_NUMERICS, BiTArchitecture, BiTConfig
from keras_vit.models.config import NUMERICS
from keras_vit.models.family import ModelFamily, families, family_of, get_architecture
from keras_vit.models.vit_family import (
    ARCHITECTURES,
    EXTRA_ARCHITECTURES,
    POSITION_EMBEDDINGS,
    Architecture,
    ViTConfig,
)

#: Names imported on first use, so that reading the architecture table does not load Keras (every
#: family's model class is one of them).
_LAZY = {
    "VisionTransformer": "keras_vit.models.vit",
    "WeightTreeError": "keras_vit.models.weight_tree",
    "get_weight_tree": "keras_vit.models.weight_tree",
    "set_weight_tree": "keras_vit.models.weight_tree",
    "weight_variables": "keras_vit.models.weight_tree",
    "TokensToGrid": "keras_vit.models.features",
    "feature_extractor": "keras_vit.models.features",
}


def _model_classes():
    return {f.class_name: f.model.split(":", 1)[0] for f in families()}


def __getattr__(name):
    if name not in _LAZY and name in _model_classes():
        _LAZY[name] = _model_classes()[name]
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_model_classes()))
