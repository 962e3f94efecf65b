"""Post-training quantization of a VisionTransformer (what `VisionTransformer.quantize` runs).

Keras' `Model.quantize` reaches the leaf layers (the MLPs' Dense layers, `pre_logits`, the
head); keras_vit's attention layers hold a Dropout, so Keras passes them by and they are
quantized here (layers.quantized.Int8AttentionMixin). The mode, the QuantizationConfig and string
filters are remembered in the model's config so that a saved quantized model loads quantized.
"""

import contextlib
import gc
import re
import warnings

import keras


@contextlib.contextmanager
def one_garbage_collection():
    """Keras' Layer.__delattr__ runs a full `gc.collect()` for every float kernel it replaces
    (to free device buffers early): 73 collections, 21 of ViT-B/16's 22 s of quantize() on
    JAX. Inside this block (only the replacing loop of `quantize`) they are skipped and one
    collection runs at the end, which frees the same buffers."""
    collect = gc.collect
    gc.collect = lambda generation=2: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def matches(layer, filters):
    """Keras' rule for `quantize(filters=...)`: a regex (or list of them) searched in the layer's
    name, or a callable on the layer; None matches every layer."""
    if filters is None:
        return True
    if isinstance(filters, str):
        return re.search(filters, layer.name) is not None
    if isinstance(filters, (list, tuple)):
        return any(re.search(f, layer.name) is not None for f in filters)
    return bool(filters(layer))


def quantize(model, keras_quantize, mode=None, config=None, filters=None, **kwargs):
    """Quantize `model` in place; returns what its config remembers ({"mode", "config", "filters"}).

    `keras_quantize` is Keras' `Model.quantize` bound to `model` (the leaf layers); the
    attention layers are quantized here for int8. See `VisionTransformer.quantize`.
    """
    from keras_vit.layers.transformer import MultiHeadDotProductAttention

    with warnings.catch_warnings():
        # Keras names every layer without a quantize method (norms, tokens): expected here.
        warnings.filterwarnings("ignore", message=".*does not have a `quantize` method.*")
        with one_garbage_collection():
            keras_quantize(mode, config=config, filters=filters, **kwargs)
            attention = []
            if getattr(config, "mode", mode) == "int8":
                attention = [
                    layer
                    for layer in model._flatten_layers()
                    if isinstance(layer, MultiHeadDotProductAttention)
                    and not getattr(layer, "cross_attention_only", False)
                    and matches(layer, filters)
                ]
                for layer in attention:
                    layer.quantize("int8", config=config)
        if attention:
            model.train_function = model.test_function = model.predict_function = None
            model._post_quantize("int8")
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
            stacklevel=3,
        )
    return remembered


def restore_arguments(quantization):
    """The `quantize` arguments of a remembered quantization (a config's "quantization" field)."""
    quantization = dict(quantization) if isinstance(quantization, dict) else {"mode": quantization}
    if isinstance(quantization.get("config"), dict):
        quantization["config"] = keras.saving.deserialize_keras_object(quantization["config"])
    return quantization
