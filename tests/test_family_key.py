"""Configs name their family: every model's get_config() writes `family`, `family_of` reads it,
and .keras files and preset folders written before the key existed still load with the outputs
they gave when written (tests/data/saved_before_family_key, made by its make.py with that code)."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models.family import family_of, families, get_family, guess_family

DATA = os.path.join(os.path.dirname(__file__), "data", "saved_before_family_key")
FAMILIES = ("vit", "bit", "axial_vit", "axial_resnet", "efficientnet")
PRESETS = ("vit", "bit", "axial_vit", "axial_resnet")


def _outputs(model):
    images = np.load(os.path.join(DATA, "images.npy"))
    return np.asarray(keras.ops.convert_to_numpy(model(images, training=False)))


@pytest.mark.parametrize("name", FAMILIES)
def test_keras_file_written_before_loads_with_equal_outputs(name, tmp_path):
    path = os.path.join(DATA, f"{name}.keras")
    model = keras.saving.load_model(path)
    assert family_of(model).name == name
    np.testing.assert_allclose(_outputs(model), np.load(os.path.join(DATA, f"{name}_outputs.npy")), rtol=1e-4, atol=1e-5)
    # Saved again, the file names its family.
    assert model.get_config()["family"] == name
    model.save(tmp_path / "again.keras")
    again = keras.saving.load_model(tmp_path / "again.keras")
    assert again.get_config()["family"] == name


@pytest.mark.parametrize("name", PRESETS)
def test_preset_written_before_loads_with_equal_outputs(name):
    folder = os.path.join(DATA, f"{name}_preset")
    with open(os.path.join(folder, "config.json")) as f:
        assert '"family"' not in f.read()  # the fallback is what reads it
    model = keras_vit.load_checkpoint(folder)
    assert family_of(model).name == name
    np.testing.assert_allclose(_outputs(model), np.load(os.path.join(DATA, f"{name}_outputs.npy")), rtol=1e-4, atol=1e-5)
