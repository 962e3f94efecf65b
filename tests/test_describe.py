"""`loading.describe`: what a weights value names, decided once (no download, no file read), and
the two users of that decision, `loading.resolve` and the CLI's checks before loading."""

import pytest

from keras_vit import loading, presets
from keras_vit.commands.resolution import model_description
from keras_vit.names import InvalidNameError

pytestmark = pytest.mark.backend_independent


def test_each_kind_of_weights_value(tmp_path):
    row = presets.preset_by_name("ViTTi16.augreg_in21k")
    assert row is not None and row.architecture == "ViTTi16"
    described = loading.describe("ViTTi16.augreg_in21k")
    assert (described.kind, described.preset) == ("preset", row)
    assert loading.describe(row).preset is row and loading.describe(row).what == row.name
    (tmp_path / "m.npz").write_bytes(b"")
    assert loading.describe(str(tmp_path / "m.npz")).kind == "path"
    assert loading.describe(tmp_path).kind == "path"  # a folder, as a PathLike
    assert loading.describe("hf://timm/vit_tiny_patch16_224.augreg_in21k").kind == "hub"
    assert loading.describe(str(tmp_path / "gone.npz")).kind == "missing"
    assert loading.describe("no_such_preset_name").kind == "unknown"


def test_tags_and_aliases_need_their_architecture():
    tagged = loading.describe("augreg_in21k", architecture="ViTTi16")
    assert tagged.preset == presets.find_preset("ViTTi16", "augreg_in21k")
    assert tagged.what == "weights='augreg_in21k' of ViTTi16"
    assert loading.describe("imagenet", architecture="ViTB16").preset.classes == 1000
    assert loading.describe("augreg_in21k").kind == "unknown"  # no architecture: a name, not a tag
    with pytest.raises(ValueError, match="ViTTi16"):
        loading.describe("no_such_tag", architecture="ViTTi16")


def test_bad_values_are_refused_as_resolve_refuses_them():
    with pytest.raises(TypeError, match="weights must be None, a path or a string"):
        loading.describe(3)
    with pytest.raises(InvalidNameError):
        loading.describe("a\x00b")
    with pytest.raises(FileNotFoundError, match="No checkpoint at 'gone.npz'"):
        loading.resolve("gone.npz")
    with pytest.raises(ValueError, match="is neither an existing path"):
        loading.resolve("no_such_preset_name")


def test_the_cli_checks_read_the_same_decision():
    what, family, config = model_description(weights="ViTTi16.augreg_in21k")
    row = loading.describe("ViTTi16.augreg_in21k").preset
    assert what == f"{row.name} ({row.architecture})" and family.name == "vit"
    assert config["hidden_size"] == 192 and config["num_layers"] == 12  # ViT-Ti/16 (the paper's DeiT-Ti sizes)
    assert model_description(weights="hf://timm/vit_tiny_patch16_224.augreg_in21k") is None  # its files tell
    assert model_description(weights="no_such_preset_name") is None  # resolving names the problem
