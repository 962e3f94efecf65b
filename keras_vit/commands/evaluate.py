"""`keras-vit evaluate`: accuracy of a trained model on a dataset split, into a run folder.

    keras-vit evaluate --weights runs/cifar10 --data tfds:cifar10 --out runs/cifar10-eval
    keras-vit evaluate --weights runs/ft/model.keras --data digits --split test --out runs/eval

Writes metrics.json / metrics.csv (accuracy, top-5 accuracy, loss, examples), per_class.csv and
confusion.png (the confusion matrix).
"""

import numpy as np

from keras_vit.commands import _common


def add_parser(subparsers):
    parser = subparsers.add_parser("evaluate", help="evaluate a trained model on a dataset split",
                                   description=__doc__.split("\n\n")[0])
    _common.add_model_args(parser)
    _common.add_data_args(parser)
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", required=True, help="run folder for metrics and plots")
    parser.set_defaults(func=evaluate)
    return parser


def plot_confusion(matrix, class_names, path, title):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    k = len(matrix)
    figure = Figure(figsize=(min(2 + 0.4 * k, 14), min(1.6 + 0.4 * k, 13)), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    image = ax.imshow(matrix / np.maximum(matrix.sum(1, keepdims=True), 1), cmap="Blues", vmin=0, vmax=1)
    if k <= 40:
        ax.set_xticks(range(k), class_names, rotation=90, fontsize=7)
        ax.set_yticks(range(k), class_names, fontsize=7)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    figure.colorbar(image, ax=ax, fraction=0.046)
    figure.tight_layout()
    figure.savefig(path)


def predict_with_progress(model, ds, num_examples=None, verbose=1):
    """(probabilities or logits (N, K), labels (N,)) over a (images, labels) dataset, with a progress bar."""
    import keras

    bar = keras.utils.Progbar(num_examples, unit_name="image") if verbose else None
    outputs, labels, seen = [], [], 0
    for images, y in ds.as_numpy_iterator():
        outputs.append(np.asarray(keras.ops.convert_to_numpy(model.predict_on_batch(images)), np.float32))
        labels.append(np.argmax(y, -1) if y.ndim == 2 else y)
        seen += len(images)
        if bar:
            bar.update(seen)
    return np.concatenate(outputs), np.concatenate(labels)


def evaluate(args):
    _common.check_model_args(args, needs_weights=True)  # before anything loads
    _common.resolve_weights(args)  # load_trained_model loads it at its own resolution
    import keras_vit.data as kd
    from keras_vit.runs import RunFolder

    model = _common.load_trained_model(args)
    if args.image_size is not None and tuple(model.image_size) != (args.image_size, args.image_size):
        raise ValueError(
            f"The model runs at {tuple(model.image_size)}, not --image-size {args.image_size}: evaluate at the "
            "model's resolution (omit --image-size) or fine-tune it at the new one first."
        )
    ds, info = kd.load_dataset(args.data, args.split, image_size=tuple(model.image_size), batch_size=args.batch_size,
                               classes=args.classes, data_dir=args.data_dir, on_bad_file=args.on_bad_file)
    head = model.output_shape[-1]
    if info.num_classes is not None and head != info.num_classes:
        raise ValueError(
            f"The model's head has {head} classes but {args.data!r} has {info.num_classes}: evaluate on data with "
            f"{head} classes, or fine-tune the model for these classes first (keras-vit finetune)."
        )
    run = RunFolder(args.out)
    run.save_config(_common.run_config(args, image_size=list(model.image_size)))
    scores, labels = predict_with_progress(model, ds, info.num_examples)
    predictions = scores.argmax(1)
    k = scores.shape[1]
    top5 = np.mean(np.any(np.argsort(-scores, 1)[:, :5] == labels[:, None], 1)) if k > 5 else 1.0
    probabilities = scores
    if not np.allclose(scores.sum(1), 1.0, atol=1e-3) or scores.min() < 0:  # logits
        shifted = np.exp(scores - scores.max(1, keepdims=True))
        probabilities = shifted / shifted.sum(1, keepdims=True)
    loss = float(-np.mean(np.log(np.maximum(probabilities[np.arange(len(labels)), labels], 1e-12))))
    matrix = np.zeros((k, k), np.int64)
    np.add.at(matrix, (labels, predictions), 1)
    names = info.class_names or [str(i) for i in range(k)]
    run.write_table("per_class", [
        {"class": names[c], "examples": int(matrix[c].sum()),
         "accuracy": float(matrix[c, c] / matrix[c].sum()) if matrix[c].sum() else None}
        for c in range(k)
    ])
    accuracy = float(np.mean(predictions == labels))
    run.write_metrics({"accuracy": accuracy, "top5_accuracy": float(top5), "loss": loss,
                       "examples": int(len(labels)), "split": args.split, "data": args.data})
    plot_confusion(matrix, names, run.file("confusion.png"), f"{args.data} {args.split}: accuracy {accuracy:.4f}")
    print(f"run folder: {run.path}")
    print(f"{args.split} accuracy: {accuracy:.4f} ({len(labels)} images)")
    return 0
