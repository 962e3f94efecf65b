"""keras_vit.training: schedules, few-shot solve, optimizers (accumulation, EMA), fine-tuning set-up."""

import math

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from tests.conftest import TINY, randomize

# === Schedules ===


def _original_schedule(s, base, total, warmup, decay, end):
    """The original train.py formula, written out independently (s = 1-based update number)."""
    progress = np.clip((s - warmup) / (total - warmup), 0.0, 1.0)
    if decay == "cosine":
        lr = base * 0.5 * (1 + np.cos(np.pi * progress))
    else:
        lr = end + (base - end) * (1 - progress)
    return lr * min(1.0, s / warmup) if warmup else lr


@pytest.mark.parametrize(
    "cls,kwargs,decay",
    [
        (training.WarmupCosineDecay, dict(base_learning_rate=0.03, total_steps=1000, warmup_steps=100), "cosine"),
        (training.WarmupLinearDecay, dict(base_learning_rate=1e-3, total_steps=500, warmup_steps=50), "linear"),
        (training.WarmupCosineDecay, dict(base_learning_rate=0.01, total_steps=40, warmup_steps=0), "cosine"),
    ],
)
def test_schedule_values_match_formula(cls, kwargs, decay):
    schedule = cls(**kwargs)
    end = getattr(schedule, "end_learning_rate", 0.0)
    total, warmup = kwargs["total_steps"], kwargs["warmup_steps"]
    for step in sorted({0, 1, warmup // 2, max(warmup - 1, 0), warmup, (warmup + total) // 2, total - 1, total + 5}):
        got = float(keras.ops.convert_to_numpy(schedule(step)))
        want = _original_schedule(step + 1, kwargs["base_learning_rate"], total, warmup, decay, end)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-9), (step, got, want)
    # Hand-picked points: end of warm-up = peak, cosine half-way = base / 2.
    peak = float(keras.ops.convert_to_numpy(schedule(max(warmup - 1, 0))))
    if warmup:
        assert peak == pytest.approx(kwargs["base_learning_rate"], rel=1e-6)
    if decay == "cosine" and warmup:
        mid = warmup + (total - warmup) // 2
        assert float(schedule(mid - 1)) == pytest.approx(kwargs["base_learning_rate"] / 2, rel=1e-5)


def test_schedule_serialises_and_validates():
    schedule = training.WarmupLinearDecay(1e-3, total_steps=100, warmup_steps=10, end_learning_rate=1e-5)
    again = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert type(again) is training.WarmupLinearDecay and again.get_config() == schedule.get_config()
    optimizer = training.finetune_optimizer(0.01, total_steps=50, warmup_steps=5)
    rebuilt = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(rebuilt, training.SGD) and isinstance(rebuilt._learning_rate, training.WarmupCosineDecay)
    with pytest.raises(ValueError, match="warmup_steps"):
        training.WarmupCosineDecay(0.1, total_steps=10, warmup_steps=20)
    with pytest.raises(ValueError, match="total_steps"):
        training.finetune_optimizer(0.01)


def test_recipe_optimizer_settings():
    ft = training.finetune_optimizer(0.01, total_steps=100, warmup_steps=10)
    assert (ft.momentum, ft.global_clipnorm, ft.weight_decay) == (0.9, 1.0, None)
    pt = training.pretrain_optimizer(1e-3, total_steps=100, warmup_steps=10)
    assert (pt.beta_1, pt.beta_2, pt.weight_decay, pt.global_clipnorm) == (0.9, 0.999, 0.1, 1.0)
    assert isinstance(pt._learning_rate, training.WarmupLinearDecay)


# === Few-shot linear evaluation ===


def test_fewshot_solve_equals_lstsq(rng):
    x = rng.normal(size=(40, 12)) * rng.uniform(0.5, 3.0, size=12) + rng.normal(size=12)
    y = np.arange(40) % 5
    l2 = 3.7
    solution = training.fewshot_linear_weights(x, y, num_classes=5, l2_reg=l2)
    # The same system written independently: whiten, append the constant 100 column, targets
    # 2*onehot-1, ridge as extra rows sqrt(l2) * I with zero targets; solved by lstsq.
    xw = (x - x.mean(0)) / (x.std(0) + 1e-5)
    xa = np.concatenate([xw, np.full((40, 1), 100.0)], axis=1)
    targets = 2.0 * np.eye(5)[y] - 1.0
    a = np.concatenate([xa, np.sqrt(l2) * np.eye(13)], axis=0)
    b = np.concatenate([targets, np.zeros((13, 5))], axis=0)
    want = np.linalg.lstsq(a, b, rcond=None)[0]
    np.testing.assert_allclose(solution["weights"], want, rtol=1e-8, atol=1e-10)
    # Fewer examples than features: the dual (N x N) route gives the same solution.
    few = training.fewshot_linear_weights(x[:8], y[:8], num_classes=5, l2_reg=l2, normalize=False, bias=None)
    a = np.concatenate([x[:8], np.sqrt(l2) * np.eye(12)], axis=0)
    b = np.concatenate([2.0 * np.eye(5)[y[:8]] - 1.0, np.zeros((12, 5))], axis=0)
    np.testing.assert_allclose(few["weights"], np.linalg.lstsq(a, b, rcond=None)[0], rtol=1e-8, atol=1e-10)
    # Accuracy is argmax agreement on the test set.
    scores = np.concatenate([(x - x.mean(0)) / (x.std(0) + 1e-5), np.full((40, 1), 100.0)], 1) @ want
    acc = training.fewshot_linear_eval(x, y, x, y, l2_reg=l2)
    assert acc == pytest.approx(np.mean(scores.argmax(1) == y))


def test_fewshot_separable_clusters(rng):
    centres = rng.normal(size=(4, 16)) * 4
    y_train = np.repeat(np.arange(4), 5)
    y_test = np.repeat(np.arange(4), 25)
    x_train = centres[y_train] + rng.normal(size=(20, 16))
    x_test = centres[y_test] + rng.normal(size=(100, 16))
    assert training.fewshot_linear_eval(x_train, y_train, x_test, y_test, l2_reg=1.0) >= 0.97
    idx = training.sample_shots(y_test, 3, seed=1)
    assert np.bincount(y_test[idx]).tolist() == [3, 3, 3, 3]
