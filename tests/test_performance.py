"""keras_vit.performance: the per-backend compile setting the benchmarks measured fastest on CPU."""

import keras
import numpy as np
import pytest

import keras_vit.performance as perf


def test_recommended_jit_compile_on_cpu():
    expected = {"jax": True, "tensorflow": False, "torch": False}
    assert perf.recommended_jit_compile() == expected.get(keras.backend.backend(), "auto")
    assert perf.recommended_jit_compile(backend="jax") is True
    assert perf.recommended_jit_compile(dtype_policy="mixed_bfloat16") == perf.recommended_jit_compile()


def test_configure_without_threads_changes_nothing():
    assert perf.configure() == {"threads": None, "backend": keras.backend.backend()}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layers_matmul_is_keras_matmul_with_float32_accumulation(dtype):
    """layers.matmul (bfloat16 on JAX's CPU: float32 product asked for, rounded once) returns
    the dtype keras.ops.matmul returns, and the float32 product of the operands rounded to
    `dtype` -- NumPy float64 here, so at most one rounding step away."""
    from keras_vit.layers.matmul import matmul

    rng = np.random.default_rng(0)
    a = keras.ops.cast(rng.normal(size=(37, 768)).astype("float32"), dtype)
    b = keras.ops.cast(rng.normal(size=(768, 29)).astype("float32"), dtype)
    out = matmul(a, b)
    assert keras.backend.standardize_dtype(out.dtype) == keras.backend.standardize_dtype(keras.ops.matmul(a, b).dtype)
    exact = keras.ops.convert_to_numpy(keras.ops.cast(a, "float32")).astype("float64") @ keras.ops.convert_to_numpy(
        keras.ops.cast(b, "float32")
    ).astype("float64")
    got = keras.ops.convert_to_numpy(keras.ops.cast(out, "float32")).astype("float64")
    # One final rounding (half an ulp: at most 2**-8 relative for bfloat16, 8 significant bits; 2**-24
    # for float32) plus float32 accumulation error (768 terms of size ~1: well below 1e-3).
    rounding = 2.0**-8 if dtype == "bfloat16" else 2.0**-24
    assert np.all(np.abs(got - exact) <= rounding * np.abs(exact) + 1e-3)
