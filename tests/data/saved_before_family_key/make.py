"""Writes the tiny .keras files and preset folders of this folder, one per model family, with the
code that wrote configs without a `family` key, and the outputs they give on a fixed input.

    PYTHONPATH=<that code> KERAS_BACKEND=jax python tests/data/saved_before_family_key/make.py
"""

import os

import numpy as np

import keras_vit

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {
    "vit": lambda: keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=8, num_layers=1,
                                               num_heads=2, mlp_dim=8, classes=3, classifier_activation=None),
    "bit": lambda: keras_vit.models.BiTResNet(image_size=32, block_units=[1], width_factor=0.5, classes=3, classifier_activation=None),
    "axial_vit": lambda: keras_vit.models.AxialVisionTransformer(image_size=32, patch_size=8, hidden_size=8,
                                                                 num_layers=1, num_heads=2, mlp_dim=8, classes=3, classifier_activation=None),
    "axial_resnet": lambda: keras_vit.models.AxialResNet(image_size=32, block_units=[1],
                                                         width_multiplier=0.125, groups=1, classes=3, classifier_activation=None),
    "efficientnet": lambda: keras_vit.models.EfficientNet(image_size=32, width_multiplier=0.01,
                                                          depth_multiplier=0.1, classes=3, classifier_activation=None),
}


def main():
    import keras

    keras.utils.set_random_seed(0)
    images = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    np.save(os.path.join(HERE, "images.npy"), images)
    for name, make in MODELS.items():
        model = make()
        rng = np.random.default_rng(1)
        for v in model.weights:  # random weights everywhere (zero heads would give equal logits)
            value = rng.normal(0, 0.3, v.shape)
            if "variance" in v.path:
                value = np.abs(value) + 0.5
            elif any(k in v.path for k in ("scale", "gamma")):
                value += 1.0
            v.assign(value.astype(v.dtype))
        model.save(os.path.join(HERE, f"{name}.keras"))
        if name != "efficientnet":  # its .keras file covers it (the preset writes the same config)
            keras_vit.save_preset(model, os.path.join(HERE, f"{name}_preset"), readme=False)
        np.save(os.path.join(HERE, f"{name}_outputs.npy"), np.asarray(model.predict(images, verbose=0)))


if __name__ == "__main__":
    main()
