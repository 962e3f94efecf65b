"""`keras-vit vtab`: fine-tune and evaluate a checkpoint on the 19 VTAB-1k tasks, the paper's one setting.

    keras-vit vtab --preset ViTB16.augreg_in21k --data-dir ~/tensorflow_datasets --out runs/vtab
    keras-vit vtab --preset ViTB16.augreg_in21k --tasks dtd,clevr_count --steps 100 --image-size 224 \
        --batch-size 64 --out runs/vtab-quick

Setting (the paper's Table 4, keras_vit.evaluation.VTAB_1K): 800 train + 200 val examples per
task, 2500 steps, learning rate 0.01, batch 512 (--micro-batch-size: gradient accumulation
where memory needs it), 384 px, SGD momentum 0.9, global-norm clip 1.0, cosine decay, no weight
decay. OUT holds vtab.json, vtab.csv (per task and the three group means), vtab.png (Figure 2's
group bars) and tasks/<task>.json; a rerun with the same OUT resumes with the next task.
"""

from keras_vit.commands import arguments, checks, resolution
from keras_vit.runs import RunFolder


def _setting():
    from keras_vit.evaluation.vtab import VTAB_1K  # no Keras: the table only

    return VTAB_1K


def add_parser(subparsers):
    setting = _setting()
    positive = arguments.positive_int
    parser = subparsers.add_parser("vtab", help="fine-tune and evaluate on the 19 VTAB-1k tasks",
                                   description=__doc__.split("\n\n")[0])
    arguments.add_model_args(parser, square_reason="vtab fine-tunes every task at one square resolution (the "
                             f"paper's {setting.image_size} px)",
                             image_size_default=f"the paper's {setting.image_size}")
    parser.add_argument("--data-dir", default=None, help="tensorflow-datasets data directory holding the tasks' data")
    parser.add_argument("--tasks", default=None,
                        help="comma-separated tasks (default: all 19), e.g. dtd,clevr_count or vtab/dtd")
    parser.add_argument("--steps", type=positive, default=None,
                        help=f"optimizer updates per task (default: the paper's {setting.steps})")
    parser.add_argument("--batch-size", type=positive, default=None,
                        help=f"examples per update (default: the paper's {setting.batch_size})")
    parser.add_argument("--micro-batch-size", type=positive, default=None,
                        help="examples per forward pass; the batch is reached by gradient accumulation (default: the "
                        "whole batch)")
    parser.add_argument("--eval-batch-size", type=positive, default=None,
                        help="test images per batch (default: the micro-batch size, at most 256)")
    parser.add_argument("--seed", type=arguments.seed_int, default=0,
                        help="seed of the training data's order and augmentation")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                        help="Keras verbosity: 1 progress bars, 2 lines, 0 quiet")
    parser.add_argument("--out", type=arguments.out_folder, required=True,
                        help="run folder (tables, plot, one file per finished task)")
    parser.set_defaults(func=vtab)
    return parser


def vtab(args):
    from keras_vit.evaluation.vtab import check_micro_batch_size, check_run_folder, effective_setting, resolve_tasks

    tasks = resolve_tasks(args.tasks)  # an unknown task fails before anything loads
    checks.check_data_dir(args.data_dir)
    check_run_folder(args.out, tasks, effective_setting(_setting(), steps=args.steps, batch_size=args.batch_size,
                                                        image_size=args.image_size))
    checks.check_model_args(args, default_image_size=_setting().image_size)
    if args.micro_batch_size is not None:
        check_micro_batch_size(args.micro_batch_size, args.batch_size or _setting().batch_size,
                               names=("--micro-batch-size", "--batch-size"))
    image_size = args.image_size or _setting().image_size
    resolution.resolve_weights(args, image_size=image_size)
    from keras_vit.evaluation import run_vtab
    from keras_vit.evaluation.vtab import check_run_weights

    RunFolder.check_command(args.out, args.command)
    weights = resolution.weights_id(args)
    check_run_weights(args.out, weights)

    if resolution.weights_argument(args) is None:  # --weights none: a random --arch, for trials
        model = resolution.load_model(args, image_size=image_size, fresh_classes=1)
    else:
        model = resolution.load_model(args, include_top=False)
    print(f"model: {model.name}, {model.count_params():,} parameters; {len(tasks)} VTAB-1k task(s) into {args.out}")
    # The run's arguments and weights (`keras-vit report` gives runs of the same weights one column).
    RunFolder.start(args.out, resolution.run_config(args))
    result = run_vtab(model, args.out, tasks=tasks, weights=weights, steps=args.steps, batch_size=args.batch_size,
                      image_size=args.image_size, micro_batch_size=args.micro_batch_size,
                      eval_batch_size=args.eval_batch_size, data_dir=args.data_dir, seed=args.seed,
                      verbose=args.verbose)
    groups = result["groups"]
    for key in ("natural", "specialized", "structured", "all"):
        g = groups[key]
        if g["mean"] is not None:
            print(f"{key}: {100 * g['mean']:.2f}% ({g['tasks']} of {g['of']} tasks)")
    return 0
