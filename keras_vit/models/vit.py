"""The VisionTransformer model: ViT and R+ViT hybrids as one functional Keras model."""

import contextlib
import gc
import re
import warnings

import keras

from keras_vit.layers.init_scope import initializer as _init
from keras_vit.layers.quantized import Dense
from keras_vit.layers.resnet import GroupNorm, MaxPoolSame, ResNetStage, StdConv2D
from keras_vit.layers.transformer import (
    ClassToken,
    EncoderBlock,
    MultiHeadDotProductAttention,
    PatchEmbedding,
    PositionEmbedding,
    TokenPooling,
)
from keras_vit.models.config import NUMERICS, resnet_stride

_POOLING = (None, "token", "gap", "avg", "max")


def _as_pair(image_size):
    if isinstance(image_size, int):
        return image_size, image_size
    size = tuple(int(s) for s in image_size)
    if len(size) != 2:
        raise ValueError(f"image_size must be an int or (height, width); got {image_size!r}.")
    return size


def _normalise_resnet(resnet):
    if resnet is None:
        return None
    if len(resnet) != 2:
        raise ValueError(f"resnet must be (stage_units, width_factor), e.g. ((3, 4, 9), 1); got {resnet!r}.")
    units, width = resnet
    return tuple(int(u) for u in units), width


@keras.saving.register_keras_serializable(package="keras_vit")
class VisionTransformer(keras.Model):
    """Vision Transformer (Dosovitskiy et al., 2021), optionally on a BiT ResNet (R+ViT hybrids).

    A functional model: its layers carry the original Flax module names, and `get_config()`
    returns exactly the arguments below, so a saved model rebuilds itself.

    Args:
        image_size: int or (height, width) of the input images; the patch size times the hybrid
            ResNet's stride must divide both.
        patch_size: side of the square patches (for hybrids: of the patches of the ResNet output).
        hidden_size, num_layers, num_heads, mlp_dim: the Transformer's width, depth, heads and
            MLP width.
        classes: size of the classification head.
        classifier: "token" (a class token is prepended and read out) or "gap" (no class token;
            the patch tokens are averaged).
        representation_size: width of the optional `pre_logits` Dense + tanh before the head.
        resnet: None, or (stage_units, width_factor) of the hybrid's BiT ResNet, e.g.
            ((3, 4, 9), 1) for R50+ViT-B/16, ((), 1) for the stem-only R+ViT-Ti/16.
        dropout_rate, attention_dropout_rate: dropout after embeddings / in blocks, and on the
            attention weights.
        include_top: whether to end in the classification head.
        pooling: with include_top=False: None returns the token sequence after the final
            LayerNorm (batch, tokens, hidden); "token", "gap" (alias "avg") or "max" pool it to
            (batch, hidden) (through `pre_logits` when the model has one).
        classifier_activation: activation of the head ("softmax", None for logits, ...).
        layer_norm_epsilon, gelu_approximate, group_norm_epsilon, std_conv_epsilon,
        std_conv_epsilon_inside_sqrt: the numerics of the weights' source (see
            `keras_vit.models.config.NUMERICS`); the defaults are the original Flax ones.
        position_embedding_resize: the source's rule for resizing position embeddings.
        num_channels: input channels.
        name: model name.

    Example:
        >>> model = VisionTransformer(image_size=32, patch_size=8, hidden_size=16, num_layers=2,
        ...                           num_heads=2, mlp_dim=32, classes=10)
        >>> model.output_shape
        (None, 10)
    """

    def __init__(
        self,
        *,
        image_size,
        patch_size,
        hidden_size,
        num_layers,
        num_heads,
        mlp_dim,
        classes=1000,
        classifier="token",
        representation_size=None,
        resnet=None,
        dropout_rate=0.0,
        attention_dropout_rate=0.0,
        include_top=True,
        pooling=None,
        classifier_activation="softmax",
        layer_norm_epsilon=NUMERICS["original"]["layer_norm_epsilon"],
        gelu_approximate=NUMERICS["original"]["gelu_approximate"],
        group_norm_epsilon=NUMERICS["original"]["group_norm_epsilon"],
        std_conv_epsilon=NUMERICS["original"]["std_conv_epsilon"],
        std_conv_epsilon_inside_sqrt=NUMERICS["original"]["std_conv_epsilon_inside_sqrt"],
        position_embedding_resize=NUMERICS["original"]["position_embedding_resize"],
        num_channels=3,
        quantization=None,
        name=None,
        dtype=None,
        **kwargs,
    ):
        height, width = _as_pair(image_size)
        resnet = _normalise_resnet(resnet)
        if classifier not in ("token", "gap"):
            raise ValueError(
                f"classifier must be 'token' (class token) or 'gap' (global average pooling); got {classifier!r}."
            )
        if pooling not in _POOLING:
            raise ValueError(f"pooling must be one of None, 'token', 'gap', 'avg' or 'max'; got {pooling!r}.")
        if pooling == "token" and classifier == "gap":
            raise ValueError(
                "pooling='token' needs a class token, but this model has classifier='gap' (no class token). "
                "Use pooling='gap'."
            )
        if include_top and (classes is None or int(classes) < 1):
            raise ValueError(f"include_top=True needs a positive number of classes; got classes={classes!r}.")
        stride = patch_size * resnet_stride(resnet)
        for axis, size in (("height", height), ("width", width)):
            if size % stride:
                lower, upper = (size // stride) * stride, (size // stride + 1) * stride
                what = f"patch size {patch_size}" + (
                    f" times the ResNet stride {resnet_stride(resnet)}" if resnet is not None else ""
                )
                raise ValueError(
                    f"Image {axis} {size} is not divisible by the {what} (= {stride}). "
                    f"Resize the images to a multiple of {stride}, e.g. {lower or stride} or {upper}."
                )
        grid = (height // stride, width // stride)
        num_prefix = 1 if classifier == "token" else 0

        # === Layers / graph ===
        images = keras.Input(shape=(height, width, num_channels), name="images")
        x = images
        if resnet is not None:
            units, width_factor = resnet
            norm_kw = dict(
                group_norm_epsilon=group_norm_epsilon,
                std_conv_epsilon=std_conv_epsilon,
                std_conv_epsilon_inside_sqrt=std_conv_epsilon_inside_sqrt,
                dtype=dtype,
            )
            root = int(64 * width_factor)
            x = StdConv2D(
                root, 7, 2, std_conv_epsilon, std_conv_epsilon_inside_sqrt, dtype=dtype, name="conv_root"
            )(x)
            x = GroupNorm(32, group_norm_epsilon, relu=True, dtype=dtype, name="gn_root")(x)
            x = MaxPoolSame(3, 2, dtype=dtype, name="root_pool")(x)
            for i, n in enumerate(units):
                x = ResNetStage(n, root * 2**i, 1 if i == 0 else 2, name=f"block{i + 1}", **norm_kw)(x)
        x = PatchEmbedding(hidden_size, patch_size, dtype=dtype, name="embedding")(x)
        if classifier == "token":
            x = ClassToken(dtype=dtype, name="cls")(x)
        x = PositionEmbedding(
            grid, num_prefix, resize_rule=position_embedding_resize, dtype=dtype, name="posembed_input"
        )(x)
        x = keras.layers.Dropout(dropout_rate, dtype=dtype, name="dropout")(x)
        for i in range(num_layers):
            x = EncoderBlock(
                num_heads,
                mlp_dim,
                dropout_rate,
                attention_dropout_rate,
                layer_norm_epsilon,
                gelu_approximate,
                dtype=dtype,
                name=f"encoderblock_{i}",
            )(x)
        x = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="encoder_norm")(x)
        if include_top or pooling is not None:
            mode = {None: classifier, "avg": "gap"}.get(pooling, pooling)
            x = TokenPooling(mode, num_prefix, dtype=dtype, name="pool")(x)
            if representation_size is not None:
                x = Dense(
                    representation_size,
                    activation="tanh",
                    kernel_initializer=_init("glorot_uniform"),
                    dtype=dtype,
                    name="pre_logits",
                )(x)
        if include_top:
            x = Dense(
                classes, kernel_initializer="zeros", bias_initializer="zeros", dtype=dtype, name="head"
            )(x)
            x = keras.layers.Activation(classifier_activation, dtype="float32", name="predictions")(x)
        super().__init__(inputs=images, outputs=x, name=name or "vision_transformer", **kwargs)

        # === Config ===
        self.image_size = (height, width)
        self.patch_size = int(patch_size)
        self.hidden_size = int(hidden_size)
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.mlp_dim = int(mlp_dim)
        self.classes = None if classes is None else int(classes)
        self.classifier = classifier
        self.representation_size = None if representation_size is None else int(representation_size)
        self.resnet = resnet
        self.dropout_rate = float(dropout_rate)
        self.attention_dropout_rate = float(attention_dropout_rate)
        self.include_top = bool(include_top)
        self.pooling = pooling
        self.classifier_activation = keras.activations.serialize(keras.activations.get(classifier_activation))
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.gelu_approximate = bool(gelu_approximate)
        self.group_norm_epsilon = float(group_norm_epsilon)
        self.std_conv_epsilon = float(std_conv_epsilon)
        self.std_conv_epsilon_inside_sqrt = bool(std_conv_epsilon_inside_sqrt)
        self.position_embedding_resize = position_embedding_resize
        self.num_channels = int(num_channels)
        self.grid_size = grid
        self.num_prefix_tokens = num_prefix
        self.quantization = None
        if quantization:
            # A saved quantized model: quantize the fresh float layers the same way, so the
            # int8 variables (kernels and scales) exist for the saved values to load into.
            quantization = dict(quantization) if isinstance(quantization, dict) else {"mode": quantization}
            if isinstance(quantization.get("config"), dict):
                quantization["config"] = keras.saving.deserialize_keras_object(quantization["config"])
            self.quantize(**quantization)

    @property
    def stride(self):
        """Input pixels per token along each axis."""
        return self.patch_size * resnet_stride(self.resnet)

    @property
    def encoder_blocks(self):
        """The EncoderBlock layers in order."""
        return [self.get_layer(f"encoderblock_{i}") for i in range(self.num_layers)]

    # The *_on_batch calls hand NumPy arrays to the compiled step, which converts them. Under
    # torch.compile (PyTorch backend, jit_compile=True) that conversion breaks the graph at its
    # first op (dynamo cannot trace ndarray.dtype), leaving the model as dozens of small graphs
    # with Keras' Python between them; converted here first, the step is one graph
    # (benchmarks/README.md). `predict`/`fit` already feed tensors. Other backends: unchanged.
    def predict_on_batch(self, x):
        return super().predict_on_batch(_torch_tensors(x))

    def test_on_batch(self, x, y=None, sample_weight=None, return_dict=False):
        x, y, sample_weight = _torch_tensors((x, y, sample_weight))
        return super().test_on_batch(x, y, sample_weight=sample_weight, return_dict=return_dict)

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None, return_dict=False):
        x, y, sample_weight = _torch_tensors((x, y, sample_weight))
        return super().train_on_batch(x, y, sample_weight=sample_weight, class_weight=class_weight, return_dict=return_dict)

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """Keras' `Model.export`, through `keras_vit.export.export_model`: "tf_saved_model",
        "onnx" and "litert" from any backend (TensorFlow writes them), with that function's
        options (`int8`, `image_size`, `with_preprocessing`); other formats go to Keras."""
        from keras_vit import export as exports

        if str(format).lower() not in exports.FORMATS:
            return super().export(filepath, format=format, verbose=verbose, input_signature=input_signature, **kwargs)
        if input_signature is not None:
            raise exports.ExportError(
                "keras_vit models export with their own input signature (any batch size, the model's image size; "
                "uint8 images of any size with with_preprocessing=True). Use image_size=... to change the size."
            )
        return exports.export_model(self, filepath, format, verbose=bool(verbose), **kwargs)

    def get_config(self):
        return {
            "image_size": list(self.image_size),
            "patch_size": self.patch_size,
            "hidden_size": self.hidden_size,
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "mlp_dim": self.mlp_dim,
            "classes": self.classes,
            "classifier": self.classifier,
            "representation_size": self.representation_size,
            "resnet": None if self.resnet is None else [list(self.resnet[0]), self.resnet[1]],
            "dropout_rate": self.dropout_rate,
            "attention_dropout_rate": self.attention_dropout_rate,
            "include_top": self.include_top,
            "pooling": self.pooling,
            "classifier_activation": self.classifier_activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "gelu_approximate": self.gelu_approximate,
            "group_norm_epsilon": self.group_norm_epsilon,
            "std_conv_epsilon": self.std_conv_epsilon,
            "std_conv_epsilon_inside_sqrt": self.std_conv_epsilon_inside_sqrt,
            "position_embedding_resize": self.position_embedding_resize,
            "num_channels": self.num_channels,
            "quantization": self.quantization,
            "name": self.name,
            "trainable": self.trainable,
        }

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
        cannot be remembered (a warning says so).

        Example:
            >>> model = keras_vit.ViTB16(weights=None)  # doctest: +SKIP
            >>> model.quantize("int8")  # doctest: +SKIP
            >>> model.save("vit_int8.keras")  # doctest: +SKIP
            >>> keras.saving.load_model("vit_int8.keras")  # int8 again  # doctest: +SKIP
        """
        with warnings.catch_warnings(), _one_garbage_collection():
            # Keras names every layer without a quantize method (norms, tokens): expected here.
            warnings.filterwarnings("ignore", message=".*does not have a `quantize` method.*")
            super().quantize(mode, config=config, filters=filters, **kwargs)
            # Keras reaches only leaf layers; the attention layers hold a Dropout, so they are ours.
            if getattr(config, "mode", mode) == "int8":
                attention = [
                    layer
                    for layer in self._flatten_layers()
                    if isinstance(layer, MultiHeadDotProductAttention) and _matches(layer, filters)
                ]
                for layer in attention:
                    layer.quantize("int8", config=config)
                if attention:
                    self.train_function = self.test_function = self.predict_function = None
                    self._post_quantize("int8")
        # Keras resolves `mode` to a QuantizationConfig (serialisable) before calling us.
        remembered = {"mode": getattr(config, "mode", mode)}
        if config is not None:
            remembered["config"] = keras.saving.serialize_keras_object(config)
        if isinstance(filters, str) or (isinstance(filters, (list, tuple)) and all(isinstance(f, str) for f in filters)):
            remembered["filters"] = filters if isinstance(filters, str) else list(filters)
        elif filters is not None or kwargs:
            warnings.warn(
                "This model was quantized with a callable filter or extra options, which its config cannot "
                "hold: a reloaded model is quantized without them (mode and config are kept).",
                stacklevel=2,
            )
        self.quantization = remembered

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        if "dtype" in config and isinstance(config["dtype"], dict):
            config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
        return cls(**config)


def _torch_tensors(structure):
    """NumPy arrays in `structure` as tensors on the PyTorch backend; anything else as it is."""
    if keras.backend.backend() != "torch":
        return structure
    import numpy as np

    def convert(value):
        return keras.ops.convert_to_tensor(value) if isinstance(value, np.ndarray) else value

    return keras.tree.map_structure(convert, structure)


@contextlib.contextmanager
def _one_garbage_collection():
    """Keras' Layer.__delattr__ runs a full `gc.collect()` for every float kernel it replaces
    (to free device buffers early): 73 collections, 21 of ViT-B/16's 22 s of quantize() on
    JAX. Inside this block they are skipped and one collection runs at the end, which frees the
    same buffers."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def _matches(layer, filters):
    """Keras' rule for `quantize(filters=...)`: a regex (or list of them) searched in the layer's
    name, or a callable on the layer; None matches every layer."""
    if filters is None:
        return True
    if isinstance(filters, str):
        return re.search(filters, layer.name) is not None
    if isinstance(filters, (list, tuple)):
        return any(re.search(f, layer.name) is not None for f in filters)
    return bool(filters(layer))
