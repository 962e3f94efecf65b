"""The programs in applications/ run on tiny data (each one run by a test)."""

import os
import runpy

import pytest
from conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _program(name):
    return runpy.run_path(os.path.join(ROOT, "applications", name), run_name="applications_test")


@pytest.mark.slow
def test_finetune_then_fewshot_programs(tmp_path, capsys):
    saved = str(tmp_path / "model.keras")
    # 150 steps from scratch on the 10 digit classes (chance 0.1) reach 0.32 on JAX CPU; a model
    # that does not learn (or a broken pipeline) stays near chance.
    accuracy = _program("finetune_cifar.py")["main"](
        ["--data", "digits", "--steps", "150", "--batch-size", "32", "--image-size", "16", "--lr", "0.03",
         "--save", saved]
    )
    assert accuracy >= 0.2 and os.path.isfile(saved)
    assert "digits test accuracy: " in capsys.readouterr().out
    # Few-shot digits from the saved model's frozen features: 2-shot measured 0.28-0.40 from such
    # models (chance 0.1; constant or NaN features give chance).
    results = _program("fewshot_eval.py")["main"](
        ["--weights", saved, "--data", "digits", "--shots", "1,2", "--max-images", "120"]
    )
    assert set(results) == {1, 2} and results[2] >= 0.2
    assert "digits: 2-shot linear accuracy" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.optimized_xla
@pytest.mark.skipif(BACKEND != "jax", reason="the training claim is measured on JAX; the TensorFlow pass runs the "
                    "program briefly")
def test_segment_shapes_program(tmp_path, capsys):
    # The small ViT from scratch, its last block's (batch, 8, 8, 64) map through ViTDet's simple
    # feature pyramid (levels of 32, 16, 8 and 4 positions a side), a 1x1 conv head, 8 epochs of
    # 250 images (the program's default is 12 of 1,000): mean IoU 0.352 measured on JAX, 0.372
    # with 500 images (background everywhere: 0.16; a perfect figure-ground split with the shape
    # classes at chance: about 0.31).
    result = _program("segment_shapes.py")["main"](
        ["--out", str(tmp_path), "--train", "250", "--epochs", "8", "--test", "200"])
    assert result["iou"]["background"] >= 0.9
    assert result["mean_iou"] >= 0.3
    assert os.path.getsize(tmp_path / "segment_shapes.png") > 10_000
    assert "shapes segmentation: mean IoU" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.skipif(BACKEND == "jax", reason="the JAX pass trains the program in full")
def test_segment_shapes_program_runs_briefly(tmp_path, capsys):
    # The program on this backend: the pyramid, the head, training, prediction, the IoU table and
    # the picture, in two training steps (no accuracy claim; the layers are tested on every backend
    # in test_features.py).
    result = _program("segment_shapes.py")["main"](
        ["--out", str(tmp_path), "--train", "64", "--epochs", "1", "--test", "20"])
    assert set(result["iou"]) == {"background", "circle", "square", "triangle", "cross"}
    assert 0 <= result["mean_iou"] <= 1
    assert os.path.getsize(tmp_path / "segment_shapes.png") > 10_000
    assert "shapes segmentation: mean IoU" in capsys.readouterr().out
