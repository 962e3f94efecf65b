"""Speed settings for keras_vit models that depend on the backend and the device.

The choices are measured (benchmarks/README.md): on CPU, TensorFlow runs a graph of oneDNN
kernels faster than its XLA path, and only its oneDNN graph uses the AMX/AVX512-BF16 units for
bfloat16 matmuls (TensorFlow's XLA:CPU dot ran at half oneDNN's AVX512-BF16 rate on an AMD EPYC,
about 10x below its AMX rate on a Sapphire Rapids); JAX always compiles with XLA;
the PyTorch backend is fastest under torch.compile (Keras' `jit_compile=True`): eager Keras
spends ~30 ms of Python per ViT-B/16 call on a 2-core CPU, which compiling removes (ViT-B/16
at batch 1: 0.65x of timm eager, 1.01x compiled). Compiling costs about a minute per input
shape for predict and about 3 minutes for the train step on 2 cores, most of it Dynamo tracing
Keras' Python (a 12-block ViT-Ti's predict: 30 of 36 s); keras_vit models compile their train
step once (Keras alone compiles it again at the second step: ViT-Ti/16 at 32 px took 173 s,
then 84 s more; compiled once, 176 s).
For a handful of calls, `jit_compile=False` finishes first.

On Linux, JAX runs faster with glibc's malloc on transparent huge pages: XLA:CPU maps and unmaps
its temporary buffers on every call, and each call faults in every page anew (a mixed_bfloat16
ViT-B/16 train step: 1.13x faster with them). glibc reads that setting only at start, so
`restart_with_huge_pages()` starts a script again with it (keras_vit.huge_pages); the `keras-vit`
commands that train and evaluate models do so themselves.

    import keras_vit
    model = keras_vit.ViTB16(weights=None)
    model.compile(jit_compile=keras_vit.performance.recommended_jit_compile())
"""

import keras

from keras_vit.huge_pages import huge_pages_environment, restart_with_huge_pages, started_with_huge_pages  # noqa: F401


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


def bfloat16_inference(model):
    """A copy of `model` for bfloat16 inference, its weights stored in bfloat16.

    Under `mixed_bfloat16` a model keeps float32 weights and casts every one of them to bfloat16
    on every call; at batch 1 the casts cost as much as the matmuls. The copy is the same
    architecture built under the "bfloat16" policy, its weights cast once from `model`'s: the
    matmuls read their kernels as stored, while the norms keep float32 scales and statistics
    (`layers.transformer.make_norm`) and the attention its float32 softmax, as under
    `mixed_bfloat16`. Its outputs are the `mixed_bfloat16` model's up to bfloat16 rounding.

    The copy is for inference only: it is not trainable, and it is a snapshot of `model`'s weights
    at the call. After training `model` or loading other weights into it, convert it again.

    Args:
        model: a keras_vit model (a constructor's or `keras_vit.load_checkpoint`'s) with float
            weights (float32, or any policy; not quantized) and no BatchNormalization (ViT, its
            hybrids and BiT; not EfficientNet or the axial models, whose batch statistics would
            be stored in bfloat16).

    Returns:
        A new model of the same class and config, dtype policy "bfloat16", not trainable.

    Example:
        >>> import keras_vit
        >>> model = keras_vit.ViTTi16(weights=None, image_size=32, patch_size=16)  # doctest: +SKIP
        >>> fast = keras_vit.performance.bfloat16_inference(model)  # doctest: +SKIP
        >>> fast.compile(jit_compile=keras_vit.performance.recommended_jit_compile())  # doctest: +SKIP
        >>> fast.predict_on_batch(images)  # doctest: +SKIP
    """
    from keras import ops

    if not (hasattr(model, "config") and hasattr(type(model), "from_config") and hasattr(model, "get_config")):
        raise TypeError(
            f"bfloat16_inference converts keras_vit models (from keras_vit's constructors or "
            f"keras_vit.load_checkpoint); got {type(model).__name__}. For another Keras model, build it under "
            "keras.config.set_dtype_policy('bfloat16') and set its weights."
        )
    quantized = sorted({layer.quantization_mode for layer in model._flatten_layers() if layer.quantization_mode})
    if quantized:
        raise ValueError(
            f"bfloat16_inference needs float weights; {model.name} is quantized ({', '.join(quantized)}). Convert the "
            "float model before quantizing it, or run the quantized model as it is."
        )
    batch_norms = [layer.name for layer in model._flatten_layers() if isinstance(layer, keras.layers.BatchNormalization)]
    if batch_norms:
        raise ValueError(
            f"bfloat16_inference keeps float32 norms where keras_vit builds them (ViT and its hybrids, BiT); "
            f"{model.name} has BatchNormalization layers ({', '.join(batch_norms[:3])}, ...), whose statistics "
            "would be stored in bfloat16. Run it under keras.config.set_dtype_policy('mixed_bfloat16') instead."
        )
    copy = type(model).from_config({**model.get_config(), "dtype": "bfloat16"})
    if len(copy.weights) != len(model.weights):
        raise ValueError(
            f"bfloat16_inference: the copy of {model.name} has {len(copy.weights)} weights and the model "
            f"{len(model.weights)}; the model was changed after it was built (layers added or removed). Build it "
            "again from its config and load its weights, then convert."
        )
    for source, target in zip(model.weights, copy.weights):
        if tuple(source.shape) != tuple(target.shape) or source.name != target.name:
            raise ValueError(
                f"bfloat16_inference: weight {source.path} {tuple(source.shape)} has no counterpart in the copy "
                f"(found {target.path} {tuple(target.shape)}); build the model again from its config, then convert."
            )
        value = source.value
        # A copy of its own where no cast makes one: JAX's predict step donates variable buffers.
        target.assign(ops.copy(value) if source.dtype == target.dtype else ops.cast(value, target.dtype))
    copy.trainable = False
    return copy


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
