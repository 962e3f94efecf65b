"""keras_vit: the Vision Transformer (Dosovitskiy et al., ICLR 2021) for Keras 3.

    import keras_vit
    model = keras_vit.ViTB16(weights=None, input_shape=(384, 384, 3), classes=10)
"""

from keras_vit.version import __version__  # noqa: F401

import os as _os
import sys as _sys


def _import_public_api():
    """Import the public API into this module; importing `layers` registers every layer with
    keras.saving."""
    # === Models ===
    from keras_vit import layers  # noqa: F401
    from keras_vit.applications import ALL_CONSTRUCTORS
    from keras_vit.models import get_weight_tree, set_weight_tree  # noqa: F401
    from keras_vit.models.family import families, family_of, import_model_classes  # noqa: F401

    # Every family's model class (VisionTransformer, BiTResNet, ...), imported so that it is
    # registered with keras.saving: a saved model of any family loads with safe_mode on.
    model_classes = import_model_classes()

    # === Checkpoints, presets and loading ===
    from keras_vit.checkpoints import CheckpointError, read_checkpoint, save_preset, write_npz  # noqa: F401
    from keras_vit.flops import flops, pretraining_exaflops  # noqa: F401
    from keras_vit.applications import preprocess_input  # noqa: F401
    from keras_vit.imagenet import decode_predictions  # noqa: F401
    from keras_vit.layers.resize import resize_patch_embedding, resize_position_embedding  # noqa: F401
    from keras_vit.loading import build_from_checkpoint as build_model  # noqa: F401
    from keras_vit.loading import load_checkpoint  # noqa: F401
    from keras_vit.presets import list_presets  # noqa: F401

    # === Data, training, analysis, distribution, performance ===
    from keras_vit import analysis, data, performance, training  # noqa: F401
    from keras_vit.distribution import get_layout_map  # noqa: F401
    from keras_vit.export import export_many, export_model, export_models  # noqa: F401  (TensorFlow loads on use)
    from keras_vit.models import ViTConfig, feature_extractor  # noqa: F401

    public = {k: v for k, v in locals().items() if k not in ("ALL_CONSTRUCTORS", "model_classes", "import_model_classes")}
    globals().update(public, **model_classes, **ALL_CONSTRUCTORS)


def _public_names():
    """The names of the public API: the functions and modules below, every family's model class
    and every constructor (read from the family records, without importing Keras)."""
    from keras_vit.models.family import families

    names = [
        "__version__", "layers", "get_weight_tree", "set_weight_tree", "families", "family_of",
        "CheckpointError", "read_checkpoint", "save_preset", "write_npz", "flops", "pretraining_exaflops",
        "decode_predictions", "preprocess_input", "resize_patch_embedding", "resize_position_embedding",
        "build_model", "load_checkpoint", "list_presets", "analysis", "data", "performance", "training",
        "get_layout_map", "export_many", "export_model", "export_models", "ViTConfig", "feature_extractor",
    ]
    names += [f.class_name for f in families()]
    names += [name for f in families() for name in f.architectures]
    return names


__all__ = _public_names()


def _started_as_command():
    """True in the `keras-vit` console script: it imports only what each subcommand needs, so
    `keras-vit --help` and `keras-vit presets` start without loading a Keras backend."""
    argv0 = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    return argv0.removesuffix(".exe") == "keras-vit"


def _registered_later(name):
    """The model class or a constructor of a family that `register_family` added after keras_vit
    was imported (looked up on each access, so an unregistered family's names go with it)."""
    from keras_vit.applications import constructor_of
    from keras_vit.models.family import families

    for family in families():
        if name == family.class_name:
            return family.model_class()
    try:
        return constructor_of(name)
    except AttributeError:
        raise AttributeError(f"module 'keras_vit' has no attribute {name!r}") from None


if _started_as_command():

    def __getattr__(name):  # the public API, imported on first use (PEP 562)
        import importlib
        import importlib.util

        if name.startswith("__"):
            raise AttributeError(name)
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule: that one only
            return importlib.import_module(f"{__name__}.{name}")
        _import_public_api()
        if name in globals():
            return globals()[name]
        return _registered_later(name)

else:
    _import_public_api()

    def __getattr__(name):  # a family registered at run time (PEP 562: only names not found above)
        if name.startswith("__"):
            raise AttributeError(name)
        return _registered_later(name)
