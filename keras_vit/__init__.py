"""keras_vit: the Vision Transformer (Dosovitskiy et al., ICLR 2021) for Keras 3.

    import keras_vit
    model = keras_vit.ViTB16(weights=None, input_shape=(384, 384, 3), classes=10)
"""

__version__ = "0.1.0"

import os as _os
import sys as _sys


def _started_as_command():
    """True in the `keras-vit` console script, which imports only what each subcommand needs
    (so `keras-vit --help` and `keras-vit presets` start without loading a backend); the public
    API below is then imported on first attribute use instead of here."""
    argv0 = _os.path.basename(_sys.argv[0]) if _sys.argv else ""
    return argv0.removesuffix(".exe") == "keras-vit" and "_PUBLIC_API_LOADED" not in globals()


if _started_as_command():

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        import importlib
        import importlib.util

        if importlib.util.find_spec(f"{__name__}.{name}") is not None:  # a submodule: just that one
            return importlib.import_module(f"{__name__}.{name}")
        global _PUBLIC_API_LOADED
        _PUBLIC_API_LOADED = True
        del globals()["__getattr__"]
        importlib.reload(_sys.modules[__name__])  # runs the imports below, now that the flag is set
        try:
            return globals()[name]
        except KeyError:
            raise AttributeError(f"module 'keras_vit' has no attribute {name!r}") from None

else:

    # === Models ===
    from keras_vit import layers  # noqa: F401  (registers every layer for keras.saving)
    from keras_vit.applications import (  # noqa: F401
        R26ViTB32,
        R26ViTS32,
        R50ViTB16,
        R50ViTB32,
        R50ViTL16,
        R50ViTL32,
        RViTTi16,
        ViTB8,
        ViTB16,
        ViTB32,
        ViTH14,
        ViTL16,
        ViTL32,
        ViTS16,
        ViTS32,
        ViTTi16,
    )
    from keras_vit.models import VisionTransformer, get_weight_tree, set_weight_tree  # noqa: F401

    # === Checkpoints and presets ===
    from keras_vit.checkpoints import (  # noqa: F401,E402
        CheckpointError,
        build_model,
        load_checkpoint,
        read_checkpoint,
        save_preset,
        write_npz,
    )
    from keras_vit.imagenet import decode_predictions, preprocess_input  # noqa: F401,E402
    from keras_vit.presets import list_presets  # noqa: F401,E402

    # === Data and training ===
    from keras_vit import data  # noqa: F401,E402  (tf.data pipelines; TensorFlow loads on first use)
    from keras_vit import training  # noqa: F401,E402  (schedules, optimizers, callbacks, few-shot, pilot)

    # === Analysis ===
    from keras_vit import analysis  # noqa: F401,E402  (light: numpy and keras only)

    # === Distribution ===
    from keras_vit.distribution import get_layout_map  # noqa: F401,E402

    # === Performance ===
    from keras_vit import performance  # noqa: F401,E402  (recommended_jit_compile, per backend and device)
