"""keras_vit.performance: the per-backend compile setting the benchmarks measured fastest on CPU."""

import keras

import keras_vit.performance as perf


def test_recommended_jit_compile_on_cpu():
    expected = {"jax": True, "tensorflow": False, "torch": False}
    assert perf.recommended_jit_compile() == expected.get(keras.backend.backend(), "auto")
    assert perf.recommended_jit_compile(backend="jax") is True
    assert perf.recommended_jit_compile(dtype_policy="mixed_bfloat16") == perf.recommended_jit_compile()


def test_configure_without_threads_changes_nothing():
    assert perf.configure() == {"threads": None, "backend": keras.backend.backend()}
