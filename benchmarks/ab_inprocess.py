"""keras_vit against other Keras ViT-B/16s in ONE process, calls interleaved (an A/B).

    KERAS_BACKEND=jax .venv/bin/python benchmarks/ab_inprocess.py
    KERAS_BACKEND=tensorflow .venv/bin/python benchmarks/ab_inprocess.py --models keras_vit,keras_hub --reps 12
    KERAS_BACKEND=torch .venv/bin/python benchmarks/ab_inprocess.py --models keras_vit,timm --jit-compile both

On a shared or virtualised CPU the speed of the whole machine drifts by +-25% from one minute
to the next, so two contenders measured in separate processes minutes apart can swap places.
Here every model is built in the same process with the same backend and the same compiled
predict step (`model.compile(jit_compile=recommended_jit_compile())` unless --jit-compile
says otherwise, `predict_on_batch`),
and the timed calls alternate A, B, C, C, B, A, ...: drift hits all of them alike. This is how
the Keras-vs-Keras comparisons in benchmarks/README.md were measured; `benchmark.py` (one
process per library and backend) is what compares across frameworks (timm).

Models: keras_vit (ViTB16, GELU tanh as the original), keras_vit_erf (GELU erf as timm),
keras_vit_int8 (`model.quantize("int8")`: every transformer matmul), keras_vit_int8_mlp (int8
of the Dense layers only, `filters=["Dense_", "head"]`: what Keras reaches by itself),
keras_hub (ViTBackbone + ViTImageClassifier, if installed: `make bench` installs it), plain
(a straightforward Keras ViT: keras.layers.MultiHeadAttention with separate q/k/v einsums,
Dense, LayerNormalization, default settings) and timm (vit_base_patch16_224 in PyTorch eager,
`torch.inference_mode()`, in the same process: the two frameworks' thread pools take turns,
so a cross-framework ratio is measured without the machine's drift; bfloat16 policies run it
under `torch.autocast`) and timm_bf16 (timm with its parameters cast to bfloat16, no autocast:
the counterpart of a Keras "bfloat16" policy), keras_vit_bf16 (`performance.bfloat16_inference` of
the keras_vit model: its weights stored in bfloat16, norms and softmax as under mixed_bfloat16)
keras_vit_unchunked (JAX's CPU attention without query chunks at any length: the form before
`layers.matmul.CHUNK_QUERIES_ABOVE`) and keras_vit_autodiff (JAX's own gradients of the bfloat16
matmuls and attentions: the form before `layers.matmul.BFLOAT16_GRADIENT_DOTS`), keras_vit_gelu_bf16
(XLA's bfloat16 GELU: the form before `layers.matmul.BFLOAT16_GELU_IN_FLOAT32`),
keras_vit_attention_autodiff (JAX's own gradient of the attention: `ATTENTION_GRADIENT_GROUPS = 0`)
keras_vit_attention_groups (the attention gradient in 8 independent groups, not one) and
keras_vit_unsplit_dots (the attention's batched products without the row reduction that has
XLA:CPU run them on all threads: `SPLIT_BATCHED_DOTS = False`) and keras_vit_mkl (PyTorch's float32
matmuls by MKL's `addmm` instead of oneDNN on an AMD CPU: `ONEDNN_FLOAT32_MATMUL = False`) and
keras_vit_half_attention (PyTorch's bfloat16 flash attention kernel instead of the float32 one on
upcast copies: `TORCH_HALF_ATTENTION_IN_FLOAT32 = False`) and keras_vit_addmm (PyTorch's bfloat16
inference products by `torch.addmm` instead of oneDNN's op: `ONEDNN_BFLOAT16_MATMUL = False`).

`--train` times the compiled train step (`train_on_batch`: SGD with momentum, cross-entropy)
instead of inference:

    KERAS_BACKEND=jax .venv/bin/python benchmarks/ab_inprocess.py --policy mixed_bfloat16 --train \
        --models keras_vit,keras_vit_autodiff --batches 8

`--model` picks another model of benchmark.py's table (`dinov2_s14_518`, `clip_b16`, `siglip_b16`):
keras_vit's constructor and timm's architecture of the same model, at its image size:

    KERAS_BACKEND=jax .venv/bin/python benchmarks/ab_inprocess.py --model dinov2_s14_518 \
        --models keras_vit,keras_vit_unchunked,timm --batches 1
    KERAS_BACKEND=jax .venv/bin/python benchmarks/ab_inprocess.py --model clip_b16 --policy mixed_bfloat16 \
        --models keras_vit,keras_vit_bf16,timm --batches 1
"""

import argparse
import os
import time

import keras
import numpy as np
from keras import layers, ops


def plain_vit(image_size=224, patch=16, width=768, depth=12, heads=12, mlp=3072, classes=1000):
    """A straightforward Keras ViT-B/16, written the way the Keras guides do."""

    class ClassAndPosition(layers.Layer):
        def build(self, input_shape):
            tokens = input_shape[1] + 1
            self.cls = self.add_weight(shape=(1, 1, width), initializer="zeros", name="cls")
            self.pos = self.add_weight(shape=(1, tokens, width), initializer="random_normal", name="pos")

        def call(self, x):
            cls = ops.broadcast_to(self.cls, (ops.shape(x)[0], 1, width))
            return ops.concatenate([cls, x], axis=1) + self.pos

    inputs = keras.Input((image_size, image_size, 3))
    x = layers.Conv2D(width, patch, strides=patch)(inputs)
    x = layers.Reshape(((image_size // patch) ** 2, width))(x)
    x = ClassAndPosition()(x)
    for _ in range(depth):
        y = layers.LayerNormalization(epsilon=1e-6)(x)
        x = x + layers.MultiHeadAttention(heads, width // heads)(y, y)
        y = layers.LayerNormalization(epsilon=1e-6)(x)
        x = x + layers.Dense(width)(layers.Dense(mlp, activation="gelu")(y))
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    return keras.Model(inputs, layers.Dense(classes)(x[:, 0]))


class TimmModel:
    """timm's ViT-B/16 behind the two calls this script makes (compile, predict_on_batch)."""

    def __init__(self, bfloat16_weights=False, zoo="vit_b16"):
        import sys

        sys.modules.setdefault("triton", None)  # timm's optional triton import crashes beside TensorFlow
        import timm
        import torch

        from benchmark import MODELS

        _, architecture, size, classes, _ = MODELS[zoo]
        torch.set_num_threads(len(os.sched_getaffinity(0)))
        self.torch = torch
        self.model = timm.create_model(architecture, num_classes=classes, img_size=size).eval()
        self.bf16 = "bfloat16" in keras.config.dtype_policy().name
        self.weights_bf16 = bfloat16_weights
        if bfloat16_weights:  # bfloat16 parameters, no autocast: what a Keras "bfloat16" policy is
            self.model = self.model.to(torch.bfloat16)

    def compile(self, **kwargs):
        pass

    def predict_on_batch(self, x):
        torch = self.torch
        images = (x if isinstance(x, torch.Tensor) else torch.from_numpy(x)).permute(0, 3, 1, 2).contiguous()
        if self.weights_bf16:
            with torch.inference_mode():
                return self.model(images.to(torch.bfloat16)).float().numpy()
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=self.bf16):
            return self.model(images).float().numpy()


class MatmulSetting:
    """A keras_vit model traced and run with one of `keras_vit.layers.matmul`'s settings changed
    (`SETTINGS`)."""

    def __init__(self, model, setting, value):
        self.model, self.setting, self.value = model, setting, value

    def compile(self, **kwargs):
        self.model.compile(**kwargs)

    def _with_setting(self, method, *args):
        from keras_vit.layers import matmul

        before = getattr(matmul, self.setting)
        setattr(matmul, self.setting, self.value)
        try:
            return getattr(self.model, method)(*args)
        finally:
            setattr(matmul, self.setting, before)

    def predict_on_batch(self, x):
        return self._with_setting("predict_on_batch", x)

    def train_on_batch(self, x, y):
        return self._with_setting("train_on_batch", x, y)


#: keras_vit models traced with one of `keras_vit.layers.matmul`'s settings changed: name ->
#: (setting, value).
SETTINGS = {
    "keras_vit_unchunked": ("CHUNK_QUERIES_ABOVE", 1 << 30),
    "keras_vit_autodiff": ("BFLOAT16_GRADIENT_DOTS", False),
    "keras_vit_gelu_bf16": ("BFLOAT16_GELU_IN_FLOAT32", False),
    "keras_vit_attention_autodiff": ("ATTENTION_GRADIENT_GROUPS", 0),
    "keras_vit_attention_groups": ("ATTENTION_GRADIENT_GROUPS", 8),
    "keras_vit_unsplit_dots": ("SPLIT_BATCHED_DOTS", False),
    "keras_vit_mkl": ("ONEDNN_FLOAT32_MATMUL", False),
    "keras_vit_half_attention": ("TORCH_HALF_ATTENTION_IN_FLOAT32", False),
    "keras_vit_addmm": ("ONEDNN_BFLOAT16_MATMUL", False),
}


def build(name, zoo="vit_b16"):
    import keras_vit

    if zoo != "vit_b16" and name in ("keras_vit", "keras_vit_bf16", "timm", "timm_bf16", *SETTINGS):
        from benchmark import _keras_model

        if name.startswith("timm"):
            return TimmModel(bfloat16_weights=name == "timm_bf16", zoo=zoo)
        model = _keras_model({"library": "keras_vit", "options": {"model": zoo}})
        if name == "keras_vit_bf16":
            return keras_vit.performance.bfloat16_inference(model)
        return MatmulSetting(model, *SETTINGS[name]) if name in SETTINGS else model
    if zoo != "vit_b16":
        raise ValueError(f"--model {zoo}: choose keras_vit, keras_vit_bf16, {', '.join(SETTINGS)}, timm or timm_bf16")
    if name == "keras_vit":
        return keras_vit.ViTB16(weights=None)
    if name == "keras_vit_bf16":
        return keras_vit.performance.bfloat16_inference(keras_vit.ViTB16(weights=None))
    if name in SETTINGS:
        return MatmulSetting(keras_vit.ViTB16(weights=None), *SETTINGS[name])
    if name == "keras_vit_erf":
        return keras_vit.ViTB16(weights=None, gelu_approximate=False)
    if name in ("keras_vit_int8", "keras_vit_int8_mlp"):
        # int8 of every transformer matmul, or (the Keras default reach) of the Dense layers only.
        model = keras_vit.ViTB16(weights=None)
        model.quantize("int8", filters=None if name == "keras_vit_int8" else ["Dense_", "head"])
        return model
    if name == "keras_hub":
        from benchmark import _keras_model  # the same keras-hub model as benchmark.py's table

        return _keras_model({"library": "keras_hub"})
    if name == "plain":
        return plain_vit()
    if name == "timm":
        return TimmModel()
    if name == "timm_bf16":
        return TimmModel(bfloat16_weights=True)
    raise ValueError(
        f"unknown model {name!r}; choose from keras_vit, keras_vit_erf, keras_vit_int8, keras_vit_int8_mlp, "
        f"keras_vit_bf16, {', '.join(SETTINGS)}, keras_hub, plain, timm, timm_bf16"
    )


def main(argv=None):
    import keras_vit.performance

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="keras_vit,keras_hub,plain")
    parser.add_argument("--model", default="vit_b16", help="the architecture: a key of benchmark.py's MODELS")
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--reps", type=int, default=8, help="timed calls per model and batch size")
    parser.add_argument("--policy", default=None, help="dtype policy, e.g. mixed_bfloat16")
    parser.add_argument(
        "--jit-compile", default="recommended", choices=("recommended", "true", "false", "both"),
        help="jit_compile of the Keras models; 'both' builds each twice (name@eager, name@compiled)",
    )
    parser.add_argument(
        "--train", action="store_true",
        help="time train_on_batch (SGD with momentum, cross-entropy on random labels) instead of predict_on_batch",
    )
    parser.add_argument(
        "--torch-tensors", action="store_true",
        help="PyTorch backend: give the models a torch tensor instead of a NumPy array",
    )
    args = parser.parse_args(argv)
    if args.policy:
        keras.config.set_dtype_policy(args.policy)
    settings = {
        "recommended": [("", keras_vit.performance.recommended_jit_compile())],
        "true": [("", True)],
        "false": [("", False)],
        "both": [("@eager", False), ("@compiled", True)],
    }[args.jit_compile]
    names, models = [], {}
    for name in args.models.split(","):
        for suffix, jit in settings if not name.startswith("timm") else [("", None)]:
            model = build(name, args.model)
            if args.train:
                if name.startswith("timm"):
                    raise SystemExit("--train times the Keras models only (benchmarks/train_step.py runs timm's step)")
                model.compile(
                    optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), jit_compile=jit,
                )
            else:
                model.compile(jit_compile=jit)
            names.append(name + suffix)
            models[name + suffix] = model
    from benchmark import MODELS

    size = MODELS[args.model][2]
    print(f"backend {keras.backend.backend()}, policy {keras.config.dtype_policy().name}, {args.model}, "
          f"{'train steps' if args.train else 'inference'}, {args.reps} interleaved calls, "
          f"load {os.getloadavg()[0]:.1f}, malloc on huge pages: {keras_vit.huge_pages.started_with_huge_pages()}")
    for batch in (int(b) for b in args.batches.split(",")):
        x = np.random.default_rng(0).random((batch, size, size, 3), dtype="float32")
        if args.torch_tensors and keras.backend.backend() == "torch":
            import torch

            x = torch.from_numpy(x)
        labels = np.arange(batch) % 1000

        def call(model):
            return model.train_on_batch(x, labels) if args.train else model.predict_on_batch(x)

        for name, model in models.items():  # compile and warm up
            start = time.perf_counter()
            call(model)
            print(f"batch {batch:2d}  {name:14s} first call {time.perf_counter() - start:6.1f} s", flush=True)
            call(model)
        times = {name: [] for name in names}
        for rep in range(args.reps):
            for name in names if rep % 2 == 0 else names[::-1]:
                start = time.perf_counter()
                call(models[name])
                times[name].append(time.perf_counter() - start)
        base = min(times[names[0]])
        base_median = sorted(times[names[0]])[len(times[names[0]]) // 2]
        for name in names:
            t = sorted(times[name])
            print(
                f"batch {batch:2d}  {name:14s} best {batch / t[0]:6.2f} img/s  median {batch / t[len(t) // 2]:6.2f}"
                f"  ({base / t[0]:.2f}x of {names[0]}; median {base_median / t[len(t) // 2]:.2f}x)",
                flush=True,
            )
        print(f"load average after batch {batch}: {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
