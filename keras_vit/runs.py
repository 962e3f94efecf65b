"""Run folders: what a training or evaluation run leaves behind.

    run = RunFolder("runs/cifar10")
    run.save_config(vars(args))
    model.fit(..., callbacks=[run.logger()])          # history.csv / history.json, curves.png
    run.write_metrics({"test_accuracy": 0.98})        # metrics.json + metrics.csv
    run.save_model(model)                             # model.keras

Files:
  config.json    the run's settings
  history.csv    one row per evaluation: step, epoch, learning_rate, loss, accuracy, val_* ...
  history.json   the same plus the training loss every few steps ("steps")
  metrics.json   final metrics (merged over calls), metrics.csv the same as one header + row
  curves.png     loss, accuracy and learning rate against the step
  model.keras    the final model (keras.saving format; loads with keras.saving.load_model)

Plots use matplotlib's Agg canvas (no display, no pyplot global state).

The checks a command makes of its --out folder before anything loads are the folder's own:
`RunFolder.check_path` (a folder can be made there), `check_command` (it holds no other
command's run) and `check_resume` (a run continued with --resume was started with the same
settings); `RunFolder.start` begins a run there. They import no Keras.

In a job of several processes (keras_vit.distribution) every process runs the same code and
keeps the same history, but only process 0 writes: the folder is written once.
"""

import csv
import functools
import json
import math
import os

import numpy as np

from keras_vit.storage.json_files import read_json_object


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        value = float(value)
        return value if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


def _unreadable(path, reason):
    return ValueError(f"{path} {reason}: the run folder's record was cut short or edited. Delete that file (or "
                      "the whole run folder) and run again.")


def _write_csv(path, rows):
    columns = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _jsonable(row.get(k)) for k in columns})


#: Recorded settings that do not change what a resumed run computes (how many processes compute
#: a step does not change what it computes: the global batch is the same).
RESUME_IGNORES = ("command", "func", "out", "resume", "verbose", "data_dir", "distribute", "coordinator_address",
                  "num_processes", "process_id", "join_timeout", "weights_id")


def setting_name(key):
    """How a message names the recorded setting `key`: its flag (`image_size` -> --image-size)."""
    return {"train_examples": "the training examples", "eval_examples": "the evaluation examples"}.get(
        key, "--" + key.replace("_", "-"))


def _shown(key, value):
    if isinstance(value, bool):
        return "given" if value else "not given"
    if key == "image_size" and isinstance(value, list) and len(value) == 2:
        return str(value[0]) if value[0] == value[1] else f"{value[0]}x{value[1]}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return "not given" if value is None else str(value)


class RunFolder:
    """A folder for one run's config, metrics, curves and model (created if missing).

    `writes`: whether this process writes the files; default: unless it is one of the
    processes other than process 0 of a multi-process job (`keras_vit.distribution`).
    """

    # --- before a run: the checks of its folder (no Keras, nothing written) ---------------

    @staticmethod
    def check_path(path):
        """Raise a ValueError (without the flag: argparse names it) when no run folder can be made
        at `path`: an empty path, a file, a path under a file, or a parent without permission to
        write; returns `path`."""
        path = str(path)
        if not path.strip():
            raise ValueError("an empty path; pass the folder to write into, e.g. --out runs/eval")
        full = os.path.abspath(os.path.expanduser(path))
        if os.path.exists(full) and not os.path.isdir(full):
            raise ValueError(f"{path!r} is a file, not a folder; pass a folder path (it is created), or move the file "
                             "away")
        parent = os.path.dirname(full)
        while not os.path.exists(parent) and os.path.dirname(parent) != parent:
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise ValueError(f"{path!r} cannot be made: {parent!r} is a file, not a folder; pass a folder path "
                             "elsewhere")
        if not os.path.isdir(full) and not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"{path!r} cannot be made: no permission to write in {parent!r}; pass a folder you can "
                             "write to")
        return path

    @staticmethod
    def check_command(path, command):
        """Refuse a folder that holds the run of another command (a finetune run's config.json and
        metrics would be replaced by `command`'s); a folder of the same command is rewritten."""
        saved = read_json_object(os.path.join(path, "config.json"), missing={}, malformed={})
        other = saved.get("command")
        if isinstance(other, str) and other != command:
            raise ValueError(
                f"--out {path} holds a `keras-vit {other}` run; its config.json and metrics would be replaced. Write "
                f"the {command} results to another folder, e.g. --out {os.path.join(path, command)}."
            )

    @staticmethod
    def check_resume(path, config):
        """Refuse to resume the run in `path` with `config` (settings as config.json records them)
        when a setting both record differs (`RESUME_IGNORES` aside); nothing recorded: a new run."""
        saved = read_json_object(os.path.join(path, "config.json"), missing=None, malformed=None)
        if saved is None:
            return
        now = json.loads(json.dumps({k: v for k, v in config.items() if k not in RESUME_IGNORES}, default=str))
        changed = [k for k in sorted(now) if k in saved and saved[k] != now[k]]
        if changed:
            differences = ", ".join(f"{setting_name(k)} {_shown(k, saved[k])} (now {_shown(k, now[k])})"
                                    for k in changed)
            raise ValueError(
                f"--resume: {path} holds a run started with other arguments: {differences}. Resume it with the "
                f"arguments it was started with (its config.json), or start a new run in another --out folder "
                f"(or delete {path} first)."
            )

    @classmethod
    def start(cls, path, config):
        """The RunFolder at `path` with `config` saved and the result files of an earlier run there
        removed (metrics.json merges what it is given: stale keys of another run would stay)."""
        run = cls(path)
        if run.writes:
            for name in ("metrics.json", "metrics.csv"):
                if os.path.isfile(run.file(name)):
                    os.remove(run.file(name))
        run.save_config(config)
        return run

    # --- the run ----------------------------------------------------------------------------

    def __init__(self, path, writes=None):
        from keras_vit.distribution import is_first_process

        self.path = os.fspath(path)
        self.writes = is_first_process() if writes is None else bool(writes)
        if self.writes:
            os.makedirs(self.path, exist_ok=True)
        self.history = []  # one dict per evaluation (epoch end)
        self.steps = []  # (step, running loss, learning rate) every few training steps
        self.stage_starts = []  # (stage, first step - 1) of each stage logged

    def file(self, name):
        return os.path.join(self.path, name)

    def save_config(self, config):
        if not self.writes:
            return
        with open(self.file("config.json"), "w") as f:
            json.dump(_jsonable(dict(config)), f, indent=2, sort_keys=True)

    def read_metrics(self):
        return read_json_object(self.file("metrics.json"), missing={}, malformed=_unreadable)

    def write_metrics(self, metrics):
        """Merge `metrics` into metrics.json and rewrite metrics.csv (one row, a column per metric)."""
        merged = self.read_metrics() if self.writes else {}
        merged.update(_jsonable(dict(metrics)))
        if not self.writes:
            return merged
        with open(self.file("metrics.json"), "w") as f:
            json.dump(merged, f, indent=2, sort_keys=True)
        flat = {k: v for k, v in merged.items() if not isinstance(v, (dict, list))}
        _write_csv(self.file("metrics.csv"), [flat])
        return merged

    def write_table(self, name, rows):
        """Write `rows` (list of dicts) to `name`.csv and `name`.json."""
        if not self.writes:
            return
        _write_csv(self.file(f"{name}.csv"), rows)
        with open(self.file(f"{name}.json"), "w") as f:
            json.dump(_jsonable(rows), f, indent=2)

    def load_history(self):
        """Read history.json back (to continue a resumed run's curves)."""
        saved = read_json_object(self.file("history.json"), missing=None, malformed=_unreadable)
        if saved is None:
            return
        self.history = saved.get("evaluations", [])
        self.steps = [tuple(s) for s in saved.get("steps", [])]
        self.stage_starts = [tuple(s) for s in saved.get("stage_starts", [])]

    def write_history(self):
        if not self.writes:
            return
        _write_csv(self.file("history.csv"), self.history)
        with open(self.file("history.json"), "w") as f:
            json.dump(_jsonable({"evaluations": self.history, "steps": self.steps, "stage_starts": self.stage_starts}),
                      f, indent=2)

    def logger(self, log_every=None, step_offset=0, stage=None):
        """A keras Callback that records this run's history and redraws curves.png at the end."""
        return _metrics_logger_class()(self, log_every=log_every, step_offset=step_offset, stage=stage)

    def plot_curves(self, filename="curves.png", title=None):
        """Draw loss / accuracy / learning rate against the step into `filename`."""
        if not self.writes:
            return self.file(filename)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        figure = Figure(figsize=(13, 3.8), dpi=100)
        FigureCanvasAgg(figure)
        axes = figure.subplots(1, 3)
        rows = self.history

        def series(key):
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            return ([p[0] for p in pts], [p[1] for p in pts])

        if self.steps:
            axes[0].plot([s[0] for s in self.steps], [s[1] for s in self.steps], lw=0.8, alpha=0.6,
                         label="train (running mean per epoch)")
        for key, style in (("loss", "o-"), ("val_loss", "s-")):
            x, y = series(key)
            if x:
                axes[0].plot(x, y, style, label=key, ms=3)
        for key, style in (("accuracy", "o-"), ("val_accuracy", "s-")):
            x, y = series(key)
            if x:
                axes[1].plot(x, y, style, label=key, ms=3)
        lr_steps = [(s[0], s[2]) for s in self.steps if len(s) > 2 and s[2] is not None]
        if lr_steps:
            axes[2].plot([s for s, _ in lr_steps], [v for _, v in lr_steps], lw=1.2)
        else:
            x, y = series("learning_rate")
            if x:
                axes[2].plot(x, y, "o-", ms=3)
        for ax, name in zip(axes, ("loss", "accuracy", "learning rate")):
            ax.set_xlabel("step")
            ax.set_title(name)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        for stage, step in self.stage_starts[1:]:  # mark where each later stage begins
            for ax in axes:
                ax.axvline(step, color="grey", ls=":", lw=1)
                ax.text(step, 1.0, f" {stage}" if stage else "", transform=ax.get_xaxis_transform(), fontsize=7,
                        va="top", color="grey")
        if title:
            figure.suptitle(title)
        figure.tight_layout()
        figure.savefig(self.file(filename))
        return self.file(filename)

    def save_model(self, model, filename="model.keras"):
        """Save `model` without its optimizer state, so that `keras.saving.load_model` needs
        nothing but `import keras_vit` (the file holds the architecture and weights)."""
        from keras_vit.distribution import without_distribution

        path = self.file(filename)
        if not self.writes:
            return path
        # Process 0 alone, on its own devices: the weights of a data-parallel job are replicated.
        with without_distribution():
            if getattr(model, "optimizer", None) is not None and hasattr(model, "get_config"):
                clean = model.__class__.from_config(model.get_config())
                clean.set_weights(model.get_weights())
                model = clean
            model.save(path)
        return path


def _current_learning_rate(optimizer):
    import keras

    lr = optimizer.learning_rate
    try:
        return float(keras.ops.convert_to_numpy(lr))
    except Exception:
        return None


@functools.cache
def _metrics_logger_class():
    """MetricsLogger, a Keras callback: made on first use, so that the checks above import no Keras."""
    import keras

    class MetricsLogger(keras.callbacks.Callback):
        """Records evaluation rows (epoch end) and the running training loss every `log_every` steps."""

        def __init__(self, run, log_every=None, step_offset=0, stage=None):
            super().__init__()
            self.run = run
            self.log_every = log_every
            self.step_offset = step_offset
            self.stage = stage
            self._step = 0

        def on_train_begin(self, logs=None):
            self._step = 0
            if not self.run.stage_starts or self.run.stage_starts[-1][0] != self.stage:
                self.run.stage_starts.append((self.stage, self.step_offset))
            if self.log_every is None:
                total = (self.params or {}).get("steps") or 50
                total *= (self.params or {}).get("epochs") or 1
                self.log_every = max(1, total // 100)

        def on_train_batch_end(self, batch, logs=None):
            self._step += 1
            if logs and "loss" in logs and self._step % self.log_every == 0:
                self.run.steps.append((self.step_offset + self._step, float(logs["loss"]),
                                       _current_learning_rate(self.model.optimizer)))

        def on_epoch_end(self, epoch, logs=None):
            row = {"stage": self.stage, "epoch": epoch + 1, "step": self.step_offset + self._step,
                   "learning_rate": _current_learning_rate(self.model.optimizer)}
            row.update({k: float(v) for k, v in (logs or {}).items() if k != "learning_rate"})
            self.run.history.append(row)
            self.run.write_history()

        def on_train_end(self, logs=None):
            self.run.write_history()
            self.run.plot_curves()

    return MetricsLogger
