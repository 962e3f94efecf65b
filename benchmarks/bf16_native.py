"""bfloat16 matmuls and ViT-B/16 inference against the CPU's native bfloat16 matmul, in one process.

    KERAS_BACKEND=tensorflow .venv/bin/python benchmarks/bf16_native.py
    KERAS_BACKEND=jax .venv/bin/python benchmarks/bf16_native.py --rounds 8 --batches 1 8
    ONEDNN_VERBOSE=1 KERAS_BACKEND=tensorflow .venv/bin/python benchmarks/bf16_native.py --rounds 1 --matmuls-only

The native rate is torch.matmul on bfloat16 matrices: oneDNN's brgemm kernels for the CPU's
bfloat16 unit (`brg_matmul:avx512_core_bf16` on AVX512-BF16, `avx512_core_amx` with AMX; run
with ONEDNN_VERBOSE=1 to see the kernel each framework picks). In the same process, calls
interleaved round by round, best and median of --rounds calls each:

- the three ViT-B/16 matmul shapes at batch 8 (1576 tokens): torch bfloat16 (the native rate),
  torch float32, and the Keras backend's own forms: on TensorFlow `tf.matmul` under
  `tf.function` (oneDNN) and with `jit_compile=True` (XLA:CPU), in float32 and bfloat16, and the
  matmul with the bias added (Grappler fuses it into a oneDNN inner product, which is what a
  Dense layer runs); on JAX `jnp.dot` in float32, bfloat16 -> bfloat16 (what `keras.ops.matmul`
  asks for) and bfloat16 -> float32 (`preferred_element_type`, what `keras_vit.layers.matmul`
  asks for);
- a keras_vit ViT-B/16 (random weights, `performance.recommended_jit_compile()`) in float32,
  `mixed_bfloat16` (float32 weights cast to bfloat16 on every call) and `bfloat16` (bfloat16
  weights) at each --batches, as GFLOP/s (35.1 GFLOP per image) and against the native rate.

Every figure shares the process's thread pools and drift; only the ratios inside one run mean
anything on a loaded machine.
"""

import argparse
import os
import time

import numpy as np

SHAPES = [(1576, 768, 3072), (1576, 3072, 768), (1576, 768, 768)]
GFLOP_PER_IMAGE = 35.1


def matmul_calls(backend, rng):
    """{(shape, form): (callable, flops)}: torch's and the backend's matmuls on ViT-B/16's shapes."""
    import torch

    calls = {}
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k), dtype="float32")
        b = rng.standard_normal((k, n), dtype="float32") / np.sqrt(k)
        shape, flops = f"{m}x{k}x{n}", 2 * m * k * n
        for dtype in (torch.bfloat16, torch.float32):
            ta, tb = torch.from_numpy(a).to(dtype), torch.from_numpy(b).to(dtype)
            calls[(shape, f"torch {str(dtype)[6:]}")] = ((lambda ta=ta, tb=tb: torch.matmul(ta, tb)), flops)
        if backend == "tensorflow":
            import tensorflow as tf

            tf.get_logger().setLevel("ERROR")  # one tf.function per form: no retracing to warn about
            for dtype in ("float32", "bfloat16"):
                x, w = tf.constant(a, dtype), tf.Variable(tf.constant(b, dtype))
                bias = tf.Variable(tf.zeros((n,), dtype))
                for jit in (False, True):
                    f = tf.function(lambda x=x, w=w: tf.matmul(x, w), jit_compile=jit)
                    calls[(shape, f"tf {dtype}{' XLA' if jit else ''}")] = ((lambda f=f: f().numpy()), flops)
                f = tf.function(lambda x=x, w=w, bias=bias: tf.matmul(x, w) + bias)
                calls[(shape, f"tf {dtype} + bias (fused)")] = ((lambda f=f: f().numpy()), flops)
        elif backend == "jax":
            import jax
            import jax.numpy as jnp

            forms = {
                "jax float32": (jnp.float32, lambda x, y: jnp.dot(x, y)),
                "jax bf16 -> bf16": (jnp.bfloat16, lambda x, y: jnp.dot(x, y)),
                "jax bf16 -> f32": (jnp.bfloat16, lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32)),
            }
            for form, (dtype, fn) in forms.items():
                f, x, y = jax.jit(fn), jnp.asarray(a, dtype), jnp.asarray(b, dtype)
                calls[(shape, form)] = ((lambda f=f, x=x, y=y: f(x, y).block_until_ready()), flops)
    return calls


def model_calls(policies, batches, rng):
    import keras

    import keras_vit
    from keras_vit import performance

    calls = {}
    before = keras.config.dtype_policy()
    for policy in policies:
        keras.config.set_dtype_policy(policy)
        model = keras_vit.ViTB16(weights=None)
        model.compile(jit_compile=performance.recommended_jit_compile())
        for batch in batches:
            images = rng.random((batch, 224, 224, 3), dtype="float32")
            flops = GFLOP_PER_IMAGE * 1e9 * batch
            calls[(f"batch {batch}", f"ViT-B/16 {policy}")] = ((lambda m=model, x=images: m.predict_on_batch(x)), flops)
    keras.config.set_dtype_policy(before)
    return calls


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batches", type=int, nargs="+", default=[8])
    parser.add_argument("--policies", nargs="+", default=["float32", "mixed_bfloat16", "bfloat16"])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--matmuls-only", action="store_true")
    args = parser.parse_args(argv)
    import keras
    import torch

    torch.set_num_threads(args.threads)
    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    calls = matmul_calls(backend, rng)
    if not args.matmuls_only:
        calls.update(model_calls(args.policies, args.batches, rng))
    for fn, _ in calls.values():  # compile and warm up
        fn()
        fn()
    times = {key: [] for key in calls}
    keys, loads = list(calls), []
    for r in range(args.rounds):
        for key in keys if r % 2 == 0 else keys[::-1]:
            start = time.perf_counter()
            calls[key][0]()
            times[key].append(time.perf_counter() - start)
        loads.append(os.getloadavg()[0])
    def rate(key, pick):  # pick: 0 the best call, 1 the median one
        ts = sorted(times[key])
        return calls[key][1] / (ts[0] if pick == 0 else ts[len(ts) // 2])

    torch_keys = [k for k in keys if k[1] == "torch bfloat16"]
    native = [max(rate(k, pick) for k in torch_keys) for pick in (0, 1)]
    print(f"{backend}, {args.rounds} rounds, load {min(loads):.1f}-{max(loads):.1f}; native bfloat16 rate (torch "
          f"bfloat16 matmul, the best shape) {native[0] / 1e9:.0f} GFLOP/s best, {native[1] / 1e9:.0f} median\n")
    print("| shape / batch | form | GFLOP/s best / median | of native: best / median |")
    print("|---|---|---|---|")
    for key in keys:
        best, median = rate(key, 0), rate(key, 1)
        extra = f" ({best / GFLOP_PER_IMAGE / 1e9:.2f} img/s)" if key[0].startswith("batch") else ""
        print(f"| {key[0]} | {key[1]}{extra} | {best / 1e9:.0f} / {median / 1e9:.0f} "
              f"| {best / native[0]:.0%} / {median / native[1]:.0%} |")

if __name__ == "__main__":
    main()
