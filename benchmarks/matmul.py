"""float32 GFLOP/s of ViT-B/16's matmuls (batch 8: 1576 tokens) in torch, JAX and TensorFlow.

    .venv/bin/python benchmarks/matmul.py                      # all three, alternating, 3 rounds
    XLA_FLAGS=--xla_cpu_use_onednn=true .venv/bin/python benchmarks/matmul.py --only jax

Each framework runs in its own process (one thread pool each), the processes alternate for
--rounds rounds and the best GFLOP/s per shape is kept. The shapes are the MLP in/out and the
attention projections; at ~35 GFLOP per image they are >95% of a ViT's work, so the kernel that
runs them bounds images/s: `benchmarks/README.md` ("Where the time goes").
"""

import argparse
import json
import os
import subprocess
import sys
import time

SHAPES = [(1576, 768, 3072), (1576, 3072, 768), (1576, 768, 768)]


def worker(framework, reps):
    import numpy as np

    rng = np.random.default_rng(0)
    out = {}
    for m, k, n in SHAPES:
        a = rng.random((m, k), dtype="float32")
        b = rng.random((k, n), dtype="float32")
        if framework == "torch":
            import torch

            ta, tb = torch.from_numpy(a), torch.from_numpy(b)

            def call():
                return torch.mm(ta, tb)
        elif framework == "jax":
            import jax

            ja, jb = jax.numpy.asarray(a), jax.numpy.asarray(b)
            f = jax.jit(lambda x, y: x @ y)

            def call():
                return f(ja, jb).block_until_ready()
        else:
            import tensorflow as tf

            fa, fb = tf.constant(a), tf.Variable(b)
            f = tf.function(lambda: tf.matmul(fa, fb))

            def call():
                return f().numpy()

        call()
        best = float("inf")
        for _ in range(reps):
            start = time.perf_counter()
            call()
            best = min(best, time.perf_counter() - start)
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="torch,jax,tensorflow")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        if args.worker == "torch":
            import torch

            torch.set_num_threads(args.threads)
        print(json.dumps(worker(args.worker, args.reps)))
        return
    best = {}
    frameworks = args.only.split(",")
    for r in range(args.rounds):
        for fw in frameworks if r % 2 == 0 else frameworks[::-1]:
            cmd = [sys.executable, __file__, "--worker", fw, "--reps", str(args.reps), "--threads", str(args.threads)]
            line = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            for shape, gflops in json.loads(line).items():
                best[(fw, shape)] = max(best.get((fw, shape), 0.0), gflops)
                print(f"round {r + 1} {fw:10s} {shape:15s} {gflops:6.0f} GFLOP/s", flush=True)
    print("\nbest GFLOP/s  " + "  ".join(f"{s[0]}x{s[1]}x{s[2]}" for s in SHAPES))
    for fw in frameworks:
        print(f"{fw:12s} " + "  ".join(f"{best[(fw, f'{s[0]}x{s[1]}x{s[2]}')]:14.0f}" for s in SHAPES))


if __name__ == "__main__":
    main()
