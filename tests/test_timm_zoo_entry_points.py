"""timm's ViT zoo through every entry point besides `load_checkpoint(folder)` (tests/test_timm_zoo.py):
the constructors' `weights=`, `hf://timm/...` from a Hub endpoint on 127.0.0.1
(tests/test_hub_server.py), preset tags, `keras-vit convert` (which keeps the licence) and
`keras-vit evaluate` (with the weights' normalisation); and the one-line warning of
non-commercial weights.

Each model is a random-weight timm model saved exactly as timm saves a Hub repository
(`save_for_hf`: config.json with architecture, model_args and pretrained_cfg, plus
model.safetensors); outputs equal timm's within max(2e-5, twice timm's own float32 error against
float64), relative to the output's scale.
"""

import json
import os
import shutil
import sys
import warnings

import numpy as np
import pytest

import keras_vit
from keras_vit.cli import main

sys.modules.setdefault("triton", None)
torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

from test_hub_server import HubServer, hub_env, run_hub_python  # noqa: E402
from test_timm_zoo import CASES, _timm_outputs, randomize_torch  # noqa: E402

OWNER = "timm-test"
#: The cases of tests/test_timm_zoo.py served from the Hub, one per feature group (registers and
#: layer scale, CLIP's pre-norm and QuickGELU, SigLIP's MAP head, DeiT's two heads, AIMv2's RmsNorm
#: and SwiGLU, fc_norm after average pooling): an hf:// handle resolves to a folder in the Hub's
#: cache, which the reader reads as test_timm_zoo.py reads every case's folder.
HUB_CASES = ("dinov2_small_reg4", "clip_b32_quickgelu", "siglip_b16_map", "deit_small_distilled", "aimv2_large",
             "medium_gap_256")
#: A full-width DINOv2-S/14 with 4 registers (12 blocks, width 384) at 28 px: the architecture of
#: the DINOv2S14Reg4 constructor, cheap to run (4 patches).
DINOV2 = ("dinov2_s14_reg4_28", "vit_small_patch14_reg4_dinov2", dict(img_size=28))
#: A tiny model of timm's MAE tag, whose pretrained_cfg names the licence cc-by-nc-4.0.
MAE = ("mae_tiny", "vit_base_patch16_224.mae", dict(img_size=32, depth=1, embed_dim=32, num_heads=2))


def _pooling(model):
    return {"token": "token", "avg": "gap", "map": "map"}[model.global_pool]


def _load_kwargs(model):
    """How a test loads the saved model: its head (logits), or its pooled features without one."""
    if model.num_classes:
        return dict(classifier_activation=None)
    return dict(include_top=False, pooling=_pooling(model))


def _within(ours, ref32, ref64):
    ours = np.asarray(ours, np.float64)
    assert ours.shape == ref32.shape
    scale = np.abs(ref64).max()
    timm_error = np.abs(ref32 - ref64).max() / scale
    error = np.abs(ours - ref64).max() / scale
    return error <= max(2e-5, 2 * timm_error), (error, timm_error)


def _loss_and_top1(logits, labels):
    logits = logits - logits.max(1, keepdims=True)
    log_p = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return -log_p[np.arange(len(labels)), labels].mean(), (logits.argmax(1) == labels).mean()


def _evaluated_repo(root):
    """A DINOv2-S/14 with 4 registers, one block and a 3-class head, whose pretrained_cfg states
    ImageNet's mean/std and (here) a non-commercial licence, as a Hub repository; an image folder
    of 6 images at its size; and timm's loss and top-1 on them, for `keras-vit evaluate`."""
    from PIL import Image
    from timm.models._hub import save_for_hf

    args = dict(img_size=28, depth=1, num_classes=3)
    model = randomize_torch(timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, **args), seed=7)
    repo = root / "repos" / OWNER / "dinov2_reg4_head"
    save_for_hf(model, repo, safe_serialization=True, model_args=args)
    config = json.loads((repo / "config.json").read_text())
    config["pretrained_cfg"]["license"] = "cc-by-nc-4.0"
    (repo / "config.json").write_text(json.dumps(config))
    pixels = np.random.default_rng(3).integers(0, 256, (6, 28, 28, 3), dtype=np.uint8)
    labels = np.arange(6) % 3
    for i, (image, label) in enumerate(zip(pixels, labels)):
        folder = root / "eval_data" / "test" / f"class{label}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(folder / f"{i}.png")  # at the model's size: the resize keeps the pixels

    def loss_and_top1(x, dtype):
        with torch.no_grad():
            logits = model.to(dtype)(torch.from_numpy(x.transpose(0, 3, 1, 2).copy()).to(dtype)).double().numpy()
        return _loss_and_top1(logits, labels)

    cfg = model.pretrained_cfg
    unit = pixels / 255.0
    x = ((unit - np.array(cfg["mean"])) / np.array(cfg["std"])).astype("float32")
    (loss64, top1), (loss32, _) = (loss_and_top1(x, t) for t in (torch.float64, torch.float32))
    unit_range_loss, _ = loss_and_top1((unit * 2 - 1).astype("float32"), torch.float64)
    model.to(torch.float32)
    return dict(data=str(root / "eval_data"), mean=list(cfg["mean"]), std=list(cfg["std"]), loss=loss64,
                top1=top1, tolerance=max(2e-5 * abs(loss64), 2 * abs(loss32 - loss64)),
                unit_range_loss=unit_range_loss)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Every case saved as a Hub repository under <root>/repos/timm-test/, with its input images
    and timm's outputs in float32 and float64."""
    from timm.models._hub import save_for_hf

    root = tmp_path_factory.mktemp("zoo_hub")
    out = {}
    cases = [(case, arch, dict(depth=2, **overrides)) for case, arch, overrides in CASES if case in HUB_CASES]
    cases += [DINOV2, MAE]
    for i, (case, arch, args) in enumerate(cases):
        model = randomize_torch(timm.create_model(arch, pretrained=False, **args), seed=100 + i)
        folder = root / "repos" / OWNER / case
        save_for_hf(model, folder, safe_serialization=True, model_args=args)
        size = model.patch_embed.img_size
        x = np.random.default_rng(i).uniform(-1, 1, (2, *size, 3)).astype("float32")
        np.save(root / f"x_{case}.npy", x)
        out[case] = dict(folder=str(folder), model=model, x=x, ref=_timm_outputs(model, x))
    # timm's QuickGELU CLIPs read the GELU models' repositories: the QuickGELU case's weights in a
    # repository whose config.json names the GELU architecture.
    quick = out["clip_b32_quickgelu"]["model"]
    args = dict(depth=2, **dict((c[0], c[2]) for c in CASES)["clip_b32_quickgelu"])
    args["num_classes"] = quick.num_classes
    gelu = timm.create_model("vit_base_patch32_clip_224", pretrained=False, **args)
    gelu.load_state_dict(quick.state_dict())
    save_for_hf(gelu.eval(), root / "repos" / OWNER / "clip_b32_gelu_repo", safe_serialization=True, model_args=args)
    return dict(root=root, cases=out, evaluate=_evaluated_repo(root))


# === The constructors' weights= (a local folder), on every backend ===


def test_constructor_loads_its_timm_architecture(zoo, tmp_path):
    case = zoo["cases"][DINOV2[0]]
    model = keras_vit.DINOv2S14Reg4(weights=case["folder"], input_shape=(28, 28, 3), include_top=False,
                                    pooling="token")
    ok, errors = _within(model.predict(case["x"], verbose=0), *case["ref"])
    assert ok, errors
    # The weights' normalisation (timm's pretrained_cfg: ImageNet's) comes with the model.
    assert model.config.input_normalization == ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    # Weights that expect another input than the row's default (as CLIPL14's LAION-2B weights take
    # [-1, 1], not CLIP's mean/std): the weights' normalisation wins.
    other = tmp_path / "other_normalisation"
    shutil.copytree(case["folder"], other)
    config = json.loads((other / "config.json").read_text())
    config["pretrained_cfg"].update(mean=[0.5, 0.5, 0.5], std=[0.5, 0.5, 0.5])
    (other / "config.json").write_text(json.dumps(config))
    model = keras_vit.DINOv2S14Reg4(weights=str(other), input_shape=(28, 28, 3), include_top=False, pooling="token")
    assert model.config.input_normalization is None


def test_constructor_refuses_another_zoo_architecture(zoo):
    # The same widths without registers, or a plain ViT-S: the registers and layer scale differ.
    folder = zoo["cases"][DINOV2[0]]["folder"]
    with pytest.raises(ValueError, match="different architecture.*DINOv2S14"):
        keras_vit.DINOv2S14(weights=folder, input_shape=(28, 28, 3))
    with pytest.raises(ValueError, match="different architecture"):
        keras_vit.DeiT3S16(weights=folder, input_shape=(28, 28, 3))


def test_non_commercial_weights_warn_once(zoo):
    mae, dinov2 = zoo["cases"][MAE[0]]["folder"], zoo["cases"][DINOV2[0]]["folder"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keras_vit.load_checkpoint(mae, include_top=False)
        keras_vit.load_checkpoint(mae, include_top=False, pooling="token")
        keras_vit.load_checkpoint(dinov2, include_top=False)  # apache-2.0: nothing to say
    said = [str(w.message) for w in caught if issubclass(w.category, keras_vit.loading.LicenseWarning)]
    assert len(said) == 1, said
    assert "cc-by-nc-4.0" in said[0] and "non-commercial" in said[0] and "\n" not in said[0]


# === keras-vit convert: a timm folder to a Keras preset folder, loaded again ===


@pytest.mark.parametrize("case", ["dinov2_small_reg4", "clip_b32_quickgelu", "siglip_b16_map", "deit_small_distilled"])
def test_cli_convert_keeps_outputs_and_normalisation(zoo, tmp_path, case):
    entry = zoo["cases"][case]
    out = str(tmp_path / "preset")
    assert main(["convert", entry["folder"], out]) == 0
    model = keras_vit.load_checkpoint(out, **_load_kwargs(entry["model"]))
    ok, errors = _within(model.predict(entry["x"], verbose=0), *entry["ref"])
    assert ok, (case, errors)
    cfg = entry["model"].pretrained_cfg
    expected = None if set(cfg["mean"]) | set(cfg["std"]) == {0.5} else (tuple(cfg["mean"]), tuple(cfg["std"]))
    assert model.config.input_normalization == expected


def _licence_warnings(load):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = load()
    return model, [str(w.message) for w in caught if issubclass(w.category, keras_vit.loading.LicenseWarning)]


def test_cli_convert_keeps_the_licence(zoo, tmp_path, capsys):
    import keras

    mae = zoo["cases"][MAE[0]]  # timm's pretrained_cfg names cc-by-nc-4.0
    x = mae["x"]
    for name in ("preset", "model.keras"):
        out = str(tmp_path / name)
        assert main(["convert", mae["folder"], out]) == 0
        assert keras_vit.loading.license_of(keras_vit.loading.resolve(out)) == "cc-by-nc-4.0", name
        # Loading the converted weights says what loading timm's folder says, once.
        model, said = _licence_warnings(lambda: keras_vit.load_checkpoint(out, **_load_kwargs(mae["model"])))
        assert len(said) == 1 and "cc-by-nc-4.0" in said[0] and "non-commercial" in said[0], (name, said)
        ok, errors = _within(model.predict(x, verbose=0), *mae["ref"])
        assert ok, (name, errors)
    # The .keras archive with the licence in its metadata.json is still Keras' own file.
    restored = keras.saving.load_model(str(tmp_path / "model.keras"))
    np.testing.assert_allclose(restored.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-6, atol=1e-6)
    with open(tmp_path / "preset" / "metadata.json") as f:
        assert json.load(f)["license"] == "cc-by-nc-4.0"
    # An open licence travels too, and warns of nothing.
    out = str(tmp_path / "dinov2")
    assert main(["convert", zoo["cases"][DINOV2[0]]["folder"], out]) == 0
    assert keras_vit.loading.license_of(keras_vit.loading.resolve(out)) == "apache-2.0"
    assert _licence_warnings(lambda: keras_vit.load_checkpoint(out, include_top=False))[1] == []
    # An .npz records no licence: convert says so.
    capsys.readouterr()
    assert main(["convert", mae["folder"], str(tmp_path / "mae.npz")]) == 0
    assert "does not record the weights' licence (cc-by-nc-4.0)" in capsys.readouterr().err


# === hf://, preset tags and the CLI from a Hub endpoint, in a fresh process ===

_HUB_BODY = """
import json, os, sys, warnings
import numpy as np
import keras_vit
from keras_vit import presets
from keras_vit.cli import main
root, owner, cases = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
result = {}
# keras-vit evaluate of a repository, the first load of its weights in this process.
handle = f"hf://{owner}/dinov2_reg4_head"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    result["evaluate"] = main(["evaluate", "--weights", handle, "--data", os.path.join(root, "eval_data"), "--out",
                               os.path.join(root, "evaluated"), "--verbose", "0"])
result["evaluate_warnings"] = [str(w.message) for w in caught if issubclass(w.category, keras_vit.loading.LicenseWarning)]
model = keras_vit.load_checkpoint(handle)
result["evaluate_normalization"] = model.config.input_normalization
result["evaluate_license"] = keras_vit.loading.license_of(keras_vit.loading.resolve(handle))
for case, kwargs in cases.items():
    x = np.load(os.path.join(root, f"x_{case}.npy"))
    model = keras_vit.load_checkpoint(f"hf://{owner}/{case}", **kwargs)
    result[case] = model.predict(x, verbose=0).tolist()
x = np.load(os.path.join(root, "x_dinov2_s14_reg4_28.npy"))
model = keras_vit.DINOv2S14Reg4(weights=f"hf://{owner}/dinov2_s14_reg4_28", input_shape=(28, 28, 3),
                                include_top=False, pooling="token")
result["constructor_hf"] = model.predict(x, verbose=0).tolist()
# A preset tag of the constructor (a row of the table, as the zoo's rows are), with a licence.
presets.register_preset("DINOv2S14Reg4", "test_tag", 28, f"{owner}/dinov2_s14_reg4_28", classes=0,
                        license="cc-by-nc-4.0")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        model = keras_vit.DINOv2S14Reg4(weights="test_tag", input_shape=(28, 28, 3), include_top=False,
                                        pooling="token")
result["constructor_tag"] = model.predict(x, verbose=0).tolist()
result["tag_warnings"] = [str(w.message) for w in caught if "licensed" in str(w.message)]
# A preset stating what its architecture changes in the repository's config.json (QuickGELU).
presets.register_preset("CLIPB16QuickGELU", "test_quick", 64, f"{owner}/clip_b32_gelu_repo", classes=64,
                        config=(("mlp_activation", "quick_gelu"),))
x = np.load(os.path.join(root, "x_clip_b32_quickgelu.npy"))
model = keras_vit.load_checkpoint("CLIPB16QuickGELU.test_quick", classifier_activation=None)
result["quick_preset"] = model.predict(x, verbose=0).tolist()
result["convert"] = main(["convert", f"hf://{owner}/siglip_b16_map", os.path.join(root, "converted")])
print("RESULT" + json.dumps(result))
"""


@pytest.mark.slow
@pytest.mark.backend_independent
def test_zoo_cases_load_from_the_hub(zoo, tmp_path):
    cases = {case: _load_kwargs(entry["model"]) for case, entry in zoo["cases"].items()}
    with HubServer(zoo["root"] / "repos") as server:
        code = (f"import sys; sys.argv = ['-c', {str(zoo['root'])!r}, {OWNER!r}, {json.dumps(cases)!r}]\n"
                + _HUB_BODY)
        out = run_hub_python(code, hub_env(server, tmp_path), timeout=600)
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT"):])
    for case, entry in zoo["cases"].items():
        ok, errors = _within(result[case], *entry["ref"])
        assert ok, (case, errors)
    dinov2 = zoo["cases"][DINOV2[0]]
    for key in ("constructor_hf", "constructor_tag"):
        ok, errors = _within(result[key], *dinov2["ref"])
        assert ok, (key, errors)
    # The QuickGELU preset read from the GELU repository gives timm's QuickGELU model's outputs.
    ok, errors = _within(result["quick_preset"], *zoo["cases"]["clip_b32_quickgelu"]["ref"])
    assert ok, errors
    # Two loads of the non-commercial tag: one line, naming the licence.
    assert len(result["tag_warnings"]) == 1 and "cc-by-nc-4.0" in result["tag_warnings"][0]
    # keras-vit convert hf://... wrote a preset folder that loads to timm's outputs.
    assert result["convert"] == 0
    siglip = zoo["cases"]["siglip_b16_map"]
    model = keras_vit.load_checkpoint(str(zoo["root"] / "converted"), **_load_kwargs(siglip["model"]))
    ok, errors = _within(model.predict(siglip["x"], verbose=0), *siglip["ref"])
    assert ok, errors
    assert os.path.isfile(zoo["root"] / "converted" / "config.json")
    # keras-vit evaluate --weights hf://...: the repository's mean/std (ImageNet's) reach the model,
    # so the loss is timm's on the normalised images (with [-1, 1] inputs it would differ); its
    # licence comes along and is said once.
    ev = zoo["evaluate"]
    assert abs(ev["unit_range_loss"] - ev["loss"]) > 100 * ev["tolerance"]  # the normalisation shows in the loss
    assert result["evaluate"] == 0
    metrics = json.loads((zoo["root"] / "evaluated" / "metrics.json").read_text())
    assert metrics["examples"] == 6 and metrics["top1"] == ev["top1"]
    assert abs(metrics["loss"] - ev["loss"]) <= ev["tolerance"], (metrics["loss"], ev)
    assert result["evaluate_normalization"] == [ev["mean"], ev["std"]]
    assert result["evaluate_license"] == "cc-by-nc-4.0"
    assert len(result["evaluate_warnings"]) == 1 and "cc-by-nc-4.0" in result["evaluate_warnings"][0]
