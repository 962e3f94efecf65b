#!/usr/bin/env python
"""The paper's Figure 13 in small: FLOPs and inference speed of ViT-B, Axial-ViT-B, AxialResNet-50
and ResNet-50, side by side, in one run on this machine's CPU.

    .venv/bin/python benchmarks/figure13.py                 # writes benchmarks/results/figure13.{json,md,png}
    .venv/bin/python benchmarks/figure13.py --batch 4 --reps 3

For each model at 224 px and 1000 classes: forward GFLOPs per image (`keras_vit.flops`, the
paper's Table 6 convention) and inference images/s (float32, `predict_on_batch` of a compiled
model, batch `--batch`, best of `--reps` timed calls after a warm-up call), each model built
with random weights (the speed does not depend on them). The models: ViT-B/32, ViT-B/16,
Axial-ViT-B/32, Axial-ViT-B/16, AxialResNet-50 (`AxialResNet50L`, the full-width s=1 network)
and ResNet-50 (BiT's R50x1). A model whose constructor does not exist in this checkout is
reported as missing. Keras' backend is whatever KERAS_BACKEND says (JAX by default).
"""

import argparse
import datetime
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

#: (label in the figure, constructor) in the paper's order.
MODELS = [
    ("ViT-B/32", "ViTB32"),
    ("ViT-B/16", "ViTB16"),
    ("Axial-ViT-B/32", "AxialViTB32"),
    ("Axial-ViT-B/16", "AxialViTB16"),
    ("AxialResNet-50", "AxialResNet50L"),
    ("ResNet-50 (BiT R50x1)", "BiTResNet50x1"),
]


def measure(name, batch, reps):
    import keras
    import numpy as np

    import keras_vit
    from keras_vit.layers.init_scope import skip_random_init

    with skip_random_init():  # the speed does not depend on the values
        model = getattr(keras_vit, name)(weights=None, classifier_activation=None)
    params = model.count_params()
    images = np.random.default_rng(0).uniform(-1, 1, (batch, 224, 224, 3)).astype("float32")
    model.compile(jit_compile=True)
    model.predict_on_batch(images)  # compile
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        out = model.predict_on_batch(images)
        np.asarray(out)
        times.append(time.perf_counter() - start)
    keras.utils.clear_session(free_memory=True)
    return {"params": params, "gflops": keras_vit.flops(name) / 1e9, "images_per_s": batch / min(times),
            "seconds": sorted(times)}


def markdown(rows, meta):
    lines = [
        f"Figure 13 in small, one run on {meta['cpu']} ({meta['cores']} cores), Keras {meta['backend']}, float32, "
        f"batch {meta['batch']}, best of {meta['reps']}, {meta['date']}.",
        "",
        "| model | constructor | parameters | GFLOPs (224 px) | images/s (this CPU) |",
        "|---|---|---:|---:|---:|",
    ]
    for r in rows:
        if r.get("missing"):
            lines.append(f"| {r['label']} | `{r['name']}` | - | - | missing in this checkout |")
        else:
            lines.append(f"| {r['label']} | `{r['name']}` | {r['params']:,} | {r['gflops']:.1f} | "
                         f"{r['images_per_s']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in rows if not r.get("missing")]
    fig, ax = plt.subplots(figsize=(6, 4.2))
    markers = {"ViT": "o", "Axial-ViT": "s", "AxialResNet": "^", "ResNet": "D"}
    for r in rows:
        kind = next(k for k in ("Axial-ViT", "AxialResNet", "ViT", "ResNet") if r["label"].startswith(k))
        ax.scatter(r["gflops"], r["images_per_s"], marker=markers[kind], s=60, label=r["label"])
        ax.annotate(r["label"], (r["gflops"], r["images_per_s"]), textcoords="offset points", xytext=(5, 4),
                    fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers on the log axes
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
    ax.set_xlabel("forward GFLOPs per image (224 px)")
    ax.set_ylabel("inference images/s (this CPU)")
    ax.set_title("Figure 13 in small: FLOPs and inference speed (one CPU run)")
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8, help="images per timed call (default 8)")
    parser.add_argument("--reps", type=int, default=3, help="timed calls per model; the best counts (default 3)")
    parser.add_argument("--out", default=os.path.join(HERE, "results"), help="folder for figure13.{json,md,png}")
    args = parser.parse_args(argv)
    if args.batch < 1 or args.reps < 1:
        parser.error("--batch and --reps must be positive")
    import keras

    import keras_vit

    rows = []
    for label, name in MODELS:
        if not hasattr(keras_vit, name):
            print(f"{label}: no constructor {name} in this checkout", flush=True)
            rows.append({"label": label, "name": name, "missing": True})
            continue
        print(f"{label}: building and timing {name} ...", flush=True)
        result = measure(name, args.batch, args.reps)
        print(f"  {result['gflops']:.1f} GFLOPs, {result['images_per_s']:.2f} images/s", flush=True)
        rows.append({"label": label, "name": name, **result})
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "backend": keras.backend.backend(),
        "batch": args.batch,
        "reps": args.reps,
    }
    try:
        with open("/proc/cpuinfo") as f:
            meta["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "figure13.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    table = markdown(rows, meta)
    with open(os.path.join(args.out, "figure13.md"), "w") as f:
        f.write(table)
    plot(rows, os.path.join(args.out, "figure13.png"))
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
