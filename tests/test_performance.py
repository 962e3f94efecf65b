"""keras_vit.performance: the per-backend compile setting the benchmarks measured fastest on CPU."""

import keras
import numpy as np
import pytest

import keras_vit.performance as perf


def test_recommended_jit_compile_on_cpu():
    expected = {"jax": True, "tensorflow": False, "torch": True}
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
    if dtype == "bfloat16" and keras.backend.backend() != "jax":
        # Outside JAX, layers.matmul is keras.ops.matmul itself; how a bfloat16 product is
        # accumulated is then the platform kernel's (oneDNN without AVX512-BF16 rounds partial
        # sums to bfloat16), so the promise checked is the identity.
        ref = keras.ops.convert_to_numpy(keras.ops.cast(keras.ops.matmul(a, b), "float32")).astype("float64")
        np.testing.assert_array_equal(got, ref)
        return
    # One final rounding (half an ulp: at most 2**-8 relative for bfloat16, 8 significant bits; 2**-24
    # for float32) plus float32 accumulation error (768 terms of size ~1: well below 1e-3).
    rounding = 2.0**-8 if dtype == "bfloat16" else 2.0**-24
    assert np.all(np.abs(got - exact) <= rounding * np.abs(exact) + 1e-3)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layers_matmul_add_is_product_plus_bias(dtype):
    """layers.matmul_add (torch: one fused addmm) is x @ kernel + bias: the float64 result within
    a rounding step or two (the fused form rounds once, the unfused twice), the dtype of the
    unfused form, and its gradients are those of the unfused form."""
    from keras_vit.layers.matmul import matmul, matmul_add

    rng = np.random.default_rng(1)
    x, k, b = (rng.normal(size=s).astype("float32") for s in ((33, 256), (256, 40), (40,)))
    b = b * 10.0  # a bias large against the product: a dropped or misplaced bias fails
    xs, ks, bs = (keras.ops.cast(v, dtype) for v in (x, k, b))
    out = matmul_add(xs, ks, bs)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    to64 = lambda t: keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")).astype("float64")  # noqa: E731
    product = to64(xs) @ to64(ks)
    exact = product + to64(bs)
    # A rounding of the product and one of the sum (half an ulp each: 2**-9 relative in bfloat16,
    # 2**-24 in float32), doubled for the float32 accumulation over 256 terms.
    rounding = 2.0**-8 if dtype == "bfloat16" else 2.0**-23
    if dtype == "bfloat16" and keras.backend.backend() == "tensorflow":
        # TensorFlow: matmul_add is keras.ops.matmul + bias, whose bfloat16 accumulation is the
        # platform kernel's (see the test above): the identity with the unfused form is checked.
        unfused = keras.ops.matmul(xs, ks) + bs
        np.testing.assert_array_equal(to64(out), to64(unfused))
    else:
        assert np.all(np.abs(to64(out) - exact) <= rounding * (np.abs(product) + np.abs(exact)) + 1e-3)
    with pytest.raises(Exception):
        np.testing.assert_allclose(to64(out), to64(matmul(xs, ks)), atol=1.0)  # the bias is there

    if keras.backend.backend() == "torch" and dtype == "float32":
        import torch

        grads = []
        for fn in (matmul_add, lambda a, w, c: matmul(a, w) + c):
            tx, tk, tb = (torch.tensor(v, requires_grad=True) for v in (x, k, b))
            fn(tx, tk, tb).square().sum().backward()
            grads.append([t.grad.numpy() for t in (tx, tk, tb)])
        for fused, unfused in zip(*grads):
            np.testing.assert_allclose(fused, unfused, rtol=1e-5, atol=1e-4)


def test_recommended_jit_compile_runs_predict_and_fit_as_eager(rng):
    """The recommended compiled predict and train steps (JAX: XLA; TensorFlow: a graph; PyTorch
    on CPU: torch.compile) give the eager model's outputs, loss and updated weights."""
    import keras_vit
    from conftest import TINY, randomize

    x = (rng.normal(size=(4, 32, 32, 3)) * np.array([0.5, 1.0, 2.0, 4.0])[:, None, None, None]).astype("float32")
    y = np.arange(4) % TINY["classes"]
    models = []
    for settings in (dict(run_eagerly=True), dict(jit_compile=perf.recommended_jit_compile())):
        keras.utils.set_random_seed(0)
        # One block: compiling (torch.compile on PyTorch) costs time per block, the check is the same.
        model = randomize(keras_vit.VisionTransformer(**dict(TINY, num_layers=1), classifier_activation=None), seed=3)
        model.compile(
            optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            **settings,
        )
        models.append(model)
    eager, compiled = models
    logits = eager.predict_on_batch(x)
    np.testing.assert_allclose(compiled.predict_on_batch(x), logits, rtol=1e-4, atol=1e-5)
    assert np.abs(logits).max() > 0.1  # random weights: a head that is not zero
    for _ in range(2):
        np.testing.assert_allclose(compiled.train_on_batch(x, y), eager.train_on_batch(x, y), rtol=1e-4)
    for a, b in zip(compiled.weights, eager.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layers_gelu_tanh_form_traced_by_torch_compile(monkeypatch, dtype):
    """PyTorch: the tanh GELU as torch.compile traces it (x * sigmoid(2z), computed in float32)
    is the original's 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in NumPy float64, to the
    output's rounding. JAX, TensorFlow: `gelu` is keras.ops.gelu, both forms."""
    import keras_vit.layers.matmul as m

    x = np.concatenate([np.linspace(-12.0, 12.0, 2001), [-60.0, -0.0, 1e-6, 60.0]]).astype("float32")
    xs = keras.ops.cast(x, dtype)
    as64 = lambda t: keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")).astype("float64")  # noqa: E731
    if keras.backend.backend() != "torch":
        for approximate in (True, False):
            np.testing.assert_array_equal(as64(m.gelu(xs, approximate)), as64(keras.ops.gelu(xs, approximate)))
        return
    monkeypatch.setattr(m, "_torch_compiling", lambda: True)  # the branch dynamo traces, run eagerly
    x64 = as64(xs)
    expected = 0.5 * x64 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3)))
    out = m.gelu(xs, approximate=True)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    rounding = 2.0**-8 if dtype == "bfloat16" else 1e-6
    np.testing.assert_allclose(as64(out), expected, rtol=rounding, atol=1e-6)
    np.testing.assert_array_equal(as64(m.gelu(xs, False)), as64(keras.ops.gelu(xs, False)))  # erf: Keras'


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layers_dot_product_attention_is_softmax_attention(dtype):
    """layers.dot_product_attention (JAX's CPU: heads merged into the batch of two 3-D products)
    is softmax(q k^T * scale) v per batch item and head, in NumPy float64: queries and keys of
    different lengths, every head and batch item distinct, the output in the inputs' dtype."""
    from keras_vit.layers.matmul import dot_product_attention

    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(3, n, 4, 16)).astype("float32") for n in (7, 11, 11))
    qs, ks, vs = (keras.ops.cast(t, dtype) for t in (q, k, v))
    as64 = lambda t: keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")).astype("float64")  # noqa: E731
    q64, k64, v64 = as64(qs), as64(ks), as64(vs)
    logits = np.einsum("bqhd,bkhd->bhqk", q64, k64) * 0.3
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("bhqk,bkhd->bqhd", weights, v64)
    out = dot_product_attention(qs, ks, vs, 0.3)
    assert keras.backend.standardize_dtype(out.dtype) == dtype
    # bfloat16: the scaled queries and the weights are rounded to 8 significant bits on the way.
    tol = 3e-2 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(as64(out), expected, rtol=tol, atol=tol)
