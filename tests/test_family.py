"""The model-family record: `family_of` for every way a model is named, one factory for every
constructor, and no code outside the records that tells the families apart by a config's keys."""

import pathlib
import re

import keras
import pytest

import keras_vit
from keras_vit import applications
from keras_vit.models.family import REGISTRY, families, family_of

pytestmark = pytest.mark.backend_independent

PACKAGE = pathlib.Path(keras_vit.__file__).parent

TINY_VIT = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, classes=3)
TINY_BIT = dict(image_size=64, block_units=(1, 1), width_factor=0.5, classes=3)
TINY_AXIAL = dict(image_size=32, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, classes=3)


def test_every_family_is_registered_once():
    names = [f.name for f in families()]
    assert names[:3] == ["vit", "bit", "axial_vit"] and len(set(names)) == len(names) == len(REGISTRY)
    constructors = [n for f in families() for n in f.architectures]
    assert len(constructors) == len(set(constructors))
    assert set(applications.ALL_CONSTRUCTORS) == set(constructors)
    for name in constructors:
        assert getattr(keras_vit, name) is applications.ALL_CONSTRUCTORS[name]
        assert name in getattr(keras_vit, name).__doc__


def _models():
    """One tiny model of every registered family."""
    models = {
        "vit": keras_vit.VisionTransformer(**TINY_VIT),
        "bit": keras_vit.models.BiTResNet(**TINY_BIT),
        "axial_vit": keras_vit.models.AxialVisionTransformer(**TINY_AXIAL),
        "axial_resnet": keras_vit.models.AxialResNet(image_size=16, block_units=(1,), width_multiplier=0.125,
                                                     groups=2, classes=3),
        "efficientnet": keras_vit.models.EfficientNet(image_size=32, width_multiplier=0.1, depth_multiplier=0.1,
                                                      classes=3),
    }
    assert sorted(models) == sorted(f.name for f in families())  # a new family needs a model here
    return models


def test_family_of_every_form():
    for name, model in _models().items():
        family = family_of(model)
        assert family.name == name and isinstance(model, family.model_class())
        config = model.get_config()
        assert family_of(config) is family  # a plain get_config() dict
        assert family_of({"class_name": type(model).__name__, "config": config}) is family  # Keras' serialised form
        assert family_of(model.config) is family and family_of(type(model)) is family
        assert family_of(family.name) is family and family_of(family.class_name) is family
        # The checkpoint config round trip: what a saved file's config says rebuilds the same model.
        rebuilt = family.build(**family.model_kwargs(family.checkpoint_config(config)))
        assert rebuilt.count_params() == model.count_params()
        assert {k: v for k, v in rebuilt.get_config().items() if k != "name"} == {
            k: v for k, v in config.items() if k != "name"}, name
        # A model wrapping one (the constructors' input_tensor=) belongs to the same family.
        wrapper = keras.Model(model.inputs, model(model.inputs[0]))
        assert family_of(wrapper) is family
    assert family_of("ViTB16").name == "vit" and family_of("R50ViTB16").name == "vit"
    assert family_of("BiTResNet152x2").name == "bit" and family_of("AxialViTB32").name == "axial_vit"
    with pytest.raises(ValueError, match="Did you mean ViTB16"):
        family_of("ViTB61")
    with pytest.raises(ValueError, match="no keras_vit model"):
        family_of({"class_name": "ResNet50", "config": {}})
    with pytest.raises(ValueError, match="no keras_vit model family"):
        family_of(3.5)


def test_one_factory_builds_every_family():
    for family in families():
        name = next(iter(family.architectures))
        with keras.StatelessScope(initialize_variables=False):
            model = getattr(keras_vit, name)(weights=None, input_shape=(64, 64, 3), classes=4)
        assert isinstance(model, family.model_class()) and model.output_shape == (None, 4)
        keras.utils.clear_session()
    # Overrides are the family's own fields; a field the constructor sets is named as such.
    with pytest.raises(TypeError, match="'block_units' \\(the constructor sets it\\)"):
        keras_vit.BiTResNet50x1(weights=None, block_units=(1, 1))
    with pytest.raises(TypeError, match="did you mean 'dropout_rate'"):
        keras_vit.AxialViTB16(weights=None, dropout=0.1)


# The keys that once told the families apart, outside the family records and the model files.
_KEY_CHECKS = re.compile(r"""["'](block_units|hidden_size|attention_axes)["']\s+(not\s+)?in\s+|\.get\(["']block_units["']\)""")


def test_no_family_checks_on_config_keys_outside_the_records():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("models/") or rel.startswith("checkpoints/") and rel != "checkpoints/keras_format.py":
            continue  # the records and model files; the readers of each family's own formats
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _KEY_CHECKS.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert not offenders, "family checks on config keys:\n" + "\n".join(offenders)
