"""`keras-vit fewshot`: the paper's few-shot linear evaluation of frozen features.

    keras-vit fewshot --arch ViTB16 --weights augreg_in21k --data tfds:cifar100 --shots 1,5,10,25 \
        --out runs/fewshot
    keras-vit fewshot --weights runs/pretrain --data digits --shots 1,5,10 --out runs/fewshot

For each shot count, `shots` training images per class are drawn (fixed seed), their pooled
features fitted by closed-form regularised least squares to {-1, 1}^K targets
(keras_vit.training.fewshot_linear_eval), and the test split classified. Writes metrics.json /
metrics.csv (accuracy per shot count) and fewshot.png.
"""

from keras_vit.commands import arguments, checks, resolution
from keras_vit.runs import RunFolder


def add_parser(subparsers):
    parser = subparsers.add_parser("fewshot", help="few-shot linear evaluation of frozen features",
                                   description=__doc__.split("\n\n")[0])
    arguments.add_model_args(parser)
    arguments.add_data_args(parser)
    parser.add_argument("--shots", type=arguments.shot_counts, default="1,5,10,25",
                        help="comma-separated shots (training images) per class")
    parser.add_argument("--l2-reg", type=arguments.number(float, low=0, low_open=True), default=1024.0,
                        help="ridge strength of the least-squares probe")
    parser.add_argument("--train-split", default="train", help="the split the shots are drawn from")
    parser.add_argument("--test-split", default="test", help="the split the probe is tested on")
    parser.add_argument("--max-train-images", type=arguments.positive_int, default=20_000,
                        help="draw the shots from the first N training images")
    parser.add_argument("--max-test-images", type=arguments.positive_int, default=10_000,
                        help="test on the first N test images")
    parser.add_argument("--seed", type=arguments.seed_int, default=0, help="seed of the drawing of the shots")
    parser.add_argument("--out", type=arguments.out_folder, required=True, help="run folder for metrics and plots")
    parser.set_defaults(func=fewshot)
    return parser


def _features(api, model, ds, limit, label, num_examples=None, data=None):
    """(features, labels) of the first `limit` images of split `label`; an empty split, a failed
    check in the pipeline or features that are not finite are a DataError naming the split."""
    import itertools

    import keras
    import numpy as np

    from keras_vit.errors import DataError
    from keras_vit.data.pipeline import numpy_batches

    total = min(limit, num_examples or limit)
    print(f"{label}: features of {total} images")
    bar = keras.utils.Progbar(total, unit_name="image")

    def batches():
        seen = 0
        for images, labels in numpy_batches(ds):
            images, labels = images[: limit - seen], labels[: limit - seen]
            yield images, labels
            seen += len(images)
            bar.update(seen)
            if seen >= limit:
                return

    chunks = batches()
    head = next(chunks, None)
    if head is None:
        raise DataError(f"{data!r} split {label!r} has no examples: no few-shot accuracy to report. Check the split "
                        "name and the data.")
    features, labels = api.extract_features(model, itertools.chain([head], chunks), return_labels=True)
    bad = ~np.isfinite(features).all(1)
    if bad.any():
        raise DataError(f"The model's features of {int(bad.sum())} of the {len(features)} {label} images are not "
                        f"finite (NaN or infinity), the first image {int(bad.argmax())}: its weights or inputs hold NaN "
                        "or overflow; no few-shot accuracy is computed from them.")
    return features, labels


def _draw_shots(api, labels, shots, args):
    """The indices of `shots` training images per class; too few images of a class is an error
    that names --shots and --max-train-images."""
    import numpy as np

    values, counts = np.unique(labels, return_counts=True)
    if len(counts) and counts.min() < shots:
        fewest = int(values[counts.argmin()])
        raise ValueError(
            f"--shots {shots}: class {fewest} has only {int(counts.min())} of the {len(labels)} training images read "
            f"(--train-split {args.train_split}, --max-train-images {args.max_train_images}); pass --shots of at most "
            f"{int(counts.min())}, or read more images with a larger --max-train-images."
        )
    return api.sample_shots(labels, shots, seed=args.seed)


def plot_fewshot(results, path, title):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(5, 3.6), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    shots = [r["shots"] for r in results]
    ax.plot(shots, [r["accuracy"] for r in results], "o-")
    ax.set_xscale("log")
    ax.set_xticks(shots, [str(s) for s in shots])
    ax.set_xlabel("images per class")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(path)


def fewshot(args):
    checks.check_model_args(args)  # before anything loads
    checks.check_data_args(args.data, {"--train-split": args.train_split, "--test-split": args.test_split},
                           args.data_dir)
    RunFolder.check_command(args.out, args.command)
    resolution.resolve_weights(args, image_size=args.image_size)
    import keras_vit.data as kd
    from keras_vit import training as api
    shots = args.shots  # sorted positive counts (checked while parsing)
    model = resolution.load_model(args, image_size=args.image_size, include_top=False, fresh_classes=1)
    image_size = model.image_size
    from keras_vit.models.family import input_normalization_of

    common = dict(image_size=image_size, batch_size=args.batch_size, classes=args.classes, data_dir=args.data_dir,
                  on_bad_file=args.on_bad_file, normalization=input_normalization_of(model))
    train_ds, info = kd.load_dataset(args.data, args.train_split, **common)
    test_ds, test_info = kd.load_dataset(args.data, args.test_split, **common)
    run = RunFolder.start(args.out, resolution.run_config(args, image_size=list(image_size)))
    train_x, train_y = _features(api, model, train_ds, args.max_train_images, args.train_split, info.num_examples,
                                 args.data)
    chosen = {n: _draw_shots(api, train_y, n, args) for n in shots}  # too few images fails before the test split
    test_x, test_y = _features(api, model, test_ds, args.max_test_images, args.test_split, test_info.num_examples,
                               args.data)
    num_classes = info.num_classes or int(max(train_y.max(), test_y.max()) + 1)
    results = []
    for n in shots:
        accuracy = api.fewshot_linear_eval(train_x[chosen[n]], train_y[chosen[n]], test_x, test_y,
                                           l2_reg=args.l2_reg, num_classes=num_classes)
        results.append({"shots": n, "train_images": int(len(chosen[n])), "accuracy": float(accuracy)})
        print(f"{n:>4}-shot linear accuracy: {accuracy:.4f}")
    run.write_table("fewshot", results)
    run.write_metrics({f"{r['shots']}shot_accuracy": r["accuracy"] for r in results} | {
        "test_images": int(len(test_y)), "feature_dim": int(train_x.shape[1]), "classes": num_classes})
    plot_fewshot(results, run.file("fewshot.png"), f"{args.data}: few-shot linear probe ({model.name})")
    print(f"run folder: {run.path}")
    return 0
