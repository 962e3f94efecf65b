"""How keras_vit models compile by default: JAX's persistent compilation cache, and no XLA for
TensorFlow on CPU until the user compiles.

JAX's persistent compilation cache
----------------------------------

On the JAX backend the first `predict` (or `fit`, `evaluate`) of a model traces it and compiles
it with XLA; for a ViT-L/16 the compilation is a large share of the time to the first logits.
JAX can keep compiled programs on disk and reuse them in later processes. keras_vit turns that
on when it builds or loads a model, in `<keras_vit cache>/xla` ($KERAS_VIT_CACHE/xla, else
~/.cache/keras_vit/xla), for every program however quickly it compiled (a ViT-L/16's `predict`
compiles in 0.7 s on a 2-core CPU, under JAX's default threshold of one second; the entries are
small, a few hundred KB for that model), unless:

- the JAX compilation cache is already configured (`jax_compilation_cache_dir` is set), or
- KERAS_VIT_COMPILATION_CACHE=0 is set in the environment.

A damaged cache entry is not fatal: JAX warns and compiles again.

TensorFlow on CPU
-----------------
Keras compiles `predict`, `evaluate` and `fit` with XLA on TensorFlow unless told otherwise
(`jit_compile="auto"`). On CPU, TensorFlow's own graph kernels (oneDNN) run ViTs faster than
XLA:CPU (benchmarks/README.md) and skip a compilation that costs seconds for a large model, so a
new keras_vit model starts with `jit_compile=False` there, as
`keras_vit.performance.recommended_jit_compile()` advises. `model.compile(jit_compile=...)`
decides as usual.
"""

import os

_DONE = False


def configure_model(model):
    """Apply the defaults above to a newly built keras_vit model."""
    enable_persistent_cache()
    import keras

    if keras.backend.backend() == "tensorflow":
        from keras_vit.performance import recommended_jit_compile

        if recommended_jit_compile(backend="tensorflow") is False:
            model.jit_compile = False


def enable_persistent_cache():
    """Turn on JAX's persistent compilation cache (see the module docstring); idempotent."""
    global _DONE
    if _DONE:
        return
    _DONE = True
    import keras

    if keras.backend.backend() == "jax":
        use_persistent_cache()


def use_persistent_cache():
    """Keep this process's JAX programs in `<keras_vit cache>/xla`, whatever the Keras backend (a
    TensorFlow or PyTorch process that also runs JAX code), under the module docstring's rules."""
    if os.environ.get("KERAS_VIT_COMPILATION_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    import jax

    if jax.config.jax_compilation_cache_dir:
        return
    from keras_vit.hub import cache_dir

    path = os.path.join(cache_dir(), "xla")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return  # a read-only home: compile as usual
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
