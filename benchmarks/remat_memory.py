"""Peak memory of a training step with and without `remat=True` (keras_vit on JAX, TensorFlow
or PyTorch: `--backend`).

For each setting, in a fresh process: a random `keras_vit.ViTL16` (or `--model`) compiled with
the fine-tuning recipe (`training.finetune_optimizer`, `training.classification_loss`), then

- on JAX, XLA's memory analysis of the compiled train step (Keras' own `train_step` under `jax.jit`
  with the state donated, as `fit` runs it): the temporaries (activations kept for the backward
  pass and the backward's work buffers), the arguments (weights, optimizer state, batch) and
  the peak of both, which is the step's device memory;
- the process's peak RSS (ru_maxrss) after `--steps` real `train_on_batch` steps (0: compile
  only), and what the steps added to the peak the process had reached with the model and the
  optimizer built (`step_rss_mb`: activations kept for the backward pass and its buffers, plus
  whatever the backend's first trace or compilation holds).

TensorFlow and PyTorch run `train_on_batch` as `fit` does with
`keras_vit.performance.recommended_jit_compile()` (`--jit-compile` overrides).

    .venv/bin/python benchmarks/remat_memory.py --backend tensorflow --model ViTB16
    KERAS_BACKEND=jax .venv/bin/python benchmarks/remat_memory.py                 # ViT-L/16, batch 8
    KERAS_BACKEND=jax .venv/bin/python benchmarks/remat_memory.py --model ViTB16 --steps 0
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(model_name, batch, size, remat, steps, jit_compile):
    import keras
    import numpy as np

    import keras_vit
    from keras_vit import performance, training

    backend = keras.backend.backend()
    if jit_compile == "auto":
        jit_compile = True if backend == "jax" else performance.recommended_jit_compile()
    else:
        jit_compile = jit_compile == "on"
    model = getattr(keras_vit, model_name)(weights=None, input_shape=(size, size, 3), classifier_activation=None,
                                           remat=remat)
    model.compile(optimizer=training.finetune_optimizer(0.003, total_steps=10_000, warmup_steps=500),
                  loss=training.classification_loss(model), jit_compile=jit_compile)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (batch, size, size, 3)).astype("float32")
    y = rng.integers(0, 1000, (batch,)).astype("int32")
    model.optimizer.build(model.trainable_variables)
    model._symbolic_build(data_batch=(x[:1], y[:1]))
    out = dict(remat=remat, backend=backend, jit_compile=bool(jit_compile))
    if backend == "jax":
        out.update(_xla_analysis(model, x, y))
    out["built_rss_mb"] = round(_peak_rss_mb(), 1)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = float(model.train_on_batch(x, y))
        times.append(time.perf_counter() - t0)
        out["loss"] = loss
    out["step_s"] = [round(t, 2) for t in times]
    out["peak_rss_mb"] = round(_peak_rss_mb(), 1)
    out["step_rss_mb"] = round(out["peak_rss_mb"] - out["built_rss_mb"], 1)
    return out


def _xla_analysis(model, x, y):
    import jax
    import keras

    state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                 optimizer_variables=True, metrics_variables=True)
    data = (keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(y), None)
    t0 = time.perf_counter()
    compiled = jax.jit(model.train_step, donate_argnums=0).lower(state, data).compile()
    compile_s = time.perf_counter() - t0
    m = compiled.memory_analysis()
    out = dict(
        compile_s=round(compile_s, 1),
        temp_bytes=int(m.temp_size_in_bytes), argument_bytes=int(m.argument_size_in_bytes),
        output_bytes=int(m.output_size_in_bytes), alias_bytes=int(m.alias_size_in_bytes),
    )
    # Donated arguments alias the outputs: the step's peak is the arguments plus the temporaries.
    out["step_bytes"] = out["argument_bytes"] + out["temp_bytes"]
    del compiled, state
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="jax", choices=["jax", "tensorflow", "torch"])
    parser.add_argument("--jit-compile", default="auto", choices=["auto", "on", "off"])
    parser.add_argument("--model", default="ViTL16")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=1, help="train_on_batch steps after the analysis")
    parser.add_argument("--json", default=None, help="default: results/remat_memory[_BACKEND].json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        print("RESULT " + json.dumps(worker(args.model, args.batch, args.image_size, args.worker == "on", args.steps,
                                              args.jit_compile)))
        return 0
    env = dict(os.environ, KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    results = []
    for remat in ("off", "on"):
        print(f"{args.backend}: {args.model} batch {args.batch} at {args.image_size}, remat {remat} (load {os.getloadavg()[0]:.1f}) ...",
              flush=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", remat, "--model", args.model,
               "--batch", str(args.batch), "--image-size", str(args.image_size), "--steps", str(args.steps),
               "--jit-compile", args.jit_compile]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(proc.stdout[-2000:], proc.stderr[-3000:])
            return 1
        result = json.loads(line[len("RESULT "):])
        result["load"] = os.getloadavg()
        results.append(result)
        print("   ", {k: v for k, v in result.items()}, flush=True)
    off, on = results
    gb = 1e9
    print(f"\n| {args.backend}: {args.model}, batch {args.batch}, {args.image_size} px | remat off | remat on | on / off |")
    print("|---|---|---|---|")
    for key, what in (("temp_bytes", "XLA temporaries (activations, backward buffers)"),
                      ("step_bytes", "train step: arguments + temporaries"),
                      ("built_rss_mb", "peak RSS with the model and optimizer built"),
                      ("step_rss_mb", "added by the train steps (RSS)"),
                      ("peak_rss_mb", "process peak RSS")):
        if key not in off:
            continue
        a, b = off[key], on[key]
        unit = 1 / 1024 if key.endswith("_mb") else 1 / gb
        print(f"| {what} (GB) | {a * unit:.2f} | {b * unit:.2f} | {b / a:.2f}x |")
    if off.get("step_s") and on.get("step_s"):
        print(f"| step time (s) | {min(off['step_s']):.1f} | {min(on['step_s']):.1f} | "
              f"{min(on['step_s']) / min(off['step_s']):.2f}x |")
    path = args.json or os.path.join(
        HERE, "results", "remat_memory.json" if args.backend == "jax" else f"remat_memory_{args.backend}.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(args=vars(args), results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
