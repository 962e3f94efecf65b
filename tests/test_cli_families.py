"""`keras-vit finetune`, `fewshot` and `vtab` end to end for every model family, from a .keras
file of a tiny model of each (and --arch with every family's constructor names)."""

import argparse
import json

import keras
import numpy as np
import pytest

from keras_vit.cli import main
from keras_vit.commands import checks
from keras_vit.models.family import family_of
from tests.test_transfer import TINY, randomize

pytestmark = pytest.mark.backend_independent
tfds = pytest.importorskip("tensorflow_datasets")

SIZE = 16
#: The pooled feature width of each tiny model.
FEATURES = {"vit": 16, "bit": 128, "efficientnet": 128, "axial_resnet": 32, "axial_vit": 16}
FAMILIES = list(FEATURES)


@pytest.fixture(scope="module", params=FAMILIES)
def saved(request, tmp_path_factory):
    """(family, path of a .keras file of a randomised tiny model of it at 16 px)."""
    path = tmp_path_factory.mktemp(request.param) / "model.keras"
    randomize(TINY[request.param](SIZE)).save(path)
    return request.param, str(path)


def _size_args(family):
    return [] if family == "axial_resnet" else ["--image-size", str(SIZE)]  # an AxialResNet keeps its own


def test_finetune(saved, tmp_path):
    family, path = saved
    out = tmp_path / "ft"
    assert main(["finetune", "--weights", path, "--data", "digits", "--batch-size", "8", "--steps", "2",
                 "--eval-every", "2", "--warmup", "1", "--verbose", "0", "--out", str(out), *_size_args(family)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["image_size"] == [SIZE, SIZE] and metrics["classes"] == 10 and metrics["steps"] == 2
    assert 0 <= metrics["test_accuracy"] <= 1
    model = keras.saving.load_model(out / "model.keras")
    assert family_of(model).name == family and model.output_shape == (None, 10)


def test_fewshot(saved, tmp_path):
    family, path = saved
    out = tmp_path / "fs"
    assert main(["fewshot", "--weights", path, "--data", "digits", "--shots", "1,2", "--max-train-images", "60",
                 "--max-test-images", "20", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["feature_dim"] == FEATURES[family] and metrics["test_images"] == 20
    assert 0 <= metrics["1shot_accuracy"] <= 1 and 0 <= metrics["2shot_accuracy"] <= 1


def test_vtab(saved, tmp_path):
    family, path = saved
    out = tmp_path / "vtab"
    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        assert main(["vtab", "--weights", path, "--tasks", "dtd", "--steps", "2", "--batch-size", "4",
                     "--verbose", "0", "--out", str(out), *_size_args(family)]) == 0
    row = json.loads((out / "tasks" / "dtd.json").read_text())
    assert row["setting"]["image_size"] == SIZE and row["setting"]["steps"] == 2 and row["examples"] == 4
    assert 0 <= row["top1"] <= 1 and np.isfinite(row["final_train_loss"])


def _save(family, folder):
    path = folder / f"{family}.keras"
    randomize(TINY[family](SIZE)).save(path)
    return str(path)


def test_finetune_bit_at_its_hyperrule_resolution(tmp_path):
    path = _save("bit", tmp_path)
    # digits' images are 8x8, below 96x96: BiT-HyperRule fine-tunes them at 128 px.
    out = tmp_path / "ft"
    assert main(["finetune", "--weights", path, "--data", "digits", "--batch-size", "8", "--steps", "1",
                 "--eval-every", "1", "--warmup", "0", "--eval-steps", "1", "--verbose", "0", "--out", str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["image_size"] == [128, 128]


def test_axial_resnet_refuses_another_size(tmp_path, capsys):
    path = _save("axial_resnet", tmp_path)
    assert main(["finetune", "--weights", path, "--data", "digits", "--steps", "1", "--image-size", "32",
                 "--out", str(tmp_path / "ft")]) == 2
    assert "AxialResNet models fine-tune at their checkpoint's resolution 16x16 only" in capsys.readouterr().err


@pytest.mark.parametrize("arch", ["BiTResNet50x1", "AxialViTB16", "AxialResNet26S", "EfficientNetB0", "R50ViTB16"])
def test_arch_takes_every_family(arch):
    for command in ("finetune", "fewshot", "vtab"):
        args = argparse.Namespace(command=command, arch=arch, weights="none", preset=None, image_size=None)
        checks.check_model_args(args, default_image_size=224)  # no "Unknown --arch"


def test_fewshot_arch_efficientnet(tmp_path):
    out = tmp_path / "fs"
    assert main(["fewshot", "--arch", "EfficientNetB0", "--weights", "none", "--image-size", "32", "--data",
                 "digits", "--shots", "1", "--max-train-images", "30", "--max-test-images", "10", "--out",
                 str(out)]) == 0
    assert json.loads((out / "metrics.json").read_text())["feature_dim"] == 1280
