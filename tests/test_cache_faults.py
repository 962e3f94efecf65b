"""Faults around the download cache: processes killed mid-load, concurrent loads, and cached files
damaged after they were verified. A real Hub endpoint on 127.0.0.1 (tests/test_hub_server.py)
serves a timm repository; every load runs in a fresh process, as users run them.

What is checked (docs/reliability.md has the table):
- SIGKILL at several points of a load (during the download, during verification and reading):
  the next load succeeds with the reference logits and nothing half-written is used.
- 4 processes loading the same named preset at once: all succeed with identical logits,
  each file is downloaded once and hashed once.
- A bit flip or a truncation of a cached file after it was verified: detected; online it is
  downloaded again (right logits), offline the error names the file and the fix.

The cache logic does not depend on the backend: these run once (marker backend_independent).
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import BACKEND, run_script
from test_hub_server import HubServer, hub_env, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.backend_independent]

REPO = "timm-test/vit_tiny_patch16_224.faults"

_MAKE_REPO = """
import os, sys, numpy as np, torch, timm
from timm.models import save_for_hf
root, repo = sys.argv[1], sys.argv[2]
x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
np.save(os.path.join(root, "x.npy"), x)
torch.manual_seed(0)
model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, num_classes=10).eval()
with torch.no_grad():
    for p in model.parameters():
        p.add_(torch.randn_like(p) * 0.05)
    np.save(os.path.join(root, "ref.npy"), model(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).numpy())
save_for_hf(model, os.path.join(root, "repos", repo), model_args=dict(img_size=32, num_classes=10),
            safe_serialization=True)
"""

_LOAD = """
import json, os, sys, time, numpy as np, keras_vit
from keras_vit import hub, presets
presets.register_preset("ViTTi16", "faults", 32, {repo!r}, classes=10)
calls = []
real_verify = hub.verify_snapshot
hub.verify_snapshot = lambda *a, **k: calls.append(a) or real_verify(*a, **k)

# STOP_AT=verifying|reading: write the phase to PHASE_FILE on reaching it and wait there (for a kill).
def reached(phase):
    if os.environ.get("STOP_AT") == phase:
        with open(os.environ["PHASE_FILE"] + ".part", "w") as f:
            f.write(phase)
        os.replace(os.environ["PHASE_FILE"] + ".part", os.environ["PHASE_FILE"])
        time.sleep(600)

real_sha256 = hub.file_sha256
def file_sha256(path, *a, **k):  # verifying: the weights are hashed, the snapshot not yet marked verified
    digest = real_sha256(path, *a, **k)
    if path.endswith("model.safetensors"):
        reached("verifying")
    return digest
hub.file_sha256 = file_sha256
real_fetch = hub.fetch
def fetch(*a, **k):  # reading: the snapshot is verified; the model is built and its weights read next
    result = real_fetch(*a, **k)
    reached("reading")
    return result
hub.fetch = fetch
print("LOADING", flush=True)
try:
    model = keras_vit.ViTTi16(weights="faults", input_shape=(32, 32, 3), classes=10, classifier_activation=None)
except Exception as err:
    print("ERROR" + json.dumps([type(err).__name__, str(err)]), flush=True)
    sys.exit(3)
logits = model.predict(np.load({x!r}), verbose=0)
print("RESULT" + json.dumps(dict(logits=logits.tolist(), verified=len(calls))), flush=True)
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("fault_hub")
    run_script(_MAKE_REPO, root, REPO)  # timm's side, in the test process
    with HubServer(root / "repos") as server:
        yield dict(server=server, root=root, ref=np.load(root / "ref.npy"),
                   code=_LOAD.format(repo=REPO, x=str(root / "x.npy")))


def _start(repo, tmp, **env):
    full = dict(os.environ, KERAS_BACKEND=BACKEND, **hub_env(repo["server"], tmp, **env))
    return subprocess.Popen([sys.executable, "-c", repo["code"]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full)


def _finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    result = [ln for ln in out.splitlines() if ln.startswith(("RESULT", "ERROR"))]
    if not result:
        raise AssertionError(f"no result (exit {proc.returncode}):\n{out}\n{err[-3000:]}")
    kind, payload = result[-1][:6], json.loads(result[-1][6:] if result[-1].startswith("RESULT") else result[-1][5:])
    return ("ok", payload) if kind == "RESULT" else ("error", payload)


def _load(repo, tmp, **env):
    return _finish(_start(repo, tmp, **env))


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _blob(tmp):
    hub_cache = tmp / "hf_home" / "hub"
    for folder, _, names in os.walk(hub_cache):
        for name in names:
            if name == "model.safetensors" and "snapshots" in folder:
                return os.path.realpath(os.path.join(folder, name))
    raise AssertionError("no cached model.safetensors")


def _weights_gets(server, since):
    return sum(1 for m, p in server.requests[since:] if m == "GET" and p.endswith("/model.safetensors"))


def _partials(tmp):
    return [os.path.join(r, n) for r, _, ns in os.walk(tmp / "hf_home") for n in ns if n.endswith(".incomplete")]


def _verified_markers(tmp):
    return [n for _, _, ns in os.walk(tmp / "keras_vit_cache" / "verified") for n in ns if n.endswith(".json")]


@pytest.mark.parametrize("phase", ["downloading", "verifying", "reading"])
def test_a_load_killed_in_each_phase_leaves_nothing_the_next_load_uses(repo, tmp_path, phase):
    # Each kill waits for its phase: "downloading", the loopback server has sent 5 of the weights'
    # 22 MiB (slowed to 0.1 s per MiB); "verifying", the process has hashed the downloaded weights
    # and stops before it marks the snapshot verified; "reading", the snapshot is verified and the
    # process stops before the model is built and the weights read.
    key = (REPO, "model.safetensors")
    size = os.path.getsize(os.path.join(repo["root"], "repos", REPO, "model.safetensors"))
    phase_file = tmp_path / "phase"
    env = {} if phase == "downloading" else dict(STOP_AT=phase, PHASE_FILE=phase_file)
    repo["server"].delays[key] = 0.1
    repo["server"].sent.pop(key, None)
    try:
        proc = _start(repo, tmp_path, **env)
        try:
            if phase == "downloading":
                wait_for(lambda: repo["server"].sent.get(key, 0) >= 5 << 20, 120, "5 MiB of the weights sent")
            else:
                wait_for(phase_file.exists, 120, f"the load to reach {phase}")
            assert proc.poll() is None, proc.communicate()
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=60)
    finally:
        repo["server"].delays.clear()
    # Where it was killed: mid-download, a partial file and part of the bytes sent; verifying, the
    # whole file sent and no snapshot marked verified; reading, the snapshot marked verified.
    if phase == "downloading":
        assert len(_partials(tmp_path)) == 1 and repo["server"].sent[key] < size
    else:
        assert phase_file.read_text() == phase and repo["server"].sent[key] == size
        assert _partials(tmp_path) == []
        assert len(_verified_markers(tmp_path)) == (1 if phase == "reading" else 0)

    before = len(repo["server"].requests)
    status, result = _load(repo, tmp_path)
    assert status == "ok", result
    assert _rel_err(result["logits"], repo["ref"]) < 2e-5
    # Downloaded again only after a kill mid-download; hashed again unless it had been verified.
    assert _weights_gets(repo["server"], before) == (1 if phase == "downloading" else 0)
    assert result["verified"] == (0 if phase == "reading" else 1)
    leftovers = [os.path.join(r, n) for r, _, ns in os.walk(tmp_path) for n in ns if n.endswith((".incomplete", ".tmp"))]
    assert leftovers == []  # the killed download's partial file is removed


def test_orphaned_partial_downloads_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    # huggingface_hub downloads a blob to `<etag>.<random>.incomplete` under its per-blob lock. A
    # partial file whose lock is free is an orphan (its process died); one whose lock is held is
    # another process's download in progress.
    from filelock import FileLock
    from huggingface_hub import constants

    from keras_vit import hub

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    repo_folder = "models--someone--tiny"
    blobs = tmp_path / repo_folder / "blobs"
    locks = tmp_path / ".locks" / repo_folder
    blobs.mkdir(parents=True)
    locks.mkdir(parents=True)
    orphan, live, blob = "a" * 64 + ".1f2e3d4c.incomplete", "b" * 64 + ".5a6b7c8d.incomplete", "c" * 64
    for name in (orphan, live, blob):
        (blobs / name).write_bytes(b"partial")
    with FileLock(str(locks / ("b" * 64 + ".lock"))):  # a download in progress holds its blob's lock
        hub._remove_orphaned_partials("someone/tiny")
    assert sorted(os.listdir(blobs)) == sorted([live, blob])
    hub._remove_orphaned_partials("someone/absent")  # no cache folder: nothing to do, no error


def test_concurrent_loads_download_and_hash_once(repo, tmp_path):
    # Four processes at once: one downloads and hashes under the repository's lock, three wait for
    # it (two processes take the same path: one waits).
    processes = 4
    before = len(repo["server"].requests)
    procs = [_start(repo, tmp_path) for _ in range(processes)]
    results = [_finish(p) for p in procs]
    assert all(status == "ok" for status, _ in results), results
    logits = [np.asarray(r["logits"]) for _, r in results]
    assert all(np.array_equal(logits[0], other) for other in logits[1:])
    assert _rel_err(logits[0], repo["ref"]) < 2e-5
    assert _weights_gets(repo["server"], before) == 1
    # One process hashes the downloaded files; the others find them verified.
    assert sorted(r["verified"] for _, r in results) == [0] * (processes - 1) + [1]


def test_damage_after_verification_is_detected(repo, tmp_path):
    status, result = _load(repo, tmp_path)
    assert status == "ok"
    blob = _blob(tmp_path)

    # A bit flip: online, the file is downloaded again and the logits are right.
    with open(blob, "r+b") as f:
        f.seek(os.path.getsize(blob) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    before = len(repo["server"].requests)
    status, result = _load(repo, tmp_path)
    assert status == "ok" and _rel_err(result["logits"], repo["ref"]) < 2e-5
    assert _weights_gets(repo["server"], before) == 1

    # A truncation, offline: the error names the file and the fix; no logits come back.
    blob = _blob(tmp_path)
    with open(blob, "r+b") as f:
        f.truncate(os.path.getsize(blob) - 1000)
    status, (name, message) = _load(repo, tmp_path, HF_HUB_OFFLINE=1)
    assert status == "error" and name == "IntegrityError"
    assert "model.safetensors" in message and "go online once" in message

    # Online again: fetched anew, right logits.
    status, result = _load(repo, tmp_path)
    assert status == "ok" and _rel_err(result["logits"], repo["ref"]) < 2e-5
