"""Backend-agnostic Keras 3 layers of the Vision Transformer and its BiT ResNet (keras.ops only;
the backend-specific lines -- a JAX dot option that decides bfloat16 speed, PyTorch's fused
matmul-plus-bias -- sit behind `layers.matmul.matmul` and `layers.matmul.matmul_add`)."""

from keras_vit.layers.heads import MAPHead
from keras_vit.layers.position import (
    PositionEmbedding,
    PositionEmbedding2D,
    SinCos2DPositionEmbedding,
    sincos2d_position_embedding,
)
from keras_vit.layers.pyramid import SimpleFeaturePyramid
from keras_vit.layers.quantized import Dense, Int8AttentionMixin, int8_matmul, integer_matmul
from keras_vit.layers.resize import PATCH_RESIZE_RULES, RESIZE_RULES, resize_patch_embedding, resize_position_embedding
from keras_vit.layers.resnet import (
    BottleneckUnit,
    GroupNorm,
    MaxPoolSame,
    MaxPoolZeroPad,
    PreActBottleneckUnit,
    PreActResNetStage,
    ResNetStage,
    StdConv2D,
    same_padding,
    symmetric_padding,
)
from keras_vit.layers.transformer import (
    ClassToken,
    EncoderBlock,
    MlpBlock,
    MultiHeadDotProductAttention,
    PatchDropout,
    PatchEmbedding,
    SplitFanXavierUniform,
    TokenPooling,
)
