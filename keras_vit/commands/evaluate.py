"""`keras-vit evaluate`: a trained model on a dataset split by that dataset's protocol, into a run folder.

    keras-vit evaluate --weights runs/cifar10 --data tfds:cifar10 --out runs/cifar10-eval
    keras-vit evaluate --preset ViTB16.augreg2_in21k_ft_in1k --data tfds:imagenet2012_real --out runs/real
    keras-vit evaluate --preset ViTB16.augreg2_in21k_ft_in1k --data tfds:imagenet_v2 --out runs/v2
    keras-vit evaluate --preset ViTB16.augreg2_in21k_ft_in1k --data objectnet:/data/objectnet-1.0 --out runs/on

Writes metrics.json / metrics.csv (top1, top5, loss, examples, mean per-class accuracy, as
fractions; on tfds:imagenet2012_real also real_top1 and real_examples), per_class.csv and
confusion.png (the confusion matrix). docs/evaluation.md describes each protocol.
"""

import numpy as np

from keras_vit.commands import arguments, checks, resolution
from keras_vit.runs import RunFolder


def add_parser(subparsers):
    parser = subparsers.add_parser("evaluate", help="evaluate a trained model (top-1/5, ReaL, ImageNet-V2, ObjectNet)",
                                   description=__doc__.split("\n\n")[0])
    arguments.add_model_args(parser)
    group = arguments.add_data_args(parser)
    group.description = (
        "--data also takes tfds:imagenet2012_real (ReaL labels), tfds:imagenet_v2[/threshold-0.7|/topimages] and "
        "objectnet:PATH (the unpacked ObjectNet download)"
    )
    parser.add_argument("--split", default="test", help="the split to evaluate (ReaL: the validation images)")
    parser.add_argument("--out", type=arguments.out_folder, required=True, help="run folder for metrics and plots")
    parser.add_argument("--verbose", type=int, choices=(0, 1), default=1, help="1: a progress bar, 0: quiet")
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


def evaluate(args):
    checks.check_model_args(args, needs_weights=True)  # before anything loads
    checks.check_data_args(args.data, {"--split": args.split}, args.data_dir)
    RunFolder.check_command(args.out, args.command)
    resolution.resolve_weights(args)  # load_trained_model loads it at its own resolution
    from keras_vit.evaluation import evaluate_classifier, load_for_evaluation, load_mapping

    resolved = getattr(args, "_resolved_weights", None)
    local = getattr(resolved, "path", None) or resolution.weights_argument(args)
    model = load_for_evaluation(local) if isinstance(local, str) else None  # EMA weights when the file keeps them
    ema = model is not None
    if model is None:
        model = resolution.load_trained_model(args)
    if args.image_size is not None and model.image_size != arguments.image_hw(args.image_size):
        raise ValueError(
            f"The model runs at {arguments.format_image_size(model.image_size)}, not --image-size "
            f"{arguments.format_image_size(args.image_size)}: evaluate at the model's resolution (omit --image-size) or "
            "fine-tune it at the new one first."
        )
    head = model.output_shape[-1]
    if args.classes is not None and args.classes != head:
        raise ValueError(f"--classes {args.classes} contradicts the model: its head has {head} classes.")
    result = evaluate_classifier(model, args.data, args.split, batch_size=args.batch_size, data_dir=args.data_dir,
                                 on_bad_file=args.on_bad_file, verbose=args.verbose)
    # Created once the evaluation has run: a failed start leaves none.
    run = RunFolder.start(args.out, resolution.run_config(args, image_size=list(model.image_size)))
    run.write_table("per_class", result.per_class)
    metrics = dict(result.metrics)
    # `accuracy` / `top5_accuracy`: the names of earlier versions, kept for scripts that read them.
    metrics.update(accuracy=metrics["top1"], top5_accuracy=metrics.get("top5"), data=args.data,
                   ema_weights=ema)
    metrics.setdefault("split", args.split)  # the split scored (ReaL: validation, whatever --split says)
    run.write_metrics(metrics)
    top1 = metrics["top1"]
    plot_confusion(result.confusion, result.class_names, run.file("confusion.png"),
                   f"{args.data} {metrics['split']}: top-1 {top1:.4f}")
    print(f"run folder: {run.path}")
    if metrics.get("protocol") == "objectnet":
        overlapping = len(load_mapping()[0])
        print(f"ObjectNet: {metrics['classes_found']} of the {overlapping} classes that overlap ImageNet found in "
              f"{args.data[len('objectnet:'):]}")
    if metrics.get("real_examples") is not None:
        real = metrics["real_top1"]
        print(f"ReaL top-1: {'n/a' if real is None else f'{real:.4f}'} ({metrics['real_examples']} images with ReaL "
              "labels)")
    print(f"{metrics['split']} accuracy: {top1:.4f} (top-5 {metrics['top5']:.4f}, {metrics['examples']} images, "
          f"{args.data})")
    return 0
