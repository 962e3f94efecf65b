"""ViTDet's simple feature pyramid (Li et al., "Exploring Plain Vision Transformer Backbones for
Object Detection", ECCV 2022, section 3): multi-scale maps for dense heads from a plain ViT's last
map alone."""

import math

import keras

from keras_vit.layers.init_scope import initializer as _init

register = keras.saving.register_keras_serializable(package="keras_vit")

#: The scale factors the pyramid builds, and how: two stride-2 deconvolutions (LayerNorm and GELU
#: between them) for 4x, one for 2x, the map itself for 1x, a 2x2 max pool for 0.5x.
SCALE_FACTORS = (4.0, 2.0, 1.0, 0.5)


@register
class SimpleFeaturePyramid(keras.layers.Layer):
    """(batch, H, W, C) map -> [(batch, H * s, W * s, channels) for each scale factor s].

    From one map of stride r (a ViT's last block, `model.feature_extractor([-1])`), the paper's
    pyramid of strides r / 4, r / 2, r and 2r (r = 16: strides 4, 8, 16, 32): for each scale a
    resampling (4x: deconvolution 2x2 stride 2 to C / 2 channels, LayerNorm, GELU, deconvolution 2x2
    stride 2 to C / 4; 2x: one deconvolution to C / 2; 1x: none; 0.5x: 2x2 max pool), then a 1x1 and
    a 3x3 convolution to `channels`, each without bias and followed by a LayerNorm over the channels
    (detectron2's ViTDet "LN"). The maps come finest first, in the order of `scale_factors`.

    Args:
        channels: output channels of every level (256 in the paper).
        scale_factors: a subset of (4.0, 2.0, 1.0, 0.5), in the order the maps are returned.
        epsilon: the LayerNorms' epsilon (1e-6, detectron2's).

    Example:
        >>> pyramid = SimpleFeaturePyramid(channels=8)
        >>> [tuple(m.shape) for m in pyramid(keras.ops.zeros((1, 4, 4, 16)))]
        [(1, 16, 16, 8), (1, 8, 8, 8), (1, 4, 4, 8), (1, 2, 2, 8)]
    """

    def __init__(self, channels=256, scale_factors=SCALE_FACTORS, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.channels = int(channels)
        self.scale_factors = tuple(float(s) for s in scale_factors)
        self.epsilon = float(epsilon)
        unknown = [s for s in self.scale_factors if s not in SCALE_FACTORS]
        if unknown or not self.scale_factors or len(set(self.scale_factors)) != len(self.scale_factors):
            raise ValueError(
                f"scale_factors must be distinct values among {SCALE_FACTORS} (ViTDet's pyramid); got "
                f"{tuple(scale_factors)!r}."
            )
        self.levels = []  # per scale: [resampling layers..., conv 1x1, norm, conv 3x3, norm]

    def _norm(self, name):
        return keras.layers.LayerNormalization(epsilon=self.epsilon, dtype=self.dtype_policy, name=name)

    def build(self, input_shape):
        dim = input_shape[-1]
        if dim is None or (4.0 in self.scale_factors and dim % 4) or (2.0 in self.scale_factors and dim % 2):
            raise ValueError(
                f"The pyramid's deconvolutions halve the input channels once (2x) or twice (4x); {dim} channels do "
                "not allow it. Use a map whose channels 4 divides."
            )
        policy = self.dtype_policy
        shape = tuple(input_shape)

        def deconv(filters, name):
            return keras.layers.Conv2DTranspose(filters, 2, 2, kernel_initializer=_init("glorot_uniform"),
                                                dtype=policy, name=name)

        def conv(size, name):
            return keras.layers.Conv2D(self.channels, size, padding="same", use_bias=False,
                                       kernel_initializer=_init("glorot_uniform"), dtype=policy, name=name)

        self.levels = []
        for scale in self.scale_factors:
            tag = f"{scale:g}x".replace(".", "_")
            layers = []
            if scale == 4.0:
                layers = [
                    deconv(dim // 2, f"{tag}_deconv_0"),
                    self._norm(f"{tag}_deconv_norm"),
                    keras.layers.Activation("gelu", dtype=policy, name=f"{tag}_gelu"),
                    deconv(dim // 4, f"{tag}_deconv_1"),
                ]
            elif scale == 2.0:
                layers = [deconv(dim // 2, f"{tag}_deconv_0")]
            elif scale == 0.5:
                layers = [keras.layers.MaxPooling2D(2, 2, dtype=policy, name=f"{tag}_pool")]
            layers += [
                conv(1, f"{tag}_lateral"), self._norm(f"{tag}_lateral_norm"),
                conv(3, f"{tag}_output"), self._norm(f"{tag}_output_norm"),
            ]
            level_shape = shape
            for layer in layers:
                layer.build(level_shape)
                level_shape = layer.compute_output_shape(level_shape)
            self.levels.append(layers)

    def call(self, features):
        outputs = []
        for layers in self.levels:
            x = features
            for layer in layers:
                x = layer(x)
            outputs.append(x)
        return outputs

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape

        def scaled(n, s):
            return None if n is None else int(math.floor(n * s))

        return [(batch, scaled(height, s), scaled(width, s), self.channels) for s in self.scale_factors]

    def get_config(self):
        return {**super().get_config(), "channels": self.channels, "scale_factors": list(self.scale_factors),
                "epsilon": self.epsilon}
