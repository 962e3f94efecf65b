"""`keras-vit finetune / evaluate / fewshot` on tiny data: run folders, metrics, errors."""

import csv
import json
import os

import keras
import numpy as np
import pytest
from PIL import Image

import keras_vit
from keras_vit.cli import main

TINY_ARCH = json.dumps(dict(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16))


def _finetune(out, *extra):
    return main(["finetune", "--data", "digits", "--batch-size", "16", "--steps", "4", "--eval-every", "2",
                 "--warmup", "1", "--lr", "0.01", "--verbose", "0", "--out", str(out), *extra])


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "scratch"
    assert _finetune(out, "--arch", TINY_ARCH, "--weights", "none", "--image-size", "16") == 0
    return out


def test_finetune_run_folder(scratch_run, capsys):
    files = set(os.listdir(scratch_run))
    assert {"config.json", "metrics.json", "metrics.csv", "history.csv", "history.json", "curves.png",
            "model.keras"} <= files
    metrics = json.loads((scratch_run / "metrics.json").read_text())
    assert metrics["steps"] == 4 and metrics["classes"] == 10 and 0 <= metrics["test_accuracy"] <= 1
    with open(scratch_run / "metrics.csv") as f:
        row = next(csv.DictReader(f))
    assert float(row["test_accuracy"]) == pytest.approx(metrics["test_accuracy"])
    with open(scratch_run / "history.csv") as f:
        history = list(csv.DictReader(f))
    assert [int(r["step"]) for r in history] == [2, 4] and "val_accuracy" in history[0]
    assert float(history[0]["learning_rate"]) > 0
    with Image.open(scratch_run / "curves.png") as image:
        assert image.size[0] > 500
    model = keras.saving.load_model(scratch_run / "model.keras")
    assert isinstance(model, keras_vit.VisionTransformer) and model.image_size == (16, 16)


def test_evaluate_agrees_with_the_finetune_metrics(scratch_run, tmp_path, capsys):
    assert main(["evaluate", "--weights", str(scratch_run), "--data", "digits", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    trained = json.loads((scratch_run / "metrics.json").read_text())
    # evaluate counts argmax hits in NumPy; finetune used keras' evaluate on the same split.
    assert metrics["examples"] == 360
    assert metrics["accuracy"] == pytest.approx(trained["test_accuracy"], abs=1e-6)
    assert metrics["loss"] == pytest.approx(trained["test_loss"], rel=1e-3)
    assert {"confusion.png", "per_class.csv", "metrics.csv"} <= set(os.listdir(tmp_path))
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("test accuracy: ")


class _RecordWeights(keras.callbacks.Callback):
    """Observes the training weights after every update (changes nothing)."""

    def __init__(self):
        super().__init__()
        self.after_batch = []

    def on_train_batch_end(self, batch, logs=None):
        self.after_batch.append({v.path: np.array(v.numpy()) for v in self.model.trainable_variables})


def test_finetune_from_a_trained_model_at_a_higher_resolution(scratch_run, tmp_path, monkeypatch):
    from keras_vit import training

    record = _RecordWeights()
    recipe = training.finetune_callbacks
    monkeypatch.setattr(training, "finetune_callbacks", lambda **kw: [record] + recipe(**kw))
    assert _finetune(tmp_path, "--weights", str(scratch_run / "model.keras"), "--image-size", "24",
                     "--ema", "0.9", "--resume") == 0
    model = keras.saving.load_model(tmp_path / "model.keras")
    assert model.image_size == (24, 24) and model.grid_size == (3, 3)
    base = keras.saving.load_model(scratch_run / "model.keras")
    # The encoder starts from the trained weights (it moved only 4 small SGD steps from them).
    a = base.get_layer("encoderblock_0").weights[0].numpy()
    b = model.get_layer("encoderblock_0").weights[0].numpy()
    assert np.abs(a - b).max() < 0.1 * np.abs(a).max()
    # --ema: the saved weights are the running (Polyak) average of the 4 updates, computed here:
    # avg_1 = w_1, avg_k = 0.9 avg_(k-1) + 0.1 w_k.
    assert json.loads((tmp_path / "config.json").read_text())["ema"] == 0.9
    assert len(record.after_batch) == 4
    average = dict(record.after_batch[0])
    for weights in record.after_batch[1:]:
        average = {k: 0.9 * average[k] + 0.1 * w for k, w in weights.items()}
    saved = {v.path: v.numpy() for v in model.trainable_variables}
    assert set(saved) == set(average)
    for key, value in average.items():
        np.testing.assert_allclose(saved[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    last = record.after_batch[-1]
    assert max(np.abs(saved[k] - last[k]).max() for k in last) > 1e-5  # not the raw weights
    # --resume: the finished run removed its backup.
    assert not os.path.exists(tmp_path / "backup")


def test_fewshot(scratch_run, tmp_path):
    assert main(["fewshot", "--weights", str(scratch_run), "--data", "digits", "--shots", "1,3",
                 "--max-train-images", "200", "--max-test-images", "100", "--out", str(tmp_path)]) == 0
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert 0 <= metrics["1shot_accuracy"] <= 1 and metrics["test_images"] == 100 and metrics["feature_dim"] == 16
    assert {"fewshot.csv", "fewshot.png", "metrics.csv"} <= set(os.listdir(tmp_path))


def test_finetune_layer_decay_scales_each_layer_group(tmp_path, capsys):
    from keras_vit.cli import build_parser
    from keras_vit.commands.finetune import build_optimizer

    arch = ["--arch", TINY_ARCH, "--weights", "none", "--image-size", "16"]
    model = keras_vit.VisionTransformer(image_size=16, classes=10, **json.loads(TINY_ARCH))
    for decay, expected in (("0.5", (0.25, 0.25, 0.5, 0.5, 1.0)), (None, None)):
        argv = ["finetune", "--data", "digits", "--out", str(tmp_path / "x"), *arch]
        args = build_parser().parse_args(argv + (["--layer-decay", decay] if decay else []))
        scales = build_optimizer(args, model, 10, 2).learning_rate_scales
        if decay is None:
            assert scales == {}  # one rate for every variable
            continue
        assert scales == keras_vit.training.layer_decay_scales(model, float(decay))
        # One block: the stem (patch embedding, class token, position embedding) at 0.5 ** 2, the
        # block and the final norm at 0.5, the head at the full rate (timm's param_groups_layer_decay).
        assert (scales["embedding/kernel"], scales["cls/cls"], scales["encoderblock_0/MlpBlock_3/Dense_0/kernel"],
                scales["encoder_norm/gamma"], scales["head/kernel"]) == expected
    # The command trains with it: three rates (two steps, one evaluation of one batch).
    assert _finetune(tmp_path / "llrd", *arch, "--layer-decay", "0.5", "--steps", "2", "--eval-every", "2",
                     "--warmup", "0", "--eval-steps", "1") == 0
    assert "layer decay 0.5 over 3 rates" in capsys.readouterr().out
    assert json.loads((tmp_path / "llrd" / "config.json").read_text())["layer_decay"] == 0.5
    for bad in ("0", "1.5"):
        with pytest.raises(SystemExit):
            _finetune(tmp_path / "bad", *arch, "--layer-decay", bad)
        assert "argument --layer-decay: " in capsys.readouterr().err


def test_cli_errors_are_clear(scratch_run, tmp_path, capsys):
    arch = ["--arch", TINY_ARCH, "--weights", "none"]
    assert _finetune(tmp_path / "a", *arch, "--image-size", "20") == 2
    assert "--image-size 20 does not fit the --arch JSON model: its patch size is 8" in capsys.readouterr().err
    assert _finetune(tmp_path / "b", *arch, "--image-size", "16", "--classes", "7") == 2
    assert "classes=7 contradicts the data" in capsys.readouterr().err
    assert _finetune(tmp_path / "c", *arch, "--data", "tfds:cifar10", "--data-dir", str(tmp_path)) == 2
    assert "dataset not prepared; run `tfds" in capsys.readouterr().err
    assert main(["evaluate", "--weights", str(scratch_run), "--data", "shapes", "--out", str(tmp_path / "d")]) == 2
    assert "head has 10 classes but 'shapes' has 4" in capsys.readouterr().err


def test_resume_refuses_a_run_started_with_other_arguments(scratch_run, capsys):
    """--resume continues a run only with the arguments it was started with: a flag typed
    differently is refused before anything loads, a setting the command works out (here the
    image size of --arch without --image-size) once the model is built; the run is untouched."""
    before = {name: (scratch_run / name).read_bytes() for name in ("config.json", "metrics.json", "model.keras")}
    arch = ["--arch", TINY_ARCH, "--weights", "none"]
    assert _finetune(scratch_run, *arch, "--image-size", "16", "--lr", "0.02", "--no-flip", "--resume") == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("keras-vit finetune: error: --resume: ") and str(scratch_run) in line
    assert "--lr 0.01 (now 0.02), --no-flip not given (now given)" in line
    assert "another --out folder" in line
    assert _finetune(scratch_run, *arch, "--resume") == 2  # built at 224 px, the default
    assert "--image-size 16 (now 224)" in capsys.readouterr().err
    assert {name: (scratch_run / name).read_bytes() for name in before} == before


def test_a_run_that_fails_after_writing_its_config_leaves_no_folder(scratch_run, tmp_path, capsys):
    """fewshot finds too few training images per class only after it has created its run folder
    and written config.json: the failed run removes the folder it created."""
    out = tmp_path / "fewshot"
    assert main(["fewshot", "--weights", str(scratch_run), "--data", "digits", "--shots", "100",
                 "--max-train-images", "40", "--max-test-images", "10", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--shots 100: class" in err and "--max-train-images 40" in err
    assert not out.exists()
