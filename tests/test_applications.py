"""The programs in applications/ run on tiny data (each one run by a test)."""

import os
import runpy

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _program(name):
    return runpy.run_path(os.path.join(ROOT, "applications", name), run_name="applications_test")


@pytest.mark.slow
def test_finetune_then_fewshot_programs(tmp_path, capsys):
    saved = str(tmp_path / "model.keras")
    accuracy = _program("finetune_cifar.py")["main"](
        ["--steps", "6", "--batch-size", "16", "--image-size", "16", "--save", saved]
    )
    assert 0 <= accuracy <= 1 and os.path.isfile(saved)
    assert "shapes test accuracy: " in capsys.readouterr().out
    # Few-shot on another dataset (digits) from the saved model's frozen features.
    results = _program("fewshot_eval.py")["main"](
        ["--weights", saved, "--data", "digits", "--shots", "1,2", "--max-images", "120"]
    )
    assert set(results) == {1, 2} and all(0 <= v <= 1 for v in results.values())
    assert "digits: 2-shot linear accuracy" in capsys.readouterr().out
