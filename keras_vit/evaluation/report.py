"""Table 2 of the paper from run folders: `keras-vit evaluate` and `keras-vit vtab` results in
Table 2's rows, with the paper's figures beside them.

    table = table2(["runs/in1k-real", "runs/cifar10", "runs/vtab"])
    print(to_markdown(table))
"""

import csv
import io
import os

from keras_vit.storage.json_files import read_json_object

#: Table 2's rows, in its order.
ROWS = ("ImageNet", "ImageNet ReaL", "CIFAR-10", "CIFAR-100", "Oxford-IIIT Pets", "Oxford Flowers-102",
        "VTAB (19 tasks)")

#: The paper's Table 2 (Dosovitskiy et al. 2021): top-1 accuracy in %, mean (± std over three
#: fine-tuning runs where given). ViT-H/14 and ViT-L/16 pre-trained on JFT-300M; BiT-L is
#: ResNet152x4 (Kolesnikov et al. 2020).
PAPER_TABLE2 = {
    "ViT-H/14 (JFT)": {
        "ImageNet": "88.55 ± 0.04", "ImageNet ReaL": "90.72 ± 0.05", "CIFAR-10": "99.50 ± 0.06",
        "CIFAR-100": "94.55 ± 0.04", "Oxford-IIIT Pets": "97.56 ± 0.03", "Oxford Flowers-102": "99.68 ± 0.02",
        "VTAB (19 tasks)": "77.63 ± 0.23",
    },
    "ViT-L/16 (JFT)": {
        "ImageNet": "87.76 ± 0.03", "ImageNet ReaL": "90.54 ± 0.03", "CIFAR-10": "99.42 ± 0.03",
        "CIFAR-100": "93.90 ± 0.05", "Oxford-IIIT Pets": "97.32 ± 0.11", "Oxford Flowers-102": "99.74 ± 0.00",
        "VTAB (19 tasks)": "76.28 ± 0.46",
    },
    "BiT-L (ResNet152x4)": {
        "ImageNet": "87.54 ± 0.02", "ImageNet ReaL": "90.54", "CIFAR-10": "99.37 ± 0.06",
        "CIFAR-100": "93.51 ± 0.08", "Oxford-IIIT Pets": "96.62 ± 0.23", "Oxford Flowers-102": "99.63 ± 0.03",
        "VTAB (19 tasks)": "76.29 ± 1.70",
    },
}

#: tfds dataset -> (Table 2 row, metric key) of an evaluate run's metrics.json.
_DATA_ROWS = {
    "imagenet2012": (("ImageNet", "top1"),),
    "imagenet2012_real": (("ImageNet", "top1"), ("ImageNet ReaL", "real_top1")),
    "cifar10": (("CIFAR-10", "top1"),),
    "cifar100": (("CIFAR-100", "top1"),),
    "oxford_iiit_pet": (("Oxford-IIIT Pets", "top1"),),
    "oxford_flowers102": (("Oxford Flowers-102", "top1"),),
}


#: The command that writes each file that a report reads.
_WRITERS = {"metrics.json": "keras-vit evaluate", "vtab.json": "keras-vit vtab",
            "config.json": "keras-vit evaluate or vtab"}


def _unreadable(path, what):
    writer = _WRITERS.get(os.path.basename(path), "keras-vit")
    return ValueError(f"{path} {what}: it is not a file that {writer} wrote, or it was cut short; run {writer} "
                      "again into that folder, or leave the folder out.")


def _read_json(path):
    """The JSON object in `path` (None when there is no such file); a file that is not JSON, or
    not a JSON object, is an error that names it."""
    return read_json_object(path, missing=None, malformed=_unreadable)


def _check_run_folder(run_dir):
    if not os.path.isdir(run_dir):
        what = "is a file, not a run folder" if os.path.exists(run_dir) else "does not exist"
        raise (NotADirectoryError if os.path.exists(run_dir) else FileNotFoundError)(
            f"Run folder {run_dir!r} {what}: pass folders written by keras-vit evaluate or keras-vit vtab (--out)."
        )


def _fraction(path, key, value):
    """An accuracy read from a run's file: a finite fraction in [0, 1], else an error that names the
    file, the key and the value."""
    import math

    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise _unreadable(path, f"holds {key}={value!r}, not a number")
    if not math.isfinite(value):
        raise _unreadable(path, f"holds {key}={value!r}, not a finite accuracy (the run's outputs or loss were not "
                          "finite)")
    if not 0 <= value <= 1:
        hint = f" (a percentage? {value} % is {value / 100:g})" if 1 < value <= 100 else ""
        raise _unreadable(path, f"holds {key}={value!r}, not a fraction in [0, 1]{hint}; keras-vit writes accuracies "
                          "as fractions")
    return float(value)


def recorded_weights(run_dir):
    """The weights a run folder records (`weights_id` of config.json, or vtab.json's `weights`):
    a preset name, hf://owner/repo, or the absolute path of a local checkpoint; None when it
    records none (a --weights none run, or a folder written by an earlier version)."""
    config = _read_json(os.path.join(run_dir, "config.json")) or {}
    weights = config.get("weights_id") or (_read_json(os.path.join(run_dir, "vtab.json")) or {}).get("weights")
    if weights:
        return str(weights)
    # A folder of an earlier version records the flags as typed: only a name means the same wherever it is read.
    typed = config.get("preset") or config.get("weights")
    if isinstance(typed, str) and typed.startswith("hf://"):
        return typed
    from keras_vit.presets import preset_by_name

    try:
        preset = preset_by_name(typed) if isinstance(typed, str) else None
    except ValueError:
        preset = None
    return preset.name if preset is not None else None


def _column_key(run_dir):
    """(key, label) of a run's column: runs recording the same weights share one; a run that
    records none has its own (keyed by the folder's absolute path, wherever `report` runs from)."""
    weights = recorded_weights(run_dir)
    if weights is None:
        folder = os.path.abspath(run_dir)
        return folder, os.path.basename(os.path.normpath(folder))
    if os.path.isabs(weights):  # a local checkpoint: its file or folder name
        name = os.path.basename(os.path.normpath(weights))
        parent = os.path.basename(os.path.dirname(os.path.normpath(weights)))
        return weights, parent if name == "model.keras" and parent else name
    return weights, weights


def run_results(run_dir):
    """{Table 2 row: accuracy in %} of one run folder (an evaluate or a vtab run)."""
    run_dir = os.fspath(run_dir)
    _check_run_folder(run_dir)
    found = {}
    path = os.path.join(run_dir, "vtab.json")
    vtab = _read_json(path)
    if vtab:
        groups = vtab.get("groups")
        groups = groups.get("all") if isinstance(groups, dict) else None
        if not (isinstance(groups, dict) and {"mean", "tasks", "of"} <= set(groups)):
            raise _unreadable(path, "has no groups.all entry with a mean, tasks and of")
        mean = _fraction(path, "groups.all.mean", groups["mean"])
        if mean is not None:
            suffix = "" if groups["tasks"] == groups["of"] else f" ({groups['tasks']} of {groups['of']} tasks)"
            found["VTAB (19 tasks)"] = f"{100 * mean:.2f}{suffix}"
    path = os.path.join(run_dir, "metrics.json")
    metrics = _read_json(path)
    if metrics and str(metrics.get("data", "")).startswith("tfds:"):
        name = metrics["data"][len("tfds:"):]
        for row, key in _DATA_ROWS.get(name, ()):
            value = _fraction(path, key, metrics.get(key))
            if value is not None:
                found[row] = f"{100 * value:.2f}"
    if not found:
        raise ValueError(
            f"{run_dir!r} holds no result of Table 2's rows: it needs metrics.json of `keras-vit evaluate` on "
            f"tfds:{', tfds:'.join(_DATA_ROWS)}, or vtab.json of `keras-vit vtab`."
        )
    return found


def table2(run_dirs, paper=True):
    """{"columns": [...], "rows": [[row name, value per column], ...]}: one column per model
    (runs that record the same weights share it, `recorded_weights`; two results of one row and
    model are an error), then the paper's columns when `paper`."""
    keys, labels, values = [], {}, {}
    for run_dir in run_dirs:
        _check_run_folder(os.fspath(run_dir))
        key, label = _column_key(os.fspath(run_dir))
        results = run_results(run_dir)
        if key not in values:
            keys.append(key)
            labels[key], values[key] = label, {}
        clash = sorted(set(values[key]) & set(results))
        if clash:
            raise ValueError(
                f"{run_dir!r} and an earlier folder both hold the {', '.join(clash)} result of the weights {key}: "
                "pass one run per row and model."
            )
        values[key].update(results)
    shown = [labels[k] for k in keys]
    columns = [k if shown.count(labels[k]) > 1 else labels[k] for k in keys]  # two models, one name: their paths
    header = list(columns)
    if paper:
        header += [f"paper: {name}" for name in PAPER_TABLE2]
    rows = []
    for row in ROWS:
        line = [values[k].get(row, "") for k in keys]
        if paper:
            line += [PAPER_TABLE2[name][row] for name in PAPER_TABLE2]
        rows.append([row, *line])
    return {"columns": header, "rows": rows}


def to_markdown(table):
    """The table as GitHub markdown (top-1 accuracy in %)."""
    header = ["top-1 accuracy [%]", *table["columns"]]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * len(table["columns"])) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in table["rows"]]
    return "\n".join(lines) + "\n"


def to_csv(table):
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["row", *table["columns"]])
    writer.writerows(table["rows"])
    return buffer.getvalue()
