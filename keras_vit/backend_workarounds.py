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
