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


def _column_name(run_dir):
    config = _read_json(os.path.join(run_dir, "config.json")) or {}
    weights = config.get("preset") or config.get("weights")
    base = os.path.basename(os.path.normpath(run_dir))
    return str(weights) if weights and not os.path.exists(str(weights)) else base


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
        if not (isinstance(groups, dict) and {"mean", "tasks", "of"} <= set(groups)) or not isinstance(
                groups["mean"], (int, float, type(None))):
            raise _unreadable(path, "has no groups.all entry with a mean, tasks and of")
        if groups["mean"] is not None:
            suffix = "" if groups["tasks"] == groups["of"] else f" ({groups['tasks']} of {groups['of']} tasks)"
            found["VTAB (19 tasks)"] = f"{100 * groups['mean']:.2f}{suffix}"
    metrics = _read_json(os.path.join(run_dir, "metrics.json"))
    if metrics and str(metrics.get("data", "")).startswith("tfds:"):
        name = metrics["data"][len("tfds:"):]
        for row, key in _DATA_ROWS.get(name, ()):
            if metrics.get(key) is not None:
                if not isinstance(metrics[key], (int, float)) or isinstance(metrics[key], bool):
                    raise _unreadable(os.path.join(run_dir, "metrics.json"),
                                      f"holds {key}={metrics[key]!r}, not a number")
                found[row] = f"{100 * metrics[key]:.2f}"
    if not found:
        raise ValueError(
            f"{run_dir!r} holds no result of Table 2's rows: it needs metrics.json of `keras-vit evaluate` on "
            f"tfds:{', tfds:'.join(_DATA_ROWS)}, or vtab.json of `keras-vit vtab`."
        )
    return found


def table2(run_dirs, paper=True):
    """{"columns": [...], "rows": [[row name, value per column], ...]}: one column per model
    (runs whose weights are the same share it), then the paper's columns when `paper`."""
    columns, values = [], {}
    for run_dir in run_dirs:
        _check_run_folder(os.fspath(run_dir))
        name = _column_name(run_dir)
        if name not in columns:
            columns.append(name)
            values[name] = {}
        values[name].update(run_results(run_dir))
    header = list(columns)
    if paper:
        header += [f"paper: {name}" for name in PAPER_TABLE2]
    rows = []
    for row in ROWS:
        line = [values[c].get(row, "") for c in columns]
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
