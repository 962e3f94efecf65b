"""The paper's position-embedding ablation (Table 8, Appendix D.4) in miniature, offline.

Trains the same small ViT on scikit-learn's digits (keras_vit.data's embedded "digits", upscaled
to 16x16 with patch 2: an 8x8 grid of 64 patch tokens) with each `position_embedding` --
"none", "learned" (1-D), "learned_2d", "relative" (1-D relative attention) and "sincos2d" --
over several seeds, and prints a Markdown table of the test accuracy (mean +/- std over seeds)
as docs/ablations.md shows it.

    python benchmarks/ablation_position_embedding.py [--seeds 0 1 2] [--steps 300] [--json out.json]
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

KINDS = ("none", "learned", "learned_2d", "relative", "sincos2d")
MODEL = dict(image_size=16, patch_size=2, hidden_size=48, num_layers=3, num_heads=3, mlp_dim=96, classes=10)
TRAIN = dict(batch_size=64, learning_rate=2e-3, warmup=40, weight_decay=0.1, label_smoothing=0.1)


def train_one(kind, seed, steps, data):
    import keras
    import numpy as np

    import keras_vit
    from keras_vit import training

    keras.utils.clear_session()
    keras.utils.set_random_seed(seed)
    (x_train, y_train), (x_test, y_test) = data
    # `steps` optimizer steps (rounded up to whole epochs) over shuffled epochs of the training split.
    steps_per_epoch = len(x_train) // TRAIN["batch_size"]
    epochs = -(-steps // steps_per_epoch)
    steps = epochs * steps_per_epoch
    model = keras_vit.VisionTransformer(**MODEL, position_embedding=kind, name=f"vit_{kind}")
    model.compile(
        optimizer=training.pretrain_optimizer(
            TRAIN["learning_rate"], total_steps=steps, warmup_steps=min(TRAIN["warmup"], steps // 10), weight_decay=TRAIN["weight_decay"]
        ),
        loss=training.classification_loss(model, label_smoothing=TRAIN["label_smoothing"]),
        metrics=["accuracy"],
    )
    # Whole batches only (Keras shuffles the arrays every epoch, seeded above).
    n = steps_per_epoch * TRAIN["batch_size"]
    order = np.random.default_rng(seed).permutation(len(x_train))[:n]
    start = time.time()
    model.fit(x_train[order], y_train[order], batch_size=TRAIN["batch_size"], epochs=epochs, verbose=0)
    trained = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    if trained != steps:
        raise RuntimeError(f"trained {trained} steps instead of {steps}")
    accuracy = float(np.mean(model.predict(x_test, batch_size=256, verbose=0).argmax(-1) == y_test))
    return {
        "position_embedding": kind, "seed": seed, "test_accuracy": accuracy, "params": model.count_params(),
        "steps": steps, "seconds": round(time.time() - start, 1),
    }


def table(results):
    import numpy as np

    lines = [
        "| position_embedding | parameters | test accuracy (mean ± std) | runs |",
        "|---|---|---|---|",
    ]
    for kind in KINDS:
        rows = [r for r in results if r["position_embedding"] == kind]
        if not rows:
            continue
        acc = np.array([r["test_accuracy"] for r in rows])
        lines.append(
            f"| {kind} | {rows[0]['params']:,} | {acc.mean():.4f} ± {acc.std(ddof=1) if len(acc) > 1 else 0.0:.4f} "
            f"| {', '.join(f'{a:.4f}' for a in acc)} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per run")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--json", help="also write every run's result to this file")
    args = parser.parse_args(argv)

    import keras

    from keras_vit import data as kd

    train = kd.as_arrays("digits", "train", image_size=MODEL["image_size"])[:2]
    test = kd.as_arrays("digits", "test", image_size=MODEL["image_size"])[:2]
    results = []
    for seed in args.seeds:
        for kind in args.kinds:
            result = train_one(kind, seed, args.steps, (train, test))
            results.append(result)
            print(json.dumps(result), flush=True)
    print(f"\nbackend {keras.backend.backend()}, {len(train[0])} training / {len(test[0])} test digits\n")
    print(table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
