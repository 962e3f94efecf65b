"""remat=True: every encoder block recomputed in the backward pass, with the same gradients.

The reference is the same model without remat (same weights, same batch): rematerialisation
changes where activations come from in the backward pass, never the values. Each test also
checks that the recomputation really happens, so that a remat flag that did nothing would fail.
"""

import re

import keras
import numpy as np
import pytest

import keras_vit
from conftest import BACKEND
from keras_vit import training

KW = dict(image_size=16, patch_size=4, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=32, classes=5,
          classifier_activation=None)


def _pair(rng):
    """Two tiny models, without and with remat, holding the same random weights."""
    plain = keras_vit.VisionTransformer(**KW)
    remat = keras_vit.VisionTransformer(**KW, remat=True)
    weights = [rng.normal(size=w.shape).astype("float32") * 0.3 for w in plain.get_weights()]
    plain.set_weights(weights)
    remat.set_weights(weights)
    return plain, remat


def _batch(rng):
    return rng.normal(size=(3, 16, 16, 3)).astype("float32"), np.array([0, 3, 4])


def _count_block_calls(model):
    """Counts the Python runs of each block's forward (the real one runs: a counting wrapper)."""
    calls = []
    for block in model.encoder_blocks:
        inner = block._block

        def counted(*args, _inner=inner, **kwargs):
            calls.append(1)
            return _inner(*args, **kwargs)

        block._block = counted
    return calls


def _gradients(model, x, y):
    """d(mean cross-entropy)/d(trainable variables), in the backend's own autodiff."""
    if BACKEND == "jax":
        import jax

        trainable = [v.value for v in model.trainable_variables]
        rest = [v.value for v in model.non_trainable_variables]

        def loss(values):
            logits, _ = model.stateless_call(values, rest, x, training=True)
            return keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True).mean()

        text = str(jax.make_jaxpr(jax.grad(loss))(trainable))
        return [np.asarray(g) for g in jax.grad(loss)(trainable)], text
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        return [g.numpy() for g in tape.gradient(loss, [v.value for v in model.trainable_variables])], None
    logits = model(x, training=True)
    keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True).mean().backward()
    return [v.value.grad.detach().cpu().numpy() for v in model.trainable_variables], None


def test_gradients_equal_without_remat(rng):
    plain, remat = _pair(rng)
    x, y = _batch(rng)
    calls_plain, calls_remat = _count_block_calls(plain), _count_block_calls(remat)
    expected, plain_program = _gradients(plain, x, y)
    got, remat_program = _gradients(remat, x, y)
    assert len(got) == len(expected) == len(plain.trainable_variables)
    for variable, g, e in zip(remat.trainable_variables, got, expected):
        assert g.shape == e.shape, variable.path
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-6, err_msg=variable.path)
    assert max(float(np.abs(e).max()) for e in expected) > 1e-2  # the gradients are not all ~0
    if BACKEND == "jax":
        # The forward is traced once either way; the recomputation is a checkpoint in the program
        # (the primitive is "remat2" in JAX 0.10, "checkpoint" in some other versions).
        recompute = re.compile(r"\b(remat\w*|checkpoint)\[")
        assert len(recompute.findall(remat_program)) == KW["num_layers"]
        assert not recompute.search(plain_program)
    else:
        # Eager backward: each block's forward runs again in the backward pass.
        assert len(calls_plain) == KW["num_layers"]
        assert len(calls_remat) == 2 * KW["num_layers"]


def test_dropout_under_remat(rng):
    """With dropout, the remat model gives the plain model's training forward and gradients under
    the same seeds on every backend: the recomputed blocks draw the forward pass's masks (JAX and
    TensorFlow: seeds drawn before the checkpointed function; PyTorch: its checkpoint replays the
    random state). New masks in the recomputation would give gradients of another loss, far from
    the plain model's. The training forward differs from inference (dropout is on)."""
    kw = dict(KW, dropout_rate=0.3, attention_dropout_rate=0.2)
    models = []
    for remat in (False, True):
        keras.utils.set_random_seed(0)  # the dropout layers' generators start from the same seeds
        models.append(keras_vit.VisionTransformer(**kw, remat=remat))
    weights = [rng.normal(size=w.shape).astype("float32") * 0.3 for w in models[0].get_weights()]
    for model in models:
        model.set_weights(weights)
    x, y = _batch(rng)
    inference = [keras.ops.convert_to_numpy(model(x, training=False)) for model in models]
    np.testing.assert_allclose(inference[1], inference[0], rtol=0, atol=1e-6)
    outputs, gradients = [], []
    for model in models:
        keras.utils.set_random_seed(5)
        outputs.append(keras.ops.convert_to_numpy(model(x, training=True)))
        keras.utils.set_random_seed(6)
        gradients.append(_gradients(model, x, y)[0])
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=0, atol=1e-6)
    assert np.abs(outputs[0] - inference[0]).max() > 1e-2
    for variable, g, e in zip(models[1].trainable_variables, gradients[1], gradients[0]):
        np.testing.assert_allclose(g, e, rtol=0, atol=1e-6, err_msg=variable.path)
    # The gradients are those of a dropout loss: not the inference loss's.
    keras.utils.set_random_seed(6)
    plain_model = keras_vit.VisionTransformer(**KW)
    plain_model.set_weights(weights)
    without_dropout = _gradients(plain_model, x, y)[0]
    assert max(float(np.abs(g - e).max()) for g, e in zip(gradients[0], without_dropout)) > 1e-2


def test_train_step_equal_without_remat():
    """One compiled `train_on_batch` (SGD momentum, clip, cross-entropy): the same loss and weights."""
    rng = np.random.default_rng(0)
    plain, remat = _pair(rng)
    x, y = _batch(rng)
    results = []
    for model in (plain, remat):
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=1.0),
                      loss=training.classification_loss(model))
        loss = float(model.train_on_batch(x, y))
        results.append((loss, [w.copy() for w in model.get_weights()]))
    (loss_plain, after_plain), (loss_remat, after_remat) = results
    assert abs(loss_plain - loss_remat) <= 1e-6 * max(1.0, abs(loss_plain))
    for a, b, w in zip(after_plain, after_remat, remat.weights):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6, err_msg=w.path)
    start = _pair(np.random.default_rng(0))[0].get_weights()
    assert any(not np.array_equal(a, s) for a, s in zip(after_plain, start))  # the step moved the weights


def test_remat_is_kept_by_config_and_keras_file(tmp_path, rng):
    model = keras_vit.VisionTransformer(**KW, remat=True)
    assert model.get_config()["remat"] is True
    assert all(block.remat for block in model.encoder_blocks)
    assert keras_vit.VisionTransformer(**KW).get_config()["remat"] is False
    x, _ = _batch(rng)
    model.set_weights([rng.normal(size=w.shape).astype("float32") * 0.3 for w in model.get_weights()])
    path = str(tmp_path / "remat.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.config.remat and all(block.remat for block in loaded.encoder_blocks)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)), keras.ops.convert_to_numpy(model(x)),
                               rtol=0, atol=1e-6)
    rebuilt = keras_vit.VisionTransformer.from_config(model.get_config())
    assert rebuilt.config.remat
    block = model.encoder_blocks[0]  # a block on its own keeps it too
    assert type(block).from_config(block.get_config()).remat


def test_finetuning_and_constructors_take_remat():
    base = keras_vit.VisionTransformer(**KW)
    fine = training.for_finetuning(base, classes=3, remat=True)
    assert fine.config.remat and all(block.remat for block in fine.encoder_blocks)
    assert training.for_finetuning(fine, classes=2).config.remat  # the model's setting by default
    assert not training.for_finetuning(fine, classes=2, remat=False).config.remat
    assert not training.for_finetuning(base, classes=2).config.remat
    with keras.StatelessScope(initialize_variables=False):
        model = keras_vit.ViTTi16(weights=None, remat=True)
    assert model.config.remat and len(model.encoder_blocks) == 12
    assert all(block.remat for block in model.encoder_blocks)


def test_remat_must_be_a_flag():
    with pytest.raises(TypeError, match="remat"):
        keras_vit.VisionTransformer(**KW, rematerialize=True)
