"""Presets and hf:// handles through a real Hub HTTP endpoint on 127.0.0.1 (tests/test_hub_server.py).

Repositories hold random models saved by timm itself in its Hub layout. The keras_vit side runs in
fresh processes (huggingface_hub reads HF_ENDPOINT / HF_HUB_OFFLINE / HF_HUB_CACHE at import), with
empty caches in tmp dirs; outputs are compared with timm's own forward pass.
"""

import hashlib
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

import keras_vit
from conftest import TINY, randomize, run_script
from test_hub_server import HubServer, hub_env, run_hub_python

# Several full ViT-Ti/16 builds in fresh processes; the Hub protocol and the cache do not depend on
# the backend.
pytestmark = [pytest.mark.slow, pytest.mark.backend_independent]

TI16_REPO = "timm-test/vit_tiny_patch16_32.test"
TI16_REPO_64 = "timm-test/vit_tiny_patch16_64.test"
TINY_REPO = "timm-test/tiny_vit.test"
KERAS_REPO = "kv-test/tiny_preset"
_SETUP = """
import json, os, sys, warnings
import numpy as np
import keras_vit
from keras_vit import hub, presets, checkpoints, loading
presets.register_preset("ViTTi16", "test_tag", 32, {ti32!r}, classes=10)
presets.register_preset("ViTTi16", "test_tag", 64, {ti64!r}, classes=10)
x32 = np.load({x32!r}); x64 = np.load({x64!r})
result = {{}}
"""

# Run in the test process (conftest imports timm before TensorFlow; conftest.run_script).
_MAKE_REPOS = """
import os, sys, numpy as np, torch, timm
from timm.models import save_for_hf
root = sys.argv[1]
rng = np.random.default_rng(0)
x = {"x32": rng.uniform(-1, 1, (2, 32, 32, 3)).astype("float32"),
     "x64": rng.uniform(-1, 1, (2, 64, 64, 3)).astype("float32")}
for k, v in x.items():
    np.save(os.path.join(root, k + ".npy"), v)

def make(seed, repo, images, key, **kwargs):
    torch.manual_seed(seed)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():  # zero heads and unit norms would hide mistakes
            p.add_(torch.randn_like(p) * 0.05)
        logits = model(torch.from_numpy(x[images]).permute(0, 3, 1, 2).contiguous()).numpy()
    save_for_hf(model, os.path.join(root, "repos", repo), model_args=kwargs, safe_serialization=True)
    np.save(os.path.join(root, "ref_" + key + ".npy"), logits)

make(1, sys.argv[2], "x32", "ti32", img_size=32, num_classes=10)
make(2, sys.argv[3], "x64", "ti64", img_size=64, num_classes=10)
make(3, sys.argv[4], "x32", "tiny", img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0,
     num_classes=7)
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The endpoint with timm repositories (and broken copies), reference outputs, input images."""
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    root = tmp_path_factory.mktemp("hub")
    repos = root / "repos"
    run_script(_MAKE_REPOS, root, TI16_REPO, TI16_REPO_64, TINY_REPO)
    ref = {k: np.load(root / f"ref_{k}.npy") for k in ("ti32", "ti64", "tiny")}
    # Copies of the tiny repository for the fault cases, and one with an unreadable weights file.
    for name in ("truncated", "corrupt", "bad_sha", "garbage"):
        shutil.copytree(repos / TINY_REPO, repos / "timm-test" / name)
    (repos / "timm-test" / "garbage" / "model.safetensors").write_bytes(b"\x08" + os.urandom(3000))
    # A repository that already is a Keras preset (written by keras_vit itself): used as it is.
    preset_model = randomize(keras_vit.VisionTransformer(**TINY, classifier_activation=None), seed=5)
    keras_vit.save_preset(preset_model, repos / KERAS_REPO, metadata={"source": "test"})
    np.save(root / "ref_keras.npy", preset_model.predict(np.load(root / "x32.npy"), verbose=0))
    ref["keras"] = np.load(root / "ref_keras.npy")
    setup = _SETUP.format(ti32=TI16_REPO, ti64=TI16_REPO_64, x32=str(root / "x32.npy"), x64=str(root / "x64.npy"))
    with HubServer(repos) as server:
        server.faults[("timm-test/truncated", "model.safetensors")] = "truncate"
        server.faults[("timm-test/corrupt", "model.safetensors")] = "corrupt"
        tiny_sha = hashlib.sha256((repos / TINY_REPO / "model.safetensors").read_bytes()).hexdigest()
        yield dict(server=server, root=root, ref=ref, setup=setup, tiny_sha=tiny_sha)


def _run(hub, tmp, body, **env):
    out = run_hub_python(hub["setup"] + body + "\nprint('RESULT' + json.dumps(result))\n", hub_env(hub["server"], tmp, **env))
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):]), out


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _cache_files(folder):
    found = []
    for root, dirs, names in os.walk(folder):
        found += [os.path.join(root, n) for n in names + dirs]
    return found


@pytest.fixture(scope="module")
def online(hub, tmp_path_factory):
    """One fresh process: a tag through the table (two resolutions), an hf:// handle, a fresh head."""
    tmp = tmp_path_factory.mktemp("online")
    body = """
m = keras_vit.ViTTi16(weights="test_tag", input_shape=(32, 32, 3), classes=10, classifier_activation=None)
result["ti32"] = m.predict(x32, verbose=0).tolist()
resolved64 = loading.resolve("ViTTi16.test_tag", image_size=(64, 64))
result["ti64_source"] = resolved64.repo
result["ti64_format"] = resolved64.format.name
m = keras_vit.load_checkpoint("hf://timm-test/tiny_vit.test", classifier_activation=None)
result["tiny"] = m.predict(x32, verbose=0).tolist()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    m = keras_vit.ViTTi16(weights="test_tag", input_shape=(32, 32, 3), classes=3)
result["fresh_head_warning"] = " ".join(str(w.message) for w in caught if "head" in str(w.message))
result["fresh_head_abs"] = float(np.abs(m.get_layer("head").kernel.numpy()).max())
result["verified"] = sorted(os.listdir(os.path.join(hub.cache_dir(), "verified")))
"""
    before = len(hub["server"].requests)
    result, out = _run(hub, tmp, body)
    return dict(result=result, tmp=tmp, stderr=out.stderr, requests=hub["server"].requests[before:])


def test_tag_through_the_preset_table_matches_timm(hub, online):
    assert _rel_err(online["result"]["ti32"], hub["ref"]["ti32"]) < 2e-5


def test_the_repository_at_the_requested_resolution_is_chosen(hub, online):
    # 64x64 input -> the 64 repository, read in place in timm's format.
    assert online["result"]["ti64_source"] == TI16_REPO_64
    assert online["result"]["ti64_format"] == "timm"
    fetched = {p.split("/resolve/")[0].strip("/") for m, p in online["requests"] if "/resolve/" in p}
    assert {TI16_REPO, TI16_REPO_64} <= fetched


def test_hf_handle_loads_through_load_checkpoint(hub, online):
    assert _rel_err(online["result"]["tiny"], hub["ref"]["tiny"]) < 2e-5


def test_other_classes_attach_a_fresh_zero_head_with_a_warning(online):
    assert online["result"]["fresh_head_abs"] == 0.0
    assert "trained 10-class head" in online["result"]["fresh_head_warning"]
    assert "classes=10" in online["result"]["fresh_head_warning"]


def test_downloads_show_progress_and_are_verified_once(online):
    # One verification record per repository; nothing converted or copied besides the Hub cache.
    assert sorted(online["result"]["verified"]) == sorted(
        r.replace("/", "--") for r in (TI16_REPO, TI16_REPO_64, TINY_REPO)
    )
    assert not os.path.exists(online["tmp"] / "keras_vit_cache" / "presets")
    # huggingface_hub's own progress bars went to stderr.
    assert "Fetching" in online["stderr"] or "Download" in online["stderr"]
    # Nothing half-written anywhere.
    leftovers = [p for p in _cache_files(online["tmp"]) if ".incomplete" in p or p.endswith(".tmp")]
    assert leftovers == []


def test_second_load_offline_uses_the_cache_and_hashes_nothing(hub, online):
    body = """
calls = []
real_hash = hub.file_sha256
hub.file_sha256 = lambda *a, **k: calls.append(a) or real_hash(*a, **k)
m = keras_vit.ViTTi16(weights="test_tag", input_shape=(32, 32, 3), classes=10, classifier_activation=None)
result["ti32"] = m.predict(x32, verbose=0).tolist()
m = keras_vit.load_checkpoint("hf://timm-test/tiny_vit.test", classifier_activation=None)
result["tiny"] = m.predict(x32, verbose=0).tolist()
result["hashed"] = len(calls)
try:
    keras_vit.load_checkpoint("hf://timm-test/corrupt")
except hub.OfflineError as err:
    result["offline_error"] = str(err)
"""
    before = len(hub["server"].requests)
    result, _ = _run(hub, online["tmp"], body, HF_HUB_OFFLINE=1)
    assert hub["server"].requests[before:] == []
    assert result["hashed"] == 0  # unchanged since verified: no file is hashed again
    assert _rel_err(result["ti32"], hub["ref"]["ti32"]) < 2e-5
    assert _rel_err(result["tiny"], hub["ref"]["tiny"]) < 2e-5
    message = result["offline_error"]
    assert "HF_HUB_OFFLINE" in message and "weights=None" in message and "timm-test/corrupt" in message


@pytest.fixture(scope="module")
def errors(hub, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("errors")
    body = """
def attempt(name, fn):
    try:
        fn()
        result[name] = None
    except Exception as err:
        result[name] = [type(err).__name__, str(err), [c.__name__ for c in type(err).__mro__]]

m = keras_vit.load_checkpoint("hf://kv-test/tiny_preset", classifier_activation=None)
result["keras_repo"] = m.predict(x32, verbose=0).tolist()
attempt("missing_repo", lambda: keras_vit.load_checkpoint("hf://timm-test/absent"))
attempt("missing_revision", lambda: keras_vit.load_checkpoint("hf://timm-test/tiny_vit.test@v9"))
presets.register_preset("ViTTi16", "pinned", 32, "timm-test/bad_sha", classes=7, sha256="0" * 64)
attempt("bad_sha", lambda: keras_vit.ViTTi16(weights="pinned", input_shape=(32, 32, 3)))
attempt("truncated", lambda: keras_vit.load_checkpoint("hf://timm-test/truncated"))
attempt("corrupt", lambda: keras_vit.load_checkpoint("hf://timm-test/corrupt"))
attempt("garbage", lambda: keras_vit.load_checkpoint("hf://timm-test/garbage"))
attempt("wrong_arch", lambda: keras_vit.ViTB16(weights="hf://timm-test/tiny_vit.test"))
import contextlib, io
from keras_vit.cli import main as cli_main
out_dir = os.path.join(os.path.dirname(hub.cache_dir()), "cli_preset")
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = cli_main(["convert", "hf://timm-test/tiny_vit.test", out_dir])
result["cli"] = [rc, buf.getvalue(), sorted(os.listdir(out_dir))]
sys.path.insert(0, {weights_dir!r})
import publish
manifest = os.path.join(os.path.dirname(hub.cache_dir()), "manifest.json")
row = dict(architecture="ViTTi16", tag="tiny", resolution=32, classes=7, top1=None, source="timm",
           repo="timm-test/tiny_vit.test", revision=None, file="model.safetensors", sha256={tiny_sha!r}, original=None)
with open(manifest, "w") as f:
    json.dump(dict(checkpoints=[row]), f)
publish_out = os.path.join(os.path.dirname(hub.cache_dir()), "published")
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = publish.main(["--manifest", manifest, "--out", publish_out])
result["publish"] = [rc, buf.getvalue(), sorted(os.listdir(publish_out))]
result["keras_vit_cache"] = sorted(
    os.path.relpath(os.path.join(r, n), hub.cache_dir()) for r, ds, ns in os.walk(hub.cache_dir()) for n in ds + ns)
"""
    weights_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "weights")
    body = body.replace("{weights_dir!r}", repr(weights_dir)).replace("{tiny_sha!r}", repr(hub["tiny_sha"]))
    result, _ = _run(hub, tmp, body)
    return dict(result=result, tmp=tmp)


def test_missing_repository_and_revision_are_clear_errors(errors):
    name, message, mro = errors["result"]["missing_repo"]
    assert name == "RepositoryNotFoundError" and "FileNotFoundError" in mro
    assert "timm-test/absent" in message and "does not exist" in message
    name, message, _ = errors["result"]["missing_revision"]
    assert name == "RepositoryNotFoundError" and "'v9'" in message


def test_wrong_sha256_is_refused(errors):
    name, message, _ = errors["result"]["bad_sha"]
    assert name == "IntegrityError" and "sha256 mismatch" in message and "0" * 64 in message


def test_truncated_and_corrupt_downloads_are_refused(errors):
    name, message, mro = errors["result"]["truncated"]
    assert name == "IntegrityError" and "Truncated download" in message and "OSError" in mro
    name, message, _ = errors["result"]["corrupt"]
    assert name == "IntegrityError" and "Corrupt download" in message and "model.safetensors" in message


def test_unreadable_weights_and_wrong_architecture(errors):
    name, message, _ = errors["result"]["garbage"]
    assert name == "CheckpointError"
    name, message, _ = errors["result"]["wrong_arch"]
    assert name == "ValueError" and "ViTB16" in message and "load_checkpoint" in message


def test_failures_leave_no_partial_file_in_any_cache(errors):
    # Only repositories that downloaded intact have a verification record.
    cached = errors["result"]["keras_vit_cache"]
    verified = {p.split(os.sep)[1] for p in cached if p.startswith("verified" + os.sep) and os.sep in p[9:]}
    assert {"timm-test--tiny_vit.test", "kv-test--tiny_preset"} <= verified
    assert not any(name in v for v in verified for name in ("bad_sha", "truncated", "corrupt"))
    assert not any(p.endswith(".tmp") for p in cached)
    hf_files = _cache_files(errors["tmp"] / "hf_home")
    assert not any(p.endswith(".incomplete") for p in hf_files)
    # The bad blobs were dropped from the Hub cache, so a retry downloads them again.
    for repo in ("bad_sha", "corrupt"):
        snap = [p for p in hf_files if f"models--timm-test--{repo}" in p and "snapshots" in p and p.endswith(".safetensors")]
        assert snap == []


def test_cli_converts_an_hf_handle_to_a_preset_folder(errors):
    rc, out, files = errors["result"]["cli"]
    assert rc == 0
    assert "resolving hf://timm-test/tiny_vit.test" in out and "wrote Keras preset folder" in out
    assert {"config.json", "metadata.json", "model.weights.h5", "README.md"} <= set(files)


def test_publish_dry_run_converts_manifest_rows_without_uploading(errors):
    rc, out, folders = errors["result"]["publish"]
    assert rc == 0
    assert "timm-test/tiny_vit.test -> keras-vit/vitti16_32.tiny" in out
    assert "dry run: would upload" in out
    assert folders == ["vitti16_32.tiny"]


def test_keras_preset_repository_is_read_in_place(hub, errors):
    assert _rel_err(errors["result"]["keras_repo"], hub["ref"]["keras"]) < 1e-6
    assert any(p.startswith(os.path.join("verified", "kv-test--tiny_preset")) for p in errors["result"]["keras_vit_cache"])
