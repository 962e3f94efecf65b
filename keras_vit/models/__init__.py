"""The architecture table, the VisionTransformer builder and the canonical weight tree."""

from keras_vit.models.config import (
    ARCHITECTURES,
    EXTRA_ARCHITECTURES,
    NUMERICS,
    POSITION_EMBEDDINGS,
    Architecture,
    ViTConfig,
    get_architecture,
)
from keras_vit.models.vit import VisionTransformer
from keras_vit.models.weight_tree import WeightTreeError, get_weight_tree, set_weight_tree, weight_variables
from keras_vit.models.features import TokensToGrid, feature_extractor
