"""Loading a `.keras` file: keras_vit.load_checkpoint beside Keras' own keras.saving.load_model.

    .venv/bin/python benchmarks/keras_file_load.py                        # ViT-B/16, JAX
    .venv/bin/python benchmarks/keras_file_load.py --arch ViTL16 --backends jax tensorflow torch
    git worktree add /tmp/old <commit> && .venv/bin/python benchmarks/keras_file_load.py --keras-vit-from /tmp/old

Set-up (once, cached in --workdir): a randomly initialised model of --arch saved with
`model.save(path)` (a zip archive whose model.weights.h5 member Keras stores uncompressed).
Each measurement is one fresh process that imports keras_vit (not timed), then times the load
and one `predict` of a zero image; it reports those seconds and the process' peak RSS
(ru_maxrss). The two loaders must give the same weights: the script checks that the logits
agree. `--keras-vit-from` times another checkout's load_checkpoint the same way (an older
commit: the "before" row).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

_MAKE = """
import sys, numpy as np, keras_vit
model = getattr(keras_vit, sys.argv[1])(weights=None, classifier_activation=None)
rng = np.random.default_rng(0)
for v in model.weights:  # random values everywhere (the head and norms start at zeros and ones)
    v.assign((rng.standard_normal(tuple(v.shape)) * 0.02).astype("float32"))
model.save(sys.argv[2])
"""

_LOAD = """
import json, resource, sys, time
import numpy as np
import keras, keras_vit
path, how = sys.argv[1], sys.argv[2]
start = time.perf_counter()
if how == "keras_vit":
    model = keras_vit.load_checkpoint(path)
else:
    model = keras.saving.load_model(path, compile=False)
loaded = time.perf_counter() - start
logits = model.predict(np.zeros((1, *model.input_shape[1:]), "float32"), verbose=0)
total = time.perf_counter() - start
np.save(sys.argv[3], logits)
print("RESULT" + json.dumps(dict(load_s=loaded, to_logits_s=total,
                                 peak_gb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6)))
"""


def run(code, args, backend, path=None):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    if path:
        env["PYTHONPATH"] = os.pathsep.join([path] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                         cwd=tempfile.gettempdir())
    if out.returncode:
        raise RuntimeError(f"{args} failed:\n{out.stderr[-3000:]}")
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
    return json.loads(lines[-1][len("RESULT"):]) if lines else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="ViTB16")
    parser.add_argument("--backends", nargs="+", default=["jax"])
    parser.add_argument("--repeats", type=int, default=1, help="runs per row (the fastest is kept)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "keras_vit_keras_file_load"))
    parser.add_argument("--keras-vit-from", default=None, metavar="DIR",
                        help="also time load_checkpoint of this checkout (e.g. a git worktree of an older commit)")
    args = parser.parse_args(argv)

    os.makedirs(args.workdir, exist_ok=True)
    model_file = os.path.join(args.workdir, f"{args.arch}.keras")
    if not os.path.exists(model_file):
        print(f"saving a random {args.arch} as {model_file} ...", flush=True)
        run(_MAKE, [args.arch, model_file], "jax")
    size_gb = os.path.getsize(model_file) / 1e9
    print(f"{model_file}: {size_gb:.2f} GB")
    who = [("keras_vit.load_checkpoint", "keras_vit", None), ("keras.saving.load_model", "keras", None)]
    if args.keras_vit_from:
        who.append((f"load_checkpoint of {args.keras_vit_from}", "keras_vit", args.keras_vit_from))
    rows = []
    for backend in args.backends:
        reference = None
        for label, how, path in who:
            logits_file = os.path.join(args.workdir, f"logits_{backend}_{len(rows)}.npy")
            best = min((run(_LOAD, [model_file, how, logits_file], backend, path) for _ in range(args.repeats)),
                       key=lambda r: r["to_logits_s"])
            import numpy as np

            logits = np.load(logits_file)
            reference = logits if reference is None else reference
            agree = float(np.abs(logits - reference).max() / max(np.abs(reference).max(), 1e-12))
            rows.append(dict(backend=backend, loader=label, **best, rel_diff=agree))
            print(f"  {backend:<10} {label:<45} load {best['load_s']:6.2f} s  to logits {best['to_logits_s']:6.2f} s  "
                  f"peak {best['peak_gb']:.2f} GB  logits vs first row {agree:.1e}", flush=True)
    print("\n| backend | loader | load | to first logits | peak RSS |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['backend']} | {r['loader']} | {r['load_s']:.2f} s | {r['to_logits_s']:.2f} s | "
              f"{r['peak_gb']:.2f} GB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
