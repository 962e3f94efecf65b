"""BiT ResNet-v2 (the paper's CNN baselines) against timm's resnetv2 port of big_transfer.

timm builds random-weight BiT models, saves them in its Hub layout, and computes the reference
logits; its own `resnetv2._load_weights` reads the .npz files keras_vit writes. Its script runs in
the test process (conftest imports timm before TensorFlow); the Hub loads run in fresh processes.
"""

import importlib.util
import json
import os

import keras
import numpy as np
import pytest

import keras_vit
from keras_vit.checkpoints import bit as bit_format
from keras_vit.models.bit_family import BIT_ARCHITECTURES
from conftest import run_script
from test_hub_server import HubServer, hub_env, run_hub_python

TINY = dict(layers=(1, 2, 1, 1), width_factor=0.5, num_classes=7)
TINY_REPO = "timm/resnetv2_50x1_bit.goog_in21k"  # served with the tiny model: the reader infers the shapes
FULL_REPO = "timm/resnetv2_50x1_bit.goog_distilled_in1k"  # what BiTResNet50x1(weights="imagenet") fetches

_TIMM = """
import json, os, sys
from functools import partial
import numpy as np, torch, timm
from timm.layers import StdConv2d
from timm.models import save_for_hf
from timm.models.resnetv2 import ResNetV2

root, job = sys.argv[1], sys.argv[2]

def bit(eps=1e-8, **kwargs):
    return ResNetV2(stem_type="fixed", conv_layer=partial(StdConv2d, eps=eps), **kwargs)

def perturb(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():  # zero heads and unit norms would hide mistakes
            p.add_(torch.randn_like(p) * 0.1)
    return model.eval()

def sharpen(model):
    # Make both epsilons matter: a kernel whose variance is near the standardisation eps, and a
    # GroupNorm whose input variance is near its eps (the norm before it scaled down).
    with torch.no_grad():
        model.stages[1].blocks[0].conv2.weight.mul_(1e-3)
        model.stages[0].blocks[0].norm2.weight.mul_(1e-2)
        model.stages[0].blocks[0].norm2.bias.mul_(1e-2)
    return model

def logits(model, x):
    # In float64, on contiguous NCHW tensors (on a channels-last view PyTorch takes a one-pass
    # GroupNorm whose float32 error is several times larger): the reference is exact to float32.
    with torch.no_grad():
        return model.double()(torch.from_numpy(x).double().permute(0, 3, 1, 2).contiguous()).float().numpy()

if job == "make":
    rng = np.random.default_rng(0)
    x = {"x64": rng.uniform(-1, 1, (2, 64, 64, 3)).astype("float32"),
         "x96": rng.uniform(-1, 1, (2, 96, 64, 3)).astype("float32"),
         "x224": rng.uniform(-1, 1, (2, 224, 224, 3)).astype("float32")}
    for k, v in x.items():
        np.save(os.path.join(root, k + ".npy"), v)
    tiny = sharpen(perturb(bit(**json.loads(sys.argv[3])), 1))
    tiny.pretrained_cfg = dict(architecture="resnetv2_50x1_bit", input_size=(3, 64, 64), num_classes=7)
    save_for_hf(tiny, os.path.join(root, "repos", *sys.argv[4].split("/")), safe_serialization=True)
    np.save(os.path.join(root, "ref_x64.npy"), logits(tiny, x["x64"]))
    np.save(os.path.join(root, "ref_x96.npy"), logits(tiny, x["x96"]))
    # Parameter counts at full size (on the meta device: no memory, no forward).
    counts = {}
    with torch.device("meta"):
        for name in timm.list_models("resnetv2_*_bit"):
            counts[name] = sum(p.numel() for p in timm.create_model(name, pretrained=False).parameters())
        counts["resnetv2_200x3_bit"] = sum(p.numel() for p in bit(layers=(3, 24, 36, 3), width_factor=3).parameters())
    registry = []
    for name in timm.list_pretrained("resnetv2_*_bit*"):
        cfg = timm.models.get_pretrained_cfg(name)
        registry.append([name, cfg.input_size[-1], cfg.num_classes, cfg.hf_hub_id])
    json.dump({"counts": counts, "registry": registry}, open(os.path.join(root, "timm.json"), "w"))
elif job == "full":
    full = perturb(timm.create_model("resnetv2_50x1_bit", pretrained=False), 2)
    save_for_hf(full, os.path.join(root, "repos", *sys.argv[3].split("/")), safe_serialization=True)
    np.save(os.path.join(root, "ref_x224.npy"), logits(full, np.load(os.path.join(root, "x224.npy"))))
elif job == "npz":
    # timm's own .npz loader (resnetv2._load_weights), run with timm's eps and with big_transfer's.
    for eps, name in ((1e-8, "ref_npz"), (1e-10, "ref_npz_big_transfer")):
        model = bit(eps=eps, **json.loads(sys.argv[3])).eval()
        model.load_pretrained(os.path.join(root, "keras.npz"))
        np.save(os.path.join(root, name + ".npy"), logits(model, np.load(os.path.join(root, "x64.npy"))))
"""


def _timm(root, job, *args):
    run_script(_TIMM, root, job, *args)


@pytest.fixture(scope="module")
def timm_side(tmp_path_factory):
    if importlib.util.find_spec("timm") is None:
        pytest.skip("timm is not installed")
    root = tmp_path_factory.mktemp("bit")
    _timm(root, "make", json.dumps(TINY), TINY_REPO)
    data = {k: np.load(root / f"{k}.npy") for k in ("x64", "x96", "x224", "ref_x64", "ref_x96")}
    return dict(root=root, **data, **json.load(open(root / "timm.json")))


def _rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def _tiny_folder(timm_side):
    return timm_side["root"] / "repos" / TINY_REPO


# === Parity with timm ===


#: Bound of the parity with timm, relative to the largest logit: about 10x the measured error
#: (tiny model in float32 against timm's in float64), so that a wrong
#: numerics field (GroupNorm eps 1e-6 or 1e-4 for 1e-5, weight standardisation eps 1e-10 for 1e-8)
#: fails: the tiny model has a kernel and a GroupNorm input whose variances are near those eps.
TIMM_TOL = 2e-5  # measured 2.6e-6 (JAX); the wrong fields measure 8e-4 (GroupNorm eps 1e-6) to 1.4e-2


def test_logits_match_timm_at_the_native_size_and_another(timm_side):
    model = keras_vit.load_checkpoint(_tiny_folder(timm_side), classifier_activation=None)
    assert isinstance(model, keras_vit.BiTResNet)
    assert tuple(model.image_size) == (64, 64)  # the repository's pretrained_cfg input size
    assert model.get_config()["std_conv_epsilon"] == 1e-8  # timm's numerics for a timm repository
    err = _rel_err(model.predict(timm_side["x64"], verbose=0), timm_side["ref_x64"])
    other = keras_vit.load_checkpoint(_tiny_folder(timm_side), image_size=(96, 64), classifier_activation=None)
    err96 = _rel_err(other.predict(timm_side["x96"], verbose=0), timm_side["ref_x96"])
    print(f"timm parity: 64x64 {err:.2e}, 96x64 {err96:.2e}")
    assert err < TIMM_TOL and err96 < TIMM_TOL
    # The bound tells the numerics apart: each wrong field is far outside it.
    for wrong in (dict(group_norm_epsilon=1e-6), dict(group_norm_epsilon=1e-4), dict(std_conv_epsilon=1e-10)):
        changed = keras_vit.load_checkpoint(_tiny_folder(timm_side), classifier_activation=None, **wrong)
        wrong_err = _rel_err(changed.predict(timm_side["x64"], verbose=0), timm_side["ref_x64"])
        print(f"  with {wrong}: {wrong_err:.2e}")
        assert wrong_err > 10 * TIMM_TOL, (wrong, wrong_err)


def test_a_bare_safetensors_file_is_recognised_as_bit(timm_side, tmp_path):
    bare = tmp_path / "weights.safetensors"
    bare.write_bytes((_tiny_folder(timm_side) / "model.safetensors").read_bytes())
    assert bit_format.detect_timm_bit(bare) and not bit_format.detect_bit_npz(bare)
    tree, config = keras_vit.read_checkpoint(bare)
    folder_tree, folder_config = keras_vit.read_checkpoint(_tiny_folder(timm_side))
    assert config["image_size"] == (224, 224) and folder_config["image_size"] == (64, 64)  # no config.json: default
    assert {k: v for k, v in config.items() if k != "image_size"} == {
        k: v for k, v in folder_config.items() if k != "image_size"
    }
    assert all(np.array_equal(tree[k], folder_tree[k]) for k in folder_tree) and set(tree) == set(folder_tree)


def test_weight_tree_is_the_big_transfer_layout(timm_side):
    tree, config = bit_format.read_timm_bit(_tiny_folder(timm_side))
    assert config["block_units"] == (1, 2, 1, 1) and config["width_factor"] == 0.5 and config["classes"] == 7
    assert tree["resnet/root_block/standardized_conv2d/kernel"].shape == (7, 7, 3, 32)
    assert tree["resnet/block1/unit01/a/group_norm/gamma"].shape == (32,)  # pre-activation: the unit's input
    assert tree["resnet/block1/unit01/a/proj/standardized_conv2d/kernel"].shape == (1, 1, 32, 128)
    assert tree["resnet/block2/unit02/b/standardized_conv2d/kernel"].shape == (3, 3, 64, 64)
    assert "resnet/block2/unit02/a/proj/standardized_conv2d/kernel" not in tree  # identity shortcut
    assert tree["resnet/head/conv2d/kernel"].shape == (1, 1, 1024, 7)
    from keras_vit.layers.init_scope import skip_random_init

    with skip_random_init():
        model = keras_vit.BiTResNet(image_size=64, block_units=(1, 2, 1, 1), width_factor=0.5, classes=7)
    assert set(keras_vit.get_weight_tree(model)) == set(tree)


def test_npz_round_trip_through_timms_own_loader(timm_side):
    """keras_vit's .npz loads in timm (`resnetv2._load_weights`); back in keras_vit, an .npz in
    big_transfer's layout runs with big_transfer's numerics (weight standardisation eps 1e-10,
    compared with timm's model built with that eps), or timm's when asked."""
    root = timm_side["root"]
    model = keras_vit.load_checkpoint(_tiny_folder(timm_side), classifier_activation=None)
    bit_format.write_bit_npz(model, root / "keras.npz")
    _timm(root, "npz", json.dumps(TINY))
    ours = model.predict(timm_side["x64"], verbose=0)
    assert _rel_err(ours, np.load(root / "ref_npz.npy")) < TIMM_TOL
    # ... and back: the file is read as BiT (by its keys, whatever its name) into the same tree.
    (root / "BiT-M-R50x1.npz").write_bytes((root / "keras.npz").read_bytes())
    tree, config = bit_format.read_bit_npz(root / "BiT-M-R50x1.npz")
    expected = keras_vit.get_weight_tree(model)
    assert set(tree) == set(expected) and all(np.array_equal(np.asarray(tree[k]), expected[k]) for k in tree)
    assert config["std_conv_epsilon"] == 1e-10 and config["group_norm_epsilon"] == 1e-5
    again = keras_vit.load_checkpoint(str(root / "BiT-M-R50x1.npz"), image_size=64, classifier_activation=None)
    got = again.predict(timm_side["x64"], verbose=0)
    big_transfer = np.load(root / "ref_npz_big_transfer.npy")
    err = _rel_err(got, big_transfer)
    apart = _rel_err(big_transfer, np.load(root / "ref_npz.npy"))
    print(f"big_transfer numerics: {err:.2e} (timm's eps 1e-8 is {apart:.2e} away)")
    assert err < TIMM_TOL and apart > 10 * TIMM_TOL
    told = keras_vit.load_checkpoint(str(root / "BiT-M-R50x1.npz"), image_size=64, std_conv_epsilon=1e-8,
                                     classifier_activation=None)
    assert _rel_err(told.predict(timm_side["x64"], verbose=0), np.load(root / "ref_npz.npy")) < TIMM_TOL


def test_a_folder_holding_a_bit_npz_is_bit(timm_side, tmp_path):
    """A Hub snapshot of a big_transfer repository: a folder with one .npz (and a README)."""
    model = keras_vit.load_checkpoint(_tiny_folder(timm_side), classifier_activation=None)
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    bit_format.write_bit_npz(model, snapshot / "BiT-M-R50x1.npz")
    (snapshot / "README.md").write_text("BiT-M R50x1\n")
    from keras_vit.checkpoints import detect_format

    assert detect_format(snapshot).name == "bit_npz"
    loaded = keras_vit.load_checkpoint(snapshot, image_size=64, std_conv_epsilon=1e-8, classifier_activation=None)
    np.testing.assert_array_equal(loaded.predict(timm_side["x64"], verbose=0), model.predict(timm_side["x64"], verbose=0))


def test_numerics_survive_keras_files_presets_and_export(timm_side, tmp_path):
    """big_transfer's eps (1e-10) is a config field: a .keras file, a preset and a SavedModel export
    keep it (the tiny model's logits depend on it: see test_npz_round_trip_through_timms_own_loader)."""
    model = keras_vit.load_checkpoint(_tiny_folder(timm_side), classifier_activation=None)
    bit_format.write_bit_npz(model, tmp_path / "b.npz")
    loaded = keras_vit.load_checkpoint(tmp_path / "b.npz", image_size=64, classifier_activation=None)
    x = timm_side["x64"]
    expected = loaded.predict(x, verbose=0)
    loaded.save(tmp_path / "b.keras")
    keras_vit.save_preset(loaded, tmp_path / "preset", readme=False)
    for again in (keras.saving.load_model(tmp_path / "b.keras"), keras_vit.load_checkpoint(tmp_path / "preset")):
        assert again.get_config()["std_conv_epsilon"] == 1e-10
        np.testing.assert_array_equal(again.predict(x, verbose=0), expected)
    if keras.backend.backend() != "tensorflow":
        return  # the export of another backend goes through the .keras file checked above
    import tensorflow as tf

    keras_vit.export_model(loaded, str(tmp_path / "saved"))
    served = tf.saved_model.load(str(tmp_path / "saved")).signatures["serving_default"]
    probabilities = served(images=tf.constant(x))["probabilities"].numpy()
    reference = np.exp(expected - expected.max(axis=1, keepdims=True))
    reference /= reference.sum(axis=1, keepdims=True)
    # Measured 1e-7 (softmax of the same float32 logits, another backend); eps 1e-8 is ~1e-2 away.
    np.testing.assert_allclose(probabilities, reference, rtol=0, atol=1e-5)


def test_a_pytorch_model_bin_reads_like_the_safetensors(timm_side, tmp_path):
    """timm's save_pretrained without safetensors writes pytorch_model.bin (a PyTorch zip file,
    read without running its pickle, as for timm's ViTs and EfficientNets): the folder and the
    bare file read the same tree as model.safetensors; a BiT file of another depth given to a
    constructor names both architectures."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    folder = _tiny_folder(timm_side)
    only_bin = tmp_path / "bin"
    only_bin.mkdir()
    torch.save(load_file(folder / "model.safetensors"), only_bin / "pytorch_model.bin")
    (only_bin / "config.json").write_text((folder / "config.json").read_text())
    tree, config = keras_vit.read_checkpoint(folder)
    for other in (only_bin, only_bin / "pytorch_model.bin"):
        other_tree, other_config = keras_vit.read_checkpoint(other)
        assert sorted(other_tree) == sorted(tree)
        assert all(np.array_equal(other_tree[k], tree[k]) for k in tree)
        assert other_config == config  # the bare file: config.json beside it still states the size
    with pytest.raises(ValueError, match=r"different architecture \(BiT ResNet units \(1, 2, 1, 1\), width x0.5\) "
                                         r"than BiTResNet101x1 \(BiT ResNet units \(3, 4, 23, 3\), width x1\)"):
        keras_vit.BiTResNet101x1(weights=str(only_bin))


def test_bit_readers_refuse_damaged_files(timm_side, tmp_path):
    """What the ViT readers refuse, the BiT ones do too, with a CheckpointError naming the problem:
    non-finite weights, .npy headers that claim more data than the file holds (before allocating),
    config.json fields of the wrong type."""
    import io
    import tracemalloc
    import zipfile

    model = keras_vit.load_checkpoint(_tiny_folder(timm_side), classifier_activation=None)
    tree = {k: np.asarray(v) for k, v in keras_vit.get_weight_tree(model).items()}
    nan = dict(tree)
    nan["resnet/group_norm/gamma"] = tree["resnet/group_norm/gamma"].copy()
    nan["resnet/group_norm/gamma"][3] = np.nan
    np.savez(tmp_path / "nan.npz", **nan)
    with pytest.raises(keras_vit.CheckpointError, match="'resnet/group_norm/gamma' holds 1 non-finite"):
        keras_vit.load_checkpoint(tmp_path / "nan.npz")

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (100_000, 250_000)})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for key, value in tree.items():
            member = io.BytesIO()
            np.save(member, value)
            data = member.getvalue()
            if key == "resnet/head/conv2d/kernel":
                data = header.getvalue() + b"\0" * 64
            z.writestr(key + ".npy", data)
    (tmp_path / "huge.npz").write_bytes(buf.getvalue())
    tracemalloc.start()
    try:
        with pytest.raises(keras_vit.CheckpointError, match=r"declares shape \(100000, 250000\)"):
            keras_vit.read_checkpoint(tmp_path / "huge.npz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20

    folder = tmp_path / "timm_bad"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes((_tiny_folder(timm_side) / "model.safetensors").read_bytes())
    config = json.loads((_tiny_folder(timm_side) / "config.json").read_text())
    for field, value, message in [("model_args", [1], "'model_args' is \\[1\\]; expected an object"),
                                  ("pretrained_cfg", {"input_size": [3, "64", 64]}, "input_size")]:
        (folder / "config.json").write_text(json.dumps(dict(config, **{field: value})))
        with pytest.raises(keras_vit.CheckpointError, match=message):
            keras_vit.read_checkpoint(folder)


# === The model itself ===


def test_include_top_pooling_and_a_fresh_head(timm_side):
    folder = _tiny_folder(timm_side)
    features = keras_vit.load_checkpoint(folder, include_top=False)
    assert features.output_shape == (None, 2, 2, 1024)
    pooled = keras_vit.load_checkpoint(folder, include_top=False, pooling="avg")
    maps = features.predict(timm_side["x64"], verbose=0)
    np.testing.assert_allclose(pooled.predict(timm_side["x64"], verbose=0), maps.mean(axis=(1, 2)), rtol=1e-5, atol=1e-6)
    fresh = keras_vit.load_checkpoint(folder, classes=3)
    head = fresh.get_layer("head")
    assert head.kernel.shape == (1, 1, 1024, 3) and not np.any(head.kernel.numpy()) and not np.any(head.bias.numpy())
    with pytest.raises(ValueError, match="pooling must be"):
        keras_vit.BiTResNet(image_size=64, block_units=(1,), width_factor=0.5, include_top=False, pooling="token")
    with pytest.raises(ValueError, match="32 groups"):
        keras_vit.BiTResNet(image_size=64, block_units=(1,), width_factor=0.25)


def test_saves_reloads_and_runs_at_any_size(tmp_path):
    model = keras_vit.BiTResNet(
        image_size=None, block_units=(1, 1), width_factor=0.5, classes=4, classifier_activation=None
    )
    rng = np.random.default_rng(0)
    for v in model.weights:
        v.assign(rng.standard_normal(tuple(v.shape)).astype("float32") * 0.1)
    x = rng.uniform(-1, 1, (2, 40, 56, 3)).astype("float32")
    y = model.predict(x, verbose=0)
    model.save(tmp_path / "bit.keras")
    again = keras.saving.load_model(tmp_path / "bit.keras")
    assert type(again) is keras_vit.BiTResNet and again.get_config() == model.get_config()
    np.testing.assert_allclose(again.predict(x, verbose=0), y, rtol=1e-6, atol=1e-6)


def test_constructors_and_their_errors():
    model = keras_vit.BiTResNet50x1(weights=None, input_shape=(64, 64, 3), include_top=False, pooling="avg")
    assert model.output_shape == (None, 2048)
    with pytest.raises(ValueError, match="No pretrained weights are published for BiTResNet200x3"):
        keras_vit.BiTResNet200x3(weights="imagenet")
    with pytest.raises(ValueError, match="Unknown override"):
        keras_vit.BiTResNet50x1(weights=None, patch_size=16)
    assert keras_vit.presets.find_preset("BiTResNet50x1", "imagenet").tag == "goog_distilled_in1k"
    assert keras_vit.presets.find_preset("BiTResNet152x2", "imagenet", 384).tag == "goog_teacher_in21k_ft_in1k_384"
    assert keras_vit.presets.find_preset("BiTResNet50x3", "imagenet").resolution == 448
    assert keras_vit.presets.find_preset("BiTResNet101x1", "imagenet21k").classes == 21843


def test_preset_rows_are_timms_bit_checkpoints(timm_side):
    expected = {f"timm/{name}": (res, classes) for name, res, classes, _ in timm_side["registry"]}
    ours = {p.repo: (p.resolution, p.classes) for p in keras_vit.list_presets() if p.architecture in BIT_ARCHITECTURES}
    assert ours == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BIT_ARCHITECTURES))
def test_full_size_parameter_counts_equal_timms(timm_side, name):
    timm_name = BIT_ARCHITECTURES[name].timm_name or "resnetv2_200x3_bit"
    # Counting needs shapes only: the variables stay uninitialised (no 3.7 GB of zeros for 152x4).
    with keras.StatelessScope(initialize_variables=False):
        model = getattr(keras_vit, name)(weights=None)
    assert model.count_params() == timm_side["counts"][timm_name]
    assert model.output_shape == (None, 1000)
    del model
    keras.utils.clear_session()


# === Through the Hub (a loopback endpoint, fresh processes) ===


# The Hub protocol and the alias's repository do not depend on the backend: once, in the JAX pass.
# BiT's numerics against timm on every backend: test_logits_match_timm_at_the_native_size_and_another
# (every stage, strided and not, of the same blocks as the full-size model).
@pytest.mark.slow
@pytest.mark.backend_independent
def test_hf_handle_and_the_imagenet_alias_load_through_the_hub(timm_side, tmp_path):
    root = timm_side["root"]
    _timm(root, "full", FULL_REPO)  # a full-size random ResNet-50x1 where weights="imagenet" looks
    code = f"""
import json
import numpy as np
import keras_vit
result = {{}}
m = keras_vit.load_checkpoint("hf://{TINY_REPO}", classifier_activation=None)
result["tiny"] = m.predict(np.load({str(root / "x64.npy")!r}), verbose=0).tolist()
m = keras_vit.BiTResNet50x1(weights="imagenet", classifier_activation=None)
result["full"] = m.predict(np.load({str(root / "x224.npy")!r}), verbose=0).tolist()
result["type"] = type(m).__name__
print("RESULT" + json.dumps(result))
"""
    with HubServer(root / "repos") as server:
        out = run_hub_python(code, hub_env(server, tmp_path), timeout=900)
    result = json.loads([ln for ln in out.stdout.splitlines() if ln.startswith("RESULT")][-1][len("RESULT"):])
    assert result["type"] == "BiTResNet"
    assert _rel_err(result["tiny"], timm_side["ref_x64"]) < TIMM_TOL
    # A randomly perturbed full-size ResNet-50x1 (16 units, unit-variance standardised kernels)
    # grows its residual stream unit after unit: measured 6.8e-6 on JAX against timm in float64
    # (3.7e-5 against timm's float32 on a channels-last view). Bound at about 10x.
    assert _rel_err(result["full"], np.load(root / "ref_x224.npy")) < 7e-5
