"""`make demo` (python -m keras_vit.demo): pre-training on the digits 0-4 transfers to the digits 5-9
with few labels at a higher resolution, and beats the same ViT trained from scratch."""

import json
import os
import re

import keras
import pytest

import keras_vit
from conftest import BACKEND
from keras_vit import demo

# What a demo run writes into its run folder.
RUN_FILES = {"config.json", "metrics.json", "metrics.csv", "history.csv", "curves.png", "attention_rollout.png",
             "pretrained.keras", "model.keras", "scratch.keras"}


@pytest.mark.slow
@pytest.mark.optimized_xla
@pytest.mark.skipif(BACKEND != "jax", reason="`make demo` runs on JAX; the other passes run its --quick form")
def test_demo_transfer_beats_training_from_scratch(tmp_path, capsys):
    fine_tuned, scratch = demo.main(["--out", str(tmp_path), "--verbose", "0", "--seed", "0"])
    lines = capsys.readouterr().out.strip().splitlines()
    match = re.fullmatch(r"test accuracy: ([01]\.\d{4}) \(from scratch: ([01]\.\d{4})\)", lines[-1])
    assert match, lines[-3:]
    assert (float(match.group(1)), float(match.group(2))) == (round(fine_tuned, 4), round(scratch, 4))
    # Five classes: chance is 0.2, and a model that did not learn (or a broken transfer) stays far
    # below 0.7; the pre-trained one must beat the one trained from scratch by 5 points.
    assert fine_tuned >= 0.7
    assert fine_tuned > scratch + 0.05
    assert any("position embeddings resized (4, 4) -> (8, 8)" in line for line in lines)
    files = set(os.listdir(tmp_path))
    assert RUN_FILES <= files
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["labelled_examples"] == 5 * demo.LABELS_PER_CLASS
    assert metrics["test_examples"] == 167  # the test images of the digits 5-9
    stages = [row.split(",")[0] for row in (tmp_path / "history.csv").read_text().splitlines()[1:]]
    assert stages == ["pretrain"] * 2 + ["finetune"] * 2 + ["scratch"] * 2
    pretrained = keras.saving.load_model(tmp_path / "pretrained.keras")
    finetuned = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(finetuned, keras_vit.VisionTransformer)
    assert pretrained.image_size == (16, 16) and finetuned.image_size == (32, 32) and finetuned.grid_size == (8, 8)
    assert pretrained.classes == 5 and finetuned.classes == 5


def test_few_labels_are_drawn_per_class_and_relabelled():
    import numpy as np

    labels = np.array([5, 6, 7, 8, 9, 0, 1] * 20)
    images = np.arange(len(labels))
    x, y = demo.select(images, labels, demo.TRANSFER_CLASSES, per_class=10, seed=3)
    assert len(x) == 50 and sorted(set(y.tolist())) == [0, 1, 2, 3, 4]
    assert all(labels[x][y == i].tolist() == [c] * 10 for i, c in enumerate(demo.TRANSFER_CLASSES))
    again, _ = demo.select(images, labels, demo.TRANSFER_CLASSES, per_class=10, seed=3)
    assert again.tolist() == x.tolist()


@pytest.mark.parametrize("pipeline", ["demo", "load_dataset"])
def test_training_batches_are_the_same_from_every_iterator(pipeline):
    # Keras' fit opens one iterator to build the model, drops it after its prefetching has read
    # ahead, and trains from a second one; the fine-tuned and the from-scratch runs iterate the same
    # dataset. Each must see the batches a fresh dataset gives. (tf.data's reshuffle_each_iteration
    # gave each iterator other epochs, in an order that depended on how far the others had read.)
    import numpy as np

    from keras_vit import data

    def batches(iterator, n=12):  # 12 batches of 4 from 10 images: about 5 epochs
        return [tuple(np.asarray(t) for t in next(iterator)) for _ in range(n)]

    def dataset():
        if pipeline == "demo":
            images = np.random.default_rng(0).integers(0, 256, (10, 8, 8, 3)).astype("uint8")
            return demo.make_dataset(images, np.arange(10) % 5, 16, 4, True, seed=3)
        return data.load_dataset("shapes", "train[:10]", image_size=16, batch_size=4, training=True, seed=3)[0]

    ds = dataset()
    read_ahead = iter(ds)
    first = batches(read_ahead)
    second = batches(iter(ds))
    fresh = batches(iter(dataset()))
    for (x1, y1), (x2, y2), (x3, y3) in zip(first, second, fresh):
        np.testing.assert_array_equal(y1, y2)
        np.testing.assert_array_equal(x1, x2)
        np.testing.assert_array_equal(y1, y3)
        np.testing.assert_array_equal(x1, x3)
    # Shuffled, not in storage order.
    assert np.concatenate([y for _, y in first]).tolist() != (np.arange(48) % 10 % 5).tolist()


def test_demo_runs_as_a_module_with_make():
    # `make demo` runs `python -m keras_vit.demo`: the module must keep its entry point.
    makefile = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "Makefile")).read()
    assert "-m keras_vit.demo" in makefile and callable(demo.main)


@pytest.mark.skipif(BACKEND == "jax", reason="the JAX pass runs the whole demo")
def test_quick_demo_writes_its_run_folder(tmp_path, capsys):
    # The demo on this backend: every stage, file and line of output, in a few steps (no accuracy
    # claim; the training recipes are tested on every backend in test_training*.py).
    demo.main(["--out", str(tmp_path), "--verbose", "0", "--quick"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"test accuracy: [01]\.\d{4} \(from scratch: [01]\.\d{4}\)", lines[-1]), lines[-3:]
    assert any("position embeddings resized (4, 4) -> (8, 8)" in line for line in lines)
    assert RUN_FILES <= set(os.listdir(tmp_path))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["quick"] and metrics["backend"] == BACKEND and metrics["test_examples"] == 167
    finetuned = keras.saving.load_model(tmp_path / "model.keras")
    assert finetuned.image_size == (32, 32) and finetuned.classes == 5
