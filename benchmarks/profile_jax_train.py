"""Where the JAX train step's time goes: keras_vit against a Flax + optax step, in one process.

Each variant is one compiled program on the same batch; the timed calls are interleaved
(A, B, C, ..., then reversed), so the machine's drift hits all alike:

- `flax`: benchmarks/flax_vit.py's jitted step (grad + clip + SGD momentum, donated state);
- `flax-grad`: the same model's loss and gradients only;
- `keras-grad`: keras_vit's model through `stateless_call` under `jax.value_and_grad`, jitted;
- `keras-optax`: that, plus the Flax side's optax update in the same jit (donated): the Keras
  model in a JAX user's step;
- `keras-recipe`: `train_on_batch` after `model.compile(training.finetune_optimizer(...),
  training.classification_loss(model))`: the trainer, keras_vit's optimizer and loss;
- `keras-sgd`: `train_on_batch` with Keras' own SGD(momentum, global_clipnorm) and
  SparseCategoricalCrossentropy(from_logits=True);
- `keras-fit`: the recipe through `fit` on a NumPy batch repeated (`--fit-steps` steps per call,
  `steps_per_execution` as given), per step.

Comparisons: keras-grad / flax-grad is the model's own program; keras-optax / keras-grad the
optimizer; keras-recipe / keras-optax what Keras' trainer and the recipe add. XLA's cost analysis
(flops, bytes accessed) of each program is printed beside the times.

    KERAS_BACKEND=jax .venv/bin/python benchmarks/profile_jax_train.py --reps 3
    KERAS_BACKEND=jax .venv/bin/python benchmarks/profile_jax_train.py --model Ti16 --variants flax keras-recipe
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

VARIANTS = ("flax", "flax-grad", "keras-grad", "keras-optax", "keras-recipe", "keras-sgd", "keras-fit")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="B16", choices=["Ti16", "B16", "L16"])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--dtype", default="float32", choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--reps", type=int, default=3, help="timed calls per variant (interleaved)")
    parser.add_argument("--fit-steps", type=int, default=2)
    parser.add_argument("--steps-per-execution", type=int, default=1)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np
    import optax

    import flax_vit
    import keras_vit
    from keras_vit import training

    ctor = {"Ti16": "ViTTi16", "B16": "ViTB16", "L16": "ViTL16"}[args.model]
    rng = np.random.default_rng(0)
    images = rng.uniform(-1, 1, (args.batch, 224, 224, 3)).astype("float32")
    labels = rng.integers(0, 1000, (args.batch,)).astype("int32")
    if args.dtype == "mixed_bfloat16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    tx = flax_vit.finetune_tx()
    steps, costs, firsts = {}, {}, {}

    def cost(compiled):
        try:
            c = compiled.cost_analysis()
            c = c[0] if isinstance(c, (list, tuple)) else c
            return {k: float(c[k]) for k in ("flops", "bytes accessed") if k in c}
        except Exception:  # noqa: BLE001 - not every XLA build reports it
            return {}

    if {"flax", "flax-grad"} & set(args.variants):
        model = flax_vit.make_model(args.model, "bfloat16" if args.dtype != "float32" else "float32")
        params = flax_vit.init_params(model)
        x, y = jnp.asarray(images), jnp.asarray(labels)

        def flax_loss(p, x, y):
            logits = model.apply({"params": p}, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

        if "flax" in args.variants:
            step = flax_vit.make_train_step(model, tx)
            state = [params, tx.init(params)]
            costs["flax"] = cost(step.lower(*state, x, y).compile())

            def flax_step():
                state[0], state[1], loss = step(state[0], state[1], x, y)
                return float(loss)

            steps["flax"] = flax_step
        if "flax-grad" in args.variants:
            grad = jax.jit(jax.value_and_grad(flax_loss))
            fparams = jax.tree_util.tree_map(jnp.copy, params)
            costs["flax-grad"] = cost(grad.lower(fparams, x, y).compile())
            steps["flax-grad"] = lambda: float(grad(fparams, x, y)[0])

    def keras_model():
        return getattr(keras_vit, ctor)(weights=None, classifier_activation=None)

    if {"keras-grad", "keras-optax"} & set(args.variants):
        km = keras_model()
        trainable = [v.value for v in km.trainable_variables]
        rest = [v.value for v in km.non_trainable_variables]
        x, y = jnp.asarray(images), jnp.asarray(labels)

        def keras_loss(tv, x, y):
            logits, _ = km.stateless_call(tv, rest, x, training=True)
            return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

        if "keras-grad" in args.variants:
            kgrad = jax.jit(jax.value_and_grad(keras_loss))
            costs["keras-grad"] = cost(kgrad.lower(trainable, x, y).compile())
            steps["keras-grad"] = lambda: float(kgrad(trainable, x, y)[0])
        if "keras-optax" in args.variants:

            def kstep(tv, opt, x, y):
                loss, g = jax.value_and_grad(keras_loss)(tv, x, y)
                updates, opt = tx.update(g, opt, tv)
                return optax.apply_updates(tv, updates), opt, loss

            kstep = jax.jit(kstep, donate_argnums=(0, 1))
            kstate = [[jnp.copy(t) for t in trainable], None]
            kstate[1] = tx.init(kstate[0])
            costs["keras-optax"] = cost(kstep.lower(*kstate, x, y).compile())

            def keras_optax():
                kstate[0], kstate[1], loss = kstep(kstate[0], kstate[1], x, y)
                return float(loss)

            steps["keras-optax"] = keras_optax

    def compiled(optimizer, loss=None, steps_per_execution=1):
        m = keras_model()
        m.compile(optimizer=optimizer, loss=loss or training.classification_loss(m), jit_compile=True,
                  steps_per_execution=steps_per_execution)
        return m

    def recipe():
        return training.finetune_optimizer(0.003, total_steps=10_000, warmup_steps=500)

    if "keras-recipe" in args.variants:
        m = compiled(recipe())
        steps["keras-recipe"] = lambda m=m: float(m.train_on_batch(images, labels))
    if "keras-sgd" in args.variants:
        schedule = keras.optimizers.schedules.CosineDecay(0.0, 9_500, warmup_target=0.003, warmup_steps=500)
        m2 = compiled(keras.optimizers.SGD(schedule, momentum=0.9, global_clipnorm=1.0),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        steps["keras-sgd"] = lambda m=m2: float(m.train_on_batch(images, labels))
    if "keras-fit" in args.variants:
        m3 = compiled(recipe(), steps_per_execution=args.steps_per_execution)
        n = args.fit_steps * args.steps_per_execution
        xs = np.repeat(images, n, axis=0)
        ys = np.repeat(labels, n, axis=0)

        def fit():
            history = m3.fit(xs, ys, batch_size=args.batch, epochs=1, shuffle=False, verbose=0)
            return history.history["loss"][-1]

        steps["keras-fit"] = fit

    names = [v for v in args.variants if v in steps]
    per_step = {"keras-fit": args.fit_steps * args.steps_per_execution}
    for name in names:  # compile + first call
        t0 = time.perf_counter()
        steps[name]()
        firsts[name] = time.perf_counter() - t0
        print(f"{name}: first call {firsts[name]:.1f} s", flush=True)
    times = {n: [] for n in names}
    for rep in range(args.reps):
        order = names if rep % 2 == 0 else names[::-1]
        for name in order:
            t0 = time.perf_counter()
            steps[name]()
            times[name].append((time.perf_counter() - t0) / per_step.get(name, 1))
    print(f"\nViT-{args.model} batch {args.batch} {args.dtype}, load {os.getloadavg()[0]:.1f}")
    print("| variant | img/s best / median | s per step best | XLA GFLOP | XLA GB accessed |")
    print("|---|---|---|---|---|")
    out = {}
    for name in names:
        best, med = min(times[name]), statistics.median(times[name])
        c = costs.get(name, {})
        out[name] = dict(step_s=times[name], first_s=firsts[name], cost=c)
        gflop = f"{c['flops'] / 1e9:.0f}" if "flops" in c else "-"
        gb = f"{c['bytes accessed'] / 1e9:.1f}" if "bytes accessed" in c else "-"
        print(f"| {name} | {args.batch / best:.2f} / {args.batch / med:.2f} | {best:.2f} | {gflop} | {gb} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), load=os.getloadavg(), results=out), f, indent=1)


if __name__ == "__main__":
    main()
