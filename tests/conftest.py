"""Shared test set-up: quiet backends, tiny configs, a fresh-process runner."""

import gc
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "jax")
# The suite compiles about 5,000 small JAX programs and runs most of them a few times, so XLA's
# machine-code optimisation (LLVM -O2 and its expensive passes) costs more than it saves: with an
# empty compilation cache, four model modules in one process took 93 s instead of 137 s (a quiet
# 2-core AMD EPYC), and the JAX pass 747-796 s instead of 889 s. The HLO passes (fusion,
# simplification) still run, and tests that train for a minute turn the optimisation back on
# (marker `optimized_xla`). Set before JAX is imported, and inherited by the fresh processes tests
# start; JAX_DISABLE_MOST_OPTIMIZATIONS=0 runs the suite optimised.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# `make test` runs as many pytest-xdist workers as there are cores, each busy: a worker whose
# OpenMP runtime (PyTorch's kernels, oneDNN in TensorFlow, timm's references on every pass) also
# starts one thread per core spins against the other worker for the same cores. One OpenMP thread
# per worker: on a 2-core AMD EPYC, seven PyTorch-pass modules took 29-30 s instead of 47-61 s,
# six JAX-pass modules 42 s instead of 44-45 s, six TensorFlow-pass modules 83 s instead of 85 s
# (-n 2). Inherited by the fresh processes tests start; OMP_NUM_THREADS set outside wins.
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) >= _CORES:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

#: The suite's Keras backend (Keras reads KERAS_BACKEND first, and it is always set above).
BACKEND = os.environ["KERAS_BACKEND"]


def _import_the_libraries():
    """The references of the parity tests and the backends, imported once per test process.

    timm crashes when it is imported after TensorFlow, so it goes first; TensorFlow's tf.data
    serves the data, training and export tests on every backend.

    Every test starts with keras.utils.clear_session() and a garbage collection. A full collection
    traverses every object the process tracks: the imported libraries' few hundred thousand and
    whatever earlier tests left alive (JAX's and TensorFlow's caches, module fixtures), 0.2-1 s
    per test late in a pass. So the survivors of each collection are frozen (gc.freeze) and the
    next test's collection traverses only what was made since; the objects of the libraries are
    frozen here, once. Frozen objects are still freed when their last reference goes, but a frozen
    cycle is only collected after gc.unfreeze(), in a full collection (0.5-1 s: it traverses the
    libraries' objects too). That happens when a new module starts (fixture
    `_collect_the_last_module`): on TensorFlow always, on JAX and PyTorch once the process has
    grown by FULL_COLLECTION_GROWTH since the last full collection, so that the cycles earlier
    modules left (their fixtures' models and artefacts) never hold more than that.
    """
    try:
        import timm  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        pass
    import keras
    import tensorflow  # noqa: F401

    import keras_vit  # noqa: F401
    from keras_vit.compilation import enable_persistent_cache

    assert keras.backend.backend() == BACKEND, (keras.backend.backend(), BACKEND)
    # keras_vit turns JAX's persistent compilation cache on when it first builds a model, in the
    # cache folder of that moment: decided here, so that no test's temporary KERAS_VIT_CACHE
    # (tests of the cache folders themselves) becomes the folder of every later test.
    enable_persistent_cache()
    if BACKEND != "jax":
        _read_the_jax_pass_compilations()
    gc.collect()
    gc.freeze()


def _read_the_jax_pass_compilations():
    """The optax references of the training tests are pure JAX whatever the backend; on TensorFlow
    and PyTorch they read the compilations the JAX pass left in keras_vit's persistent cache
    instead of compiling them again (the two references of test_finetune_tools: 10.5 -> 1.8 s CPU
    on TensorFlow, loaded 2-core EPYC). The cache holds what XLA compiled from the same programs."""
    import importlib.util

    if importlib.util.find_spec("jax") is not None:
        from keras_vit.compilation import use_persistent_cache

        use_persistent_cache()


# A tiny token model and a tiny hybrid: fast enough for logic tests on every backend.
TINY = dict(image_size=32, patch_size=8, hidden_size=24, num_layers=2, num_heads=3, mlp_dim=48, classes=7)
TINY_HYBRID = dict(
    image_size=64, patch_size=1, hidden_size=24, num_layers=2, num_heads=2, mlp_dim=32, classes=5,
    resnet=((1, 1), 0.5),
)


def rel_err(a, b):
    """Largest absolute difference relative to the largest magnitude of the reference `b`."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / np.abs(b).max()


#: The backend that runs the tests marked `backend_independent` (make test runs every backend).
INDEPENDENT_BACKEND = "jax"


def _is_xdist_controller(config):
    """True in the process that only hands tests to pytest-xdist's workers (it imports no test
    module, so it needs none of the libraries)."""
    return (not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))
            and not config.option.collectonly)


def pytest_configure(config):
    if not _is_xdist_controller(config):
        _import_the_libraries()
    config.addinivalue_line(
        "markers",
        "optimized_xla: trains long enough that XLA's full machine-code optimisation pays for its compile "
        "time (JAX programs compiled in the test process)",
    )
    config.addinivalue_line(
        "markers",
        "backend_independent: logic that no Keras backend changes (Hub protocol, preset table, CLI "
        f"errors, docs); run once, on the {INDEPENDENT_BACKEND} backend",
    )


#: The longest test modules of each pass, longest first (measured in that pass). A module is the
#: unit the two xdist workers take turns on (--dist loadfile); the longest start first so that the
#: workers finish together, with the many short modules filling in at the end. The JAX pass also
#: runs the modules that run on one backend only (backend_independent, the JAX SPMD and
#: multi-process ones); on PyTorch torch.compile (test_performance) and the exports (a TensorFlow
#: process per module) weigh most. Each order is a measured pass (-n 2, --durations=0, summed per module).
LONG_MODULES = {
    "jax": ("test_demo", "test_docs", "test_cache_faults", "test_multihost_finetune", "test_applications",
            "test_distribution_jax", "test_cli_families", "test_model_contract", "test_vtab", "test_bit",
            "test_export", "test_export_families", "test_resume", "test_timm_zoo_entry_points", "test_cli_errors",
            "test_hub", "test_efficientnet", "test_saving_precision", "test_loading", "test_transfer", "test_models",
            "test_remat", "test_checkpoints", "test_quantize", "test_timm_eva", "test_timm_beit_eva_presets",
            "test_hostile_files", "test_training_fit", "test_hub_pytorch_bin", "test_axial_resnet",
            "test_recipes_optax", "test_finetune_tools"),
    "tensorflow": ("test_saving_precision", "test_export", "test_export_families", "test_transfer",
                   "test_distribution_tf", "test_training_fit", "test_resume", "test_timm_eva",
                   "test_model_variants", "test_applications", "test_demo", "test_models", "test_bit",
                   "test_timm_zoo", "test_dynamic_size", "test_quantize", "test_checkpoints", "test_recipes_optax",
                   "test_analysis", "test_finetune_tools", "test_model_contract", "test_cli_train",
                   "test_family_configs", "test_cli_checkpoints", "test_axial_vit", "test_efficientnet",
                   "test_evaluation", "test_loading", "test_timm_zoo_entry_points"),
    "torch": ("test_performance", "test_export_families", "test_export", "test_quantize", "test_saving_precision",
              "test_demo", "test_cli_train", "test_torch_zip_tampered", "test_analysis", "test_evaluation",
              "test_cli_checkpoints", "test_model_contract", "test_recipes_optax", "test_checkpoints", "test_bit",
              "test_training_fit", "test_timm_zoo"),
}


def pytest_collection_modifyitems(config, items):
    # `make test` distributes whole modules (--dist loadfile): a module's fixtures are built once
    # per pass, in one worker, and the modules start in the order sorted here.
    if BACKEND != INDEPENDENT_BACKEND:
        kept = [item for item in items if item.get_closest_marker("backend_independent") is None]
        deselected = [item for item in items if item.get_closest_marker("backend_independent") is not None]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = kept
    order = LONG_MODULES.get(BACKEND, LONG_MODULES["tensorflow"])
    rank = {name: i for i, name in enumerate(order)}
    # A stable sort: each module's tests stay together and in order.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py"),
                                         len(rank)))


def _collect(everything=False):
    if everything:  # one full collection (0.5-1 s), then everything alive is frozen again
        gc.unfreeze()
    gc.collect()
    gc.freeze()


#: The growth of the test process (resident memory) that makes the next module start with a full
#: collection. Most modules leave far less (a few tiny models), and on JAX and PyTorch the full
#: collection is what costs: single-process, 8 modules took 112 s on JAX with one per module, 84 s
#: with this rule; 10 modules 61 -> 57 s on PyTorch. On TensorFlow (None) every module starts with
#: one: there the cycles earlier modules left slow the later ones down (the same 8 modules took
#: 168 s with one per module, 191 s with this rule).
FULL_COLLECTION_GROWTH = None if BACKEND == "tensorflow" else 1 << 30
_resident_after_full_collection = [None]


def _resident_bytes():
    """The process's resident memory (Linux), or None where /proc is not there."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@pytest.fixture(scope="module", autouse=True)
def _collect_the_last_module():
    """Collect what the previous modules left, their fixtures included, frozen or not (on JAX and
    PyTorch once the process has grown by FULL_COLLECTION_GROWTH since the last full collection,
    on TensorFlow always); this module's
    fixtures start from a clean Keras session too (they are built before the first test's reset)."""
    _clean_keras_session()
    resident, last = _resident_bytes(), _resident_after_full_collection[0]
    if FULL_COLLECTION_GROWTH is None or resident is None or last is None or resident - last > FULL_COLLECTION_GROWTH:
        _collect(everything=True)
        _resident_after_full_collection[0] = _resident_bytes()
    else:
        _collect()
    yield


def _clean_keras_session():
    import keras

    keras.config.set_dtype_policy("float32")
    keras.utils.clear_session(free_memory=False)


@pytest.fixture(autouse=True)
def _reset_keras_state():
    """Each test starts from float32 and a clean session (tests change the dtype policy)."""
    import keras

    _clean_keras_session()
    _collect()
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture(autouse=True)
def _xla_optimization(request):
    """JAX compiles a test marked `optimized_xla` with XLA's full optimisation (the suite's default
    leaves the machine code unoptimised: JAX_DISABLE_MOST_OPTIMIZATIONS, set at the top)."""
    if request.node.get_closest_marker("optimized_xla") is None or "jax" not in sys.modules:
        yield
        return
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def randomize(model, seed=0, scale=0.5):
    """Give every weight a random value (zero-initialised heads and norms would hide bugs)."""
    r = np.random.default_rng(seed)
    for v in model.weights:
        v.assign((r.standard_normal(tuple(v.shape)) * scale / max(1.0, np.sqrt(v.shape[0] if v.shape else 1))).astype(v.dtype))
    return model


def count_train_step_traces(monkeypatch, model_class):
    """A list that grows by one each time `model_class.train_step` runs in Python: once per trace
    under tf.function or jax.jit, once per step when eager."""
    traces, traced = [], model_class.train_step
    monkeypatch.setattr(model_class, "train_step", lambda self, *args: traces.append(1) or traced(self, *args))
    return traces


def _is_weight(name):
    return name.endswith("weight")


def randomize_torch_batch_norm(module, seed=0, is_batch_norm_scale=_is_weight):
    """Random weights, BatchNorm scales, shifts and running statistics everywhere in a PyTorch
    `module` (returned in eval mode). A 1-D parameter whose name `is_batch_norm_scale(name)`
    accepts is a BatchNorm scale, drawn around 1; other 1-D parameters (shifts, biases) around 0;
    the rest normal / sqrt(fan in); running means around 0 and running variances in [0.5, 1.5)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim == 1 and is_batch_norm_scale(name):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                fan_in = p[0].numel() if p.ndim > 1 else 1
                p.copy_(torch.randn(p.shape, generator=g) / fan_in**0.5)
        for name, b in module.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
            elif name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return module.eval()


def run_script(code, *argv):
    """Run the script `code` in this process as `python -c code argv...` runs it (sys.argv, a
    namespace of its own named __main__); returns what it printed. For the reference sides that
    need no fresh process (timm and torch, imported here before TensorFlow), without the 5 s a
    Python start-up with torch and timm costs."""
    import contextlib
    import io

    printed, saved = io.StringIO(), sys.argv
    sys.argv = ["-c", *(str(a) for a in argv)]
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "<script>", "exec"), {"__name__": "__main__"})
    finally:
        sys.argv = saved
    return printed.getvalue()


def run_python(code, env=None, timeout=600):
    """Run `code` in a fresh Python process on the current backend; returns stdout."""
    full_env = dict(os.environ, KERAS_BACKEND=BACKEND, **(env or {}))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=timeout
    )
    if out.returncode:
        raise AssertionError(f"subprocess failed ({out.returncode}):\n{out.stdout}\n{out.stderr[-4000:]}")
    return out.stdout


#: The export tests write and check every format (SavedModel, ONNX, LiteRT) in the TensorFlow pass
#: only. On JAX and PyTorch keras_vit.export hands the model to a TensorFlow process that rebuilds it
#: from its .keras file and runs the same writers, so those passes write the ONNX artefacts only,
#: float and int8, with and without preprocessing: they check the hand-off (each backend's weights
#: and predict against an artefact TensorFlow wrote).
ONNX_ONLY_EXPORTS = BACKEND != "tensorflow"


class OneExportProcess:
    """Within `with OneExportProcess():`, the exports that keras_vit.export hands to a TensorFlow
    subprocess (on JAX and PyTorch) are collected, and one subprocess writes them all when the
    block ends: the same checks, .keras files and TensorFlow rebuilds as one process per call, with
    one TensorFlow start-up (3-8 s) and no second import of the exporters for a module's
    exports, whichever entry point asked (`export_many`, `model.export`, `keras-vit export`).
    An artefact exists only after the block; on TensorFlow, where exports run in the test process,
    the block changes nothing."""

    def __enter__(self):
        from keras_vit import export

        self._module, self._real, self.pending = export, export._export_in_subprocess, []
        export._export_in_subprocess = self.pending.extend
        return self

    def __exit__(self, kind, error, traceback):
        self._module._export_in_subprocess = self._real
        if kind is None and self.pending:
            self._real(self.pending)
        return False
