#!/usr/bin/env python
"""keras_vit against timm and keras-hub, side by side, in one run on this machine's CPU.

    .venv/bin/python benchmarks/benchmark.py            # the full comparison (make bench)
    .venv/bin/python benchmarks/benchmark.py --quick    # a few minutes: fewer contenders and reps
    .venv/bin/python benchmarks/benchmark.py --models dinov2_s14_518,clip_b16,siglip_b16   # timm's zoo

ViT-B/16 at 224: inference images/s at batch 1 and 8 and one training step (SGD momentum,
batch 8) for keras_vit on the JAX, TensorFlow and PyTorch backends, timm (PyTorch eager) and
keras-hub's ViTBackbone + ViTImageClassifier head, in float32 and in bfloat16
(`mixed_bfloat16` for Keras, `torch.autocast` for timm); then int8 (`model.quantize("int8")`)
speed and change of logits, ViT-H/14 build time and peak memory, ViT-L/16 conversion time.

KERAS_BACKEND is fixed when Keras is imported, so every contender runs in its own worker
process (this file with --worker) that prints one JSON line. Workers run one at a time, pinned
to the same cores (taskset) with the same thread count. Contenders are measured round-robin
for --rounds rounds (order reversed every other round); each worker keeps the best of its
timed repetitions, the table keeps the best over rounds, and every ratio is to timm measured
in the same rounds (best / best), with the spread of per-round ratios alongside.
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# ViT-B/16 as every library spells it.
VIT_B16 = dict(image_size=224, patch_size=16, hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072)
VIT_H14 = dict(image_size=224, patch_size=14, hidden_size=1280, num_layers=32, num_heads=16, mlp_dim=5120)
KERAS_BF16 = "mixed_bfloat16"

#: The models --models selects: (keras_vit constructor, timm architecture, image size, classes,
#: pooling without a head). "vit_b16" is the default comparison (with keras-hub, the training step
#: and the extras); the others are inference comparisons of timm's zoo, each against timm's own
#: model of the same architecture (headless ones return their pooled features, as timm's do).
MODELS = {
    "vit_b16": ("ViTB16", "vit_base_patch16_224", 224, 1000, None),
    "dinov2_s14_518": ("DINOv2S14", "vit_small_patch14_dinov2", 518, 0, "token"),
    "clip_b16": ("CLIPB16", "vit_base_patch16_clip_224", 224, 512, None),
    "siglip_b16": ("SigLIPB16", "vit_base_patch16_siglip_224", 224, 0, "map"),
}


def contender(library, backend, dtype, **options):
    label = f"{library}/{backend}/{dtype}" + "".join(f"/{k}={v}" for k, v in sorted(options.items()))
    return dict(id=label, library=library, backend=backend, dtype=dtype, options=options)


def zoo_contenders(models):
    """timm and keras_vit (JAX, TensorFlow) in float32 and bfloat16 for each zoo model of --models.
    JAX's bfloat16 on CPU (no oneDNN path, see `vit_b16_contenders`) times batch 1 only.

    bfloat16 is timed twice for Keras: `mixed_bfloat16` (float32 weights cast on every call) and
    `inference=bfloat16` (`performance.bfloat16_inference`: the weights stored in bfloat16). JAX's
    float32 runs once more with `attention=unchunked` (the attention's queries taken all at once at
    any length, the form before `layers.matmul.CHUNK_QUERIES_ABOVE`), so that a run shows both."""
    out = []
    for model in models:
        for dtype in ("float32", "bfloat16"):
            both = "predict1,predict8"
            jax_tasks = "predict1" if dtype == "bfloat16" else both
            out.append(contender("timm", "torch", dtype, model=model, tasks=both))
            out.append(contender("keras_vit", "jax", dtype, model=model, tasks=jax_tasks))
            out.append(contender("keras_vit", "tensorflow", dtype, model=model, tasks=both))
            if dtype == "bfloat16":
                out.append(contender("keras_vit", "jax", dtype, model=model, inference="bfloat16", tasks=jax_tasks))
                out.append(contender("keras_vit", "tensorflow", dtype, model=model, inference="bfloat16", tasks=both))
            else:
                out.append(contender("keras_vit", "jax", dtype, model=model, attention="unchunked", tasks=jax_tasks))
    return out


def contenders(args):
    """The (library, backend, dtype) workers of the speed table, the main comparisons first
    (a run stopped early still has them): timm and keras_vit's best path per dtype, then the rest."""
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise SystemExit(f"--models: unknown {unknown}; known: {', '.join(MODELS)}")
    out = vit_b16_contenders(args) if "vit_b16" in models else []
    out += zoo_contenders([m for m in models if m != "vit_b16"])
    if args.only:
        import re

        out = [c for c in out if re.search(args.only, c["id"])]
    return out


def vit_b16_contenders(args):
    """ViT-B/16's contenders (see `contenders`)."""
    slow = {} if args.all else dict(tasks="predict1,predict8")
    # bfloat16 training on JAX:CPU: XLA has no AMX/oneDNN path here (bf16 matmuls run ~10x
    # slower than oneDNN's), a step takes minutes; time inference only unless --all.
    out = [
        contender("timm", "torch", "float32"),
        contender("keras_vit", "jax", "float32"),
        contender("keras_vit", "tensorflow", "float32"),
        contender("timm", "torch", "bfloat16"),
        contender("keras_vit", "torch", "bfloat16"),
        contender("keras_vit", "tensorflow", "bfloat16"),
    ]
    if not args.skip_keras_hub:
        out += [contender("keras_hub", "jax", "float32"), contender("keras_hub", "tensorflow", "float32"),
                contender("keras_hub", "tensorflow", "bfloat16")]
    out += [contender("keras_vit", "torch", "float32"), contender("keras_vit", "jax", "bfloat16", **slow)]
    if not args.skip_keras_hub:
        out.append(contender("keras_hub", "jax", "bfloat16", **slow))
        if args.all:
            out += [contender("keras_hub", "torch", "float32"), contender("keras_hub", "torch", "bfloat16")]
    if not args.quick:
        # What the recommended settings are measured against (see README), batch-8 inference
        # only: TensorFlow's XLA path (Keras' default jit_compile="auto" picks it), the eager
        # PyTorch backend (Keras' default there; the recommended setting is torch.compile), and
        # bfloat16 weights (an inference-only policy, no per-call casts of float32 weights).
        out.append(contender("keras_vit", "tensorflow", "float32", jit_compile=True, tasks="predict8"))
        out.append(contender("keras_vit", "torch", "bfloat16", jit_compile=False, tasks="predict8"))
        out.append(contender("keras_vit", "torch", "bfloat16", weights="bfloat16", tasks="predict8"))
        if args.all:
            out.append(contender("keras_vit", "tensorflow", "bfloat16", jit_compile=True, tasks="predict8"))
    return out


# ---------------------------------------------------------------------------------------------
# Worker side: runs inside one process per contender.
# ---------------------------------------------------------------------------------------------


def _rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mb():
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _set_threads(backend_library, threads):
    """The same thread count for every framework (called before any op runs)."""
    if backend_library in ("tensorflow",):
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)
    if backend_library == "torch":
        import torch

        torch.set_num_threads(threads)


def _time(fn, reps, warmup):
    """(first call seconds, best seconds, median seconds) of `fn` over `reps` timed calls."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return first, times[0], times[len(times) // 2]


def _images(batch, seed=0, size=224):
    """A smooth, image-like input in [-1, 1] (gradients, a disc and stripes) rather than noise."""
    import numpy as np

    r = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / (size - 1.0)
    out = np.empty((batch, size, size, 3), "float32")
    for i in range(batch):
        cy, cx, rad = r.uniform(0.3, 0.7), r.uniform(0.3, 0.7), r.uniform(0.15, 0.35)
        disc = ((yy - cy) ** 2 + (xx - cx) ** 2 < rad**2).astype("float32")
        stripes = np.sin(2 * np.pi * r.uniform(3, 12) * (xx * r.uniform(-1, 1) + yy))
        for c in range(3):
            a, b, d = r.uniform(-1, 1, 3)
            out[i, :, :, c] = np.clip(0.5 * a * (xx - 0.5) + 0.5 * b * yy + 0.6 * d * disc + 0.2 * stripes, -1, 1)
    return out


def _model_name(spec):
    return spec["options"].get("model", "vit_b16")


def _keras_model(spec):
    lib = spec["library"]
    if lib == "keras_vit" and _model_name(spec) != "vit_b16":
        import keras_vit

        constructor, _, size, classes, pooling = MODELS[_model_name(spec)]
        return getattr(keras_vit, constructor)(weights=None, input_shape=(size, size, 3), include_top=bool(classes),
                                               classes=classes or 1000, pooling=pooling, classifier_activation=None)
    if lib == "keras_vit":
        import keras_vit

        return keras_vit.VisionTransformer(**VIT_B16, classes=1000, classifier_activation=None, name="vit_b16")
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(224, 224, 3), patch_size=16, num_layers=12, num_heads=12, hidden_dim=768, mlp_dim=3072
    )
    return keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=1000, preprocessor=None)


def _jit_compile(spec):
    if "jit_compile" in spec["options"]:
        return bool(spec["options"]["jit_compile"])
    import keras_vit.performance

    return keras_vit.performance.recommended_jit_compile(dtype_policy=_keras_policy(spec))


def _keras_policy(spec):
    if spec["dtype"] == "float32" or spec["options"].get("inference") == "bfloat16":
        return "float32"  # inference=bfloat16: a float32 model, converted by performance.bfloat16_inference
    return "bfloat16" if spec["options"].get("weights") == "bfloat16" else KERAS_BF16


def worker_speed(spec):
    """Inference at batch 1 and 8 and a training step at batch 8; images per second."""
    import numpy as np

    tasks, reps = spec["tasks"], spec["reps"]
    result = dict(rss_start_mb=_rss_mb())
    _, timm_name, size, classes, _ = MODELS[_model_name(spec)]
    x8 = _images(8, size=size)
    y8 = np.random.default_rng(1).integers(0, max(classes, 1), 8)
    t0 = time.perf_counter()
    if spec["library"] == "timm":
        import timm
        import torch

        bf16 = spec["dtype"] == "bfloat16"
        model = timm.create_model(timm_name, pretrained=False, num_classes=classes, img_size=size)
        result["build_s"] = time.perf_counter() - t0
        xt = torch.from_numpy(x8).permute(0, 3, 1, 2).contiguous()
        yt = torch.from_numpy(y8)

        def infer(batch):
            model.eval()
            with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                model(xt[:batch])

        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
        loss_fn = torch.nn.CrossEntropyLoss()

        def train():
            model.train()
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = loss_fn(model(xt), yt)
            loss.backward()
            opt.step()

        infer_fns = {b: (lambda b=b: infer(b)) for b in (1, 8)}
    else:
        import keras

        keras.config.set_dtype_policy(_keras_policy(spec))
        model = _keras_model(spec)
        if spec["options"].get("inference") == "bfloat16":
            import keras_vit.performance

            model = keras_vit.performance.bfloat16_inference(model)
        if spec["options"].get("attention") == "unchunked":
            from keras_vit.layers import matmul

            matmul.CHUNK_QUERIES_ABOVE = 1 << 30
        result["build_s"] = time.perf_counter() - t0
        jit = _jit_compile(spec)
        result["jit_compile"] = jit
        model.compile(
            optimizer=keras.optimizers.SGD(1e-3, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit,
        )
        xs = {1: x8[:1], 8: x8}
        infer_fns = {b: (lambda b=b: model.predict_on_batch(xs[b])) for b in (1, 8)}

        def train():
            model.train_on_batch(x8, y8)

    for task in tasks:
        if task == "predict1":
            fn, batch, n, warm = infer_fns[1], 1, reps * 3, 2
        elif task == "predict8":
            fn, batch, n, warm = infer_fns[8], 8, reps, 1
        elif task == "train8":
            fn, batch, n, warm = train, 8, max(1, reps - 1), 1
        else:
            raise ValueError(f"unknown task {task!r}")
        first, best, median = _time(fn, n, warm)
        result[task] = dict(ips=batch / best, ips_median=batch / median, first_call_s=first, reps=n)
    result["peak_rss_mb"] = _peak_rss_mb()
    return result


def worker_int8(spec):
    """keras_vit ViT-B/16 quantized with model.quantize("int8"): speed and change of logits."""
    import numpy as np

    model = _keras_model(spec)
    r = np.random.default_rng(0)
    # The head is zero-initialised; give it weights so the logits carry signal to compare.
    head = model.get_layer("head")
    head.kernel.assign(r.normal(0, 0.05, tuple(head.kernel.shape)).astype("float32"))
    x = _images(8, seed=3)
    jit = _jit_compile(spec)
    model.compile(jit_compile=jit)
    ref = np.asarray(model.predict_on_batch(x), "float64")
    _, f32_best, _ = _time(lambda: model.predict_on_batch(x), spec["reps"], 1)
    t0 = time.perf_counter()
    model.quantize("int8")  # VisionTransformer.quantize: no warnings for the norms and tokens
    quantize_s = time.perf_counter() - t0
    model.compile(jit_compile=jit)
    out = np.asarray(model.predict_on_batch(x), "float64")
    _, q_best, _ = _time(lambda: model.predict_on_batch(x), spec["reps"], 1)
    quantized = sorted(
        {layer.path for layer in model._flatten_layers() if "int8" in str(layer.dtype_policy.name)}
    )
    diff = np.abs(out - ref)
    return dict(
        float32_ips=8 / f32_best,
        int8_ips=8 / q_best,
        quantize_s=quantize_s,
        max_abs_change=float(diff.max()),
        mean_abs_change=float(diff.mean()),
        logit_std=float(ref.std()),
        top1_agreement=float(np.mean(out.argmax(-1) == ref.argmax(-1))),
        top5_overlap=float(
            np.mean([len(set(a) & set(b)) / 5 for a, b in zip(np.argsort(-out)[:, :5], np.argsort(-ref)[:, :5])])
        ),
        quantized_layers=len(quantized),
        quantized_names=sorted({n.split("/")[-1] for n in quantized}),
        jit_compile=jit,
    )


def worker_build_h14(spec):
    """Time and peak memory to build ViT-H/14 (632M parameters) with random weights."""
    import gc

    start = _rss_mb()
    t0 = time.perf_counter()
    if spec["library"] == "timm":
        import timm

        model = timm.create_model("vit_huge_patch14_224", pretrained=False)
        params = sum(p.numel() for p in model.parameters())
    elif spec["library"] == "keras_vit":
        import keras_vit

        model = keras_vit.ViTH14(weights=None)
        params = model.count_params()
    else:
        import keras_hub

        backbone = keras_hub.models.ViTBackbone(
            image_shape=(224, 224, 3), patch_size=14, num_layers=32, num_heads=16, hidden_dim=1280, mlp_dim=5120
        )
        model = keras_hub.models.ViTImageClassifier(backbone=backbone, num_classes=1000, preprocessor=None)
        params = model.count_params()
    build_s = time.perf_counter() - t0
    del model
    gc.collect()
    return dict(build_s=build_s, params=int(params), rss_before_mb=start, peak_rss_mb=_peak_rss_mb())


def worker_convert_l16(spec):
    """keras_vit.load_checkpoint on a timm ViT-L/16 folder (model.safetensors + config.json)."""
    import numpy as np

    try:
        import keras_vit

        load_checkpoint = keras_vit.load_checkpoint
    except (ImportError, AttributeError) as err:
        return dict(missing=f"keras_vit.load_checkpoint not available: {err}")
    folder = spec["folder"]
    start = _rss_mb()
    t0 = time.perf_counter()
    model = load_checkpoint(folder, classifier_activation=None)
    convert_s = time.perf_counter() - t0
    x = _images(1, seed=5)
    out = np.asarray(model.predict_on_batch(x), "float64")
    ref = np.load(os.path.join(folder, "reference_logits.npy"))
    return dict(
        convert_s=convert_s,
        params=int(model.count_params()),
        rss_before_mb=start,
        peak_rss_mb=_peak_rss_mb(),
        max_abs_diff_vs_timm=float(np.abs(out - ref).max()),
        rel_diff_vs_timm=float(np.abs(out - ref).max() / np.abs(ref).max()),
    )


def worker_make_l16(spec):
    """A timm-layout ViT-L/16 repo folder with random weights and timm's logits for one image."""
    import numpy as np
    import timm
    import torch
    from safetensors.torch import save_file

    folder = spec["folder"]
    torch.manual_seed(0)
    model = timm.create_model("vit_large_patch16_224", pretrained=False).eval()
    # timm zero-initialises nothing that matters here, but make the head non-trivial anyway.
    with torch.no_grad():
        model.head.weight.normal_(0, 0.02)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "model.safetensors"))
    config = dict(architecture="vit_large_patch16_224", num_classes=1000, num_features=1024, global_pool="token",
                  pretrained_cfg=dict(input_size=[3, 224, 224], mean=[0.5] * 3, std=[0.5] * 3, num_classes=1000))
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    x = _images(1, seed=5)
    with torch.inference_mode():
        ref = model(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).double().numpy()
    np.save(os.path.join(folder, "reference_logits.npy"), ref)
    return dict(folder=folder)


def worker_main(spec):
    threads = spec["threads"]
    backend = spec["backend"]
    _set_threads(backend, threads)
    if spec["library"] in ("keras_vit", "keras_hub") and backend == "jax":
        # keras_vit and keras-hub import TensorFlow too (tf.data); keep its pools at the same size.
        # Not under torch: configuring TensorFlow's pools in a process that runs torch's oneDNN
        # kernels crashes it (SIGSEGV in the int8 path, reproduced with a 2-layer model).
        try:
            _set_threads("tensorflow", threads)
        except Exception:
            pass
    kind = spec["kind"]
    fn = {"speed": worker_speed, "int8": worker_int8, "build_h14": worker_build_h14,
          "convert_l16": worker_convert_l16, "make_l16": worker_make_l16}[kind]
    return fn(spec)


# ---------------------------------------------------------------------------------------------
# Driver side.
# ---------------------------------------------------------------------------------------------


def run_worker(spec, args, timeout=3600):
    env = dict(os.environ)
    env.update(
        KERAS_BACKEND=spec["backend"],
        TF_CPP_MIN_LOG_LEVEL="3",
        OMP_NUM_THREADS=str(args.threads),
        MKL_NUM_THREADS=str(args.threads),
        XLA_FLAGS=(env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=true "
                   f"intra_op_parallelism_threads={args.threads}").strip(),
        PYTHONWARNINGS="ignore",
    )
    spec = dict(spec, threads=args.threads)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", json.dumps(spec)]
    if shutil.which("taskset") and args.cores:
        cmd = ["taskset", "-c", args.cores] + cmd
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout} s")
    wall = time.perf_counter() - t0
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            out = json.loads(line)
            out["wall_s"] = wall
            return out
    return dict(error=f"worker exited {proc.returncode}: {proc.stderr[-1500:]}", wall_s=wall)


def load_average():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def machine_description():
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        flags = open("/proc/cpuinfo").read()
        isa = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "amx_int8") if f" {f}" in flags]
    except OSError:
        isa = []
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f"{int(f.readline().split()[1]) / 1024**2:.0f} GiB RAM"
    except OSError:
        pass
    versions = {}
    for name in ("keras", "jax", "tensorflow", "torch", "timm", "keras_hub"):
        try:
            from importlib.metadata import version

            versions[name] = version(name.replace("_", "-") if name == "keras_hub" else name)
        except Exception:
            versions[name] = "not installed"
    try:
        from importlib.metadata import version

        versions["tensorflow"] = version("tensorflow-cpu")
    except Exception:
        pass
    return dict(cpu=cpu, cores=os.cpu_count(), isa=isa, memory=mem, python=platform.python_version(),
                versions=versions, gpu="none")


def summarise(speed_runs, specs, tasks):
    """Best over rounds, and ratios to timm of the same dtype (best/best, per-round min-max)."""
    rows = []
    for spec in specs:
        row = dict(id=spec["id"], library=spec["library"], backend=spec["backend"], dtype=spec["dtype"],
                   options=spec["options"])
        # timm's contender of the same dtype and model.
        ref_id = next((s["id"] for s in specs if s["library"] == "timm" and s["dtype"] == spec["dtype"]
                       and s["options"].get("model") == spec["options"].get("model")), f"timm/torch/{spec['dtype']}")
        for task in tasks:
            vals, ratios = [], []
            for rnd in speed_runs:
                mine, ref = rnd.get(spec["id"], {}), rnd.get(ref_id, {})
                if task in mine:
                    vals.append(mine[task]["ips"])
                    if task in ref:
                        ratios.append(mine[task]["ips"] / ref[task]["ips"])
            refs = [rnd[ref_id][task]["ips"] for rnd in speed_runs if task in rnd.get(ref_id, {})]
            if vals:
                row[task] = max(vals)
                row[task + "_ratio"] = max(vals) / max(refs) if refs else None
                row[task + "_round_ratios"] = ratios
        errors = [rnd[spec["id"]]["error"] for rnd in speed_runs if "error" in rnd.get(spec["id"], {})]
        if errors:
            row["error"] = errors[-1][-300:]
        rows.append(row)
    return rows


def _short_error(text):
    """The last informative line of a worker's error, for a table cell."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip() and not line.startswith(("WARNING", "I0000"))]
    return (lines[-1] if lines else str(text).strip())[:160].replace("|", "/")


def markdown(report):
    lines = []
    m = report["machine"]
    lines.append(f"Machine: {m['cpu']}, {m['cores']} cores ({', '.join(m['isa'])}), {m['memory']}, "
                 f"GPU: {m['gpu']}. Threads per contender: {report['threads']}; "
                 f"{report['rounds']} round(s); load average during the run "
                 f"{report['load_start'][0]:.1f} -> {report['load_end'][0]:.1f}.")
    lines.append("Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()))
    lines.append("")
    tasks = report["tasks"]
    head = "| contender | " + " | ".join(f"{t} img/s (x timm)" for t in tasks) + " |"
    lines.append(head)
    lines.append("|" + "---|" * (len(tasks) + 1))
    for row in report["speed"]:
        cells = []
        for t in tasks:
            if t in row:
                r = row.get(t + "_ratio")
                rr = row.get(t + "_round_ratios") or []
                spread = f" [{min(rr):.2f}-{max(rr):.2f}]" if len(rr) > 1 else ""
                cells.append(f"{row[t]:.2f} ({r:.2f}{spread})" if r else f"{row[t]:.2f}")
            else:
                cells.append("error" if "error" in row else "-")
        lines.append(f"| {row['id']} | " + " | ".join(cells) + " |")
    if report.get("int8"):
        lines.append("")
        lines.append("| keras_vit int8 (ViT-B/16, batch 8) | float32 img/s | int8 img/s | max abs dlogit | "
                     "mean abs dlogit | logit std | top-1 agree | top-5 overlap | quantized layers |")
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for backend, r in report["int8"].items():
            if "error" in r:
                lines.append(f"| {backend} | error: {_short_error(r['error'])} |")
                continue
            lines.append(
                f"| {backend} | {r['float32_ips']:.2f} | {r['int8_ips']:.2f} | {r['max_abs_change']:.4f} | "
                f"{r['mean_abs_change']:.4f} | {r['logit_std']:.3f} | {r['top1_agreement']:.2f} | "
                f"{r['top5_overlap']:.2f} | {r['quantized_layers']} ({', '.join(r['quantized_names'])}) |"
            )
    if report.get("build_h14"):
        lines.append("")
        lines.append("| ViT-H/14 build (random weights) | seconds | peak RSS MiB | RSS before MiB | parameters |")
        lines.append("|---|---|---|---|---|")
        for key, r in report["build_h14"].items():
            if "error" in r:
                lines.append(f"| {key} | error: {_short_error(r['error'])} |")
                continue
            lines.append(f"| {key} | {r['build_s']:.1f} | {r['peak_rss_mb']:.0f} | {r['rss_before_mb']:.0f} | "
                         f"{r['params']:,} |")
    if report.get("convert_l16"):
        r = report["convert_l16"]
        lines.append("")
        if "convert_s" in r:
            lines.append(
                f"ViT-L/16 conversion (keras_vit.load_checkpoint on a timm model.safetensors folder, "
                f"{r['params']:,} parameters, jax): {r['convert_s']:.1f} s, peak RSS {r['peak_rss_mb']:.0f} MiB; "
                f"max |logit - timm| {r['max_abs_diff_vs_timm']:.2e} (relative {r['rel_diff_vs_timm']:.1e})."
            )
        else:
            lines.append(f"ViT-L/16 conversion: {r.get('missing') or r.get('error')}")
    return "\n".join(lines)


def extras(args, report, reps, save):
    """int8 quantization, ViT-H/14 build, ViT-L/16 conversion: once per run."""
    report["int8"] = {}
    for backend in ("jax", "tensorflow", "torch"):
        spec = contender("keras_vit", backend, "float32")
        out = run_worker(dict(spec, kind="int8", reps=reps), args)
        report["int8"][backend] = out
        print(f"[int8] {backend}: {json.dumps(out)[:300]}", flush=True)
        save()
    report["build_h14"] = {}
    for lib, backend in (("keras_vit", "jax"), ("keras_vit", "tensorflow"), ("timm", "torch"), ("keras_hub", "jax")):
        if lib == "keras_hub" and args.skip_keras_hub:
            continue
        out = run_worker(dict(contender(lib, backend, "float32"), kind="build_h14"), args)
        report["build_h14"][f"{lib}/{backend}"] = out
        print(f"[ViT-H/14 build] {lib}/{backend}: {json.dumps(out)[:300]}", flush=True)
        save()
    folder = tempfile.mkdtemp(prefix="vit_l16_timm_")
    try:
        out = run_worker(dict(contender("timm", "torch", "float32"), kind="make_l16", folder=folder), args)
        if "error" not in out:
            out = run_worker(dict(contender("keras_vit", "jax", "float32"), kind="convert_l16", folder=folder), args)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report["convert_l16"] = out
    print(f"[ViT-L/16 conversion] {json.dumps(out)[:300]}", flush=True)
    save()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="inference only, 1 round, 2 reps, no extras (about 10 minutes on an idle 2-core machine, plus ~1.5 minutes of torch.compile per PyTorch-backend worker)")
    parser.add_argument("--rounds", type=int, default=None, help="round-robin rounds (default 2, quick 1)")
    parser.add_argument("--reps", type=int, default=None, help="timed repetitions per task (default 3, quick 2)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="threads for every contender")
    parser.add_argument("--cores", default=None, help="taskset core list (default 0-<threads-1>)")
    parser.add_argument("--tasks", default="predict1,predict8,train8")
    parser.add_argument("--models", default="vit_b16",
                        help=f"comma-separated models to compare ({', '.join(MODELS)}); models other than vit_b16 "
                             "time inference against timm's own model (float32 and bfloat16, JAX and TensorFlow)")
    parser.add_argument("--only", default=None, help="regex on contender ids, e.g. 'keras_vit|timm'")
    parser.add_argument("--train-rounds", type=int, default=1,
                        help="rounds that also time the training step (it dominates the run time)")
    parser.add_argument("--all", action="store_true",
                        help="also keras-hub on the torch backend and TensorFlow-XLA in bfloat16")
    parser.add_argument("--skip-keras-hub", action="store_true")
    parser.add_argument("--skip-extras", action="store_true", help="no int8, ViT-H/14 build, ViT-L/16 conversion")
    parser.add_argument("--extras-only", action="store_true", help="only int8, ViT-H/14 build, ViT-L/16 conversion")
    parser.add_argument("--output", default=os.path.join(HERE, "results"), help="folder for JSON and Markdown")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        spec = json.loads(args.worker)
        print(json.dumps(worker_main(spec)), flush=True)
        return 0

    rounds = args.rounds or (1 if args.quick else 2)
    reps = args.reps or (2 if args.quick else 3)
    args.cores = args.cores or f"0-{args.threads - 1}"
    tasks = args.tasks.split(",")
    if args.quick and args.tasks == "predict1,predict8,train8":
        tasks = ["predict1", "predict8"]
    specs = contenders(args)
    try:
        import keras_hub  # noqa: F401
    except ImportError:
        if not args.skip_keras_hub:
            print("keras-hub is not installed (pip install keras-hub --no-deps, see README); skipping it.")
            specs = [s for s in specs if s["library"] != "keras_hub"]

    report = dict(started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  machine=machine_description(), threads=args.threads, rounds=rounds, reps=reps, tasks=tasks,
                  load_start=load_average(), quick=args.quick)
    print(f"{len(specs)} contenders x {rounds} round(s), tasks {tasks}, {args.threads} threads on cores "
          f"{args.cores}; load {report['load_start'][0]:.1f}", flush=True)
    os.makedirs(args.output, exist_ok=True)
    stamp = report["started"].replace(":", "").replace("+00:00", "Z")
    speed_runs = []

    def save():
        """Write the report so far (a long run that is stopped still leaves its table)."""
        report["speed_runs"] = speed_runs
        report["speed"] = summarise(speed_runs, specs, tasks)
        report["load_end"] = load_average()
        report["finished"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        with open(os.path.join(args.output, f"bench-{stamp}.json"), "w") as f:
            json.dump(report, f, indent=1)
        table = markdown(report)
        with open(os.path.join(args.output, "latest.md"), "w") as f:
            f.write(f"Run started {report['started']}, last result {report['finished']}.\n\n{table}\n")
        return table

    def speed_round(rnd):
        order = specs if rnd % 2 == 0 else specs[::-1]
        results = {}
        speed_runs.append(results)
        for spec in order:
            mine = [t for t in tasks if t in spec["options"].get("tasks", t).split(",")]
            if rnd >= args.train_rounds:
                mine = [t for t in mine if not t.startswith("train")]
            if not mine:
                continue
            out = run_worker(dict(spec, kind="speed", tasks=mine, reps=reps), args)
            out["load"] = load_average()[0]
            results[spec["id"]] = out
            msg = out.get("error", "")[:200] or "  ".join(f"{t} {out[t]['ips']:.2f}" for t in tasks if t in out)
            print(f"[round {rnd + 1}] {spec['id']:<50} {msg}  ({out.get('wall_s', 0):.0f} s, load "
                  f"{out['load']:.1f})", flush=True)
            save()

    # Round 1 (with the training step), then the one-off measurements, then the remaining
    # inference rounds, so that the repeated rounds run last.
    if args.extras_only:
        extras(args, report, reps, save)
        return 0
    speed_round(0)
    if not args.skip_extras and not args.quick and "vit_b16" in args.models.split(","):
        extras(args, report, reps, save)
    for rnd in range(1, rounds):
        speed_round(rnd)
    table = save()
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
