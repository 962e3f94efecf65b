"""The VTAB-1k suite (Zhai et al. 2019) with the paper's single setting (its Table 4).

    from keras_vit.evaluation import run_vtab
    table = run_vtab(keras_vit.ViTB16(weights="augreg_in21k", include_top=False), "runs/vtab")

Each of the 19 tasks fine-tunes a copy of the model (`keras_vit.training.for_finetuning`: a
zero head, position embeddings resized) on the task's 800 training + 200 validation examples
and reports the top-1 accuracy on its test split. The three groups (natural, specialized,
structured) and the whole suite are the means over their tasks.

The run folder holds one file per finished task (tasks/<task>.json), so an interrupted run
resumes with the next task; vtab.json / vtab.csv (the table with the group means) are rewritten
after every task, vtab.png (Figure 2's group bars) at the end of the run.
"""

import dataclasses
import json
import os
import time

import numpy as np

from keras_vit.data.tfds_sources import TFDS_DATASETS, VTAB_TASKS, get_tfds_source
from keras_vit.storage.json_files import read_json_object

GROUPS = ("natural", "specialized", "structured")


@dataclasses.dataclass(frozen=True)
class VtabSetting:
    """One fine-tuning setting for every VTAB-1k task."""

    steps: int = 2500
    learning_rate: float = 0.01
    batch_size: int = 512
    image_size: int = 384
    momentum: float = 0.9
    global_clipnorm: float = 1.0
    warmup_steps: int = 500  # the original code's fine-tuning warm-up (no more than a fifth of the steps)
    train_split: str = "train800val200"  # the first 800 train + first 200 val examples
    test_split: str = "test"
    weight_decay: float = 0.0  # none: SGD with momentum, cosine decay


#: The paper's VTAB-1k setting (Table 4): 2500 steps at learning rate 0.01, batch 512, 384 px,
#: SGD momentum 0.9, global-norm clipping at 1.0, cosine decay, no weight decay.
VTAB_1K = VtabSetting()


def resolve_tasks(tasks=None):
    """The VTAB task names of `tasks` (names with or without "vtab/", a list or a comma-separated
    string; None: all 19). An unknown name is an error that lists the tasks."""
    if tasks is None:
        return list(VTAB_TASKS)
    if isinstance(tasks, str):
        tasks = [t for t in tasks.split(",") if t.strip()]
    names = []
    for task in tasks:
        name = task.strip()
        name = name if name.startswith("vtab/") else f"vtab/{name}"
        if name not in VTAB_TASKS:
            get_tfds_source(name)  # raises the error that lists the tasks
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"No VTAB task given. Tasks: {', '.join(VTAB_TASKS)}.")
    return names


def _task_file(out, task):
    return os.path.join(out, "tasks", task.split("/", 1)[1] + ".json")


def summarise(rows):
    """Group means and the suite mean (fractions) of per-task rows ({"task", "group", "top1"})."""
    summary = {}
    for group in GROUPS:
        values = [r["top1"] for r in rows if r["group"] == group]
        total = sum(1 for t in VTAB_TASKS if TFDS_DATASETS[t].vtab == group)
        summary[group] = {"mean": float(np.mean(values)) if values else None, "tasks": len(values), "of": total}
    values = [r["top1"] for r in rows]
    summary["all"] = {"mean": float(np.mean(values)) if values else None, "tasks": len(values), "of": len(VTAB_TASKS)}
    return summary


def _not_a_task(path, reason):
    return ValueError(f"{path} {reason}: it was not written by keras-vit vtab, or it was cut short; delete it to run "
                      "that task again.")


def _read_task(path):
    """A finished task's row (None when the task has not run); a file that is not one is an error
    that names it."""
    row = read_json_object(path, missing=None, malformed=_not_a_task)
    if row is not None and not (isinstance(row.get("setting"), dict) and "top1" in row):
        raise _not_a_task(path, "is not a task result (no top1 and setting)")
    return row


def read_results(out):
    """The finished tasks' rows of a VTAB run folder, in the suite's order."""
    rows = [_read_task(_task_file(out, task)) for task in VTAB_TASKS]
    return [row for row in rows if row is not None]


#: The VtabSetting fields that `keras-vit vtab` sets, and their flags.
_FLAGS = {"steps": "--steps", "batch_size": "--batch-size", "image_size": "--image-size"}


def effective_setting(setting=VTAB_1K, *, steps=None, batch_size=None, image_size=None):
    """`setting` with the given fields replaced, and its warm-up shortened to at most a fifth of
    the steps."""
    overrides = {k: v for k, v in (("steps", steps), ("batch_size", batch_size), ("image_size", image_size))
                 if v is not None}
    setting = dataclasses.replace(setting, **overrides)
    return dataclasses.replace(setting, warmup_steps=min(setting.warmup_steps, setting.steps // 5))


def check_micro_batch_size(micro, batch, names=("micro_batch_size", "batch_size")):
    """Refuse a micro-batch size that does not divide the batch (an update is made of equal
    micro-batches), naming both (`names`: the arguments' or the flags' names) and the largest
    divisors below it."""
    if micro <= batch and batch % micro == 0:
        return
    divisors = [d for d in range(min(micro, batch), 0, -1) if batch % d == 0][:2]
    raise ValueError(
        f"{names[0]} {micro} does not divide {names[1]} {batch} (the examples of one update, made of equal "
        f"micro-batches): pass a divisor of {batch}, e.g. {' or '.join(map(str, divisors))}."
    )


def check_run_folder(out, tasks, setting):
    """Refuse to add results of `setting` to a run folder whose finished tasks used another one
    (a rerun resumes with the next task only when the setting is the same)."""
    compared = dataclasses.asdict(setting)
    for task in tasks:
        done = _read_task(_task_file(out, task))
        if done is None:
            continue
        before = {k: done["setting"].get(k) for k in compared}
        if before != compared:
            changes = ", ".join(f"{_FLAGS.get(k, k)} {before[k]} (now {compared[k]})" for k in compared
                                if before[k] != compared[k])
            raise ValueError(
                f"{out} holds {task} results of another setting: {changes}. Resume with the setting it was started "
                "with, or write this run to another --out folder."
            )


def check_run_weights(out, weights):
    """Refuse to add results of `weights` to a run folder whose finished tasks ran other weights
    (vtab.json records them): the group means would mix two models."""
    try:
        with open(os.path.join(out, "vtab.json")) as f:
            before = json.load(f).get("weights")
    except (OSError, ValueError, AttributeError):
        return
    if before is None or before == weights or not read_results(out):
        return
    raise ValueError(
        f"{out} holds VTAB results of the weights {before}, not {weights}: resume with those weights, or write this "
        "run to another --out folder."
    )


def write_tables(out, rows, setting_record, plot=True, weights=None):
    """vtab.json (tasks, groups, setting, weights), vtab.csv (one row per task, then the group
    means) and, with `plot`, vtab.png."""
    import csv

    summary = summarise(rows)
    with open(os.path.join(out, "vtab.json"), "w") as f:
        json.dump({"tasks": rows, "groups": summary, "setting": setting_record, "weights": weights}, f, indent=2)
    with open(os.path.join(out, "vtab.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["task", "group", "top1", "examples"])
        for r in rows:
            writer.writerow([r["task"], r["group"], f"{r['top1']:.6f}", r["examples"]])
        for group in (*GROUPS, "all"):
            s = summary[group]
            writer.writerow([f"mean ({s['tasks']} of {s['of']} tasks)", group,
                             "" if s["mean"] is None else f"{s['mean']:.6f}", ""])
    if plot:
        plot_groups(rows, os.path.join(out, "vtab.png"))
    return summary


def plot_groups(rows, path, title="VTAB-1k"):
    """Figure 2's layout: one bar per group (VTAB overall, Natural, Specialized, Structured) with
    the mean top-1 accuracy in %, each task a dot on its group's bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    summary = summarise(rows)
    labels = ["VTAB (19 tasks)", "Natural (7)", "Specialized (4)", "Structured (8)"]
    keys = ["all", *GROUPS]
    colours = ["#4c72b0", "#55a868", "#c44e52", "#8172b2"]
    figure = Figure(figsize=(8, 4), dpi=100)
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    for i, (key, colour) in enumerate(zip(keys, colours)):
        mean = summary[key]["mean"]
        if mean is None:
            continue
        ax.bar(i, 100 * mean, color=colour, width=0.6)
        ax.text(i, 100 * mean + 1, f"{100 * mean:.1f}", ha="center", fontsize=9)
        points = [100 * r["top1"] for r in rows if key == "all" or r["group"] == key]
        ax.plot(np.full(len(points), i) + np.linspace(-0.2, 0.2, len(points)), points, "k.", ms=4, alpha=0.6)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("top-1 accuracy [%]")
    ax.set_ylim(0, 105)
    done = summary["all"]["tasks"]
    ax.set_title(title + ("" if done == len(VTAB_TASKS) else f" ({done} of {len(VTAB_TASKS)} tasks)"))
    ax.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)
    return path


def _setting_record(setting, micro_batch_size):
    record = dataclasses.asdict(setting)
    record["micro_batch_size"] = micro_batch_size
    return record


def own_size(model):
    """A model's input size as a VTAB setting states it: one side when square."""
    height, width = (int(n) for n in model.image_size)
    return height if height == width else (height, width)


def run_vtab(model, out, *, tasks=None, weights=None, setting=VTAB_1K, steps=None, batch_size=None, image_size=None,
             micro_batch_size=None, eval_batch_size=None, data_dir=None, seed=0, verbose=1):
    """Fine-tune `model` on VTAB-1k tasks and evaluate each on its test split.

    Args:
        model: a keras_vit model of any family (e.g. a pre-trained one, any head); each task
            fine-tunes its own copy (`keras_vit.training.for_finetuning`). A family that cannot
            change its input size (an AxialResNet) runs at its own unless `image_size` is given.
        out: run folder (created): tasks/<task>.json per finished task, vtab.json, vtab.csv, vtab.png.
        tasks: task names (e.g. ["dtd", "vtab/clevr_count"]); default: all 19.
        weights: what `model`'s weights are (a preset name, hf://owner/repo or a checkpoint's
            absolute path), recorded in vtab.json: `keras-vit report` gives runs of the same
            weights one column. A folder whose finished tasks ran other weights is refused.
        setting: a VtabSetting (default: the paper's); `steps`, `batch_size`, `image_size`
            override its fields for quick runs.
        micro_batch_size: examples per forward pass; the batch is then reached by gradient
            accumulation (batch_size must be a multiple). Default: the whole batch at once.
        eval_batch_size: test batch (default: micro_batch_size or batch_size, at most 256).

    Returns:
        {"tasks": rows, "groups": group means} (top-1 accuracies as fractions).
    """
    import keras

    import keras_vit.data as kd
    from keras_vit import training
    from keras_vit.evaluation.evaluators import evaluate_classifier

    from keras_vit.models.family import family_of, input_normalization_of

    if image_size is None and not family_of(model).transfer.resizable:
        image_size = own_size(model)  # a family fine-tuned at its own resolution only (an AxialResNet)
    setting = effective_setting(setting, steps=steps, batch_size=batch_size, image_size=image_size)
    micro = micro_batch_size or setting.batch_size
    check_micro_batch_size(micro, setting.batch_size)
    accumulation = setting.batch_size // micro
    names = resolve_tasks(tasks)
    check_run_folder(out, names, setting)
    check_run_weights(out, weights)
    os.makedirs(os.path.join(out, "tasks"), exist_ok=True)
    record = _setting_record(setting, micro)
    for number, task in enumerate(names, 1):
        path = _task_file(out, task)
        if os.path.exists(path):
            print(f"[{number}/{len(names)}] {task}: done before (resumed)")
            continue
        source = get_tfds_source(task)
        print(f"[{number}/{len(names)}] {task}: fine-tuning {setting.steps} steps at {setting.image_size} px, batch "
              f"{setting.batch_size}" + (f" ({accumulation} x {micro})" if accumulation > 1 else ""))
        start = time.time()
        train_ds, info = kd.load_dataset(
            f"tfds:{task}", setting.train_split, image_size=setting.image_size, batch_size=micro, training=True,
            seed=seed, classes=source.classes, data_dir=data_dir,
            normalization=input_normalization_of(model),  # the input the weights expect, as evaluate_classifier's
        )
        keras.utils.set_random_seed(seed)
        task_model = training.for_finetuning(model, image_size=setting.image_size, classes=source.classes,
                                             classifier_activation=None)
        task_model.compile(
            optimizer=training.finetune_optimizer(
                setting.learning_rate, total_steps=setting.steps, warmup_steps=setting.warmup_steps,
                momentum=setting.momentum, global_clipnorm=setting.global_clipnorm,
                gradient_accumulation_steps=accumulation if accumulation > 1 else None,
            ),
            loss=training.classification_loss(task_model),
        )
        history = task_model.fit(train_ds, steps_per_epoch=setting.steps * accumulation, epochs=1,
                                 verbose=verbose, shuffle=False)
        result = evaluate_classifier(task_model, f"tfds:{task}", setting.test_split,
                                     batch_size=eval_batch_size or min(micro, 256), data_dir=data_dir,
                                     verbose=verbose)
        row = {
            "task": task, "group": source.vtab, "top1": result.metrics["top1"],
            "examples": result.metrics["examples"], "classes": source.classes,
            "train_examples": info.num_examples, "final_train_loss": float(history.history["loss"][-1]),
            "seconds": round(time.time() - start, 1), "setting": record,
        }
        with open(path + ".tmp", "w") as f:
            json.dump(row, f, indent=2)
        os.replace(path + ".tmp", path)  # a task's file appears whole or not at all
        print(f"[{number}/{len(names)}] {task}: top-1 {row['top1']:.4f} on {row['examples']} test images "
              f"({row['seconds']:.0f} s)")
        write_tables(out, read_results(out), record, plot=False, weights=weights)  # the plot is drawn once, at the end
        del task_model
    rows = read_results(out)
    summary = write_tables(out, rows, record, weights=weights)
    return {"tasks": rows, "groups": summary}
