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
    assert "reading" in out and "wrote original-layout .npz" in out
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


def test_help_lists_the_commands():
    from keras_vit.cli import build_parser

    text = build_parser().format_help()
    assert "presets" in text and "convert" in text
