"""Checkpoint values enter the backend's own memory exactly as NumPy lays them out: strided views
(transposed kernels, reshaped and sliced ones) are copied axis for axis, and the variable never
aliases the source."""

import keras
import numpy as np
import pytest

from keras_vit.models.weight_tree import _ValueInitializer, contiguous_layout


def _views():
    r = np.random.default_rng(0)
    w = r.standard_normal((48, 40)).astype(np.float32)  # a PyTorch (out, in) weight
    conv = r.standard_normal((6, 3, 4, 4)).astype(np.float32)  # (out, in, kh, kw)
    return {
        "contiguous": w,
        "transposed": w.T,  # a Linear kernel
        "rows_transposed": w[8:24].T,  # one of q, k, v from a fused qkv weight
        "transposed_split": w.T.reshape(40, 4, 12),  # (hidden, heads, head_dim)
        "split_transposed": w.T.reshape(5, 8, 48),  # (heads, head_dim, hidden)
        "conv": conv.transpose(2, 3, 1, 0),  # (kh, kw, in, out): not a matrix transpose
        "every_other_row": w[::2],  # gaps: no permutation makes it contiguous
        "broadcast": np.broadcast_to(w[:1], (5, 40)),
        "vector": w[0],
        "scalar": np.float32(3.5).reshape(()),
    }


@pytest.mark.parametrize("name", list(_views()))
def test_initialiser_copies_every_layout(name):
    view = _views()[name]
    tensor = _ValueInitializer(view)(view.shape, "float32")
    got = keras.ops.convert_to_numpy(tensor)
    np.testing.assert_array_equal(got, np.ascontiguousarray(view))
    assert got.shape == view.shape
    variable = keras.Variable(tensor)
    source = np.array(view)
    if view.flags.writeable and view.size:
        view[...] = -1  # the variable holds a copy of its own
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), source)


def test_contiguous_layout():
    w = np.arange(24, dtype=np.float32).reshape(4, 6)
    base, axes = contiguous_layout(w.T)
    assert base.flags.c_contiguous and np.shares_memory(base, w) and axes == (1, 0)
    np.testing.assert_array_equal(base.transpose(axes), w.T)
    base, axes = contiguous_layout(w.T.reshape(3, 2, 4))
    np.testing.assert_array_equal(base.transpose(axes), w.T.reshape(3, 2, 4))
    assert contiguous_layout(w[::2]) is None
    assert contiguous_layout(np.broadcast_to(w[:1], (3, 6))) is None
