"""`keras-vit finetune`, `keras-vit fewshot` and `run_vtab` feed a model the input its weights
expect: a tiny ViT with CLIP's mean and std (`input_normalization`, as timm's CLIP and EVA-02
weights have) gets (pixels / 255 - mean) / std, checked against that normalisation written here in
NumPy: finetune's final test loss, the few-shot features, VTAB's training batches and top-1.

Images are saved at the model's size (16 px), so the evaluation resize keeps every pixel.
"""

import json

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.cli import main

MEAN = np.array((0.48145466, 0.4578275, 0.40821073))
STD = np.array((0.26862954, 0.26130258, 0.27577711))
ARCH = dict(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32)


def _by_hand(pixels):
    """CLIP's normalisation of uint8 pixels, in NumPy."""
    return ((pixels / 255.0 - MEAN) / STD).astype("float32")


def _cross_entropy(logits, labels):
    logits = np.asarray(logits, np.float64)
    logits = logits - logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return -log_p[np.arange(len(labels)), labels].mean()


@pytest.fixture(scope="module")
def clip_normalised(tmp_path_factory):
    """A tiny CLIP-normalised ViT with a random 3-class head as a .keras file, and an image folder
    (train: 12 images, test: 6) of its size."""
    root = tmp_path_factory.mktemp("normalised")
    keras.utils.set_random_seed(0)
    model = keras_vit.VisionTransformer(**ARCH, classes=3, classifier_activation=None,
                                        input_normalization=(tuple(MEAN), tuple(STD)))
    rng = np.random.default_rng(0)
    for var in model.weights:  # a head and biases that are not zero; a patch embedding of the
        # position embedding's scale, so that the first LayerNorm keeps the input's scale and offset
        std = 0.01 if var.path.endswith("embedding/kernel") else 0.3
        var.assign(rng.normal(0, std, var.shape).astype(var.dtype))
    model.save(root / "model.keras")
    data = {}
    for split, count in (("train", 12), ("test", 6)):
        pixels = rng.integers(0, 256, (count, 16, 16, 3), dtype=np.uint8)
        labels = np.arange(count) % 3
        for i, (image, label) in enumerate(zip(pixels, labels)):
            folder = root / "data" / split / f"class{label}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(folder / f"{i:02d}.png")
        data[split] = (pixels, labels)
    return dict(root=root, model=str(root / "model.keras"), data=str(root / "data"), images=data)


def test_finetune_evaluates_on_normalised_images(clip_normalised, tmp_path):
    out = tmp_path / "run"
    assert main(["finetune", "--weights", clip_normalised["model"], "--data", clip_normalised["data"],
                 "--batch-size", "6", "--steps", "4", "--eval-every", "4", "--warmup", "1", "--lr", "0.5",
                 "--verbose", "0", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    trained = keras.saving.load_model(out / "model.keras")
    assert trained.config.input_normalization == (tuple(MEAN), tuple(STD))
    pixels, labels = clip_normalised["images"]["test"]
    reference = _cross_entropy(trained.predict(_by_hand(pixels), verbose=0), labels)
    assert metrics["test_loss"] == pytest.approx(reference, rel=1e-5)
    # The [-1, 1] input would have given another loss.
    unit_range = _cross_entropy(trained.predict((pixels / 127.5 - 1).astype("float32"), verbose=0), labels)
    assert abs(unit_range - reference) > 1e-3


def test_fewshot_features_are_of_normalised_images(clip_normalised, tmp_path, monkeypatch):
    from keras_vit import training

    seen = []
    real = training.fewshot_linear_eval

    def recording(train_x, train_y, test_x, test_y, **kwargs):
        seen.append(np.array(test_x))
        return real(train_x, train_y, test_x, test_y, **kwargs)

    monkeypatch.setattr(training, "fewshot_linear_eval", recording)
    assert main(["fewshot", "--weights", clip_normalised["model"], "--data", clip_normalised["data"], "--shots", "2",
                 "--batch-size", "6", "--out", str(tmp_path / "fewshot")]) == 0
    features = keras_vit.load_checkpoint(clip_normalised["model"], include_top=False, pooling="token")
    pixels, _ = clip_normalised["images"]["test"]
    reference = features.predict(_by_hand(pixels), verbose=0)
    (got,) = seen
    order = lambda a: a[np.lexsort(a.T[::-1])]  # noqa: E731  (the folder's order is the pipeline's)
    np.testing.assert_allclose(order(got), order(reference), rtol=1e-5, atol=1e-6)


@pytest.mark.backend_independent  # VTAB's pipelines are TensorFlow on every backend
def test_vtab_trains_and_evaluates_on_normalised_images(clip_normalised, tmp_path, monkeypatch):
    import tensorflow_datasets as tfds

    import keras_vit.data as kd
    from keras_vit import evaluation
    from keras_vit.data import VTAB_TASKS
    from keras_vit.evaluation import evaluators

    batches, evaluated = [], []
    real_load, real_evaluate = kd.load_dataset, evaluators.evaluate_classifier

    def recording_load(data, split, **kwargs):
        ds, info = real_load(data, split, **kwargs)
        if kwargs.get("training"):  # the batch VTAB trains on, and the same pipeline at [-1, 1]
            plain, _ = real_load(data, split, **dict(kwargs, normalization=None))
            batches.append((next(iter(ds))[0].numpy(), next(iter(plain))[0].numpy()))
        return ds, info

    def recording_evaluate(model, data, split, **kwargs):
        result = real_evaluate(model, data, split, **kwargs)
        evaluated.append((model, data, split, kwargs, result))
        return result

    monkeypatch.setattr(kd, "load_dataset", recording_load)
    monkeypatch.setattr(evaluators, "evaluate_classifier", recording_evaluate)
    task = VTAB_TASKS[0]
    base = keras_vit.load_checkpoint(clip_normalised["model"])
    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        result = evaluation.run_vtab(base, str(tmp_path / "vtab"), tasks=[task], steps=1, batch_size=2,
                                     image_size=16, verbose=0)
        (fed, plain), = batches
        # Training: the [-1, 1] pipeline's images (the same crops and flips), normalised by hand.
        np.testing.assert_allclose(fed, (((plain + 1) / 2 - MEAN) / STD).astype("float32"), rtol=1e-6, atol=1e-6)
        # Evaluation: top-1 of the trained task model on the test images normalised by hand.
        (model, data, split, kwargs, _), = evaluated
        images, labels, _ = kd.as_arrays(data, split, image_size=16, data_dir=kwargs.get("data_dir"))
    logits = model.predict(((images + 1) / 2 - MEAN) / STD, verbose=0)
    assert result["tasks"][0]["top1"] == pytest.approx(float(np.mean(np.argmax(logits, -1) == labels)))
