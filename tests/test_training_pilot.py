"""Masked patch prediction (the paper's pilot): corruption, colour targets, loss, transfer."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from keras_vit.training import pilot as pilot_module
from tests.conftest import TINY, count_train_step_traces, randomize


def _pilot(seed=1, **kwargs):
    encoder = keras_vit.VisionTransformer(**{**TINY, "include_top": False})
    return training.MaskedPatchPrediction(randomize(encoder, scale=0.3), seed=seed, **kwargs)


def test_colour_targets_by_hand(rng):
    images = rng.uniform(-1, 1, size=(2, 16, 24, 3)).astype("float32")
    images[0, :8, :8] = 1.0  # a white patch: top bin 7 in every channel
    images[0, :8, 8:16] = -1.0  # black: bin 0
    got = keras.ops.convert_to_numpy(training.colour_targets(images, 8))
    want = np.zeros((2, 6), int)
    for b in range(2):
        for r in range(2):
            for c in range(3):
                bins = []
                for ch in range(3):
                    mean = images[b, 8 * r : 8 * r + 8, 8 * c : 8 * c + 8, ch].mean()
                    bins.append(min(int(np.floor((mean + 1) / 2 * 8)), 7))
                want[b, 3 * r + c] = bins[0] * 64 + bins[1] * 8 + bins[2]
    np.testing.assert_array_equal(got, want)
    assert got[0, 0] == 511 and got[0, 1] == 0 and got.max() < 512


def test_corruption_rates_and_contents():
    pilot = _pilot()
    r = np.random.default_rng(0)
    tokens = r.normal(size=(512, 16, TINY["hidden_size"])).astype("float32")
    out, kind = pilot.corrupt(keras.ops.convert_to_tensor(tokens))
    out, kind = keras.ops.convert_to_numpy(out), keras.ops.convert_to_numpy(kind)
    n = kind.size
    corrupted = kind > 0
    frac = corrupted.mean()
    masked = (kind == pilot_module.MASKED).sum() / corrupted.sum()
    other = (kind == pilot_module.RANDOM_PATCH).sum() / corrupted.sum()
    same = (kind == pilot_module.UNCHANGED).sum() / corrupted.sum()
    print(f"{n} positions: corrupted {frac:.4f}; of those mask {masked:.4f}, random {other:.4f}, unchanged {same:.4f}")
    assert abs(frac - 0.5) < 0.02 and abs(masked - 0.8) < 0.02
    assert abs(other - 0.1) < 0.015 and abs(same - 0.1) < 0.015
    mask_embedding = keras.ops.convert_to_numpy(pilot.mask_embedding)
    np.testing.assert_array_equal(out[kind == pilot_module.MASKED], np.broadcast_to(mask_embedding, (int((kind == 1).sum()), 24)))
    keep = (kind == pilot_module.KEPT) | (kind == pilot_module.UNCHANGED)
    np.testing.assert_array_equal(out[keep], tokens[keep])
    # A random-patch position holds another patch of the same image, never its own.
    for b, i in zip(*np.nonzero(kind == pilot_module.RANDOM_PATCH)):
        matches = np.nonzero(np.all(tokens[b] == out[b, i], axis=1))[0]
        assert len(matches) == 1 and matches[0] != i
    # A second call draws new positions (the SeedGenerator advances).
    _, kind2 = pilot.corrupt(keras.ops.convert_to_tensor(tokens))
    assert (keras.ops.convert_to_numpy(kind2) != kind).mean() > 0.3


def test_pilot_loss_counts_corrupted_positions_only(rng):
    pilot = _pilot()
    keras.utils.set_random_seed(0)
    pilot.head.kernel.assign(rng.normal(size=pilot.head.kernel.shape).astype("float32") * 0.1)
    images = rng.uniform(-1, 1, size=(4, 32, 32, 3)).astype("float32")
    pred = pilot(images)
    logits = keras.ops.convert_to_numpy(pred["logits"])
    weight = keras.ops.convert_to_numpy(pred["corrupted"])
    assert logits.shape == (4, 16, 512) and set(np.unique(weight)) <= {0.0, 1.0}
    loss = float(keras.ops.convert_to_numpy(pilot.compute_loss(x=images, y_pred=pred)))
    targets = keras.ops.convert_to_numpy(training.colour_targets(images, 8))
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) - logits.max(-1, keepdims=True)
    ce = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    assert loss == pytest.approx((ce * weight).sum() / weight.sum(), rel=1e-5)


def test_pilot_trains_and_transfers_to_finetuning(monkeypatch):
    # On TensorFlow the train step is traced once (AdamW's slots exist before the trace).
    traces = count_train_step_traces(monkeypatch, training.MaskedPatchPrediction)
    pilot = _pilot()
    pilot.compile(optimizer=training.pretrain_optimizer(3e-3, total_steps=24, warmup_steps=2))
    r = np.random.default_rng(1)
    # Images whose patches have a few flat colours: mean colour is predictable from context.
    small = r.choice([-0.9, -0.3, 0.3, 0.9], size=(32, 4, 4, 3)).astype("float32")
    images = np.repeat(np.repeat(small, 8, 1), 8, 2)
    before = pilot.encoder_weight_tree()
    history = pilot.fit(images, batch_size=8, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0], losses
    assert len(traces) == 1 or keras.backend.backend() != "tensorflow"
    tree = pilot.encoder_weight_tree()
    assert not np.allclose(tree["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"],
                           before["Transformer/encoderblock_0/MlpBlock_3/Dense_0/kernel"])
    model = training.for_finetuning(pilot.encoder, image_size=48, classes=5)
    transferred = keras_vit.get_weight_tree(model)
    for key, value in tree.items():
        if not key.endswith("pos_embedding"):
            np.testing.assert_array_equal(transferred[key], value, err_msg=key)
    assert np.all(transferred["head/kernel"] == 0) and model.output_shape == (None, 5)
    # The pilot serialises through its config.
    again = training.MaskedPatchPrediction.from_config(pilot.get_config())
    assert again.encoder.grid_size == pilot.encoder.grid_size and again.corrupt_rate == 0.5
