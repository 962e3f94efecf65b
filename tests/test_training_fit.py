"""keras_vit.training under model.fit: gradient accumulation, EMA, resume, mixed precision, pilot."""

import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from tests.conftest import BACKEND, TINY, count_train_step_traces, randomize


def _data(n=16, size=32, classes=7, seed=0):
    r = np.random.default_rng(seed)
    x = r.uniform(-1, 1, size=(n, size, size, 3)).astype("float32")
    y = r.integers(0, classes, size=n)
    return x, y


def _model(seed=0):
    model = keras_vit.VisionTransformer(**TINY, classifier_activation=None)
    return randomize(model, seed=seed)


class _RecordWeights(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.after_batch = []

    def on_train_batch_end(self, batch, logs=None):
        self.after_batch.append([np.array(v.numpy()) for v in self.model.trainable_variables])


def test_accumulated_steps_equal_large_batch_steps_and_ema_is_polyak():
    """4 accumulated micro-batches of 4 == one batch of 16, with momentum, the global-norm clip
    (active: the first gradient's norm is 0.31 > 0.1; clipping micro-batches instead would
    differ), the warm-up schedule and EMA; the EMA equals the hand-computed average of updates.
    Three updates: with two, an EMA that also moved on the micro-batches between updates (whose
    weights are those of the last update) would still end at the same average."""
    x, y = _data()
    ema = 0.5
    loss = training.classification_loss(from_logits=True)

    def run(batch_size, accumulation):
        model = _model()
        opt = training.finetune_optimizer(
            0.5, total_steps=4, warmup_steps=2, gradient_accumulation_steps=accumulation, use_ema=True,
            ema_momentum=ema, global_clipnorm=0.1,
        )
        model.compile(optimizer=opt, loss=loss)
        record = _RecordWeights()
        model.fit(x, y, batch_size=batch_size, epochs=3, shuffle=False, verbose=0, callbacks=[record])
        averages = [np.array(a.numpy()) for a in opt._model_variables_moving_average]
        return model, opt, record.after_batch, averages

    large, large_opt, large_steps, large_avg = run(16, None)
    small, small_opt, small_steps, small_avg = run(4, 4)
    assert len(large_steps) == 3 and len(small_steps) == 12
    assert int(large_opt.iterations) == int(small_opt.iterations) == 3
    # Weights after every applied update agree (micro-steps in between leave them unchanged).
    init = [np.array(v.numpy()) for v in _model().trainable_variables]
    for k in range(3):
        for a, b in zip(large_steps[k], small_steps[4 * k + 3]):
            np.testing.assert_allclose(b, a, rtol=2e-5, atol=2e-6)
        for a, b in zip(small_steps[4 * k], small_steps[4 * k + 2]):
            np.testing.assert_array_equal(a, b)
    assert max(np.abs(a - b).max() for a, b in zip(large_steps[-1], init)) > 1e-3  # it trained
    # Polyak average by hand: avg_1 = w_1, avg_k = m avg_(k-1) + (1 - m) w_k over the updates.
    hand = [w.copy() for w in large_steps[0]]
    for k in (1, 2):
        hand = [ema * h + (1 - ema) * w for h, w in zip(hand, large_steps[k])]
    for h, a, b in zip(hand, large_avg, small_avg):
        np.testing.assert_allclose(a, h, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(b, h, rtol=2e-5, atol=2e-6)
    # fit leaves the averaged weights in the model (Keras finalize_variable_values).
    for v, h in zip(large.trainable_variables, hand):
        np.testing.assert_allclose(v.numpy(), h, rtol=1e-5, atol=1e-6)
    # ... and training can go on (plain Keras EMA on JAX aliases the buffers and fails here).
    assert np.isfinite(small.fit(x, y, batch_size=4, epochs=1, verbose=0).history["loss"][0])


def test_ema_swap_checkpoint_and_fewshot_probe(tmp_path):
    """Validation and the few-shot probe use the EMA weights, training the raw ones; the EMA
    checkpoint holds the averages; the probe's logged value is the few-shot solve."""
    x, y = _data(n=24, classes=3)
    model = _model()
    opt = training.finetune_optimizer(0.3, total_steps=8, warmup_steps=1, use_ema=True, ema_momentum=0.7)
    model.compile(optimizer=opt, loss=training.classification_loss(from_logits=True))
    path = str(tmp_path / "ema.weights.h5")
    callbacks = training.finetune_callbacks(
        checkpoint_path=path, ema=True, fewshot=(x[:12], y[:12], x[12:], y[12:]), fewshot_l2_reg=1.0
    )
    assert [type(c).__name__ for c in callbacks] == ["SwapEMAWeights", "FewShotProbe", "EMAModelCheckpoint"]

    class _Check(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            m = self.model
            raw = [np.array(v.numpy()) for v in m.trainable_variables]
            averaged = [np.array(a.numpy()) for a in m.optimizer._model_variables_moving_average]
            with training.ema_weights(m):
                inside = [np.array(v.numpy()) for v in m.trainable_variables]
            after = [np.array(v.numpy()) for v in m.trainable_variables]
            self.result = (raw, averaged, inside, after)

    check = _Check()
    record = _RecordWeights()
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, validation_data=(x, y),
                        callbacks=[record, check] + callbacks)
    raw, averaged, inside, after = check.result
    # The running (Polyak) average, computed by hand from the weights after each of the 6 updates.
    hand = [w.copy() for w in record.after_batch[0]]
    for weights in record.after_batch[1:]:
        hand = [0.7 * h + 0.3 * w for h, w in zip(hand, weights)]
    for h, a in zip(hand, averaged):
        np.testing.assert_allclose(a, h, rtol=1e-5, atol=1e-6)
    for r, a, i, f in zip(raw, averaged, inside, after):
        np.testing.assert_array_equal(i, a)
        np.testing.assert_array_equal(f, r)
    assert any(np.abs(r - a).max() > 1e-4 for r, a in zip(raw, averaged))
    # Validation loss was computed with the averages: recompute it on a copy holding them.
    reference = _model()
    reference.compile(loss=training.classification_loss(from_logits=True))
    for v, a in zip(reference.trainable_variables, averaged):
        v.assign(a)
    want = reference.evaluate(x, y, batch_size=8, verbose=0)
    assert history.history["val_loss"][-1] == pytest.approx(want, rel=1e-5)
    # The checkpoint holds the averages.
    saved = _model()
    saved.load_weights(path)
    for v, a in zip(saved.trainable_variables, averaged):
        np.testing.assert_array_equal(v.numpy(), a)
    # The probe's last value: the few-shot solve on features of the averaged weights, which fit
    # leaves in the model at the end.
    assert len(history.history["fewshot_accuracy"]) == 2
    features = training.extract_features(model, x)
    want = training.fewshot_linear_eval(features[:12], y[:12], features[12:], y[12:], l2_reg=1.0, num_classes=3)
    assert history.history["fewshot_accuracy"][-1] == pytest.approx(want)
    pooled = keras_vit.VisionTransformer(**{**TINY, "include_top": False, "pooling": "token"})
    keras_vit.set_weight_tree(pooled, keras_vit.get_weight_tree(model), skip=("head/",))
    np.testing.assert_allclose(training.extract_features(pooled, x), features, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_ema_callbacks_refuse_an_optimizer_without_ema(tmp_path, checkpoint):
    """finetune_callbacks(ema=True) with an optimizer built without use_ema=True would evaluate and
    save the raw weights as if averaged: fit refuses to start."""
    x, y = _data(n=8, classes=3)
    model = _model()
    model.compile(optimizer=training.finetune_optimizer(0.3, total_steps=4, warmup_steps=1),
                  loss=training.classification_loss(from_logits=True))
    before = [np.array(v.numpy()) for v in model.trainable_variables]
    path = str(tmp_path / "ema.weights.h5") if checkpoint else None
    callbacks = training.finetune_callbacks(ema=True, checkpoint_path=path)
    if checkpoint:
        callbacks = callbacks[-1:]  # EMAModelCheckpoint alone checks too
    with pytest.raises(ValueError, match="without use_ema=True"):
        model.fit(x, y, batch_size=4, epochs=1, verbose=0, validation_data=(x, y), callbacks=callbacks)
    for a, b in zip(before, model.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())  # no step was taken
    assert not os.path.exists(tmp_path / "ema.weights.h5")
    with pytest.raises(ValueError, match="without use_ema=True"):
        model.evaluate(x, y, verbose=0, callbacks=[training.SwapEMAWeights()])


class _Interrupt(keras.callbacks.Callback):
    def __init__(self, after):
        super().__init__()
        self.after, self.seen = after, 0

    def on_train_batch_end(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.after:
            raise RuntimeError("simulated preemption")


def _stream(x, y, skip=0):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4).skip(skip)


def test_resume_after_interruption_equals_uninterrupted_run(tmp_path):
    x, y = _data(n=24)

    def compiled():
        model = _model()
        model.compile(
            optimizer=training.finetune_optimizer(0.2, total_steps=12, warmup_steps=3),
            loss=training.classification_loss(from_logits=True),
        )
        return model

    reference = compiled()
    reference.fit(_stream(x, y), epochs=3, steps_per_epoch=4, verbose=0, shuffle=False)

    backup_dir = str(tmp_path / "backup")
    first = compiled()
    with pytest.raises(RuntimeError, match="simulated preemption"):
        first.fit(_stream(x, y), epochs=3, steps_per_epoch=4, verbose=0, shuffle=False,
                  callbacks=[training.BackupAndResume(backup_dir, save_freq=3), _Interrupt(after=7)])
    progress = training.backup_progress(backup_dir)
    assert progress == {"epoch": 1, "batch": 2, "step": 6}

    resumed = compiled()  # a fresh process would rebuild the same model
    counter = []

    class _Count(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            counter.append(int(self.model.optimizer.iterations))

    history = resumed.fit(_stream(x, y, skip=progress["step"]), epochs=3, steps_per_epoch=4, verbose=0, shuffle=False,
                          callbacks=[training.BackupAndResume(backup_dir, save_freq=3), _Count()])
    assert counter == list(range(6, 12))  # the step counter (and schedule) continues
    assert len(history.history["loss"]) == 2  # epochs 2 (remaining 2 steps) and 3
    assert int(resumed.optimizer.iterations) == 12
    for a, b in zip(resumed.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert not os.path.exists(backup_dir)  # deleted after a completed run


@pytest.mark.skipif(BACKEND not in ("jax", "tensorflow"), reason="bfloat16 training is checked on JAX and TF")
def test_fit_mixed_bfloat16_loss_finite_and_decreasing():
    keras.config.set_dtype_policy("mixed_bfloat16")
    r = np.random.default_rng(0)
    y = np.arange(64) % 2
    # Learnable: class 1 images are brighter.
    x = (r.uniform(-1, 0.6, size=(64, 32, 32, 3)) + 0.4 * y[:, None, None, None]).astype("float32")
    model = keras_vit.VisionTransformer(**{**TINY, "classes": 2}, classifier_activation=None)
    assert model.get_layer("encoderblock_0").compute_dtype == "bfloat16"
    model.compile(
        optimizer=training.finetune_optimizer(0.03, total_steps=40, warmup_steps=4),
        loss=training.classification_loss(model, label_smoothing=0.1),
    )
    history = model.fit(x, y, batch_size=16, epochs=10, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.05, losses


def test_a_keras_vit_data_pipeline_feeds_fit():
    import keras_vit.data as kd

    ds, info = kd.load_dataset("shapes", "train", image_size=16, batch_size=8, training=True)
    model = keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
                                        mlp_dim=16, classes=info.num_classes)
    model.compile("sgd", "sparse_categorical_crossentropy")
    history = model.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="the second trace is TensorFlow's (variables created in a tf.function)")
@pytest.mark.parametrize("data", ["dataset", "arrays"])
def test_tensorflow_traces_the_train_step_once(data, monkeypatch):
    # Adam's slots and the compiled metrics' variables exist before the first trace (see
    # keras_vit.backend_workarounds.TraceTrainStepOnce); Keras alone traces this step twice.
    import tensorflow as tf

    traces = count_train_step_traces(monkeypatch, keras_vit.VisionTransformer)
    x, y = _data(16)
    model = _model()
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    if data == "dataset":
        history = model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0)
    else:
        history = model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert len(traces) == 1
    assert model.optimizer.iterations.numpy() == 4 and np.isfinite(history.history["loss"]).all()


# === Labels outside the classes ===


def _tiny_classifier(classes=3):
    return keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                                       mlp_dim=16, classes=classes, classifier_activation=None)


def test_loss_of_a_label_outside_the_classes_is_nan():
    """The cross-entropy of NumPy's formula for the labels in range; NaN (not 0) for -1 and 3 of 3
    classes, as integers and as tf.one_hot's all-zero rows."""
    logits = np.array([[1.0, 2.0, 0.5], [0.2, -1.0, 3.0], [0.0, 0.0, 0.0], [1.0, 1.0, -2.0]], "float32")
    labels = np.array([1, 2, -1, 3])
    shifted = logits - logits.max(1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    loss = training.classification_loss(from_logits=True)
    per_row = keras.ops.convert_to_numpy(loss.call(keras.ops.convert_to_tensor(labels), logits))
    np.testing.assert_allclose(per_row[:2], -log_softmax[[0, 1], [1, 2]], rtol=1e-6)
    assert np.isnan(per_row[2:]).all()
    one_hot = np.zeros((4, 3), "float32")
    one_hot[[0, 1], [1, 2]] = 1  # rows 2 and 3: what tf.one_hot makes of -1 and 3
    per_row = keras.ops.convert_to_numpy(loss.call(keras.ops.convert_to_tensor(one_hot), logits))
    np.testing.assert_allclose(per_row[:2], -log_softmax[[0, 1], [1, 2]], rtol=1e-6)
    assert np.isnan(per_row[2:]).all()
    assert np.isnan(float(loss(labels, logits)))  # the batch's loss


@pytest.mark.parametrize("label", [-1, 3])
def test_fit_refuses_a_label_outside_the_classes(label):
    """NumPy labels are checked before the first step, a tf.data pipeline's batch by batch as it is
    read (on every backend, as one DataError line), the validation data too; no update is made
    from them."""
    import tensorflow as tf

    from keras_vit.errors import DataError

    model = _tiny_classifier()
    model.compile(optimizer="sgd", loss=training.classification_loss(model))
    x = np.zeros((8, 16, 16, 3), "float32")
    y = np.array([0, 1, 2, 0, 1, 2, label, 0])
    with pytest.raises(DataError, match=rf"^Label {label} \(row 6 of the training labels\) is outside \[0, 3\): the "
                       "model's head has 3 classes"):
        model.fit(x, y, batch_size=4, verbose=0)
    assert int(model.optimizer.iterations) == 0
    good = np.array([0, 1, 2, 0, 1, 2, 1, 0])
    with pytest.raises(DataError, match=rf"^Label {label} \(row 1 of the validation labels\)"):
        model.fit(x, good, validation_data=(x[:2], np.array([0, label])), verbose=0)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    steps = _RecordWeights()
    with pytest.raises(DataError, match=rf"^Label {label} in a batch of the training data is outside \[0, 3\): the "
                       r"model's head has 3 classes\. Pass labels 0 to 2") as caught:
        model.fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=[steps])
    assert "\n" not in str(caught.value) and caught.value.__cause__ is None
    assert len(steps.after_batch) == 1  # the first batch is fine; the second stops the run
    good_ds = tf.data.Dataset.from_tensor_slices((x, good)).batch(4)
    with pytest.raises(DataError, match=rf"^Label {label} in a batch of the validation data"):
        model.fit(good_ds, validation_data=ds, epochs=1, verbose=0, shuffle=False)
    model.fit(good_ds, epochs=1, verbose=0, shuffle=False)  # labels in range train
