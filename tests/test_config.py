"""ViTConfig: sizes normalised once, validation with clear errors, field groups, unknown keywords."""

import keras
import pytest
from conftest import TINY

import keras_vit
from keras_vit.models.config import NUMERICS
from keras_vit.models.vit_family import ARCHITECTURE_FIELDS, NUMERICS_FIELDS, TABLE_FIELDS, ViTConfig

pytestmark = pytest.mark.backend_independent


def test_sizes_normalised_once():
    c = ViTConfig(image_size=[128, 192], patch_size=2, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=8,
                  resnet=[[3, 4], 1.0])
    assert c.image_size == (128, 192) and c.resnet == ((3, 4), 1)
    assert c.stride == 2 * 8 and c.grid_size == (8, 12) and ViTConfig(**TINY).grid_size == (4, 4)
    assert ViTConfig.from_dict(c.to_dict()) == c  # JSON-friendly round trip (lists back to tuples)
    assert c.replace(image_size=128).image_size == (128, 128)


def test_field_groups_cover_what_a_checkpoint_holds():
    assert NUMERICS_FIELDS == tuple(NUMERICS["original"])
    assert set(NUMERICS_FIELDS) <= set(ARCHITECTURE_FIELDS)
    assert set(TABLE_FIELDS) <= set(ARCHITECTURE_FIELDS) and "position_embedding" in ARCHITECTURE_FIELDS
    assert not {"include_top", "pooling", "dropout_rate", "quantization"} & set(ARCHITECTURE_FIELDS)
    assert set(ViTConfig.fields()) == set(keras_vit.VisionTransformer(**TINY).get_config()) - {"name", "trainable", "family"}


def test_unknown_keywords_raise_with_suggestions():
    with pytest.raises(TypeError, match=r"'dropout' \(did you mean 'dropout_rate'\?\); 'totally_unknown'"):
        keras_vit.VisionTransformer(**TINY, dropout=0.1, totally_unknown=3)
    with pytest.raises(TypeError, match=r"'hiden_size' \(did you mean 'hidden_size'\?\)"):
        ViTConfig.from_dict({**TINY, "hiden_size": 3})
    with pytest.raises(TypeError, match=r"'clases' \(did you mean 'classes'\?\)"):
        ViTConfig(**TINY).replace(clases=3)
    with pytest.raises(TypeError, match="needs image_size"):
        keras_vit.VisionTransformer(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=8)
    # Keras' own model arguments still work, and the config object builds the same model.
    model = keras_vit.VisionTransformer(**TINY, name="tiny", dtype="float32", trainable=False)
    assert model.name == "tiny" and not model.trainable
    same = keras_vit.VisionTransformer(ViTConfig(**TINY), name="tiny2")
    assert same.config == model.config and same.count_params() == model.count_params()


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(num_heads=5), "not divisible by num_heads 5"),
        (dict(image_size=36), r"Image height 36 is not divisible by the patch size 8.*32 or 40"),
        (dict(dropout_rate=1.5), r"dropout_rate must be in \[0, 1\)"),
        (dict(resnet=(3, 1)), "resnet must be"),
        (dict(position_embedding_resize="cubic"), r"position_embedding_resize must be one of"),
        (dict(include_top=True, classes=None), "needs a positive number of classes"),
        (dict(patch_size=0), "patch_size must be a positive int"),
    ],
)
def test_validation_errors(change, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**{**TINY, **change})


def test_config_reloads_through_keras(tmp_path):
    model = keras_vit.VisionTransformer(**TINY, position_embedding="learned_2d", classifier_activation=None)
    model.save(tmp_path / "m.keras")
    assert keras.saving.load_model(tmp_path / "m.keras").config == model.config


def test_a_config_is_a_read_only_mapping_of_its_fields():
    """Code written for the plain dicts the checkpoint readers once returned keeps working on the
    config objects: item access, `get`, `in`, `dict(...)`, `**config`; nothing can be set."""
    import dataclasses

    c = ViTConfig(**TINY)
    names = [f.name for f in dataclasses.fields(ViTConfig)]  # ClassVar `family` is no field
    assert list(c) == list(c.keys()) == names and len(c) == len(names) and "family" not in c
    assert c["num_heads"] == c.num_heads == 3 and c["image_size"] == (32, 32)
    assert c.get("resnet") is None and c.get("no_such_field", "default") == "default"
    assert "mlp_dim" in c and "hiden_size" not in c
    assert dict(c) == {f: getattr(c, f) for f in names} == {**c}
    assert ViTConfig.from_dict(dict(c)) == c and keras_vit.family_of(c).name == "vit"
    with pytest.raises(KeyError):
        c["no_such_field"]
    with pytest.raises(TypeError):
        c["num_heads"] = 4
    assert c != dict(c)  # a config equals configs, not dicts


@pytest.mark.parametrize("size, pair", [(64, (64, 64)), ([48, 80], (48, 80)), (None, (None, None)),
                                        ((None, 96), (None, 96))])
def test_convolutional_families_normalise_any_size_to_a_pair(size, pair):
    from keras_vit.models.bit_family import BiTConfig
    from keras_vit.models.efficientnet_family import EfficientNetConfig

    assert BiTConfig(image_size=size, block_units=[1]).image_size == pair
    assert EfficientNetConfig(image_size=size).image_size == pair


@pytest.mark.parametrize("size", [0, -32, 2.5, 32.0, True, "32", (32, 32, 3), (0, 32), [None, 0]])
def test_bad_sizes_are_refused_by_every_family(size):
    from keras_vit.models.axial_resnet_family import AxialResNetConfig
    from keras_vit.models.bit_family import BiTConfig
    from keras_vit.models.efficientnet_family import EfficientNetConfig

    for make in (lambda: BiTConfig(image_size=size, block_units=[1]), lambda: EfficientNetConfig(image_size=size),
                 lambda: AxialResNetConfig(image_size=size, block_units=[1], width_multiplier=0.25)):
        with pytest.raises(ValueError, match="image_size must be"):
            make()
