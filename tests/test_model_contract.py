"""The model contract over the registry, as timm's tests/test_models.py checks every model: for
every constructor of every family, at a small size, forward; backward with every trainable weight
receiving a non-zero gradient; `include_top=False` and `classes=0`; the features contract
(`feature_info`, `feature_extractor`, `forward_intermediates`).

Constructors cannot shrink their width or depth (their row fixes it), so each one is checked
twice, as timm samples models by size:
- its tiny twin: the family's model with the row's layout (patch size, classifier, hybrid ResNet
  stages, stage strides, block kinds) at a small width and one unit per stage, where forward,
  backward and features run (constructors of one layout share a twin);
- each family's smallest constructor, itself, built at a small input where its forward FLOPs at
  224 px are under CONSTRUCTOR_GFLOPS (the rest would cost seconds to build; their layout runs in
  the twin).
"""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.models.family import families

from conftest import BACKEND

#: Constructors whose forward pass at 224 px takes fewer GFLOPs are built and run themselves.
CONSTRUCTOR_GFLOPS = 2.6
CLASSES = 5


def _tiny(family, row):
    """(model kwargs, image side) of the tiny twin of an architecture `row` of `family`."""
    kwargs = dict(row.kwargs())
    if family.name == "vit":
        kwargs.update(hidden_size=16, num_heads=2, mlp_dim=32, num_layers=2)
        if kwargs.get("resnet") is not None:
            kwargs["resnet"] = ((1,) * len(kwargs["resnet"][0]), 0.5)
        return kwargs, 2 * row.patch_size * (1 if kwargs.get("resnet") is None else
                                             4 * 2 ** max(len(kwargs["resnet"][0]) - 1, 0))
    if family.name == "axial_vit":
        kwargs.update(hidden_size=16, num_heads=2, mlp_dim=32, num_layers=1)
        return kwargs, 2 * row.patch_size
    if family.name == "bit":
        kwargs.update(block_units=(1,) * len(kwargs["block_units"]), width_factor=0.5)
        return kwargs, 64
    if family.name == "axial_resnet":
        kwargs.update(block_units=(1,) * len(kwargs["block_units"]), width_multiplier=0.25)
        return kwargs, 32
    if family.name == "efficientnet":  # every stage one block (the rows differ in multipliers only)
        kwargs.update(width_multiplier=0.1, depth_multiplier=0.1, dropout_rate=0.2)
        return kwargs, 32
    raise AssertionError(f"no tiny twin for the {family.name} family: add its rule here")


def _twins():
    """[(family, kwargs, image side, [constructor names])], one per distinct tiny layout."""
    out = {}
    for family in families():
        for name, row in family.all_architectures().items():
            kwargs, side = _tiny(family, row)
            key = (family.name, repr(sorted(kwargs.items())), side)
            out.setdefault(key, (family, kwargs, side, []))[3].append(name)
    return list(out.values())


TWINS = _twins()


def _randomize(model, seed):
    """Every variable moved off its initial value (zero-initialised heads included), so that every
    weight reaches the output."""
    rng = np.random.default_rng(seed)
    for v in model.trainable_variables:
        v.assign(keras.ops.convert_to_numpy(v) + rng.normal(0, 0.05, v.shape).astype("float32"))


def _forward_backward(model, x, probe):
    """(outputs, d(sum(outputs * probe))/d(trainable variables)) in the backend's autodiff, in
    training mode: one compiled program on JAX."""
    if BACKEND == "jax":
        import jax

        rest = [v.value for v in model.non_trainable_variables]

        def loss(values):
            out, _ = model.stateless_call(values, rest, x, training=True)
            return (out * probe).sum(), out

        grads, out = jax.jit(jax.grad(loss, has_aux=True))([v.value for v in model.trainable_variables])
        return np.asarray(out), [np.asarray(g) for g in grads]
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            out = model(x, training=True)
            loss = tf.reduce_sum(out * probe)
        grads = tape.gradient(loss, [v.value for v in model.trainable_variables])
        # a gathered table (BEiT's relative position bias) has a sparse gradient: IndexedSlices
        return out.numpy(), [tf.convert_to_tensor(g).numpy() for g in grads]
    out = model(x, training=True)
    (out * keras.ops.convert_to_tensor(probe)).sum().backward()
    return out.detach().cpu().numpy(), [v.value.grad.detach().cpu().numpy() for v in model.trainable_variables]


def _check_features(model, side):
    """The features contract on `model` at images of `side` pixels: the maps' NHWC shapes are the
    channels and reductions `feature_info` states; the last n; tokens; the prefix tokens apart.
    Returns the final features' shape."""
    info = model.feature_info
    assert info and [f["index"] for f in info] == list(range(len(info)))
    final, *maps = model.feature_extractor(include_final=True).outputs  # flattened: final, then the maps
    assert len(maps) == len(info)
    for f, m in zip(info, maps):
        assert tuple(m.shape[1:]) == (side // f["reduction"], side // f["reduction"], f["channels"]), (f, m.shape)
    prefix = getattr(model, "num_prefix_tokens", 0)
    last = model.feature_extractor(1, output="tokens", return_prefix_tokens=True).outputs
    patches = (side // info[-1]["reduction"]) ** 2
    assert [tuple(t.shape[1:]) for t in last] == [(patches, info[-1]["channels"])] + (
        [(prefix, info[-1]["channels"])] if prefix else [])
    return tuple(final.shape[1:])


@pytest.mark.parametrize("twin", TWINS, ids=["-".join(t[3]) for t in TWINS])
def test_contract_of_every_layout(twin):
    family, kwargs, side, _ = twin
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, side, side, 3)).astype("float32")
    model = family.build(**kwargs, image_size=side, classes=CLASSES, classifier_activation=None)
    _randomize(model, 1)
    # Forward (logits of the right shape, finite) and backward: every trainable weight receives a
    # gradient.
    logits, grads = _forward_backward(model, x, rng.normal(size=(2, CLASSES)).astype("float32"))
    assert logits.shape == (2, CLASSES) and np.all(np.isfinite(logits))
    silent = [v.path for v, g in zip(model.trainable_variables, grads) if not np.any(g)]
    assert not silent, f"no gradient reaches {silent}"
    assert all(np.all(np.isfinite(g)) for g in grads)

    final = _check_features(model, side)
    # include_top=False: the final features; classes=0: them pooled, one vector per image.
    headless = family.build(**kwargs, image_size=side, include_top=False)
    assert headless.output_shape[1:] == final
    pooled = family.build(**kwargs, image_size=side, classes=0)
    assert not pooled.include_top and pooled.output_shape == (None, final[-1])
    # timm's num_classes=0: pooled as the classifier pools (a ViT's class token, average, MAP head).
    classifier = kwargs.get("classifier")
    assert pooled.pooling == ({"token": "token", "gap": "gap", "map": "map"}[classifier] if classifier else "avg")


def _small_constructors():
    """Each family's smallest constructor under CONSTRUCTOR_GFLOPS at 224 px."""
    out = []
    for family in families():
        cost = {n: keras_vit.flops(n, 224) for n in family.architectures}
        smallest = min(cost, key=cost.get)
        if cost[smallest] < CONSTRUCTOR_GFLOPS * 1e9:
            out.append(smallest)
    return out


SMALL = _small_constructors()


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", SMALL)
def test_small_constructors(name):
    """The constructors themselves, at 64 px: the head, include_top=False, classes=0, features."""
    constructor = getattr(keras_vit, name)
    model = constructor(weights=None, input_shape=(64, 64, 3), classes=CLASSES)
    assert model.output_shape == (None, CLASSES)
    info = model.feature_info
    assert all(f["reduction"] <= model.stride for f in info) and info[-1]["reduction"] == model.stride
    headless = constructor(weights=None, input_shape=(64, 64, 3), include_top=False)
    pooled = constructor(weights=None, input_shape=(64, 64, 3), classes=0)
    assert pooled.output_shape == (None, headless.output_shape[-1])
    assert model.predict(np.zeros((1, 64, 64, 3), "float32"), verbose=0).shape == (1, CLASSES)
    maps = model.feature_extractor(2).outputs
    assert [tuple(m.shape[1:]) for m in maps] == [
        (64 // f["reduction"], 64 // f["reduction"], f["channels"]) for f in info[-2:]]


@pytest.mark.backend_independent
def test_every_constructor_is_covered():
    covered = {name for twin in TWINS for name in twin[3]}
    assert covered == {n for f in families() for n in f.all_architectures()}
    assert {keras_vit.models.family.family_of(n).name for n in SMALL} >= {"vit", "efficientnet"}
