"""`make demo`: a small ViT trained offline on scikit-learn's digits (upsampled to 32x32)."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_vit  # noqa: E402


def load_digits_images(size=32, seed=0):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = digits.images.astype("float32") / 16.0  # (n, 8, 8) in [0, 1]
    x = np.kron(x, np.ones((size // 8, size // 8), "float32"))[..., None].repeat(3, -1)
    x = x * 2.0 - 1.0
    order = np.random.default_rng(seed).permutation(len(x))
    return x[order], digits.target[order]


def main():
    x, y = load_digits_images()
    n_test = 360
    model = keras_vit.VisionTransformer(
        image_size=32, patch_size=4, hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128, classes=10,
        classifier_activation=None,
    )
    model.compile(
        optimizer=keras.optimizers.AdamW(1e-3, weight_decay=0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(x[n_test:], y[n_test:], batch_size=64, epochs=15, verbose=2)
    _, acc = model.evaluate(x[:n_test], y[:n_test], verbose=0)
    print(f"test accuracy: {acc:.4f}")


if __name__ == "__main__":
    main()
