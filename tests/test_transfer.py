"""Fine-tuning and few-shot features of every model family through the Python API
(`training.for_finetuning`, `training.extract_features`): the weights carried over, the zero
head, the input resized where the family allows it, the settings each family declares
(`keras_vit.models.transfer`), a few training steps; features against NumPy pooling."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from keras_vit.models import AxialResNet, AxialVisionTransformer, BiTResNet, EfficientNet
from keras_vit.models.efficientnet_family import finetune_resolution, finetune_settings
from keras_vit.models.transfer import bit_hyperrule_resolution

VIT = dict(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32)
#: One tiny model per family at `size` px with 5 classes.
TINY = {
    "vit": lambda size, **k: keras_vit.VisionTransformer(image_size=size, classes=5, **VIT, **k),
    "r_vit": lambda size, **k: keras_vit.VisionTransformer(image_size=size, classes=5, **{**VIT, "patch_size": 2},
                                                           resnet=((1,), 0.5), **k),
    "bit": lambda size, **k: BiTResNet(image_size=size, block_units=(1,), width_factor=0.5, classes=5, **k),
    "efficientnet": lambda size, **k: EfficientNet(image_size=size, width_multiplier=0.1, depth_multiplier=0.1,
                                                   classes=5, **k),
    "axial_resnet": lambda size, **k: AxialResNet(image_size=size, block_units=(1,), width_multiplier=0.125,
                                                  groups=2, classes=5, **k),
    "axial_vit": lambda size, **k: AxialVisionTransformer(image_size=size, classes=5, **VIT, **k),
}
FAMILIES = list(TINY)
SIZE, NEW_SIZE = 32, 48
#: The layer whose output is the pooled representation (what the head reads), per family.
POOLED = {"vit": "pool", "r_vit": "pool", "bit": "pool", "efficientnet": "global_pool", "axial_resnet": "avgpool",
          "axial_vit": "pool"}


def randomize(model, seed=0):
    """Random weights everywhere (the head too), BatchNorm variances positive, norms near 1."""
    r = np.random.default_rng(seed)
    for v in model.weights:
        shape, name = tuple(v.shape), v.path.rsplit("/", 1)[-1]
        noise = r.standard_normal(shape)
        if name in ("moving_variance",):
            value = 1.0 + 0.2 * np.abs(noise)
        elif name in ("gamma", "scale"):
            value = 1.0 + 0.2 * noise
        elif len(shape) >= 2:
            value = noise / np.sqrt(np.prod(shape[:-1]))
        else:
            value = 0.2 * noise
        v.assign(value.astype(v.dtype))
    return model


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    """(name, a randomised tiny model with its head, images)."""
    name = request.param
    images = np.random.default_rng(1).uniform(-1, 1, (4, SIZE, SIZE, 3)).astype("float32")
    return name, randomize(TINY[name](SIZE, classifier_activation=None)), images


def _head_prefix(model):
    from keras_vit.models.family import family_of

    return family_of(model).head.rstrip("/").rsplit("/", 1)[-1] + "/"


def test_finetuning_keeps_the_weights_and_zeroes_the_head(family):
    name, source, images = family
    ft = training.for_finetuning(source, classes=3, classifier_activation=None)
    assert type(ft) is type(source) and ft.output_shape == (None, 3)
    # A zero head: logits exactly 0 whatever the image.
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(ft(images)), 0.0)
    head = _head_prefix(source)
    own = {v.path: keras.ops.convert_to_numpy(v) for v in source.weights}
    carried = [v for v in ft.weights if not v.path.startswith(head)]
    assert len(carried) == len([p for p in own if not p.startswith(head)])
    for v in carried:
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(v), own[v.path], err_msg=v.path)
    # The pooled representation the new head reads is the pretrained one.
    pooled = lambda m: keras.Model(m.inputs, m.get_layer(POOLED[name]).output).predict(images, verbose=0)  # noqa: E731
    np.testing.assert_allclose(pooled(ft), pooled(source), rtol=1e-5, atol=1e-6)


def test_finetuning_trains_a_few_steps(family):
    name, source, images = family
    # Dropout (EfficientNet's head and drop connect) draws from Keras' global seed: fixed here, so
    # the three steps do not depend on what ran before in the worker.
    keras.utils.set_random_seed(0)
    ft = training.for_finetuning(source, classes=3, classifier_activation=None)
    ft.compile(optimizer=training.finetune_optimizer(0.1, total_steps=3, warmup_steps=0),
               loss=training.classification_loss(ft))
    history = ft.fit(images, np.array([0, 1, 2, 0]), batch_size=4, epochs=3, verbose=0)
    losses = history.history["loss"]
    assert np.isclose(losses[0], np.log(3), rtol=1e-4)  # a zero head: uniform predictions first
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_finetuning_resizes_where_the_family_allows_it(family):
    name, source, images = family
    if name == "axial_resnet":  # its attention spans are fixed by its image size
        with pytest.raises(ValueError, match=r"AxialResNet models fine-tune at their checkpoint's resolution 32x32 "
                                             r"only .*pass image_size=32"):
            training.for_finetuning(source, image_size=NEW_SIZE, classes=3)
        return
    ft = training.for_finetuning(source, image_size=NEW_SIZE, classes=3, classifier_activation=None)
    assert ft.input_shape == (None, NEW_SIZE, NEW_SIZE, 3) and ft.output_shape == (None, 3)
    big = np.random.default_rng(2).uniform(-1, 1, (2, NEW_SIZE, NEW_SIZE, 3)).astype("float32")
    features = keras.Model(ft.inputs, ft.get_layer(POOLED[name]).output).predict(big, verbose=0)
    if name in ("bit", "efficientnet"):  # fully convolutional: the same weights in a model built at 48 px
        other = TINY[name](NEW_SIZE, classifier_activation=None)
        other.set_weights(source.get_weights())
        expected = keras.Model(other.inputs, other.get_layer(POOLED[name]).output).predict(big, verbose=0)
        np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(features))
    if name != "efficientnet":  # the random tiny EfficientNet's pooled features barely depend on the image:
        # each block shrinks the difference between two images, to float32 rounding at the pool
        assert np.ptp(features, axis=0).max() > 1e-3 * np.abs(features).max()


def test_each_family_declares_its_settings(family):
    name, source, _ = family
    if name in ("vit", "r_vit", "axial_vit"):  # the transformers fine-tune without dropout, with their remat
        dropped = TINY[name](SIZE, dropout_rate=0.1, attention_dropout_rate=0.1, remat=True)
        dropped.set_weights(source.get_weights())
        config = training.for_finetuning(dropped, classes=3).get_config()
        assert config["dropout_rate"] == 0.0 and config["attention_dropout_rate"] == 0.0 and config["remat"] is True
        assert training.for_finetuning(dropped, classes=3, dropout_rate=0.2).get_config()["dropout_rate"] == 0.2
    elif name == "efficientnet":  # its own dropout
        own = TINY[name](SIZE, dropout_rate=0.35, drop_path_rate=0.1)
        config = training.for_finetuning(own, classes=3).get_config()
        assert (config["dropout_rate"], config["drop_path_rate"]) == (0.35, 0.1)
    else:  # nothing to set: a dropout is refused, naming what the family takes
        with pytest.raises(ValueError, match=r"have no dropout_rate to set for fine-tuning \(what they take: none\)"):
            training.for_finetuning(source, classes=3, dropout_rate=0.1)


def test_efficientnet_rules_follow_its_architecture_table():
    # EfficientNet-B3 (width 1.2, depth 1.4): 300 px, dropout 0.3 (the EfficientNet paper's table).
    b3 = {"width_multiplier": 1.2, "depth_multiplier": 1.4}
    assert finetune_resolution(b3, (32, 32)) == (300, 300)
    assert finetune_settings(b3) == {"dropout_rate": 0.3, "drop_path_rate": 0.2}
    assert finetune_settings({**b3, "dropout_rate": 0.1})["dropout_rate"] == 0.1
    assert finetune_resolution({"width_multiplier": 0.1, "depth_multiplier": 0.1}, (32, 32)) is None


def test_bit_hyperrule_resolution():
    # Below 96 x 96 pixels: 128 px; from there on: 480 px; unknown data: the model's own.
    assert bit_hyperrule_resolution({}, (95, 96)) == (128, 128)
    assert bit_hyperrule_resolution({}, (96, 96)) == (480, 480)
    assert bit_hyperrule_resolution({}, (8, 8)) == (128, 128)
    assert bit_hyperrule_resolution({}, None) is None


def test_fewshot_features_are_pooled(family):
    name, source, images = family
    # The family's feature map (headless, unpooled), with the source's weights, pooled in NumPy.
    headless = TINY[name](SIZE, include_top=False)
    headless.set_weights(source.get_weights()[: len(headless.weights)])
    tokens = np.asarray(headless.predict(images, verbose=0), np.float64)
    if name in ("vit", "r_vit"):
        expected = tokens[:, 0]  # the class token
    else:
        expected = tokens.mean(axis=(1, 2))  # global average pool of the (batch, h, w, channels) map
    for model in (source, headless):  # with its head, and without
        features = training.extract_features(model, images)
        assert features.shape == expected.shape
        np.testing.assert_allclose(features, expected, rtol=1e-5, atol=1e-5)
    labels = np.array([0, 1, 0, 1])
    assert 0.0 <= training.fewshot_linear_eval(features, labels, features, labels, l2_reg=1.0) <= 1.0
