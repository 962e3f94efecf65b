"""The fine-tuning tools of today's ViT checkpoints, through `model.fit` on every backend:
layer-wise learning-rate decay, patch dropout and DeiT's hard distillation.

Layer-wise decay: a tiny ViT trained 6 updates by `fit` with `finetune_optimizer` /
`pretrain_optimizer(layer_decay=...)` against the original's update written with optax (the
reference of tests/test_recipes_optax.py: a pure-JAX forward and loss), each parameter group
through `optax.multi_transform` with its rate scaled by decay ** (groups - 1 - group), the groups
written here from timm's rule (stem, block 0, block 1 with the final norm, head).
"""

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from tests.test_recipes_optax import (
    BASE_LR,
    BATCH,
    CONFIG,
    FROZEN_BY_SOFTMAX,
    UPDATES,
    WARMUP,
    _data,
    _start,
    accumulate_gradient,
    original_loss,
    original_schedule,
    worst,
)

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")

DECAY = 0.5


# === Layer-wise learning-rate decay against optax ===


def group_of(key):
    """timm's layer groups of the tiny 2-block ViT: stem 0, block i -> i + 1, final norm with the
    last block, head 3."""
    if key.startswith(("embedding/", "cls", "Transformer/posembed_input/")):
        return 0
    if key.startswith("Transformer/encoderblock_"):
        return 1 + int(key.split("/")[1].rsplit("_", 1)[1])
    if key.startswith("Transformer/encoder_norm/"):
        return 2
    assert key.startswith("head/"), key
    return 3


def scaled_transform(tree, make, decay=DECAY):
    """optax.multi_transform: group g's transformation made with rate scale decay ** (3 - g)."""
    labels = {k: f"group{group_of(k)}" for k in tree}
    return optax.multi_transform({f"group{g}": make(decay ** (3 - g)) for g in range(4)}, labels)


_COMPILED = {}


def run_reference(tree, images, labels, tx, accum_steps=1, ema_momentum=None):
    """UPDATES updates of the original update step; with `ema_momentum`, Keras' averages (the
    first update's weights, then m * average + (1 - m) * weights) instead of the weights."""
    if "loss_and_grad" not in _COMPILED:
        _COMPILED["loss_and_grad"] = jax.jit(jax.value_and_grad(original_loss))
    loss_and_grad = _COMPILED["loss_and_grad"]

    @jax.jit
    def apply(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    params = {k: jnp.asarray(v, jnp.float32) for k, v in tree.items()}
    state, average = tx.init(params), None
    for step in range(UPDATES):
        sl = slice(step * BATCH, (step + 1) * BATCH)
        _, grads = accumulate_gradient(loss_and_grad, params, jnp.asarray(images[sl]), jnp.asarray(labels[sl]),
                                       accum_steps)
        params, state = apply(grads, state, params)
        if ema_momentum is not None:
            m = 0.0 if average is None else ema_momentum
            average = params if average is None else jax.tree.map(lambda a, p: m * a + (1 - m) * p, average, params)
    out = params if ema_momentum is None else average
    return {k: np.asarray(v, np.float32) for k, v in out.items()}


def run_keras_vit(tree, images, labels, make_optimizer, accum_steps=1):
    model = keras_vit.VisionTransformer(**CONFIG, classifier_activation=None)
    keras_vit.set_weight_tree(model, tree)
    optimizer = make_optimizer(model)
    model.compile(optimizer=optimizer, loss=training.classification_loss(model))
    model.fit(images, labels, batch_size=BATCH // accum_steps, epochs=1, shuffle=False, verbose=0)
    assert int(optimizer.iterations) == UPDATES
    return {k: np.asarray(v, np.float32) for k, v in keras_vit.get_weight_tree(model).items()}


CLIP = optax.clip_by_global_norm(1.0)
SGD_SCHEDULE = original_schedule(UPDATES, BASE_LR, "cosine", WARMUP)
ADAM_BASE = 0.01
ADAM_SCHEDULE = original_schedule(UPDATES, ADAM_BASE, "linear", WARMUP, linear_end=1e-5)


def _sgd_case():
    """The SGD run's inputs and its optax reference: clip, then each group's SGD-momentum trace at
    its scaled cosine rate; 2 micro-batches per update; the EMA of the weights (momentum 0.5)."""
    images, labels = _data(seed=6)
    tree = _start()
    tx = optax.chain(CLIP, scaled_transform(tree, lambda s: optax.sgd(lambda c: s * SGD_SCHEDULE(c), momentum=0.9)))
    return images, labels, tree, run_reference(tree, images, labels, tx, accum_steps=2, ema_momentum=0.5)


def _kernels(tree):
    return {k: k.endswith("/kernel") for k in tree}


def _adamw_case():
    """The AdamW run's inputs and its optax reference: each group's adamw at its scaled rate, the
    decoupled decay (kernels only) scaled with it, as a PyTorch parameter group's lr_scale
    scales both."""
    images, labels = _data(seed=7)
    tree = _start()

    def adamw(s):
        return optax.adamw(lambda c: s * ADAM_SCHEDULE(c), b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1,
                           mask=_kernels(tree))

    return images, labels, tree, run_reference(tree, images, labels, optax.chain(CLIP, scaled_transform(tree, adamw)))


def _without_frozen(tree):
    # The key biases' gradient is 0 up to rounding, which Adam scales to full steps (see
    # tests/test_recipes_optax.py): left out of the Adam comparisons.
    return {k: v for k, v in tree.items() if not k.endswith(FROZEN_BY_SOFTMAX)}


def test_layer_decay_sgd_with_accumulation_and_ema_equals_optax():
    """finetune_optimizer(layer_decay=0.5), 2 micro-batches per update, EMA 0.5 (what fit leaves
    in the model), against optax's multi_transform."""
    images, labels, tree, want = _sgd_case()
    got = run_keras_vit(tree, images, labels, lambda model: training.finetune_optimizer(
        BASE_LR, total_steps=UPDATES, warmup_steps=WARMUP, layer_decay=DECAY, model=model,
        gradient_accumulation_steps=2, use_ema=True, ema_momentum=0.5), accum_steps=2)
    error, key = worst(got, want)
    assert error <= 1e-5, (key, error)


def test_layer_decay_adamw_equals_optax():
    """pretrain_optimizer(layer_decay=0.5) against optax's multi_transform of scaled adamw."""
    images, labels, tree, want = _adamw_case()
    got = run_keras_vit(tree, images, labels, lambda model: training.pretrain_optimizer(
        ADAM_BASE, total_steps=UPDATES, warmup_steps=WARMUP, layer_decay=DECAY, model=model))
    error, key = worst(_without_frozen(got), _without_frozen(want))
    assert error <= 1e-5, (key, error)


# Only references here (JAX and optax whatever the backend): once, in the JAX pass.
@pytest.mark.backend_independent
def test_layer_decay_references_tell_apart_one_rate_and_unscaled_decay():
    """The comparisons above see the decay: one rate for all ends far from the SGD reference, and
    AdamW's weight decay at the full rate for every group (rate_t * 0.1 * w) from the AdamW one."""
    images, labels, tree, want = _sgd_case()
    plain = run_reference(tree, images, labels, optax.chain(CLIP, optax.sgd(SGD_SCHEDULE, momentum=0.9)), 2, 0.5)
    assert worst(plain, want)[0] > 100 * 1e-5
    images, labels, tree, want = _adamw_case()
    unscaled_decay = optax.chain(CLIP, scaled_transform(tree, lambda s: optax.chain(
        optax.scale_by_adam(b1=0.9, b2=0.999, eps=1e-8), optax.add_decayed_weights(0.1 / s, mask=_kernels(tree)),
        optax.scale_by_learning_rate(lambda c: s * ADAM_SCHEDULE(c)))))
    other = run_reference(tree, images, labels, unscaled_decay)
    assert worst(_without_frozen(other), _without_frozen(want))[0] > 100 * 1e-5


def test_learning_rate_scales_round_trip_and_errors():
    model = keras_vit.VisionTransformer(**CONFIG)
    optimizer = training.finetune_optimizer(0.01, total_steps=10, warmup_steps=2, layer_decay=0.5, model=model)
    config = optimizer.get_config()
    assert config["learning_rate_scales"]["embedding/kernel"] == 0.125
    again = training.SGD.from_config(config)
    assert again.learning_rate_scales == optimizer.learning_rate_scales
    with pytest.raises(ValueError, match="layer_decay needs the model"):
        training.finetune_optimizer(0.01, total_steps=10, warmup_steps=2, layer_decay=0.75)
    with pytest.raises(ValueError, match="learning_rate_scales names none of the variables"):
        other = training.SGD(0.1, learning_rate_scales={"elsewhere/kernel": 0.5})
        other.build(model.trainable_variables)
    with pytest.raises(ValueError, match=r"learning_rate_scales\['embedding/kernel'\] must be a finite number"):
        training.AdamW(learning_rate_scales={"embedding/kernel": -1})


# === Patch dropout ===

torch = pytest.importorskip("torch")


def timm_kept(patches, rate, prefix):
    """The token count after timm's own patch_dropout_forward in training."""
    from timm.layers.patch_dropout import patch_dropout_forward

    out, _ = patch_dropout_forward(torch.zeros(2, prefix + patches, 4), rate, prefix, ordered=False, training=True)
    return out.shape[1]


@pytest.mark.parametrize("patches,rate,prefix", [
    (196, 0.5, 1), (196, 0.25, 1), (49, 0.3, 2), (16, 0.75, 5), (3, 0.9, 1), (64, 0.1, 0), (7, 1 / 3, 1),
])
def test_patch_dropout_keeps_prefix_tokens_and_timms_count(patches, rate, prefix):
    from keras_vit.layers import PatchDropout

    # token j of image b holds the value 1000 b + j in every channel: where it came from is readable
    tokens = (1000 * np.arange(3)[:, None, None] + np.arange(prefix + patches)[None, :, None]
              + np.zeros((1, 1, 4))).astype("float32")
    layer = PatchDropout(rate, num_prefix_tokens=prefix, seed=1)
    out = keras.ops.convert_to_numpy(layer(tokens, training=True))
    assert out.shape == (3, timm_kept(patches, rate, prefix), 4)
    kept_sets = []
    for b in range(3):
        ids = out[b, :, 0] - 1000 * b
        assert (out[b] == out[b, :, :1]).all()  # whole tokens moved
        np.testing.assert_array_equal(ids[:prefix], np.arange(prefix))  # the prefix kept, in front
        patch_ids = ids[prefix:]
        assert len(set(patch_ids)) == len(patch_ids) and all(prefix <= i < prefix + patches for i in patch_ids)
        kept_sets.append(frozenset(patch_ids))
    if 1 < out.shape[1] - prefix < patches:
        assert len(set(kept_sets)) > 1  # each image draws its own subset
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(tokens)), tokens)  # inference: identity
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(layer(tokens, training=False)), tokens)


TINY_DEIT = dict(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, classes=5,
                 distillation_token=True, register_tokens=2, classifier_activation=None)


def test_patch_dropout_in_the_model():
    """A ViT with patch_drop_rate: inference equals the model without it (same weights), training
    drops patches after the position embedding (the outputs change), fit runs, and the rate is
    in the config."""
    from tests.conftest import randomize

    model = randomize(keras_vit.VisionTransformer(**TINY_DEIT, patch_drop_rate=0.5), seed=2)
    plain = keras_vit.VisionTransformer(**TINY_DEIT)
    keras_vit.set_weight_tree(plain, keras_vit.get_weight_tree(model))
    images = np.random.default_rng(0).uniform(-1, 1, (4, 16, 16, 3)).astype("float32")
    want = keras.ops.convert_to_numpy(plain(images))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(model(images)), want)
    np.testing.assert_allclose(model.predict(images, verbose=0), want, rtol=1e-6, atol=1e-6)
    dropout = model.get_layer("patch_dropout")
    assert dropout.num_prefix_tokens == 4 and dropout.rate == 0.5  # class, distillation, 2 registers
    # half the patches gone: the logits move (by about 1e-3 at this size), far beyond rounding (1e-7)
    assert np.abs(keras.ops.convert_to_numpy(model(images, training=True)) - want).max() > 1e-5
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=training.classification_loss(model))
    history = model.fit(images, np.arange(4), epochs=2, verbose=0)
    assert np.isfinite(history.history["loss"]).all()
    config = model.get_config()
    assert config["patch_drop_rate"] == 0.5
    again = keras_vit.VisionTransformer.from_config(config)
    assert again.get_layer("patch_dropout").rate == 0.5
    tuned = training.for_finetuning(plain, classes=3, patch_drop_rate=0.25)
    assert tuned.get_layer("patch_dropout").rate == 0.25 and tuned.config.patch_drop_rate == 0.25
    assert not keras_vit.get_weight_tree(tuned)["head_dist/kernel"].any()  # both heads fresh for 3 classes
    with pytest.raises(ValueError, match="patch_drop_rate=0.5 drops patch tokens.*relative"):
        keras_vit.VisionTransformer(**CONFIG, position_embedding="relative", patch_drop_rate=0.5)
    with pytest.raises(ValueError, match=r"patch_drop_rate must be in \[0, 1\)"):
        keras_vit.VisionTransformer(**CONFIG, patch_drop_rate=1.0)


# === DeiT hard distillation ===

DEIT = dict(image_size=16, patch_size=4, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=32, classes=5,
            distillation_token=True, classifier_activation=None)


def log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def reference_loss(logits, logits_dist, labels, teacher_scores, smoothing):
    """DeiT's hard distillation in NumPy: 0.5 CE(class head, smoothed y) + 0.5 CE(distillation
    head, argmax teacher), batch means."""
    classes = logits.shape[-1]
    target = np.eye(classes)[labels] * (1 - smoothing) + smoothing / classes
    hard = np.eye(classes)[teacher_scores.argmax(-1)]
    return float(0.5 * -(target * log_softmax(logits)).sum(-1).mean() + 0.5 * -(hard * log_softmax(logits_dist)).sum(-1).mean())


def _deit_case(seed):
    from tests.conftest import randomize

    r = np.random.default_rng(seed)
    student = randomize(keras_vit.VisionTransformer(**DEIT), seed=seed)
    teacher = randomize(keras_vit.VisionTransformer(**{**DEIT, "distillation_token": False, "num_layers": 2}), seed=9)
    images = r.uniform(-1, 1, (8, 16, 16, 3)).astype("float32")
    labels = r.integers(0, 5, 8)
    return student, teacher, images, labels


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="the second trace is TensorFlow's (variables created in a tf.function)")
def test_hard_distillation_traces_its_train_step_once(monkeypatch):
    # Adam's slots exist before the first trace (keras_vit.backend_workarounds.TraceTrainStepOnce);
    # Keras alone traces this step twice.
    from keras_vit.training import HardDistillation
    from tests.conftest import count_train_step_traces

    traces = count_train_step_traces(monkeypatch, HardDistillation)
    student, teacher, images, labels = _deit_case(seed=4)
    trainer = HardDistillation(student, teacher)
    trainer.compile(optimizer="adam", metrics=["accuracy"])
    history = trainer.fit(images, labels, batch_size=8, epochs=2, verbose=0)
    assert len(traces) == 1 and np.isfinite(history.history["loss"]).all()


@pytest.mark.parametrize("mode", ["teacher", "stored_logits"])
def test_hard_distillation_fit_equals_deit_loss_and_gradient(mode):
    """Three fit steps of plain SGD: each step's loss equals the NumPy reference at the weights
    before it, and the first step moves the two head kernels by -rate * 0.5 * features^T
    (softmax - target) / batch: the class head toward the labels, the distillation head toward
    the teacher's argmax."""
    from keras_vit.training import HardDistillation

    student, teacher, images, labels = _deit_case(seed=4)
    teacher_scores = np.asarray(keras.ops.convert_to_numpy(teacher(images)), np.float64)
    assert (teacher_scores.argmax(-1) != labels).sum() >= 3  # the two targets differ
    trainer = HardDistillation(student, teacher if mode == "teacher" else None, label_smoothing=0.1)
    rate = 0.5
    trainer.compile(optimizer=keras.optimizers.SGD(rate))
    targets = labels if mode == "teacher" else (labels, teacher_scores.astype("float32"))
    features = keras.Model(student.input, [student.get_layer("pool_head").output,
                                            student.get_layer("pool_head_dist").output])
    both = keras_vit.VisionTransformer(**{**DEIT, "distillation_output": "both"})
    for step in range(3):
        keras_vit.set_weight_tree(both, keras_vit.get_weight_tree(student))
        logits, logits_dist = (np.asarray(keras.ops.convert_to_numpy(t), np.float64) for t in both(images))
        want = reference_loss(logits, logits_dist, labels, teacher_scores, 0.1)
        pooled, pooled_dist = (np.asarray(keras.ops.convert_to_numpy(t), np.float64) for t in features(images))
        before = keras_vit.get_weight_tree(student)
        history = trainer.fit(images, targets, batch_size=8, epochs=1, shuffle=False, verbose=0)
        np.testing.assert_allclose(history.history["loss"][0], want, rtol=2e-5)
        if step == 0:
            after = keras_vit.get_weight_tree(student)
            smooth = np.eye(5)[labels] * 0.9 + 0.02
            hard = np.eye(5)[teacher_scores.argmax(-1)]
            for key, x, z, target in (("head/kernel", pooled, logits, smooth),
                                      ("head_dist/kernel", pooled_dist, logits_dist, hard)):
                grad = 0.5 * x.T @ (np.exp(log_softmax(z)) - target) / len(x)
                np.testing.assert_allclose(after[key] - before[key], -rate * grad, rtol=1e-4, atol=1e-6)
    assert len(trainer.trainable_variables) == len(student.trainable_variables)
    assert not teacher.trainable or mode == "stored_logits"


def test_hard_distillation_evaluate_metrics_and_errors():
    """evaluate's loss is the same reference; compiled metrics see the mean of the two heads (the
    distilled model's prediction); wrong targets and students are refused."""
    from keras_vit.training import HardDistillation

    student, teacher, images, labels = _deit_case(seed=5)
    teacher_scores = np.asarray(keras.ops.convert_to_numpy(teacher(images)), np.float64)
    trainer = HardDistillation(student, teacher)
    trainer.compile(optimizer="sgd", metrics=["accuracy"])
    result = trainer.evaluate(images, labels, verbose=0, return_dict=True)
    both = keras_vit.VisionTransformer(**{**DEIT, "distillation_output": "both"})
    keras_vit.set_weight_tree(both, keras_vit.get_weight_tree(student))
    logits, logits_dist = (np.asarray(keras.ops.convert_to_numpy(t), np.float64) for t in both(images))
    np.testing.assert_allclose(result["loss"], reference_loss(logits, logits_dist, labels, teacher_scores, 0.0),
                               rtol=2e-5)
    mean = keras.ops.convert_to_numpy(student(images))  # distillation_output="mean": timm's inference output
    assert result["accuracy"] == pytest.approx(float((mean.argmax(-1) == labels).mean()))
    # (each error on a fresh student: JAX's evaluate leaves the variables it was given away when
    # a step raises)
    other = HardDistillation(keras_vit.VisionTransformer(**DEIT), teacher)
    other.compile(optimizer="sgd")
    with pytest.raises(ValueError, match="targets are the labels alone"):
        other.evaluate(images, (labels, teacher_scores), verbose=0)
    alone = HardDistillation(keras_vit.VisionTransformer(**DEIT))
    alone.compile(optimizer="sgd")
    with pytest.raises(ValueError, match=r"fit\(images, \(labels, teacher_logits\)\)"):
        alone.evaluate(images, labels, verbose=0)
    with pytest.raises(ValueError, match="distillation_token=True"):
        HardDistillation(keras_vit.VisionTransformer(**{**DEIT, "distillation_token": False}))
