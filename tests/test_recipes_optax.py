"""The training recipes against the original code's arithmetic, update for update.

A tiny ViT is trained for 6 updates (through warm-up and decay) by `model.fit` with keras_vit's
`finetune_optimizer` / `pretrain_optimizer`, and by an independent reference written here: a
pure-JAX forward of the same ViT (the original modules' formulas, as tests/reference_numpy.py
writes them), `jax.value_and_grad` of the original loss (batch mean of -sum(onehot *
log_softmax)), the original `accumulate_gradient` arithmetic (equal micro-batches in order,
losses and gradients averaged) and optax itself:
`optax.chain(clip_by_global_norm(1.0), sgd(schedule, momentum=0.9, accumulator_dtype=...))` for
fine-tuning (vit_jax/train.py) and `adamw` with a kernel mask for pre-training, the schedule
written from `create_learning_rate_schedule`'s formulas (rate of update t, from t = 0). Every
parameter must agree within a fraction of its tensor's scale (max |value|). The reference runs on
JAX arrays in any backend's process.
"""

import math

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit import training
from tests.conftest import randomize

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
optax = pytest.importorskip("optax")

CONFIG = dict(image_size=8, patch_size=4, hidden_size=32, num_layers=2, num_heads=2, mlp_dim=64, classes=4)
UPDATES, BATCH, BASE_LR, WARMUP = 6, 8, 0.03, 2


# === The reference: the original formulas in JAX, optax for the update ===


def original_schedule(total_steps, base, decay_type, warmup_steps, linear_end=1e-5):
    """create_learning_rate_schedule's step_fn: the rate of update `step`, counted from 0."""

    def step_fn(step):
        progress = jnp.clip((step - warmup_steps) / float(total_steps - warmup_steps), 0.0, 1.0)
        if decay_type == "linear":
            lr = linear_end + (base - linear_end) * (1.0 - progress)
        else:
            lr = base * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        if warmup_steps:
            lr = lr * jnp.minimum(1.0, step / warmup_steps)
        return jnp.asarray(lr, jnp.float32)

    return step_fn


def _layer_norm(x, scale, bias):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-6) * scale + bias


def vit_logits(t, images):
    """The original ViT (token classifier, learned position embedding) on the canonical tree."""
    b, h, w, c = images.shape
    p = CONFIG["patch_size"]
    patches = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, p * p * c)
    kernel = t["embedding/kernel"]
    x = patches @ kernel.reshape(-1, kernel.shape[-1]) + t["embedding/bias"]
    x = jnp.concatenate([jnp.broadcast_to(t["cls"], (b, 1, x.shape[-1])), x], axis=1)
    x = x + t["Transformer/posembed_input/pos_embedding"]
    for i in range(CONFIG["num_layers"]):
        pre = f"Transformer/encoderblock_{i}/"
        a = pre + "MultiHeadDotProductAttention_1/"
        y = _layer_norm(x, t[pre + "LayerNorm_0/scale"], t[pre + "LayerNorm_0/bias"])
        q, k, v = (jnp.einsum("btd,dhk->bhtk", y, t[a + n + "/kernel"]) + t[a + n + "/bias"][None, :, None, :]
                   for n in ("query", "key", "value"))
        weights = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1]), axis=-1)
        x = x + jnp.einsum("bhtk,hkd->btd", weights @ v, t[a + "out/kernel"]) + t[a + "out/bias"]
        y = _layer_norm(x, t[pre + "LayerNorm_2/scale"], t[pre + "LayerNorm_2/bias"])
        m = pre + "MlpBlock_3/"
        y = jax.nn.gelu(y @ t[m + "Dense_0/kernel"] + t[m + "Dense_0/bias"], approximate=True)
        x = x + y @ t[m + "Dense_1/kernel"] + t[m + "Dense_1/bias"]
    x = _layer_norm(x, t["Transformer/encoder_norm/scale"], t["Transformer/encoder_norm/bias"])
    return x[:, 0] @ t["head/kernel"] + t["head/bias"]


def original_loss(params, images, labels):
    logp = jax.nn.log_softmax(vit_logits(params, images))
    return -jnp.mean(jnp.sum(logp * labels, axis=1))


def accumulate_gradient(loss_and_grad_fn, params, images, labels, accum_steps):
    """The original's arithmetic: equal micro-batches in order, losses and gradients summed, then
    divided by accum_steps."""
    if accum_steps <= 1:
        return loss_and_grad_fn(params, images, labels)
    size = images.shape[0] // accum_steps
    loss, grads = loss_and_grad_fn(params, images[:size], labels[:size])
    for i in range(1, accum_steps):
        li, gi = loss_and_grad_fn(params, images[i * size:(i + 1) * size], labels[i * size:(i + 1) * size])
        loss, grads = loss + li, jax.tree.map(lambda x, y: x + y, grads, gi)
    return jax.tree.map(lambda x: x / accum_steps, (loss, grads))


_COMPILED = {}


def run_reference(tree, images, labels, tx, accum_steps=1):
    """UPDATES updates of the original's update_fn (one device): returns the final parameters and
    records the gradients' global norms in `run_reference.norms`."""
    if not _COMPILED:
        _COMPILED["loss_and_grad"] = jax.jit(jax.value_and_grad(original_loss))
    loss_and_grad = _COMPILED["loss_and_grad"]

    @jax.jit
    def apply(grads, state, params):  # tx.update + apply_updates, as update_fn does them
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state, optax.global_norm(grads)

    params = {k: jnp.asarray(v, jnp.float32) for k, v in tree.items()}
    state = tx.init(params)
    norms = []
    for step in range(UPDATES):
        sl = slice(step * BATCH, (step + 1) * BATCH)
        _, grads = accumulate_gradient(loss_and_grad, params, jnp.asarray(images[sl]), jnp.asarray(labels[sl]),
                                       accum_steps)
        params, state, norm = apply(grads, state, params)
        norms.append(float(norm))
    run_reference.norms = norms
    return {k: np.asarray(v, np.float32) for k, v in params.items()}


# === keras_vit ===


def _data(seed=0):
    r = np.random.default_rng(seed)
    images = r.uniform(-1, 1, size=(UPDATES * BATCH, 8, 8, 3)).astype("float32")
    labels = np.eye(CONFIG["classes"], dtype="float32")[r.integers(0, CONFIG["classes"], UPDATES * BATCH)]
    return images, labels


def _start():
    """The start weights (canonical tree), all random: with the zero head of a real fine-tuning
    start the backbone would hardly move in 6 updates, and the test would not see its updates.
    The head is 4x the random scale, so that the gradients' global norm is above the clip (1.0)
    on some updates and below it on others; so are the query and key kernels: with near-uniform
    attention their gradients are tiny differences of large terms, whose rounding (which differs
    between backends' kernels) Adam would scale up to full-size steps."""
    model = randomize(keras_vit.VisionTransformer(**CONFIG, classifier_activation=None), seed=3)
    tree = {k: np.array(v, np.float32) for k, v in keras_vit.get_weight_tree(model).items()}
    for key in tree:
        if key.endswith(("head/kernel", "query/kernel", "key/kernel")):
            tree[key] *= 4.0
    return tree


# The key bias adds the same term to every logit of a query: softmax ignores it, its gradient is 0.
FROZEN_BY_SOFTMAX = ("MultiHeadDotProductAttention_1/key/bias",)
KEY_KERNEL = ("MultiHeadDotProductAttention_1/key/kernel",)


def run_keras_vit(tree, images, labels, optimizer, accum_steps=1):
    model = keras_vit.VisionTransformer(**CONFIG, classifier_activation=None)
    keras_vit.set_weight_tree(model, tree)
    model.compile(optimizer=optimizer, loss=training.classification_loss(model))
    model.fit(images, labels, batch_size=BATCH // accum_steps, epochs=1, shuffle=False, verbose=0)
    assert int(optimizer.iterations) == UPDATES  # updates, not micro-batches
    return {k: np.asarray(v, np.float32) for k, v in keras_vit.get_weight_tree(model).items()}


def worst(got, want):
    """The largest error of any tensor, as a fraction of that tensor's scale (max |value|)."""
    assert sorted(got) == sorted(want)
    errors = {k: float(np.abs(got[k] - want[k]).max() / max(np.abs(want[k]).max(), 1e-12)) for k in want}
    key = max(errors, key=errors.get)
    return errors[key], key


# === Fine-tuning: vit_jax/train.py's optimizer ===


@pytest.mark.parametrize(
    "momentum_dtype,accum_steps,tolerance",
    [(None, 1, 1e-5), (None, 2, 1e-5), ("bfloat16", 1, 1e-5)],
    ids=["float32", "float32-accumulated", "bfloat16-momentum"],
)
def test_finetune_updates_equal_the_original(momentum_dtype, accum_steps, tolerance):
    images, labels = _data()
    tree = _start()
    schedule = original_schedule(UPDATES, BASE_LR, "cosine", WARMUP)
    # The figures: update t's rate, t = 0..5.
    np.testing.assert_allclose([float(schedule(t)) for t in range(UPDATES)],
                               [0.0, 0.015, 0.03, 0.025607, 0.015, 0.004393], atol=1e-6)
    accumulator = None if momentum_dtype is None else jnp.bfloat16
    tx = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(schedule, momentum=0.9, accumulator_dtype=accumulator))
    want = run_reference(tree, images, labels, tx, accum_steps)

    optimizer = training.finetune_optimizer(
        BASE_LR, total_steps=UPDATES, warmup_steps=WARMUP, momentum_dtype=momentum_dtype,
        gradient_accumulation_steps=accum_steps if accum_steps > 1 else None,
    )
    got = run_keras_vit(tree, images, labels, optimizer, accum_steps)
    error, key = worst(got, want)
    assert error <= tolerance, (key, error)
    # The run exercised the clip both ways, and the weights moved far more than the tolerance.
    assert min(run_reference.norms) < 1.0 < max(run_reference.norms), run_reference.norms
    moved = [float(np.abs(want[k] - tree[k]).max() / np.abs(want[k]).max()) for k in tree]
    assert np.median(moved) > 1e-4 and max(moved) > 0.1, sorted(moved)
    if momentum_dtype is not None:
        dtypes = {str(v.dtype) for v in optimizer.momentums}
        assert dtypes == {"bfloat16"}, dtypes


def test_bfloat16_momentum_from_a_zero_head_equals_the_original():
    """The original fine-tuning run with `accumulator_dtype=bfloat16`, from a zero head kernel as
    the original starts it: the head's trace starts at zero and the first updates are where the
    trace's rounding shows. Every tensor agrees with the original's compiled (XLA) optax step
    within 1e-5 of its scale on every backend; its float32 run is far from it."""
    images, labels = _data(seed=5)
    tree = _start()
    tree["head/kernel"] = np.zeros_like(tree["head/kernel"])
    schedule = original_schedule(UPDATES, BASE_LR, "cosine", WARMUP)
    clip = optax.clip_by_global_norm(1.0)
    want = run_reference(tree, images, labels,
                         optax.chain(clip, optax.sgd(schedule, momentum=0.9, accumulator_dtype=jnp.bfloat16)))
    optimizer = training.finetune_optimizer(BASE_LR, total_steps=UPDATES, warmup_steps=WARMUP,
                                            momentum_dtype="bfloat16")
    got = run_keras_vit(tree, images, labels, optimizer)
    error, key = worst(got, want)
    assert error <= 1e-5, (key, error)
    assert {str(v.dtype) for v in optimizer.momentums} == {"bfloat16"}
    float32_run = run_reference(tree, images, labels, optax.chain(clip, optax.sgd(schedule, momentum=0.9)))
    assert worst(float32_run, want)[0] > 10 * 1e-5


def test_nesterov_updates_equal_optax():
    """keras_vit's SGD with nesterov=True against optax's `sgd(nesterov=True)`: trace <- g + m trace,
    update g + m trace (both after the clip); plain momentum ends far from it."""
    images, labels = _data(seed=2)
    tree = _start()
    schedule = original_schedule(UPDATES, BASE_LR, "cosine", WARMUP)
    clip = optax.clip_by_global_norm(1.0)
    want = run_reference(tree, images, labels, optax.chain(clip, optax.sgd(schedule, momentum=0.9, nesterov=True)))
    optimizer = training.SGD(training.WarmupCosineDecay(BASE_LR, total_steps=UPDATES, warmup_steps=WARMUP),
                             momentum=0.9, nesterov=True, global_clipnorm=1.0)
    got = run_keras_vit(tree, images, labels, optimizer)
    error, key = worst(got, want)
    assert error <= 1e-5, (key, error)
    plain = run_reference(tree, images, labels, optax.chain(clip, optax.sgd(schedule, momentum=0.9)))
    assert worst(plain, want)[0] > 100 * 1e-5


@pytest.mark.parametrize("nesterov", [False, True], ids=["momentum", "nesterov"])
def test_bfloat16_trace_equals_optax_update_for_update(nesterov):
    """One variable, 8 updates of random gradients: the weights and the stored bfloat16 trace equal
    optax's `sgd(accumulator_dtype=bfloat16)` compiled by `jax.jit`, as the original's update step
    is, to float32 rounding. There the momentum is rounded to bfloat16, the product momentum x
    trace is not (XLA keeps it in float32 before adding the float32 gradient), and the update uses
    the new trace unrounded. The same optax step run op by op, which rounds the product to
    bfloat16, ends far from it, and so does optax's float32 trace (checked below)."""
    r = np.random.default_rng(4)
    grads = r.normal(size=(8, 256)).astype("float32")
    start = r.normal(size=256).astype("float32")

    def optax_run(accumulator_dtype, compiled=True):
        tx = optax.sgd(0.1, momentum=0.9, nesterov=nesterov, accumulator_dtype=accumulator_dtype)

        def step(g, state, params):
            updates, state = tx.update(g, state, params)
            return optax.apply_updates(params, updates), state

        step = jax.jit(step) if compiled else step
        params = jnp.asarray(start)
        state = tx.init(params)
        for g in grads:
            params, state = step(jnp.asarray(g), state, params)
        return np.asarray(params, np.float32), np.asarray(state[0].trace.astype(jnp.float32))

    want, want_trace = optax_run(jnp.bfloat16)
    optimizer = training.SGD(0.1, momentum=0.9, nesterov=nesterov, momentum_dtype="bfloat16")
    variable = keras.Variable(start)
    for g in grads:
        optimizer.apply([keras.ops.convert_to_tensor(g)], [variable])
    got = keras.ops.convert_to_numpy(variable)
    trace = optimizer.momentums[0]
    assert keras.backend.standardize_dtype(trace.dtype) == "bfloat16"
    got_trace = keras.ops.convert_to_numpy(keras.ops.cast(trace, "float32"))
    np.testing.assert_allclose(got_trace, want_trace, rtol=0, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    float32_params, _ = optax_run(None)
    assert np.abs(float32_params - want).max() > 1e-4
    op_by_op, _ = optax_run(jnp.bfloat16, compiled=False)
    assert np.abs(op_by_op - want).max() > 1e-4


# Only the reference runs here (JAX and optax, whatever the backend; the start weights are NumPy
# draws, the same on every backend): once, in the JAX pass.
@pytest.mark.backend_independent
def test_finetune_reference_tells_apart_the_old_schedule_and_momentum():
    """The comparison above fails for a schedule one update ahead or for Keras' momentum form
    (rate inside the velocity): both references differ from optax's by far more than 1e-5."""
    images, labels = _data()
    tree = _start()
    schedule = original_schedule(UPDATES, BASE_LR, "cosine", WARMUP)
    clip = optax.clip_by_global_norm(1.0)
    want = run_reference(tree, images, labels, optax.chain(clip, optax.sgd(schedule, momentum=0.9)))
    ahead = run_reference(tree, images, labels, optax.chain(clip, optax.sgd(lambda t: schedule(t + 1), momentum=0.9)))

    def keras_form(rate):  # v <- 0.9 v - rate_t g; w <- w + v
        def init(params):
            return (jnp.zeros([], jnp.int32), jax.tree.map(jnp.zeros_like, params))

        def update(grads, state, params=None):
            count, velocity = state
            velocity = jax.tree.map(lambda v, g: 0.9 * v - rate(count) * g, velocity, grads)
            return velocity, (count + 1, velocity)

        return optax.GradientTransformation(init, update)

    inside = run_reference(tree, images, labels, optax.chain(clip, keras_form(schedule)))
    assert worst(ahead, want)[0] > 100 * 1e-5
    assert worst(inside, want)[0] > 100 * 1e-5


# === Pre-training: Adam 0.9 / 0.999, decoupled weight decay 0.1 on kernels, linear decay ===


@pytest.mark.parametrize("accum_steps", [1, 2], ids=["plain", "accumulated"])
def test_pretrain_updates_equal_optax_adamw(accum_steps):
    """Under accumulation (2 micro-batches of 4 per update) the bias correction counts applied
    updates, as optax's on the original's accumulated batch of 8 does, not micro-batches."""
    images, labels = _data(seed=1)
    tree = _start()
    base = 0.01
    schedule = original_schedule(UPDATES, base, "linear", WARMUP, linear_end=1e-5)
    kernels = {k: k.endswith("/kernel") for k in tree}
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(schedule, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.1, mask=kernels),
    )
    want = run_reference(tree, images, labels, tx, accum_steps)
    optimizer = training.pretrain_optimizer(base, total_steps=UPDATES, warmup_steps=WARMUP,
                                            gradient_accumulation_steps=accum_steps if accum_steps > 1 else None)
    got = run_keras_vit(tree, images, labels, optimizer, accum_steps)
    # The key biases' gradient is 0 up to rounding (see FROZEN_BY_SOFTMAX); Adam divides that
    # rounding noise by its own size, which makes steps of full size in a direction the noise
    # picks. They are left out, the key kernels get the bound below, and every other tensor must agree.
    error, key = worst(*({k: v for k, v in t.items() if not k.endswith(FROZEN_BY_SOFTMAX + KEY_KERNEL)}
                         for t in (got, want)))
    assert error <= 1e-5, (key, error)
    # The key kernels' gradients come from the same near-zero sums (the keys' gradients sum to 0
    # over the tokens), so Adam magnifies their rounding too, though less: 3e-6 to 1.2e-5 on the
    # three backends with one or two threads (the next tensor: 1.7e-6).
    error, key = worst(*({k: v for k, v in t.items() if k.endswith(KEY_KERNEL)} for t in (got, want)))
    assert error <= 3e-5, (key, error)
    # The decay matters at this size: optax without it ends far from the above (that the mask
    # is the kernels' is checked directly in tests/test_training.py).
    no_decay = run_reference(tree, images, labels, optax.chain(
        optax.clip_by_global_norm(1.0), optax.adam(schedule, b1=0.9, b2=0.999, eps=1e-8)), accum_steps)
    assert worst(no_decay, want)[0] > 100 * 1e-5
