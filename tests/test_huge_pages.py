"""keras_vit.huge_pages: which environment turns glibc's huge pages on, that it cuts the page
faults of large blocks, and that a command restarts itself under it (in child processes, since
glibc reads its tunables when a process starts)."""

import os
import subprocess
import sys
import textwrap

import pytest

from keras_vit import huge_pages

pytestmark = pytest.mark.backend_independent

#: The tunable helps on this machine: glibc 2.35 or later, transparent huge pages on `madvise`.
APPLIES = bool(huge_pages.huge_pages_environment(environ={}))
needs_madvise = pytest.mark.skipif(
    not APPLIES,
    reason=f"glibc {huge_pages.glibc_version()}, transparent huge pages "
    f"{huge_pages.transparent_huge_page_mode()!r}: the tunable changes nothing here",
)


def test_the_environment_adds_the_tunable_only_where_it_changes_something():
    env = huge_pages.huge_pages_environment
    assert env({}, libc=(2, 36), thp_mode="madvise") == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    # the user's other tunables are kept, in front
    assert env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, libc=(2, 35), thp_mode="madvise") == {
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    }
    assert env({}, libc=(2, 34), thp_mode="madvise") == {}  # the tunable came in glibc 2.35
    assert env({}, libc=None, thp_mode="madvise") == {}  # not glibc
    assert env({}, libc=(3, 0), thp_mode="madvise") != {}
    for mode in ("always", "never", None):
        assert env({}, libc=(2, 36), thp_mode=mode) == {}
    assert env({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, libc=(2, 36), thp_mode="madvise") == {}  # the user's
    assert env({"KERAS_VIT_HUGE_PAGES": "0"}, libc=(2, 36), thp_mode="madvise") == {}


def test_the_kernel_mode_is_read_from_its_bracket(tmp_path):
    path = tmp_path / "enabled"
    path.write_text("always [madvise] never\n")
    assert huge_pages.transparent_huge_page_mode(str(path)) == "madvise"
    path.write_text("[always] madvise never\n")
    assert huge_pages.transparent_huge_page_mode(str(path)) == "always"
    assert huge_pages.transparent_huge_page_mode(str(tmp_path / "missing")) is None


def _child(code, extra_env=None, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "KERAS_VIT_HUGE_PAGES")}
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, *kwargs.pop("args", ["-c", code])], env=env, capture_output=True, text=True, timeout=120,
        **kwargs,
    )


@needs_madvise
def test_huge_pages_cut_the_page_faults_of_large_blocks():
    """A 64 MiB block malloc'd, written and freed five times: 16,384 page faults each time with
    4 KiB pages, a few dozen with the tunable (2 MiB pages)."""
    code = textwrap.dedent(
        """
        import ctypes, resource
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        size = 64 << 20
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            block = libc.malloc(size)
            ctypes.memset(block, 1, size)
            libc.free(block)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        """
    )
    plain = int(_child(code).stdout)
    huge = int(_child(code, huge_pages.huge_pages_environment(environ={})).stdout)
    assert plain >= 5 * 16384 * 0.9, plain
    assert huge <= plain / 20, (huge, plain)


RESTARTING = textwrap.dedent(
    """
    import importlib.util, os, sys
    spec = importlib.util.spec_from_file_location("huge_pages", os.environ["HUGE_PAGES_PY"])
    huge_pages = importlib.util.module_from_spec(spec)  # the module alone: no Keras to import
    spec.loader.exec_module(huge_pages)
    print("start", huge_pages.started_with_huge_pages(), sys.argv[1:], flush=True)
    print("restarted", huge_pages.restart_with_huge_pages(), flush=True)
    """
)
MODULE_ENV = {"HUGE_PAGES_PY": huge_pages.__file__}


@pytest.mark.parametrize("form", ["script", "module", "code"])
def test_a_command_restarts_itself_once_under_huge_pages(tmp_path, form):
    """The script, `-m module` and `-c code` forms run again from the start with the tunable (and
    their arguments), once; where the tunable changes nothing, they go on without restarting."""
    (tmp_path / "restarting.py").write_text(RESTARTING)
    args = {"script": [str(tmp_path / "restarting.py"), "a", "b"], "module": ["-m", "restarting", "a", "b"],
            "code": ["-c", RESTARTING, "a", "b"]}[form]
    out = _child(None, {**MODULE_ENV, "PYTHONPATH": str(tmp_path)}, args=args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    if APPLIES:
        assert lines == ["start False ['a', 'b']", "start True ['a', 'b']", "restarted False"]
    else:
        assert lines == ["start False ['a', 'b']", "restarted False"]


def test_no_restart_when_turned_off_or_reading_standard_input(tmp_path):
    off = _child(RESTARTING, {**MODULE_ENV, "KERAS_VIT_HUGE_PAGES": "0"})
    assert off.stdout.splitlines() == ["start False []", "restarted False"], off.stderr
    stdin = _child(None, MODULE_ENV, args=["-"], input=RESTARTING)  # nothing to read a second time
    assert stdin.stdout.splitlines() == ["start False []", "restarted False"], stdin.stderr


@needs_madvise
def test_the_keras_vit_commands_that_run_models_restart_under_huge_pages(tmp_path):
    """`keras-vit finetune` (here a script of that name that runs keras_vit.cli) restarts itself
    before it parses its arguments; `keras-vit presets` and a bad command start as they are."""
    env = {"PYTHONPATH": os.path.dirname(os.path.dirname(huge_pages.__file__))}
    # says, in each process, whether it started with huge pages, then runs the command; named as the
    # console script is, so that keras_vit loads as lazily as it does for `keras-vit`
    probe = tmp_path / "keras-vit"
    probe.write_text(
        "import runpy\n"
        "from keras_vit import huge_pages\n"
        "print('huge pages', huge_pages.started_with_huge_pages(), flush=True)\n"
        "runpy.run_module('keras_vit.cli', run_name='__main__')\n"
    )
    finetune = _child(None, env, args=[str(probe), "finetune", "--help"])
    assert finetune.returncode == 0, finetune.stderr
    lines = finetune.stdout.splitlines()
    assert lines[:2] == ["huge pages False", "huge pages True"] and lines[2].startswith("usage: keras-vit finetune"), lines
    bad = _child(None, env, args=[str(probe), "no-such-command"])
    assert bad.stdout.splitlines() == ["huge pages False"], (bad.stdout, bad.stderr)
    assert bad.returncode == 2 and bad.stderr.count("invalid choice") == 1, bad.stderr
