"""Tensors read from their file only when they are converted (`np.asarray`)."""

import numpy as np


class LazyArray:
    """A tensor that is read (and transposed, sliced, reshaped) only when `np.asarray` asks.

    Its shape is known up front, so config inference and validation need no data. Loading
    through lazy trees lets a model be built before the weights occupy memory, which keeps a
    conversion's peak near two copies of the weights.
    """

    __slots__ = ("_load", "shape")
    dtype = np.dtype(np.float32)

    def __init__(self, load, shape):
        self._load = load
        self.shape = tuple(int(s) for s in shape)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape, dtype=np.int64))

    def __array__(self, dtype=None, copy=None):
        array = self._load()
        return array if dtype is None else array.astype(dtype, copy=False)

    def _then(self, op, shape):
        load = self._load
        return LazyArray(lambda: op(load()), shape)

    @property
    def T(self):
        return self._then(lambda a: a.T, self.shape[::-1])

    def transpose(self, *axes):
        axes = tuple(axes[0]) if len(axes) == 1 and not isinstance(axes[0], int) else axes
        return self._then(lambda a: a.transpose(axes), tuple(self.shape[i] for i in axes))

    def reshape(self, *shape):
        shape = list(shape[0]) if len(shape) == 1 and not isinstance(shape[0], int) else list(shape)
        if -1 in shape:
            known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
            shape[shape.index(-1)] = self.size // known
        if int(np.prod(shape, dtype=np.int64)) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {tuple(shape)}")
        return self._then(lambda a: a.reshape(shape), shape)

    def __getitem__(self, index):
        # Slicing a zero-stride stand-in gives the result's shape without touching data.
        # The slice is copied out so that it does not keep its whole source tensor alive.
        shape = np.broadcast_to(np.zeros((), np.float32), self.shape)[index].shape
        return self._then(lambda a: np.ascontiguousarray(a[index]), shape)


def materialize(tree):
    """The tree with every LazyArray read into a numpy array."""
    return {k: (np.asarray(v) if isinstance(v, LazyArray) else v) for k, v in tree.items()}
