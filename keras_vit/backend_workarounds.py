"""Backend-specific workarounds at the model's edge (the layers themselves are keras.ops only,
apart from `layers.matmul`)."""

import keras


def torch_tensors(structure):
    """NumPy arrays in `structure` as tensors on the PyTorch backend; anything else as it is."""
    if keras.backend.backend() != "torch":
        return structure
    import numpy as np

    def convert(value):
        return keras.ops.convert_to_tensor(value) if isinstance(value, np.ndarray) else value

    return keras.tree.map_structure(convert, structure)


class TorchOnBatchInputs:
    """keras.Model mixin: the *_on_batch calls convert NumPy inputs to tensors first.

    They hand NumPy arrays to the compiled step, which converts them. Under torch.compile
    (PyTorch backend, jit_compile=True) that conversion breaks the graph at its first op (dynamo
    cannot trace ndarray.dtype), leaving the model as dozens of small graphs with Keras' Python
    between them; converted here first, the step is one graph (benchmarks/README.md).
    `predict`/`fit` already feed tensors. Other backends: unchanged.
    """

    def predict_on_batch(self, x):
        return super().predict_on_batch(torch_tensors(x))

    def test_on_batch(self, x, y=None, sample_weight=None, return_dict=False):
        x, y, sample_weight = torch_tensors((x, y, sample_weight))
        return super().test_on_batch(x, y, sample_weight=sample_weight, return_dict=return_dict)

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None, return_dict=False):
        x, y, sample_weight = torch_tensors((x, y, sample_weight))
        return super().train_on_batch(
            x, y, sample_weight=sample_weight, class_weight=class_weight, return_dict=return_dict
        )


class TraceTrainStepOnce:
    """keras.Model mixin (TensorFlow, PyTorch): the model's training state exists before the train
    step is traced or compiled, so that it is traced or compiled once.

    TensorFlow: without a distribution strategy, Keras creates the optimizer's variables and
    those of the compiled metrics inside the first trace of the train step, and a tf.function
    that creates variables is traced a second time. Each trace of a ViT's step costs seconds (a
    4-layer ViT: one short `fit` 12.3 s with the second trace, 5.6 s without). Here `fit` builds
    them first, as Keras itself does under a strategy, from the element spec of a tf.data.Dataset
    or the shapes of arrays (nothing is read from the data); `train_on_batch` builds the
    optimizer.

    PyTorch under torch.compile (`jit_compile=True`): Keras' train step starts with
    `zero_grad()`, which Dynamo guards on whether each weight's `.grad` is None. It is None
    before the first step and a tensor after it, so the step was compiled twice (a one-block
    ViT: 23 s, then 12 s more at the second step). Here the trainable weights get zero
    gradients before the step is first compiled (the step sets them to None before its own
    backward pass, so nothing reads them), and it compiles once. Other backends: unchanged.

    keras_vit's models and its trainers (`training.HardDistillation`,
    `training.MaskedPatchPrediction`) take it.
    """

    def _builds_before_tracing(self):
        """TensorFlow without a distribution strategy (under one, Keras builds first itself)."""
        return keras.backend.backend() == "tensorflow" and getattr(self, "_distribute_strategy", None) is None

    def fit(self, x=None, y=None, *args, **kwargs):
        if self._builds_before_tracing():
            batch = _symbolic_batch(x, y, kwargs.get("sample_weight"))
            if batch is not None and self.built and getattr(self, "compiled", False):
                try:
                    self._symbolic_build(data_batch=batch)
                except Exception:  # noqa: BLE001 - Keras reports the same problem when it traces the step
                    pass
        return super().fit(x, y, *args, **kwargs)

    def make_train_function(self, force=False):
        optimizer = getattr(self, "optimizer", None)
        if self._builds_before_tracing() and optimizer is not None and not optimizer.built and self.built:
            optimizer.build(self.trainable_variables)
        if (force or getattr(self, "train_function", None) is None) and self._torch_compiles_train_step():
            import torch

            for variable in self.trainable_variables:
                tensor = variable.value
                if tensor.requires_grad and tensor.grad is None:
                    tensor.grad = torch.zeros_like(tensor)
        return super().make_train_function(force=force)

    def _torch_compiles_train_step(self):
        """PyTorch with torch.compile chosen for the train step (Keras' own test of `jit_compile`)."""
        should_compile = getattr(self, "_should_torch_compile", None)
        return keras.backend.backend() == "torch" and should_compile is not None and bool(should_compile())


def _symbolic_batch(x, y, sample_weight):
    """(x, y, sample_weight) as KerasTensors of one batch, for a tf.data.Dataset or NumPy arrays;
    None for anything else."""
    import numpy as np
    import tensorflow as tf

    def symbolic(spec, batched):
        if spec is None:
            return None
        shape = tuple(spec.shape) if batched else (None, *spec.shape[1:])
        return keras.KerasTensor(shape, dtype=keras.backend.standardize_dtype(spec.dtype))

    if isinstance(x, tf.data.Dataset):
        if y is not None:
            return None
        element = keras.tree.map_structure(lambda s: symbolic(s, True), x.element_spec)
        return element if isinstance(element, tuple) else (element,)
    arrays = (x, y, sample_weight)
    if not isinstance(x, np.ndarray) or any(a is not None and not isinstance(a, np.ndarray) for a in arrays):
        return None
    return tuple(symbolic(a, False) for a in arrays)
