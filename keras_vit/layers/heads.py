"""Pooling heads beyond the class token and the average: big_vision's MAP head."""

import keras
from keras import ops

from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.transformer import MlpBlock, MultiHeadDotProductAttention, layer_norm_variables

register = keras.saving.register_keras_serializable(package="keras_vit")


@register
class MAPHead(keras.layers.Layer):
    """Multihead attention pooling (big_vision's `MAPHead`, `pool_type="map"`).

    A learned `probe` (1, 1, hidden) attends over the tokens with its own
    MultiHeadDotProductAttention_0 (no residual), then x + MlpBlock_0(LayerNorm_0(x)); the
    probe's row is the pooled (batch, hidden) output. Names and shapes are big_vision's, so a
    `MAPHead_0/...` weight of its checkpoints is a weight of this layer.
    """

    def __init__(self, num_heads, mlp_dim, layer_norm_epsilon=1e-6, gelu_approximate=True, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        policy = self.dtype_policy
        self.attention = MultiHeadDotProductAttention(self.num_heads, dtype=policy, name="MultiHeadDotProductAttention_0")
        self.attention.cross_attention_only = True  # quantization leaves it float
        self.norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, dtype=policy, name="LayerNorm_0")
        self.mlp = MlpBlock(self.mlp_dim, 0.0, self.gelu_approximate, dtype=policy, name="MlpBlock_0")

    def build(self, input_shape):
        hidden = input_shape[-1]
        self.probe = self.add_weight(name="probe", shape=(1, 1, hidden), initializer=_init("glorot_uniform"))
        self.attention.build(input_shape)
        self.norm.build((None, 1, hidden))
        self.mlp.build((None, 1, hidden))

    def call(self, tokens, training=None):
        batch, hidden = ops.shape(tokens)[0], tokens.shape[-1]
        probe = ops.broadcast_to(ops.cast(self.probe, tokens.dtype), (batch, 1, hidden))
        x = self.attention.cross_attend(probe, tokens, training=training)
        x = x + self.mlp(self.norm(x), training=training)
        return x[:, 0]

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[-1])

    def weight_tree_variables(self):
        tree = {"probe": self.probe}
        tree.update({f"MultiHeadDotProductAttention_0/{k}": v for k, v in self.attention.weight_tree_variables().items()})
        tree.update({f"LayerNorm_0/{k}": v for k, v in layer_norm_variables(self.norm).items()})
        tree.update({f"MlpBlock_0/{k}": v for k, v in self.mlp.weight_tree_variables().items()})
        return tree

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.num_heads,
            mlp_dim=self.mlp_dim,
            layer_norm_epsilon=self.layer_norm_epsilon,
            gelu_approximate=self.gelu_approximate,
        )
        return config
