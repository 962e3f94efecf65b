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
