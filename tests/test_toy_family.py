"""Adding a family is its model file, its family file and its reader modules: a test-only toy
family (a two-conv CNN, its frozen config class, its `ModelFamily` record and a reader of its own
PyTorch-layout files), all defined in this module and registered from it, works through the
shared code with no edit of it: `family_of`, the config round trip, `.keras` files and preset
folders, the loading path and the constructors' factory, presets and `loading.describe`, FLOPs,
`feature_info` / `feature_extractor`, `training.for_finetuning` with the family's transfer rule,
and few-shot features. Outputs are checked against a NumPy forward pass of the reader's file."""

import dataclasses
import json
import os
from typing import ClassVar

import keras
import numpy as np
import pytest

from keras_vit import loading, presets, training
from keras_vit.applications import build_application
from keras_vit.checkpoints import registry
from keras_vit.checkpoints.keras_format import save_preset
from keras_vit.errors import CheckpointError
from keras_vit.flops import flops
from keras_vit.geometry import as_pair
from keras_vit.layers.heads import pooled_classifier
from keras_vit.models import family as family_module
from keras_vit.models.config import FieldGroupConfig, config_field
from keras_vit.models.config_model import ConfigModel, config_from_arguments, expose_config_fields
from keras_vit.models.features import FeatureEndpoint, FeatureMaps
from keras_vit.models.family import ModelFamily, families, family_of, get_family
from keras_vit.models.transfer import Transfer
from keras_vit.storage.lazy import LazyArray

# === The family file: config, architecture table, record (no Keras needed) ===


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToyConfig(FieldGroupConfig):
    family: ClassVar[str] = "toy"

    image_size: tuple = config_field("architecture", (32, 32))
    toy_width: int = config_field("architecture", 4)
    classes: int = config_field("architecture", 1000)
    num_channels: int = config_field("architecture", 3)
    dropout_rate: float = config_field("training", 0.0)
    include_top: bool = config_field("head", True)
    pooling: str = config_field("head", None)
    classifier_activation: object = config_field("head", "softmax")

    def __post_init__(self):
        size = as_pair(self.image_size)
        if any(s % 4 for s in size):
            raise ValueError(f"A toy net's image_size must be a multiple of 4 (two stride-2 convs); got {size}.")
        object.__setattr__(self, "image_size", size)
        if isinstance(self.toy_width, bool) or not isinstance(self.toy_width, int) or self.toy_width < 1:
            raise ValueError(f"toy_width must be a positive int; got {self.toy_width!r}.")

    def to_dict(self):
        return {**{f: getattr(self, f) for f in self.fields()}, "image_size": list(self.image_size)}


@dataclasses.dataclass(frozen=True)
class ToyArchitecture:
    name: str
    paper_name: str
    toy_width: int
    stride = 4

    def kwargs(self):
        return {"toy_width": self.toy_width}


def toy_flops(config, image_size, classes):
    """2 per multiply-add of the two 2x2 stride-2 convolutions and the head."""
    get = config.get if isinstance(config, dict) else (lambda k, d=None: getattr(config, k, d))
    h, w = as_pair(image_size if image_size is not None else get("image_size"))
    width, channels = get("toy_width"), get("num_channels", 3)
    classes = get("classes", 1000) if classes is None else classes
    return 2 * ((h // 2) * (w // 2) * 4 * channels * width + (h // 4) * (w // 4) * 4 * width * 2 * width
                + 2 * width * (classes or 0))


def toy_settings(source_config):
    """The toy rule: fine-tune with half the pretrained model's dropout."""
    return {"dropout_rate": source_config.get("dropout_rate", 0.0) / 2}


def toy_resolution(config, data_size):
    """The toy rule: fine-tune at twice the data's side."""
    return None if data_size is None else (2 * data_size[0], 2 * data_size[1])


TOY = ModelFamily(
    name="toy",
    title="Toy CNN",
    model=f"{__name__}:ToyNet",
    config_class=ToyConfig,
    architectures={"ToyNetS": ToyArchitecture("ToyNetS", "Toy-S", 4)},
    signature=("toy_width",),
    flops=toy_flops,
    presets=(("ToyNetS", "toy_in1k", 32, 1000, 12.5, "keras-vit-tests/toynet_s.toy_in1k", None, "keras"),),
    head="fc/",
    optional_weights=("fc/",),
    resizable_weights=("fc/",),
    features_pooling="avg",
    dynamic_size=None,
    describe=lambda config: f"Toy CNN of width {config['toy_width']}",
    transfer=Transfer(settings=toy_settings, options=("dropout_rate",), resolution=toy_resolution,
                      features=("pool",)),
)

# === The model file ===


@keras.saving.register_keras_serializable(package="keras_vit_tests")
class ToyNet(ConfigModel, FeatureMaps, keras.Model):
    """Two 2x2 stride-2 convolutions with ReLU, then the shared tail: global average pooling,
    dropout and a linear head (or pooled features)."""

    def __init__(self, config=None, /, *, name=None, dtype=None, trainable=True, **kwargs):
        config = config_from_arguments(ToyConfig, config, kwargs, "ToyNet")
        width = config.toy_width
        images = keras.Input((*config.image_size, config.num_channels), name="images")
        x = keras.layers.Conv2D(width, 2, strides=2, dtype=dtype, name="stem")(images)
        x = keras.layers.ReLU(name="stem_relu")(x)
        x = keras.layers.Conv2D(2 * width, 2, strides=2, dtype=dtype, name="stage")(x)
        x = keras.layers.ReLU(name="stage_relu")(x)
        x = pooled_classifier(x, config, dtype, pool="pool", head=lambda x: keras.layers.Dense(
            config.classes, dtype=dtype, name="fc")(keras.layers.Dropout(config.dropout_rate, name="dropout")(x)))
        super().__init__(inputs=images, outputs=x, name=name or "toynet", trainable=trainable)
        self._keep_config(config)

    def _feature_endpoints(self):
        return [FeatureEndpoint("stem_relu", 2), FeatureEndpoint("stage_relu", 4)]

    def _final_feature_layer(self):
        return "stage_relu"


expose_config_fields(ToyNet, ToyConfig)  # model.image_size, model.dropout_rate, ...


# === Its reader module: PyTorch-layout files (a toy.json and a toy.npz in a folder) ===


def _detect_toy(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, "toy.json"))


def read_toy(path):
    """(canonical tree, checkpoint config) of a toy folder: PyTorch layouts to Keras'. The config
    names no family: its `toy_width` key (the record's signature) tells it."""
    with open(os.path.join(path, "toy.json")) as f:
        meta = json.load(f)
    arrays = np.load(os.path.join(path, "toy.npz"))

    def conv(key):  # (out, in, kh, kw) -> (kh, kw, in, out), read when assigned
        out, inp, kh, kw = arrays[key].shape
        return LazyArray(lambda: arrays[key].transpose(2, 3, 1, 0), (kh, kw, inp, out))

    tree = {"stem/kernel": conv("stem.weight"), "stem/bias": arrays["stem.bias"],
            "stage/kernel": conv("stage.weight"), "stage/bias": arrays["stage.bias"]}
    if "fc.weight" in arrays:
        tree.update({"fc/kernel": arrays["fc.weight"].T, "fc/bias": arrays["fc.bias"]})
    config = {"image_size": tuple(meta["image_size"]), "toy_width": meta["width"], "num_channels": 3,
              "classes": meta.get("classes")}
    return tree, config


TOY_FORMAT = registry.CheckpointFormat(name="toy", description="a toy folder (toy.json + toy.npz)",
                                       detect=_detect_toy, read=read_toy)

# === The reference: a NumPy forward pass of the PyTorch-layout weights ===


def _conv2x2(x, weight, bias):
    """A 2x2 stride-2 convolution of NHWC `x` with a PyTorch (out, in, 2, 2) weight."""
    n, h, w, c = x.shape
    patches = x.reshape(n, h // 2, 2, w // 2, 2, c)
    return np.einsum("nipjqc,ocpq->nijo", patches, weight) + bias


def reference(arrays, images):
    """(stem map, stage map, logits) of the toy net, in float64."""
    stem = np.maximum(_conv2x2(images.astype(np.float64), arrays["stem.weight"], arrays["stem.bias"]), 0)
    stage = np.maximum(_conv2x2(stem, arrays["stage.weight"], arrays["stage.bias"]), 0)
    logits = stage.mean(axis=(1, 2)) @ arrays["fc.weight"].T + arrays["fc.bias"]
    return stem, stage, logits


WIDTH, CLASSES, SIZE = 4, 5, 16


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """The toy family and its reader registered for this module; removed after it, so other tests
    see the real registries."""
    before = families()
    family_module.register_family(TOY)
    registry.register_format(TOY_FORMAT, before="npz")
    folder = tmp_path_factory.mktemp("toy") / "toy_checkpoint"
    folder.mkdir()
    rng = np.random.default_rng(0)
    arrays = {"stem.weight": rng.normal(size=(WIDTH, 3, 2, 2)), "stem.bias": rng.normal(size=WIDTH),
              "stage.weight": rng.normal(size=(2 * WIDTH, WIDTH, 2, 2)) / 4, "stage.bias": rng.normal(size=2 * WIDTH),
              "fc.weight": rng.normal(size=(CLASSES, 2 * WIDTH)), "fc.bias": rng.normal(size=CLASSES)}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    np.savez(folder / "toy.npz", **arrays)
    (folder / "toy.json").write_text(json.dumps({"image_size": [SIZE, SIZE], "width": WIDTH, "classes": CLASSES}))
    images = rng.uniform(-1, 1, size=(2, SIZE, SIZE, 3)).astype(np.float32)
    try:
        yield dict(folder=str(folder), arrays=arrays, images=images)
    finally:
        registry.unregister_format("toy")
        family_module.unregister_family("toy")
        assert families() == before and "toy" not in registry.formats()
        import keras_vit

        with pytest.raises(AttributeError, match="has no attribute 'ToyNetS'"):
            keras_vit.ToyNetS
        assert not [p for p in presets.PRESETS.values() if p.architecture == "ToyNetS"]


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x), np.float64)


def test_the_reader_loads_through_the_one_loading_path(toy):
    assert registry.detect_format(toy["folder"]) is TOY_FORMAT
    model = loading.load_checkpoint(toy["folder"], classifier_activation=None)
    assert isinstance(model, ToyNet) and family_of(model) is TOY
    _, _, logits = reference(toy["arrays"], toy["images"])
    np.testing.assert_allclose(_numpy(model(toy["images"])), logits, rtol=1e-5, atol=1e-5)
    # The constructors' factory (what keras_vit.ToyNetS would be) checks the file's architecture.
    built = build_application("ToyNetS", weights=toy["folder"], input_shape=(SIZE, SIZE, 3), classes=CLASSES,
                              classifier_activation=None)
    np.testing.assert_allclose(_numpy(built(toy["images"])), logits, rtol=1e-5, atol=1e-5)
    # keras_vit.<Name> finds a family registered after keras_vit was imported: its constructor and class.
    import keras_vit

    assert keras_vit.ToyNet is ToyNet and keras_vit.ToyNetS.__name__ == "ToyNetS"
    attribute = keras_vit.ToyNetS(weights=toy["folder"], input_shape=(SIZE, SIZE, 3), classes=CLASSES,
                                  classifier_activation=None)
    np.testing.assert_allclose(_numpy(attribute(toy["images"])), logits, rtol=1e-5, atol=1e-5)
    # Another class count: a fresh zero head (the head prefix is the record's `fc/`).
    with pytest.warns(UserWarning, match="fresh zero-initialised 3-class head"):
        fresh = loading.load_checkpoint(toy["folder"], classes=3, classifier_activation=None)
    np.testing.assert_array_equal(_numpy(fresh(toy["images"])), 0.0)
    # Headless: the pooled features.
    _, stage, _ = reference(toy["arrays"], toy["images"])
    headless = loading.load(toy["folder"], include_top=False, pooling="avg")
    np.testing.assert_allclose(_numpy(headless(toy["images"])), stage.mean(axis=(1, 2)), rtol=1e-5, atol=1e-5)
    # The shared tail's other poolings (`layers.heads.pooled_classifier`): the max, and none (the map).
    headless = loading.load(toy["folder"], include_top=False, pooling="max")
    np.testing.assert_allclose(_numpy(headless(toy["images"])), stage.max(axis=(1, 2)), rtol=1e-5, atol=1e-5)
    headless = loading.load(toy["folder"], include_top=False)
    np.testing.assert_allclose(_numpy(headless(toy["images"])), stage, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"different architecture \(Toy CNN of width 8\) than ToyNetS \(Toy CNN of "
                                         r"width 4\)"):
        loading.check_architecture(TOY.architectures["ToyNetS"], {"toy_width": 8, "image_size": (16, 16)}, "x")


def test_family_of_every_form_and_the_config_round_trip(toy):
    model = loading.load_checkpoint(toy["folder"])
    config = model.get_config()
    assert config["family"] == "toy" and config["toy_width"] == WIDTH
    for form in (model, config, {"class_name": "ToyNet", "config": config}, model.config, ToyNet, ToyConfig,
                 TOY.architectures["ToyNetS"], "ToyNetS", "ToyNet", "toy", {"toy_width": 2}):
        assert family_of(form) is TOY, form
    assert get_family("toy") is TOY and family_module.get_architecture("ToyNetS").toy_width == WIDTH
    # The constructor that stands for it (none named: its first); the default family stays the first registered.
    assert TOY.default_constructor() == "ToyNetS" and family_module.default_family().name == "vit"
    # A keras.Model wrapping one belongs to it too; the other families stay theirs.
    assert family_of(keras.Model(model.inputs, model(model.inputs[0]))) is TOY
    assert family_of({"patch_size": 8, "hidden_size": 8}).name == "vit" and family_of("ViTB16").name == "vit"
    rebuilt = ToyNet.from_config(config)
    assert rebuilt.get_config() == config
    # What a saved file's config says (the checkpoint config) rebuilds the same model.
    again = TOY.build(**TOY.model_kwargs(TOY.checkpoint_config(config)), classifier_activation=None)
    assert {k: v for k, v in again.get_config().items() if k != "name"} == {k: v for k, v in config.items()
                                                                             if k != "name"}
    # A callable activation is kept by its Keras name, so the config stays JSON (a .keras file).
    relu = ToyNet(image_size=8, toy_width=2, classes=3, classifier_activation=keras.activations.relu)
    assert relu.get_config()["classifier_activation"] == "relu" and json.dumps(relu.get_config())
    with pytest.raises(ValueError, match="builds 'toy' models; the config names family 'vit'"):
        ToyNet({**config, "family": "vit"})


def test_keras_file_and_preset_folder_round_trip(toy, tmp_path):
    model = loading.load_checkpoint(toy["folder"], classifier_activation=None)
    expected = _numpy(model(toy["images"]))
    model.save(tmp_path / "toy.keras")
    for loaded in (keras.saving.load_model(tmp_path / "toy.keras"), loading.load_checkpoint(tmp_path / "toy.keras")):
        assert isinstance(loaded, ToyNet) and loaded.config == model.config
        np.testing.assert_allclose(_numpy(loaded(toy["images"])), expected, rtol=1e-6, atol=1e-6)
    save_preset(model, tmp_path / "preset")
    card = (tmp_path / "preset" / "README.md").read_text()
    assert "Toy CNN weights for keras_vit." in card and "Toy CNN of width 4" in card  # the record's default card
    np.testing.assert_allclose(_numpy(loading.load_checkpoint(tmp_path / "preset")(toy["images"])), expected,
                               rtol=1e-6, atol=1e-6)
    # A config.json claiming a model too big for its weights file would be refused by the record's
    # lower bound; this record states none, and the file is checked against the config instead.
    config = json.loads((tmp_path / "preset" / "config.json").read_text())
    (tmp_path / "preset" / "config.json").write_text(json.dumps({**config, "toy_width": 8}))
    with pytest.raises(CheckpointError, match="do not fit its config.json"):
        loading.load_checkpoint(tmp_path / "preset")


def test_presets_describe_and_flops_ask_the_record(toy):
    (row,) = presets.list_presets("ToyNetS")
    assert presets.PRESETS[row.repo] is row  # the table is current however keras_vit was imported
    assert (row.tag, row.resolution, row.repo, row.source) == ("toy_in1k", 32, "keras-vit-tests/toynet_s.toy_in1k",
                                                                "keras")
    for name, kw in (("ToyNetS.toy_in1k", {}), ("toy_in1k", {"architecture": "ToyNetS"}),
                     ("imagenet", {"architecture": "ToyNetS"}), ("toynet_s.toy_in1k", {})):
        described = loading.describe(name, **kw)
        assert described.kind == "preset" and described.preset is row, name
    with pytest.raises(ValueError, match="Unknown weights 'toy_in21k' for ToyNetS.*Did you mean 'toy_in1k'"):
        loading.describe("ToyNetS.toy_in21k")
    # FLOPs by hand, at 32 px: 16x16x4 stem outputs of 2x2x3 multiply-adds, 8x8x8 stage outputs of
    # 2x2x4, a 1000-class head on 8 features; the model's own size (16 px) and classes (5).
    assert flops("ToyNetS", image_size=32) == 2 * (16 * 16 * 4 * 12 + 8 * 8 * 8 * 16 + 8 * 1000)
    model = loading.load_checkpoint(toy["folder"])
    assert flops(model) == 2 * (8 * 8 * 4 * 12 + 4 * 4 * 8 * 16 + 8 * CLASSES)


def test_features_and_fewshot_features(toy):
    model = loading.load_checkpoint(toy["folder"])
    assert model.feature_info == [dict(index=0, layer="stem_relu", channels=WIDTH, reduction=2),
                                  dict(index=1, layer="stage_relu", channels=2 * WIDTH, reduction=4)]
    stem, stage, _ = reference(toy["arrays"], toy["images"])
    maps = model.feature_extractor()(toy["images"])
    np.testing.assert_allclose(_numpy(maps[0]), stem, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_numpy(maps[1]), stage, rtol=1e-5, atol=1e-5)
    # Few-shot features: the record's feature layer ("pool"), the pooled stage map.
    features = training.extract_features(model, toy["images"], batch_size=2)
    np.testing.assert_allclose(features, stage.mean(axis=(1, 2)), rtol=1e-5, atol=1e-5)


def test_for_finetuning_follows_the_records_transfer_rule(toy):
    model = loading.load_checkpoint(toy["folder"], dropout_rate=0.3)
    assert model.dropout_rate == 0.3
    tuned = training.for_finetuning(model, image_size=24, classes=2, classifier_activation=None)
    # The record's settings (half the dropout), the new size and class count, a zero head, the weights kept.
    assert isinstance(tuned, ToyNet) and tuned.dropout_rate == 0.15
    assert tuned.image_size == (24, 24) and tuned.output_shape == (None, 2)
    np.testing.assert_array_equal(_numpy(tuned.get_layer("fc").kernel), 0.0)
    np.testing.assert_array_equal(_numpy(tuned.get_layer("stem").kernel),
                                  toy["arrays"]["stem.weight"].transpose(2, 3, 1, 0))
    assert training.for_finetuning(model, classes=2, dropout_rate=0.1).dropout_rate == 0.1  # one of its options
    with pytest.raises(ValueError, match=r"Toy CNN models have no drop_path_rate to set .*they take: dropout_rate"):
        training.for_finetuning(model, classes=2, drop_path_rate=0.1)
    # From the weights source itself, and the family's default resolution for the task's images.
    assert training.for_finetuning(toy["folder"], classes=2).image_size == (SIZE, SIZE)
    assert TOY.transfer.default_resolution(model.get_config(), (20, 12)) == (40, 24)


def test_registration_refuses_clashes_and_keeps_keras_vits_own(toy):
    clash = dataclasses.replace(TOY, name="toy2", model=f"{__name__}:ToyNet2",
                                architectures={"ViTB16": ToyArchitecture("ViTB16", "Toy-B", 8)})
    with pytest.raises(ValueError, match="clashes with the registered Vision Transformer family: both name ViTB16"):
        family_module.register_family(clash)
    with pytest.raises(ValueError, match="'vit' is a family of keras_vit's REGISTRY"):
        family_module.unregister_family("vit")
    with pytest.raises(ValueError, match="checkpoint format 'toy' is registered already"):
        registry.register_format(TOY_FORMAT)
    with pytest.raises(ValueError, match="No checkpoint format 'npz' was added with register_format"):
        registry.unregister_format("npz")
    assert family_of("ViTB16").name == "vit" and "npz" in registry.formats()
