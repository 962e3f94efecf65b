"""Time and peak memory of converting a full-size ViT-L/16 from timm's Hub layout.

    .venv/bin/python benchmarks/convert_vit_l16.py [--backend jax] [--folder /tmp/vit_l16_timm]

Step 1 (once, in this process): a random timm vit_large_patch16_224 saved with timm's own
save_for_hf (model.safetensors + config.json), unless the folder already holds one.
Step 2 (fresh processes per backend, so nothing from step 1 counts): after importing keras_vit,
time read_checkpoint alone (the eager canonical tree) in one process and keras_vit.load_checkpoint
(lazy read, model build, assignment) in another, each reporting its peak resident memory
(ru_maxrss) above the post-import baseline, in units of the checkpoint's weight bytes.
"""

import argparse
import json
import os
import subprocess
import sys
import time

_MEASURE = r"""
import gc, json, os, resource, sys, time
import numpy as np

def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

import keras
import keras_vit
from keras_vit.checkpoints import read_checkpoint
folder = sys.argv[1]
# Warm the backend (first-op overheads are not conversion costs).
keras.ops.convert_to_tensor(np.zeros(4, "float32")) + 1
gc.collect()
base_rss = rss_mb()
mode = sys.argv[2]
t0 = time.perf_counter()
if mode == "read":  # read_checkpoint alone: the eager canonical tree
    result = read_checkpoint(folder)
    weights_mb = sum(v.nbytes for v in result[0].values()) / 2**20
    params = sum(v.size for v in result[0].values())
else:  # load_checkpoint: reads lazily, builds the model, assigns (what users call)
    result = keras_vit.load_checkpoint(folder)
    params = result.count_params()
    weights_mb = params * 4 / 2**20
seconds = time.perf_counter() - t0
gc.collect()
out = dict(
    backend=keras.backend.backend(),
    step=mode + ("_checkpoint" if mode == "read" else "_checkpoint (lazy read + build + assign)"),
    seconds=round(seconds, 2),
    weights_mb=round(weights_mb, 1),
    baseline_rss_mb=round(base_rss, 1),
    final_rss_above_baseline_mb=round(rss_mb() - base_rss, 1),
    peak_rss_above_baseline_mb=round(peak_mb() - base_rss, 1),
    params=int(params),
)
out["peak_in_weight_copies"] = round(out["peak_rss_above_baseline_mb"] / weights_mb, 2)
print("RESULT " + json.dumps(out))
"""


def make_checkpoint(folder):
    if os.path.exists(os.path.join(folder, "model.safetensors")):
        return
    import timm
    from timm.models._hub import save_for_hf

    t = time.perf_counter()
    model = timm.create_model("vit_large_patch16_224", pretrained=False).eval()
    save_for_hf(model, folder, safe_serialization=True)
    print(f"created and saved random timm vit_large_patch16_224 in {time.perf_counter() - t:.1f}s -> {folder}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default="/tmp/keras_vit_bench_vit_l16_timm")
    parser.add_argument("--backend", action="append", help="jax, tensorflow, torch (repeatable; default jax and tensorflow)")
    args = parser.parse_args()
    make_checkpoint(args.folder)
    results = []
    for backend in args.backend or ["jax", "tensorflow"]:
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
        for mode in ("read", "load"):  # separate processes: freed heap from one does not count in the other
            cmd = [sys.executable, "-c", _MEASURE, args.folder, mode]
            run = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = [ln for ln in run.stdout.splitlines() if ln.startswith("RESULT ")]
            if run.returncode or not line:
                print(run.stdout, run.stderr[-3000:])
                raise SystemExit(f"measurement failed on {backend} ({mode})")
            results.append(json.loads(line[0][7:]))
            print(json.dumps(results[-1]))
    return results


if __name__ == "__main__":
    main()
