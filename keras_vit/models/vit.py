"""The VisionTransformer model: ViT and R+ViT hybrids as one functional Keras model."""

import math

import keras

from keras_vit import compilation

from keras_vit.backend_workarounds import TraceTrainStepOnce, TorchOnBatchInputs
from keras_vit.layers.heads import MAPHead
from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.position import PositionEmbedding, PositionEmbedding2D, SinCos2DPositionEmbedding
from keras_vit.layers.quantized import Dense
from keras_vit.layers.resnet import GroupNorm, MaxPoolSame, ResNetStage, StdConv2D
from keras_vit.layers.transformer import (
    ClassToken,
    EncoderBlock,
    PatchDropout,
    PatchEmbedding,
    RegisterTokens,
    TokenPooling,
    make_norm,
)
from keras_vit.models.fit_checks import CheckedLabels
from keras_vit.models.vit_family import ViTConfig
from keras_vit.models.config_model import ConfigModel, config_from_arguments, expose_config_fields
from keras_vit.models.export_method import DeploymentExport
from keras_vit.models.features import FeatureEndpoint, FeatureMaps

_POSITION_LAYERS = {
    "learned": PositionEmbedding,
    "learned_2d": PositionEmbedding2D,
    "sincos2d": SinCos2DPositionEmbedding,
}


def _resnet_stem(x, config, dtype):
    units, width_factor = config.resnet
    norm_kw = dict(
        group_norm_epsilon=config.group_norm_epsilon,
        std_conv_epsilon=config.std_conv_epsilon,
        std_conv_epsilon_inside_sqrt=config.std_conv_epsilon_inside_sqrt,
        dtype=dtype,
    )
    root = int(64 * width_factor)
    x = StdConv2D(
        root, 7, 2, config.std_conv_epsilon, config.std_conv_epsilon_inside_sqrt, dtype=dtype, name="conv_root"
    )(x)
    x = GroupNorm(32, config.group_norm_epsilon, relu=True, dtype=dtype, name="gn_root")(x)
    x = MaxPoolSame(3, 2, dtype=dtype, name="root_pool")(x)
    for i, n in enumerate(units):
        x = ResNetStage(n, root * 2**i, 1 if i == 0 else 2, name=f"block{i + 1}", **norm_kw)(x)
    return x


def _graph(config, dtype):
    """(inputs, outputs) of the functional model described by `config`."""
    c = config
    size = (None, None) if c.dynamic_image_size else c.image_size
    images = keras.Input(shape=(*size, c.num_channels), name="images")
    x = images
    if c.resnet is not None:
        x = _resnet_stem(x, c, dtype)
    x = PatchEmbedding(c.hidden_size, c.patch_size, use_bias=c.patch_embedding_bias, dtype=dtype, name="embedding")(x)
    if c.patch_embedding_norm:
        x = make_norm(c.norm, c.layer_norm_epsilon, dtype, "embedding_norm")(x)
    position, stride = None, (c.stride if c.dynamic_image_size else None)
    if c.position_embedding in _POSITION_LAYERS:
        # dynamic_image_size: the layer reads each batch's grid off the images (stride pixels per token).
        position = _POSITION_LAYERS[c.position_embedding](
            c.grid_size, c.num_position_prefix_tokens, resize_rule=c.position_embedding_resize, stride=stride,
            dtype=dtype, name="posembed_input",
        )

    def add_position(tokens):
        return position(tokens, images) if stride else position(tokens)

    if position is not None and not c.class_token_position_embedding:
        x = add_position(x)  # big_vision: on the patch grid, before the class token joins it
    # Prefix tokens, each prepended: [class, distillation, registers..., patches...] (timm's order).
    if c.register_tokens:
        x = RegisterTokens(c.register_tokens, dtype=dtype, name="reg_tokens")(x)
    if c.distillation_token:
        x = ClassToken(dtype=dtype, name="dist_token")(x)
    if c.has_class_token:
        x = ClassToken(dtype=dtype, name="cls")(x)
    if position is not None and c.class_token_position_embedding:
        x = add_position(x)
    x = keras.layers.Dropout(c.dropout_rate, dtype=dtype, name="dropout")(x)
    keep = None
    if c.patch_drop_rate:  # timm's order: position dropout, patch dropout, norm_pre
        dropout = PatchDropout(c.patch_drop_rate, c.num_prefix_tokens, return_indices=c.rotary_position_embedding,
                               dtype=dtype, name="patch_dropout")
        # A rotary model's blocks rotate each kept patch by its own grid position (timm's EVA).
        x, keep = dropout(x) if c.rotary_position_embedding else (dropout(x), None)
    if c.pre_norm:
        x = make_norm(c.norm, c.layer_norm_epsilon, dtype, "norm_pre")(x)
    relative = c.num_tokens if c.position_embedding == "relative" else None
    for i in range(c.num_layers):
        x = EncoderBlock(
            c.num_heads,
            c.mlp_dim,
            c.dropout_rate,
            c.attention_dropout_rate,
            c.layer_norm_epsilon,
            c.gelu_approximate,
            relative_positions=relative,
            remat=c.remat,
            qkv_bias=c.qkv_bias,
            key_bias=c.key_bias,
            projection_bias=c.projection_bias,
            layer_scale=c.layer_scale,
            norm=c.norm,
            mlp_activation=c.mlp_activation,
            glu=c.glu,
            relative_position_bias=c.grid_size if c.relative_position_bias else None,
            rotary=dict(grid=c.grid_size, prefix_tokens=c.num_prefix_tokens, temperature=c.rope_temperature,
                        reference_grid=c.rope_reference_grid, offset=c.rope_grid_offset,
                        indexing=c.rope_grid_indexing, coordinates=c.rope_coordinates,
                        rotate_half=c.rope_rotate_half, learned=c.rope_learned_frequencies, stride=stride)
            if c.rotary_position_embedding else None,
            attention_norm=c.attention_norm,
            mlp_norm=c.mlp_norm,
            post_norm=c.post_norm,
            parallel=c.parallel_blocks,
            # timm's DiffAttention: lambda_init = 0.8 - 0.6 exp(-0.3 i) in block i
            differential=0.8 - 0.6 * math.exp(-0.3 * i) if c.differential_attention else None,
            qk_norm=c.qk_norm,
            num_kv_heads=c.block_kv_heads(i),
            attention_only_layer_scale=c.attention_only_layer_scale,
            dtype=dtype,
            name=f"encoderblock_{i}",
        )(*((x, images) if stride and c.rotary_position_embedding else (x,)),
          **({} if keep is None else {"keep": keep}))
    if c.final_norm and not c.fc_norm:
        x = make_norm(c.norm, c.layer_norm_epsilon, dtype, "encoder_norm")(x)
    mode = {None: c.classifier, "avg": "gap"}.get(c.pooling, c.pooling)
    if c.include_top and c.distillation_token:
        return images, _distilled_heads(x, c, dtype)
    if c.include_top or c.pooling is not None:
        if mode == "map":
            x = MAPHead(
                c.map_heads or c.num_heads, c.map_mlp_dim or c.mlp_dim, c.layer_norm_epsilon, c.gelu_approximate,
                mlp_activation=c.mlp_activation, norm=c.norm,
                num_prefix_tokens=0 if c.map_include_prefix else c.num_prefix_tokens, dtype=dtype, name="MAPHead_0",
            )(x)
        elif mode != "none":  # "none": pre_logits and the head apply to every token
            x = TokenPooling(mode, c.num_prefix_tokens, dtype=dtype, name="pool")(x)
        if c.fc_norm and mode != "none":
            x = make_norm(c.norm, c.layer_norm_epsilon, dtype, "fc_norm")(x)
        if c.representation_size is not None:
            x = Dense(
                c.representation_size,
                activation="tanh",
                kernel_initializer=_init("glorot_uniform"),
                dtype=dtype,
                name="pre_logits",
            )(x)
    if c.include_top:
        x = Dense(c.classes, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype, name="head")(x)
        x = keras.layers.Activation(c.classifier_activation, dtype="float32", name="predictions")(x)
    return images, x


def _distilled_heads(tokens, c, dtype):
    """DeiT's two heads: `head` on the class token and `head_dist` on the distillation token;
    their logits averaged (timm's inference output), or both outputs with
    distillation_output='both' (for training with a teacher)."""
    heads = []
    for token, name in (("token", "head"), ("distillation", "head_dist")):
        pooled = TokenPooling(token, c.num_prefix_tokens, dtype=dtype, name=f"pool_{name}")(tokens)
        heads.append(Dense(c.classes, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype, name=name)(pooled))
    if c.distillation_output == "both":
        return [
            keras.layers.Activation(c.classifier_activation, dtype="float32", name=name)(logits)
            for logits, name in zip(heads, ("predictions", "predictions_dist"))
        ]
    logits = keras.layers.Average(dtype=dtype, name="head_mean")(heads)
    return keras.layers.Activation(c.classifier_activation, dtype="float32", name="predictions")(logits)


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(
    DeploymentExport, ConfigModel, FeatureMaps, CheckedLabels, TraceTrainStepOnce, TorchOnBatchInputs, keras.Model
):
    """Vision Transformer (Dosovitskiy et al., 2021), optionally on a BiT ResNet (R+ViT hybrids).

    A functional model: its layers carry the original Flax module names, and `get_config()`
    returns exactly the arguments below, so a saved model rebuilds itself. The arguments are the
    fields of `keras_vit.models.vit_family.ViTConfig` (normalised and validated there; `model.config`
    is that object); a ViTConfig may also be passed as the only positional argument. Unknown
    keyword arguments raise a TypeError with a suggestion.

    Args:
        image_size: int or (height, width) of the input images; the patch size times the hybrid
            ResNet's stride must divide both. With `dynamic_image_size`, the size the position
            embeddings are laid out on (the weights' training size).
        patch_size: side of the square patches (for hybrids: of the patches of the ResNet output).
        hidden_size, num_layers, num_heads, mlp_dim: the Transformer's width, depth, heads and
            MLP width.
        classes: size of the classification head.
        classifier: "token" (a class token is prepended and read out), "gap" (no class token;
            the patch tokens are averaged), "map" (no class token; big_vision's attention
            pooling head `MAPHead_0`), "first" (no class token; the first patch token is read
            out: big_vision's pool_type "0") or "none" (no class token and no pooling:
            `pre_logits` and the head apply to every token, so the model outputs
            (batch, tokens, classes): big_vision's pool_type "none").
        representation_size: width of the optional `pre_logits` Dense + tanh before the head.
        resnet: None, or (stage_units, width_factor) of the hybrid's BiT ResNet, e.g.
            ((3, 4, 9), 1) for R50+ViT-B/16, ((), 1) for the stem-only R+ViT-Ti/16.
        position_embedding: "learned" (1-D, one learned vector per token; the paper's default),
            "none", "learned_2d" (learned X and Y tables of hidden/2 each, concatenated per
            patch), "relative" (1-D relative attention in every block) or "sincos2d" (fixed 2-D
            sin-cos, big_vision's); the paper's Appendix D.4 compares them.
        class_token_position_embedding: True (the original): the embedding covers the class
            token too and is added after it is prepended. False (big_vision): the embedding is
            laid out on the patch grid alone and added before the class token joins, so the
            class token gets none (resizing then treats every row as a grid cell). No effect
            without a class token; "sincos2d" never gives the class token an embedding.
        relative_position_bias: BEiT's learned 2-D relative position bias (Bao et al. 2022) in
            every block: a table per block of one bias per head for each 2-D offset between two
            patches, plus class-token entries, added to the attention logits. Needs exactly one
            prefix token (the class token) and a fixed image size.
        rotary_position_embedding, rope_temperature, rope_reference_grid, rope_grid_offset,
        rope_grid_indexing: EVA-02's 2-D rotary position embedding (Fang et al. 2023) of the patch
            tokens' queries and keys in every block (prefix tokens unrotated), with its frequency
            base, the (rows, cols) the positions are rescaled to span (None: patch indices), an
            offset added to the indices, and which axis the first half follows ("ij": the row,
            "xy": the column); it follows `image_size`.
        rope_coordinates, rope_rotate_half: DINOv3's rotary form: "centered" positions (patch
            centres mapped to [-1, 1]) and channels paired across the two halves of a head.
        rope_learned_frequencies: RoPE-Mixed's rotary embedding: frequencies learned per block and
            head (`rope_frequencies`), applied to the patch indices.
        attention_norm, mlp_norm: EVA-02's sub-LNs: a norm on the attention's output before its
            projection, and one inside the MLP before `Dense_1`.
        map_heads, map_mlp_dim, map_include_prefix: the MAP head's own head count and MLP width
            (None: the encoder's), and whether it attends over the prefix tokens too.
        post_norm: blocks that normalise their branches' outputs instead of their inputs,
            x + LN(MHA(x)) then y + LN(MLP(y)) (EVA-02 enormous).
        differential_attention: differential attention in every block (timm's DiffAttention:
            softmax(q1 k1) - lambda softmax(q2 k2) per head, lambda learned, sub-norm on the output).
        qk_norm: a norm on each head's query and key (timm's qk_norm).
        num_kv_heads: grouped-query attention: key/value heads, one count (every block) or one
            per block (Sapiens2's); None: num_heads.
        attention_only_layer_scale: the layer scale on the attention branch only (Sapiens2's).
        parallel_blocks: attention and MLP side by side on one norm of the block's input,
            x + LS(MHA(LN(x)) + MLP(LN(x))) (timm's ParallelScalingBlock, ViT-22B's block).
        num_channels: input channels.
        layer_norm_epsilon, gelu_approximate, group_norm_epsilon, std_conv_epsilon,
        std_conv_epsilon_inside_sqrt: the numerics of the weights' source (see
            `keras_vit.models.config.NUMERICS`); the defaults are the original Flax ones.
        position_embedding_resize: the source's rule for resizing position embeddings.
        include_top: whether to end in the classification head.
        pooling: with include_top=False: None returns the token sequence after the final
            LayerNorm (batch, tokens, hidden); "token", "gap" (alias "avg"), "max", "first"
            (the first token) or ("map" models) "map" pool it to (batch, hidden) (through
            `pre_logits` when the model has one).
        classifier_activation: activation of the head ("softmax", None for logits, ...).
        dropout_rate, attention_dropout_rate: dropout after embeddings / in blocks, and on the
            attention weights.
        patch_drop_rate: in training, drop this fraction of each image's patch tokens after the
            position embedding (timm's `patch_drop_rate`; the class, distillation and register
            tokens are kept); no effect on inference. A rotary model rotates each kept patch by
            its own grid position, as timm's EVA; BEiT's relative position bias refuses it.
        remat: recompute each encoder block in the backward pass instead of keeping its
            activations (`keras.remat`): the same gradients, the activation memory of one block
            instead of all of them, about a third more compute per step. For training big models
            at high resolution (ViT-H/14 at 518 px, the paper's Table 2); no effect on inference.
            With dropout, the recomputed blocks draw the forward pass's masks.
        quantization: set by `quantize` (a saved quantized model reloads quantized).
        dynamic_image_size: take images of any size the stride divides, known only at run time
            (input shape (None, None, channels)): the position embeddings are resampled inside
            the graph to each batch's grid with `position_embedding_resize`, the rule
            `resize_position_embedding` applies at load time, and the rotary embedding
            (`rotary_position_embedding`) is computed for that grid ("relative" position
            embeddings and BEiT's relative position bias cannot follow a grid and are refused). A size the stride does not divide raises a ValueError when
            the size is known as the graph is traced (eager, jit on JAX, TensorFlow functions
            traced for that shape).
        name, dtype, trainable: as for any keras.Model.

    Example:
        >>> model = VisionTransformer(image_size=32, patch_size=8, hidden_size=16, num_layers=2,
        ...                           num_heads=2, mlp_dim=32, classes=10)
        >>> model.output_shape
        (None, 10)
    """

    def __init__(self, config=None, /, *, name=None, dtype=None, trainable=True, **kwargs):
        config = config_from_arguments(
            ViTConfig, config, kwargs, "VisionTransformer", required=ViTConfig.fields("architecture")[:6]
        )
        activation = config.classifier_activation
        if activation is None:
            config = config.replace(classifier_activation="linear")  # Keras' name for no activation
        elif not isinstance(activation, str):
            # A callable is stored by name. Strings stay as they are: serialising one would import
            # TensorFlow on every backend (keras.saving checks whether it is installed).
            activation = keras.activations.serialize(keras.activations.get(activation))
            config = config.replace(classifier_activation=activation)
        inputs, outputs = _graph(config, dtype)
        super().__init__(inputs=inputs, outputs=outputs, name=name or "vision_transformer", trainable=trainable)
        compilation.configure_model(self)
        self._model_config = config.replace(quantization=None)
        if config.quantization:
            # A saved quantized model: quantize the fresh float layers the same way, so the
            # int8 variables (kernels and scales) exist for the saved values to load into.
            from keras_vit.quantization import restore_arguments

            self.quantize(**restore_arguments(config.quantization))

    @property
    def grid_size(self):
        """(rows, cols) of the patch grid."""
        return self.config.grid_size

    @property
    def num_prefix_tokens(self):
        """Tokens in front of the patch tokens (1 for the class token)."""
        return self.config.num_prefix_tokens

    @property
    def stride(self):
        """Input pixels per token along each axis."""
        return self.config.stride

    @property
    def encoder_blocks(self):
        """The EncoderBlock layers in order."""
        return [self.get_layer(f"encoderblock_{i}") for i in range(self.num_layers)]

    def _feature_endpoints(self):
        # timm: every block, normed by the final norm (none when it follows pooling: fc_norm).
        norm = "encoder_norm" if self.final_norm and not self.fc_norm else None
        return [FeatureEndpoint(f"encoderblock_{i}", self.stride, norm) for i in range(self.num_layers)]

    def _final_feature_layer(self):
        return "encoder_norm" if self.final_norm and not self.fc_norm else f"encoderblock_{self.num_layers - 1}"

    def quantize(self, mode=None, config=None, filters=None, **kwargs):
        """Keras' `Model.quantize`, remembered in the model's config so that a saved quantized
        model loads quantized (`keras.saving.load_model` rebuilds the model from its arguments).

        int8 quantizes every transformer matmul: the attention projections (query/key/value fused
        into one int8 kernel, and out), the MLPs' Dense_0/Dense_1, `pre_logits` and the head, each
        with per-output-channel scales and the inputs quantized per token on the fly
        (benchmarks/README.md has the speed and the change of the logits). The patch embedding,
        ResNet stem and norms stay float; other modes (int4, float8, ...) reach only the Dense
        layers. A quantized model has no float weight tree (`get_weight_tree` refuses it). The
        config remembers `mode`, the QuantizationConfig and string filters; a callable filter
        cannot be remembered (a warning says so). The work is in `keras_vit.quantization`.

        Example:
            >>> model = keras_vit.ViTB16(weights=None)  # doctest: +SKIP
            >>> model.quantize("int8")  # doctest: +SKIP
            >>> model.save("vit_int8.keras")  # doctest: +SKIP
            >>> keras.saving.load_model("vit_int8.keras")  # int8 again  # doctest: +SKIP
        """
        from keras_vit import quantization

        keras_quantize = super().quantize
        remembered = quantization.quantize(self, keras_quantize, mode, config=config, filters=filters, **kwargs)
        self._model_config = self._model_config.replace(quantization=remembered)


# Every config field reads as a model attribute; help() and IDEs show them as keyword arguments.
expose_config_fields(VisionTransformer, ViTConfig)
