"""The VTAB-1k suite (keras_vit.evaluation.run_vtab, `keras-vit vtab`) on tfds' mock data: every
task's data, one task per group end to end with a tiny model, resume, the tables and plot, the
task labels, bad input."""

import csv
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import keras_vit
from keras_vit import evaluation
from keras_vit.cli import main
from keras_vit.data import TFDS_DATASETS, VTAB_TASKS

TINY_ARCH = dict(patch_size=8, hidden_size=8, num_layers=1, num_heads=2, mlp_dim=16)
QUICK = dict(steps=1, batch_size=2, image_size=16, verbose=0)


def _tiny_base():
    return keras_vit.VisionTransformer(image_size=16, classes=3, **TINY_ARCH)


#: Tasks whose labels read nested object lists, which tfds' random sequences do not fit (their
#: lengths are drawn per field): hand-made examples stand in for them.
OBJECT_TASKS = ["vtab/clevr_count", "vtab/clevr_distance", "vtab/kitti_distance"]


def _objects_as_dataset(self, split, **kwargs):
    """CLEVR-like (3 to 10 objects, depths 7-11) or KITTI-like (types 0-7, depths 0-40 m) examples."""
    counts = (3, 4, 5, 10, 7, 3)
    rng = np.random.default_rng(0)
    if self.name == "kitti":
        examples = [{"image": rng.integers(0, 255, (12, 20, 3), np.uint8),
                     "objects": {"type": rng.integers(0, 8, n).astype(np.int64),
                                 "location": rng.uniform(0, 40, (n, 3)).astype(np.float32)}} for n in counts]
        spec = {"type": tf.TensorSpec((None,), tf.int64), "location": tf.TensorSpec((None, 3), tf.float32)}
    else:
        examples = [{"image": rng.integers(0, 255, (12, 12, 3), np.uint8),
                     "objects": {"size": np.zeros(n, np.int64),
                                 "pixel_coords": rng.uniform(7, 11, (n, 3)).astype(np.float32)}} for n in counts]
        spec = {"size": tf.TensorSpec((None,), tf.int64), "pixel_coords": tf.TensorSpec((None, 3), tf.float32)}
    return tf.data.Dataset.from_generator(lambda: iter(examples), output_signature={
        "image": tf.TensorSpec((None, None, 3), tf.uint8), "objects": spec}).cache()


def test_the_papers_setting():
    s = evaluation.VTAB_1K
    assert (s.steps, s.learning_rate, s.batch_size, s.image_size) == (2500, 0.01, 512, 384)
    assert (s.momentum, s.global_clipnorm, s.weight_decay) == (0.9, 1.0, 0.0)
    assert s.train_split == "train800val200" and TFDS_DATASETS["vtab/dtd"].splits["train800val200"] == (
        ("train", 800), ("validation", 200))
    assert len(VTAB_TASKS) == 19
    assert [sum(TFDS_DATASETS[t].vtab == g for t in VTAB_TASKS) for g in evaluation.GROUPS] == [7, 4, 8]


def test_structured_labels_known_answer():
    """clevr_distance bins the closest object's depth at 0, 8, 8.5, 9, 9.5, 10; kitti_distance the
    closest vehicle's (Car, Van, Truck: types 0-2) at 8 and 20 m, 3 with no vehicle."""
    clevr = TFDS_DATASETS["vtab/clevr_distance"].label
    for depths, want in (([12.0, 7.5], 0), ([8.2, 9.9], 1), ([9.7], 4), ([10.5, 11.0], 5), ([9.2, 8.7], 2)):
        coords = tf.constant([[0.0, 0.0, d] for d in depths])
        assert int(clevr({"objects": {"pixel_coords": coords}})) == want, depths
    count = TFDS_DATASETS["vtab/clevr_count"].label
    assert int(count({"objects": {"size": tf.zeros(7, tf.int64)}})) == 4
    kitti = TFDS_DATASETS["vtab/kitti_distance"].label
    for types, depths, want in (([0, 4], [5.0, 1.0], 0), ([2, 1], [25.0, 12.0], 1), ([3, 0], [3.0, 30.0], 2),
                                ([5, 6], [3.0, 4.0], 3)):
        example = {"objects": {"type": tf.constant(types, tf.int64),
                               "location": tf.constant([[0.0, 0.0, d] for d in depths])}}
        assert int(kitti(example)) == want, (types, depths)


#: The tasks fine-tuned and evaluated end to end: one per group (natural, specialized, structured;
#: the structured one reads nested object lists). Every task's data (both splits, shapes, labels,
#: counts) is read in test_every_task_reads_its_splits; the steps after reading are the same code
#: for every task.
END_TO_END = ["vtab/caltech101", "vtab/eurosat", "vtab/clevr_count"]


def _mock(task):
    if task in OBJECT_TASKS:
        return tfds.testing.mock_data(as_dataset_fn=_objects_as_dataset, policy=tfds.testing.MockPolicy.USE_CODE)
    return tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE)


@pytest.mark.backend_independent  # the tasks' data pipelines are TensorFlow on every backend
def test_every_task_reads_its_splits():
    """All 19 tasks: the fine-tuning split (train800val200) and the test split as keras_vit.data
    reads a tfds source (builder, splits, image feature, label function, class count); resizing
    and batching after that are the same for every task (test_tasks_end_to_end)."""
    from keras_vit.data.pipeline import _source_tfds

    def read(task):
        source = TFDS_DATASETS[task]
        for split in (evaluation.VTAB_1K.train_split, evaluation.VTAB_1K.test_split):
            ds, info = _source_tfds(task, split, None)
            pairs = [(np.asarray(image), int(label)) for image, label in ds]
            assert info.num_classes == source.classes and pairs, (task, split)
            for image, label in pairs:
                assert image.ndim == 3 and image.shape[-1] == 3 and image.dtype == np.uint8, (task, image.shape)
                assert 0 <= label < source.classes, (task, split, label)
            yield split, info, len(pairs)

    with _mock(VTAB_TASKS[0]):
        for task in VTAB_TASKS:
            if task not in OBJECT_TASKS:
                # Mock data: 4 examples per split; train800val200 is train's 4 + val's 4.
                assert [(n, info.num_examples) for _, info, n in read(task)] == [(8, 8), (4, 4)], task
    with _mock(OBJECT_TASKS[0]):
        for task in OBJECT_TASKS:
            assert [n for _, _, n in read(task)] == [12, 6], task  # _objects_as_dataset: 6 per split


@pytest.mark.slow
@pytest.mark.skipif(keras.backend.backend() != "jax", reason="the tasks' data pipelines are TensorFlow on every "
                    "backend; each backend's fine-tuning path runs in test_resume_gradient_accumulation_and_cli")
def test_tasks_end_to_end(tmp_path, capsys):
    """One task per group (END_TO_END), 1 step each, write their rows and the tables; the run
    resumes task by task. (Every task's data: test_every_task_reads_its_splits.)"""
    out = str(tmp_path / "vtab")
    base = _tiny_base()
    plain = [t for t in END_TO_END if t not in OBJECT_TASKS]
    objects = [t for t in END_TO_END if t in OBJECT_TASKS]
    with _mock(plain[0]):
        evaluation.run_vtab(base, out, tasks=plain, **QUICK)
    with _mock(objects[0]):
        result = evaluation.run_vtab(base, out, tasks=objects, micro_batch_size=1, **QUICK)
    rows = result["tasks"]
    assert [r["task"] for r in rows] == [t for t in VTAB_TASKS if t in END_TO_END]
    assert sorted({r["group"] for r in rows}) == sorted(evaluation.GROUPS)
    for row in rows:
        source = TFDS_DATASETS[row["task"]]
        assert row["group"] == source.vtab and row["classes"] == source.classes
        assert row["examples"] > 0 and 0 <= row["top1"] <= 1
        assert row["setting"]["steps"] == 1 and row["setting"]["image_size"] == 16
    assert {r["train_examples"] for r in rows if r["task"] not in OBJECT_TASKS} == {8}
    assert {r["setting"]["micro_batch_size"] for r in rows if r["task"] in OBJECT_TASKS} == {1}
    groups = result["groups"]
    for group in evaluation.GROUPS:
        values = [r["top1"] for r in rows if TFDS_DATASETS[r["task"]].vtab == group]
        assert groups[group]["mean"] == pytest.approx(np.mean(values)) and groups[group]["tasks"] == len(values)
        assert groups[group]["of"] == sum(TFDS_DATASETS[t].vtab == group for t in VTAB_TASKS)
    n = len(END_TO_END)
    assert groups["all"]["mean"] == pytest.approx(np.mean([r["top1"] for r in rows])) and groups["all"]["tasks"] == n
    saved = json.loads(open(os.path.join(out, "vtab.json")).read())
    assert saved["groups"] == json.loads(json.dumps(groups)) and len(saved["tasks"]) == n
    with open(os.path.join(out, "vtab.csv")) as f:
        table = list(csv.reader(f))
    assert table[0] == ["task", "group", "top1", "examples"] and len(table) == 1 + n + 4
    assert table[-1][:2] == [f"mean ({n} of 19 tasks)", "all"] and float(table[-1][2]) == pytest.approx(
        groups["all"]["mean"], abs=1e-6)
    assert os.path.getsize(os.path.join(out, "vtab.png")) > 0
    capsys.readouterr()
    # Everything done: a rerun trains nothing and returns the same table.
    with _mock(plain[0]):
        again = evaluation.run_vtab(base, out, tasks=END_TO_END, **QUICK)
    assert capsys.readouterr().out.count("done before (resumed)") == n and again["tasks"] == rows


def test_resume_gradient_accumulation_and_cli(tmp_path, capsys):
    out = tmp_path / "vtab"
    arch = json.dumps(TINY_ARCH)
    argv = ["vtab", "--arch", arch, "--weights", "none", "--tasks", "vtab/dtd", "--steps", "2", "--batch-size", "4",
            "--micro-batch-size", "2", "--image-size", "16", "--verbose", "0", "--out", str(out)]
    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        assert main(argv) == 0
        row = json.loads((out / "tasks" / "dtd.json").read_text())
        assert row["task"] == "vtab/dtd" and row["examples"] == 4 and row["setting"]["micro_batch_size"] == 2
        assert row["setting"]["batch_size"] == 4 and row["setting"]["steps"] == 2
        assert {"vtab.json", "vtab.csv", "vtab.png"} <= set(os.listdir(out))
        printed = capsys.readouterr().out
        assert "natural: " in printed and "(1 of 7 tasks)" in printed
        # Another setting in the same folder is refused.
        assert main(argv[:-1] + [str(out)] + ["--steps", "3"]) == 2
        assert "another setting" in capsys.readouterr().err
        # A micro-batch that does not divide the batch.
        assert main([*argv[:-2], "--micro-batch-size", "3", "--out", str(tmp_path / "b")]) == 2
        assert "--micro-batch-size 3 does not divide --batch-size 4" in capsys.readouterr().err


def test_unknown_task_lists_the_tasks(tmp_path, capsys):
    assert main(["vtab", "--arch", "ViTTi16", "--weights", "none", "--tasks", "dtd,clever_count",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "Unknown VTAB-1k task 'vtab/clever_count'" in err and "vtab/clevr_count" in err
    assert all(task in err for task in VTAB_TASKS)
    assert not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match="Known: vtab/caltech101"):
        evaluation.resolve_tasks(["nope"])
    assert evaluation.resolve_tasks("dtd, vtab/svhn,dtd") == ["vtab/dtd", "vtab/svhn"]


def test_missing_task_data_names_the_command(tmp_path, capsys):
    assert main(["vtab", "--arch", json.dumps(TINY_ARCH), "--weights", "none", "--tasks", "sun397", "--steps", "1",
                 "--batch-size", "2", "--image-size", "16", "--data-dir", str(tmp_path), "--out",
                 str(tmp_path / "o")]) == 2
    assert "run `tfds build sun397/tfds`" in capsys.readouterr().err


# === Known answers and data that cannot give one ===


def _dtd_as_dataset(train_labels, test_labels):
    """vtab/dtd examples (random 8x8 images) with the given labels: `train_labels` in each of
    dtd's train and validation splits, `test_labels` in its test split."""

    def as_dataset(self, split, **kwargs):
        labels = test_labels if str(split).startswith("test") else train_labels
        rng = np.random.default_rng(len(labels))
        examples = [{"image": rng.integers(0, 255, (8, 8, 3), np.uint8), "label": np.int64(label),
                     "file_name": f"{i}.jpg"} for i, label in enumerate(labels)]
        return tf.data.Dataset.from_generator(lambda: iter(examples), output_signature={
            "image": tf.TensorSpec((None, None, 3), tf.uint8), "label": tf.TensorSpec((), tf.int64),
            "file_name": tf.TensorSpec((), tf.string)}).cache()

    return tfds.testing.mock_data(as_dataset_fn=as_dataset, policy=tfds.testing.MockPolicy.USE_CODE)


@pytest.mark.backend_independent
def test_warmup_of_the_papers_setting():
    """The original fine-tuning warm-up: 500 steps of the paper's 2500, at most a fifth of shorter runs."""
    assert evaluation.VTAB_1K.warmup_steps == 500 == evaluation.VTAB_1K.steps // 5
    from keras_vit.evaluation.vtab import effective_setting

    for steps, warmup in ((2500, 500), (5000, 500), (2000, 400), (100, 20), (4, 0)):
        assert effective_setting(steps=steps).warmup_steps == warmup, steps


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="each backend's fine-tuning path runs in "
                    "test_resume_gradient_accumulation_and_cli; what is checked here comes after it")
def test_known_answer_task(tmp_path):
    """A zero head that learns nothing (learning rate 0) predicts class 0 for every image: its
    top-1 is the fraction of test images of class 0, 3 of 5; the group and suite means are it."""
    import dataclasses

    setting = dataclasses.replace(evaluation.VTAB_1K, learning_rate=0.0)
    with _dtd_as_dataset([1, 2, 3, 4], [0, 5, 0, 7, 0]):
        result = evaluation.run_vtab(_tiny_base(), str(tmp_path / "vtab"), tasks=["dtd"], setting=setting, steps=5,
                                     batch_size=2, image_size=16, verbose=0, weights="ViTTi16.augreg_in21k")
    (row,) = result["tasks"]
    assert row["top1"] == pytest.approx(3 / 5) and row["examples"] == 5
    assert row["setting"]["warmup_steps"] == 1 and row["setting"]["learning_rate"] == 0.0
    assert result["groups"]["natural"]["mean"] == pytest.approx(3 / 5)
    assert result["groups"]["all"]["mean"] == pytest.approx(3 / 5)
    saved = json.loads((tmp_path / "vtab" / "vtab.json").read_text())
    assert saved["weights"] == "ViTTi16.augreg_in21k"  # what `keras-vit report` keys its columns by
    # Other weights into the same folder are refused: the means would mix two models.
    with pytest.raises(ValueError, match="holds VTAB results of the weights ViTTi16.augreg_in21k, not ViTS16"):
        evaluation.run_vtab(_tiny_base(), str(tmp_path / "vtab"), tasks=["dtd"], setting=setting, steps=5,
                            batch_size=2, image_size=16, verbose=0, weights="ViTS16.augreg_in21k")


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="each backend's fine-tuning path runs in "
                    "test_resume_gradient_accumulation_and_cli; what is checked here comes after it")
def test_an_empty_test_split_is_an_error_not_a_zero(tmp_path):
    from keras_vit.errors import DataError

    out = tmp_path / "vtab"
    with _dtd_as_dataset([1, 2, 3, 4], []):
        with pytest.raises(DataError, match=r"^'tfds:vtab/dtd' split 'test' has no examples"):
            evaluation.run_vtab(_tiny_base(), str(out), tasks=["dtd"], steps=1, batch_size=2, image_size=16,
                                verbose=0)
    assert not (out / "tasks" / "dtd.json").exists() and evaluation.vtab.read_results(str(out)) == []


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="each backend's fit turns a failed pipeline check into "
                    "its one line: test_training_fit.test_fit_refuses_a_label_outside_the_classes")
def test_label_outside_the_classes_is_one_line_and_weights_are_recorded(tmp_path, capsys):
    """dtd has 47 classes: a label of 50 stops the fine-tuning with one line, not TensorFlow's
    traceback. A run records its weights (config.json), and the help states the real default size."""
    path = tmp_path / "tiny.keras"
    _tiny_base().save(path)
    argv = ["vtab", "--weights", str(path), "--tasks", "dtd", "--steps", "2", "--batch-size", "2", "--image-size",
            "16", "--verbose", "0", "--out"]
    with _dtd_as_dataset([1, 50, 3, 4], [0, 1]):
        assert main([*argv, str(tmp_path / "bad")]) == 2
    assert capsys.readouterr().err == (
        "keras-vit vtab: error: label 50 of 'tfds:vtab/dtd' split 'train800val200' is outside [0, 47) (47 classes): "
        "the class count contradicts the data, or the labels are not class indices\n")
    assert not (tmp_path / "bad").exists()
    with _dtd_as_dataset([1, 2, 3, 4], [0, 1]):
        assert main([*argv, str(tmp_path / "good")]) == 0
    config = json.loads((tmp_path / "good" / "config.json").read_text())
    assert config["command"] == "vtab" and config["weights_id"] == os.path.realpath(path)
    assert json.loads((tmp_path / "good" / "vtab.json").read_text())["weights"] == os.path.realpath(path)
    with pytest.raises(SystemExit):
        main(["vtab", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "(default: the paper's 384)" in help_text and "or 224" not in help_text
