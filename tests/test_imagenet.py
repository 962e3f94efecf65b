"""decode_predictions for 1000- and 21843-way heads (offline), and preprocess_input."""

import importlib.util
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.imagenet import imagenet_classes



def _timm_info(name):
    """A class-info file of the installed timm, read without importing timm (importing it after
    TensorFlow crashes the interpreter)."""
    spec = importlib.util.find_spec("timm")
    if spec is None:
        pytest.skip("timm is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "_info", name)
    with open(path) as f:
        return f.read().splitlines()


def test_class_orders_match_timm_imagenet_info():
    lemmas = dict(line.split("\t", 1) for line in _timm_info("imagenet_synset_to_lemma.txt") if line)
    for synsets, n in (("imagenet_synsets.txt", 1000), ("imagenet21k_goog_synsets.txt", 21843)):
        wnids = [w for w in _timm_info(synsets) if w]
        ours = imagenet_classes(n)
        assert [w for w, _ in ours] == wnids
        assert [d for _, d in ours] == [lemmas[w] for w in wnids]


def test_in21k_order_is_the_sorted_google_release():
    wnids = [w for w, _ in imagenet_classes(21843)]
    assert len(wnids) == len(set(wnids)) == 21843
    assert wnids == sorted(wnids)
    # Google's release has two synsets that are not in fall11 (21,841 classes).
    assert {"n03931044", "n09859684"} <= set(wnids)


def test_decode_predictions_1k():
    preds = np.full((2, 1000), 0.0001, "float32")
    preds[0, [1, 2, 3]] = [0.5, 0.3, 0.2]
    preds[1, 999] = 0.9
    out = keras_vit.decode_predictions(preds, top=3)
    assert [(w, n) for w, n, _ in out[0]] == [
        ("n01443537", "goldfish"), ("n01484850", "great_white_shark"), ("n01491361", "tiger_shark")
    ]
    assert out[0][0][2] == pytest.approx(0.5)
    assert out[1][0][:2] == ("n15075141", "toilet_tissue")
    assert len(out[1]) == 3


def test_decode_predictions_21k():
    preds = np.zeros((1, 21843), "float32")
    wnids = [w for w, _ in imagenet_classes(21843)]
    preds[0, wnids.index("n01443537")] = 3.0  # goldfish, as a logit
    preds[0, wnids.index("n02084071")] = 2.0  # dog
    out = keras_vit.decode_predictions(preds, top=2)
    assert [(w, n) for w, n, _ in out[0]] == [("n01443537", "goldfish"), ("n02084071", "dog")]


def test_decode_predictions_errors():
    with pytest.raises(ValueError, match="1000 and 21843"):
        keras_vit.decode_predictions(np.zeros((1, 10)))
    with pytest.raises(ValueError, match=r"\(batch, classes\)"):
        keras_vit.decode_predictions(np.zeros(1000))


def test_preprocess_input_maps_0_255_to_minus_one_one():
    x = np.array([[0, 51, 127, 255]], "uint8")
    out = keras_vit.preprocess_input(x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, x.astype(np.float64) / 127.5 - 1, atol=1e-6)
    assert out.min() == -1.0 and out.max() == 1.0
    tensor = keras_vit.preprocess_input(keras.ops.convert_to_tensor(np.array([0.0, 127.5, 255.0])))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(tensor), [-1.0, 0.0, 1.0], atol=1e-6)


def test_preprocess_input_with_a_model_applies_its_familys_normalisation():
    """EfficientNet's weights take torchvision's ImageNet statistics (timm's pretrained_cfg); a ViT
    without its own normalisation takes [-1, 1]."""
    x = np.array([[[[0, 51, 255], [200, 127, 3]]]], "uint8")
    efficientnet = keras_vit.EfficientNetB0(weights=None, input_shape=(32, 32, 3), classes=3)
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    out = keras_vit.preprocess_input(x, model=efficientnet)
    np.testing.assert_allclose(out, (x / 255.0 - mean) / std, rtol=1e-6, atol=1e-6)
    vit = keras_vit.VisionTransformer(image_size=8, patch_size=4, hidden_size=8, num_layers=1, num_heads=2,
                                      mlp_dim=8, classes=3)
    np.testing.assert_allclose(keras_vit.preprocess_input(x, model=vit), x / 127.5 - 1, atol=1e-6)
    tensor = keras_vit.preprocess_input(keras.ops.convert_to_tensor(x.astype("float32")), model=efficientnet)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(tensor), (x / 255.0 - mean) / std, rtol=1e-5, atol=1e-5)
