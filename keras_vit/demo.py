"""`make demo`: the paper's two stages in miniature, offline, on scikit-learn's digits.

1. Pre-training (the paper's upstream recipe): a small ViT (patch 4, width 64, 4 layers) learns
   the digits of a *pre-training split* at 16x16 pixels (a 4x4 patch grid) with Adam(W), weight
   decay, linear warm-up then linear decay, and label smoothing.
2. Fine-tuning (the paper's transfer recipe) on a *separate labelled split* at a higher
   resolution, 32x32 (an 8x8 grid): the position embeddings are resized 4x4 -> 8x8, a new
   zero-initialised head is attached, and the model is trained with SGD momentum 0.9,
   global-norm clipping 1.0, warm-up then cosine decay.
3. Evaluation on the held-out test split, a run folder with metrics (JSON, CSV), training curves,
   attention-rollout overlays and both models, and the last line `test accuracy: 0.xxxx`.

    python -m keras_vit.demo [--out runs/demo] [--quick]

The digits (8x8, 1,797 images) ship inside scikit-learn: nothing is downloaded. --quick (or
KERAS_VIT_DEMO_QUICK=1) runs a few steps only, for tests.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Splits of the 1,437 digits training images (the 360 test images are never trained on).
PRETRAIN_SPLIT = "train[:1000]"
FINETUNE_SPLIT = "train[1000:]"
TEST_SPLIT = "test"

MODEL = dict(patch_size=4, hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128, classes=10)
PRETRAIN = dict(image_size=16, steps=600, batch_size=64, learning_rate=2e-3, warmup=60, weight_decay=0.1,
                label_smoothing=0.1, evals=3)
FINETUNE = dict(image_size=32, steps=300, batch_size=64, learning_rate=0.02, warmup=30, evals=3)
QUICK = dict(pretrain_steps=12, finetune_steps=12)

# Digits are not mirror-symmetric and tiny: no flip, and crops keep at least 60% of the area.
AUGMENT = dict(flip=False, area_range=(0.6, 1.0))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m keras_vit.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("KERAS_VIT_DEMO_OUT", os.path.join("runs", "demo")),
                        help="run folder (default runs/demo)")
    parser.add_argument("--quick", action="store_true", default=os.environ.get("KERAS_VIT_DEMO_QUICK") == "1",
                        help="a few steps only (for tests)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", type=int, default=1, help="Keras verbosity (1: progress bars)")
    return parser.parse_args(argv)


def save_attention_overlays(model, images, labels, predictions, path):
    """A grid of test digits with their attention-rollout maps (keras_vit.analysis) overlaid."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from keras_vit.analysis import attention_rollout

    maps = np.asarray(attention_rollout(model, images))  # (n, grid_h, grid_w)
    n = len(images)
    figure = Figure(figsize=(1.6 * n, 3.5), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, n, squeeze=False)
    height, width = images.shape[1:3]
    for i in range(n):
        picture = (images[i] + 1.0) / 2.0
        heat = maps[i] / max(float(maps[i].max()), 1e-12)
        heat = np.kron(heat, np.ones((height // heat.shape[0], width // heat.shape[1])))
        axes[0, i].imshow(picture, interpolation="nearest")
        axes[0, i].set_title(f"label {labels[i]} / pred {predictions[i]}", fontsize=7)
        axes[1, i].imshow(picture, interpolation="nearest")
        axes[1, i].imshow(heat, cmap="jet", alpha=0.5, interpolation="bilinear")
        for ax in axes[:, i]:
            ax.axis("off")
    figure.suptitle("attention rollout (class token -> patches), fine-tuned model at 32x32", fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    return path


def main(argv=None):
    args = parse_args(argv)
    start = time.time()

    import keras
    import numpy as np

    import keras_vit
    import keras_vit.data as kd
    from keras_vit.commands._common import training_api
    from keras_vit.runs import RunFolder

    keras.utils.set_random_seed(args.seed)
    api = training_api()
    run = RunFolder(args.out)
    pre, ft = dict(PRETRAIN), dict(FINETUNE)
    if args.quick:
        pre.update(steps=QUICK["pretrain_steps"], warmup=2)
        ft.update(steps=QUICK["finetune_steps"], warmup=2)
    run.save_config({"model": MODEL, "pretrain": pre, "finetune": ft, "augment": AUGMENT, "quick": args.quick,
                     "splits": {"pretrain": PRETRAIN_SPLIT, "finetune": FINETUNE_SPLIT, "test": TEST_SPLIT},
                     "backend": keras.backend.backend(), "seed": args.seed})

    def data(split, image_size, batch_size, training):
        return kd.load_dataset("digits", split, image_size=image_size, batch_size=batch_size, training=training,
                               seed=args.seed, **(AUGMENT if training else {}))

    # === 1. Pre-training at 16x16 ===
    print(f"[1/3] pre-training a ViT (patch {MODEL['patch_size']}, width {MODEL['hidden_size']}, "
          f"{MODEL['num_layers']} layers) on {PRETRAIN_SPLIT} of the digits at {pre['image_size']}x{pre['image_size']}"
          f": AdamW (weight decay {pre['weight_decay']}), warm-up + linear decay, label smoothing "
          f"{pre['label_smoothing']}, {pre['steps']} steps")
    model = keras_vit.VisionTransformer(image_size=pre["image_size"], name="vit_digits_pretrain", **MODEL)
    model.compile(
        optimizer=api.pretrain_optimizer(pre["learning_rate"], total_steps=pre["steps"], warmup_steps=pre["warmup"],
                                         weight_decay=pre["weight_decay"]),
        loss=api.classification_loss(model, label_smoothing=pre["label_smoothing"]),
        metrics=["accuracy"],
    )
    train_ds, _ = data(PRETRAIN_SPLIT, pre["image_size"], pre["batch_size"], True)
    val_ds, _ = data(TEST_SPLIT, pre["image_size"], 256, False)
    epochs = pre["evals"]
    model.fit(train_ds, steps_per_epoch=pre["steps"] // epochs, epochs=epochs, validation_data=val_ds,
              callbacks=[run.logger(stage="pretrain")], verbose=args.verbose, shuffle=False)
    pre_results = model.evaluate(val_ds, return_dict=True, verbose=0)
    run.save_model(model, "pretrained.keras")
    pretrain_steps = (pre["steps"] // epochs) * epochs

    # === 2. Fine-tuning at 32x32 ===
    finetuned = api.for_finetuning(model, image_size=ft["image_size"], classes=MODEL["classes"],
                                   name="vit_digits_finetune")
    print(f"[2/3] fine-tuning on {FINETUNE_SPLIT} at {ft['image_size']}x{ft['image_size']}: position embeddings "
          f"resized {tuple(model.grid_size)} -> {tuple(finetuned.grid_size)}, new zero head; SGD momentum 0.9, "
          f"clip 1.0, warm-up + cosine, {ft['steps']} steps")
    finetuned.compile(
        optimizer=api.finetune_optimizer(ft["learning_rate"], total_steps=ft["steps"], warmup_steps=ft["warmup"]),
        loss=api.classification_loss(finetuned),
        metrics=["accuracy"],
    )
    train_ds, _ = data(FINETUNE_SPLIT, ft["image_size"], ft["batch_size"], True)
    test_ds, test_info = data(TEST_SPLIT, ft["image_size"], 256, False)
    epochs = ft["evals"]
    finetuned.fit(train_ds, steps_per_epoch=ft["steps"] // epochs, epochs=epochs, validation_data=test_ds,
                  callbacks=[run.logger(stage="finetune", step_offset=pretrain_steps)], verbose=args.verbose,
                  shuffle=False)

    # === 3. Evaluation and the run folder ===
    print("[3/3] evaluating on the held-out test split")
    images, labels, _ = kd.as_arrays("digits", TEST_SPLIT, image_size=ft["image_size"])
    scores = np.asarray(finetuned.predict(images, batch_size=256, verbose=0))
    predictions = scores.argmax(1)
    accuracy = float(np.mean(predictions == labels))
    run.plot_curves(title="ViT on digits: pre-training at 16x16, then fine-tuning at 32x32")
    run.save_model(finetuned, "model.keras")
    overlay = None
    try:
        overlay = save_attention_overlays(finetuned, images[:8], labels[:8], predictions[:8],
                                          run.file("attention_rollout.png"))
    except ImportError:  # keras_vit.analysis not available
        pass
    elapsed = time.time() - start
    run.write_metrics({
        "test_accuracy": accuracy, "test_examples": int(len(labels)),
        "pretrain_test_accuracy_16px": pre_results.get("accuracy"),
        "pretrain_steps": pretrain_steps, "finetune_steps": (ft["steps"] // epochs) * epochs,
        "wall_seconds": round(elapsed, 1), "backend": keras.backend.backend(), "quick": args.quick,
    })
    print(f"run folder: {run.path} (metrics.json, metrics.csv, history.csv, curves.png"
          + (", attention_rollout.png" if overlay else "") + ", pretrained.keras, model.keras)")
    print(f"pre-trained model at 16x16: test accuracy {pre_results.get('accuracy', float('nan')):.4f}; "
          f"wall time {elapsed:.0f} s")
    print(f"test accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    main()
