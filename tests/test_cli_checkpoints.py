"""`keras-vit presets` and `keras-vit convert` (hf:// sources are covered in test_hub.py)."""

import json

import keras
import numpy as np
import pytest
from conftest import TINY, randomize

import keras_vit
from keras_vit.cli import main


def test_presets_table(capsys):
    assert main(["presets", "ViTL16"]) == 0
    out = capsys.readouterr().out
    assert "timm/vit_large_patch16_384.augreg_in21k_ft_in1k" in out
    assert "87.08" in out and "google/vit-large-patch16-224" in out
    assert "ViTB16" not in out
    line = next(ln for ln in out.splitlines() if "augreg_in21k_ft_in1k  224" in ln)
    assert "imagenet" in line  # the alias marks the default (224) choice
    assert "GFLOPS" in out and " 123.1 " in line  # ViT-L/16 at 224: 123.1 GFLOPs per image (keras_vit.flops)
    assert main(["presets", "BiTResNet50x1"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "goog_distilled_in1k" in ln)
    assert " 8.2 " in line and "imagenet" in line


def test_presets_json_and_unknown_architecture(capsys):
    assert main(["presets", "ViTS32", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["tag"] for r in rows} == {"augreg_in21k_ft_in1k", "augreg_in21k"}
    assert main(["presets", "ViTS23"]) == 2
    assert "keras-vit presets: error: Unknown architecture 'ViTS23'. Did you mean ViTS32" in capsys.readouterr().err


@pytest.fixture
def tiny_preset(tmp_path):
    model = randomize(keras_vit.VisionTransformer(**TINY, classifier_activation=None), seed=4)
    folder = tmp_path / "src_preset"
    keras_vit.save_preset(model, folder)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    return model, str(folder), x, model.predict(x, verbose=0)


def test_convert_to_npz_writes_the_original_layout(tiny_preset, tmp_path, capsys):
    model, src, _, _ = tiny_preset
    dst = str(tmp_path / "out.npz")
    assert main(["convert", src, dst]) == 0
    out = capsys.readouterr().out
    assert "reading" in out and "wrote an original google-research/vision_transformer .npz" in out
    with np.load(dst) as f:
        arrays = dict(f)
    assert arrays["Transformer/encoderblock_1/MultiHeadDotProductAttention_1/query/kernel"].shape == (24, 3, 8)
    np.testing.assert_array_equal(arrays["head/kernel"], keras_vit.get_weight_tree(model)["head/kernel"])
    assert main(["convert", src, dst]) == 2  # exists: refuses without --force


def test_convert_round_trips_through_preset_and_keras_file(tiny_preset, tmp_path, capsys):
    _, src, x, expected = tiny_preset
    npz = str(tmp_path / "a.npz")
    folder = str(tmp_path / "preset")
    keras_file = str(tmp_path / "m.keras")
    assert main(["convert", src, npz]) == 0
    assert main(["convert", npz, folder]) == 0
    assert main(["convert", folder, keras_file]) == 0
    assert "Keras preset folder" in capsys.readouterr().out
    for loaded in (keras_vit.load_checkpoint(folder), keras.saving.load_model(keras_file)):
        np.testing.assert_allclose(loaded.predict(x, verbose=0), expected, rtol=1e-5, atol=1e-5)


def test_convert_resizes_to_image_size(tiny_preset, tmp_path):
    _, src, _, _ = tiny_preset
    folder = str(tmp_path / "p48")
    assert main(["convert", src, folder, "--image-size", "48"]) == 0
    assert keras_vit.load_checkpoint(folder).input_shape == (None, 48, 48, 3)


def test_convert_non_square_big_vision_file_with_height_x_width(tmp_path, capsys):
    """A big_vision .npz stores no image size, and 4x6 = 24 position tokens are no square grid:
    `--image-size 32x48` says which grid they are (the file alone cannot be read)."""
    model = randomize(keras_vit.VisionTransformer(**dict(TINY, image_size=(32, 48)), classifier_activation=None),
                      seed=6)
    src, npz = str(tmp_path / "src.keras"), str(tmp_path / "bv.npz")
    model.save(src)
    assert main(["convert", src, npz, "--to", "big_vision"]) == 0
    with np.load(npz) as f:
        assert next(v.shape for k, v in f.items() if k.endswith("pos_embedding")) == (1, 24, 24)
    capsys.readouterr()
    assert main(["convert", npz, str(tmp_path / "a.keras")]) == 2
    assert "not a square grid" in capsys.readouterr().err
    dst = str(tmp_path / "b.keras")
    assert main(["convert", npz, dst, "--image-size", "32x48"]) == 0
    assert "at 32x48" in capsys.readouterr().out
    x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 48, 3)).astype("float32")
    converted = keras_vit.load_checkpoint(dst)
    assert converted.input_shape == (None, 32, 48, 3)
    np.testing.assert_allclose(converted.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-5)


def test_help_lists_the_commands():
    from keras_vit.cli import build_parser

    text = build_parser().format_help()
    assert "presets" in text and "convert" in text


# === convert from and to every format with a writer ===

_BIT_TINY = dict(image_size=32, block_units=(1, 1), width_factor=0.5, classes=5)


def _writer_formats():
    from keras_vit.checkpoints.registry import formats

    return {name: fmt for name, fmt in formats().items() if fmt.write is not None}


def _family_sources(model, folder):
    """{format: path} of `model` written in every format that holds its family: a .keras file,
    a preset folder, and each registered writer whose file reads back as its own format."""
    from keras_vit.checkpoints.registry import detect_format

    paths = {"keras": str(folder / "src.keras"), "keras_preset": str(folder / "src_preset")}
    model.save(paths["keras"])
    keras_vit.save_preset(model, paths["keras_preset"], readme=False)
    for name, fmt in _writer_formats().items():
        path = str(folder / f"src_{name}.npz")
        try:
            fmt.write(model, path)
        except ValueError:
            continue  # a writer of the other family
        if detect_format(path).name == name:
            paths[name] = path
    return paths


@pytest.mark.parametrize("family", ["vit", "bit"])
def test_convert_from_and_to_every_format_with_a_writer(family, tmp_path, capsys):
    """Every source format of the family to every destination, logits equal to the model's.
    The ViT is big_vision's layout (no position embedding for the class token, as a `tok` file
    loads); the BiT has big_transfer's numerics (its .npz files load with them)."""
    if family == "vit":
        model = keras_vit.VisionTransformer(**dict(TINY, class_token_position_embedding=False), classifier_activation=None)
        x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    else:
        from keras_vit.checkpoints.bit import BIG_TRANSFER_NUMERICS

        model = keras_vit.models.BiTResNet(**_BIT_TINY, **BIG_TRANSFER_NUMERICS, classifier_activation=None)
        x = np.random.default_rng(1).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    randomize(model, seed=5)
    expected = model.predict(x, verbose=0)
    sources = _family_sources(model, tmp_path)
    npz_formats = sorted(set(sources) - {"keras", "keras_preset"})
    assert npz_formats == (["big_vision", "npz"] if family == "vit" else ["bit_npz"]), sources
    for src_name, src in sources.items():
        for to in sources:
            dst = str(tmp_path / f"{src_name}_to_{to}") + (".keras" if to == "keras" else ".npz" if to in npz_formats
                                                         else "")
            # A big_transfer .npz does not store its image size (224 unless told).
            assert main(["convert", src, dst, "--to", to, "--image-size", "32"]) == 0, (src_name, to)
            out, err = capsys.readouterr()
            assert "wrote" in out and "note:" not in err, (src_name, to, err)
            loaded = keras_vit.load_checkpoint(dst, image_size=32)
            # Measured: 0 (the same float32 operations on the same weights); 1e-6 allows another
            # summation order of one backend.
            np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), expected, rtol=0, atol=1e-6,
                                       err_msg=f"{src_name} -> {to}")


def test_convert_says_when_the_destination_loads_with_other_numerics(tmp_path, capsys):
    model = randomize(keras_vit.models.BiTResNet(**_BIT_TINY), seed=2)  # timm's numerics (eps 1e-8)
    keras_vit.save_preset(model, tmp_path / "timm_bit", readme=False)
    assert main(["convert", str(tmp_path / "timm_bit"), str(tmp_path / "b.npz")]) == 0
    err = capsys.readouterr().err
    assert "std_conv_epsilon=1e-08 (the file loads with 1e-10)" in err
    assert main(["convert", str(tmp_path / "timm_bit"), str(tmp_path / "b2.npz"), "--to", "big_vision"]) == 2
    assert "cannot be written as" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "timm_bit"), str(tmp_path / "b3"), "--to", "pth"]) == 2
    assert "--to 'pth' is not a format convert writes" in capsys.readouterr().err
