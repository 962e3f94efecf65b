"""Speed settings for keras_vit models that depend on the backend and the device.

The choices are measured (benchmarks/README.md): on CPU, TensorFlow runs a graph of oneDNN
kernels faster than its XLA path, and only its oneDNN graph uses the AMX/AVX512-BF16 units for
bfloat16 matmuls (TensorFlow's XLA:CPU dot ran at half oneDNN's AVX512-BF16 rate on an AMD EPYC,
about 10x below its AMX rate on a Sapphire Rapids); JAX always compiles with XLA;
the PyTorch backend is fastest under torch.compile (Keras' `jit_compile=True`): eager Keras
spends ~30 ms of Python per ViT-B/16 call on a 2-core CPU, which compiling removes (ViT-B/16
at batch 1: 0.65x of timm eager, 1.01x compiled). Compiling costs about a minute per input
shape for predict and about 3 minutes for the train step on 2 cores; for a handful of calls,
`jit_compile=False` finishes first.

    import keras_vit
    model = keras_vit.ViTB16(weights=None)
    model.compile(jit_compile=keras_vit.performance.recommended_jit_compile())
"""

import keras


def _on_cpu(backend):
    try:
        if backend == "tensorflow":
            import tensorflow as tf

            return not tf.config.list_logical_devices("GPU")
        if backend == "jax":
            import jax

            return jax.default_backend() == "cpu"
        if backend == "torch":
            import torch

            return not torch.cuda.is_available()
    except Exception:  # an unusual install: fall back to Keras' own choice
        return False
    return False


def recommended_jit_compile(dtype_policy=None, backend=None):
    """The `jit_compile` for `model.compile(...)` that ran fastest for ViTs on this backend.

    Args:
        dtype_policy: the policy the model runs in (default: the global one); kept so that a
            choice that depends on the precision has one place to live.
        backend: default `keras.backend.backend()`.

    Returns:
        False for TensorFlow on CPU (oneDNN graph kernels; XLA:CPU is slower in float32 and
        much slower in bfloat16), True for JAX, True for PyTorch on CPU (torch.compile: the
        same oneDNN kernels without Keras' per-layer Python; compiling takes about a minute
        per input shape), and "auto" (Keras' own choice) on accelerators (on an H200 the
        compiled PyTorch backend ran at 1.02x eager: Dynamo breaks its graph on Keras'
        internals, so compiling buys nothing there; benchmarks/README.md, "On one GPU").

    Example:
        >>> keras_vit.performance.recommended_jit_compile(backend="jax")
        True
    """
    backend = backend or keras.backend.backend()
    del dtype_policy  # the same choice is best in float32 and mixed_bfloat16 on every backend
    if backend == "jax":
        return True
    if backend == "tensorflow" and _on_cpu(backend):
        return False
    if backend == "torch" and _on_cpu(backend):
        return True
    return "auto"


def configure(threads=None):
    """Pin TensorFlow's and PyTorch's CPU thread pools to `threads` (call before running ops).

    JAX sizes its pool from the CPU affinity mask (use `taskset` to restrict it) or
    `XLA_FLAGS=--xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads=N`, which must be
    set before JAX starts. Returns the settings applied.

    Example:
        >>> keras_vit.performance.configure(threads=2)  # doctest: +SKIP
        {'threads': 2, 'backend': 'jax'}
    """
    import os

    applied = {"threads": threads, "backend": keras.backend.backend()}
    if threads is None:
        return applied
    threads = int(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if keras.backend.backend() == "torch":
        import torch

        torch.set_num_threads(threads)
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(1)
        except RuntimeError:  # TensorFlow already started its pools
            applied["tensorflow"] = "already initialised; set threads before the first op"
    return applied
