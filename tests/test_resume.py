"""Resume after SIGKILL: `keras-vit finetune --resume` and `model.fit` with BackupAndResume + EMA.

A run in a subprocess is killed with SIGKILL as soon as its first backup exists (so somewhere in
the following epoch, or while it writes the next backup), then run again with --resume. The
resumed run must end with the weights (<= 1e-6, JAX CPU; 1e-5 elsewhere) and the metrics of a
run that was never interrupted.
"""

import json
import os
import runpy
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from keras_vit.cli import main
from tests.conftest import BACKEND

TOLERANCE = 1e-6 if BACKEND == "jax" else 1e-5
TINY_ARCH = json.dumps(dict(patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _args(out):
    return ["finetune", "--data", "digits", "--arch", TINY_ARCH, "--weights", "none", "--image-size", "16",
            "--batch-size", "16", "--steps", "30", "--eval-every", "10", "--eval-steps", "4", "--warmup", "5",
            "--lr", "0.05", "--ema", "0.8", "--resume", "--verbose", "0", "--out", str(out)]


def _env():
    return dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _kill_after_first_backup(command, backup, timeout=300):
    """Start `command`, SIGKILL it once `backup`/training_metadata.json exists; return that progress."""
    process = subprocess.Popen(command, cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    marker = os.path.join(backup, "training_metadata.json")
    start = time.time()
    try:
        while not os.path.exists(marker):
            if process.poll() is not None:
                raise AssertionError(f"the run ended before its first backup:\n{process.stderr.read().decode()[-3000:]}")
            if time.time() - start > timeout:
                raise AssertionError("no backup appeared")
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        process.wait()
        process.stderr.close()
    assert process.returncode == -signal.SIGKILL
    with open(marker) as f:
        return json.load(f)


def _weights(path):
    model = keras.saving.load_model(path)
    return [np.asarray(w) for w in model.get_weights()]


@pytest.mark.slow
def test_finetune_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    reference = tmp_path / "reference"
    assert main(_args(reference)) == 0

    out = tmp_path / "killed"
    progress = _kill_after_first_backup([sys.executable, "-m", "keras_vit.cli", *_args(out)], str(out / "backup"))
    assert not (out / "metrics.json").exists()  # it was killed mid-run
    assert progress["step"] in (10, 20)
    assert main(_args(out)) == 0
    assert not (out / "backup").exists()  # a finished run removes its backup

    got_weights, want_weights = _weights(out / "model.keras"), _weights(reference / "model.keras")
    assert len(got_weights) == len(want_weights)
    for a, b in zip(got_weights, want_weights):
        np.testing.assert_allclose(a, b, rtol=0, atol=TOLERANCE * max(1.0, np.abs(b).max()))
    want = json.loads((reference / "metrics.json").read_text())
    got = json.loads((out / "metrics.json").read_text())
    assert got["test_accuracy"] == pytest.approx(want["test_accuracy"], abs=1e-6)
    assert got["test_loss"] == pytest.approx(want["test_loss"], rel=1e-5)
    # The curves continue: one evaluation row per 10 steps, none repeated or lost.
    history = json.loads((out / "history.json").read_text())["evaluations"]
    reference_history = json.loads((reference / "history.json").read_text())["evaluations"]
    assert [r["step"] for r in history] == [r["step"] for r in reference_history] == [10, 20, 30]
    for r, s in zip(history, reference_history):
        assert r["val_accuracy"] == pytest.approx(s["val_accuracy"], abs=1e-6)
        assert r["val_loss"] == pytest.approx(s["val_loss"], rel=1e-4)


_FIT_SCRIPT = r"""
import json, sys, time
import keras, numpy as np, tensorflow as tf
import keras_vit
from keras_vit import training

backup_dir, out, slow = sys.argv[1], sys.argv[2], float(sys.argv[3])
keras.utils.set_random_seed(0)
r = np.random.default_rng(0)
x = r.uniform(-1, 1, size=(24, 16, 16, 3)).astype("float32")
y = r.integers(0, 3, size=24)
model = keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
                                    mlp_dim=16, classes=3, classifier_activation=None)
for i, v in enumerate(model.weights):
    v.assign(np.random.default_rng(i).standard_normal(tuple(v.shape)).astype("float32") * 0.3)
model.compile(optimizer=training.finetune_optimizer(0.2, total_steps=12, warmup_steps=3, use_ema=True,
                                                    ema_momentum=0.7),
              loss=training.classification_loss(from_logits=True))
progress = training.backup_progress(backup_dir)
skip = progress["step"] if progress else 0
ds = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(4).skip(skip)


class Slow(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(slow)


callbacks = [training.BackupAndResume(backup_dir, save_freq=3), *training.finetune_callbacks(ema=True), Slow()]
history = model.fit(ds, epochs=3, steps_per_epoch=4, validation_data=(x, y), verbose=0, callbacks=callbacks)
np.savez(out, *[np.asarray(w) for w in model.get_weights()])
with open(out + ".json", "w") as f:
    json.dump({"val_loss": history.history["val_loss"], "loss": model.evaluate(x, y, verbose=0)}, f)
"""


@pytest.mark.slow
def test_fit_with_backup_and_ema_killed_and_resumed_equals_an_uninterrupted_run(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(_FIT_SCRIPT)

    def run(backup, out):  # in this process: a resumed run starts from the files alone
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sys, "argv", [str(script), str(backup), str(out), "0"])
            runpy.run_path(str(script), run_name="__main__")

    run(tmp_path / "b0", tmp_path / "reference.npz")
    progress = _kill_after_first_backup(
        [sys.executable, str(script), str(tmp_path / "b1"), str(tmp_path / "resumed.npz"), "0.5"], str(tmp_path / "b1"))
    assert progress["step"] == 3 and progress["batch"] == 3  # mid-epoch: 3 of the first epoch's 4 steps
    assert not (tmp_path / "resumed.npz").exists()
    run(tmp_path / "b1", tmp_path / "resumed.npz")

    want, got = np.load(tmp_path / "reference.npz"), np.load(tmp_path / "resumed.npz")
    for key in want.files:
        np.testing.assert_allclose(got[key], want[key], rtol=0, atol=TOLERANCE * max(1.0, np.abs(want[key]).max()))
    want_m = json.loads((tmp_path / "reference.npz.json").read_text())
    got_m = json.loads((tmp_path / "resumed.npz.json").read_text())
    assert got_m["loss"] == pytest.approx(want_m["loss"], rel=1e-5)
    # The resumed fit ran the rest of epoch 1 and epochs 2, 3: its three validations (with the EMA
    # weights) are the reference's three.
    assert len(got_m["val_loss"]) == len(want_m["val_loss"]) == 3
    assert got_m["val_loss"] == pytest.approx(want_m["val_loss"], rel=1e-5)
