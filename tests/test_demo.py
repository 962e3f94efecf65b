"""`make demo` (python -m keras_vit.demo) in its quick mode: run folder and final line."""

import json
import os
import re

import keras
import pytest

import keras_vit
from keras_vit import demo


@pytest.mark.slow
def test_demo_quick_mode(tmp_path, capsys):
    demo.main(["--quick", "--out", str(tmp_path), "--verbose", "0"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"test accuracy: [01]\.\d{4}", lines[-1]), lines[-3:]
    assert any("position embeddings resized (4, 4) -> (8, 8)" in line for line in lines)
    files = set(os.listdir(tmp_path))
    assert {"config.json", "metrics.json", "metrics.csv", "history.csv", "curves.png", "attention_rollout.png",
            "pretrained.keras", "model.keras"} <= files
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["quick"] and metrics["test_examples"] == 360
    assert f"{metrics['test_accuracy']:.4f}" == lines[-1].split(": ")[1]
    stages = [row.split(",")[0] for row in (tmp_path / "history.csv").read_text().splitlines()[1:]]
    assert stages == ["pretrain"] * 3 + ["finetune"] * 3
    pretrained = keras.saving.load_model(tmp_path / "pretrained.keras")
    finetuned = keras.saving.load_model(tmp_path / "model.keras")
    assert isinstance(finetuned, keras_vit.VisionTransformer)
    assert pretrained.image_size == (16, 16) and finetuned.image_size == (32, 32) and finetuned.grid_size == (8, 8)


def test_demo_runs_as_a_module_with_make():
    # `make demo` runs `python -m keras_vit.demo`: the module must keep its entry point.
    makefile = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "Makefile")).read()
    assert "-m keras_vit.demo" in makefile and callable(demo.main)
