"""keras_vit.training: schedules, few-shot solve, optimizers (accumulation, EMA), fine-tuning set-up."""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from tests.conftest import TINY, randomize

# === Schedules ===


def _original_schedule(t, base, total, warmup, decay, end):
    """The original create_learning_rate_schedule, written out independently: the rate of update
    t, counted from 0 (optax's schedule count)."""
    progress = np.clip((t - warmup) / (total - warmup), 0.0, 1.0)
    if decay == "cosine":
        lr = base * 0.5 * (1 + np.cos(np.pi * progress))
    else:
        lr = end + (base - end) * (1 - progress)
    return lr * min(1.0, t / warmup) if warmup else lr


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
        want = _original_schedule(step, kwargs["base_learning_rate"], total, warmup, decay, end)
        assert got == pytest.approx(want, rel=1e-5, abs=1e-9), (step, got, want)
        # The plain-Python form of the same formula.
        plain = training.warmup_decay_value(step, kwargs["base_learning_rate"], total, warmup, decay, end)
        assert plain == pytest.approx(want, rel=1e-12, abs=1e-15), (step, plain, want)
    # Hand-picked points: the first update of a warm-up has rate 0, update `warmup` the peak,
    # cosine half-way = base / 2.
    peak = float(keras.ops.convert_to_numpy(schedule(warmup)))
    assert peak == pytest.approx(kwargs["base_learning_rate"], rel=1e-6)
    if warmup:
        assert float(keras.ops.convert_to_numpy(schedule(0))) == 0.0
    if decay == "cosine" and warmup:
        mid = warmup + (total - warmup) // 2
        assert float(schedule(mid)) == pytest.approx(kwargs["base_learning_rate"] / 2, rel=1e-5)


@pytest.mark.parametrize("accumulation", [None, 2])
def test_update_t_uses_the_original_rate_for_t(accumulation):
    """Through the optimizer, as fit drives it: the rate in force at update t (from 0) is the
    original's rate for t: 0, 0.015, 0.03, 0.0256, 0.015, 0.0044 for base 0.03, 2 warm-up
    updates, 6 updates, cosine. Under accumulation every micro-batch of update t sees it too."""
    variable = keras.Variable(np.ones(3, "float32"))
    opt = training.finetune_optimizer(0.03, total_steps=6, warmup_steps=2, gradient_accumulation_steps=accumulation)
    rates = []
    for _ in range(6 * (accumulation or 1)):
        rates.append(float(keras.ops.convert_to_numpy(opt.learning_rate)))
        opt.apply([keras.ops.zeros((3,))], [variable])
    want = [_original_schedule(t, 0.03, 6, 2, "cosine", 0.0) for t in range(6)]
    np.testing.assert_allclose(rates, np.repeat(want, accumulation or 1), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(want, [0.0, 0.015, 0.03, 0.025607, 0.015, 0.004393], atol=1e-6)
    assert int(opt.iterations) == 6


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
    assert (ft.momentum, ft.global_clipnorm, ft.weight_decay, ft.momentum_dtype) == (0.9, 1.0, None, None)
    pt = training.pretrain_optimizer(1e-3, total_steps=100, warmup_steps=10)
    assert (pt.beta_1, pt.beta_2, pt.weight_decay, pt.global_clipnorm, pt.epsilon) == (0.9, 0.999, 0.1, 1.0, 1e-8)
    half = training.finetune_optimizer(0.01, total_steps=100, warmup_steps=10, momentum_dtype="bfloat16")
    again = keras.optimizers.deserialize(keras.optimizers.serialize(half))
    assert again.momentum_dtype == "bfloat16"
    with pytest.raises(ValueError, match="momentum_dtype"):
        training.finetune_optimizer(0.01, total_steps=100, warmup_steps=10, momentum_dtype="int8")
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


# === Optimizer details ===


def test_adamw_decays_kernels_only():
    model = randomize(keras_vit.VisionTransformer(**TINY, representation_size=12))
    opt = training.pretrain_optimizer(0.5, total_steps=10, warmup_steps=0, weight_decay=0.1)
    decays = {v.path for v in model.trainable_variables if opt._use_weight_decay(v)}
    kernels = {v.path for v in model.trainable_variables if v.path.endswith("kernel")}
    assert decays == kernels and len(kernels) >= 8
    # Numerically, on a few of them: zero gradients make Adam's step 0, so only the decoupled
    # decay moves the weights, w <- w (1 - lr * wd), for kernels only.
    names = ("head/kernel", "head/bias", "pos_embedding", "cls", "LayerNorm_0/gamma", "query_kernel")
    chosen = [v for v in model.trainable_variables if v.path.endswith(names)]
    assert len(chosen) >= 6
    opt = training.pretrain_optimizer(0.5, total_steps=10, warmup_steps=0, weight_decay=0.1)
    before = [np.array(v.numpy()) for v in chosen]
    opt.apply([keras.ops.zeros(v.shape) for v in chosen], chosen)
    lr = _original_schedule(0, 0.5, 10, 0, "linear", 1e-5)  # the rate of the first update
    for v, b in zip(chosen, before):
        factor = (1 - lr * 0.1) if v.path.endswith("kernel") else 1.0
        np.testing.assert_allclose(v.numpy(), b * factor, rtol=1e-6, err_msg=v.path)
    everything = training.pretrain_optimizer(0.5, total_steps=10, warmup_steps=0, weight_decay_pattern=None)
    assert all(everything._use_weight_decay(v) for v in model.trainable_variables)


def test_label_smoothing_loss_matches_formula():
    logits = np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]], "float32")
    labels = np.array([0, 2])
    loss = training.ClassificationCrossentropy(label_smoothing=0.1, from_logits=True, reduction=None)
    got = keras.ops.convert_to_numpy(loss(labels, logits))
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    target = np.eye(3)[labels] * 0.9 + 0.1 / 3
    np.testing.assert_allclose(got, -(target * logp).sum(1), rtol=1e-5)
    onehot = keras.ops.convert_to_numpy(loss(np.eye(3, dtype="float32")[labels], logits))
    np.testing.assert_allclose(onehot, got, rtol=1e-6)
    model = keras_vit.VisionTransformer(**TINY, classifier_activation=None)
    assert training.classification_loss(model).from_logits
    assert not training.classification_loss(keras_vit.VisionTransformer(**TINY)).from_logits


# === Fine-tuning set-up ===


def test_for_finetuning_copies_weights_resizes_and_resets_head():
    from scipy import ndimage

    base = randomize(keras_vit.VisionTransformer(**TINY, representation_size=12))
    ft = training.for_finetuning(base, image_size=48, classes=4)
    assert ft.grid_size == (6, 6) and ft.output_shape == (None, 4)
    assert ft.representation_size is None and ft.dropout_rate == 0.0
    src, dst = keras_vit.get_weight_tree(base), keras_vit.get_weight_tree(ft)
    assert not any(k.startswith("pre_logits/") for k in dst)
    assert np.all(dst["head/kernel"] == 0) and np.all(dst["head/bias"] == 0)
    for key, value in dst.items():
        if key.startswith("head/") or key.endswith("pos_embedding"):
            continue
        np.testing.assert_array_equal(value, src[key], err_msg=key)
    # Position embedding: class token kept, grid resized like scipy.ndimage.zoom(order=1).
    pe = src["Transformer/posembed_input/pos_embedding"][0]
    grid = pe[1:].reshape(4, 4, -1)
    want = ndimage.zoom(grid, (6 / 4, 6 / 4, 1), order=1).reshape(36, -1)
    got = dst["Transformer/posembed_input/pos_embedding"][0]
    np.testing.assert_array_equal(got[0], pe[0])
    np.testing.assert_allclose(got[1:], want, rtol=1e-5, atol=1e-6)
    keep = training.for_finetuning(base, classes=3, keep_representation=True, classifier_activation=None)
    np.testing.assert_array_equal(keras_vit.get_weight_tree(keep)["pre_logits/kernel"], src["pre_logits/kernel"])
    assert keep.classifier_activation == "linear"
    with pytest.raises(TypeError, match="needs a keras_vit model or a weights source, got Sequential"):
        training.for_finetuning(keras.Sequential([keras.layers.Dense(2)]), classes=2)


def _smooth_position_grid(model):
    """Set the patch part of the position embedding to a smooth function of the position."""
    var = model.get_layer("posembed_input").pos_embedding
    rows, cols = model.grid_size
    hidden = var.shape[-1]
    u, v = np.meshgrid(np.linspace(0, 1, rows), np.linspace(0, 1, cols), indexing="ij")
    freq = np.random.default_rng(3).uniform(0.2, 1.0, size=(2, hidden))
    phase = np.random.default_rng(4).uniform(0, np.pi, size=hidden)
    grid = np.sin(u[..., None] * freq[0] * np.pi + v[..., None] * freq[1] * np.pi + phase)
    value = var.numpy().copy()
    value[0, model.num_prefix_tokens :] = grid.reshape(rows * cols, hidden)
    var.assign(value)


def test_resolution_change_keeps_features_close_for_smooth_positions(rng):
    base = randomize(keras_vit.VisionTransformer(**{**TINY, "classifier": "gap"}), scale=0.3)
    _smooth_position_grid(base)
    features_32 = keras_vit.VisionTransformer(**{**TINY, "classifier": "gap", "include_top": False, "pooling": "gap"})
    keras_vit.set_weight_tree(features_32, keras_vit.get_weight_tree(base), skip=("head/",))
    big = training.for_finetuning(base, image_size=64, classes=2)
    features_64 = keras_vit.VisionTransformer(
        **{**TINY, "image_size": 64, "classifier": "gap", "include_top": False, "pooling": "gap"}
    )
    keras_vit.set_weight_tree(features_64, keras_vit.get_weight_tree(big), skip=("head/",))
    # A 4x4 colour image upsampled (nearest) to 32 and 64 pixels: every 8-pixel patch is flat.
    small = rng.uniform(-1, 1, size=(3, 4, 4, 3)).astype("float32")
    img32, img64 = (np.repeat(np.repeat(small, k, 1), k, 2) for k in (8, 16))
    f32 = np.asarray(features_32.predict(img32, verbose=0))
    f64 = np.asarray(features_64.predict(img64, verbose=0))
    rel = np.linalg.norm(f64 - f32) / np.linalg.norm(f32)
    # Control: the resized grid flipped upside down (the right function, wrong positions).
    tree = keras_vit.get_weight_tree(big)
    pe = tree["Transformer/posembed_input/pos_embedding"].copy()
    pe[0] = pe[0].reshape(8, 8, -1)[::-1].reshape(64, -1)
    tree["Transformer/posembed_input/pos_embedding"] = pe
    keras_vit.set_weight_tree(features_64, tree, skip=("head/",))
    control = np.linalg.norm(np.asarray(features_64.predict(img64, verbose=0)) - f32) / np.linalg.norm(f32)
    print(f"relative feature change 32->64 px: {rel:.4f} (flipped-position control {control:.4f})")
    assert rel < 0.05, rel
    assert rel < control / 2, (rel, control)
