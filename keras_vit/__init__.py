"""keras_vit: the Vision Transformer (Dosovitskiy et al., ICLR 2021) for Keras 3.

    import keras_vit
    model = keras_vit.ViTB16(weights=None, input_shape=(384, 384, 3), classes=10)
"""

__version__ = "0.1.0"

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

# === Deployment ===
from keras_vit.export import export_model, export_models  # noqa: F401,E402  (TensorFlow loads on use)

# === Data and training ===
from keras_vit import data  # noqa: F401,E402  (tf.data pipelines; TensorFlow loads on first use)
from keras_vit import training  # noqa: F401,E402  (schedules, optimizers, callbacks, few-shot, pilot)

# === Analysis ===
from keras_vit import analysis  # noqa: F401,E402  (light: numpy and keras only)

# === Distribution ===
from keras_vit.distribution import get_layout_map  # noqa: F401,E402
