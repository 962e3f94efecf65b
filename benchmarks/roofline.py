"""Where a ViT-B/16's time goes on each backend, against the best matmul rate of the same run.

    .venv/bin/python benchmarks/roofline.py                         # JAX, TensorFlow, PyTorch; float32
    .venv/bin/python benchmarks/roofline.py --dtypes float32 mixed_bfloat16 --train
    .venv/bin/python benchmarks/roofline.py --backends jax --rounds 3 --readme benchmarks/README.md
    git archive OLD keras_vit | tar -x -C /tmp/old        # another commit's keras_vit, for a before/after
    .venv/bin/python benchmarks/roofline.py --backends jax --keras-vit-from /tmp/old

One process per backend and dtype policy. In it, for batch 8 at 224 px:

- the best rate of the backend's own plain matmul on ViT-B/16's three matmul shapes (the
  roofline: a ViT is >95% matmul FLOPs); on PyTorch in float32 both of its kernels, MKL's
  `torch.mm` and oneDNN's;
- the model's inference (`predict_on_batch`, `jit_compile=performance.recommended_jit_compile()`)
  and, with --train, one SGD-momentum train step (`train_on_batch`, 3x the forward FLOPs);
- on PyTorch, timm's vit_base_patch16_224 beside it (eager, `inference_mode`, autocast under
  mixed_bfloat16);
- the pieces of one encoder block, each compiled alone the way the backend runs the model (a
  `jax.jit`, a `tf.function`; eager on PyTorch) with the model's own functions
  (`layers.matmul.matmul_add`, `dot_product_attention`, `gelu`, Keras' LayerNormalization): the
  projections and MLP matmuls by shape, attention (its two batched products, softmax and the
  head transposes it makes), the softmax alone, LayerNorm, GELU and the residual adds. Times 12
  blocks plus the patch embedding, their sum set against the model's time leaves "fusion,
  layout and dispatch" (negative when the compiled model fuses pieces that ran apart here);
- with --train, the same pieces' forward and backward passes (the gradients with respect to every
  input, the patch embedding's kernel only; a `jax.jit` of `jax.vjp`, a `tf.function` with a
  GradientTape, eager `backward()` on PyTorch), set against the train step in a second table
  whose remainder is the optimizer, the weight casts, fusion, layout and dispatch.

Every timed call alternates with the others round by round (the machine's drift hits all
alike); the best of --rounds is kept and the load average printed. The whole models' calls run
twice back to back in each round and the second is timed, as in a loop of steps: a PyTorch train
step timed right after the eager pieces ran 1.3-1.8 s where consecutive steps ran 1.30-1.40
(mixed_bfloat16, AMD EPYC family 26). The table's "of matmul" is
GFLOP/s against the best matmul rate measured in that same process. With --readme the tables
for this CPU replace the ones between `<!-- roofline: CPU -->` and `<!-- /roofline -->` in the
file (a CPU not seen before gets its section after the last CPU's).

Workers start with glibc's malloc on transparent huge pages where that changes something
(`keras_vit.huge_pages`, what `keras-vit finetune` does; --huge-pages off for 4 KiB pages); each
table's heading says which.
"""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import time

B, T, HID, HEADS, MLP, DEPTH, CLASSES = 8, 197, 768, 12, 3072, 12, 1000
ROWS = B * T
MATMULS = {  # name: (m, k, n, calls per block)
    "qkv projections": (ROWS, HID, HID, 3),
    "out projection": (ROWS, HID, HID, 1),
    "MLP in": (ROWS, HID, MLP, 1),
    "MLP out": (ROWS, MLP, HID, 1),
}
ROOF_SHAPES = [(ROWS, HID, MLP), (ROWS, MLP, HID), (ROWS, HID, HID)]


def forward_flops():
    """FLOPs of one ViT-B/16 image forward (multiply-adds x 2): patch conv, 12 blocks, head."""
    per_block = sum(2 * T * k * n * c for _, k, n, c in MATMULS.values()) + 2 * 2 * T * T * HID
    return 2 * (T - 1) * 16 * 16 * 3 * HID + DEPTH * per_block + 2 * HID * CLASSES


def cpu_model():
    with open("/proc/cpuinfo") as f:
        text = f.read()
    name = re.search(r"model name\s*:\s*(.*)", text).group(1).strip()
    flags = set(re.search(r"flags\s*:\s*(.*)", text).group(1).split())
    extras = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    # A virtual machine's model name can be the vendor's family name alone ("AMD EPYC"), the same
    # for CPUs of twice the vector width: the family and model numbers tell them apart.
    family, model = (re.search(rf"^{key}\s*:\s*(\d+)", text, flags=re.M) for key in ("cpu family", "model"))
    generation = f" (family {family.group(1)}, model {model.group(1)})" if family and model else ""
    return f"{name}{generation}, {os.cpu_count()} CPUs, {' '.join(extras) or 'no AVX-512'}"


# === The worker: one backend and dtype policy ===

MODEL_CALLS = ("model inference", "model train step", "timm inference")


def _backend_tools(backend):
    """(compile(fn), sync(result), to_tensor(ndarray, dtype)) for the backend."""
    from keras import ops

    if backend == "jax":
        import jax

        return jax.jit, lambda y: jax.block_until_ready(y), lambda a, dt: ops.cast(ops.convert_to_tensor(a), dt)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function, lambda y: [t.numpy() for t in tf.nest.flatten(y)], lambda a, dt: ops.cast(a, dt)
    import torch

    def eager(fn):
        def run(*args):
            with torch.inference_mode():
                return fn(*args)

        return run

    return eager, lambda y: y, lambda a, dt: ops.cast(ops.convert_to_tensor(a), dt)


def _gradient_tool(backend):
    """grad(fn) -> a compiled callable of (*inputs, upstream) giving `fn`'s output and its
    gradients with respect to its inputs for that upstream gradient: `fn`'s forward and backward
    pass, compiled the way the backend runs the train step (`jax.jit`, `tf.function`; eager on
    PyTorch)."""
    if backend == "jax":
        import jax

        def grad(fn):
            def run(*args):
                y, pullback = jax.vjp(fn, *args[:-1])
                return y, pullback(args[-1])  # the forward's output too: XLA would drop it otherwise

            return jax.jit(run)

        return grad
    if backend == "tensorflow":
        import tensorflow as tf

        def grad(fn):
            @tf.function
            def run(*args):
                inputs = list(args[:-1])
                with tf.GradientTape() as tape:
                    tape.watch(inputs)
                    y = fn(*inputs)
                return y, tape.gradient(y, inputs, output_gradients=args[-1])

            return run

        return grad

    def grad(fn):
        def run(*args):
            inputs = [a.detach().requires_grad_(True) for a in args[:-1]]
            y = fn(*inputs)
            y.backward(args[-1])
            return y, [a.grad for a in inputs]

        return run

    return grad


def _plain_matmul(backend, dtype):
    """The backend's own matmul of two `dtype` matrices (bfloat16 accumulating in float32 where
    the backend allows it), the roofline's kernel."""
    if backend == "jax":
        import jax
        import jax.numpy as jnp

        if dtype == "bfloat16":
            return jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
        return jax.jit(jnp.matmul)
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(tf.matmul)
    import torch

    return torch.mm


def _torch_onednn_matmul():
    """oneDNN's float32 matmul in PyTorch (`torch.ops.mkldnn._linear_pointwise`), or None."""
    import torch

    if not torch.backends.mkldnn.is_available():
        return None
    return lambda a, b: torch.ops.mkldnn._linear_pointwise(a, b.t(), None, "none", [], "")


def worker(backend, policy, rounds, train):
    import keras
    import numpy as np
    from keras import ops

    keras.config.set_dtype_policy(policy)
    import keras_vit
    from keras_vit import performance

    source = os.path.dirname(os.path.dirname(os.path.abspath(keras_vit.__file__)))
    commit = subprocess.run(["git", "-C", source, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    from keras_vit.layers.matmul import dot_product_attention, gelu, matmul_add

    dtype = keras.config.dtype_policy().compute_dtype
    compile_fn, sync, tensor = _backend_tools(backend)
    rng = np.random.default_rng(0)

    def rand(*shape):
        return tensor(rng.standard_normal(shape, dtype="float32") * 0.1, dtype)

    calls = {}  # name: (callable, count per model call, flops per call or 0)
    mm = _plain_matmul(backend, dtype)
    onednn = _torch_onednn_matmul() if backend == "torch" and dtype == "float32" else None
    for m, k, n in ROOF_SHAPES:
        a, b = rand(m, k), rand(k, n)
        calls[f"matmul {m}x{k}x{n}"] = ((lambda a=a, b=b: sync(mm(a, b))), 0, 2 * m * k * n)
        if onednn:  # PyTorch's float32 matmul is MKL's; its oneDNN one can be faster (AMD)
            calls[f"matmul {m}x{k}x{n} oneDNN"] = ((lambda a=a, b=b: sync(onednn(a, b))), 0, 2 * m * k * n)
    for name, (m, k, n, count) in MATMULS.items():
        f = compile_fn(matmul_add)
        x, w, bias = rand(m, k), rand(k, n), rand(n)
        calls[name] = ((lambda f=f, x=x, w=w, bias=bias: sync(f(x, w, bias))), DEPTH * count, 2 * m * k * n)
    q = rand(B, T, HEADS, HID // HEADS)
    attend = compile_fn(lambda q, k, v: dot_product_attention(q, k, v, 0.125))
    calls["attention (products, softmax, transposes)"] = ((lambda: sync(attend(q, q, q))), DEPTH, 4 * B * T * T * HID)
    logits = rand(B, HEADS, T, T)
    softmax = compile_fn(lambda x: ops.softmax(ops.cast(x, "float32"), axis=-1))
    calls["  of which softmax (float32)"] = ((lambda: sync(softmax(logits))), 0, 0)
    heads = compile_fn(lambda x: ops.transpose(x, (0, 2, 1, 3)))
    calls["  of which one head transpose"] = ((lambda: sync(heads(q))), 0, 0)
    norm = keras.layers.LayerNormalization(epsilon=1e-6)
    norm.build((ROWS, HID))
    tokens = rand(ROWS, HID)
    layer_norm = compile_fn(lambda x: norm(x))
    calls["LayerNorm"] = ((lambda: sync(layer_norm(tokens))), 2 * DEPTH + 1, 0)
    hidden = rand(ROWS, MLP)
    act = compile_fn(lambda x: gelu(x, approximate=True))
    calls["GELU (tanh)"] = ((lambda: sync(act(hidden))), DEPTH, 0)
    add = compile_fn(lambda x, y: x + y)
    calls["residual add"] = ((lambda: sync(add(tokens, tokens))), 2 * DEPTH, 0)
    images = rng.random((B, 224, 224, 3), dtype="float32")
    patches = tensor(images, dtype)
    kernel = rand(16, 16, 3, HID)
    embed = compile_fn(lambda x, w: ops.conv(x, w, strides=16, padding="valid"))
    calls["patch embedding"] = ((lambda: sync(embed(patches, kernel))), 1, 2 * (T - 1) * 16 * 16 * 3 * HID * B)

    if train:  # each piece's forward and backward pass, the upstream gradient a random tensor
        grad = _gradient_tool(backend)
        for name, (m, k, n, count) in MATMULS.items():
            f = grad(matmul_add)
            x, w, bias, up = rand(m, k), rand(k, n), rand(n), rand(m, n)
            calls[f"{name} (train)"] = (
                (lambda f=f, x=x, w=w, bias=bias, up=up: sync(f(x, w, bias, up))), DEPTH * count, 6 * m * k * n
            )
        f = grad(lambda q, k, v: dot_product_attention(q, k, v, 0.125))
        up = rand(B, T, HEADS, HID // HEADS)
        calls["attention (train)"] = ((lambda f=f, up=up: sync(f(q, q, q, up))), DEPTH, 12 * B * T * T * HID)
        f = grad(lambda x: norm(x))
        calls["LayerNorm (train)"] = ((lambda f=f: sync(f(tokens, tokens))), 2 * DEPTH + 1, 0)
        f = grad(lambda x: gelu(x, approximate=True))
        calls["GELU (tanh) (train)"] = ((lambda f=f: sync(f(hidden, hidden))), DEPTH, 0)
        f = grad(lambda x, y: x + y)
        calls["residual add (train)"] = ((lambda f=f: sync(f(tokens, tokens, tokens))), 2 * DEPTH, 0)
        f = grad(lambda w: ops.conv(patches, w, strides=16, padding="valid"))  # no gradient for the images
        up = rand(B, 14, 14, HID)
        calls["patch embedding (train)"] = (
            (lambda f=f, up=up: sync(f(kernel, up))), 1, 2 * 2 * (T - 1) * 16 * 16 * 3 * HID * B
        )

    model = keras_vit.ViTB16(weights=None)
    jit = performance.recommended_jit_compile()
    model.compile(jit_compile=jit)
    calls["model inference"] = ((lambda: model.predict_on_batch(images)), 0, forward_flops() * B)
    if train:
        trained = keras_vit.ViTB16(weights=None)
        trained.compile(
            optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=jit,
        )
        labels = np.arange(B) % CLASSES
        calls["model train step"] = ((lambda: trained.train_on_batch(images, labels)), 0, 3 * forward_flops() * B)
    if backend == "torch":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from ab_inprocess import TimmModel

        timm = TimmModel()
        calls["timm inference"] = ((lambda: timm.predict_on_batch(images)), 0, forward_flops() * B)

    for _ in range(2):  # compile and warm up, twice round: one model's compile can make another's recompile
        for fn, _, _ in calls.values():
            fn()
    best = {name: float("inf") for name in calls}
    loads = []
    names = list(calls)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            if name in MODEL_CALLS:  # a step follows a step in a training loop: the second of two is timed
                calls[name][0]()
            start = time.perf_counter()
            calls[name][0]()
            best[name] = min(best[name], time.perf_counter() - start)
        loads.append(os.getloadavg()[0])
    return {
        "backend": backend, "policy": policy, "jit_compile": jit, "loads": loads,
        "huge_pages": huge_pages_module().started_with_huge_pages(),
        "commit": commit.stdout.strip() or source,
        "rows": [
            {"name": n, "seconds": best[n], "count": calls[n][1], "flops": calls[n][2], "train": n.endswith(" (train)")}
            for n in names
        ],
    }


# === The table ===


def table(result, roof_all):
    """Markdown rows of one worker's result; `roof_all` the best matmul rate of every worker of
    that dtype (all backends). With train-step pieces, a second table splits the train step."""
    rows = {r["name"]: r for r in result["rows"]}
    roof = max(r["flops"] / r["seconds"] for n, r in rows.items() if n.startswith("matmul "))
    roof_all = max(roof, roof_all)
    lines = [
        f"#### {result['backend']}, {result['policy']}, keras_vit {result['commit']} "
        f"(jit_compile={result['jit_compile']}; "
        f"best matmul {roof / 1e9:.0f} GFLOP/s, all backends {max(roof, roof_all) / 1e9:.0f}; "
        f"load {min(result['loads']):.1f}-{max(result['loads']):.1f}"
        f"{'; malloc on huge pages' if result.get('huge_pages') else ''})",
        "",
    ]

    def split(whole_name, train):
        whole = rows[whole_name]["seconds"] * 1e3
        what = "train step" if train else "inference"
        calls = "ms per call (forward + backward)" if train else "ms per call"
        out = [
            f"| piece | {calls} | calls | ms per {'step' if train else 'model call'} | share of {what} | GFLOP/s "
            "| of matmul |",
            "|---|---|---|---|---|---|---|",
        ]
        accounted = 0.0
        for name, r in rows.items():
            roofline_row = name.startswith("matmul ")  # the inference table's only
            if (roofline_row and train) or (not roofline_row and r.get("train", False) != train):
                continue
            ms = r["seconds"] * 1e3
            rate = r["flops"] / r["seconds"] if r["flops"] else 0.0
            rate_cols = f"{rate / 1e9:.0f} | {rate / roof:.0%}" if rate else "- | -"
            if name.startswith("matmul "):
                out.append(f"| roofline {name} | {ms:.1f} | - | - | - | {rate_cols} |")
            elif r["count"]:
                total = ms * r["count"]
                accounted += total
                out.append(f"| {name} | {ms:.2f} | {r['count']} | {total:.0f} | {total / whole:.0%} | {rate_cols} |")
            elif name.startswith("  "):
                out.append(f"| {name} | {ms:.2f} | ({DEPTH}) | {ms * DEPTH:.0f} | {ms * DEPTH / whole:.0%} | - | - |")
        rest = whole - accounted
        label = "optimizer, weight casts, fusion, layout and dispatch (step - pieces)" if train else (
            "fusion, layout and dispatch (model - pieces)"
        )
        out.append(f"| {label} | - | - | {rest:.0f} | {rest / whole:.0%} | - | - |")
        names = ("model train step",) if train else ("model inference", "timm inference")
        for name in names:
            if name in rows:
                r = rows[name]
                rate = r["flops"] / r["seconds"]
                out.append(
                    f"| **{name}**: {B / r['seconds']:.2f} img/s | {r['seconds'] * 1e3:.0f} | 1 | - | - | "
                    f"{rate / 1e9:.0f} | **{rate / roof:.0%}** ({rate / roof_all:.0%} of all) |"
                )
        return out

    lines += split("model inference", False)
    if any(r.get("train") for r in rows.values()):
        lines += ["", "The train step, piece by piece:", ""] + split("model train step", True)
    return "\n".join(lines) + "\n"


def huge_pages_module():
    """keras_vit/huge_pages.py of this checkout, loaded alone: a driver process that starts
    workers under it imports no Keras (train_step.py uses it too)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "keras_vit", "huge_pages.py")
    spec = importlib.util.spec_from_file_location("huge_pages", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def update_readme(path, cpu, text):
    with open(path) as f:
        readme = f.read()
    start, end = f"<!-- roofline: {cpu} -->", "<!-- /roofline -->"
    block = f"{start}\n{text}{end}"
    pattern = re.escape(start) + r".*?" + re.escape(end)
    if re.search(pattern, readme, flags=re.S):
        readme = re.sub(pattern, lambda _: block, readme, flags=re.S)
    elif end in readme:  # a new CPU kind: after the last one's table
        at = readme.rindex(end) + len(end)
        readme = readme[:at] + f"\n\n##### {cpu}\n\n{block}" + readme[at:]
    else:
        readme = readme.rstrip("\n") + f"\n\n##### {cpu}\n\n{block}\n"
    with open(path, "w") as f:
        f.write(readme)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", nargs="+", default=["jax", "tensorflow", "torch"])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], help="dtype policies, e.g. mixed_bfloat16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train", action="store_true", help="time a train step as well (minutes to compile)")
    parser.add_argument("--readme", default=None, help="write the tables into this README's section for this CPU")
    parser.add_argument(
        "--keras-vit-from", default=None, help="measure the keras_vit of another checkout (an older commit)"
    )
    parser.add_argument("--huge-pages", choices=["on", "off"], default="on",
                        help="start the workers with glibc's malloc on transparent huge pages where it helps")
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(*args.worker, args.rounds, args.train)))
        return
    cpu = cpu_model()
    results = []
    for policy in args.dtypes:
        for backend in args.backends:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", backend, policy, "--rounds", str(args.rounds)]
            cmd += ["--train"] if args.train else []
            env = dict(os.environ, KERAS_BACKEND=backend)
            if args.huge_pages == "on":
                env.update(huge_pages_module().huge_pages_environment(env))
            if args.keras_vit_from:
                env["PYTHONPATH"] = os.pathsep.join([os.path.abspath(args.keras_vit_from), env.get("PYTHONPATH", "")])
            out = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                sys.exit(f"{backend} {policy} failed:\n{out.stderr[-3000:]}")
            results.append(json.loads(line[0][len("RESULT "):]))
            print(table(results[-1], 0.0), flush=True)  # as it comes; the summary follows
    text = (
        f"CPU: {cpu}; ViT-B/16, batch {B}, {forward_flops() / 1e9:.1f} GFLOP per image forward; "
        f"best of {args.rounds} rounds.\n\n"
    )
    for result in results:
        same = [r for r in results if r["policy"] == result["policy"]]
        roof_all = max(x["flops"] / x["seconds"] for r in same for x in r["rows"] if x["name"].startswith("matmul "))
        text += table(result, roof_all) + "\n"
    print(text)
    if args.readme:
        update_readme(args.readme, cpu, text)


if __name__ == "__main__":
    main()
