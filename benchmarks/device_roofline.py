"""ViT-B/16 inference on one GPU against the GPU's own matmul rate, per backend, in one run.

    python3 benchmarks/device_roofline.py --out DIR                     # bfloat16 and float32, batch 64
    python3 benchmarks/device_roofline.py --dtypes bfloat16 --batch 128 --budget 240
    .venv/bin/python benchmarks/device_roofline.py --device cpu --batch 2 --reps 2   # the script's smoke test

One fresh process per side and dtype. In each, at 224 px:

- the roofline: the side's own plain matmul (`torch.matmul`, a jitted `jnp.dot`) on ViT-B/16's three matmul
  shapes at the run's batch (rows = batch x 197), the best of --reps timed calls after warm-up;
- the model's forward on device-resident input, the best of --reps calls, each waited for:
  - keras-jax: `keras_vit.ViTB16(weights=None)` called through `model.stateless_call` under one `jax.jit`
    (the function `predict` compiles, without the host-to-device copy of a NumPy batch);
  - keras-torch: the same model on Keras' PyTorch backend, eager under `torch.no_grad()`, and compiled
    (`model.compile(jit_compile=True)`, `predict_on_batch` of a CUDA tensor);
  - timm: `vit_base_patch16_224` in `inference_mode`, eager and under `torch.compile`.
- bfloat16: Keras' `mixed_bfloat16` policy; timm under `torch.autocast("cuda", bfloat16)`. float32: each
  framework's default float32 matmul precision (reported, since JAX on GPU may use TF32 where PyTorch does not).

The table gives images/s, GFLOP/s (images/s x the forward's FLOPs, roofline.forward_flops()) and that rate as a
share of the same process's best matmul rate ("of own matmul") and of the best matmul rate any side reached for
that dtype ("of best"). Results: OUT/device_roofline.json and .md, written after every side, so a run cut short
keeps what it measured. --budget stops launching sides once that many seconds have passed.
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from roofline import HID, MLP, T, forward_flops  # noqa: E402
from train_step import _env as train_step_env  # noqa: E402

SIDES = ("keras-jax", "timm", "keras-torch")


def _shapes(batch):
    rows = batch * T
    return [(rows, HID, MLP), (rows, MLP, HID), (rows, HID, HID)]


def _best(fn, sync, reps, warmup=2):
    for _ in range(warmup):
        sync(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        sync(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def _matmul_rates(side, dtype, batch, reps):
    rates = {}
    if side == "keras-jax":
        import jax
        import jax.numpy as jnp

        dot = jax.jit(jnp.dot)
        for m, k, n in _shapes(batch):
            a = jnp.ones((m, k), dtype) * 0.01
            b = jnp.ones((k, n), dtype) * 0.01
            seconds = _best(lambda: dot(a, b), lambda y: y.block_until_ready(), reps)
            rates[f"{m}x{k}x{n}"] = 2 * m * k * n / seconds / 1e9
    else:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        torch_dtype = getattr(torch, dtype)
        for m, k, n in _shapes(batch):
            a = torch.full((m, k), 0.01, dtype=torch_dtype, device=device)
            b = torch.full((k, n), 0.01, dtype=torch_dtype, device=device)
            seconds = _best(lambda: a @ b, lambda y: torch.cuda.synchronize() if device == "cuda" else None, reps)
            rates[f"{m}x{k}x{n}"] = 2 * m * k * n / seconds / 1e9
    return rates


def _images(batch):
    import numpy as np

    return np.random.default_rng(0).uniform(-1, 1, size=(batch, 224, 224, 3)).astype("float32")


def _keras_jax(dtype, batch, reps):
    import jax
    import keras

    if dtype == "bfloat16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    import keras_vit

    model = keras_vit.ViTB16(weights=None)
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]
    forward = jax.jit(lambda tv, ntv, x: model.stateless_call(tv, ntv, x, training=False)[0])
    x = jax.device_put(_images(batch))
    seconds = _best(lambda: forward(trainable, non_trainable, x), lambda y: y.block_until_ready(), reps)
    info = dict(device=str(jax.devices()[0]), matmul_precision=str(jax.config.jax_default_matmul_precision))
    return {"keras-jax": batch / seconds}, info


def _keras_torch(dtype, batch, reps):
    import keras
    import torch

    if dtype == "bfloat16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    import keras_vit

    cuda = torch.cuda.is_available()
    sync = (lambda y: torch.cuda.synchronize()) if cuda else (lambda y: None)
    model = keras_vit.ViTB16(weights=None)
    x = torch.from_numpy(_images(batch)).to("cuda" if cuda else "cpu")
    rates = {}
    with torch.no_grad():
        rates["keras-torch eager"] = batch / _best(lambda: model(x, training=False), sync, reps)
    model.compile(jit_compile=True)
    rates["keras-torch compiled"] = batch / _best(lambda: model.predict_on_batch(x), sync, reps)
    info = dict(allow_tf32=bool(torch.backends.cuda.matmul.allow_tf32))
    return rates, info


def _timm(dtype, batch, reps):
    import timm
    import torch

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sync = (lambda y: torch.cuda.synchronize()) if cuda else (lambda y: None)
    model = timm.create_model("vit_base_patch16_224", pretrained=False).to(device).eval()
    x = torch.from_numpy(_images(batch)).permute(0, 3, 1, 2).contiguous().to(device)
    rates = {}
    compiled = torch.compile(model)
    for name, fn in (("timm eager", model), ("timm compiled", compiled)):
        def call(fn=fn):
            with torch.inference_mode(), torch.autocast(device, torch.bfloat16, enabled=dtype == "bfloat16"):
                return fn(x)

        rates[name] = batch / _best(call, sync, reps)
    return rates, dict(allow_tf32=bool(torch.backends.cuda.matmul.allow_tf32))


def worker(spec):
    side, dtype, batch, reps = spec["side"], spec["dtype"], spec["batch"], spec["reps"]
    model = {"keras-jax": _keras_jax, "keras-torch": _keras_torch, "timm": _timm}[side]
    images_per_s, info = model(dtype, batch, reps)
    matmul = _matmul_rates(side, dtype, batch, reps)
    return dict(images_per_s=images_per_s, matmul_gflops=matmul, info=info)


def run_side(spec, timeout):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=train_step_env(spec["side"], 2, spec["device"]), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout} s")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        return dict(error=f"exit {proc.returncode}: {(proc.stderr or proc.stdout)[-1500:]}")
    return json.loads(lines[-1])


def table(runs, batch):
    flops = forward_flops()
    lines = []
    for dtype in dict.fromkeys(r["spec"]["dtype"] for r in runs):
        group = [r for r in runs if r["spec"]["dtype"] == dtype]
        best = max((max(r["matmul_gflops"].values()) for r in group if "matmul_gflops" in r), default=None)
        lines += [f"#### ViT-B/16 at 224, batch {batch}, {dtype} (best matmul of the run: "
                  + (f"{best:.0f} GFLOP/s)" if best else "none)"), "",
                  "| side | img/s | GFLOP/s | of own matmul | of best | own matmul GFLOP/s by shape |",
                  "|---|---|---|---|---|---|"]
        for run in group:
            if "error" in run:
                lines.append(f"| {run['spec']['side']} | failed: {run['error'].strip().splitlines()[-1][:120]} "
                             f"| | | | |")
                continue
            own = max(run["matmul_gflops"].values())
            shapes = ", ".join(f"{k} {v:.0f}" for k, v in run["matmul_gflops"].items())
            for name, rate in run["images_per_s"].items():
                gflops = rate * flops / 1e9
                lines.append(f"| {name} | {rate:.1f} | {gflops:.0f} | {gflops / own:.0%} | {gflops / best:.0%} "
                             f"| {shapes} |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--reps", type=int, default=10, help="timed calls of each function (the best is kept)")
    parser.add_argument("--device", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument("--budget", type=float, default=None, help="seconds after which no side is started")
    parser.add_argument("--timeout", type=int, default=240, help="seconds per side")
    parser.add_argument("--out", default=os.path.join(HERE, "results"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    os.makedirs(args.out, exist_ok=True)
    started = time.monotonic()
    report = dict(args=vars(args), started=time.strftime("%Y-%m-%d %H:%M:%S"), runs=[])
    try:
        report["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                        "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        report["gpu"] = None
    json_path, md_path = os.path.join(args.out, "device_roofline.json"), os.path.join(args.out, "device_roofline.md")
    for dtype in args.dtypes:
        for side in args.sides:
            if args.budget and time.monotonic() - started > args.budget:
                print(f"budget of {args.budget:.0f} s spent: {side} {dtype} not run", flush=True)
                continue
            spec = dict(side=side, dtype=dtype, batch=args.batch, reps=args.reps, device=args.device)
            t0 = time.monotonic()
            print(f"{side} {dtype} ...", flush=True)
            result = run_side(spec, args.timeout)
            result.update(spec=spec, wall_s=round(time.monotonic() - t0, 1))
            print(json.dumps(result)[:600], flush=True)
            report["runs"].append(result)
            with open(json_path, "w") as f:
                json.dump(report, f, indent=1)
            with open(md_path, "w") as f:
                f.write(f"GPU: {report['gpu']}\n\n" + table(report["runs"], args.batch))
    print(table(report["runs"], args.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
