"""The architecture table, the VisionTransformer and BiTResNet builders and the canonical weight tree."""

from keras_vit.models.bit import BiTResNet
from keras_vit.models.config import (
    ARCHITECTURES,
    BIT_ARCHITECTURES,
    BIT_NUMERICS,
    EXTRA_ARCHITECTURES,
    NUMERICS,
    Architecture,
    BiTArchitecture,
    get_architecture,
)
from keras_vit.models.vit import VisionTransformer
from keras_vit.models.weight_tree import WeightTreeError, get_weight_tree, set_weight_tree, weight_variables
