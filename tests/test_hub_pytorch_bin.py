"""hf:// repositories whose weights are a PyTorch `pytorch_model.bin`, through the Hub endpoint on
127.0.0.1 (tests/test_hub_server.py) and the verified download path (hashes, cache, offline mode).

The .bin files are written by the real `torch.save` of a random timm ViT's state dict (outputs
compared with timm's own forward pass), or by hand with a pickle that would run `os.system`.
A repository with only `pytorch_model.bin` downloads it; one that also holds `model.safetensors`
downloads the safetensors alone (the .bin is never requested).
"""

import hashlib
import importlib.util
import json
import os

import numpy as np
import pytest
from conftest import run_script
from test_hub_server import HubServer, hub_env, run_hub_python
from torch_zip_files import _code_pickles, torch_zip_bytes

pytestmark = pytest.mark.backend_independent

BIN_ONLY = "pt-test/bin_only"
BOTH = "pt-test/both"
HOSTILE = "pt-test/hostile"

# Run in the test process (conftest imports timm before TensorFlow; conftest.run_script).
_MAKE_REPOS = """
import os, shutil, sys, numpy as np, torch, timm
from timm.models import save_for_hf
root, bin_only, both = sys.argv[1:4]
x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
np.save(os.path.join(root, "x.npy"), x)
torch.manual_seed(0)
kwargs = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3, mlp_ratio=2.0, num_classes=7)
model = timm.create_model("vit_tiny_patch16_224", pretrained=False, **kwargs).eval()
with torch.no_grad():
    for p in model.parameters():  # zero heads and unit norms would hide mistakes
        p.add_(torch.randn_like(p) * 0.05)
    logits = model(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).numpy()
np.save(os.path.join(root, "ref.npy"), logits)
save_for_hf(model, os.path.join(root, "repos", both), model_args=kwargs, safe_serialization=True)
torch.save(model.state_dict(), os.path.join(root, "repos", both, "pytorch_model.bin"))
os.makedirs(os.path.join(root, "repos", bin_only))
shutil.copy(os.path.join(root, "repos", both, "config.json"), os.path.join(root, "repos", bin_only))
torch.save(model.state_dict(), os.path.join(root, "repos", bin_only, "pytorch_model.bin"))
"""

_LOADS = """
import json, os, sys
import numpy as np
import keras_vit
from keras_vit import hub
x = np.load(sys.argv[1])
result = {}
for repo in sys.argv[2:4]:
    m = keras_vit.load_checkpoint("hf://" + repo, classifier_activation=None)
    result[repo] = m.predict(x, verbose=0).tolist()
try:
    keras_vit.load_checkpoint("hf://" + sys.argv[4])
except keras_vit.CheckpointError as err:
    result["hostile"] = str(err)
print("RESULT" + json.dumps(result))
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    if importlib.util.find_spec("timm") is None or importlib.util.find_spec("torch") is None:
        pytest.skip("timm and torch are not installed")
    root = tmp_path_factory.mktemp("hub_bin")
    run_script(_MAKE_REPOS, root, BIN_ONLY, BOTH)
    hostile = root / "repos" / HOSTILE
    hostile.mkdir(parents=True)
    (hostile / "config.json").write_bytes((root / "repos" / BIN_ONLY / "config.json").read_bytes())
    marker = root / "ran"
    payload = _code_pickles(marker)["os.system"]
    (hostile / "pytorch_model.bin").write_bytes(torch_zip_bytes(payload, {"0": np.zeros(4, np.float32).tobytes()}))
    with HubServer(root / "repos") as server:
        yield dict(server=server, root=root, marker=marker, ref=np.load(root / "ref.npy"))


def _load(hub, tmp, **env):
    code = "import sys; sys.argv[1:] = " + repr([str(hub["root"] / "x.npy"), BIN_ONLY, BOTH, HOSTILE]) + "\n" + _LOADS
    before = len(hub["server"].requests)
    out = run_hub_python(code, hub_env(hub["server"], tmp, **env))
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1]
    return json.loads(line[len("RESULT"):]), hub["server"].requests[before:]


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _fetched(requests, repo):
    """{file: {methods}} of the files of `repo` that huggingface_hub asked the endpoint for."""
    files = {}
    for method, path in requests:
        if path.startswith(f"/{repo}/resolve/"):
            files.setdefault(path.split("/", 5)[5], set()).add(method)
    return files


def _blobs_match_their_names(hf_cache):
    """Every blob of the Hub cache hashes to its name (sha256 for LFS files, git blob sha1 else);
    nothing half-written is left."""
    checked = 0
    for folder, _, names in os.walk(hf_cache):
        for name in names:
            path = os.path.join(folder, name)
            assert not name.endswith((".incomplete", ".tmp")), path
            if os.path.basename(folder) != "blobs":
                continue
            data = open(path, "rb").read()
            digest = hashlib.sha256(data) if len(name) == 64 else hashlib.sha1(b"blob %d\0" % len(data) + data)
            assert digest.hexdigest() == name, path
            checked += 1
    return checked


@pytest.fixture(scope="module")
def online(hub, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("online")
    result, requests = _load(hub, tmp)
    return dict(tmp=tmp, result=result, requests=requests)


def test_repository_with_only_pytorch_model_bin_matches_timm(hub, online):
    assert _rel_err(online["result"][BIN_ONLY], hub["ref"]) < 2e-5
    assert "GET" in _fetched(online["requests"], BIN_ONLY)["pytorch_model.bin"]


def test_safetensors_beside_the_bin_is_the_only_weights_file_fetched(hub, online):
    assert _rel_err(online["result"][BOTH], hub["ref"]) < 2e-5
    fetched = _fetched(online["requests"], BOTH)
    assert "model.safetensors" in fetched and "pytorch_model.bin" not in fetched
    cached = online["tmp"] / "hf_home" / "hub" / f"models--{BOTH.replace('/', '--')}"
    files = {name for _, _, names in os.walk(cached / "snapshots") for name in names}
    assert "model.safetensors" in files and "pytorch_model.bin" not in files
    bin_sha = hashlib.sha256((hub["root"] / "repos" / BOTH / "pytorch_model.bin").read_bytes()).hexdigest()
    assert not any(bin_sha in name for _, _, names in os.walk(cached) for name in names)


def test_hostile_bin_is_refused_naming_the_global_and_the_cache_stays_sound(hub, online):
    message = online["result"]["hostile"]
    assert "os.system" in message or "posix.system" in message
    assert "Nothing was loaded or run" in message
    assert not hub["marker"].exists()
    assert _blobs_match_their_names(online["tmp"] / "hf_home" / "hub") >= 6


def test_offline_second_load_uses_the_cache(hub, online):
    result, requests = _load(hub, online["tmp"], HF_HUB_OFFLINE=1)
    assert requests == []
    assert _rel_err(result[BIN_ONLY], hub["ref"]) < 2e-5 and _rel_err(result[BOTH], hub["ref"]) < 2e-5
    assert result["hostile"] == online["result"]["hostile"]
    assert not hub["marker"].exists()
