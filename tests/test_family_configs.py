"""The CNN families' configs (BiTResNet, AxialResNet, EfficientNet) through the plumbing every
keras_vit model shares (`keras_vit.models.config_model`): the frozen config kept on the model,
its fields read as attributes, `get_config()` built from it. Files written before the models
kept their config must still load, so `get_config()` is compared with the literal dicts the
models returned when they stored each argument as an attribute of their own (recorded from
that code for these arguments), and a `.keras` file whose config.json holds such a dict loads
and computes the outputs that code computed for the same weights and images.
"""

import inspect
import json
import zipfile

import keras
import numpy as np
import pytest
from conftest import rel_err

from keras_vit.models import AxialResNet, BiTResNet, EfficientNet
from keras_vit.models.axial_resnet_family import AxialResNetConfig
from keras_vit.models.bit_family import BiTConfig
from keras_vit.models.config import UnknownArgumentError
from keras_vit.models.efficientnet_family import EfficientNetConfig

CONFIG_CLASSES = {BiTResNet: BiTConfig, AxialResNet: AxialResNetConfig, EfficientNet: EfficientNetConfig}

#: case: (model class, constructor arguments, the get_config() the models returned when each kept
#: its arguments as attributes of its own; recorded from that code, float32, JAX).
CASES = {
    "bit": (
        BiTResNet,
        dict(image_size=32, block_units=(1,), width_factor=0.5, classes=3),
        {"image_size": [32, 32], "block_units": [1], "width_factor": 0.5, "classes": 3, "num_channels": 3,
         "group_norm_epsilon": 1e-05, "std_conv_epsilon": 1e-08, "std_conv_epsilon_inside_sqrt": True,
         "include_top": True, "pooling": None, "classifier_activation": "softmax", "name": "old_bit",
         "trainable": True},
    ),
    "bit_headless": (
        BiTResNet,
        dict(image_size=None, block_units=(1, 1), width_factor=0.5, include_top=False, pooling="max",
             std_conv_epsilon=1e-10),
        {"image_size": [None, None], "block_units": [1, 1], "width_factor": 0.5, "classes": 1000,
         "num_channels": 3, "group_norm_epsilon": 1e-05, "std_conv_epsilon": 1e-10,
         "std_conv_epsilon_inside_sqrt": True, "include_top": False, "pooling": "max",
         "classifier_activation": "softmax", "name": "old_bit_headless", "trainable": True},
    ),
    "axial_resnet": (
        AxialResNet,
        dict(image_size=32, block_units=(1,), width_multiplier=0.25, classes=3, classifier_activation=None),
        {"image_size": [32, 32], "block_units": [1], "width_multiplier": 0.25, "groups": 8, "classes": 3,
         "include_top": True, "pooling": None, "classifier_activation": "linear", "batch_norm_epsilon": 1e-05,
         "num_channels": 3, "name": "old_axial_resnet", "trainable": True},
    ),
    "axial_resnet_headless": (
        AxialResNet,
        dict(image_size=(64, 64), block_units=(1, 1), width_multiplier=0.25, groups=4, include_top=False,
             pooling="avg", batch_norm_epsilon=1e-3),
        {"image_size": [64, 64], "block_units": [1, 1], "width_multiplier": 0.25, "groups": 4, "classes": 1000,
         "include_top": False, "pooling": "avg", "classifier_activation": "softmax", "batch_norm_epsilon": 0.001,
         "num_channels": 3, "name": "old_axial_resnet_headless", "trainable": True},
    ),
    "efficientnet": (
        EfficientNet,
        dict(image_size=(32, 48), width_multiplier=0.25, depth_multiplier=0.1, classes=3, classifier_activation=None,
             dropout_rate=0.1),
        {"image_size": [32, 48], "width_multiplier": 0.25, "depth_multiplier": 0.1, "classes": 3,
         "include_top": True, "pooling": None, "classifier_activation": "linear", "dropout_rate": 0.1,
         "drop_path_rate": 0.2, "batch_norm_epsilon": 0.001, "num_channels": 3, "name": "old_efficientnet",
         "trainable": True},
    ),
    "efficientnet_headless": (
        EfficientNet,
        dict(image_size=None, width_multiplier=0.25, depth_multiplier=0.1, include_top=False, pooling="gap",
             drop_path_rate=0.0, classifier_activation="sigmoid", num_channels=1),
        {"image_size": [None, None], "width_multiplier": 0.25, "depth_multiplier": 0.1, "classes": 1000,
         "include_top": False, "pooling": "gap", "classifier_activation": "sigmoid", "dropout_rate": 0.2,
         "drop_path_rate": 0.0, "batch_norm_epsilon": 0.001, "num_channels": 1,
         "name": "old_efficientnet_headless", "trainable": True},
    ),
}

#: case: (stride, spans) the models reported (spans: AxialResNet's only).
OLD_DERIVED = {
    "bit": (4, None), "bit_headless": (8, None), "axial_resnet": (4, [(8, 1)]),
    "axial_resnet_headless": (8, [(16, 1), (16, 2)]), "efficientnet": (32, None), "efficientnet_headless": (32, None),
}

#: case: the outputs that code computed for two images (`_images`) after `_fill` gave the model
#: its weights (float32, JAX).
OLD_OUTPUTS = {
    "bit": [[0.09855087846517563, 0.5983774662017822, 0.30307161808013916],
            [0.0900777280330658, 0.6156883239746094, 0.2942339777946472]],
    "axial_resnet": [[0.3409198820590973, 2.0013599395751953, 0.05624949932098389],
                     [0.39572787284851074, 1.9978547096252441, 0.17934855818748474]],
    "efficientnet": [[2.7641263008117676, -2.5699100494384766, 0.420385479927063],
                     [2.7641263008117676, -2.5699100494384766, 0.42038577795028687]],
}


def _fill(model):
    """The weights the recorded outputs were computed with: one draw per weight, in order."""
    r = np.random.default_rng(0)
    for v in model.weights:
        value = r.standard_normal(tuple(v.shape)) * 0.3
        if v.path.endswith("moving_variance"):  # BatchNorm variances: positive
            value = 0.5 + np.abs(value)
        v.assign(value.astype(v.dtype))
    return model


def _images(model):
    size = tuple(16 if s is None else s for s in model.input_shape[1:3])
    return np.random.default_rng(1).normal(size=(2, *size, model.input_shape[-1])).astype("float32")


_built = {}


def _model(case):
    """The case's model, built once per module."""
    if case not in _built:
        cls, kwargs, _ = CASES[case]
        _built[case] = cls(**kwargs, name=f"old_{case}")
    return _built[case]


@pytest.mark.parametrize("case", CASES)
def test_get_config_is_the_dict_saved_files_hold(case):
    # The config saved files held before configs named their family, plus that name.
    old = {"family": _model(case).config.family, **CASES[case][2]}
    config = _model(case).get_config()
    assert sorted(config) == sorted(old)
    assert config == old  # values and their types (lists, not tuples: what JSON gives back)
    assert json.loads(json.dumps(config)) == old


@pytest.mark.parametrize("case", CASES)
def test_config_fields_read_as_attributes_and_derived_sizes_stay_properties(case):
    cls = CASES[case][0]
    model, config_class = _model(case), CONFIG_CLASSES[CASES[case][0]]
    assert isinstance(model.config, config_class)
    for field in config_class.fields():
        assert getattr(model, field) == getattr(model.config, field), field
        with pytest.raises(AttributeError):  # read-only: the config is the one record
            setattr(model, field, object())
    assert model.image_size == tuple(CASES[case][2]["image_size"])  # a tuple, as the models always gave it
    old_stride, old_spans = OLD_DERIVED[case]
    assert model.stride == old_stride
    if cls is AxialResNet:
        assert model.spans == old_spans
    for name in ("stride",) + (("spans",) if cls is AxialResNet else ()):
        assert isinstance(inspect.getattr_static(cls, name), property)
    signature = inspect.signature(cls)
    assert list(signature.parameters) == [*config_class.fields(), "name", "dtype", "trainable"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in signature.parameters.values())


@pytest.mark.parametrize("cls", [BiTResNet, AxialResNet, EfficientNet], ids=lambda c: c.__name__)
def test_a_config_object_or_a_config_dict_builds_the_same_model(cls):
    case = {BiTResNet: "bit", AxialResNet: "axial_resnet", EfficientNet: "efficientnet"}[cls]
    model = _model(case)
    again = cls(model.config, name=model.name)
    assert again.get_config() == model.get_config()
    changed = cls(model.get_config(), classes=5)
    assert changed.classes == 5 and changed.output_shape == (None, 5)
    # A dict given as the config holds the model's arguments; Keras' own (name) are keywords.
    assert changed.get_config() == {**model.get_config(), "classes": 5, "name": changed.name}
    with pytest.raises(TypeError, match=f"{cls.__name__} takes an? {CONFIG_CLASSES[cls].__name__}"):
        cls(3)
    with pytest.raises(UnknownArgumentError, match="'clases' \\(did you mean 'classes'\\?\\)"):
        cls(**CASES[case][1], clases=5)


def _with_config(path, config):
    """Rewrite the model config inside the .keras file at `path` (a zip) as `config`."""
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    saved = json.loads(files["config.json"])
    saved["config"] = config
    files["config.json"] = json.dumps(saved).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)


@pytest.mark.parametrize("case", CASES)
def test_a_keras_file_with_the_old_config_loads(tmp_path, case):
    old = CASES[case][2]
    model = _fill(_model(case))
    path = tmp_path / f"{case}.keras"
    model.save(path)
    _with_config(path, old)
    loaded = keras.saving.load_model(path)
    assert type(loaded) is CASES[case][0]
    assert loaded.get_config() == {"family": loaded.config.family, **old}
    x = _images(loaded)
    y = loaded.predict(x, verbose=0)
    np.testing.assert_array_equal(y, model.predict(x, verbose=0))
    if case in OLD_OUTPUTS:  # what the old code computed with these weights
        assert rel_err(y, OLD_OUTPUTS[case]) < 1e-5
