"""Pooling heads beyond the class token and the average: big_vision's MAP head."""

import keras
from keras import ops

from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.transformer import MlpBlock, MultiHeadDotProductAttention, layer_norm_variables, make_norm

register = keras.saving.register_keras_serializable(package="keras_vit")


@register
class MAPHead(keras.layers.Layer):
    """Multihead attention pooling (big_vision's `MAPHead`, `pool_type="map"`).

    A learned `probe` (1, 1, hidden) attends over the tokens with its own
    MultiHeadDotProductAttention_0 (no residual), then x + MlpBlock_0(LayerNorm_0(x)); the
    probe's row is the pooled (batch, hidden) output. Names and shapes are big_vision's, so a
    `MAPHead_0/...` weight of its checkpoints is a weight of this layer. timm's
    AttentionPoolLatent computes the same (its `latent` is the probe, `q`/`kv`/`proj` the
    attention, `norm` and `mlp` the rest), with the model's norm and MLP activation.
    """

    def __init__(self, num_heads, mlp_dim, layer_norm_epsilon=1e-6, gelu_approximate=True, mlp_activation=None,
                 norm="layer_norm", num_prefix_tokens=0, **kwargs):
        super().__init__(**kwargs)
        self.num_prefix_tokens = int(num_prefix_tokens)  # left out of the pool (timm's class and register tokens)
        self.mlp_activation = mlp_activation
        self.norm_kind = norm
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        policy = self.dtype_policy
        self.attention = MultiHeadDotProductAttention(self.num_heads, dtype=policy, name="MultiHeadDotProductAttention_0")
        self.attention.cross_attention_only = True  # quantization leaves it float
        self.norm = make_norm(norm, self.layer_norm_epsilon, policy, "LayerNorm_0")
        self.mlp = MlpBlock(
            self.mlp_dim, 0.0, self.gelu_approximate, activation=mlp_activation, dtype=policy, name="MlpBlock_0"
        )

    def build(self, input_shape):
        hidden = input_shape[-1]
        self.probe = self.add_weight(name="probe", shape=(1, 1, hidden), initializer=_init("glorot_uniform"))
        self.attention.build(input_shape)
        self.norm.build((None, 1, hidden))
        self.mlp.build((None, 1, hidden))

    def call(self, tokens, training=None):
        if self.num_prefix_tokens:
            tokens = tokens[:, self.num_prefix_tokens :]
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
        if self.mlp_activation is not None:
            config.update(mlp_activation=self.mlp_activation)
        if self.num_prefix_tokens:
            config.update(num_prefix_tokens=self.num_prefix_tokens)
        if self.norm_kind != "layer_norm":
            config.update(norm=self.norm_kind)
        return config


def pooled_classifier(x, config, dtype, *, pool, head, max_pool=None, keepdims=False):
    """The tail of a convolutional model on its last feature map `x` (batch, h, w, channels): with
    `config.include_top`, global average pooling (layer `pool`; the map kept 1 x 1 with `keepdims`),
    the family's classifier `head(x)` and the activation `config.classifier_activation` (layer
    "predictions", float32); without, the features pooled as `config.pooling` says ("avg" or
    "gap": layer `pool`, "max": layer `max_pool`, default `pool`; None: the map itself)."""
    if config.include_top:
        x = keras.layers.GlobalAveragePooling2D(keepdims=keepdims, dtype=dtype, name=pool)(x)
        x = head(x)
        return keras.layers.Activation(config.classifier_activation, dtype="float32", name="predictions")(x)
    if config.pooling in ("avg", "gap"):
        return keras.layers.GlobalAveragePooling2D(dtype=dtype, name=pool)(x)
    if config.pooling == "max":
        return keras.layers.GlobalMaxPooling2D(dtype=dtype, name=max_pool or pool)(x)
    return x
