"""The BEiT, BEiT v2 and EVA-02 constructors and presets (timm's beit.py and eva.py) against timm:
each constructor is the architecture timm's reader finds in a timm-saved repository of that
architecture, and its weights reach it through every entry point (a local folder, `hf://timm/...`
from a Hub endpoint on 127.0.0.1, a preset tag, the CLI's `presets`).

The preset rows themselves (resolution, head, mean/std, licence, repository) are checked against
timm's live pretrained_cfg with the rest of the zoo in tests/test_timm_zoo_presets.py, and the
parameter counts of the full-size constructors there too.
"""

import dataclasses
import json
import sys

import numpy as np
import pytest

import keras_vit
from keras_vit import presets
from keras_vit.cli import main
from keras_vit.loading import check_architecture
from keras_vit.models.vit_family import ZOO_ARCHITECTURES

sys.modules.setdefault("triton", None)
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

from test_hub_server import HubServer, hub_env, run_hub_python  # noqa: E402
from test_timm_zoo import _timm_outputs, randomize_torch  # noqa: E402

OWNER = "timm-test"
CONSTRUCTORS = ("BEiTB16", "BEiTL16", "BEiTv2B16", "BEiTv2L16", "EVA02Ti14", "EVA02S14", "EVA02B14", "EVA02L14")


def _save(root, name, architecture, args, seed=0):
    from timm.models._hub import save_for_hf

    model = randomize_torch(timm.create_model(architecture, pretrained=False, **args), seed=seed)
    folder = root / name
    save_for_hf(model, folder, safe_serialization=True, model_args=args)
    return folder, model


def _within(ours, ref32, ref64):
    ours = np.asarray(ours, np.float64)
    assert ours.shape == ref32.shape
    scale = np.abs(ref64).max()
    error, timm_error = np.abs(ours - ref64).max() / scale, np.abs(ref32 - ref64).max() / scale
    return error <= max(2e-5, 2 * timm_error), (error, timm_error)


def test_beit_and_eva02_presets_are_named():
    names = {p.name for p in presets.PRESETS.values()}
    assert {"BEiTB16.in22k_ft_in22k_in1k", "BEiTL16.in22k_ft_in22k_in1k", "BEiTv2B16.in1k_ft_in22k_in1k",
            "EVA02Ti14.mim_in22k_ft_in1k", "EVA02S14.mim_in22k_ft_in1k", "EVA02B14.mim_in22k_ft_in22k_in1k",
            "EVA02L14.mim_in22k_ft_in22k_in1k", "EVA02L14.mim_m38m"} <= names
    # timm's names reach the same rows, at the resolution their architecture names.
    p = presets.preset_by_name("eva02_base_patch14_448.mim_in22k_ft_in22k_in1k")
    assert (p.name, p.resolution, p.license) == ("EVA02B14.mim_in22k_ft_in22k_in1k", 448, "mit")
    assert presets.preset_by_name("BEiTL16.in22k_ft_in22k_in1k", image_size=512).repo == (
        "timm/beit_large_patch16_512.in22k_ft_in22k_in1k")


@pytest.mark.backend_independent
@pytest.mark.parametrize("name", CONSTRUCTORS)
def test_constructor_is_the_architecture_timm_saves(name, tmp_path):
    # timm's architecture at a tiny width and depth, read back: every field but the sizes is the row's.
    row = ZOO_ARCHITECTURES[name]
    args = dict(depth=2, embed_dim=32, num_heads=4, img_size=32 if name.startswith("BEiT") else 28)
    folder, _ = _save(tmp_path, name, row.timm_name, args)
    _, config = keras_vit.loading.resolve(str(folder)).format.read(str(folder))
    small = dataclasses.replace(row, hidden_size=32, num_heads=4, num_layers=2, mlp_dim=config["mlp_dim"])
    check_architecture(small, config, str(folder))
    # Another of the four does not pass for it.
    other = ZOO_ARCHITECTURES["EVA02B14" if name.startswith("BEiT") else "BEiTB16"]
    with pytest.raises(ValueError, match="different architecture"):
        check_architecture(dataclasses.replace(other, hidden_size=32, num_heads=4, num_layers=2,
                                               mlp_dim=config["mlp_dim"]), config, str(folder))


# One script in a fresh process, with HF_ENDPOINT at the local Hub: hf:// and a preset tag for the
# full-width EVA-02 Ti/14 constructor (12 blocks of 192 at 28 px), hf:// for a tiny BEiT.
_HUB_BODY = """
import json, sys
import numpy as np
import keras_vit
from keras_vit import presets
root, owner = sys.argv[1], sys.argv[2]
out = {}
x = np.load(root + "/x_eva.npy")
model = keras_vit.EVA02Ti14(weights=f"hf://{owner}/eva02_tiny_28", input_shape=(28, 28, 3), classes=5,
                            classifier_activation=None)
out["constructor_hf"] = model.predict(x, verbose=0).tolist()
out["normalization"] = model.config.input_normalization
presets.register_preset("EVA02Ti14", "test_tag", 28, f"{owner}/eva02_tiny_28", classes=5, license="mit")
model = keras_vit.EVA02Ti14(weights="test_tag", input_shape=(28, 28, 3), classes=5, classifier_activation=None)
out["constructor_tag"] = model.predict(x, verbose=0).tolist()
model = keras_vit.load_checkpoint("EVA02Ti14.test_tag", classifier_activation=None)
out["preset_name"] = model.predict(x, verbose=0).tolist()
x = np.load(root + "/x_beit.npy")
model = keras_vit.load_checkpoint(f"hf://{owner}/beit_tiny", classifier_activation=None)
out["beit_hf"] = model.predict(x, verbose=0).tolist()
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.backend_independent
def test_constructors_load_from_the_hub(tmp_path):
    repos = tmp_path / "repos" / OWNER
    eva_folder, eva = _save(repos, "eva02_tiny_28", "eva02_tiny_patch14_336", dict(img_size=28, num_classes=5), seed=1)
    beit_folder, beit = _save(repos, "beit_tiny", "beit_base_patch16_224",
                              dict(img_size=32, depth=2, embed_dim=32, num_heads=4, num_classes=3), seed=2)
    rng = np.random.default_rng(0)
    x_eva, x_beit = (rng.uniform(-1, 1, (2, s, s, 3)).astype("float32") for s in (28, 32))
    np.save(tmp_path / "x_eva.npy", x_eva)
    np.save(tmp_path / "x_beit.npy", x_beit)
    # A local folder through the constructor, in this process.
    model = keras_vit.EVA02Ti14(weights=str(eva_folder), input_shape=(28, 28, 3), classes=5, classifier_activation=None)
    eva_ref = _timm_outputs(eva, x_eva)
    ok, errors = _within(model.predict(x_eva, verbose=0), *eva_ref)
    assert ok, errors
    with HubServer(tmp_path / "repos") as server:
        code = f"import sys; sys.argv = ['-c', {str(tmp_path)!r}, {OWNER!r}]\n" + _HUB_BODY
        out = run_hub_python(code, hub_env(server, tmp_path), timeout=600)
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT"):])
    for key in ("constructor_hf", "constructor_tag", "preset_name"):
        ok, errors = _within(result[key], *eva_ref)
        assert ok, (key, errors)
    # EVA-02 takes CLIP's mean and std, from the repository's pretrained_cfg.
    assert [tuple(v) for v in result["normalization"]] == [tuple(eva.pretrained_cfg["mean"]),
                                                          tuple(eva.pretrained_cfg["std"])]
    ok, errors = _within(result["beit_hf"], *_timm_outputs(beit, x_beit))
    assert ok, errors


def test_presets_command_lists_beit_and_eva02_with_their_licences(capsys):
    assert main(["presets", "EVA02L14", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["license"] for r in rows} == {"mit"} and len(rows) == 8
    assert main(["presets", "BEiTv2B16"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "in1k_ft_in22k_in1k" in ln)
    assert "apache-2.0" in line and "timm/beitv2_base_patch16_224.in1k_ft_in22k_in1k" in line
