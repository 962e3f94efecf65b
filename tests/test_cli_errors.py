"""`keras-vit <command>` on bad input: one line `keras-vit <command>: error: ...`, a non-zero exit
status, no traceback, no run folder left behind; and a start that loads no backend for `--help`
and `presets`.

Each case runs the installed console script in a fresh process, as a user would. Most fail
before Keras loads; the offline cases load it (the weights are looked up through the public API)
and run on the JAX backend whatever the suite's backend, with HF_HUB_OFFLINE=1 and empty caches.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import keras_vit
from keras_vit.cli import main

SCRIPT = shutil.which("keras-vit", path=os.path.dirname(sys.executable))
pytestmark = [pytest.mark.backend_independent,
              pytest.mark.skipif(SCRIPT is None, reason="the keras-vit console script is not installed")]

TINY_ARCH = json.dumps(dict(patch_size=8, hidden_size=16, num_layers=2, num_heads=2, mlp_dim=16))


def _start(argv, env):
    full_env = dict(os.environ, **(env or {}))
    full_env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the command sets it itself
    return subprocess.Popen([sys.executable, SCRIPT, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env)


def keras_vit_commands(*commands, env=None, timeout=600):
    """Run several `keras-vit` commands (argument lists) side by side; their (exit status, stdout,
    stderr) in order."""
    processes = [_start(argv, env) for argv in commands]
    results = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=timeout)
        results.append((process.returncode, stdout, stderr))
    return results


def keras_vit_command(*argv, env=None):
    """Run the `keras-vit` script; returns (exit status, stdout, stderr)."""
    return keras_vit_commands(argv, env=env)[0]


def assert_user_error(result, command, *fragments):
    status, stdout, stderr = result
    assert status == 2, (status, stdout, stderr)
    assert "Traceback" not in stdout + stderr, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"keras-vit {command}: error: "), stderr
    for fragment in fragments:
        assert fragment in line, (fragment, line)
    return line


# === Errors found before anything loads ===


def test_convert_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    (tmp_path / "exists.keras").write_text("")
    assert_user_error(keras_vit_command("convert", str(tmp_path / "notes.txt"), str(tmp_path / "no" / "dir" / "m.keras")),
                      "convert", "does not exist", "mkdir -p")
    assert_user_error(keras_vit_command("convert", str(tmp_path / "notes.txt"), str(tmp_path / "exists.keras")),
                      "convert", "exists; pass --force")


def test_model_argument_errors(tmp_path):
    out = tmp_path / "run"
    data = ["--data", "digits", "--out", str(out)]
    assert_user_error(keras_vit_command("finetune", *data), "finetune", "Say which model", "--weights none")
    assert_user_error(keras_vit_command("finetune", "--arch", "ViTB61", "--weights", "none", *data),
                      "finetune", "Unknown --arch 'ViTB61'", "Did you mean ViTB16")
    assert_user_error(keras_vit_command("fewshot", "--arch", TINY_ARCH, "--weights", "augreg_in21k", *data),
                      "fewshot", "--arch as JSON", "--weights none")
    assert_user_error(keras_vit_command("evaluate", "--arch", "ViTTi16", "--weights", "none", *data),
                      "evaluate", "needs trained weights")
    assert_user_error(keras_vit_command("explain", "--weights", "a.keras", "--preset", "ViTTi16.augreg_in21k",
                                        "--out", str(out)), "explain", "either --preset or --weights")
    assert_user_error(keras_vit_command("explain", str(tmp_path / "missing.jpg"), "--out", str(out)),
                      "explain", "missing.jpg", "does not exist")
    assert_user_error(keras_vit_command("explain", "sample:nosuch", "--out", str(out)), "explain",
                      "Unknown sample 'nosuch'", "sample:grace_hopper")
    assert not out.exists()


def test_presets_unknown_architecture():
    assert_user_error(keras_vit_command("presets", "NoSuch"), "presets", "Unknown architecture 'NoSuch'", "ViTB16")
    assert_user_error(keras_vit_command("presets", "ViTS23"), "presets", "Did you mean ViTS32")


def test_argparse_errors_use_the_same_form():
    status, _, stderr = keras_vit_command("finetune", "--data", "digits")
    assert status == 2 and "keras-vit finetune: error: the following arguments are required: --out" in stderr


def test_help_and_presets_load_no_backend():
    """`--help` and `presets` import neither Keras nor a backend (they start in well under a second)."""
    code = (
        "import sys; sys.argv[0] = 'keras-vit'\n"
        "from keras_vit.cli import main\n"
        "main(['presets', 'ViTB16'])\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in ('keras', 'tensorflow', 'jax', 'torch') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "augreg2_in21k_ft_in1k" in out.stdout and "COMMAND" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"
    assert out.stderr == ""


_PARSE_CASES = """
import contextlib, io, json, sys
sys.argv[0] = "keras-vit"  # as the console script starts: keras_vit imports lazily
from keras_vit.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as exit:
            status = exit.code
    results.append([status, err.getvalue()])
print(json.dumps({"results": results, "loaded": sorted(
    m for m in ("keras", "tensorflow", "jax", "torch", "PIL.ImageFile") if m in sys.modules and m != "PIL.ImageFile")}))
"""


def test_bad_values_fail_before_anything_loads(tmp_path):
    """Numbers out of range, unreadable shot lists, folders and non-image files given as images:
    one line naming the flag (or file) and the fix, status 2, no run folder, and neither Keras
    nor a backend imported. All cases run in one process, one after the other."""
    (tmp_path / "notimage.jpg").write_text("not an image\n")
    (tmp_path / "folder").mkdir()
    png = tmp_path / "truncated.png"
    from PIL import Image

    Image.new("RGB", (64, 64), (200, 10, 10)).save(png)
    png.write_bytes(png.read_bytes()[:-30])  # the image data's end and IEND cut off
    out = str(tmp_path / "run")
    (tmp_path / "started").mkdir()
    (tmp_path / "started" / "config.json").write_text(json.dumps({"image_size": [16, 24]}))
    train = ["finetune", "--arch", TINY_ARCH, "--weights", "none", "--data", "digits", "--out", out]
    fewshot = ["fewshot", "--weights", str(tmp_path / "model.keras"), "--data", "digits", "--out", out]
    explain = ["explain", "--weights", "none", "--arch", TINY_ARCH, "--out", out]
    cases = [  # (argv, the command, fragments of its error line)
        (train + ["--batch-size", "0"], "finetune", ["argument --batch-size: 0 is not a whole number of at least 1"]),
        (train + ["--steps", "0"], "finetune", ["argument --steps: 0 is not a whole number of at least 1"]),
        (train + ["--steps", "-5"], "finetune", ["argument --steps: -5 is not"]),
        (train + ["--lr", "-0.1"], "finetune", ["argument --lr: -0.1 is not a number above 0", "e.g. 0.003"]),
        (train + ["--lr", "nan"], "finetune", ["argument --lr: nan is not"]),
        (train + ["--eval-every", "0"], "finetune", ["argument --eval-every: 0 is not"]),
        (train + ["--ema", "2"], "finetune", ["argument --ema: 2 is not a number in (0, 1)", "e.g. 0.9999"]),
        (train + ["--label-smoothing", "1"], "finetune", ["argument --label-smoothing: 1 is not a number in [0, 1)"]),
        (train + ["--image-size", "-32"], "finetune", ["argument --image-size: -32 is not"]),
        (train + ["--image-size", "32x"], "finetune", ["argument --image-size: '32x' is not an image size",
                                                       "(384)", "HEIGHTxWIDTH (384x512, or 384,512)"]),
        (train + ["--image-size", "16x0"], "finetune", ["argument --image-size: 16x0 is not", "at least 1 pixel"]),
        (train + ["--image-size", "16x32", "--resume", "--out", str(tmp_path / "started")], "finetune",
         ["--image-size 16x24 (now 16x32)"]),
        (["convert", "a.npz", "b.keras", "--image-size", "1x2x3"], "convert",
         ["argument --image-size: '1x2x3' is not an image size", "HEIGHTxWIDTH"]),
        (["vtab", "--arch", "ViTTi16", "--weights", "none", "--out", out, "--image-size", "384x512"], "vtab",
         ["argument --image-size: '384x512' is not square", "one square resolution", "pass one number"]),
        (train + ["--steps", "4", "--warmup", "4"], "finetune", ["--warmup 4 must be smaller than --steps 4"]),
        (train + ["--distribute", "model"], "finetune", ["argument --distribute: invalid choice: 'model'"]),
        (train + ["--distribute", "data", "--coordinator-address", "10.0.0.2"], "finetune",
         ["argument --coordinator-address: '10.0.0.2' is not HOST:PORT", "e.g. 10.0.0.2:1234"]),
        (train + ["--distribute", "data", "--coordinator-address", "h:70000"], "finetune",
         ["argument --coordinator-address: '70000' in 'h:70000' is not a port number (1-65535)"]),
        (train + ["--distribute", "data", "--num-processes", "0"], "finetune", ["argument --num-processes: 0 is not"]),
        (train + ["--distribute", "data", "--process-id", "-1"], "finetune", ["argument --process-id: -1 is not"]),
        (train + ["--num-processes", "2"], "finetune", ["--num-processes describes a job", "add --distribute data"]),
        (train + ["--distribute", "data", "--process-id", "1"], "finetune", ["--process-id needs --num-processes"]),
        (train + ["--distribute", "data", "--num-processes", "2", "--process-id", "0"], "finetune",
         ["--num-processes 2 needs --coordinator-address"]),
        (train + ["--distribute", "data", "--num-processes", "2", "--coordinator-address", "h:1234"], "finetune",
         ["--num-processes 2 needs --process-id"]),
        (train + ["--distribute", "data", "--num-processes", "2", "--coordinator-address", "h:1234", "--process-id",
                  "2"], "finetune", ["--process-id 2 is not below --num-processes 2", "0 to 1"]),
        (train + ["--distribute", "data", "--num-processes", "1", "--process-id", "1"], "finetune",
         ["--num-processes 1 runs one process"]),
        (train + ["--distribute", "data", "--num-processes", "4", "--coordinator-address", "h:1234", "--process-id",
                  "0", "--batch-size", "18"], "finetune", ["--batch-size 18 (the global batch) does not split evenly",
                                                           "multiple of 4"]),
        (fewshot + ["--shots", "a,b"], "fewshot", ["argument --shots: 'a' is not a whole number", "--shots 1,5,10,25"]),
        (fewshot + ["--shots", "5,0"], "fewshot", ["argument --shots: 0 is not a positive number", "--shots 1,5,10,25"]),
        (["evaluate", "--weights", "m.keras", "--data", "digits", "--batch-size", "-1", "--out", out], "evaluate",
         ["argument --batch-size: -1 is not"]),
        (["export", "m.keras", out, "--image-size", "0"], "export", ["argument --image-size: 0 is not"]),
        (["export", "m.keras", out, "--image-size", "abc"], "export", ["argument --image-size: 'abc' is not"]),
        (["export", "m.keras", out, "--image-size", "16x24", "32"], "export", ["--image-size takes", "got 16x24 32"]),
        (explain + [str(tmp_path / "notimage.jpg")], "explain", ["notimage.jpg' is not an image file", "image files"]),
        (explain + [str(tmp_path / "folder")], "explain", ["folder' is a folder, not an image file", "*.jpg"]),
        (explain + [str(png)], "explain", ["truncated.png' is a damaged image"]),
        (explain + ["sample:grace_hopper", "--components", "0"], "explain", ["argument --components: 0 is not"]),
    ]
    cases += _image_size_cases(tmp_path)
    cases += _run_folder_and_data_cases(tmp_path)
    done = subprocess.run([sys.executable, "-c", _PARSE_CASES, json.dumps([argv for argv, _, _ in cases])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    for (argv, command, fragments), (status, stderr) in zip(cases, report["results"]):
        line = assert_user_error((status, "", stderr), command, *fragments)
        assert "--warmup" not in line or "--warmup" in argv, (argv, line)  # --steps errors name --steps only
    assert not os.path.exists(out)
    assert (tmp_path / "afile").read_text() == "a file\n"  # an --out that is a file is left as it was
    assert sorted(os.listdir(tmp_path / "vtab_done" / "tasks")) == ["dtd.json"]  # nothing added to a run folder
    assert os.listdir(tmp_path / "finetuned") == ["config.json"]


def _image_size_cases(tmp_path):
    """An --image-size the model cannot take (not a multiple of its patch size, or below one patch),
    the model named by --arch, a preset or SOURCE: refused before anything loads, naming the flag,
    the patch size and the nearest sizes the model takes."""
    out = str(tmp_path / "run")
    none = ["--weights", "none"]
    return [
        (["vtab", "--arch", "ViTTi16", *none, "--out", out, "--image-size", "30"], "vtab",
         ["--image-size 30 does not fit ViTTi16", "patch size is 16 pixels", "nearest sizes it takes are 16 and 32",
          "--image-size 32."]),
        (["vtab", "--arch", "ViTH14", *none, "--out", out], "vtab",  # the paper's 384 is no multiple of 14
         ["--image-size 384 (the default) does not fit ViTH14", "patch size is 14", "378 and 392"]),
        (["vtab", "--preset", "ViTB16.augreg_in21k", "--out", out, "--image-size", "100"], "vtab",
         ["--image-size 100 does not fit ViTB16.augreg_in21k (ViTB16)", "patch size is 16", "96 and 112"]),
        (["finetune", "--arch", TINY_ARCH, *none, "--data", "digits", "--out", out, "--image-size", "20"], "finetune",
         ["--image-size 20 does not fit the --arch JSON model", "patch size is 8", "16 and 24", "--image-size 24."]),
        (["finetune", "--arch", "R50ViTB16", *none, "--data", "digits", "--out", out, "--image-size", "100x224"],
         "finetune", ["--image-size 100x224 does not fit R50ViTB16", "ResNet of stride 16", "multiple of 16",
                      "height 100 -> 96 and 112", "--image-size 96x224."]),
        (["fewshot", "--arch", "ViTS32", *none, "--data", "digits", "--out", out, "--image-size", "8"], "fewshot",
         ["--image-size 8 does not fit ViTS32", "patch size is 32", "nearest size it takes is 32"]),
        (["evaluate", "--preset", "ViTB16.augreg2_in21k_ft_in1k", "--data", "digits", "--out", out, "--image-size",
          "30"], "evaluate", ["--image-size 30 does not fit ViTB16.augreg2_in21k_ft_in1k", "16 and 32"]),
        (["explain", *none, "--out", out, "--image-size", "30"], "explain",  # the default --arch ViTB16
         ["--image-size 30 does not fit ViTB16", "patch size is 16"]),
        (["export", "ViTB32.augreg_in21k", out, "--image-size", "100", "224"], "export",
         ["--image-size 100x224 does not fit ViTB32.augreg_in21k (ViTB32)", "patch size is 32", "96 and 128"]),
        (["convert", "ViTB16.augreg_in21k", str(tmp_path / "b.keras"), "--image-size", "30"], "convert",
         ["--image-size 30 does not fit ViTB16.augreg_in21k", "16 and 32"]),
    ]


def _run_folder_and_data_cases(tmp_path):
    """The newer commands' bad --out, --data, split, ObjectNet, VTAB and report inputs: all refused
    before anything loads."""
    out = str(tmp_path / "run")
    afile = tmp_path / "afile"
    afile.write_text("a file\n")
    (tmp_path / "objectnet" / "images" / "not_a_class").mkdir(parents=True)
    (tmp_path / "objectnet_empty" / "images" / "banana").mkdir(parents=True)
    (tmp_path / "no_classes" / "test").mkdir(parents=True)
    (tmp_path / "finetuned").mkdir()
    (tmp_path / "finetuned" / "config.json").write_text(json.dumps({"command": "finetune", "steps": 500}))
    setting = dict(steps=2, learning_rate=0.01, batch_size=4, image_size=16, momentum=0.9, global_clipnorm=1.0,
                   warmup_steps=0, train_split="train800val200", test_split="test", weight_decay=0.0)
    (tmp_path / "vtab_done" / "tasks").mkdir(parents=True)
    (tmp_path / "vtab_done" / "tasks" / "dtd.json").write_text(json.dumps(
        {"task": "vtab/dtd", "group": "natural", "top1": 0.5, "examples": 4, "setting": setting}))
    (tmp_path / "vtab_cut" / "tasks").mkdir(parents=True)
    (tmp_path / "vtab_cut" / "tasks" / "dtd.json").write_text('{"task": "vtab/dtd", "top1": 0.')
    for name, files in {"cut": {"metrics.json": '{"data": "tfds:cifar10", "top1": 0.'},
                        "array": {"metrics.json": "[0.5]"},
                        "text_top1": {"metrics.json": json.dumps({"data": "tfds:cifar10", "top1": "high"})},
                        "vtab_nogroups": {"vtab.json": json.dumps({"tasks": []})},
                        "bad_config": {"metrics.json": json.dumps({"data": "tfds:cifar10", "top1": 0.5}),
                                       "config.json": "{"}}.items():
        (tmp_path / name).mkdir()
        for file, text in files.items():
            (tmp_path / name / file).write_text(text)
    weights = ["--weights", str(tmp_path / "model.keras")]
    evaluate = ["evaluate", *weights, "--out", out]
    tiny = ["--arch", TINY_ARCH, "--weights", "none"]
    vtab = ["vtab", *tiny, "--tasks", "dtd", "--steps", "2", "--batch-size", "4", "--image-size", "16"]
    file_out = ["is a file, not a folder", "pass a folder path"]
    return [
        (["evaluate", *weights, "--data", "digits", "--out", str(afile)], "evaluate", ["argument --out: ", *file_out]),
        (["evaluate", *weights, "--data", "digits", "--out", str(afile / "sub")], "evaluate",
         ["argument --out: ", "cannot be made", "afile' is a file"]),
        (["fewshot", *weights, "--data", "digits", "--out", str(afile)], "fewshot", ["argument --out: ", *file_out]),
        (["finetune", *tiny, "--data", "digits", "--out", str(afile)], "finetune", ["argument --out: ", *file_out]),
        (["explain", *tiny, "--out", str(afile)], "explain", ["argument --out: ", *file_out]),
        (["report", str(tmp_path / "cut"), "--out", str(afile)], "report", ["argument --out: ", *file_out]),
        (vtab + ["--out", str(afile)], "vtab", ["argument --out: ", *file_out]),
        (evaluate + ["--data", str(tmp_path / "no_such_data")], "evaluate",
         ["--data '", "no_such_data' does not exist", "image folder", "tfds:NAME"]),
        (evaluate + ["--data", str(afile)], "evaluate", ["afile' is a file: pass an image folder"]),
        (evaluate + ["--data", str(tmp_path / "no_classes")], "evaluate",
         ["--split 'test' of --data", "has no class sub-folders", "<class name>"]),
        (evaluate + ["--data", "tfds:"], "evaluate", ["--data tfds: needs a dataset name", "tfds:cifar100"]),
        (evaluate + ["--data", "digits", "--split", "validation"], "evaluate",
         ["--split 'validation' of --data digits", "'train' and 'test'"]),
        (evaluate + ["--data", "tfds:imagenet2012_real", "--split", "train"], "evaluate",
         ["--split 'train' of --data tfds:imagenet2012_real", "test, validation"]),
        (evaluate + ["--data", "tfds:vtab/dtdd"], "evaluate", ["Unknown VTAB-1k task 'vtab/dtdd'", "vtab/dtd"]),
        (evaluate + ["--data", "objectnet:" + str(tmp_path / "no_objectnet")], "evaluate",
         ["no_objectnet' does not exist", "objectnet.dev"]),
        (evaluate + ["--data", "objectnet:"], "evaluate", ["needs the ObjectNet folder after the colon"]),
        (evaluate + ["--data", "objectnet:" + str(tmp_path / "objectnet")], "evaluate",
         ["none of ObjectNet's 113 classes", "not_a_class"]),
        (evaluate + ["--data", "objectnet:" + str(tmp_path / "objectnet_empty")], "evaluate", ["hold no images"]),
        (["evaluate", *weights, "--data", "digits", "--out", str(tmp_path / "finetuned")], "evaluate",
         ["holds a `keras-vit finetune` run", "another folder", "finetuned/evaluate"]),
        (["fewshot", *weights, "--data", "digits", "--test-split", "val", "--out", out], "fewshot",
         ["--test-split 'val' of --data digits"]),
        (vtab + ["--micro-batch-size", "3", "--out", out], "vtab",
         ["--micro-batch-size 3 does not divide --batch-size 4", "e.g. 2 or 1"]),
        (["vtab", *tiny, "--tasks", "dtd", "--steps", "3", "--batch-size", "4", "--image-size", "16", "--out",
          str(tmp_path / "vtab_done")],
         "vtab", ["holds vtab/dtd results of another setting: --steps 2 (now 3)", "another --out folder"]),
        (vtab + ["--data-dir", str(tmp_path / "no_tfds"), "--out", out], "vtab",
         ["--data-dir", "no_tfds does not exist", "tfds build NAME --data_dir DIR"]),
        (evaluate + ["--data", "tfds:cifar10", "--data-dir", str(afile)], "evaluate", ["afile is a file"]),
        (vtab + ["--out", str(tmp_path / "vtab_cut")], "vtab", ["dtd.json is not valid JSON", "delete it"]),
        (["report", str(tmp_path / "cut")], "report", ["cut/metrics.json is not valid JSON", "keras-vit evaluate"]),
        (["report", str(tmp_path / "array")], "report", ["array/metrics.json holds an array, not a JSON object"]),
        (["report", str(tmp_path / "text_top1")], "report", ["holds top1='high', not a number"]),
        (["report", str(tmp_path / "vtab_nogroups")], "report",
         ["vtab.json has no groups.all entry", "keras-vit vtab"]),
        (["report", str(tmp_path / "bad_config")], "report", ["bad_config/config.json is not valid JSON"]),
        (["report", str(afile)], "report", ["afile' is a file, not a run folder"]),
    ]


def test_help_shows_the_defaults():
    """Every option with a default says it in `keras-vit COMMAND --help`."""
    from keras_vit import cli

    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(commands) == set(cli.COMMANDS)
    for name, command in commands.items():
        text = " ".join(command.format_help().split())
        for action in command._actions:
            if not action.option_strings or action.default is None or action.default is False:
                continue
            if action.default == argparse.SUPPRESS:
                continue
            shown = f"default: {action.default if not isinstance(action.default, tuple) else action.default}"
            assert shown in text or "default" in (action.help or "").lower(), (name, action.option_strings)
    text = " ".join(commands["finetune"].format_help().split())
    for fragment in ("--steps STEPS optimizer updates (paper: CIFAR 10k, Pets 500) (default: 500)",
                     "(default: 0.003)", "--seed SEED seed of the initialisation and the data (default: 0)",
                     "(default: 64)", "(default: skip)"):
        assert fragment in text, fragment
    assert "(default: 1,5,10,25)" in " ".join(commands["fewshot"].format_help().split())


# === Errors found while loading (Keras loads, on JAX) ===


def test_unreadable_sources(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    dst = str(tmp_path / "out.keras")
    missing, empty, notes = keras_vit_commands(
        ["convert", str(tmp_path / "missing.npz"), dst],
        ["convert", str(tmp_path / "empty"), dst],
        ["convert", str(tmp_path / "notes.txt"), dst],
        env={"KERAS_BACKEND": "jax"},
    )
    line = assert_user_error(missing, "convert", "No checkpoint at", "missing.npz", "a preset name")
    assert "weights" not in line.split("error:", 1)[1]  # convert has no --weights option to advise
    assert_user_error(empty, "convert", "holds no checkpoint")
    assert_user_error(notes, "convert", "Unknown checkpoint format", "notes.txt")
    assert not os.path.exists(dst)


OFFLINE_CASES = {
    "finetune": ["--arch", "ViTTi16", "--weights", "augreg_in21k", "--data", "digits", "--steps", "2"],
    "evaluate": ["--weights", "ViTTi16.augreg_in21k_ft_in1k", "--data", "digits"],
    "fewshot": ["--arch", "ViTTi16", "--weights", "augreg_in21k", "--data", "digits"],
    "explain": ["--arch", "ViTTi16", "--weights", "augreg_in21k", "sample:grace_hopper"],
    "preset": ["--preset", "ViTTi16.augreg_in21k", "--data", "digits", "--steps", "2"],
}


def test_offline_without_cache(tmp_path):
    env = {
        "KERAS_BACKEND": "jax",
        "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_CACHE": str(tmp_path / "hf" / "hub"),
        "KERAS_VIT_CACHE": str(tmp_path / "keras_vit"),
    }
    commands = {case: ["finetune" if case == "preset" else case, *argv, "--out", str(tmp_path / case)]
                for case, argv in OFFLINE_CASES.items()}
    commands["convert"] = ["convert", "ViTTi16.augreg_in21k", str(tmp_path / "a.keras")]
    commands["convert_hf"] = ["convert", "hf://timm/vit_tiny_patch16_224.augreg_in21k", str(tmp_path / "b.keras")]
    results = keras_vit_commands(*commands.values(), env=env)
    for (case, argv), result in zip(commands.items(), results):
        line = assert_user_error(result, argv[0], "HF_HUB_OFFLINE=1", "Download it once while online")
        assert "weights=None" not in line, (case, line)
        # --weights none is the way out for the commands that have the option; convert has not.
        assert ("--weights none" in line) == (argv[0] != "convert"), (case, line)
    assert not set(os.listdir(tmp_path)) & {*commands, "a.keras", "b.keras"}  # no run folder, no output


_BEFORE_ANY_BACKEND = """
import sys
sys.argv[0] = "keras-vit"  # as the console script starts: keras_vit imports lazily
from keras_vit.cli import main
status = main(sys.argv[1:])
print("STATUS", status, "LOADED", sorted(m for m in ("keras", "tensorflow", "jax", "torch") if m in sys.modules))
"""


@pytest.mark.parametrize("argv", [
    ["finetune", "--arch", "ViTTi16", "--weights", "augreg_in21k", "--data", "digits"],
    ["evaluate", "--weights", "/no/such/run", "--data", "digits"],
    ["fewshot", "--preset", "ViTTi16.no_such_tag", "--data", "digits"],
    ["explain", "--weights", "hf://timm/vit_tiny_patch16_224.augreg_in21k", "sample:grace_hopper"],
])
def test_weights_that_cannot_load_fail_before_any_backend_loads(argv, tmp_path):
    """--weights is resolved first (keras_vit.loading needs no Keras): a missing file, an
    unknown preset or an offline download fails before Keras, TensorFlow, JAX or PyTorch load."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"),
               KERAS_VIT_CACHE=str(tmp_path / "kv"))
    out = subprocess.run([sys.executable, "-c", _BEFORE_ANY_BACKEND, *argv, "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "STATUS 2 LOADED []", (out.stdout, out.stderr[-2000:])
    assert out.stderr.strip().splitlines()[-1].startswith(f"keras-vit {argv[0]}: error: ")


#: What TensorFlow, absl and CUDA print as they start (C++ log lines: I/W/E, date, time, thread).
_START_UP_NOISE = re.compile(r"absl::InitializeLog|port\.cc|cudart_stub|cuda_\w+\.cc|cpu_feature_guard|oneDNN|"
                             r"^[IWEF]\d{4} \d\d:\d\d:\d\d", re.MULTILINE)


def test_evaluate_prints_no_backend_start_up_lines_on_jax(tmp_path):
    """evaluate on JAX (fewshot reads its data the same way): the data pipeline imports TensorFlow
    after JAX's compilation cache has looked it up, and its start-up lines are not shown.
    (explain and convert import no TensorFlow on JAX.)"""
    import keras_vit as kv

    weights = str(tmp_path / "tiny.keras")
    kv.VisionTransformer(image_size=16, patch_size=8, hidden_size=16, num_layers=1, num_heads=2, mlp_dim=16,
                         classes=10).save(weights)
    status, _, stderr = keras_vit_command("evaluate", "--weights", weights, "--data", "digits", "--split", "test[:50]",
                                          "--out", str(tmp_path / "evaluate"),
                                          env={"KERAS_BACKEND": "jax", "KERAS_VIT_CACHE": str(tmp_path / "cache")})
    assert status == 0, stderr[-3000:]
    assert not _START_UP_NOISE.search(stderr), stderr[-3000:]


# === What used to fail and now works ===


def test_explain_accepts_weights_none_at_height_x_width(tmp_path, capsys):
    out = tmp_path / "explain"
    with pytest.warns(UserWarning, match="randomly initialised"):
        status = main(["explain", "sample:grace_hopper", "--weights", "none", "--arch", TINY_ARCH,
                       "--image-size", "32x48", "--components", "4", "--out", str(out)])
    assert status == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["grid_size"] == [4, 6] and summary["image_size"] == [32, 48]


def test_evaluate_takes_height_x_width(tmp_path, capsys):
    import keras_vit as kv

    model = kv.VisionTransformer(image_size=(16, 24), patch_size=8, hidden_size=16, num_layers=1, num_heads=2,
                                 mlp_dim=16, classes=10)
    model.save(tmp_path / "m.keras")
    args = ["evaluate", "--weights", str(tmp_path / "m.keras"), "--data", "digits", "--verbose", "0"]
    assert main(args + ["--image-size", "16x24", "--out", str(tmp_path / "ok")]) == 0
    assert json.loads((tmp_path / "ok" / "config.json").read_text())["image_size"] == [16, 24]
    capsys.readouterr()
    assert main(args + ["--image-size", "24x16", "--out", str(tmp_path / "swapped")]) == 2
    assert "The model runs at 16x24, not --image-size 24x16" in capsys.readouterr().err
    assert not (tmp_path / "swapped").exists()


def test_failed_run_leaves_no_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    arch = json.dumps(dict(json.loads(TINY_ARCH), num_heads=3))  # found when the model is built, after the data
    status = main(["finetune", "--arch", arch, "--weights", "none", "--image-size", "16", "--data", "digits",
                   "--steps", "2", "--out", str(out)])
    assert status == 2 and "hidden_size 16 is not divisible by num_heads 3" in capsys.readouterr().err
    assert not out.exists()


def test_performance_is_reachable_after_import():
    assert keras_vit.performance.recommended_jit_compile() in (True, False, "auto")


def test_a_remote_data_dir_is_accepted_as_finetune_accepts_it(tmp_path):
    """evaluate, vtab and fewshot check --data-dir before loading; a gs:// (or other remote) URL is
    tensorflow-datasets' to read, not a local folder that does not exist."""
    from keras_vit.commands import checks

    for url in ("gs://bucket/tensorflow_datasets", "s3://bucket/tfds"):
        checks.check_data_dir(url)
        checks.check_data_args("tfds:cifar10", {"--split": "test"}, url)
    with pytest.raises(ValueError, match="no_tfds does not exist"):
        checks.check_data_dir(str(tmp_path / "no_tfds"))
    with pytest.raises(ValueError, match="gs:/bucket does not exist"):  # not a URL: one slash
        checks.check_data_dir("gs:/bucket")


def test_convert_help_lists_every_format_it_writes(capsys):
    from keras_vit.commands.convert import _npz_writers

    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    to = text[text.index("--to FORMAT the format"):text.index("--force overwrite")]
    for name in ("keras", "keras_preset", *_npz_writers()):
        assert re.search(rf"\b{name}\b", to), (name, to)
