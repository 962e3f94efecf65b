"""Keras-native checkpoints: .keras files, .weights.h5 (with a config.json next to them) and
Keras preset folders (config.json, metadata.json, model.weights.h5, README.md).

A preset folder is what `save_preset` writes and what the publishing pipeline uploads:
config.json is `VisionTransformer.get_config()` (so the architecture, the numerics and a possibly
non-square resolution travel with the weights), model.weights.h5 is Keras' own weights file.
"""

import datetime
import json
import os

import keras
import numpy as np

from keras_vit.checkpoints.common import ARCHITECTURE_FIELDS, CheckpointError, read_json

CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "model.weights.h5"
README_FILE = "README.md"


_BIT_FIELDS = ("image_size", "block_units", "width_factor", "classes", "num_channels", "group_norm_epsilon",
               "std_conv_epsilon", "std_conv_epsilon_inside_sqrt")


def _unwrap(config, source):
    if "class_name" in config and "config" in config:  # keras.saving.serialize_keras_object form
        if config["class_name"] not in ("VisionTransformer", "BiTResNet"):
            raise CheckpointError(
                f"{source}: config.json describes a {config['class_name']}, not a VisionTransformer or BiTResNet."
            )
        config = config["config"]
    if "block_units" in config:  # a BiTResNet
        return config
    if not {"patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim"} <= set(config):
        raise CheckpointError(
            f"{source}: config.json is not a keras_vit VisionTransformer config (it lacks patch_size, "
            "hidden_size, num_layers, num_heads or mlp_dim)."
        )
    return config


def _model_from_config(config):
    from keras_vit.models.bit import BiTResNet
    from keras_vit.models.vit import VisionTransformer

    kwargs = {k: v for k, v in config.items() if k not in ("name", "trainable", "dtype")}
    if "block_units" in kwargs:
        return BiTResNet(**kwargs)
    if kwargs.get("resnet") is not None:
        units, width = kwargs["resnet"]
        kwargs["resnet"] = (tuple(units), width)
    return VisionTransformer(**kwargs)


def _tree_and_config(model):
    from keras_vit.models.weight_tree import get_weight_tree

    tree = get_weight_tree(model)
    full = model.get_config()
    if "block_units" in full:  # a BiTResNet
        config = {k: full[k] for k in _BIT_FIELDS}
        config["image_size"] = tuple(config["image_size"])
        config["block_units"] = tuple(config["block_units"])
        if not full["include_top"]:
            config["classes"] = None
        return tree, config
    config = {k: full[k] for k in ARCHITECTURE_FIELDS if k in full}
    config["image_size"] = tuple(config["image_size"])
    if config.get("resnet") is not None:
        config["resnet"] = (tuple(config["resnet"][0]), config["resnet"][1])
    config["position_embedding_resize"] = full.get("position_embedding_resize", "original")
    if "head/kernel" not in tree:
        config["classes"] = None
    if "pre_logits/kernel" not in tree:
        config["representation_size"] = None
    return tree, config


def _load_weights_file(model, weights, source):
    try:
        model.load_weights(weights)
    except Exception as err:  # h5py and Keras raise a variety of types for bad files
        if os.path.getsize(weights) == 0 or "truncated" in str(err).lower() or isinstance(err, OSError):
            raise CheckpointError(
                f"Cannot read {weights!r}: the file is truncated or corrupt ({type(err).__name__}: {err}). "
                "Delete it and download or convert it again."
            ) from None
        raise CheckpointError(f"{source}: the weights in {weights!r} do not fit its config.json ({err}).") from None


def read_weights_h5(path, config_path=None):
    """Read a .weights.h5 (Keras' save_weights) with the VisionTransformer config.json beside it."""
    path = os.fspath(path)
    config_path = config_path or os.path.join(os.path.dirname(path), CONFIG_FILE)
    if not os.path.exists(config_path):
        raise CheckpointError(
            f"{path}: a .weights.h5 file holds no architecture; put the model's config.json "
            "(VisionTransformer.get_config()) next to it, or save the model with save_preset()."
        )
    config = _unwrap(read_json(config_path), config_path)
    model = _model_from_config(config)
    _load_weights_file(model, path, config_path)
    return _tree_and_config(model)


def read_keras_preset(folder):
    """Read a Keras preset folder written by `save_preset` -> (canonical tree, config)."""
    folder = os.fspath(folder)
    weights = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.exists(weights):
        raise CheckpointError(f"{folder}: a Keras preset folder needs {WEIGHTS_FILE} next to {CONFIG_FILE}.")
    return read_weights_h5(weights, os.path.join(folder, CONFIG_FILE))


def read_keras_file(path):
    """Read a .keras file holding a keras_vit VisionTransformer or BiTResNet -> (canonical tree, config)."""
    from keras_vit.models.bit import BiTResNet
    from keras_vit.models.vit import VisionTransformer

    path = os.fspath(path)
    try:
        model = keras.saving.load_model(path, compile=False)
    except Exception as err:
        raise CheckpointError(
            f"Cannot read {path!r} ({type(err).__name__}: {err}). The file is truncated or corrupt, or was "
            "not saved from a keras_vit model; save it again with model.save()."
        ) from None
    if not isinstance(model, (VisionTransformer, BiTResNet)):
        raise CheckpointError(f"{path}: holds a {type(model).__name__}, not a keras_vit VisionTransformer or BiTResNet.")
    return _tree_and_config(model)


# === Writer ===

_CARD = """---
library_name: keras
tags:
- keras_vit
- vision-transformer
- image-classification
---
# {title}

Vision Transformer weights for [keras_vit](https://github.com/) (Keras 3: JAX, TensorFlow,
PyTorch), from "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021).

| | |
|---|---|
| architecture | {arch} |
| image size | {image_size} |
| classes | {classes} |
| parameters | {params:,} |
| numerics | LayerNorm eps {layer_norm_epsilon:g}, GELU {gelu}, position-embedding resize "{resize}" |
{extra}
## Usage

```python
import keras_vit

model = keras_vit.load_checkpoint("{source}")
# inputs: channels-last images scaled to [-1, 1] (keras_vit.preprocess_input)
```
"""


def _bit_model_card(model, metadata, folder):
    c = model.get_config()
    text = _BIT_CARD.format(
        title=metadata.get("name") or os.path.basename(os.path.abspath(folder)),
        units=tuple(c["block_units"]),
        width=c["width_factor"],
        image_size="x".join(str(s) for s in c["image_size"]),
        classes=c["classes"] if c["include_top"] else "none (feature extractor)",
        params=model.count_params(),
        gn=c["group_norm_epsilon"],
        ws=c["std_conv_epsilon"],
        extra="".join(
            f"| {k} | {v} |\n" for k, v in metadata.items() if isinstance(v, (str, int, float)) and k != "description"
        ),
        source=metadata.get("hub_id", os.path.abspath(folder)),
    )
    if metadata.get("description"):
        text += "\n" + str(metadata["description"]).strip() + "\n"
    return text


_BIT_CARD = """---
library_name: keras
tags:
- keras_vit
- bit
- resnet
- image-classification
---
# {title}

BiT ResNet-v2 weights for keras_vit (Keras 3: JAX, TensorFlow, PyTorch), the CNN baselines of
"An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021) from "Big Transfer (BiT)"
(Kolesnikov et al., 2020).

| | |
|---|---|
| architecture | BiT ResNet-v2, units per stage {units}, width x{width} |
| image size | {image_size} |
| classes | {classes} |
| parameters | {params:,} |
| numerics | GroupNorm eps {gn:g}, weight standardisation eps {ws:g} |
{extra}
## Usage

```python
import keras_vit

model = keras_vit.load_checkpoint("{source}")
# inputs: channels-last images scaled to [-1, 1] (keras_vit.preprocess_input)
```
"""


def _model_card(model, metadata, folder):
    if "block_units" in model.get_config():
        return _bit_model_card(model, metadata, folder)
    c = model.get_config()
    arch = f"hidden {c['hidden_size']}, {c['num_layers']} layers, {c['num_heads']} heads, MLP {c['mlp_dim']}, patch {c['patch_size']}"
    if c.get("resnet"):
        arch += f", BiT ResNet stages {tuple(c['resnet'][0])} width x{c['resnet'][1]}"
    if c["classifier"] == "gap":
        arch += ", global average pooling"
    extra = "".join(
        f"| {k} | {v} |\n" for k, v in metadata.items() if isinstance(v, (str, int, float)) and k != "description"
    )
    text = _CARD.format(
        title=metadata.get("name") or os.path.basename(os.path.abspath(folder)),
        arch=arch,
        image_size="x".join(str(s) for s in c["image_size"]),
        classes=c["classes"] if c["include_top"] else "none (feature extractor)",
        params=model.count_params(),
        layer_norm_epsilon=c["layer_norm_epsilon"],
        gelu="tanh approximation" if c["gelu_approximate"] else "exact (erf)",
        resize=c["position_embedding_resize"],
        extra=extra,
        source=metadata.get("hub_id", os.path.abspath(folder)),
    )
    if metadata.get("description"):
        text += "\n" + str(metadata["description"]).strip() + "\n"
    return text


def _write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def save_preset(model, folder, metadata=None, readme=True):
    """Save a keras_vit model as a Keras preset folder that `load_checkpoint` reads back.

    Writes config.json (the model's get_config()), model.weights.h5, metadata.json (versions,
    parameter count, date and the given `metadata`: e.g. source, license, sha256 of the upstream
    file) and, unless `readme=False`, a README.md model card.

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...     num_layers=1, num_heads=2, mlp_dim=32, classes=3)
        >>> save_preset(model, "/tmp/tiny_preset", metadata={"source": "random"})
        >>> keras_vit.load_checkpoint("/tmp/tiny_preset").output_shape
        (None, 3)
    """
    from keras_vit import __version__
    from keras_vit.models.bit import BiTResNet
    from keras_vit.models.vit import VisionTransformer

    if not isinstance(model, (VisionTransformer, BiTResNet)):
        raise TypeError(f"save_preset expects a keras_vit VisionTransformer or BiTResNet; got {type(model).__name__}.")
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    metadata = dict(metadata or {})
    config = model.get_config()
    weights = os.path.join(folder, WEIGHTS_FILE)
    tmp = os.path.join(folder, "tmp." + WEIGHTS_FILE)
    model.save_weights(tmp)
    os.replace(tmp, weights)
    _write_text(os.path.join(folder, CONFIG_FILE), json.dumps(config, indent=2, default=_json_default) + "\n")
    meta = {
        "keras_vit_version": __version__,
        "keras_version": keras.__version__,
        "parameter_count": int(model.count_params()),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **metadata,
    }
    _write_text(os.path.join(folder, METADATA_FILE), json.dumps(meta, indent=2, default=_json_default) + "\n")
    if readme:
        _write_text(os.path.join(folder, README_FILE), _model_card(model, metadata, folder))
    return folder


def _json_default(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
