"""One entry point for every format: detect it, read it into (tree, config), build the model."""

import os

from keras_vit.checkpoints.common import CheckpointError, materialize, read_json, source_grid
from keras_vit.models.weight_tree import set_weight_tree, weight_variables

#: Formats `read_checkpoint` knows, by the name `detect_format` returns.
FORMATS = ("npz", "timm", "transformers", "keras_preset", "keras", "keras_weights")

_SUPPORTED = (
    "an original .npz or BiT .npz, a timm Hub folder (model.safetensors + config.json with 'architecture') or "
    "timm .safetensors, a transformers ViT folder (config.json + model.safetensors), a Keras preset "
    "folder (config.json + model.weights.h5), a .keras file, or a .weights.h5 with config.json beside it"
)


def _sniff(path):
    with open(path, "rb") as f:
        head = f.read(8)
    if head[:4] == b"PK\x03\x04" or head[:4] == b"PK\x05\x06":
        import zipfile

        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except zipfile.BadZipFile:
            return "npz"  # damaged zip; the npz reader reports it
        return "keras" if "config.json" in names and "model.weights.h5" in names else "npz"
    if head == b"\x89HDF\r\n\x1a\n":
        return "keras_weights"
    if len(head) == 8 and int.from_bytes(head, "little") < os.path.getsize(path):
        return "safetensors"
    return None


def _safetensors_flavour(path):
    """timm or transformers, from the tensor names of a .safetensors (or its index)."""
    if path.endswith(".index.json"):
        keys = list(read_json(path).get("weight_map", {}))
    else:
        from keras_vit.checkpoints.common import SafetensorsFile

        keys = SafetensorsFile(path).keys()
    if any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in keys):
        return "transformers"
    return "timm"


def detect_format(path):
    """The format name (one of FORMATS) of the local checkpoint `path`."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No checkpoint at {path!r}.")
    if os.path.isdir(path):
        config_path = os.path.join(path, "config.json")
        config = read_json(config_path) if os.path.exists(config_path) else {}
        if "architecture" in config:
            return "timm"
        if config.get("model_type") or "architectures" in config:
            return "transformers"
        if os.path.exists(os.path.join(path, "model.weights.h5")):
            return "keras_preset"
        for name in ("model.safetensors", "model.safetensors.index.json"):
            if os.path.exists(os.path.join(path, name)):
                return _safetensors_flavour(os.path.join(path, name))
        npz = [f for f in os.listdir(path) if f.endswith(".npz")]
        if len(npz) == 1:
            return "npz"
        raise CheckpointError(f"{path!r} is a folder but holds no checkpoint this package reads; expected {_SUPPORTED}.")
    name = os.path.basename(path)
    if name.endswith(".npz"):
        return "npz"
    if name.endswith(".keras"):
        return "keras"
    if name.endswith(".h5"):
        return "keras_weights"
    if name.endswith((".safetensors", ".safetensors.index.json")):
        return _safetensors_flavour(path)
    if name.endswith((".bin", ".pt", ".pth", ".ckpt", ".pkl")):
        raise CheckpointError(
            f"{path!r} is a pickled PyTorch file; this package never unpickles (it can run arbitrary code). "
            "Convert it to safetensors (save_pretrained(..., safe_serialization=True), or timm's "
            "save_for_hf(..., safe_serialization=True))."
        )
    sniffed = _sniff(path)
    if sniffed == "safetensors":
        return _safetensors_flavour(path)
    if sniffed:
        return sniffed
    raise CheckpointError(f"Unknown checkpoint format of {path!r}; expected {_SUPPORTED}.")


def read_checkpoint(path):
    """Read a local checkpoint into (canonical weight tree, VisionTransformer kwargs).

    The kwargs hold the architecture inferred from the checkpoint itself (shapes and its own
    config file) and the numerics of its source framework; the tree's values are float32 numpy
    arrays.

    Example:
        >>> tree, config = keras_vit.read_checkpoint("vit_tiny_patch16_224/")   # doctest: +SKIP
        >>> config["num_heads"], config["gelu_approximate"]
        (3, False)
    """
    tree, config = _read(path)
    return materialize(tree), config


def _read(path):
    """read_checkpoint, leaving safetensors weights lazy (read when assigned)."""
    from keras_vit.checkpoints import bit

    path = os.fspath(path)
    fmt = detect_format(path)
    if fmt == "npz":
        from keras_vit.checkpoints.npz import read_npz

        if os.path.isdir(path):
            path = os.path.join(path, next(f for f in os.listdir(path) if f.endswith(".npz")))
        if bit.detect_bit_npz(path):
            return bit.read_bit_npz(path)
        return read_npz(path)
    if fmt == "timm":
        from keras_vit.checkpoints.timm import read_timm

        if bit.detect_timm_bit(path):
            return bit.read_timm_bit(path, lazy=True)
        return read_timm(path, lazy=True)
    if fmt == "transformers":
        from keras_vit.checkpoints.transformers import read_transformers

        return read_transformers(path, lazy=True)
    from keras_vit.checkpoints import keras_format

    if fmt == "keras_preset":
        return keras_format.read_keras_preset(path)
    if fmt == "keras":
        return keras_format.read_keras_file(path)
    return keras_format.read_weights_h5(path)


def build_model(
    tree,
    config,
    *,
    image_size=None,
    include_top=True,
    classes=None,
    pooling=None,
    classifier_activation=None,
    **overrides,
):
    """Build a VisionTransformer from a checkpoint's (tree, config) and assign the weights.

    Args:
        tree, config: what `read_checkpoint` returns.
        image_size: int or (height, width); position embeddings are resized from the
            checkpoint's grid with the source's rule (config["position_embedding_resize"]).
        include_top: False drops the head (and `pre_logits` unless `pooling` is set).
        classes: a number other than the checkpoint's attaches a fresh zero-initialised head
            (keeping `pre_logits`); None keeps the checkpoint's head.
        pooling: with include_top=False, None / "token" / "gap" / "max" (see VisionTransformer).
        classifier_activation: activation of the head; None returns logits.
        **overrides: other VisionTransformer arguments (dropout_rate, dtype, name, ...).

    Raises:
        WeightTreeError when the tree does not fit (the model is then never partly assigned);
        ValueError for impossible requests (e.g. no head in the checkpoint and classes=None).
    """
    from keras_vit.layers.init_scope import skip_random_init
    from keras_vit.models.bit import is_bit_config
    from keras_vit.models.vit import VisionTransformer

    if is_bit_config(config):
        from keras_vit.checkpoints.bit import build_bit_model

        return build_bit_model(
            tree, config, image_size=image_size, include_top=include_top, classes=classes, pooling=pooling,
            classifier_activation=classifier_activation, **overrides,
        )
    kwargs = dict(config)
    ckpt_classes = kwargs.get("classes")
    fresh_head = False
    if include_top:
        if classes is None and ckpt_classes is None:
            raise ValueError(
                "This checkpoint has no classification head. Pass classes=N to attach a fresh one "
                "(zero-initialised, to be fine-tuned), or include_top=False for features."
            )
        if classes is not None and classes != ckpt_classes:
            kwargs["classes"] = int(classes)
            fresh_head = True
    elif classes is not None:
        kwargs["classes"] = int(classes)
    if kwargs.get("classes") is None:
        kwargs["classes"] = 1000  # unused without a top; VisionTransformer stores it only
    if image_size is not None:
        kwargs["image_size"] = image_size
    kwargs.update(include_top=include_top, pooling=pooling, classifier_activation=classifier_activation)
    kwargs.update(overrides)
    with skip_random_init():  # every weight is assigned below (or is the zero fresh head)
        model = VisionTransformer(**kwargs)

    present = {k.split("/", 1)[0] for k in weight_variables(model)}
    skip = tuple(f"{p}/" for p in ("head", "pre_logits") if p not in present)
    allow_missing = ()
    if fresh_head:
        skip += ("head/",)
        allow_missing = ("head/",)
    set_weight_tree(
        model,
        tree,
        source_grid=source_grid(config),
        resize_rule=config.get("position_embedding_resize"),
        skip=skip,
        allow_missing=allow_missing,
    )
    return model


def _is_local(source):
    return os.path.exists(os.fspath(source))


def resolve(source, image_size=None):
    """A local path for `source`: itself when it exists, otherwise what the presets/Hub side
    (keras_vit.presets.resolve_source) downloads or finds in the cache."""
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"source must be a path or a string; got {type(source).__name__}.")
    if _is_local(source):
        return os.fspath(source)
    source = os.fspath(source)
    looks_local = source.startswith((".", "/", "~")) or source.endswith(
        (".npz", ".keras", ".h5", ".safetensors", ".json")
    )
    if looks_local and not source.startswith("hf://"):
        raise FileNotFoundError(
            f"No checkpoint at {source!r}. Pass an existing file or folder, 'hf://owner/repo', or a preset "
            "name (keras_vit.list_presets())."
        )
    from keras_vit import presets

    resolver = getattr(presets, "resolve_source", None)
    if resolver is None:
        raise NotImplementedError(f"Cannot resolve {source!r}: Hub and preset downloads are not available yet.")
    return os.fspath(resolver(source, image_size=image_size))


def load_checkpoint(
    source, *, image_size=None, include_top=True, classes=None, pooling=None, classifier_activation=None
):
    """Load any supported checkpoint as a keras_vit VisionTransformer (or BiTResNet, for BiT weights).

    The architecture and the source framework's numerics are read from the checkpoint itself.

    Args:
        source: an original .npz, a timm folder or .safetensors, a transformers folder, a Keras
            preset folder, a .keras or .weights.h5 file; or "hf://owner/repo" / a preset name
            (resolved to a local copy by keras_vit.presets).
        image_size: int or (height, width) to run at; position embeddings are resized with the
            source's own rule. Default: the checkpoint's resolution.
        include_top, classes, pooling, classifier_activation: as in `build_model`
            (classifier_activation None returns logits).

    Example:
        >>> model = keras_vit.load_checkpoint("ViT-B_16.npz", image_size=384)   # doctest: +SKIP
    """
    path = resolve(source, image_size=image_size)
    # Lazy: the model is built before the weights are read, one tensor at a time.
    tree, config = _read(path)
    return build_model(
        tree,
        config,
        image_size=image_size,
        include_top=include_top,
        classes=classes,
        pooling=pooling,
        classifier_activation=classifier_activation,
    )
