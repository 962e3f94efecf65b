"""`keras-vit finetune`: the paper's fine-tuning recipe on a dataset, into a run folder.

    keras-vit finetune --arch ViTB16 --weights augreg_in21k --data tfds:cifar100 --image-size 384 \
        --steps 10000 --batch-size 512 --lr 0.01 --warmup 500 --out runs/cifar100
    keras-vit finetune --weights runs/pretrain --data digits --image-size 32 --steps 300 --out runs/ft

On several hosts (a TPU pod slice: the same command on every worker; see docs/TPU.md):

    keras-vit finetune --distribute data --arch ViTB16 --weights augreg_in21k --data tfds:cifar100 \
        --image-size 384 --batch-size 512 --resume --out /mnt/shared/runs/cifar100

Recipe: SGD momentum 0.9, global-norm clip 1.0, no weight decay, linear warm-up then cosine
decay (with --layer-decay D, layer-wise rates: each layer group D times slower than the next); Inception crop + flip for training, resize for evaluation; a zero-initialised head and
position embeddings resized to the new resolution (keras_vit.training.for_finetuning). Any model
family fine-tunes; without --image-size, at its family's resolution (a BiT: BiT-HyperRule's, 128
px for images under 96x96, else 480; an EfficientNet: its architecture's), else the checkpoint's.
"""

import math
import time

from keras_vit.commands import arguments, checks, resolution


def add_parser(subparsers):
    parser = subparsers.add_parser(
        "finetune", help="fine-tune a model (any family) on a dataset (SGD momentum, warm-up + cosine)",
        description=__doc__.split("\n\n")[0],
    )
    arguments.add_model_args(parser)
    arguments.add_data_args(parser)
    group = parser.add_argument_group("training")
    group.add_argument("--steps", type=arguments.positive_int, default=500,
                       help="optimizer updates (paper: CIFAR 10k, Pets 500)")
    group.add_argument("--lr", type=arguments.number(float, low=0, low_open=True, example="0.003"), default=0.003,
                       help="base learning rate (paper: 0.001-0.03)")
    group.add_argument("--warmup", type=arguments.number(int, low=0), default=None,
                       help="warm-up steps, fewer than --steps (default: min(500, steps // 5))")
    group.add_argument("--eval-every", type=arguments.positive_int, default=None,
                       help="evaluate every N steps (default: steps // 5; adjusted so that the evaluations "
                       "divide --steps evenly)")
    group.add_argument("--eval-steps", type=arguments.positive_int, default=None,
                       help="batches per evaluation (default: all)")
    group.add_argument("--train-split", default="train", help="the split to train on")
    group.add_argument("--eval-split", default="test", help="the split to evaluate on")
    group.add_argument("--label-smoothing", type=arguments.number(float, low=0, high=1, high_open=True), default=0.0,
                       help="label smoothing of the loss")
    group.add_argument("--min-crop-area", type=arguments.number(float, low=0, high=1, low_open=True), default=0.05,
                       help="Inception crop area lower bound (fraction of the image)")
    group.add_argument("--no-crop", action="store_true", help="no Inception crop (resize only)")
    group.add_argument("--no-flip", action="store_true", help="no random horizontal flip")
    group.add_argument("--ema", type=arguments.number(float, low=0, high=1, low_open=True, high_open=True,
                                                    example="0.9999"),
                       default=None, metavar="MOMENTUM",
                       help="Polyak averaging of the weights, a momentum in (0, 1) (paper: 0.9999 for long runs); "
                       "evaluate and save the averages (default: no averaging)")
    group.add_argument("--layer-decay", type=arguments.number(float, low=0, high=1, low_open=True, example="0.75"),
                       default=None, metavar="D",
                       help="layer-wise learning-rate decay (BEiT, MAE, DINOv2 recipes): each group of layers from the "
                       "head down trains D times slower than the one above it, as timm's param_groups_layer_decay "
                       "(keras_vit.training.layer_decay_scales; Vision Transformers and Axial-ViTs) (default: one rate)")
    group.add_argument("--resume", action="store_true",
                       help="back up weights + optimizer state in OUT/backup each evaluation and resume an "
                       "interrupted run from it (with the arguments it was started with)")
    group.add_argument("--seed", type=arguments.seed_int, default=0, help="seed of the initialisation and the data")
    group.add_argument("--out", type=arguments.out_folder, required=True,
                       help="run folder (metrics, curves, model.keras)")
    group.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                       help="Keras verbosity: 1 progress bars, 2 lines, 0 quiet")
    arguments.add_distribution_args(parser)
    parser.set_defaults(func=finetune)
    return parser


def steps_plan(steps, eval_every):
    """(epochs, steps_per_epoch) with epochs * steps_per_epoch == steps (eval_every adjusted: at
    most `steps`, and a divisor of it)."""
    if steps < 1 or (eval_every is not None and eval_every < 1):
        raise ValueError(f"--steps {steps} and --eval-every {eval_every} must be positive whole numbers.")
    eval_every = min(eval_every or max(1, steps // 5), steps)
    epochs = max(1, round(steps / eval_every))
    while steps % epochs:
        epochs -= 1
    return epochs, steps // epochs


def _check_shared_folder(run, shard):
    """Every process of a job resumes from the backup process 0 writes: all must see the folder."""
    if shard is None:
        return
    import os

    from keras_vit import distribution

    distribution.barrier("config.json written")
    missing = distribution.processes_where(not os.path.exists(run.file("config.json")))
    if missing:
        raise ValueError(
            f"--resume: process{'es' if len(missing) > 1 else ''} {', '.join(map(str, missing))} cannot see the "
            f"config.json that process 0 wrote in --out {run.path}: every process reads the backup there to resume. "
            "Put --out on storage that every host mounts at the same path (NFS / Filestore, a bucket mounted with "
            "gcsfuse)."
        )


def _first_image_size(source):
    """(height, width) of the first training image: the data's image size that a family's
    resolution rule (BiT-HyperRule) reads when --image-size is not given."""
    for image, _ in source.take(1).as_numpy_iterator():
        return tuple(int(n) for n in image.shape[:2])
    return None


def start_distribution(args):
    """With --distribute data: join the job's processes and set a data-parallel distribution
    over all their devices (keras_vit.distribution). Returns the process shard for
    keras_vit.data.load_dataset (None in one process), after saying what runs where."""
    if not getattr(args, "distribute", None):
        return None
    import keras

    from keras_vit import distribution

    if keras.backend.backend() != "jax":
        raise ValueError(
            f"--distribute data runs on the JAX backend (keras.distribution); Keras runs on "
            f"{keras.backend.backend()!r} here. Set KERAS_BACKEND=jax, or leave out --distribute."
        )
    count = args.num_processes
    if count != 1 and (count or args.coordinator_address):
        timeout = getattr(args, "join_timeout", distribution.JOIN_TIMEOUT)
        print(f"process {args.process_id}: waiting up to {timeout:g} s for the job's {count or ''} processes to join at "
              f"the coordinator {args.coordinator_address or '(from the environment)'}".replace("  ", " "), flush=True)
    try:
        distribution.join_processes(args.coordinator_address, args.num_processes, args.process_id,
                                    timeout=getattr(args, "join_timeout", distribution.JOIN_TIMEOUT),
                                    program=f"keras-vit {args.command}")
    except distribution.NoJobFoundError:
        raise ValueError(
            "--distribute data found no job of several processes in the environment (a Cloud TPU pod slice, SLURM, "
            "Open MPI, KERAS_DISTRIBUTION_JOB_ADDRESSES): pass --coordinator-address HOST:PORT --num-processes N "
            "--process-id I in every process, or --num-processes 1 for this machine's devices alone."
        ) from None
    data_parallel = distribution.data_parallel()
    devices = int(data_parallel.device_mesh.devices.size)
    processes = distribution.process_count()
    if args.batch_size % devices:
        raise ValueError(
            f"--batch-size {args.batch_size} (the global batch) does not split evenly over the {devices} devices of "
            f"--distribute data ({processes} process{'es' if processes > 1 else ''}): pass a multiple of {devices}."
        )
    keras.distribution.set_distribution(data_parallel)
    print(f"data-parallel over {devices} devices in {processes} process{'es' if processes > 1 else ''} (this is "
          f"process {distribution.process_index()}): each process reads {args.batch_size // processes} of every "
          f"{args.batch_size} examples of a batch")
    return distribution.process_shard()


def build_optimizer(args, model, total_steps, warmup_steps):
    """The fine-tuning optimizer of the parsed `args` for `model`: the paper's SGD, with --ema's
    averaging and --layer-decay's per-variable rates (`training.layer_decay_scales`; a family
    without layer groups is refused with a ValueError)."""
    from keras_vit import training

    return training.finetune_optimizer(
        args.lr, total_steps=total_steps, warmup_steps=warmup_steps, use_ema=args.ema is not None,
        ema_momentum=args.ema or 0.9999, layer_decay=args.layer_decay,
        model=model if args.layer_decay is not None else None,
    )


def finetune(args):
    checks.check_model_args(args)  # before anything loads
    checks.check_training_args(args)
    checks.check_distribution_args(args)
    checks.check_resume(args)
    resolution.resolve_weights(args)  # model_for_task loads the base at its own resolution
    import keras

    import keras_vit.data as kd
    from keras_vit import training as api
    from keras_vit.runs import RunFolder

    keras.utils.set_random_seed(args.seed)  # the same seed in every process (runs nothing on the devices)
    shard = start_distribution(args)  # before anything runs on the devices
    # The data decides the class count (and checks --classes); the model is built for it.
    source, info = kd.load_source(args.data, args.train_split, data_dir=args.data_dir, on_bad_file=args.on_bad_file)
    if args.classes is not None and info.num_classes is not None and args.classes != info.num_classes:
        kd.pipeline._check_classes(args.classes, info)
    classes = info.num_classes or args.classes
    if classes is None:
        raise ValueError(f"Cannot tell how many classes {args.data!r} has: pass --classes.")
    model, base = resolution.model_for_task(args, args.image_size, classes,
                                            data_size=None if args.image_size else _first_image_size(source))
    image_size = model.image_size
    print(f"model: {model.name}, {model.count_params():,} parameters, input {image_size[0]}x{image_size[1]}, "
          f"{classes} classes" + (f" (from {base.name} at {base.image_size})" if base is not None else ""))

    # With --distribute each process reads its rows of every global batch (the same batches as one process).
    from keras_vit.models.family import input_normalization_of

    common = dict(image_size=image_size, batch_size=args.batch_size, seed=args.seed, data_dir=args.data_dir,
                  on_bad_file=args.on_bad_file, classes=classes, shard=shard,
                  normalization=input_normalization_of(model))  # the input the weights expect
    train_ds, train_info = kd.load_dataset(
        args.data, args.train_split, training=True, crop=not args.no_crop, flip=not args.no_flip,
        area_range=(args.min_crop_area, 1.0), **common,
    )
    eval_ds, eval_info = kd.load_dataset(args.data, args.eval_split, training=False, **common)
    epochs, steps_per_epoch = steps_plan(args.steps, args.eval_every)
    total = epochs * steps_per_epoch
    warmup = arguments.default_warmup(total) if args.warmup is None else args.warmup  # below total: checked above
    config = resolution.run_config(args, image_size=list(image_size), classes=classes, warmup=warmup,
                                train_examples=train_info.num_examples, eval_examples=eval_info.num_examples)
    checks.check_resume(args, config)  # what the model and the data decided, against the run's record
    if shard is not None and eval_info.num_examples and args.eval_steps is None:
        kept = eval_info.num_examples // args.batch_size * args.batch_size
        if kept < eval_info.num_examples:
            print(f"evaluating on {kept} of the {eval_info.num_examples} {args.eval_split} examples: several processes "
                  f"evaluate whole batches of {args.batch_size} only (a --batch-size dividing "
                  f"{eval_info.num_examples} uses them all)")
    optimizer = build_optimizer(args, model, total, warmup)  # before the run folder: it may refuse --layer-decay
    run = RunFolder(args.out)  # process 0 writes it; created once the model and data are ready
    run.save_config(config)
    backup, done = None, 0
    if args.resume:
        import os

        _check_shared_folder(run, shard)
        backup = os.path.join(run.path, "backup")
        progress = api.backup_progress(backup)
        if progress:
            done = progress["step"]
            print(f"resuming after step {done} from {backup}")
            run.load_history()
            # A kill between writing the history and the backup leaves rows the resumed run repeats.
            run.history = [r for r in run.history if r.get("step", 0) <= done]
            run.steps = [s for s in run.steps if s[0] <= done]
            train_ds = train_ds.skip(done)  # the same stream of batches, continued
    # The logger writes an epoch's history row before the backup of that epoch is written, so a
    # kill in between never loses a row (the rows past the backup are dropped above).
    callbacks = [run.logger(stage="finetune", step_offset=done)]
    callbacks += api.finetune_callbacks(backup_dir=backup, ema=args.ema is not None)
    model.compile(
        optimizer=optimizer,
        loss=api.classification_loss(model, label_smoothing=args.label_smoothing),
        metrics=["accuracy"],
    )
    groups = len(set(optimizer.learning_rate_scales.values()))
    print(f"fine-tuning {total} steps (batch {args.batch_size}, lr {args.lr}, warm-up {warmup}"
          + (f", layer decay {args.layer_decay} over {groups} rates" if groups else "") + "), "
          f"evaluating every {steps_per_epoch} steps on {args.eval_split}")
    start = time.time()
    model.fit(
        train_ds, steps_per_epoch=steps_per_epoch, epochs=epochs, validation_data=eval_ds,
        validation_steps=args.eval_steps, callbacks=callbacks, verbose=args.verbose,
        shuffle=False,
    )
    train_time = time.time() - start
    results = model.evaluate(eval_ds, steps=args.eval_steps, return_dict=True, verbose=args.verbose)
    metrics = {f"{args.eval_split}_{k}": v for k, v in results.items()}
    metrics.update(steps=total, train_seconds=round(train_time, 1), image_size=list(image_size), classes=classes)
    run.write_metrics(metrics)
    path = run.save_model(model)
    print(f"run folder: {run.path} (model {path})")
    accuracy = results.get("accuracy")
    if accuracy is not None and not math.isnan(accuracy):
        print(f"{args.eval_split} accuracy: {accuracy:.4f}")
    return 0
