"""`make demo`: the paper's claim in miniature, offline: pre-training transfers.

1. Pre-training (the paper's upstream recipe): a small ViT (patch 4, width 64, 4 layers) learns
   the digits 0-4 of scikit-learn's digits at 16x16 pixels (a 4x4 patch grid) with AdamW, weight
   decay, linear warm-up then linear decay, and label smoothing.
2. Transfer (the paper's fine-tuning recipe) to a *different task with few labels at a higher
   resolution*: the digits 5-9, with only 10 labelled images per class, at 32x32 (an 8x8 grid).
   The position embeddings are resized 4x4 -> 8x8, a new zero-initialised 5-class head is
   attached, and the model is trained with SGD momentum 0.9, global-norm clipping 1.0, warm-up
   then cosine decay.
3. The same ViT trained from scratch on the same few labels for the same number of steps (with
   the upstream recipe, AdamW, which trains a ViT from scratch better than SGD does).
4. Evaluation of both on the held-out test images of the digits 5-9, a run folder with metrics
   (JSON, CSV), training curves, attention-rollout overlays and the models, and the last line
   `test accuracy: Y (from scratch: X)`.

    python -m keras_vit.demo [--out runs/demo] [--seed 0] [--quick]

The digits (8x8, 1,797 images) ship inside scikit-learn: nothing is downloaded. --quick (or
KERAS_VIT_DEMO_QUICK=1) runs a few steps only, for tests.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

# Tasks: pre-train on the digits 0-4, transfer to the digits 5-9 (the 360 test images of the
# digits are never trained on; their 5-9 part is the transfer task's test set).
PRETRAIN_CLASSES = (0, 1, 2, 3, 4)
TRANSFER_CLASSES = (5, 6, 7, 8, 9)
LABELS_PER_CLASS = 10

MODEL = dict(patch_size=4, hidden_size=64, num_layers=4, num_heads=4, mlp_dim=128)
PRETRAIN = dict(image_size=16, steps=500, batch_size=64, learning_rate=2e-3, warmup=50, weight_decay=0.1,
                label_smoothing=0.1, evals=2)
FINETUNE = dict(image_size=32, steps=100, batch_size=32, learning_rate=0.03, warmup=10, evals=2)
SCRATCH = dict(learning_rate=1e-3, weight_decay=0.1, label_smoothing=0.1)
QUICK = dict(pretrain_steps=8, finetune_steps=8)

# Digits are not mirror-symmetric: no flip. Pre-training crops down to 20% of the area, so that the
# model also sees digits magnified up to ~2x, as they are at the transfer task's 32x32; the few
# labelled transfer images are cropped mildly (at least 60% of the area).
PRETRAIN_AUGMENT = dict(flip=False, area_range=(0.2, 1.0))
AUGMENT = dict(flip=False, area_range=(0.6, 1.0))


def select(images, labels, classes, per_class=None, seed=0):
    """The examples of `classes` (relabelled 0..len(classes)-1); `per_class` of each, drawn with `seed`."""
    import numpy as np

    rng = np.random.default_rng(seed)
    keep = []
    for c in classes:
        index = np.flatnonzero(labels == c)
        keep.append(index if per_class is None else rng.choice(index, per_class, replace=False))
    keep = np.sort(np.concatenate(keep))
    relabel = np.full(int(labels.max()) + 1, -1, "int64")
    relabel[list(classes)] = np.arange(len(classes))
    return images[keep], relabel[labels[keep]]


def make_dataset(images, labels, image_size, batch_size, training, seed=0, augment=None):
    """A tf.data pipeline over uint8 arrays, preprocessed as keras_vit.data does (Inception crop
    when training, resize otherwise; [-1, 1])."""
    import tensorflow as tf

    from keras_vit.data import preprocessing
    from keras_vit.data.pipeline import shuffle_repeated

    ds = tf.data.Dataset.from_tensor_slices((images, labels.astype("int32"))).cache()
    if not training:
        ds = ds.map(lambda x, y: (preprocessing.eval_preprocess(x, image_size), y))
        return ds.batch(batch_size)
    base = tf.constant(int(seed), tf.int64)
    options = AUGMENT if augment is None else augment

    def train_map(index, pair):
        x, y = pair
        return preprocessing.train_preprocess(x, image_size, tf.stack([base, index]), **options), y

    # Every iterator yields the same batches: the fine-tuned and the from-scratch runs see the same
    # ones, whatever Keras' model-building iterator read ahead (see shuffle_repeated).
    ds = shuffle_repeated(ds, len(images), seed)
    ds = ds.enumerate().map(train_map, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


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


# The demo's picture: one colour per run.
COLOURS = {"pretrain": "#555555", "finetune": "#1f77b4", "scratch": "#d62728"}


def plot_demo_curves(run, spans, accuracies, path):
    """The demo's curves.png: (a) pre-training, (b) the transfer runs' training loss and (c) their test
    accuracy, the fine-tuned and the from-scratch run as two series in their own colours, each against
    its own steps, with the final test accuracies in the legends.

    spans: {stage: (first, end)} slices of `run.steps` written by each stage; accuracies: {"pretrain",
    "finetune", "scratch": final test accuracy}.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 4.2), dpi=100)
    FigureCanvasAgg(figure)
    pre_ax, loss_ax, acc_ax = figure.subplots(1, 3)
    offsets = dict(run.stage_starts)  # stage -> the step its logger counted from

    def steps_of(stage):
        first, end = spans[stage]
        rows = run.steps[first:end]
        return [r[0] - offsets[stage] for r in rows], [r[1] for r in rows]

    def evaluations_of(stage, key):
        rows = [r for r in run.history if r["stage"] == stage and r.get(key) is not None]
        return [r["step"] - offsets[stage] for r in rows], [r[key] for r in rows]

    # (a) pre-training: training loss, and the accuracy on the held-out digits 0-4 on a second axis.
    x, y = steps_of("pretrain")
    pre_ax.plot(x, y, color=COLOURS["pretrain"], lw=1.0, label="training loss (running mean per epoch)")
    pre_ax.set_ylabel("training loss")
    twin = pre_ax.twinx()
    x, y = evaluations_of("pretrain", "val_accuracy")
    twin.plot(x, y, "o--", color="#2ca02c", ms=4,
              label=f"test accuracy (digits 0-4): {accuracies['pretrain']:.4f}")
    twin.set_ylim(0.0, 1.0)
    twin.set_ylabel("test accuracy")
    handles = pre_ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    pre_ax.legend(handles, [h.get_label() for h in handles], fontsize=8, loc="lower left")
    pre_ax.set_title("1. pre-training: digits 0-4 at 16x16", fontsize=10)
    pre_ax.set_xlabel("pre-training step")

    # (b), (c) transfer: the two runs side by side, each against its own steps.
    names = {"finetune": "fine-tuned from pre-training", "scratch": "trained from scratch"}
    for stage in ("finetune", "scratch"):
        x, y = steps_of(stage)
        loss_ax.plot(x, y, color=COLOURS[stage], lw=1.2, label=names[stage])
        x, y = evaluations_of(stage, "val_accuracy")
        acc_ax.plot(x, y, "o-", color=COLOURS[stage], ms=5,
                    label=f"{names[stage]}: final {accuracies[stage]:.4f}")
    loss_ax.set_title("2. transfer: digits 5-9, 10 labels per class, 32x32", fontsize=10)
    loss_ax.set_xlabel("transfer step")
    loss_ax.set_ylabel("training loss (running mean per epoch)")
    loss_ax.legend(fontsize=8)
    acc_ax.axhline(1.0 / len(TRANSFER_CLASSES), color="grey", ls=":", lw=1, label="chance (0.2)")
    acc_ax.set_ylim(0.0, 1.0)
    acc_ax.set_title("3. test accuracy on the digits 5-9 (167 images)", fontsize=10)
    acc_ax.set_xlabel("transfer step")
    acc_ax.set_ylabel("test accuracy")
    acc_ax.legend(fontsize=8, loc="lower right")
    for ax in (pre_ax, loss_ax, acc_ax):
        ax.grid(alpha=0.3)
    figure.suptitle("ViT on digits: pre-training on 0-4 at 16x16, then transfer to 5-9 with few labels at 32x32",
                    fontsize=11)
    figure.tight_layout()
    figure.savefig(path)
    return path


def main(argv=None):
    args = parse_args(argv)
    start = time.time()

    import keras
    import numpy as np

    import keras_vit
    from keras_vit import training
    from keras_vit.data.embedded import load_embedded
    from keras_vit.runs import RunFolder

    keras.utils.set_random_seed(args.seed)
    run = RunFolder(args.out)
    pre, ft, scratch = dict(PRETRAIN), dict(FINETUNE), dict(SCRATCH)
    if args.quick:
        pre.update(steps=QUICK["pretrain_steps"], warmup=2)
        ft.update(steps=QUICK["finetune_steps"], warmup=2)
    run.save_config({"model": MODEL, "pretrain": pre, "finetune": ft, "scratch": scratch, "augment": AUGMENT,
                     "pretrain_augment": PRETRAIN_AUGMENT,
                     "pretrain_classes": PRETRAIN_CLASSES, "transfer_classes": TRANSFER_CLASSES,
                     "labels_per_class": LABELS_PER_CLASS, "quick": args.quick,
                     "backend": keras.backend.backend(), "seed": args.seed})

    train_images, train_labels, _ = load_embedded("digits", "train")
    test_images, test_labels, _ = load_embedded("digits", "test")
    pre_x, pre_y = select(train_images, train_labels, PRETRAIN_CLASSES)
    pre_test_x, pre_test_y = select(test_images, test_labels, PRETRAIN_CLASSES)
    few_x, few_y = select(train_images, train_labels, TRANSFER_CLASSES, LABELS_PER_CLASS, seed=args.seed)
    test_x, test_y = select(test_images, test_labels, TRANSFER_CLASSES)

    # === 1. Pre-training at 16x16 on the digits 0-4 ===
    print(f"[1/4] pre-training a ViT (patch {MODEL['patch_size']}, width {MODEL['hidden_size']}, "
          f"{MODEL['num_layers']} layers) on the digits 0-4 ({len(pre_x)} images) at {pre['image_size']}x"
          f"{pre['image_size']}: AdamW (weight decay {pre['weight_decay']}), warm-up + linear decay, label smoothing "
          f"{pre['label_smoothing']}, crops of {PRETRAIN_AUGMENT['area_range'][0]:.0%}-100% of the area, "
          f"{pre['steps']} steps")
    model = keras_vit.VisionTransformer(image_size=pre["image_size"], classes=len(PRETRAIN_CLASSES),
                                        name="vit_digits_0_4", **MODEL)
    model.compile(
        optimizer=training.pretrain_optimizer(pre["learning_rate"], total_steps=pre["steps"], warmup_steps=pre["warmup"],
                                         weight_decay=pre["weight_decay"]),
        loss=training.classification_loss(model, label_smoothing=pre["label_smoothing"]),
        metrics=["accuracy"],
    )
    val_ds = make_dataset(pre_test_x, pre_test_y, pre["image_size"], 256, False)
    epochs = pre["evals"]
    spans = {}  # stage -> the slice of run.steps its training wrote
    first = len(run.steps)
    model.fit(make_dataset(pre_x, pre_y, pre["image_size"], pre["batch_size"], True, args.seed, PRETRAIN_AUGMENT),
              steps_per_epoch=pre["steps"] // epochs, epochs=epochs, validation_data=val_ds,
              callbacks=[run.logger(stage="pretrain")], verbose=args.verbose)
    spans["pretrain"] = (first, len(run.steps))
    pre_results = model.evaluate(val_ds, return_dict=True, verbose=0)
    run.save_model(model, "pretrained.keras")
    pretrain_steps = (pre["steps"] // epochs) * epochs

    # === 2. Transfer at 32x32 to the digits 5-9, few labels ===
    finetuned = training.for_finetuning(model, image_size=ft["image_size"], classes=len(TRANSFER_CLASSES),
                                   name="vit_digits_5_9_finetuned")
    print(f"[2/4] fine-tuning on the digits 5-9 with {LABELS_PER_CLASS} labels per class ({len(few_x)} images) at "
          f"{ft['image_size']}x{ft['image_size']}: position embeddings resized {tuple(model.grid_size)} -> "
          f"{tuple(finetuned.grid_size)}, new zero head; SGD momentum 0.9, clip 1.0, warm-up + cosine, "
          f"{ft['steps']} steps")
    finetuned.compile(
        optimizer=training.finetune_optimizer(ft["learning_rate"], total_steps=ft["steps"], warmup_steps=ft["warmup"]),
        loss=training.classification_loss(finetuned),
        metrics=["accuracy"],
    )
    few_ds = make_dataset(few_x, few_y, ft["image_size"], ft["batch_size"], True, args.seed)
    test_ds = make_dataset(test_x, test_y, ft["image_size"], 256, False)
    epochs = ft["evals"]
    first = len(run.steps)
    finetuned.fit(few_ds, steps_per_epoch=ft["steps"] // epochs, epochs=epochs, validation_data=test_ds,
                  callbacks=[run.logger(stage="finetune", step_offset=pretrain_steps)], verbose=args.verbose)
    spans["finetune"] = (first, len(run.steps))

    # === 3. The same ViT from scratch, same labels and steps ===
    print(f"[3/4] training the same ViT from scratch on the same {len(few_x)} images at {ft['image_size']}x"
          f"{ft['image_size']}, {ft['steps']} steps (AdamW, warm-up + linear decay)")
    baseline = keras_vit.VisionTransformer(image_size=ft["image_size"], classes=len(TRANSFER_CLASSES),
                                           name="vit_digits_5_9_scratch", **MODEL)
    baseline.compile(
        optimizer=training.pretrain_optimizer(scratch["learning_rate"], total_steps=ft["steps"],
                                         warmup_steps=ft["warmup"], weight_decay=scratch["weight_decay"]),
        loss=training.classification_loss(baseline, label_smoothing=scratch["label_smoothing"]),
        metrics=["accuracy"],
    )
    first = len(run.steps)
    baseline.fit(few_ds, steps_per_epoch=ft["steps"] // epochs, epochs=epochs, validation_data=test_ds,
                 callbacks=[run.logger(stage="scratch", step_offset=pretrain_steps)], verbose=args.verbose)
    spans["scratch"] = (first, len(run.steps))

    # === 4. Evaluation and the run folder ===
    print(f"[4/4] evaluating on the held-out test images of the digits 5-9 ({len(test_x)})")
    images = np.concatenate([x for x, _ in test_ds.as_numpy_iterator()])

    def accuracy_of(m):
        predictions = np.asarray(m.predict(images, batch_size=256, verbose=0)).argmax(1)
        return float(np.mean(predictions == test_y)), predictions

    accuracy, predictions = accuracy_of(finetuned)
    scratch_accuracy, _ = accuracy_of(baseline)
    plot_demo_curves(run, spans, {"pretrain": pre_results.get("accuracy"), "finetune": accuracy,
                                  "scratch": scratch_accuracy}, run.file("curves.png"))
    run.save_model(finetuned, "model.keras")
    run.save_model(baseline, "scratch.keras")
    overlay = None
    try:
        overlay = save_attention_overlays(finetuned, images[:8], np.asarray(TRANSFER_CLASSES)[test_y[:8]],
                                          np.asarray(TRANSFER_CLASSES)[predictions[:8]],
                                          run.file("attention_rollout.png"))
    except ImportError:  # keras_vit.analysis not available
        pass
    elapsed = time.time() - start
    run.write_metrics({
        "test_accuracy": accuracy, "scratch_test_accuracy": scratch_accuracy, "test_examples": int(len(test_y)),
        "labelled_examples": int(len(few_y)), "pretrain_test_accuracy_16px": pre_results.get("accuracy"),
        "pretrain_steps": pretrain_steps, "finetune_steps": (ft["steps"] // epochs) * epochs,
        "wall_seconds": round(elapsed, 1), "backend": keras.backend.backend(), "quick": args.quick,
        "seed": args.seed,
    })
    print(f"run folder: {run.path} (metrics.json, metrics.csv, history.csv, curves.png"
          + (", attention_rollout.png" if overlay else "") + ", pretrained.keras, model.keras, scratch.keras)")
    print(f"pre-trained model on the digits 0-4 at 16x16: test accuracy {pre_results.get('accuracy', float('nan')):.4f}; "
          f"wall time {elapsed:.0f} s")
    print(f"test accuracy: {accuracy:.4f} (from scratch: {scratch_accuracy:.4f})")
    return accuracy, scratch_accuracy


if __name__ == "__main__":
    main()
