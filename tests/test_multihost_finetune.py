"""`keras-vit finetune --distribute data` on 2 processes x 2 CPU devices (JAX, gloo collectives):
a pod slice in small.

The run is killed with SIGKILL in both processes once process 0 has written its first backup,
then resumed with --resume in both (and a copy of it in one process). Against a one-process, one-device run of the same command
(same global batch, seed and steps) it must log the same loss at every step (within 2e-5) and
end with the same weights and metrics; only process 0 may write into the run folder. The
per-process input pipeline itself (each process its own rows of every global batch, disjoint,
together the one-process batch) is checked directly on tf.data, on every backend.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from conftest import BACKEND

from keras_vit.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
multi_process = pytest.mark.skipif(BACKEND != "jax", reason="keras.distribution (several processes) runs on JAX only")

# Each process runs the CLI under an audit hook that records every write into the run folder
# (open for writing, mkdir, rename/replace, remove, rmtree, copy) to a log outside it, line by
# line, so that a killed process leaves its record too.
WORKER = r"""
import os, sys
out, log_path = os.path.realpath(sys.argv[1]), sys.argv[2]
log = open(log_path, "w", buffering=1)
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def inside(path):
    try:
        return isinstance(path, (str, bytes, os.PathLike)) and os.path.realpath(os.fsdecode(path)).startswith(out)
    except (TypeError, ValueError):
        return False

def hook(event, args):
    if event == "open" and args[2] is not None and args[2] & WRITE_FLAGS and inside(args[0]):
        log.write(f"open {args[0]}\n")
    elif event in ("os.mkdir", "os.remove", "os.rmdir", "shutil.rmtree") and inside(args[0]):
        log.write(f"{event} {args[0]}\n")
    elif event in ("os.rename", "shutil.copyfile") and (inside(args[0]) or inside(args[1])):
        log.write(f"{event} {args[1]}\n")

sys.addaudithook(hook)
sys.argv[0] = "keras-vit"
from keras_vit.cli import main
sys.exit(main(sys.argv[3:]))
"""

STEPS, EVAL_EVERY = 12, 4


def _args(out, base):
    # Batch 24: 12 rows per process, 6 per device; --eval-steps keeps every evaluation on the same
    # 120 test images in both runs.
    return ["finetune", "--data", "digits", "--weights", str(base), "--image-size", "24", "--batch-size", "24",
            "--steps", str(STEPS), "--eval-every", str(EVAL_EVERY), "--eval-steps", "5", "--warmup", "2",
            "--lr", "0.3", "--ema", "0.8", "--resume", "--verbose", "0", "--out", str(out)]


def _free_address():
    with socket.socket() as s:  # a free port for the coordinator, never a fixed one
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _start_job(args, out, logs):
    """Both processes of a 2-process job, each with 2 CPU devices and gloo collectives."""
    script = logs / "worker.py"
    script.write_text(WORKER)
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo",
               XLA_FLAGS="--xla_force_host_platform_device_count=2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    address = _free_address()
    processes = []
    for i in range(2):
        with open(logs / f"output{i}.txt", "w") as output:  # the child holds its own copy
            processes.append(subprocess.Popen(
                [sys.executable, str(script), str(out), str(logs / f"writes{i}.log"), *args, "--distribute", "data",
                 "--coordinator-address", address, "--num-processes", "2", "--process-id", str(i)],
                cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT))
    return processes


def _output(logs, i):
    return (logs / f"output{i}.txt").read_text()


def _stop(processes):
    for p in processes:
        if p.poll() is None:
            p.kill()
        p.wait()


def _finish(processes, logs, timeout=300):
    try:
        for i, p in enumerate(processes):
            p.wait(timeout=timeout)
            assert p.returncode == 0, f"process {i} failed ({p.returncode}):\n{_output(logs, i)[-4000:]}"
    finally:
        _stop(processes)
    return [_output(logs, i) for i in range(len(processes))]


def _kill_after_first_backup(processes, backup, logs, timeout=300):
    """SIGKILL both processes once process 0's first backup exists; return that progress."""
    marker = os.path.join(backup, "training_metadata.json")
    start = time.time()
    try:
        while not os.path.exists(marker):
            ended = [i for i, p in enumerate(processes) if p.poll() is not None]
            if ended:
                raise AssertionError(f"process {ended[0]} ended before the first backup:\n"
                                     f"{_output(logs, ended[0])[-3000:]}")
            if time.time() - start > timeout:
                raise AssertionError("no backup appeared")
            time.sleep(0.01)
        for p in processes:
            p.send_signal(signal.SIGKILL)
    finally:
        _stop(processes)
    assert [p.returncode for p in processes] == [-signal.SIGKILL] * 2
    with open(marker) as f:
        return json.load(f)


def _weights(path):
    import keras

    return [np.asarray(w) for w in keras.saving.load_model(path).get_weights()]


@pytest.fixture(scope="module")
def base_model(tmp_path_factory):
    """A small trained-looking ViT to fine-tune (random weights, 16 px): the recipe's path
    (for_finetuning: position embeddings resized to 24 px, a new zero head)."""
    import keras

    import keras_vit

    model = keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
                                        mlp_dim=32, classes=5)
    r = np.random.default_rng(0)
    for v in model.weights:
        v.assign((r.standard_normal(tuple(v.shape)) * 0.3).astype("float32"))
    path = tmp_path_factory.mktemp("base") / "base.keras"
    model.save(path)
    keras.utils.clear_session()
    return path


@multi_process
@pytest.mark.slow
def test_two_processes_killed_and_resumed_match_one_process(base_model, tmp_path):
    out, logs, reference = tmp_path / "two", tmp_path / "logs", tmp_path / "one"
    logs.mkdir()
    # The 2-process job starts first, watched by a thread that kills it after its first backup;
    # the one-process reference runs here meanwhile.
    killed = {}

    def kill():
        try:
            killed["progress"] = _kill_after_first_backup(job, str(out / "backup"), logs)
        except BaseException as error:  # re-raised below
            killed["error"] = error

    job = _start_job(_args(out, base_model), out, logs)
    watcher = threading.Thread(target=kill)
    watcher.start()
    try:
        assert main(_args(reference, base_model)) == 0
    finally:
        watcher.join()
    if "error" in killed:
        raise killed["error"]
    progress = killed["progress"]
    assert progress["step"] in (EVAL_EVERY, 2 * EVAL_EVERY), progress  # killed mid-run, after a backup
    assert not (out / "metrics.json").exists() and not (out / "model.keras").exists()
    killed_writes = [(logs / f"writes{i}.log").read_text().split("\n") for i in range(2)]

    # Both processes resume; meanwhile a copy of the killed run resumes here, in one process (the
    # process flags are not part of what a resumed run must repeat: the global batches are the same).
    alone = tmp_path / "resumed-alone"
    shutil.copytree(out, alone)
    job = _start_job(_args(out, base_model), out, logs)
    try:
        assert main(_args(alone, base_model)) == 0
    finally:
        outputs = _finish(job, logs)
    assert f"resuming after step {progress['step']}" in outputs[1]
    assert "each process reads 12 of every 24 examples" in outputs[1]
    assert not (out / "backup").exists()  # the finished run removed its backup

    # Process 0 wrote the run folder (the hook sees its writes); process 1 wrote nothing, killed or not.
    writes = [(logs / f"writes{i}.log").read_text().split("\n") for i in range(2)]
    assert any("model.keras" in w for w in writes[0]) and any("training_metadata.json" in w for w in killed_writes[0])
    assert [w for w in killed_writes[1] + writes[1] if w] == []

    # The same loss at every logged step (the first ones from before the kill): measured 2.4e-7 apart, final
    # weights 6.7e-8; the bounds are about 10x.
    got, want = (json.loads((folder / "history.json").read_text()) for folder in (out, reference))
    got_steps, want_steps = np.array(got["steps"]), np.array(want["steps"])
    assert got_steps[:, 0].tolist() == want_steps[:, 0].tolist() == list(range(1, STEPS + 1))
    difference = np.abs(got_steps[:, 1] - want_steps[:, 1]).max()
    print(f"max loss difference over {STEPS} steps, 2 processes (killed at step {progress['step']}, resumed) vs "
          f"1 process: {difference:.2e}; losses {np.round(want_steps[:, 1], 5).tolist()}")
    assert difference <= 3e-6
    assert np.ptp(want_steps[:, 1]) > 1e-3  # the loss moves: equal curves are not a constant
    np.testing.assert_allclose(got_steps[:, 2], want_steps[:, 2], rtol=1e-6)  # learning rate
    assert [r["step"] for r in got["evaluations"]] == [r["step"] for r in want["evaluations"]] == [4, 8, 12]
    for g, w in zip(got["evaluations"], want["evaluations"]):
        assert g["val_accuracy"] == pytest.approx(w["val_accuracy"], abs=1e-6)
        assert g["val_loss"] == pytest.approx(w["val_loss"], abs=3e-6)

    # The same final (EMA) weights and metrics, resumed on 2 processes or on one.
    want_weights = _weights(reference / "model.keras")
    want_metrics = json.loads((reference / "metrics.json").read_text())
    for folder in (out, alone):
        got_weights = _weights(folder / "model.keras")
        assert len(got_weights) == len(want_weights)
        print(f"{folder.name}: max final weight difference",
              max(float(np.abs(a - b).max()) for a, b in zip(got_weights, want_weights)))
        for a, b in zip(got_weights, want_weights):
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * max(1.0, np.abs(b).max()))
        got_metrics = json.loads((folder / "metrics.json").read_text())
        assert got_metrics["test_accuracy"] == pytest.approx(want_metrics["test_accuracy"], abs=1e-6)
        assert got_metrics["test_loss"] == pytest.approx(want_metrics["test_loss"], abs=3e-6)
    alone_steps = np.array(json.loads((alone / "history.json").read_text())["steps"])
    assert np.abs(alone_steps[:, 1] - want_steps[:, 1]).max() <= 3e-6
    config = json.loads((out / "config.json").read_text())
    assert config["distribute"] == "data" and config["num_processes"] == 2 and config["process_id"] == 0


@pytest.mark.backend_independent
def test_each_process_reads_its_own_rows_of_every_global_batch():
    """load_dataset(shard=(2, i)): disjoint halves that together are the one-process batch, in
    order; for training (crops and flips of the process's own examples) and evaluation (whole
    global batches only)."""
    from keras_vit.data import load_dataset

    for training, batches in ((True, 40), (False, None)):
        kwargs = dict(image_size=16, batch_size=24, training=training, seed=3)

        def read(shard=None):
            ds = load_dataset("digits", "test", shard=shard, **kwargs)[0]
            return list((ds.take(batches) if batches else ds).as_numpy_iterator())

        whole, first, second = read(), read((2, 0)), read((2, 1))
        assert len(first) == len(second) == (batches or 360 // 24)  # evaluation: 15 whole batches of 24
        if not training:
            assert len(whole) == 15  # 360 = 15 x 24: nothing left out here
        for (x, y), (x0, y0), (x1, y1) in zip(whole, first, second):
            assert x0.shape == x1.shape == (12, 16, 16, 3)
            np.testing.assert_array_equal(np.concatenate([x0, x1]), x)
            np.testing.assert_array_equal(np.concatenate([y0, y1]), y)
    # Evaluation with a batch that does not divide the 360 test images keeps whole global batches.
    halves = [load_dataset("digits", "test", image_size=16, batch_size=16, shard=(2, i))[0] for i in range(2)]
    assert [sum(int(x.shape[0]) for x, _ in h) for h in halves] == [22 * 8, 22 * 8]
    with pytest.raises(ValueError, match="does not split evenly over 2 processes"):
        load_dataset("digits", "test", image_size=16, batch_size=25, shard=(2, 0))
    with pytest.raises(ValueError, match="process index must be 0 to num_processes - 1 = 1"):
        load_dataset("digits", "test", image_size=16, batch_size=24, shard=(2, 2))


@multi_process
def test_a_process_whose_job_never_forms_says_so_and_ends(tmp_path):
    """Process 0 of 2, the other never started: it says that it waits (where, for how many, how
    long) and ends at --join-timeout with one line naming the coordinator and the timeout, not
    with JAX's abort (a C++ stack trace, exit 134, after 5 minutes). A fresh process: the end of
    the process is what is tested."""
    address = _free_address()
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    argv = ["finetune", "--data", "digits", "--weights", "none", "--arch", json.dumps(dict(
            patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16)), "--image-size", "16", "--steps", "2",
            "--batch-size", "4", "--verbose", "0", "--out", str(tmp_path / "run"), "--distribute", "data",
            "--coordinator-address", address, "--num-processes", "2", "--process-id", "0", "--join-timeout", "4"]
    done = subprocess.run([sys.executable, "-m", "keras_vit.cli", *argv], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    assert f"process 0: waiting up to 4 s for the job's 2 processes to join at the coordinator {address}" in done.stdout
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("keras-vit finetune: error: process 0 waited 4 s for 2 processes at the coordinator "
                           f"{address}"), last
    assert "Check failure" not in done.stderr and "DEADLINE_EXCEEDED" not in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(BACKEND == "jax", reason="the error of the other backends")
def test_distribute_needs_the_jax_backend(tmp_path, capsys):
    argv = ["finetune", "--data", "digits", "--arch", json.dumps(dict(patch_size=8, hidden_size=16, num_layers=1,
            num_heads=2, mlp_dim=16)), "--weights", "none", "--image-size", "16", "--steps", "2", "--distribute",
            "data", "--num-processes", "1", "--verbose", "0", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("keras-vit finetune: error: --distribute data runs on the JAX backend"), line
    assert f"on {BACKEND!r} here" in line and not (tmp_path / "run").exists()
