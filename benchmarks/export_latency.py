"""Latency of each deployment artefact of ViT-B/16 (random weights) against Keras' predict, on CPU.

    KERAS_BACKEND=tensorflow python benchmarks/export_latency.py            # batch 1 and 8
    python benchmarks/export_latency.py --batch-sizes 1 8 --repeats 10 --out results/export.json

Exports the model with keras_vit.export_model as a SavedModel, ONNX and LiteRT file (float32 and
int8), then times one call of each runtime on the same images (median of --repeats calls after
two warm-up calls): Keras `predict` and `predict_on_batch` on the current backend, the SavedModel's
`serve` endpoint through `tf.saved_model.load`, onnxruntime's CPU session and ai-edge-litert's
Interpreter (XNNPACK, one thread per core). Prints a Markdown table (ms and the ratio to Keras
predict) and writes the numbers as JSON.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np


def median_ms(fn, repeats, warmup=2):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def runners(paths, threads):
    """{artefact name: callable(images) -> outputs} for every exported file."""
    import onnxruntime as ort
    import tensorflow as tf
    from ai_edge_litert.interpreter import Interpreter

    out = {}
    for name, path in paths.items():
        if name.startswith("saved_model"):
            loaded = tf.saved_model.load(path)
            # Hold the loaded object: its variables die with it, not with the bound endpoint.
            out[name] = (lambda m: lambda x: m.serve(tf.constant(x)).numpy())(loaded)
        elif name.startswith("onnx"):
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
            out[name] = (lambda s: lambda x: s.run(None, {"images": x})[0])(session)
        else:
            interpreter = Interpreter(model_path=path, num_threads=threads)
            runner = interpreter.get_signature_runner("serve")
            out[name] = (lambda r: lambda x: r(images=x)["predictions"])(runner)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--architecture", default="ViTB16", help="a keras_vit constructor name")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--formats", nargs="+", default=["saved_model", "onnx", "litert"])
    parser.add_argument("--no-int8", action="store_true", help="skip the int8 artefacts")
    parser.add_argument("--out", default=None, help="JSON file for the results")
    args = parser.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import keras

    import keras_vit

    threads = os.cpu_count()
    model = getattr(keras_vit, args.architecture)(weights=None)
    rng = np.random.default_rng(0)
    for variable in model.weights:  # random weights (the zero-initialised head would give zeros)
        variable.assign((rng.standard_normal(tuple(variable.shape)) * 0.02).astype("float32"))

    results = {"architecture": args.architecture, "backend": keras.backend.backend(), "threads": threads,
               "machine": platform.processor() or platform.machine(), "rows": []}
    with tempfile.TemporaryDirectory(prefix="export_latency_") as tmp:
        jobs, paths = [], {}
        suffix = {"saved_model": "", "onnx": ".onnx", "litert": ".tflite"}
        for fmt in args.formats:
            for int8 in (False,) if args.no_int8 else (False, True):
                name = fmt + ("_int8" if int8 else "")
                paths[name] = os.path.join(tmp, name + suffix[fmt])
                jobs.append(dict(path=paths[name], format=fmt, int8=int8))
        start = time.perf_counter()
        keras_vit.export_models(model, jobs)
        results["export_s"] = round(time.perf_counter() - start, 1)
        sizes = {name: _size_mb(path) for name, path in paths.items()}
        print(f"exported {len(jobs)} artefacts in {results['export_s']} s", file=sys.stderr)

        calls = {
            "keras predict": lambda x: model.predict(x, verbose=0),
            "keras predict_on_batch": lambda x: model.predict_on_batch(x),
        }
        calls.update(runners(paths, threads))
        for batch in args.batch_sizes:
            images = rng.uniform(-1, 1, (batch, *model.image_size, 3)).astype("float32")
            reference = None
            for name, call in calls.items():
                ms = median_ms(lambda: call(images), args.repeats)
                output = np.asarray(call(images))
                if reference is None:
                    reference = output
                change = float(np.abs(output - reference).max() / np.abs(reference).max())
                results["rows"].append(dict(artefact=name, batch=batch, ms=round(ms, 2),
                                            size_mb=sizes.get(name), max_rel_change=change))
                print(f"batch {batch:2d}  {name:24s} {ms:9.2f} ms", file=sys.stderr)
    print(markdown(results))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


def _size_mb(path):
    if os.path.isdir(path):
        total = sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)
    else:
        total = os.path.getsize(path)
    return round(total / 2**20, 1)


def markdown(results):
    batches = sorted({r["batch"] for r in results["rows"]})
    names = list(dict.fromkeys(r["artefact"] for r in results["rows"]))
    by = {(r["artefact"], r["batch"]): r for r in results["rows"]}
    head = "| artefact | size (MB) | " + " | ".join(f"batch {b}: ms | × predict" for b in batches) + " |"
    lines = [head, "|---|---:|" + "---:|---:|" * len(batches)]
    for name in names:
        cells = []
        for b in batches:
            row, base = by[(name, b)], by[("keras predict", b)]
            cells += [f"{row['ms']:.1f}", f"{row['ms'] / base['ms']:.2f}"]
        size = by[(name, batches[0])]["size_mb"]
        lines.append(f"| {name} | {'' if size is None else size} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
