"""The fine-tuning train step side by side: keras_vit on JAX, TensorFlow and PyTorch against timm
(eager and torch.compile) and a Flax + optax step of the same model.

Every side runs the same update, the paper's fine-tuning step: softmax cross-entropy on the logits
of a new zero-initialised 1000-class head, gradients clipped to global norm 1, SGD with momentum
0.9 under a warm-up + cosine schedule.

- keras_vit: `keras_vit.ViTB16(weights=None, classifier_activation=None)` (random weights, the
  zero head `training.for_finetuning` gives), compiled with the recipe:
  `training.finetune_optimizer(...)`, `training.classification_loss(model)`,
  `jit_compile=keras_vit.performance.recommended_jit_compile()` (PyTorch: `--torch-jit` picks
  eager, torch.compile or both), then `train_on_batch` (the compiled step `fit` runs).
- timm: `vit_base_patch16_224` with its head zeroed, `torch.optim.SGD(momentum=0.9)` under a
  LambdaLR warm-up + cosine, `clip_grad_norm_(1.0)`, `F.cross_entropy`; eager, and with the
  model under `torch.compile` ("timm-compiled").
- Flax: benchmarks/flax_vit.py, a linen ViT with the original module layout and one jitted
  optax step (clip_by_global_norm + sgd momentum), parameters and state donated.

Mixed bfloat16: Keras' `mixed_bfloat16` policy, timm under `torch.autocast("cpu", bfloat16)`,
Flax with `dtype=bfloat16` (float32 parameters). Each side runs in a fresh process; the sides are
interleaved round by round (the order reversed every other round), and each round records the
load average. The table's ratios are the best images/s of a side over the best of its peer in
the same run; peak RSS is the child's ru_maxrss (os.wait4). Every side starts with glibc's malloc
on transparent huge pages where that changes something (`keras_vit.huge_pages`; --huge-pages off
for 4 KiB pages).

    .venv/bin/python benchmarks/train_step.py --quick            # ViT-B/16, float32, one round
    .venv/bin/python benchmarks/train_step.py --models B16 L16 --dtypes float32 mixed_bfloat16
    .venv/bin/python benchmarks/train_step.py --sides keras-jax flax --rounds 3
    .venv/bin/python benchmarks/train_step.py --device gpu --flash on off --dtypes mixed_bfloat16

Results: benchmarks/results/train_step.json (every run, with its load and machine) and
benchmarks/results/train_step.md (the table).
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")

#: model -> (timm name, keras_vit constructor, image size, batch)
MODELS = {
    "Ti16": ("vit_tiny_patch16_224", "ViTTi16", 224, 8),  # a smoke test of the script
    "B16": ("vit_base_patch16_224", "ViTB16", 224, 8),
    "L16": ("vit_large_patch16_224", "ViTL16", 224, 4),
    "L16_384": ("vit_large_patch16_384", "ViTL16", 384, 4),
    "H14_518": ("vit_huge_patch14_224", "ViTH14", 518, 1),
}
SIDES = ("keras-jax", "keras-tensorflow", "keras-torch", "timm", "timm-compiled", "flax")
BASE_LR, TOTAL_STEPS, WARMUP_STEPS = 0.003, 10_000, 500


# ---------------------------------------------------------------------------------------------
# Worker: one side, one model, one dtype, in its own process.
# ---------------------------------------------------------------------------------------------


def _data(size, batch, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    images = rng.uniform(-1, 1, size=(batch, size, size, 3)).astype("float32")
    labels = rng.integers(0, 1000, size=(batch,)).astype("int32")
    return images, labels


def _cosine_lr(step):
    import math

    if step < WARMUP_STEPS:
        return BASE_LR * step / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / (TOTAL_STEPS - WARMUP_STEPS)
    return BASE_LR * 0.5 * (1 + math.cos(math.pi * progress))


def _patch_flash(flash):
    """`keras.ops.dot_product_attention` with flash_attention forced on or off (None: Keras'
    own choice). keras_vit's attention calls it through `keras.ops` at run time."""
    if flash in (None, "auto"):
        return
    import functools

    import keras

    forced = functools.partial(keras.ops.dot_product_attention, flash_attention=(flash == "on"))
    keras.ops.dot_product_attention = forced


def _keras_step(spec):
    import keras

    import keras_vit
    from keras_vit import training
    from keras_vit.performance import recommended_jit_compile

    if spec["dtype"] == "mixed_bfloat16":
        keras.config.set_dtype_policy("mixed_bfloat16")
    _patch_flash(spec.get("flash"))
    timm_name, ctor, size, batch = MODELS[spec["model"]]
    model = getattr(keras_vit, ctor)(
        weights=None, input_shape=(size, size, 3), classifier_activation=None, remat=spec.get("remat", False)
    )
    jit = spec.get("jit", "recommended")
    jit = recommended_jit_compile() if jit == "recommended" else jit
    model.compile(
        optimizer=training.finetune_optimizer(BASE_LR, total_steps=TOTAL_STEPS, warmup_steps=WARMUP_STEPS),
        loss=training.classification_loss(model),
        jit_compile=jit,
    )
    images, labels = _data(size, spec.get("batch") or batch)
    if spec.get("backend") == "torch":
        images, labels = keras.ops.convert_to_tensor(images), keras.ops.convert_to_tensor(labels)

    def step():
        return float(model.train_on_batch(images, labels))

    return step, dict(jit_compile=str(jit))


def _timm_step(spec):
    import timm
    import torch

    if spec.get("device") == "gpu":
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    timm_name, _, size, batch = MODELS[spec["model"]]
    kwargs = dict(img_size=size) if spec["model"] == "H14_518" else {}
    model = timm.create_model(timm_name, pretrained=False, num_classes=1000, **kwargs).to(device)
    with torch.no_grad():
        model.head.weight.zero_()
        model.head.bias.zero_()
    if spec.get("remat"):
        model.set_grad_checkpointing(True)
    model.train()
    forward = torch.compile(model) if spec["side"] == "timm-compiled" else model
    optimizer = torch.optim.SGD(model.parameters(), lr=BASE_LR, momentum=0.9)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _cosine_lr(s) / BASE_LR)
    images, labels = _data(size, spec.get("batch") or batch)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().to(device)
    y = torch.from_numpy(labels).long().to(device)
    autocast = spec["dtype"] == "mixed_bfloat16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, torch.bfloat16, enabled=autocast):
            logits = forward(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        value = float(loss)  # waits for the step (and the device)
        return value

    return step, {}


def _flax_step(spec):
    import jax

    sys.path.insert(0, HERE)
    import flax_vit

    timm_name, _, size, batch = MODELS[spec["model"]]
    arch = spec["model"].split("_")[0]
    dtype = "bfloat16" if spec["dtype"] == "mixed_bfloat16" else "float32"
    model = flax_vit.make_model(arch, dtype, remat=spec.get("remat", False))
    params = flax_vit.init_params(model, size)
    tx = flax_vit.finetune_tx(BASE_LR, TOTAL_STEPS, WARMUP_STEPS)
    state = [params, tx.init(params)]
    train = flax_vit.make_train_step(model, tx)
    images, labels = _data(size, spec.get("batch") or batch)
    images, labels = jax.device_put(images), jax.device_put(labels)

    def step():
        state[0], state[1], loss = train(state[0], state[1], images, labels)
        return float(loss)

    return step, {}


def _set_threads(spec):
    threads = spec.get("threads")
    if not threads or spec.get("device") == "gpu":
        return
    if spec["side"] in ("timm", "timm-compiled") or spec["side"] == "keras-torch":
        import torch

        torch.set_num_threads(threads)
    if spec["side"] == "keras-tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def _gpu_peak_bytes(spec):
    """Peak accelerator memory of the process, where the framework reports it."""
    try:
        if spec["side"] in ("timm", "timm-compiled", "keras-torch"):
            import torch

            return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None
        if spec["side"] in ("keras-jax", "flax"):
            import jax

            stats = jax.devices()[0].memory_stats() or {}
            return stats.get("peak_bytes_in_use")
        if spec["side"] == "keras-tensorflow":
            import tensorflow as tf

            gpus = tf.config.list_logical_devices("GPU")
            return tf.config.experimental.get_memory_info("GPU:0")["peak"] if gpus else None
    except Exception:  # noqa: BLE001 - not every backend reports it on every device
        return None
    return None


def worker(spec):
    _set_threads(spec)
    t0 = time.perf_counter()
    side = spec["side"]
    if side.startswith("keras-"):
        step, info = _keras_step(spec)
    elif side.startswith("timm"):
        step, info = _timm_step(spec)
    else:
        step, info = _flax_step(spec)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    first_loss = step()
    first = time.perf_counter() - t0
    for _ in range(spec["warmup"]):
        step()
    times, losses = [], []
    for _ in range(spec["steps"]):
        t0 = time.perf_counter()
        losses.append(step())
        times.append(time.perf_counter() - t0)
    batch = spec.get("batch") or MODELS[spec["model"]][3]
    rates = sorted(batch / t for t in times)
    return dict(
        info,
        build_s=round(built, 2),
        first_step_s=round(first, 2),
        step_s=[round(t, 3) for t in times],
        img_s_best=round(rates[-1], 3),
        img_s_median=round(statistics.median(rates), 3),
        first_loss=first_loss,
        last_loss=losses[-1] if losses else None,
        peak_rss_mb_self=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        device_peak_bytes=_gpu_peak_bytes(spec),
    )


# ---------------------------------------------------------------------------------------------
# Driver.
# ---------------------------------------------------------------------------------------------


def _env(side, threads, device, huge_pages=False):
    env = dict(os.environ)
    if huge_pages:  # every side alike: glibc's malloc on transparent huge pages where it helps
        sys.path.insert(0, HERE)
        from roofline import huge_pages_module

        env.update(huge_pages_module().huge_pages_environment(env))
    backend = {"keras-jax": "jax", "keras-tensorflow": "tensorflow", "keras-torch": "torch"}.get(side)
    if backend:
        env["KERAS_BACKEND"] = backend
    env.update(TF_CPP_MIN_LOG_LEVEL="3", PYTHONWARNINGS="ignore")
    if device != "gpu":
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="")
        env["JAX_PLATFORMS"] = "cpu"
    else:
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # so that peaks are the program's
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_side(spec, timeout):
    """Runs one worker; its result with the child's peak RSS (os.wait4), or an error."""
    with tempfile.TemporaryDirectory() as tmp:
        out_path, log_path = os.path.join(tmp, "out.json"), os.path.join(tmp, "log.txt")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec), "--out", out_path]
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env=_env(spec["side"], spec.get("threads"), spec.get("device"),
                                             spec.get("huge_pages", False)), cwd=ROOT)
            deadline = time.monotonic() + timeout
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    proc.returncode = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() > deadline:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    proc.returncode = -9
                    break
                time.sleep(0.2)
        wall = time.perf_counter() - t0
        result = dict(wall_s=round(wall, 1), peak_rss_mb=round(usage.ru_maxrss / 1024, 1))
        if os.path.exists(out_path):
            with open(out_path) as f:
                result.update(json.load(f))
        else:
            with open(log_path) as f:
                tail = f.read()[-1500:]
            result["error"] = f"exit {proc.returncode}" + (" (timed out)" if proc.returncode == -9 else "") + f": {tail}"
        return result


def machine():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        cpu = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name"))
        isa = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in text]
    except (OSError, StopIteration):
        isa = []
    versions = {}
    from importlib.metadata import PackageNotFoundError, version

    for name in ("keras", "jax", "flax", "optax", "tensorflow-cpu", "tensorflow", "torch", "timm"):
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            pass
    return dict(cpu=cpu, cores=os.cpu_count(), isa=isa, python=platform.python_version(), versions=versions)


PEERS = {"keras-jax": ("timm", "timm-compiled", "flax"), "keras-tensorflow": ("timm",),
         "keras-torch": ("timm",), "keras-torch-compiled": ("timm-compiled",)}


def _label(spec):
    side = spec["side"]
    if side == "keras-torch" and spec.get("jit") is True:
        side = "keras-torch-compiled"
    extra = "".join(f", flash {spec['flash']}" for _ in [0] if spec.get("flash") not in (None, "auto"))
    extra += ", remat" if spec.get("remat") else ""
    return side + extra


def table(runs):
    """Markdown: per (model, dtype), each side's best / median img/s and peak RSS, the ratios
    (each keras_vit side's best over its peers' best in the same run)."""
    groups = {}
    for run in runs:
        s = run["spec"]
        groups.setdefault((s["model"], s["dtype"]), {}).setdefault(_label(s), []).append(run)
    lines = []
    for (model, dtype), sides in groups.items():
        timm_name, _, size, batch = MODELS[model]
        batch = next(iter(sides.values()))[0]["spec"].get("batch") or batch
        device = any(r.get("device_peak_bytes") for rs in sides.values() for r in rs)
        lines += [f"#### {model} at {size}, batch {batch}, {dtype}", "",
                  "| side | img/s best / median | peak RSS (GB) |" + (" device peak (GB) |" if device else "")
                  + " first step (s) | ratio | rounds (load avg) |",
                  "|---|---|---|" + ("---|" if device else "") + "---|---|---|"]
        best, rss = {}, {}
        for label, rs in sides.items():
            ok = [r for r in rs if "img_s_best" in r]
            if ok:
                best[label] = max(r["img_s_best"] for r in ok)
                rss[label] = min(r["peak_rss_mb"] for r in ok)
        for label, rs in sides.items():
            ok = [r for r in rs if "img_s_best" in r]
            loads = ", ".join(f"{r['load'][0]:.1f}" for r in rs)
            if not ok:
                error = rs[-1].get("error", "").strip().splitlines()
                lines.append(f"| {label} | failed: {(error[-1] if error else '')[:100]} |"
                             + (" |" if device else "") + f" | | | {loads} |")
                continue
            med = statistics.median(r["img_s_median"] for r in ok)
            ratios = []
            base = label.split(",")[0]
            if base == "keras-jax":
                fast = [p for p in ("timm", "timm-compiled", "flax") if p in best]
                if fast:
                    top = max(fast, key=best.get)
                    ratios.append(f"{best[label] / best[top]:.2f}x {top} (the fastest peer)")
            for p in PEERS.get(base, ()):
                if p in best and base != "keras-jax":
                    ratios.append(f"{best[label] / best[p]:.2f}x {p}")
            if base.startswith("keras"):
                lighter = min((p for p in ("timm", "timm-compiled", "flax") if p in rss), key=rss.get, default=None)
                if lighter:
                    ratios.append(f"RSS {rss[label] / rss[lighter]:.2f}x {lighter}")
            first = min(r["first_step_s"] for r in ok)
            peak = ""
            if device:
                values = [r["device_peak_bytes"] for r in ok if r.get("device_peak_bytes")]
                peak = f" {min(values) / 1e9:.2f} |" if values else " - |"
            lines.append(f"| {label} | {best[label]:.2f} / {med:.2f} | {rss[label] / 1024:.2f} |{peak} {first:.1f} | "
                         f"{'; '.join(ratios)} | {len(rs)} ({loads}) |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["B16"], choices=sorted(MODELS))
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "mixed_bfloat16"])
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES)
    parser.add_argument("--torch-jit", nargs="+", default=["eager"], choices=["eager", "compiled"],
                        help="the Keras PyTorch backend without and/or with torch.compile (compiling the "
                             "train step takes ~3 minutes on 2 cores)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side")
    parser.add_argument("--warmup", type=int, default=1, help="steps after the first, untimed")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=None, help="default: the model's (B16: 8, L16: 4)")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    parser.add_argument("--flash", nargs="+", default=["auto"], choices=["auto", "on", "off"],
                        help="keras_vit's ops.dot_product_attention with flash_attention forced (GPU)")
    parser.add_argument("--remat", nargs="+", default=["off"], choices=["off", "on"])
    parser.add_argument("--huge-pages", choices=["on", "off"], default="on",
                        help="start every side with glibc's malloc on transparent huge pages where it helps "
                             "(keras_vit.huge_pages)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per side")
    parser.add_argument("--quick", action="store_true", help="ViT-B/16, float32, one round, 2 timed steps")
    parser.add_argument("--name", default="train_step", help="results file name (results/NAME.json, .md)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        result = worker(json.loads(args.worker))
        with open(args.out, "w") as f:
            json.dump(result, f)
        return 0
    if args.quick:
        args.models, args.dtypes, args.rounds, args.steps = ["B16"], ["float32"], 1, 2
    specs = []
    for model in args.models:
        for dtype in args.dtypes:
            for flash in args.flash:
                for remat in args.remat:
                    for side in args.sides:
                        jits = args.torch_jit if side == "keras-torch" else ["-"]
                        for jit in jits:
                            spec = dict(side=side, model=model, dtype=dtype, steps=args.steps, warmup=args.warmup,
                                        threads=args.threads, device=args.device, batch=args.batch,
                                        remat=remat == "on", flash=None if flash == "auto" else flash,
                                        huge_pages=args.huge_pages == "on")
                            if side == "keras-torch":
                                spec["jit"] = jit == "compiled"
                            if side.startswith("keras-") and side != "keras-torch" and args.device == "gpu":
                                spec["jit"] = "recommended"
                            if flash != "auto" and not side.startswith("keras-"):
                                if flash == "off":
                                    continue  # the peers once per flash setting
                                spec["flash"] = None
                            specs.append(spec)
    os.makedirs(RESULTS, exist_ok=True)
    report = dict(machine=machine(), args=vars(args), started=time.strftime("%Y-%m-%d %H:%M:%S"), runs=[])
    json_path, md_path = os.path.join(RESULTS, f"{args.name}.json"), os.path.join(RESULTS, f"{args.name}.md")
    total = len(specs) * args.rounds
    done = 0
    for rnd in range(args.rounds):
        order = specs if rnd % 2 == 0 else specs[::-1]
        for spec in order:
            done += 1
            load = os.getloadavg()
            print(f"[{done}/{total}] round {rnd + 1}: {_label(spec)} {spec['model']} {spec['dtype']} "
                  f"(load {load[0]:.1f}) ...", flush=True)
            result = run_side(spec, args.timeout)
            result.update(spec=spec, round=rnd, load=[round(v, 2) for v in load],
                          load_after=[round(v, 2) for v in os.getloadavg()])
            report["runs"].append(result)
            if "error" in result:
                print(f"    failed: {result['error'][-300:]}", flush=True)
            else:
                print(f"    {result['img_s_best']:.2f} img/s best ({result['img_s_median']:.2f} median), "
                      f"peak RSS {result['peak_rss_mb'] / 1024:.2f} GB, first step {result['first_step_s']:.1f} s, "
                      f"wall {result['wall_s']:.0f} s", flush=True)
            with open(json_path, "w") as f:
                json.dump(report, f, indent=1)
            with open(md_path, "w") as f:
                f.write(table(report["runs"]))
    print(table(report["runs"]))
    print(f"wrote {json_path} and {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
