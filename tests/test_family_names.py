"""The `family` key of a config dict decides its family; the key-based guess is only the fallback
for dicts without it. And every public name of keras_vit imports."""

import importlib

import pytest

from keras_vit.models.family import family_of, families, get_family, guess_family

pytestmark = pytest.mark.backend_independent

VIT_KEYS = {"image_size": [32, 32], "patch_size": 8, "hidden_size": 16, "num_layers": 1, "num_heads": 2, "mlp_dim": 32}


def test_family_key_decides_over_the_keys():
    # A dict holding a ViT's signature keys and BiT's: the family key names which it is.
    both = {**VIT_KEYS, "block_units": [1], "width_factor": 0.5}
    assert family_of({**both, "family": "vit"}).name == "vit"
    assert family_of({**both, "family": "bit"}).name == "bit"
    assert family_of({**VIT_KEYS, "family": "axial_vit"}).name == "axial_vit"
    # Without the key, the guess (BiT's signature, matched before ViT's fallback).
    assert family_of(both).name == "bit" == guess_family(both).name
    assert family_of(VIT_KEYS).name == "vit"


def test_unknown_family_name_is_one_clear_error():
    with pytest.raises(ValueError, match=r"names family 'vitt'.*known: vit, bit"):
        family_of({**VIT_KEYS, "family": "vitt"})


def test_every_config_class_names_its_family():
    for family in families():
        assert family.config_class.family == family.name
        assert get_family(family.name) is family


def test_model_refuses_another_familys_config():
    from keras_vit.models.config_model import config_from_arguments
    from keras_vit.models.vit_family import ViTConfig

    with pytest.raises(ValueError, match=r"builds 'vit' models; the config names family 'bit'"):
        config_from_arguments(ViTConfig, {**VIT_KEYS, "family": "bit"}, {}, "VisionTransformer")
    assert config_from_arguments(ViTConfig, {**VIT_KEYS, "family": "vit"}, {}, "VisionTransformer").patch_size == 8


def test_every_public_name_imports():
    keras_vit = importlib.import_module("keras_vit")
    assert len(keras_vit.__all__) == len(set(keras_vit.__all__)) > 60
    missing = [name for name in keras_vit.__all__ if not hasattr(keras_vit, name)]
    assert not missing
    for name in ("ViTB16", "BiTResNet50x1", "EfficientNetB0", "VisionTransformer", "BiTResNet", "load_checkpoint",
                 "flops", "get_layout_map", "list_presets", "ViTConfig", "family_of", "families", "__version__"):
        assert name in keras_vit.__all__, name
    namespace = {}
    exec("from keras_vit import *", namespace)
    assert set(keras_vit.__all__) <= set(namespace) | {"__version__"}
