"""keras_vit.evaluation and `keras-vit evaluate` / `keras-vit report`: top-1 / top-5 / per-class
accuracy, ImageNet ReaL, ImageNet-V2 and ObjectNet by their protocols, on hand-made data with
known answers (tfds' mock data for the tfds datasets, an ObjectNet folder written here)."""

import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from PIL import Image

import keras_vit
from keras_vit import evaluation
from keras_vit.cli import main
from keras_vit.data import get_tfds_source

IMAGE = 16


def colour_classifier(centres, classes=1000):
    """A Keras classifier whose ImageNet class is read off the mean red value of the image:
    `centres` maps class -> red pixel value (0-255); the class whose value is nearest wins,
    the others rank by distance; classes without a centre score far below."""
    inputs = keras.Input((IMAGE, IMAGE, 3))
    x = keras.layers.GlobalAveragePooling2D()(inputs)
    head = keras.layers.Dense(classes)
    outputs = head(x)
    model = keras.Model(inputs, outputs)
    kernel = np.zeros((3, classes), np.float32)
    bias = np.full((classes,), -1e4, np.float32)
    for cls, pixel in centres.items():
        a = pixel / 127.5 - 1.0  # the pipeline's [-1, 1] scaling
        kernel[0, cls] = 2 * a  # -(v - a)^2 = 2 a v - a^2 - v^2, and v^2 is common to all classes
        bias[cls] = -a * a
    head.set_weights([kernel, bias])
    return model


def uniform_image(red, size=6):
    image = np.zeros((size, size, 3), np.uint8)
    image[..., 0] = red
    return image


# === Metrics on arrays (answers worked out by hand) ===


def test_top_k_and_per_class_known_answer():
    scores = np.array([
        [0.1, 0.6, 0.3, 0.0],  # label 1: top-1 right
        [0.5, 0.1, 0.4, 0.0],  # label 2: second -> top-2 right
        [0.4, 0.3, 0.2, 0.1],  # label 3: last -> wrong at top-2
        [0.7, 0.1, 0.1, 0.1],  # label 0: right
    ])
    labels = np.array([1, 2, 3, 0])
    m = evaluation.ClassificationMetrics(4, top_k=2)
    m.update(scores[:2], labels[:2])
    m.update(scores[2:], labels[2:])
    r = m.result()
    assert r["top1"] == 0.5 and r["top2"] == 0.75 and r["examples"] == 4
    assert r["loss"] == pytest.approx(-np.mean(np.log([0.6, 0.4, 0.1, 0.7])))
    rows = m.per_class(["a", "b", "c", "d"])
    assert [(row["class"], row["examples"], row["accuracy"]) for row in rows] == [
        ("a", 1, 1.0), ("b", 1, 1.0), ("c", 1, 0.0), ("d", 1, 0.0)]
    assert r["mean_per_class_accuracy"] == 0.5
    # Logits are turned into probabilities for the loss.
    logits = np.log(np.array([[0.2, 0.8]]))
    m2 = evaluation.ClassificationMetrics(2)
    m2.update(logits, np.array([1]))
    assert m2.result()["loss"] == pytest.approx(-np.log(0.8)) and m2.result()["top5"] == 1.0


def test_real_top1_known_answer():
    # Top-1 predictions 2, 0, 1, 3, 1 (5 classes).
    scores = np.eye(5)[[2, 0, 1, 3, 1]]
    original = np.array([2, 1, 1, 3, 4])
    real = [[2], [0, 1], [4], [], []]  # image 1 right only under ReaL, image 2 only originally, 3-4 unlabelled
    m = evaluation.ClassificationMetrics(5, real=True)
    m.update(scores, original, real=real)
    r = m.result()
    assert r["top1"] == 3 / 5
    assert r["real_examples"] == 3 and r["real_top1"] == 2 / 3
    counted, correct = evaluation.real_top1_correct(scores, real)
    assert counted.tolist() == [True, True, True, False, False]
    assert correct.tolist() == [True, True, False, False, False]
    # A 0/1 matrix is the same as the lists.
    matrix = np.zeros((5, 5), np.uint8)
    for i, labels in enumerate(real):
        matrix[i, labels] = 1
    assert evaluation.real_top1_correct(scores, matrix)[1].tolist() == correct.tolist()


def test_metrics_edge_rules_against_numpy():
    """The rules a plain known answer does not reach, each against NumPy written here: padded
    ReaL label lists (-1 is padding, not the last class), non-negative logits whose rows do not
    sum to one (a softmax for the loss, not probabilities), and the mean per-class accuracy over
    the classes that have examples only."""
    scores = np.eye(4)[[3, 0, 1]]  # top-1: 3, 0, 1
    counted, correct = evaluation.real_top1_correct(scores, [[2, -1], [0, -1], [-1, -1]])
    assert counted.tolist() == [True, True, False] and correct.tolist() == [False, True, False]
    logits = np.array([[1.0, 3.0, 0.5], [2.0, 0.0, 0.25]])  # non-negative, rows sum to 4.5 and 2.25
    labels = np.array([1, 2])
    m = evaluation.ClassificationMetrics(3)
    m.update(logits, labels)
    shifted = np.exp(logits - logits.max(1, keepdims=True))
    probabilities = shifted / shifted.sum(1, keepdims=True)
    assert m.result()["loss"] == pytest.approx(-np.mean(np.log(probabilities[[0, 1], labels])), rel=1e-12)
    # 5 classes, examples of classes 0, 1 and 4 only: accuracies 1/2, 1, 0 -> mean 1/2.
    m = evaluation.ClassificationMetrics(5)
    m.update(np.eye(5)[[0, 2, 1, 0]], np.array([0, 0, 1, 4]))
    assert m.result()["mean_per_class_accuracy"] == pytest.approx(np.mean([1 / 2, 1.0, 0.0]))
    assert m.result()["top1"] == pytest.approx(2 / 4)


def test_objectnet_mapping_shipped():
    names, members = evaluation.load_mapping()
    assert len(names) == 113 and len(set(names)) == 113
    flat = [i for m in members for i in m]
    assert len(flat) == len(set(flat)) == 125 and all(0 <= i < 1000 for i in flat)
    by_name = dict(zip(names, members))
    assert by_name["Alarm clock"] == (409, 530)  # analog clock, digital clock
    assert by_name["Banana"] == (954,) and by_name["Bicycle"] == (444, 671)
    assert by_name["Pen"] == (418, 563, 749) and by_name["Skirt"] == (601, 655, 689)
    # Scores: the best of each class's ImageNet scores; other ImageNet classes take no part.
    scores = np.zeros((1, 1000))
    scores[0, [0, 530, 954]] = [5.0, 3.0, 1.0]
    mapped = evaluation.objectnet_scores(scores)
    assert mapped.shape == (1, 113)
    assert mapped[0, names.index("Alarm clock")] == 3.0 and mapped[0, names.index("Banana")] == 1.0
    with pytest.raises(ValueError, match="1000"):
        evaluation.objectnet_scores(np.zeros((1, 21843)))


# === ObjectNet: the shipped mapping against the published one ===

PUBLISHED = os.path.join(os.path.dirname(__file__), "objectnet_published")


def _published_mapping():
    """{class: (folder, ImageNet-1k indices)} from ObjectNet's released mapping files
    (objectnet-1.0/mappings/, copied in tests/objectnet_published from mlfoundations/wise-ft),
    ImageNet class names looked up in the ILSVRC-2012 synset list shipped with the package."""
    with open(os.path.join(PUBLISHED, "objectnet_to_imagenet_1k.json")) as f:
        to_imagenet = json.load(f)
    with open(os.path.join(PUBLISHED, "folder_to_objectnet_label.json")) as f:
        folder_of = {label: folder for folder, label in json.load(f).items()}
    resources = os.path.join(os.path.dirname(keras_vit.__file__), "resources")
    with open(os.path.join(resources, "imagenet1k_classes.txt")) as f:
        imagenet_names = [line.rstrip("\n").split("\t", 1)[1] for line in f]
    published = {}
    for name, imagenet in to_imagenet.items():
        ids = [i for part in imagenet.split("; ") for i, n in enumerate(imagenet_names) if n == part]
        assert len(ids) == len(imagenet.split("; ")), name  # every name is one ImageNet class
        published[name] = (folder_of[name], tuple(sorted(ids)))
    return published


def test_objectnet_mapping_matches_published():
    published = _published_mapping()
    names, members = evaluation.load_mapping()
    shipped = {n: (f, tuple(sorted(m))) for n, f, m in zip(names, evaluation.load_folders(), members)}
    assert shipped == published
    assert sum(f != n.lower().replace(" ", "_") for n, (f, _) in published.items()) >= 3


def test_objectnet_top1_is_the_testbed_rule():
    """Top-1 of objectnet_scores equals imagenet-testbed's rule, written out here from the
    published files: argmax over the 1000-way scores restricted to the mapped ImageNet classes,
    right when it is one of the image's class's ImageNet classes."""
    published = _published_mapping()
    names, _ = evaluation.load_mapping()
    sublist = sorted(i for _, ids in published.values() for i in ids)
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(400, 1000))
    labels = rng.integers(0, len(names), size=400)
    testbed = [sublist[int(np.argmax(s[sublist]))] in published[names[y]][1] for s, y in zip(scores, labels)]
    ours = evaluation.objectnet_scores(scores).argmax(1) == labels
    assert ours.tolist() == testbed and 0 < sum(testbed) < 400


# === ObjectNet: a hand-made download ===

OBJECTNET_CENTRES = {0: 100, 954: 110, 409: 120, 530: 130, 671: 140, 444: 150,
                     414: 160, 419: 170, 790: 180, 434: 190, 440: 200}


def _objectnet_folder(root):
    """images/<folder>/ with 8x8 PNGs: a 2-pixel red border (ObjectNet's, cropped as its
    evaluation template does) around a uniform 4x4 interior."""
    images = {  # folder: interior red values
        "banana": [100, 138, 200],  # unmapped tench first, then banana | banana 4th | banana 6th
        "alarm_clock": [128],  # digital clock (one of the class's two ImageNet classes)
        "bicycle": [118],  # analog clock, banana, digital clock, mountain bike: top-5 only
        "full_sized_towel": [190],  # Bath towel's folder (not its class name): right
        "air_freshener": [110],  # not one of the 113 classes: skipped
    }
    for folder, values in images.items():
        os.makedirs(root / "images" / folder)
        for i, value in enumerate(values):
            image = uniform_image(value, size=8)
            image[:2, :], image[-2:, :], image[:, :2], image[:, -2:] = (255, 0, 0), (255, 0, 0), (255, 0, 0), (255, 0, 0)
            Image.fromarray(image).save(root / "images" / folder / f"{i}.png")
    return root


def test_objectnet_protocol_known_answer(tmp_path):
    root = _objectnet_folder(tmp_path / "objectnet-1.0")
    paths, labels, found = evaluation.index_objectnet_folder(root)
    assert sorted(found) == ["Alarm clock", "Banana", "Bath towel", "Bicycle"] and len(paths) == 6
    model = colour_classifier(OBJECTNET_CENTRES)
    result = evaluation.evaluate_classifier(model, f"objectnet:{root}", verbose=0)
    # Right at top-1: banana (tench is not an ObjectNet class), alarm clock (digital clock), bath towel.
    # Top-5 only: bicycle (3rd), banana at 138 (4th). Wrong: banana at 200 (6th).
    assert result.metrics["examples"] == 6
    assert result.metrics["top1"] == pytest.approx(3 / 6) and result.metrics["top5"] == pytest.approx(5 / 6)
    assert result.metrics["protocol"] == "objectnet" and result.metrics["classes_found"] == 4
    per_class = {r["class"]: (r["examples"], r["correct"]) for r in result.per_class}
    assert per_class == {"Alarm clock": (1, 1), "Banana": (3, 1), "Bath towel": (1, 1), "Bicycle": (1, 0)}


def test_objectnet_errors(tmp_path):
    (tmp_path / "images" / "foo").mkdir(parents=True)
    with pytest.raises(ValueError, match="none of ObjectNet's 113 classes"):
        evaluation.index_objectnet_folder(tmp_path)
    with pytest.raises(FileNotFoundError, match="objectnet.dev"):
        evaluation.index_objectnet_folder(tmp_path / "missing")


def test_objectnet_files_that_are_not_images(tmp_path):
    """A file named .png that is no image is left out with a counted warning (or refused with
    on_bad_file="error"); an image cut short is an error that names it, not TensorFlow's."""
    root = _objectnet_folder(tmp_path / "objectnet-1.0")
    (root / "images" / "banana" / "notes.png").write_text("not an image\n")
    with pytest.warns(UserWarning, match=r"1 of 7 image files .* not PNG, JPEG, GIF or BMP images \(banana/notes.png"):
        paths, _, _ = evaluation.index_objectnet_folder(root)
    assert len(paths) == 6 and not any(p.endswith("notes.png") for p in paths)
    with pytest.raises(ValueError, match=r"banana/notes.png.*--on-bad-file skip"):
        evaluation.index_objectnet_folder(root, on_bad_file="error")
    model = colour_classifier(OBJECTNET_CENTRES)
    with pytest.warns(UserWarning, match="Left them out"):
        result = evaluation.evaluate_classifier(model, f"objectnet:{root}", verbose=0)
    assert result.metrics["examples"] == 6 and result.metrics["top1"] == pytest.approx(3 / 6)  # as without the file
    os.remove(root / "images" / "banana" / "notes.png")
    cut = root / "images" / "bicycle" / "0.png"
    cut.write_bytes(cut.read_bytes()[:40])  # a PNG's start, then nothing
    with pytest.raises(ValueError, match=r"Cannot decode the image .*bicycle/0.png"):
        evaluation.evaluate_classifier(model, f"objectnet:{root}", batch_size=2, verbose=0)


def test_objectnet_command_warns_in_one_line_and_names_the_bad_image(vit_409, tmp_path, capsys, monkeypatch):
    """The skipped file is one warning line; an image too small for the border crop (3x3, which
    Pillow decodes) is an error naming that file only, not its neighbours."""
    import warnings

    import sys

    # Printed to stderr as Python does outside pytest (which records them instead).
    monkeypatch.setattr(warnings, "_showwarnmsg_impl", lambda message: sys.stderr.write(warnings._formatwarnmsg(message)))
    root = _objectnet_folder(tmp_path / "objectnet-1.0")
    (root / "images" / "banana" / "notes.png").write_text("not an image\n")
    Image.fromarray(np.full((3, 3, 3), 128, np.uint8)).save(root / "images" / "banana" / "grey.png")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["evaluate", "--weights", vit_409, "--data", f"objectnet:{root}", "--batch-size", "2",
                     "--verbose", "0", "--out", str(tmp_path / "o")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0].startswith("keras-vit evaluate: warning: 1 of 8 image files under ") and lines[0].endswith(
        "(banana/notes.png). Left them out."), lines
    grey = str(root / "images" / "banana" / "grey.png")
    assert lines[1:] == [f"keras-vit evaluate: error: The image {grey} is too small for ObjectNet's 2-pixel border "
                         "crop (it needs at least 5x5 pixels): replace it with the download's file, or remove it."]


def test_real_labels_that_do_not_fit():
    scores = np.eye(5)[[2, 0, 1]]
    with pytest.raises(ValueError, match="ReaL labels for 2 images but scores for 3"):
        evaluation.real_top1_correct(scores, [[2], [0]])
    with pytest.raises(ValueError, match=r"ReaL label 7 of image 1 is outside \[0, 5\)"):
        evaluation.real_top1_correct(scores, [[2], [0, 7], []])
    with pytest.raises(ValueError, match="not whole class indices"):
        evaluation.real_top1_correct(scores, [[2], ["n01440764"], []])
    with pytest.raises(ValueError, match="not whole class indices"):
        evaluation.real_top1_correct(scores, [[2.5], [0], []])
    with pytest.raises(ValueError, match=r"bool matrix of shape \(3, 4\)"):
        evaluation.real_top1_correct(scores, np.zeros((3, 4), bool))
    with pytest.raises(ValueError, match="one list of class indices per image"):
        evaluation.real_top1_correct(scores, "2 0 1")
    # Lists padded with -1 in an integer array are still read as label lists.
    counted, correct = evaluation.real_top1_correct(scores, np.array([[2, -1], [1, 3], [-1, -1]]))
    assert counted.tolist() == [True, True, False] and correct.tolist() == [True, False, False]


# === tfds: ReaL and ImageNet-V2 through tfds' mock data ===

REAL_EXAMPLES = [  # (interior red value -> predicted class, original label, ReaL labels)
    (110, 954, [954]),  # right under both
    (130, 409, [530, 409]),  # predicted 530: right only under ReaL
    (140, 671, [444]),  # predicted 671: right only under the original label
    (100, 0, []),  # no ReaL label: not counted for ReaL
    (190, 440, []),  # no ReaL label, wrong originally
]


def _real_as_dataset(self, split, **kwargs):
    def generate():
        for i, (red, label, real) in enumerate(REAL_EXAMPLES):
            yield {"image": uniform_image(red, 8), "original_label": label,
                   "real_label": np.asarray(real, np.int64), "file_name": f"ILSVRC2012_val_{i:08d}.JPEG"}

    return tf.data.Dataset.from_generator(generate, output_signature={
        "image": tf.TensorSpec((None, None, 3), tf.uint8), "original_label": tf.TensorSpec((), tf.int64),
        "real_label": tf.TensorSpec((None,), tf.int64), "file_name": tf.TensorSpec((), tf.string)})


def test_real_protocol_known_answer():
    model = colour_classifier({954: 110, 530: 130, 409: 125, 671: 140, 444: 155, 0: 100, 434: 190, 440: 205})
    with tfds.testing.mock_data(as_dataset_fn=_real_as_dataset, policy=tfds.testing.MockPolicy.USE_CODE):
        result = evaluation.evaluate_classifier(model, "tfds:imagenet2012_real", batch_size=2, verbose=0)
    m = result.metrics
    assert m["examples"] == 5 and m["top1"] == pytest.approx(3 / 5)
    assert m["real_examples"] == 3 and m["real_top1"] == pytest.approx(2 / 3)


def _tiny_vit(classes, predicted=None):
    model = keras_vit.VisionTransformer(image_size=IMAGE, patch_size=8, hidden_size=8, num_layers=1, num_heads=2,
                                        mlp_dim=16, classes=classes, classifier_activation=None)
    if predicted is not None:  # a zero kernel and a bias that makes `predicted` every image's top-1
        kernel, bias = model.get_layer("head").get_weights()
        bias = np.zeros_like(bias)
        bias[predicted] = 1.0
        model.get_layer("head").set_weights([np.zeros_like(kernel), bias])
    return model


@pytest.fixture(scope="module")
def vit_409(tmp_path_factory):
    path = tmp_path_factory.mktemp("w") / "vit409.keras"
    _tiny_vit(1000, predicted=409).save(path)
    return str(path)


def test_evaluate_command_real_metrics_json(vit_409, tmp_path):
    out = tmp_path / "real"
    with tfds.testing.mock_data(as_dataset_fn=_real_as_dataset, policy=tfds.testing.MockPolicy.USE_CODE):
        assert main(["evaluate", "--weights", vit_409, "--data", "tfds:imagenet2012_real", "--batch-size", "4",
                     "--verbose", "0", "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    # Every image is predicted 409: one original label is 409; of the 3 images with ReaL labels one has 409.
    assert metrics["top1"] == pytest.approx(1 / 5) and metrics["real_top1"] == pytest.approx(1 / 3)
    # The other 999 classes tie: classes 0-3 follow 409 in the top 5, so the image labelled 0 counts too.
    assert metrics["top5"] == pytest.approx(2 / 5)
    assert metrics["real_examples"] == 3 and metrics["examples"] == 5 and metrics["ema_weights"] is False
    assert metrics["split"] == "validation"  # the images ReaL labels (--split defaults to test)
    assert {"per_class.csv", "confusion.png", "config.json"} <= set(os.listdir(out))


def test_imagenet_v2_variants(vit_409, tmp_path):
    # tfds' ImageNet-V2 configs (imagenet_v2/matched-frequency is the paper's and tfds' default).
    configs = {"imagenet_v2": "imagenet_v2/matched-frequency", "imagenet_v2/threshold-0.7": "imagenet_v2/threshold-0.7",
               "imagenet_v2/topimages": "imagenet_v2/topimages"}
    assert {name: get_tfds_source(name).builder for name in configs} == configs
    with tfds.testing.mock_data(num_examples=5, policy=tfds.testing.MockPolicy.USE_CODE):
        for data in ("tfds:imagenet_v2", "tfds:imagenet_v2/threshold-0.7"):
            out = tmp_path / data.replace("/", "_").replace(":", "_")
            assert main(["evaluate", "--weights", vit_409, "--data", data, "--verbose", "0", "--out", str(out)]) == 0
            metrics = json.loads((out / "metrics.json").read_text())
            builder = tfds.builder(get_tfds_source(data[5:]).builder)
            labels = [int(ex["label"]) for ex in builder.as_dataset(split="test")]
            assert metrics["examples"] == 5
            assert metrics["top1"] == pytest.approx(np.mean(np.asarray(labels) == 409))


def test_ema_weights_are_evaluated(tmp_path):
    """A .keras file saved with an optimizer that keeps an EMA: the averages are what is evaluated."""
    model = _tiny_vit(10)
    model.compile(optimizer=keras_vit.training.finetune_optimizer(0.5, total_steps=4, warmup_steps=0, use_ema=True),
                  loss=keras_vit.training.classification_loss(model))
    model.optimizer.build(model.trainable_variables)
    rng = np.random.default_rng(0)
    averages = []
    for average in model.optimizer._model_variables_moving_average:  # averages unlike the weights
        value = rng.normal(size=average.shape).astype("float32")
        average.assign(value)
        averages.append(value)
    model.save(tmp_path / "m.keras")
    loaded = evaluation.load_for_evaluation(tmp_path / "m.keras")
    assert loaded is not None
    for variable, average in zip(loaded.trainable_variables, averages):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), average)
    # A file without an optimizer is loaded the ordinary way.
    plain = tmp_path / "plain.keras"
    _tiny_vit(10).save(plain)
    assert evaluation.load_for_evaluation(plain) is None


#: ImageNet-V2 images (red value, label) for the colour classifier of V2_CENTRES: predicted 954,
#: 530, 671, 0, 434, 530, so top-1 hits rows 0, 2, 3, 5 (4 of 6); the label 440 of row 4 (centre
#: 205, second nearest to 190) is in its top 5, the label 409 of row 1 (no centre) is not: top-5 5 of 6.
V2_EXAMPLES = [(110, 954), (131, 409), (140, 671), (100, 0), (190, 440), (130, 530)]
V2_CENTRES = {954: 110, 530: 130, 671: 140, 0: 100, 434: 190, 440: 205}


def _v2_as_dataset(self, split, **kwargs):
    examples = [] if getattr(self, "_empty", False) else V2_EXAMPLES

    def generate():
        for i, (red, label) in enumerate(examples):
            yield {"image": uniform_image(red, 8), "label": label, "file_name": f"{label}/{i}.jpeg"}

    return tf.data.Dataset.from_generator(generate, output_signature={
        "image": tf.TensorSpec((None, None, 3), tf.uint8), "label": tf.TensorSpec((), tf.int64),
        "file_name": tf.TensorSpec((), tf.string)})


def test_imagenet_v2_known_answer():
    """Hits and misses worked out by hand (V2_EXAMPLES), on the default and another tfds config."""
    model = colour_classifier(V2_CENTRES)
    with tfds.testing.mock_data(as_dataset_fn=_v2_as_dataset, policy=tfds.testing.MockPolicy.USE_CODE):
        for data in ("tfds:imagenet_v2", "tfds:imagenet_v2/topimages"):
            m = evaluation.evaluate_classifier(model, data, batch_size=4, verbose=0).metrics
            assert m["examples"] == 6 and m["split"] == "test"
            assert m["top1"] == pytest.approx(4 / 6) and m["top5"] == pytest.approx(5 / 6)


# === Data that cannot give a number ===


def test_metrics_refuse_non_finite_scores_labels_outside_and_no_examples():
    from keras_vit.errors import DataError

    metrics = evaluation.ClassificationMetrics(3)
    metrics.update(np.eye(3), np.arange(3))
    scores = np.array([[0.1, 0.2, 0.3], [np.nan, np.nan, np.nan], [1.0, np.inf, 0.0], [0.0, 1.0, 2.0]])
    with pytest.raises(DataError, match=r"not finite \(NaN or infinity\) in 2 of the 4 rows of batch 2 \(images 3-6, "
                       r"first row 4\)"):
        metrics.update(scores, np.array([0, 0, 1, 2]))
    assert metrics.examples == 3  # nothing of that batch counted
    for batch, label in ((3, -1), (4, 3)):  # the batches given, counted
        with pytest.raises(DataError, match=rf"^Label {label} in batch {batch} \(images 3-4\) is outside \[0, 3\): the model "
                           "has 3 classes"):
            metrics.update(np.eye(3)[:2], np.array([1, label]))
    assert metrics.confusion.sum() == 3 and metrics.result()["top1"] == 1.0
    with pytest.raises(DataError, match="No examples were evaluated"):
        evaluation.ClassificationMetrics(3).result()


def test_an_empty_split_is_an_error_that_names_it():
    from keras_vit.errors import DataError

    model = colour_classifier(V2_CENTRES)

    def empty(self, split, **kwargs):
        self._empty = True
        return _v2_as_dataset(self, split)

    with tfds.testing.mock_data(as_dataset_fn=empty, policy=tfds.testing.MockPolicy.USE_CODE):
        with pytest.raises(DataError, match=r"^'tfds:imagenet_v2' split 'test' has no examples"):
            evaluation.evaluate_classifier(model, "tfds:imagenet_v2", verbose=0)
    with tfds.testing.mock_data(as_dataset_fn=lambda self, split, **k: _real_as_dataset(self, split).take(0),
                                policy=tfds.testing.MockPolicy.USE_CODE):
        with pytest.raises(DataError, match=r"^'tfds:imagenet2012_real' split 'validation' has no examples"):
            evaluation.evaluate_classifier(model, "tfds:imagenet2012_real", verbose=0)


def test_non_finite_outputs_stop_the_evaluation():
    """(A file with NaN weights is refused when it loads; in-memory weights can still diverge.)"""
    from keras_vit.errors import DataError

    model = _tiny_vit(1000, predicted=409)
    kernel, bias = model.get_layer("head").get_weights()
    bias[5] = np.nan  # every row's logits hold a NaN
    model.get_layer("head").set_weights([kernel, bias])
    with tfds.testing.mock_data(as_dataset_fn=_v2_as_dataset, policy=tfds.testing.MockPolicy.USE_CODE):
        with pytest.raises(DataError, match=r"not finite \(NaN or infinity\) in 4 of the 4 rows of batch 1 \(images "
                           r"0-3, first row 0\)"):
            evaluation.evaluate_classifier(model, "tfds:imagenet_v2", batch_size=4, verbose=0)


def test_a_label_outside_the_classes_in_the_pipeline_is_one_line(vit_409, tmp_path, capsys):
    def labels_past_the_end(self, split, **kwargs):
        return _v2_as_dataset(self, split).map(lambda ex: {**ex, "label": ex["label"] + 600})

    with tfds.testing.mock_data(as_dataset_fn=labels_past_the_end, policy=tfds.testing.MockPolicy.USE_CODE):
        assert main(["evaluate", "--weights", vit_409, "--data", "tfds:imagenet_v2", "--verbose", "0",
                     "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("keras-vit evaluate: error: label 1554 of 'tfds:imagenet_v2' split 'test' is outside [0, 1000) "
                   "(1000 classes): the class count contradicts the data, or the labels are not class indices"), err


# === Bad input ===


def test_missing_manual_download_names_the_command(vit_409, tmp_path, capsys):
    assert main(["evaluate", "--weights", vit_409, "--data", "tfds:imagenet2012_real", "--data-dir", str(tmp_path),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "tfds build imagenet2012_real --manual_dir DIR" in err and "ILSVRC2012_img_val.tar" in err
    assert not (tmp_path / "o").exists()


def test_class_count_that_does_not_fit(tmp_path, capsys):
    path = tmp_path / "in21k.keras"
    _tiny_vit(21843).save(path)
    assert main(["evaluate", "--weights", str(path), "--data", "tfds:imagenet2012_real", "--out",
                 str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "head has 21843 classes" in err and "1000" in err and "ImageNet-21k" in err
    small = tmp_path / "ten.keras"  # ImageNet-V2 too (a small head: the check must come before the evaluation)
    _tiny_vit(10).save(small)
    with tfds.testing.mock_data(num_examples=2, policy=tfds.testing.MockPolicy.USE_CODE):
        assert main(["evaluate", "--weights", str(small), "--data", "tfds:imagenet_v2", "--out", str(tmp_path / "v2")]) == 2
    assert "head has 10 classes" in capsys.readouterr().err


def test_objectnet_folder_without_the_classes(vit_409, tmp_path, capsys):
    (tmp_path / "on" / "images" / "not_a_class").mkdir(parents=True)
    assert main(["evaluate", "--weights", vit_409, "--data", f"objectnet:{tmp_path / 'on'}", "--out",
                 str(tmp_path / "o")]) == 2
    assert "none of ObjectNet's 113 classes" in capsys.readouterr().err


def test_evaluate_into_an_earlier_runs_folder_keeps_no_stale_metrics(tmp_path, capsys):
    path = tmp_path / "m.keras"
    _tiny_vit(10).save(path)
    out = tmp_path / "eval"
    out.mkdir()
    (out / "metrics.json").write_text(json.dumps({"data": "tfds:imagenet2012_real", "real_top1": 0.9, "top1": 0.8}))
    assert main(["evaluate", "--weights", str(path), "--data", "digits", "--split", "test[:20]", "--verbose", "0",
                 "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"] == "digits" and metrics["examples"] == 20 and "real_top1" not in metrics
    assert "real_top1" not in (out / "metrics.csv").read_text()


def test_tfds_name_that_does_not_exist(tmp_path, capsys):
    path = tmp_path / "m.keras"
    _tiny_vit(10).save(path)
    assert main(["evaluate", "--weights", str(path), "--data", "tfds:cifar1000", "--out", str(tmp_path / "o")]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and "no dataset 'cifar1000'. Did you mean cifar100" in line
    assert not (tmp_path / "o").exists()


def test_tfds_config_that_does_not_exist(tmp_path, capsys):
    path = tmp_path / "m.keras"
    _tiny_vit(1000).save(path)
    assert main(["evaluate", "--weights", str(path), "--data", "tfds:imagenet_v2/foo", "--out",
                 str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == (
        "keras-vit evaluate: error: tensorflow-datasets' imagenet_v2 has no config 'foo'; its configs: "
        "matched-frequency, threshold-0.7, topimages. Pass tfds:imagenet_v2/CONFIG with one of them, e.g. "
        "tfds:imagenet_v2/matched-frequency.\n")


# === Report: Table 2's layout ===


def test_report_table2(tmp_path, capsys):
    real = tmp_path / "real"
    real.mkdir()
    (real / "metrics.json").write_text(json.dumps({"data": "tfds:imagenet2012_real", "top1": 0.8, "real_top1": 0.85}))
    (real / "config.json").write_text(json.dumps({"weights": "ViTB16.augreg2_in21k_ft_in1k"}))
    cifar = tmp_path / "cifar"
    cifar.mkdir()
    (cifar / "metrics.json").write_text(json.dumps({"data": "tfds:cifar10", "top1": 0.9912}))
    (cifar / "config.json").write_text(json.dumps({"weights": "ViTB16.augreg2_in21k_ft_in1k"}))
    vtab = tmp_path / "vtab"
    vtab.mkdir()
    (vtab / "vtab.json").write_text(json.dumps({"groups": {"all": {"mean": 0.5, "tasks": 2, "of": 19}}}))
    assert main(["report", str(real), str(cifar), str(vtab), "--out", str(tmp_path / "t")]) == 0
    markdown = capsys.readouterr().out
    lines = markdown.splitlines()
    assert "ViTB16.augreg2_in21k_ft_in1k" in lines[0] and "vtab" in lines[0]
    assert "paper: ViT-H/14 (JFT)" in lines[0] and "paper: BiT-L (ResNet152x4)" in lines[0]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines[2:]}
    assert list(rows) == list(evaluation.ROWS)
    assert rows["ImageNet"][:2] == ["80.00", ""] and rows["ImageNet ReaL"][0] == "85.00"
    assert rows["CIFAR-10"][0] == "99.12" and rows["VTAB (19 tasks)"][1] == "50.00 (2 of 19 tasks)"
    assert rows["ImageNet"][2] == "88.55 ± 0.04" and rows["VTAB (19 tasks)"][2] == "77.63 ± 0.23"
    assert (tmp_path / "t" / "table2.md").read_text() == markdown
    assert (tmp_path / "t" / "table2.csv").read_text().splitlines()[1].startswith("ImageNet,80.00")
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


#: The paper's Table 2 (Dosovitskiy et al. 2021, "Comparison with state of the art on popular
#: image classification benchmarks"), typed from the paper: top-1 accuracy in %, mean ± std over
#: three fine-tuning runs. Columns: ViT-H/14 (JFT), ViT-L/16 (JFT), BiT-L (ResNet152x4).
PAPER = """
ImageNet            | 88.55 ± 0.04 | 87.76 ± 0.03 | 87.54 ± 0.02
ImageNet ReaL       | 90.72 ± 0.05 | 90.54 ± 0.03 | 90.54
CIFAR-10            | 99.50 ± 0.06 | 99.42 ± 0.03 | 99.37 ± 0.06
CIFAR-100           | 94.55 ± 0.04 | 93.90 ± 0.05 | 93.51 ± 0.08
Oxford-IIIT Pets    | 97.56 ± 0.03 | 97.32 ± 0.11 | 96.62 ± 0.23
Oxford Flowers-102  | 99.68 ± 0.02 | 99.74 ± 0.00 | 99.63 ± 0.03
VTAB (19 tasks)     | 77.63 ± 0.23 | 76.28 ± 0.46 | 76.29 ± 1.70
"""


def test_report_paper_columns_are_table2():
    """All 21 figures of the report's paper columns, row by row."""
    table = evaluation.PAPER_TABLE2
    expected = [[cell.strip() for cell in line.split("|")] for line in PAPER.strip().splitlines()]
    assert list(evaluation.ROWS) == [row[0] for row in expected]
    assert list(table) == ["ViT-H/14 (JFT)", "ViT-L/16 (JFT)", "BiT-L (ResNet152x4)"]
    got = [[row, *(table[column][row] for column in table)] for row in evaluation.ROWS]
    assert got == expected


def _run(folder, metrics=None, config=None, vtab=None):
    folder.mkdir(parents=True)
    for name, value in (("metrics.json", metrics), ("config.json", config), ("vtab.json", vtab)):
        if value is not None:
            (folder / name).write_text(json.dumps(value))
    return str(folder)


def test_report_columns_are_the_weights_each_run_records(tmp_path, monkeypatch):
    """Two folders named `run` of two models stay two columns (labelled by their paths when their
    names are the same); runs of one checkpoint share one, read from any folder; a vtab run joins
    the evaluate runs of its weights; a run that records no weights has its own column."""
    first, second = str(tmp_path / "a" / "m.keras"), str(tmp_path / "b" / "m.keras")
    a = _run(tmp_path / "a" / "run", {"data": "tfds:cifar10", "top1": 0.1139}, {"weights_id": first})
    b = _run(tmp_path / "b" / "run", {"data": "tfds:cifar10", "top1": 0.99}, {"weights_id": second})
    a100 = _run(tmp_path / "a" / "c100", {"data": "tfds:cifar100", "top1": 0.5}, {"weights_id": first})
    vtab = _run(tmp_path / "vtab", vtab={"groups": {"all": {"mean": 0.25, "tasks": 1, "of": 19}}, "weights": first},
                config={"command": "vtab", "weights_id": first})
    bare = _run(tmp_path / "c" / "run", {"data": "tfds:cifar10", "top1": 0.3})
    table = evaluation.table2([a, b, a100, vtab, bare], paper=False)
    assert table["columns"] == [first, second, "run"]
    rows = {row[0]: row[1:] for row in table["rows"]}
    assert rows["CIFAR-10"] == ["11.39", "99.00", "30.00"] and rows["CIFAR-100"] == ["50.00", "", ""]
    assert rows["VTAB (19 tasks)"] == ["25.00 (1 of 19 tasks)", "", ""]
    monkeypatch.chdir(tmp_path / "a")  # the same table from another folder, with relative paths
    again = evaluation.table2([os.path.relpath(p) for p in (a, b, a100, vtab, bare)], paper=False)
    assert again == table
    # One name per model where names differ; a preset's name as it is.
    c = _run(tmp_path / "d" / "run", {"data": "tfds:cifar100", "top1": 0.7}, {"weights_id": "ViTB16.augreg_in21k"})
    assert evaluation.table2([a, c], paper=False)["columns"] == ["m.keras", "ViTB16.augreg_in21k"]
    # Two results of one row and model: an error, not one silently replacing the other.
    twice = _run(tmp_path / "a" / "again", {"data": "tfds:cifar10", "top1": 0.2}, {"weights_id": first})
    with pytest.raises(ValueError, match="both hold the CIFAR-10 result of the weights"):
        evaluation.table2([a, twice])


@pytest.mark.parametrize("value, problem", [
    (float("nan"), r"holds top1=nan, not a finite accuracy"),
    (57.3, r"holds top1=57.3, not a fraction in \[0, 1\] \(a percentage\? 57.3 % is 0.573\)"),
    (-0.1, r"holds top1=-0.1, not a fraction in \[0, 1\]; keras-vit writes accuracies as fractions"),
    ("0.5", r"holds top1='0.5', not a number"),
])
def test_report_refuses_what_is_not_an_accuracy(tmp_path, capsys, value, problem):
    import re

    run = _run(tmp_path / "run", {"data": "tfds:cifar10", "top1": value})
    assert main(["report", run]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(problem, err), err
    assert os.path.join(run, "metrics.json") in err
    vtab = _run(tmp_path / "vtab", vtab={"groups": {"all": {"mean": value, "tasks": 1, "of": 19}}})
    assert main(["report", vtab]) == 2
    assert "groups.all.mean" in capsys.readouterr().err
