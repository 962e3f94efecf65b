"""JAX's persistent compilation cache, turned on for keras_vit models.

On the JAX backend the first `predict` (or `fit`, `evaluate`) of a model traces it and compiles
it with XLA; for a ViT-L/16 the compilation is a large share of the time to the first logits.
JAX can keep compiled programs on disk and reuse them in later processes. keras_vit turns that
on when it builds or loads a model, in `<keras_vit cache>/xla` ($KERAS_VIT_CACHE/xla, else
~/.cache/keras_vit/xla), for programs that took at least a second to compile, unless:

- the JAX compilation cache is already configured (`jax_compilation_cache_dir` is set), or
- KERAS_VIT_COMPILATION_CACHE=0 is set in the environment.

A damaged cache entry is not fatal: JAX warns and compiles again. Other backends are left as
they are.
"""

import os

_DONE = False


def enable():
    """Turn on JAX's persistent compilation cache (see the module docstring); idempotent."""
    global _DONE
    if _DONE:
        return
    _DONE = True
    if os.environ.get("KERAS_VIT_COMPILATION_CACHE", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    import keras

    if keras.backend.backend() != "jax":
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
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
