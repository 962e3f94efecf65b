"""Input pipelines: tensorflow-datasets, image folders and embedded data, with the paper's
preprocessing (Inception crop + flip for training, resize for evaluation, pixels in [-1, 1]).

    ds, info = keras_vit.data.load_dataset("tfds:cifar100", "train", image_size=384,
                                           batch_size=512, training=True)
"""

from keras_vit.data.embedded import EMBEDDED_DATASETS, SHAPE_CLASSES, load_digits, load_embedded, make_shapes  # noqa: F401
from keras_vit.data.folder import IMAGE_EXTENSIONS, index_image_folder  # noqa: F401
from keras_vit.data.pipeline import INCEPTION_AREA_RANGE, INCEPTION_ASPECT_RANGE, DatasetInfo, as_arrays, load_dataset, load_source  # noqa: F401
from keras_vit.data.tfds_sources import (  # noqa: F401
    TFDS_DATASETS,
    VTAB_TASKS,
    DatasetNotPreparedError,
    TfdsSource,
    get_tfds_source,
)

_PREPROCESSING = ("eval_preprocess", "inception_crop", "inception_crop_box", "random_flip", "scale_to_unit_range",
                  "train_preprocess")


def __getattr__(name):
    # TensorFlow is imported when a pipeline is built or a preprocessing function is first used,
    # so that `import keras_vit` stays light.
    if name == "preprocessing" or name in _PREPROCESSING:
        import importlib

        module = importlib.import_module("keras_vit.data.preprocessing")
        return module if name == "preprocessing" else getattr(module, name)
    raise AttributeError(f"module 'keras_vit.data' has no attribute {name!r}")
