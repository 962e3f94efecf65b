"""keras_vit.performance: the per-backend compile setting the benchmarks measured fastest on CPU."""

import functools

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


def _torch_has_onednn():
    if keras.backend.backend() != "torch":
        return False
    import torch

    return torch.backends.mkldnn.is_available()


only_torch = pytest.mark.skipif(
    not _torch_has_onednn(), reason="oneDNN's float32 matmul is PyTorch's, where it is built with oneDNN"
)


def _profiled_ops(fn):
    """The names of the operators PyTorch's profiler records while `fn()` runs."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return {event.name for event in prof.events()}


@only_torch
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_onednn_float32_matmul_is_the_product_with_its_gradients(monkeypatch, compiled, with_bias):
    """PyTorch, float32 through oneDNN (`keras_vit::onednn_matmul`, forced on whatever the CPU):
    `matmul` / `matmul_add` and their gradients are the float64 formulas within float32 rounding,
    eager and under torch.compile, for a random upstream and for the broadcast one of a `sum()`
    (stride 0, copied before oneDNN reads it); oneDNN's kernel is what runs."""
    import torch

    from keras_vit.layers import matmul as mm

    monkeypatch.setattr(mm, "ONEDNN_FLOAT32_MATMUL", True)
    rng = np.random.default_rng(2)
    x, k, b, g = (rng.normal(size=s) for s in ((33, 256), (256, 40), (40,), (33, 40)))
    b = b * 10.0

    def fn(tx, tk, tb):
        return mm.matmul_add(tx, tk, tb) if with_bias else mm.matmul(tx, tk)

    run = torch.compile(fn, fullgraph=True) if compiled else fn
    for upstream in (g, np.ones_like(g)):
        tx, tk, tb = (torch.tensor(v, dtype=torch.float32, requires_grad=True) for v in (x, k, b))
        out = run(tx, tk, tb)
        loss = out.sum() if upstream is not g else (out * torch.tensor(g, dtype=torch.float32)).sum()
        loss.backward()
        exact = x @ k + (b if with_bias else 0.0)
        # float32: rounding of 256-term sums of size ~16 (2**-24 relative each, far below 1e-4)
        np.testing.assert_allclose(out.detach().numpy(), exact, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(tx.grad.numpy(), upstream @ k.T, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(tk.grad.numpy(), x.T @ upstream, rtol=1e-5, atol=1e-4)
        if with_bias:
            np.testing.assert_allclose(tb.grad.numpy(), upstream.sum(0), rtol=1e-5, atol=1e-4)
        else:
            assert tb.grad is None
    tx, tk, tb = (torch.tensor(v, dtype=torch.float32) for v in (x, k, b))
    assert "mkldnn::_linear_pointwise" in _profiled_ops(lambda: run(tx, tk, tb))


@only_torch
def test_onednn_float32_matmul_under_torch_func_transforms(monkeypatch):
    """torch.func's transforms see the forced oneDNN `matmul_add` as x @ kernel + bias: `grad`
    and `jvp` (forward mode: a tangent in every input) equal the float64 formulas, and `vmap`
    over the inputs, the kernels or both stacks the products."""
    import torch

    from keras_vit.layers import matmul as mm

    monkeypatch.setattr(mm, "ONEDNN_FLOAT32_MATMUL", True)
    rng = np.random.default_rng(5)
    x, k, b, tx, tk, tb = (rng.normal(size=s) for s in ((7, 16), (16, 5), (5,), (7, 16), (16, 5), (5,)))
    xs, ks = rng.normal(size=(3, 7, 16)), rng.normal(size=(3, 16, 5))
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5)

    d_x, d_k = torch.func.grad(lambda a, w: mm.matmul_add(a, w, f32(b)).square().sum(), argnums=(0, 1))(f32(x), f32(k))
    y = x @ k + b
    close(d_x.numpy(), 2 * y @ k.T)
    close(d_k.numpy(), x.T @ (2 * y))
    value, tangent = torch.func.jvp(mm.matmul_add, (f32(x), f32(k), f32(b)), (f32(tx), f32(tk), f32(tb)))
    close(value.numpy(), y)
    close(tangent.numpy(), tx @ k + x @ tk + tb)
    close(torch.func.vmap(lambda a: mm.matmul_add(a, f32(k), f32(b)))(f32(xs)).numpy(), xs @ k + b)
    close(torch.func.vmap(lambda w: mm.matmul(f32(x), w))(f32(ks)).numpy(), x @ ks)
    close(torch.func.vmap(mm.matmul)(f32(xs), f32(ks)).numpy(), xs @ ks)


def _amd_cpu():
    with open("/proc/cpuinfo") as f:
        return "AuthenticAMD" in f.read()


@only_torch
def test_onednn_float32_matmul_runs_where_it_is_chosen(monkeypatch):
    """"auto" takes oneDNN's float32 matmul on AMD CPUs (MKL runs its AVX2 code there) and MKL's
    `addmm` elsewhere; False always MKL; bfloat16 follows its own setting. A float32 ViT's forward
    on the oneDNN path gives MKL's logits within float32 rounding."""
    import torch

    import keras_vit
    from conftest import TINY, randomize
    from keras_vit.layers import matmul as mm

    x = np.random.default_rng(3).normal(size=(2, 32, 32, 3)).astype("float32")
    model = randomize(keras_vit.VisionTransformer(**dict(TINY, num_layers=1), classifier_activation=None), seed=4)
    outputs = {}
    for choice in ("auto", False, True):
        monkeypatch.setattr(mm, "ONEDNN_FLOAT32_MATMUL", choice)
        ops_run = _profiled_ops(lambda: outputs.__setitem__(choice, model.predict_on_batch(x)))
        onednn = "mkldnn::_linear_pointwise" in ops_run
        assert onednn == (choice is True or (choice == "auto" and _amd_cpu())), (choice, sorted(ops_run)[:40])
        assert onednn != ("aten::addmm" in ops_run)
    np.testing.assert_allclose(outputs[True], outputs[False], rtol=1e-5, atol=1e-5)
    assert np.abs(outputs[False]).max() > 0.1
    monkeypatch.setattr(mm, "ONEDNN_BFLOAT16_MATMUL", False)
    a, w, c = (torch.ones(shape, dtype=torch.bfloat16) for shape in ((4, 8), (8, 3), (3,)))
    assert "mkldnn::_linear_pointwise" not in _profiled_ops(lambda: mm.matmul_add(a, w, c))


@only_torch
def test_onednn_bfloat16_matmul_add_where_no_gradient_is_recorded(monkeypatch):
    """PyTorch, bfloat16: `matmul_add` without a recorded gradient goes through oneDNN's op (the
    bias in its epilogue) where ONEDNN_BFLOAT16_MATMUL chooses it ("auto": where PyTorch's oneDNN
    has a bfloat16 matmul for the CPU), and is then the float64 formula of its bfloat16 inputs
    rounded once to bfloat16; with a gradient to record it stays torch's `addmm`. A tiny
    mixed_bfloat16 ViT gives the same logits either way, to bfloat16 rounding."""
    import torch

    import keras_vit
    from conftest import TINY, randomize
    from keras_vit.layers import matmul as mm

    rng = np.random.default_rng(8)
    x, k, b = (torch.tensor(rng.normal(size=s), dtype=torch.bfloat16) for s in ((33, 256), (256, 40), (40,)))
    exact = x.double() @ k.double() + b.double()
    supported = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    for choice in ("auto", True, False):
        monkeypatch.setattr(mm, "ONEDNN_BFLOAT16_MATMUL", choice)
        if choice is True and not supported:
            continue
        out = {}
        ran = _profiled_ops(lambda: out.__setitem__("y", mm.matmul_add(x, k, b)))
        assert ("mkldnn::_linear_pointwise" in ran) == (choice is True or (choice == "auto" and supported)), choice
        assert out["y"].dtype == torch.bfloat16
        # one rounding to bfloat16 (2**-9 relative) of float32 sums of 256 terms
        np.testing.assert_allclose(out["y"].double().numpy(), exact.numpy(), rtol=2.0**-8, atol=1e-2)
        tracked = [t.clone().requires_grad_(True) for t in (x, k, b)]
        ran = _profiled_ops(lambda: mm.matmul_add(*tracked).float().sum().backward())
        assert "mkldnn::_linear_pointwise" not in ran and "aten::addmm" in ran
        np.testing.assert_allclose(tracked[2].grad.double().numpy(), np.full(40, 33.0))
    images = rng.normal(size=(2, 32, 32, 3)).astype("float32")
    logits = {}
    for choice in (True, False) if supported else (False,):
        monkeypatch.setattr(mm, "ONEDNN_BFLOAT16_MATMUL", choice)
        model = randomize(keras_vit.VisionTransformer(**dict(TINY, num_layers=1), classifier_activation=None,
                                                      dtype="mixed_bfloat16"), seed=4)
        ran = _profiled_ops(lambda: logits.__setitem__(choice, model.predict_on_batch(images)))
        assert ("mkldnn::_linear_pointwise" in ran) == choice
        logits[choice] = np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(logits[choice], "float32")))
    np.testing.assert_allclose(logits[True if supported else False], logits[False], rtol=2e-2, atol=2e-2)
    assert np.abs(logits[False]).max() > 0.1


def _no_recompiles():
    """PyTorch: a context in which torch.compile raises instead of compiling a function again
    (the train step is compiled once, not again at the second step); other backends: none."""
    import contextlib

    if keras.backend.backend() != "torch":
        return contextlib.nullcontext()
    import torch._dynamo

    return torch._dynamo.config.patch(error_on_recompile=True)


def test_recommended_jit_compile_runs_predict_and_fit_as_eager(rng):
    """The recommended compiled predict and train steps (JAX: XLA; TensorFlow: a graph; PyTorch
    on CPU: torch.compile, the train step compiled once) give the eager model's outputs, loss and
    updated weights."""
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
    with _no_recompiles():
        for _ in range(2):
            np.testing.assert_allclose(compiled.train_on_batch(x, y), eager.train_on_batch(x, y), rtol=1e-4)
    for a, b in zip(compiled.weights, eager.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_layers_gelu_tanh_form_traced_by_torch_compile(monkeypatch, dtype):
    """PyTorch: the tanh GELU as torch.compile traces it (x * sigmoid(2z), computed in float32)
    is the original's 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in NumPy float64, to the
    output's rounding. JAX's CPU, bfloat16: both forms are the float64 formulas rounded once to
    bfloat16. Otherwise on JAX and TensorFlow `gelu` is keras.ops.gelu, both forms."""
    import scipy.special

    import keras_vit.layers.matmul as m

    x = np.concatenate([np.linspace(-12.0, 12.0, 2001), [-60.0, -0.0, 1e-6, 60.0]]).astype("float32")
    xs = keras.ops.cast(x, dtype)
    as64 = lambda t: keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")).astype("float64")  # noqa: E731
    if keras.backend.backend() == "jax" and dtype == "bfloat16":
        x64 = as64(xs)
        forms = {
            True: 0.5 * x64 * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x64 + 0.044715 * x64**3))),
            False: 0.5 * x64 * (1.0 + scipy.special.erf(x64 / np.sqrt(2.0))),
        }
        for approximate, expected in forms.items():
            out = m.gelu(xs, approximate)
            assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
            # one rounding to 8 significant bits: half an ulp, at most 2**-8 relative; plus float32's
            # cancellation in 1 + tanh(z) far out on the negative side (1e-6 absolute)
            np.testing.assert_allclose(as64(out), expected, rtol=2.0**-8, atol=1e-6)
        return
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


only_tensorflow = pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="TensorFlow's CPU GELU and attention")


@only_tensorflow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("approximate", [True, False], ids=["tanh", "erf"])
@pytest.mark.parametrize("in_function", [False, True], ids=["eager", "tf.function"])
def test_tensorflow_gelu_under_a_tape_is_gelu_and_its_gradient(dtype, approximate, in_function):
    """TensorFlow's CPU, a gradient tape recording: `gelu` is an XLA-compiled function (one with
    `_XlaMustCompile` in the traced graph) whose value and gradient are GELU's and upstream x
    GELU'(x) from TensorFlow's own float64 autodiff of tf.nn.gelu, to one rounding of the output
    dtype; with no tape it stays keras.ops.gelu (the test above)."""
    import tensorflow as tf

    import keras_vit.layers.matmul as m

    rng = np.random.default_rng(0)
    x32 = np.concatenate([np.linspace(-9.0, 9.0, 1201), rng.normal(size=799) * 3, [-0.0, 1e-6]]).astype("float32")
    up32 = rng.normal(size=x32.shape).astype("float32")
    x, up = tf.cast(x32, dtype), tf.cast(up32, dtype)

    def step(x, up):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = m.gelu(x, approximate)
        return y, tape.gradient(y, x, up)

    run = tf.function(step, autograph=False) if in_function else step
    y, grad = run(x, up)
    assert y.dtype == grad.dtype == tf.as_dtype(dtype)
    x64, up64 = (tf.cast(tf.cast(t, tf.float32), tf.float64) for t in (x, up))
    with tf.GradientTape() as tape:
        tape.watch(x64)
        y64 = tf.nn.gelu(x64, approximate=approximate)
    grad64 = tape.gradient(y64, x64, up64)
    rounding = 2.0**-8 if dtype == "bfloat16" else 2e-6
    np.testing.assert_allclose(_as64(y), y64.numpy(), rtol=rounding, atol=1e-6)
    np.testing.assert_allclose(_as64(grad), grad64.numpy(), rtol=rounding, atol=1e-5)

    graph = tf.function(step, autograph=False).get_concrete_function(x, up).graph
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    compiled = [f for f in library.values() if f.attr["_XlaMustCompile"].b]
    assert len(compiled) == 2, sorted(library)  # the value and the gradient
    m_off = tf.function(lambda x: m.gelu(x, approximate), autograph=False).get_concrete_function(x).graph
    assert not any(f.attr["_XlaMustCompile"].b for f in m_off.as_graph_def().library.function)


@only_tensorflow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tensorflow_head_major_attention_is_keras_attention_bit_for_bit(monkeypatch, dtype):
    """TensorFlow's CPU: the head-major attention (batched matmuls) gives keras.ops.
    dot_product_attention's output and gradients with respect to queries, keys and values, bit
    for bit (the same products and float32 softmax, the heads moved first); the routing off gives
    Keras' own."""
    import tensorflow as tf

    import keras_vit.layers.matmul as m

    rng = np.random.default_rng(0)
    q, k, v, up = (tf.cast(rng.normal(size=(2, 13, 3, 8)).astype("float32") * 2, dtype) for _ in range(4))

    def run(attend):
        @tf.function(autograph=False)
        def step(q, k, v, up):
            with tf.GradientTape() as tape:
                tape.watch([q, k, v])
                y = attend(q, k, v, 0.35)
            return [y] + tape.gradient(y, [q, k, v], up)

        return [_as64(t) for t in step(q, k, v, up)]

    keras_own = run(lambda q, k, v, scale: keras.ops.dot_product_attention(q, k, v, scale=scale))
    ours = run(m.dot_product_attention)
    for a, b in zip(ours, keras_own):
        np.testing.assert_array_equal(a, b)
    assert np.abs(keras_own[1]).max() > 0.1  # gradients that are not all zero
    graph = tf.function(lambda q, k, v: m.dot_product_attention(q, k, v, 0.35)).get_concrete_function(q, k, v).graph
    ops_made = {op.type for op in graph.get_operations()}
    assert "BatchMatMulV2" in ops_made and "Einsum" not in ops_made, ops_made
    monkeypatch.setattr(m, "TENSORFLOW_HEAD_MAJOR_ATTENTION", False)
    graph = tf.function(lambda q, k, v: m.dot_product_attention(q, k, v, 0.35)).get_concrete_function(q, k, v).graph
    assert "Einsum" in {op.type for op in graph.get_operations()}


@only_tensorflow
@pytest.mark.parametrize("jit_compile", [False, True])
def test_tensorflow_training_with_xla_gelu_and_head_major_attention_is_keras_ops_training(monkeypatch, jit_compile):
    """TensorFlow's CPU: three SGD steps of a tiny ViT give the losses and weights that Keras' own
    GELU and attention give, to float32 rounding, inside Keras' graph and under XLA."""
    import keras_vit
    import keras_vit.layers.matmul as m

    rng = np.random.default_rng(0)
    x, y = rng.random((4, 32, 32, 3), dtype="float32"), np.arange(4) % 10
    runs = {}
    for ours in (False, True):
        monkeypatch.setattr(m, "TENSORFLOW_GELU_BY_XLA", ours)
        monkeypatch.setattr(m, "TENSORFLOW_HEAD_MAJOR_ATTENTION", ours)
        keras.utils.set_random_seed(0)
        model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=32, num_layers=2, num_heads=2,
                                            mlp_dim=64, classes=10, classifier_activation=None)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit_compile)
        runs[ours] = ([float(model.train_on_batch(x, y)) for _ in range(3)], [w.numpy() for w in model.weights])
    (keras_losses, keras_weights), (our_losses, our_weights) = runs[False], runs[True]
    assert keras_losses[2] < keras_losses[0] - 0.1  # the steps train
    np.testing.assert_allclose(our_losses, keras_losses, rtol=1e-5)
    for ours, theirs in zip(our_weights, keras_weights):
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)


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


def test_dot_product_attention_in_query_chunks_is_softmax_attention(monkeypatch):
    """Past CHUNK_QUERIES_ABOVE query tokens, JAX's CPU attention takes QUERY_CHUNK queries at a
    time (whole chunks in a loop, then the rest): still softmax(q k^T * scale) v per batch item and
    head, in NumPy float64, every query row in its place (11 queries: two chunks of 4 and 3 left)."""
    import keras_vit.layers.matmul as m

    monkeypatch.setattr(m, "CHUNK_QUERIES_ABOVE", 8)
    monkeypatch.setattr(m, "QUERY_CHUNK", 4)
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, n, 3, 8)).astype("float32") for n in (11, 13, 13))
    logits = np.einsum("bqhd,bkhd->bhqk", q.astype("float64"), k.astype("float64")) * 0.4
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("bhqk,bkhd->bqhd", weights, v.astype("float64"))
    out = keras.ops.convert_to_numpy(m.dot_product_attention(q, k, v, 0.4))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


only_jax = pytest.mark.skipif(
    keras.backend.backend() != "jax", reason="JAX's CPU gradient products; the other backends' are their own"
)


def _as64(t):
    return np.asarray(keras.ops.convert_to_numpy(keras.ops.cast(t, "float32")), dtype="float64")


@only_jax
@pytest.mark.parametrize("gradient_dots", [True, False])
@pytest.mark.parametrize("with_bias", [False, True])
def test_bfloat16_matmul_gradients_are_bfloat16_dots(monkeypatch, gradient_dots, with_bias):
    """JAX's CPU: with BFLOAT16_GRADIENT_DOTS the gradients of a bfloat16 layers.matmul /
    matmul_add of 2-D operands (as the attention projections and MLPs call them) are upstream @
    kernel^T, input^T @ upstream and the upstream's column sums of NumPy float64, rounded once to
    bfloat16 from a float32 sum, and both products are bfloat16 dots in the compiled program;
    without it XLA upcasts them to float32 (its bfloat16 dot kernel takes no transposed operand)."""
    import jax

    import keras_vit.layers.matmul as m

    monkeypatch.setattr(m, "BFLOAT16_GRADIENT_DOTS", gradient_dots)
    rng = np.random.default_rng(4)
    shapes = ((48, 40), (40, 56), (56,), (48, 56))
    x, w, b, g = (keras.ops.cast(rng.normal(size=s).astype("float32"), "bfloat16") for s in shapes)

    def gradients(x, w, b, g):
        if with_bias:
            return jax.vjp(m.matmul_add, x, w, b)[1](g)
        return jax.vjp(m.matmul, x, w)[1](g)

    program = jax.jit(gradients).lower(x, w, b, g).compile().as_text()
    operands = _dot_operand_types(program)
    assert len(operands) == 2  # the two gradient products
    assert all(types == ["bf16", "bf16"] for types in operands) == gradient_dots, operands
    if not gradient_dots:
        return
    grads = jax.jit(gradients)(x, w, b, g)
    assert all(d.dtype == jax.numpy.bfloat16 for d in grads)
    x64, w64, g64 = _as64(x), _as64(w), _as64(g)
    expected = (g64 @ w64.T, x64.T @ g64, g64.sum(0))[: len(grads)]
    for got, exact in zip(grads, expected):
        assert np.all(np.abs(_as64(got) - exact) <= 2.0**-8 * np.abs(exact) + 1e-3)


def _dot_operand_types(program):
    """The element types of each dot's two operands in the text of a compiled XLA program."""
    import re

    types = {}
    for name, dtype in re.findall(r"%?([\w.\-]+) = (\w+)\[", program):
        types[name] = dtype
    for name, dtype in re.findall(r"([\w.\-]+): (\w+)\[", program):  # computation parameters
        types[name] = dtype
    dots = re.findall(r" dot\(%?([\w.\-]+), %?([\w.\-]+)\)", program)
    return [[types[a], types[b]] for a, b in dots]


def _attention_gradients64(q, k, v, g, scale):
    """The gradients of softmax attention of (batch, tokens, heads, head_dim) float64 arrays for
    the cotangent `g`, from the formulas."""
    qs = q * scale
    logits = np.einsum("bqhd,bkhd->bhqk", qs, k)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    dp = np.einsum("bqhd,bkhd->bhqk", g, v)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True))
    dq = np.einsum("bhqk,bkhd->bqhd", ds, k) * scale
    dk = np.einsum("bhqk,bqhd->bkhd", ds, qs)
    dv = np.einsum("bhqk,bqhd->bkhd", p, g)
    return dq, dk, dv


@only_jax
@pytest.mark.parametrize("dtype, groups", [("float32", 1), ("bfloat16", 0), ("bfloat16", 1), ("bfloat16", 4)])
@pytest.mark.parametrize("chunked", [False, True])
def test_dot_product_attention_gradients_are_softmax_attention_gradients(monkeypatch, dtype, chunked, groups):
    """JAX's CPU: the gradients of layers.dot_product_attention with respect to queries, keys and
    values are those of softmax(q k^T * scale) v in NumPy float64 (bfloat16: its own gradient
    products, to bfloat16 rounding, all of them bfloat16 dots where JAX's own are float32), queries
    and keys of different lengths, whole and in query chunks; bfloat16 with JAX's own gradient
    (ATTENTION_GRADIENT_GROUPS = 0) and with the recomputing one in one group or in four uneven
    ones (6 batch * heads rows: 1, 2, 1 and 2)."""
    import jax

    import keras_vit.layers.matmul as m

    monkeypatch.setattr(m, "ATTENTION_GRADIENT_GROUPS", groups)
    if chunked:
        monkeypatch.setattr(m, "CHUNK_QUERIES_ABOVE", 8)
        monkeypatch.setattr(m, "QUERY_CHUNK", 4)
    rng = np.random.default_rng(5)
    q, k, v, g = (keras.ops.cast(rng.normal(size=(2, n, 3, 16)).astype("float32"), dtype) for n in (11, 13, 13, 11))
    gradients = jax.jit(lambda q, k, v, g: jax.vjp(lambda *a: m.dot_product_attention(*a, 0.3), q, k, v)[1](g))
    grads = gradients(q, k, v, g)
    expected = _attention_gradients64(*(_as64(t) for t in (q, k, v, g)), 0.3)
    tol = 4e-2 if dtype == "bfloat16" else 2e-5
    for got, exact in zip(grads, expected):
        assert got.dtype == jax.numpy.dtype(dtype)
        np.testing.assert_allclose(_as64(got), exact, rtol=tol, atol=tol * np.abs(exact).max())
    if dtype == "bfloat16" and not chunked and groups:  # every product a bfloat16 dot: logits and the four gradients
        operands = _dot_operand_types(gradients.lower(q, k, v, g).compile().as_text())
        assert len(operands) >= 5 and all(types == ["bf16", "bf16"] for types in operands), operands
        monkeypatch.setattr(m, "BFLOAT16_GRADIENT_DOTS", False)  # JAX's own: float32 dots
        program = jax.jit(lambda *a: jax.vjp(lambda *b: m.dot_product_attention(*b, 0.3), *a[:3])[1](a[3]))
        operands = _dot_operand_types(program.lower(q, k, v, g).compile().as_text())
        assert any("f32" in types for types in operands), operands


on_torch = pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch's CPU half-precision attention")


@on_torch
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_half_attention_is_float32_attention_rounded_once(monkeypatch, dtype):
    """PyTorch's CPU: a bfloat16 or float16 attention and its gradients with respect to queries,
    keys and values are softmax(q k^T * scale) v's in NumPy float64 to one rounding of the
    result (they are computed in float32), queries and keys of different lengths, in the inputs'
    dtype; float32 inputs, and the routing off, give keras.ops.dot_product_attention's own."""
    import torch

    import keras_vit.layers.matmul as m

    rng = np.random.default_rng(6)
    shapes = [(2, n, 3, 16) for n in (11, 13, 13, 11)]
    q, k, v, g = (torch.tensor(rng.normal(size=s).astype("float32") * 2).to(getattr(torch, dtype)) for s in shapes)

    def run(attend, *inputs):
        inputs = [t.detach().clone().requires_grad_(True) for t in inputs]
        y = attend(*inputs)
        y.backward(g.to(y.dtype))
        return [y] + [t.grad for t in inputs]

    ours = run(lambda *a: m.dot_product_attention(*a, 0.3), q, k, v)
    q64, k64, v64 = (_as64(t) for t in (q, k, v))
    logits = np.einsum("bqhd,bkhd->bhqk", q64, k64) * 0.3
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    exact = [np.einsum("bhqk,bkhd->bqhd", p, v64), *_attention_gradients64(q64, k64, v64, _as64(g), 0.3)]
    ulp = 2.0**-8 if dtype == "bfloat16" else 2.0**-11  # half the spacing of the dtype's numbers near 1
    for got, want in zip(ours, exact):
        assert got.dtype == getattr(torch, dtype)
        np.testing.assert_allclose(_as64(got), want, rtol=ulp, atol=ulp * 1e-2 * np.abs(want).max())
    keras_own = run(lambda *a: keras.ops.dot_product_attention(*a, scale=0.3), q, k, v)
    worst = lambda results: max(np.abs(_as64(a) - b).max() / np.abs(b).max() for a, b in zip(results, exact))  # noqa: E731
    assert worst(ours) <= worst(keras_own)  # no further from the exact values than the half-precision kernel
    monkeypatch.setattr(m, "TORCH_HALF_ATTENTION_IN_FLOAT32", False)
    for a, b in zip(run(lambda *a: m.dot_product_attention(*a, 0.3), q, k, v), keras_own):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    monkeypatch.setattr(m, "TORCH_HALF_ATTENTION_IN_FLOAT32", True)
    q32, k32, v32 = (t.float() for t in (q, k, v))
    for a, b in zip(run(lambda *a: m.dot_product_attention(*a, 0.3), q32, k32, v32),
                    run(lambda *a: keras.ops.dot_product_attention(*a, scale=0.3), q32, k32, v32)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def _attention_tangent64(q, k, v, tq, tk, tv, scale):
    """The directional derivative of softmax attention of (batch, tokens, heads, head_dim) float64
    arrays along the tangents (tq, tk, tv), from the formulas."""
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) * scale
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    d_logits = (np.einsum("bqhd,bkhd->bhqk", tq, k) + np.einsum("bqhd,bkhd->bhqk", q, tk)) * scale
    d_p = p * (d_logits - (p * d_logits).sum(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", d_p, v) + np.einsum("bhqk,bkhd->bqhd", p, tv)


@only_jax
@pytest.mark.parametrize("chunked", [False, True])
def test_float32_attention_has_forward_mode_derivatives(monkeypatch, chunked):
    """JAX's CPU: float32 layers.dot_product_attention keeps JAX's own differentiation, so
    `jax.jvp` runs through it (a custom gradient would refuse) and gives the directional
    derivative of softmax(q k^T * scale) v in NumPy float64, whole and in query chunks."""
    import jax

    import keras_vit.layers.matmul as m

    if chunked:
        monkeypatch.setattr(m, "CHUNK_QUERIES_ABOVE", 8)
        monkeypatch.setattr(m, "QUERY_CHUNK", 4)
    rng = np.random.default_rng(9)
    q, k, v, tq, tk, tv = (rng.normal(size=(2, n, 3, 16)).astype("float32") for n in (11, 13, 13, 11, 13, 13))
    out, tangent = jax.jit(lambda *a: jax.jvp(lambda *b: m.dot_product_attention(*b, 0.3), a[:3], a[3:]))(
        q, k, v, tq, tk, tv
    )
    expected = _attention_tangent64(*(_as64(t) for t in (q, k, v, tq, tk, tv)), 0.3)
    assert tangent.dtype == np.float32
    np.testing.assert_allclose(_as64(tangent), expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())

@only_jax
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_split_batched_dots_leave_the_attention_bit_identical(monkeypatch, dtype):
    """JAX's CPU: the row reduction SPLIT_BATCHED_DOTS puts beside the attention's batched
    products (for XLA:CPU's threads) changes no bit of its output or of its gradients."""
    import jax

    import keras_vit.layers.matmul as m

    rng = np.random.default_rng(8)
    q, k, v, g = (keras.ops.cast(rng.normal(size=(2, n, 3, 16)).astype("float32"), dtype) for n in (11, 13, 13, 11))
    results = {}
    for split in (False, True):
        monkeypatch.setattr(m, "SPLIT_BATCHED_DOTS", split)
        run = jax.jit(lambda q, k, v, g: jax.vjp(lambda *a: m.dot_product_attention(*a, 0.3), q, k, v))
        out, pullback = run(q, k, v, g)
        results[split] = [np.asarray(_as64(t)) for t in (out, *pullback(g))]
    for plain, split in zip(results[False], results[True]):
        np.testing.assert_array_equal(split, plain)


@only_jax
@pytest.mark.parametrize("groups, keeps_weights", [(0, True), (1, False), (4, False)])
def test_bfloat16_attention_gradient_keeps_no_softmax_weights(capsys, monkeypatch, groups, keeps_weights):
    """JAX's CPU: with ATTENTION_GRADIENT_GROUPS the bfloat16 attention's forward pass keeps no
    (batch * heads, queries, keys) softmax weights for the gradient (it recomputes them); JAX's own
    gradient keeps them, so the check can fail."""
    from jax.ad_checkpoint import print_saved_residuals

    import keras_vit.layers.matmul as m

    monkeypatch.setattr(m, "ATTENTION_GRADIENT_GROUPS", groups)
    rng = np.random.default_rng(7)
    q, k, v = (keras.ops.cast(rng.normal(size=(2, n, 3, 16)).astype("float32"), "bfloat16") for n in (11, 13, 13))
    capsys.readouterr()
    print_saved_residuals(lambda *a: m.dot_product_attention(*a, 0.3), q, k, v)
    saved = capsys.readouterr().out
    assert "[6,11,16]" in saved  # the head-major queries
    assert ("[6,11,13]" in saved) == keeps_weights, saved


@only_jax
@pytest.mark.parametrize("batch, patch, hidden, heads, classes", [(1, 16, 8, 1, 1), (3, 4, 48, 2, 10)])
def test_bfloat16_gradient_dots_give_jax_gradients_of_a_model(monkeypatch, batch, patch, hidden, heads, classes):
    """JAX's CPU, mixed_bfloat16: a ViT's gradients with BFLOAT16_GRADIENT_DOTS equal JAX's own
    gradients of the same model to bfloat16 rounding, at edge shapes too (one image, one patch,
    one class, one head: dots XLA's bfloat16 kernel refuses), and the compiled train step runs."""
    import jax

    import keras_vit
    import keras_vit.layers.matmul as m

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        keras.utils.set_random_seed(0)
        model = keras_vit.VisionTransformer(
            image_size=16, patch_size=patch, hidden_size=hidden, num_layers=2, num_heads=heads, mlp_dim=2 * hidden,
            classes=classes, classifier_activation=None,
        )
    finally:
        keras.config.set_dtype_policy(previous)
    rng = np.random.default_rng(6)
    images = rng.random((batch, 16, 16, 3), dtype="float32")
    weights = [rng.normal(size=v.shape).astype("float32") * 0.5 for v in model.trainable_variables]
    targets = rng.normal(size=(batch, classes)).astype("float32")

    def loss(trainable):
        logits, _ = model.stateless_call(trainable, [v.value for v in model.non_trainable_variables], images)
        return jax.numpy.sum((logits.astype("float32") - targets) ** 2)

    grads = {}
    for setting in (False, True):
        monkeypatch.setattr(m, "BFLOAT16_GRADIENT_DOTS", setting)
        grads[setting] = jax.jit(jax.grad(loss))(weights)
    for variable, ours, jaxs in zip(model.trainable_variables, grads[True], grads[False]):
        if variable.path.endswith("key_bias"):
            # zero in exact arithmetic (a key bias adds q . b to every logit of a row, which the
            # softmax cancels): both sides are rounding noise there
            continue
        scale = float(np.abs(jaxs).max()) or 1.0
        np.testing.assert_allclose(np.asarray(ours), np.asarray(jaxs), atol=5e-2 * scale, err_msg=variable.path)
    model.compile(optimizer="sgd", loss=keras.losses.MeanSquaredError(), jit_compile=True)
    assert np.isfinite(model.train_on_batch(images, targets))


def _timm_dinov2(tmp_path):
    """A tiny random timm DINOv2 (layer scale, LayerNorm eps 1e-6) saved with timm's Hub saver,
    and the timm model."""
    pytest.importorskip("timm")
    import timm
    from test_timm_zoo import randomize_torch
    from timm.models._hub import save_for_hf

    args = dict(depth=2, img_size=28, embed_dim=64, num_heads=4)
    model = randomize_torch(timm.create_model("vit_small_patch14_dinov2", pretrained=False, **args))
    save_for_hf(model, tmp_path, safe_serialization=True, model_args=args)
    return model


def test_bfloat16_inference_is_the_mixed_bfloat16_model_with_bfloat16_weights(tmp_path):
    """performance.bfloat16_inference: the same outputs as the mixed_bfloat16 model to bfloat16
    rounding, as far from timm's float64 output as timm's own bfloat16 autocast is; matmul kernels
    stored in bfloat16, norm parameters in float32; not trainable; a snapshot of the weights."""
    import torch

    import keras_vit

    ref = _timm_dinov2(tmp_path)
    x = np.random.default_rng(1).uniform(-1, 1, (2, 28, 28, 3)).astype("float32")
    images = torch.from_numpy(x.transpose(0, 3, 1, 2).copy())
    with torch.no_grad():
        exact = ref.double()(images.double()).numpy()
        ref.float()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = ref(images).float().double().numpy()
    model = keras_vit.load_checkpoint(tmp_path, include_top=False, pooling="token")
    fast = perf.bfloat16_inference(model)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = keras_vit.load_checkpoint(tmp_path, include_top=False, pooling="token")
    finally:
        keras.config.set_dtype_policy("float32")
    outputs = {name: np.asarray(m.predict_on_batch(x), "float64") for name, m in
               (("float32", model), ("mixed", mixed), ("fast", fast))}
    scale = np.abs(exact).max()
    error = {name: np.abs(out - exact).max() / scale for name, out in outputs.items()}
    timm_error = np.abs(autocast - exact).max() / scale
    assert error["float32"] < 1e-5 and 1e-3 < error["mixed"] < 3e-2, error  # bfloat16 compute, not float32
    # Norms and softmax as under mixed_bfloat16: the same rounding, to a few bfloat16 ulps of the output.
    assert np.abs(outputs["fast"] - outputs["mixed"]).max() / scale <= 2.0**-7, (error, timm_error)
    # timm's autocast keeps the residual stream in float32 (a bfloat16 branch added to a float32
    # input) where a Keras mixed_bfloat16 model keeps it in bfloat16: 1.9x timm's error here.
    assert error["fast"] <= 3 * timm_error, (error, timm_error)

    dtypes = {w.path.split("/", 1)[1]: keras.backend.standardize_dtype(w.dtype) for w in fast.weights}
    kernels = [p for p in dtypes if p.endswith("kernel")]
    norms = [p for p in dtypes if "norm" in p.lower() and p.endswith(("gamma", "beta"))]
    assert kernels and all(dtypes[p] == "bfloat16" for p in kernels), dtypes
    assert norms and all(dtypes[p] == "float32" for p in norms), dtypes
    assert not fast.trainable and not fast.trainable_weights
    # A snapshot: changing the float32 model afterwards leaves the copy as it was.
    model.weights[0].assign(keras.ops.zeros(model.weights[0].shape))
    np.testing.assert_array_equal(np.asarray(fast.predict_on_batch(x), "float64"), outputs["fast"])


def test_bfloat16_inference_refuses_what_it_cannot_convert():
    import keras_vit
    from conftest import TINY

    with pytest.raises(TypeError, match="keras_vit models"):
        perf.bfloat16_inference(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    model = keras_vit.VisionTransformer(**TINY)
    model.quantize("int8")
    with pytest.raises(ValueError, match="quantized"):
        perf.bfloat16_inference(model)
    batch_norm = keras_vit.EfficientNetB0(weights=None, input_shape=(32, 32, 3), classes=3)
    with pytest.raises(ValueError, match="BatchNormalization"):
        perf.bfloat16_inference(batch_norm)
