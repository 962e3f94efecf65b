"""Time to first logits and peak memory of a named load, keras_vit beside timm, as a new user
meets them: a fresh process, weights named by tag, downloaded from a Hub endpoint.

    .venv/bin/python benchmarks/load_time.py                       # ViT-L/16, every backend
    .venv/bin/python benchmarks/load_time.py --models L16 H14 --backends jax --repeats 2

Set-up (once, cached in --workdir): random timm models saved with timm's own save_for_hf in
the Hub layout (model.safetensors + config.json) as timm/vit_large_patch16_224.augreg_in21k_ft_in1k
(1.2 GB) and timm/vit_huge_patch14_224.orig_in21k (2.5 GB), served by the loopback Hub of the
tests (tests/test_hub_server.py) on 127.0.0.1.

Each measurement is one fresh process, timed from its start (interpreter, imports, download or
cache look-up, model build, weights, one predict of a 224x224 image) to its first logits (the
process reports the moment it has them; "wall" adds the interpreter's exit, which takes
another 1.5-1.9 s on the TensorFlow and PyTorch backends and about 1 s on JAX and for timm):
- "first": empty Hugging Face cache (download included);
- "cached": the second run on the same cache.
timm runs `timm.create_model(name, pretrained=True)` and one forward; keras_vit runs
`keras_vit.ViTL16(weights="augreg_in21k_ft_in1k")` (ViTH14(weights="orig_in21k")) and one
`predict`, per Keras backend. Peak RSS is the process's ru_maxrss. Ratios are keras_vit / timm
measured in the same run (this machine's speed drifts between runs).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

MODELS = {
    "L16": dict(timm="vit_large_patch16_224.augreg_in21k_ft_in1k", arch="ViTL16", tag="augreg_in21k_ft_in1k"),
    "H14": dict(timm="vit_huge_patch14_224.orig_in21k", arch="ViTH14", tag="orig_in21k"),
}

_MAKE = """
import sys, torch, timm
from timm.models import save_for_hf
name, folder = sys.argv[1], sys.argv[2]
model = timm.create_model(name.split(".")[0], pretrained=False, num_classes=timm.models.get_pretrained_cfg(name).num_classes)
save_for_hf(model, folder, safe_serialization=True)
"""

_TIMM = """
import resource, sys, time
import numpy as np, torch, timm
model = timm.create_model(sys.argv[1], pretrained=True).eval()
with torch.no_grad():
    out = model(torch.from_numpy(np.zeros((1, 3, 224, 224), "float32")))
print("AT", time.monotonic(), "PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, tuple(out.shape), flush=True)
"""

_KERAS_VIT = """
import resource, sys, time
import numpy as np
import keras_vit
model = getattr(keras_vit, sys.argv[1])(weights=sys.argv[2], classifier_activation=None)
out = model.predict(np.zeros((1, 224, 224, 3), "float32"), verbose=0)
print("AT", time.monotonic(), "PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, out.shape, flush=True)
"""


def make_repos(workdir, models):
    repos = os.path.join(workdir, "repos")
    for key in models:
        name = MODELS[key]["timm"]
        folder = os.path.join(repos, "timm", name)
        if not os.path.exists(os.path.join(folder, "model.safetensors")):
            print(f"making a random {name} in timm's Hub layout ...", flush=True)
            subprocess.run([sys.executable, "-c", _MAKE, name, folder], check=True)
    return repos


def run_once(code, args, env, cwd=None):
    """(seconds to the moment the process reports ("AT": its first logits, or the end of its
    imports), wall seconds, peak RSS GB) of one fresh process."""
    start_clock, start = time.monotonic(), time.perf_counter()  # CLOCK_MONOTONIC: one clock for every process
    # Started outside the repository: `python -c` puts the working directory first on sys.path.
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                         cwd=cwd or tempfile.gettempdir())
    wall = time.perf_counter() - start
    if out.returncode:
        raise RuntimeError(f"{args} failed:\n{out.stderr[-3000:]}")
    fields = [ln for ln in out.stdout.splitlines() if ln.startswith("AT ")][-1].split()
    to_logits = float(fields[1]) - start_clock
    peak_kb = int(fields[fields.index("PEAK") + 1])
    return to_logits, wall, peak_kb / 1e6


_IMPORT = """
import resource, sys, time
import {module}
print("AT", time.monotonic(), "PEAK", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
"""


def import_floor(repeats):
    """Best time of a fresh process to import timm, or keras_vit on each backend: the part of a
    load no loading code can shorten."""
    floors = {}
    for who, module, backend in [("timm", "timm", None), ("keras_vit jax", "keras_vit", "jax"),
                                 ("keras_vit tensorflow", "keras_vit", "tensorflow"),
                                 ("keras_vit torch", "keras_vit", "torch")]:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **({"KERAS_BACKEND": backend} if backend else {}))
        floors[who] = min(run_once(_IMPORT.format(module=module), [], env)[0] for _ in range(repeats))
        print(f"  import {who:<22} {floors[who]:5.1f} s", flush=True)
    return floors


def measure(server, who, code, args, repeats, backend=None, path=None):
    """(first, cached), each (s to first logits, wall s, peak GB), from fresh caches; `path`
    goes first on PYTHONPATH (keras_vit from another checkout)."""
    from test_hub_server import hub_env

    tmp = tempfile.mkdtemp(prefix="load_time_")
    try:
        env = dict(os.environ, **hub_env(server, __import__("pathlib").Path(tmp)), TF_CPP_MIN_LOG_LEVEL="3")
        if backend:
            env["KERAS_BACKEND"] = backend
        if path:
            env["PYTHONPATH"] = os.pathsep.join([path] + [p for p in [env.get("PYTHONPATH")] if p])
        first = run_once(code, args, env, tmp)
        cached = min((run_once(code, args, env, tmp) for _ in range(repeats)), key=lambda r: r[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"  {who:<22} first {first[0]:6.1f} s (wall {first[1]:5.1f}) {first[2]:5.2f} GB   "
          f"cached {cached[0]:6.1f} s (wall {cached[1]:5.1f}) {cached[2]:5.2f} GB", flush=True)
    return first, cached


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["L16"], choices=sorted(MODELS))
    parser.add_argument("--backends", nargs="+", default=["jax", "tensorflow", "torch"])
    parser.add_argument("--repeats", type=int, default=1, help="cached runs per row (the best is kept)")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "keras_vit_load_time"))
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--keras-vit-from", default=None, metavar="DIR",
                        help="import keras_vit from this checkout instead (e.g. a git worktree of an older "
                             "commit: the same measurement of another revision)")
    args = parser.parse_args(argv)

    from test_hub_server import HubServer

    repos = make_repos(args.workdir, args.models)
    print("import alone (fresh process, best of --repeats):", flush=True)
    floors = import_floor(max(args.repeats, 1))
    rows = []
    with HubServer(repos) as server:
        for key in args.models:
            spec = MODELS[key]
            size_gb = os.path.getsize(os.path.join(repos, "timm", spec["timm"], "model.safetensors")) / 1e9
            print(f"{spec['timm']} ({size_gb:.2f} GB of weights)", flush=True)
            timm_first, timm_cached = measure(server, "timm", _TIMM, [spec["timm"]], args.repeats)
            for backend in args.backends:
                first, cached = measure(server, f"keras_vit {backend}", _KERAS_VIT, [spec["arch"], spec["tag"]],
                                        args.repeats, backend, args.keras_vit_from)
                peak = max(first[2], cached[2])
                rows.append(dict(
                    model=key, backend=backend, weights_gb=size_gb,
                    timm_first_s=timm_first[0], timm_cached_s=timm_cached[0], timm_peak_gb=timm_cached[2],
                    timm_first_wall_s=timm_first[1], timm_cached_wall_s=timm_cached[1],
                    first_s=first[0], cached_s=cached[0], first_wall_s=first[1], cached_wall_s=cached[1],
                    peak_gb=peak, first_ratio=first[0] / timm_first[0], cached_ratio=cached[0] / timm_cached[0],
                    cached_wall_ratio=cached[1] / timm_cached[1], peak_over_file=peak / size_gb,
                    import_s=floors[f"keras_vit {backend}"], timm_import_s=floors["timm"],
                ))
    print("\n| model | backend | first: keras_vit / timm | cached: keras_vit / timm | cached, process wall | "
          "peak RSS (x file) | timm peak | import: keras_vit / timm |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['backend']} | {r['first_s']:.1f} / {r['timm_first_s']:.1f} s "
              f"(**{r['first_ratio']:.2f}x**) | {r['cached_s']:.1f} / {r['timm_cached_s']:.1f} s "
              f"(**{r['cached_ratio']:.2f}x**) | {r['cached_wall_s']:.1f} / {r['timm_cached_wall_s']:.1f} s "
              f"({r['cached_wall_ratio']:.2f}x) | {r['peak_gb']:.2f} GB ({r['peak_over_file']:.2f}x) | "
              f"{r['timm_peak_gb']:.2f} GB | {r['import_s']:.1f} / {r['timm_import_s']:.1f} s |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
