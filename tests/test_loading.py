"""The one loading path (keras_vit.loading): every way of naming weights resolves in `resolve`,
one head policy, one model build per load with no random initialisation, and Keras-native files
read lazily into that one model.

References are independent of the loading code: the original .npz layout written from a model's
own weights (checked against timm's .npz loader in test_checkpoints.py), and the model's own
predictions before saving.
"""

import os
import shutil
import warnings

import keras
import numpy as np
import pytest
from conftest import TINY, TINY_HYBRID, randomize

import keras_vit
from keras_vit import loading
from keras_vit.models.vit import VisionTransformer


@pytest.fixture
def build_counter(monkeypatch):
    """Counts VisionTransformer builds and random-initialiser calls made while a test runs."""
    counts = {"builds": 0, "random": 0}
    real_init = VisionTransformer.__init__

    def counting_init(self, *args, **kwargs):
        counts["builds"] += 1
        return real_init(self, *args, **kwargs)

    monkeypatch.setattr(VisionTransformer, "__init__", counting_init)
    for name in ("RandomNormal", "TruncatedNormal", "GlorotUniform", "RandomUniform", "LecunNormal"):
        cls = getattr(keras.initializers, name)
        real_call = cls.__call__

        def counting_call(self, *args, _real=real_call, **kwargs):
            counts["random"] += 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__call__", counting_call)
    return counts


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """One tiny model (with pre_logits) in every local format, plus its predictions."""
    root = tmp_path_factory.mktemp("formats")
    model = randomize(VisionTransformer(**TINY, representation_size=12, classifier_activation=None), seed=3)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    keras_vit.write_npz(model, root / "model.npz")
    keras_vit.save_preset(model, root / "preset")
    model.save(root / "model.keras")
    os.makedirs(root / "run")
    model.save(root / "run" / "model.keras")
    os.makedirs(root / "h5")
    model.save_weights(root / "h5" / "model.weights.h5")
    (root / "h5" / "config.json").write_text((root / "preset" / "config.json").read_text())
    return dict(root=root, x=x, logits=model.predict(x, verbose=0), tree=keras_vit.get_weight_tree(model))


FORMS = [
    ("model.npz", "npz"),
    ("preset", "keras_preset"),
    ("model.keras", "keras"),
    ("run", "keras"),
    ("h5/model.weights.h5", "keras_weights"),
]


@pytest.mark.parametrize("name,fmt", FORMS)
def test_every_local_form_resolves_and_loads_in_one_build(saved, build_counter, name, fmt):
    path = saved["root"] / name
    resolved = loading.resolve(path)
    assert resolved.format.name == fmt and os.path.exists(resolved.path)
    assert loading.resolve(str(path)).format.name == fmt
    build_counter.update(builds=0, random=0)
    model = keras_vit.load_checkpoint(path)
    assert build_counter == {"builds": 1, "random": 0}
    np.testing.assert_allclose(model.predict(saved["x"], verbose=0), saved["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["preset", "model.keras"])
def test_keras_files_load_at_another_size_and_head_like_the_npz(saved, build_counter, name):
    # The .npz route (reader checked against timm elsewhere) is the reference for resize + head.
    kwargs = dict(image_size=48, classes=5, include_top=True, classifier_activation=None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = keras_vit.load_checkpoint(saved["root"] / "model.npz", **kwargs)
        build_counter.update(builds=0, random=0)
        model = keras_vit.load_checkpoint(saved["root"] / name, **kwargs)
    assert build_counter["builds"] == 1 and build_counter["random"] == 0
    ours, ref = keras_vit.get_weight_tree(model), keras_vit.get_weight_tree(reference)
    assert sorted(ours) == sorted(ref)
    for key in ref:
        np.testing.assert_allclose(ours[key], ref[key], rtol=1e-6, atol=1e-7, err_msg=key)
    assert not np.any(ours["head/kernel"])  # the fresh head is zero


def test_head_policy_matrix(saved):
    path = saved["root"] / "model.npz"
    tree = saved["tree"]
    # as the checkpoint is: its head
    m = keras_vit.load_checkpoint(path, include_top=None)
    assert m.output_shape == (None, TINY["classes"])
    # kept head (classes None or equal)
    for classes in (None, TINY["classes"]):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            m = keras_vit.load_checkpoint(path, classes=classes)
        np.testing.assert_array_equal(m.get_layer("head").kernel.numpy(), tree["head/kernel"])
    # a fresh head, with a warning naming how to keep the trained one
    with pytest.warns(UserWarning, match=f"trained {TINY['classes']}-class head.*classes={TINY['classes']}"):
        m = keras_vit.load_checkpoint(path, classes=3)
    assert m.output_shape == (None, 3) and not np.any(m.get_layer("head").kernel.numpy())
    np.testing.assert_array_equal(m.get_layer("pre_logits").kernel.numpy(), tree["pre_logits/kernel"])
    # features: no head; pre_logits only when pooling
    m = keras_vit.load_checkpoint(path, include_top=False)
    assert m.output_shape == (None, 17, TINY["hidden_size"])
    m = keras_vit.load_checkpoint(path, include_top=False, pooling="token")
    assert m.output_shape == (None, 12)
    # fine-tuning: fresh head, pre_logits dropped, from a model or straight from the file
    for base in (keras_vit.load_checkpoint(path), path):
        ft = keras_vit.training.for_finetuning(base, image_size=48, classes=4)
        assert ft.output_shape == (None, 4) and ft.grid_size == (6, 6)
        assert "pre_logits" not in [layer.name for layer in ft.layers]
        np.testing.assert_array_equal(
            ft.get_layer("encoder_norm").gamma.numpy(), tree["Transformer/encoder_norm/scale"]
        )


def test_a_load_that_fails_while_reading_values_leaves_later_builds_working(saved, tmp_path):
    # The NaN is found only when its tensor is read, as its variable is initialised at the end of
    # the build: the half-built model must not stay behind in Keras' list of variables waiting for
    # initialisation, where it failed every later build of the process.
    import h5py

    from keras_vit.checkpoints import CheckpointError

    bad = tmp_path / "bad"
    shutil.copytree(saved["root"] / "h5", bad)
    with h5py.File(bad / "model.weights.h5", "r+") as f:
        datasets = []
        f.visititems(lambda name, obj: datasets.append(name) if isinstance(obj, h5py.Dataset) else None)
        last = f[sorted(datasets)[-1]]
        last[...] = np.full(last.shape, np.nan, last.dtype)
    with pytest.raises(CheckpointError, match="non-finite"):
        keras_vit.load_checkpoint(bad / "model.weights.h5")
    model = keras_vit.load_checkpoint(saved["root"] / "h5" / "model.weights.h5")
    np.testing.assert_allclose(model.predict(saved["x"], verbose=0), saved["logits"], rtol=1e-5, atol=1e-5)
    with keras.StatelessScope():  # Keras' own deferred initialisation works too
        VisionTransformer(**TINY)
    # A caller's uninitialised variables are left as they are: the load initialises its own only.
    with keras.StatelessScope(initialize_variables=False):
        shapes_only = VisionTransformer(**TINY)
    keras_vit.load_checkpoint(saved["root"] / "model.npz")
    assert all(v._value is None for v in shapes_only.weights)  # Keras' mark of a deferred variable


def test_a_checkpoint_without_head_needs_classes_or_no_top(tmp_path):
    model = VisionTransformer(**TINY, include_top=False)
    keras_vit.write_npz(model, tmp_path / "features.npz")
    with pytest.raises(ValueError, match="no classification head.*classes=N.*include_top=False"):
        keras_vit.load_checkpoint(tmp_path / "features.npz")
    assert keras_vit.load_checkpoint(tmp_path / "features.npz", include_top=None).output_shape == (None, 24)
    assert keras_vit.load_checkpoint(tmp_path / "features.npz", classes=2).output_shape == (None, 2)


def test_bad_names_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="No checkpoint at.*missing.npz.*weights=None"):
        loading.resolve(str(tmp_path / "missing.npz"))
    with pytest.raises(FileNotFoundError, match="No checkpoint"):
        loading.resolve("./not/here")
    with pytest.raises(ValueError, match="Unknown weights 'augreg2_in21k_ft_in1' for ViTB16. Did you mean 'augreg2_in21k_ft_in1k'"):
        loading.resolve("ViTB16.augreg2_in21k_ft_in1")
    with pytest.raises(ValueError, match="Did you mean 'vit_base_patch16_224.augreg2_in21k_ft_in1k'"):
        loading.resolve("vit_base_patch16_224.augreg2_in21k_ft_in1")
    with pytest.raises(ValueError, match="Unknown weights 'augreg_in22k' for ViTB16.*augreg_in21k"):
        keras_vit.ViTB16(weights="augreg_in22k")
    with pytest.raises(ValueError, match="not a Hub handle"):
        loading.resolve("hf://not a repo")
    with pytest.raises(TypeError, match="weights must be None, a path or a string"):
        loading.resolve(3)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(keras_vit.CheckpointError, match="Unknown checkpoint format of the folder"):
        loading.resolve(empty)


def test_constructor_refuses_another_architecture(saved):
    with pytest.raises(ValueError, match="different architecture.*ViTTi16.*load_checkpoint"):
        keras_vit.ViTTi16(weights=saved["root"] / "model.npz")


def test_hybrid_keras_preset_round_trip(tmp_path, build_counter):
    model = randomize(VisionTransformer(**TINY_HYBRID, classifier_activation=None), seed=4)
    keras_vit.save_preset(model, tmp_path / "hybrid")
    x = np.random.default_rng(1).uniform(-1, 1, (1, 64, 64, 3)).astype("float32")
    build_counter.update(builds=0, random=0)
    loaded = keras_vit.load_checkpoint(tmp_path / "hybrid")
    assert build_counter == {"builds": 1, "random": 0}
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), rtol=1e-5, atol=1e-5)


def test_the_registry_declares_every_format():
    from keras_vit.checkpoints import registry

    table = registry.formats()
    # axial_deeplab before npz: npz takes any zip, and a PyTorch zip file may carry any name.
    assert list(table) == ["keras_preset", "keras", "keras_weights", "timm_bit", "bit_npz", "timm_efficientnet", "timm",
                           "transformers", "axial_deeplab", "big_vision", "npz"]
    assert table["timm"].resize_rule == "bicubic_antialias" and table["npz"].resize_rule == "original"
    assert table["big_vision"].resize_rule == "original"  # big_vision's resample_posemb: ndimage.zoom order=1
    assert table["npz"].write is keras_vit.write_npz
    patterns = registry.hub_file_patterns()
    assert {"*.safetensors", "*.npz", "model.weights.h5", "*.keras", "*.json"} <= set(patterns)
    assert not any(p.endswith((".bin", ".msgpack", ".pt")) for p in patterns)


_COMPILE_CACHE = """
import os, jax, keras_vit
user_dir = os.environ.get("USER_XLA_DIR")
if user_dir:
    jax.config.update("jax_compilation_cache_dir", user_dir)
keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=24, num_layers=1, num_heads=3, mlp_dim=48)
print("DIR", jax.config.jax_compilation_cache_dir)
"""


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX's persistent compilation cache")
@pytest.mark.parametrize("setting", ["default", "off", "user"])
def test_jax_compilation_cache_is_turned_on_unless_configured_or_refused(tmp_path, setting):
    from conftest import run_python

    env = {"KERAS_VIT_CACHE": str(tmp_path / "kv")}
    if setting == "off":
        env["KERAS_VIT_COMPILATION_CACHE"] = "0"
    if setting == "user":
        env["USER_XLA_DIR"] = str(tmp_path / "mine")
    line = [ln for ln in run_python(_COMPILE_CACHE, env).splitlines() if ln.startswith("DIR")][0]
    expected = {"default": str(tmp_path / "kv" / "xla"), "off": "None", "user": str(tmp_path / "mine")}[setting]
    assert line == f"DIR {expected}"
    assert (tmp_path / "kv" / "xla").is_dir() == (setting == "default")


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's default of XLA for predict")
def test_tensorflow_on_cpu_starts_without_xla_until_compiled():
    model = keras_vit.VisionTransformer(**TINY, classifier_activation=None)
    assert model.jit_compile is False  # Keras alone would pick XLA ("auto" -> True)
    x = np.random.default_rng(0).uniform(-1, 1, (2, 32, 32, 3)).astype("float32")
    eager_graph = model.predict(x, verbose=0)
    model.compile(jit_compile=True)
    assert model.jit_compile is True
    np.testing.assert_allclose(model.predict(x, verbose=0), eager_graph, rtol=1e-5, atol=1e-6)
