"""Callbacks of the recipes: EMA weights for evaluation and saving, resumable backups, a
few-shot probe during training."""

import contextlib
import json
import os
import shutil

import keras
import numpy as np
from keras import ops

from keras_vit.training import fewshot


# === Polyak averaging (EMA) ===


def _ema_pairs(model):
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or not getattr(optimizer, "use_ema", False) or not optimizer.built:
        return []
    averages = getattr(optimizer, "_model_variables_moving_average", None) or []
    return [(v, a) for v, a in zip(optimizer._trainable_variables, averages) if a is not None]


def require_ema(model, who):
    """Raise a clear error unless `model`'s optimizer keeps an EMA of the weights (use_ema=True).

    The EMA callbacks call it when `fit` (or `evaluate`) starts: without it they would evaluate
    and save the raw weights while claiming the averaged ones.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        raise ValueError(f"{who} needs a compiled model whose optimizer keeps an EMA of the weights; "
                         "compile the model first (e.g. with training.finetune_optimizer(..., use_ema=True)).")
    if not getattr(optimizer, "use_ema", False):
        raise ValueError(
            f"{who} evaluates and saves the optimizer's moving average of the weights, but the optimizer "
            f"({type(optimizer).__name__}) was built without use_ema=True, so it keeps none. Build it with "
            "training.finetune_optimizer(..., use_ema=True) (or keras.optimizers.*(..., use_ema=True)), or drop "
            "ema=True from finetune_callbacks."
        )


@contextlib.contextmanager
def ema_weights(model):
    """Temporarily put the optimizer's moving averages (use_ema=True) into the model.

    Does nothing when the optimizer keeps no EMA (not compiled, use_ema=False, or not built yet).

    Example:
        >>> with ema_weights(model):              # doctest: +SKIP
        ...     model.save("averaged.keras")
    """
    pairs = _ema_pairs(model)
    saved = [ops.copy(v.value) for v, _ in pairs]
    for v, average in pairs:
        v.assign(ops.copy(average.value))  # a copy: JAX donates the variables' buffers to the train step
    try:
        yield model
    finally:
        for (v, _), value in zip(pairs, saved):
            v.assign(value)


class SwapEMAWeights(keras.callbacks.Callback):
    """Evaluates with the optimizer's EMA weights (Polyak averaging): swaps them in when
    validation (or `evaluate`) begins and the training weights back when it ends.

    Needs an optimizer with `use_ema=True` (e.g. `finetune_optimizer(..., use_ema=True)`);
    without one, `fit` and `evaluate` raise a ValueError when they start. Save averaged weights with `EMAModelCheckpoint` or
    `with ema_weights(model): ...`. At the end of `fit`, Keras itself leaves the averages in
    the model (`optimizer.finalize_variable_values`).

    Example:
        >>> model.fit(ds, validation_data=val, callbacks=[SwapEMAWeights()])   # doctest: +SKIP
    """

    def __init__(self):
        super().__init__()
        self._context = None

    def on_train_begin(self, logs=None):
        require_ema(self.model, "SwapEMAWeights")

    def on_test_begin(self, logs=None):
        require_ema(self.model, "SwapEMAWeights")
        if self._context is None:
            self._context = ema_weights(self.model)
            self._context.__enter__()

    def on_test_end(self, logs=None):
        if self._context is not None:
            context, self._context = self._context, None
            context.__exit__(None, None, None)


class EMAModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """keras.callbacks.ModelCheckpoint that writes the EMA weights (training continues on the
    raw ones). Same arguments as ModelCheckpoint; the optimizer must keep an EMA (use_ema=True),
    checked when `fit` starts."""

    def on_train_begin(self, logs=None):
        require_ema(self.model, "EMAModelCheckpoint")
        super().on_train_begin(logs)

    def _save_model(self, epoch, batch, logs):
        with ema_weights(self.model):
            return super()._save_model(epoch, batch, logs)


# === Checkpoint and resume ===


def backup_progress(backup_dir):
    """The training progress recorded by `BackupAndResume` in `backup_dir`, or None.

    Returns a dict with "epoch" (completed epochs), "batch" (batches done in the next epoch),
    "step" (train batches done in total). A data pipeline that streams one long sequence of
    batches skips `step` batches to continue exactly where the interrupted run stopped.

    Example:
        >>> progress = backup_progress("/tmp/run/backup")        # doctest: +SKIP
        >>> ds = make_train_dataset().skip(progress["step"] if progress else 0)  # doctest: +SKIP
    """
    path = os.path.join(backup_dir, "training_metadata.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        meta = json.load(f)
    return {"epoch": int(meta["epoch"]), "batch": int(meta.get("batch", 0)), "step": int(meta.get("step", 0))}


class BackupAndResume(keras.callbacks.BackupAndRestore):
    """BackupAndRestore that resumes mid-epoch where the interrupted run stopped.

    Every `save_freq` batches (or each epoch) it writes the model weights together with the
    optimizer state (step counter, so the learning-rate schedule continues; momentum / Adam
    moments; EMA averages; gradient accumulators) and the progress (epoch, batch in epoch, total
    step). When `fit` starts again with the same callback it restores all of it; in a restored
    mid-epoch it runs only that epoch's remaining `steps_per_epoch - batch` steps, so epochs
    keep their boundaries and the run ends after the planned number of steps.

    Keras' own BackupAndRestore restores the epoch only (a mid-epoch interruption repeats the
    whole epoch on top of the saved weights). For a result equal to an uninterrupted run, train
    on a stream of batches with `steps_per_epoch` and skip `backup_progress(dir)["step"]`
    batches of it when resuming (a restarted NumPy-array epoch cannot skip its first batches).

    In a job of several processes (`keras_vit.distribution.data_parallel`) every process
    resumes from the same `backup_dir`, which process 0 alone writes (and deletes at the end):
    put it where every process can read it.

    Args: as keras.callbacks.BackupAndRestore (backup_dir, save_freq="epoch" or an int,
        double_checkpoint, delete_checkpoint).

    Example:
        >>> backup = BackupAndResume("/tmp/run/backup", save_freq=100)          # doctest: +SKIP
        >>> model.fit(ds, epochs=10, steps_per_epoch=1000, callbacks=[backup])  # doctest: +SKIP
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False, delete_checkpoint=True):
        super().__init__(backup_dir, save_freq=save_freq, double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self._resume_batch = 0
        self._batches_in_epoch = 0
        self._step = 0
        self._ending_partial_epoch = False
        self._last_saved_step = 0

    def on_train_begin(self, logs=None):
        self._resume_batch = 0
        self._step = 0
        self._last_saved_step = 0
        super().on_train_begin(logs)
        progress = backup_progress(self.backup_dir)
        if progress is not None:
            self._current_epoch = progress["epoch"]
            self._step = progress["step"]
            self._last_saved_step = progress["step"]
            steps = self.params.get("steps") if self.params else None
            batch = progress["batch"]
            if steps and batch >= steps:
                self.model._initial_epoch = progress["epoch"] + 1
                batch = 0
            self._resume_batch = batch

    def on_epoch_begin(self, epoch, logs=None):
        self._batches_in_epoch = self._resume_batch

    def on_train_batch_end(self, batch, logs=None):
        done_in_fit_epoch = batch + 1  # batch is the last index of this call (steps_per_execution)
        previous = self._batches_in_epoch
        self._batches_in_epoch = self._resume_batch + done_in_fit_epoch
        self._step += self._batches_in_epoch - previous
        # Save at multiples of save_freq total steps, so a resumed run keeps the cadence.
        if self.save_freq != "epoch" and self._step // self.save_freq > self._last_saved_step // self.save_freq:
            self._last_saved_step = self._step
            self._save_model()
        steps = self.params.get("steps") if self.params else None
        if self._resume_batch and steps and self._batches_in_epoch >= steps:
            # The restored epoch is complete: end it here (fit would run a full epoch).
            self._ending_partial_epoch = True
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        from keras_vit.distribution import is_first_process

        if is_first_process():  # process 0 deletes the backup it wrote
            super().on_train_end(logs)

    def on_epoch_end(self, epoch, logs=None):
        if self._ending_partial_epoch:
            self._ending_partial_epoch = False
            self.model.stop_training = False
        self._resume_batch = 0
        self._batches_in_epoch = 0
        super().on_epoch_end(epoch, logs)

    def _save_model(self):
        from keras_vit.distribution import is_first_process, without_distribution

        model = self.model  # syncs the JAX training state into the variables (in every process)
        if not is_first_process():
            return  # the weights are replicated: process 0 writes the backup every process resumes from
        if not os.path.exists(self.backup_dir):
            os.makedirs(self.backup_dir, exist_ok=True)
        if self.double_checkpoint and os.path.exists(self._weights_path):
            shutil.copyfile(self._weights_path, self._prev_weights_path)
        if self.double_checkpoint and os.path.exists(self._training_metadata_path):
            shutil.copyfile(self._training_metadata_path, self._prev_training_metadata_path)
        tmp = self._weights_path + ".tmp.weights.h5"
        with without_distribution():  # process 0 alone: nothing here may wait for the others
            model.save_weights(tmp, overwrite=True)
        os.replace(tmp, self._weights_path)
        meta = {"epoch": self._current_epoch, "batch": self._batches_in_epoch, "step": self._step}
        with open(self._training_metadata_path + ".tmp", "w") as f:
            json.dump(meta, f)
        os.replace(self._training_metadata_path + ".tmp", self._training_metadata_path)


# === Few-shot probe ===


class FewShotProbe(keras.callbacks.Callback):
    """Runs the few-shot linear evaluation during training and logs its accuracy.

    Every `every_epochs` epochs it extracts frozen pooled features (`fewshot.extract_features`)
    of the few-shot training images and of the test images with the current weights (the EMA
    weights when `use_ema` and the optimizer keeps them), solves the regularised least squares
    and writes `logs[name]` (so History / TensorBoard record it).

    Args:
        train_images, train_labels: the few-shot set (e.g. 10 images per class).
        test_images, test_labels: where accuracy is measured.
        l2_reg: the ridge strength of `fewshot_linear_eval`.
        name: the log key (default "fewshot_accuracy").

    Example:
        >>> probe = FewShotProbe(x_few, y_few, x_test, y_test)                 # doctest: +SKIP
        >>> model.fit(ds, epochs=5, callbacks=[probe])                          # doctest: +SKIP
    """

    def __init__(self, train_images, train_labels, test_images, test_labels, *, l2_reg=1024.0, every_epochs=1,
                 batch_size=64, use_ema=True, name="fewshot_accuracy", verbose=0):
        super().__init__()
        self.train_images = np.asarray(train_images)
        self.train_labels = np.asarray(train_labels).reshape(-1)
        self.test_images = np.asarray(test_images)
        self.test_labels = np.asarray(test_labels).reshape(-1)
        self.l2_reg = float(l2_reg)
        self.every_epochs = int(every_epochs)
        self.batch_size = int(batch_size)
        self.use_ema = bool(use_ema)
        self.name = name
        self.verbose = verbose
        self.history = []

    def evaluate(self):
        """The few-shot accuracy of the model's current weights."""
        model = self.model
        context = ema_weights(model) if self.use_ema else contextlib.nullcontext()
        with context:
            train = fewshot.extract_features(model, self.train_images, batch_size=self.batch_size)
            test = fewshot.extract_features(model, self.test_images, batch_size=self.batch_size)
        num_classes = int(max(self.train_labels.max(), self.test_labels.max()) + 1)
        return fewshot.fewshot_linear_eval(
            train, self.train_labels, test, self.test_labels, l2_reg=self.l2_reg, num_classes=num_classes
        )

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_epochs:
            return
        accuracy = self.evaluate()
        self.history.append((epoch, accuracy))
        if logs is not None:
            logs[self.name] = accuracy
        if self.verbose:
            print(f"\nEpoch {epoch + 1}: {self.name} = {accuracy:.4f}")


# === The recipe's callback list ===


def finetune_callbacks(*, backup_dir=None, save_freq="epoch", checkpoint_path=None, ema=False, fewshot=None,
                       fewshot_l2_reg=1024.0, fewshot_every_epochs=1):
    """The fine-tuning recipe's callbacks, in an order that works together.

    Args:
        backup_dir: resumable backups there (`BackupAndResume`, every `save_freq` batches or
            epoch); when resuming a streamed dataset, skip `backup_progress(backup_dir)["step"]`
            batches.
        checkpoint_path: a ModelCheckpoint path (".keras" or ".weights.h5"); with `ema` it
            writes the averaged weights.
        ema: the optimizer keeps an EMA (`finetune_optimizer(..., use_ema=True)`): validate and
            save with it. An optimizer without use_ema=True is a ValueError when `fit` starts.
        fewshot: (train_images, train_labels, test_images, test_labels) for a `FewShotProbe`.

    Example:
        >>> callbacks = finetune_callbacks(backup_dir="/tmp/run/backup", ema=True)
        >>> [type(c).__name__ for c in callbacks]
        ['BackupAndResume', 'SwapEMAWeights']
    """
    callbacks = []
    if backup_dir:
        callbacks.append(BackupAndResume(backup_dir, save_freq=save_freq))
    if ema:
        callbacks.append(SwapEMAWeights())
    if fewshot is not None:
        callbacks.append(FewShotProbe(*fewshot, l2_reg=fewshot_l2_reg, every_epochs=fewshot_every_epochs,
                                      use_ema=bool(ema)))
    if checkpoint_path:
        weights_only = str(checkpoint_path).endswith(".weights.h5")
        checkpoint = EMAModelCheckpoint if ema else keras.callbacks.ModelCheckpoint
        callbacks.append(checkpoint(checkpoint_path, save_weights_only=weights_only))
    return callbacks
