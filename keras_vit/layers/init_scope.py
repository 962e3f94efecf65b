"""How keras_vit's layers initialise their variables: zeros when every weight is assigned right
after, and random draws made on the host on JAX.

Random initialisers are not free on JAX: each distinct variable shape compiles its own
random-number program there, 0.1-0.2 s apiece on a CPU. A tiny ViT (two blocks) has about 30
of them and took 4 s to build; ViT-B/16 took 4.4 s where building it with zeros takes 0.9 s, and
a hybrid has dozens of shapes more. So:

- `skip_random_init()`: checkpoint loading overwrites every variable, so it builds the model
  inside this context, where keras_vit's layers create zero-filled variables. Loading stays
  strict: a weight the checkpoint lacks is an error before anything is assigned
  (keras_vit.models.weight_tree.set_weight_tree), so a zero can never be mistaken for a trained
  weight; a deliberately fresh head is zero-initialised in any case.
- `HostRandom`: on the JAX backend the layers' random initialisers (Keras' VarianceScaling
  family, RandomNormal, RandomUniform, TruncatedNormal, keras_vit's SplitFanXavierUniform) draw
  with NumPy instead, from the same distribution with the same parameters, and nothing
  compiles. The draws are reproducible as Keras' are: an initialiser with an integer seed (Keras
  gives each one such a seed from Python's `random`, which `keras.utils.set_random_seed` seeds)
  gives the same values for the same shape; a `SeedGenerator` or no seed draws a new seed at
  each call. They are not the values Keras' JAX random functions would give. TensorFlow and
  PyTorch draw eagerly without compiling, so there the initialisers run as Keras wrote them.
  User-supplied initialisers of other kinds always run as they are.
"""

import contextlib
import contextvars
import math
import random

import keras
import numpy as np

_SKIP = contextvars.ContextVar("keras_vit_skip_random_init", default=False)


@keras.saving.register_keras_serializable(package="keras_vit")
class SplitFanXavierUniform(keras.initializers.Initializer):
    """Xavier-uniform for kernels whose leading `in_axes` dims are the fan-in (Flax's convention
    for the per-head attention kernels); Keras' glorot would treat them as a receptive field."""

    def __init__(self, in_axes=1, seed=None):
        self.in_axes = int(in_axes)
        self.seed = seed

    def limit(self, shape):
        """The bound of the uniform draws, sqrt(6 / (fan_in + fan_out))."""
        fan_in = math.prod(shape[: self.in_axes])
        fan_out = math.prod(shape[self.in_axes :])
        return math.sqrt(6.0 / (fan_in + fan_out))

    def __call__(self, shape, dtype=None):
        limit = self.limit(shape)
        return keras.random.uniform(shape, -limit, limit, dtype=dtype, seed=self.seed)

    def get_config(self):
        return {"in_axes": self.in_axes, "seed": self.seed}


@contextlib.contextmanager
def skip_random_init():
    """Layers built inside this context get zero-filled variables (weights follow).

    Example:
        >>> with skip_random_init():  # doctest: +SKIP
        ...     model = keras_vit.VisionTransformer(**config)
        >>> set_weight_tree(model, tree)  # doctest: +SKIP
    """
    token = _SKIP.set(True)
    try:
        yield
    finally:
        _SKIP.reset(token)


def initializer(init):
    """What a layer's add_weight should use for `init`: "zeros" inside `skip_random_init()`,
    else `init`, drawn on the host on JAX (`host_random`)."""
    return "zeros" if _SKIP.get() else host_random(init)


def host_random(init):
    """`init` as a `HostRandom` on the JAX backend when it is one of the initialisers it knows
    (unchanged otherwise, and on other backends)."""
    if keras.backend.backend() != "jax" or isinstance(init, HostRandom):
        return init
    resolved = keras.initializers.get(init)
    return HostRandom(resolved) if _knows(resolved) else init


def unwrap(init):
    """The initialiser a `HostRandom` stands for (what configs record)."""
    return init.initializer if isinstance(init, HostRandom) else init


def _fans(shape, input_axes=None, output_axes=None):
    """(fan_in, fan_out) by Keras' rule: given axes, else the last two dims times the rest."""
    if input_axes is not None and output_axes is not None:
        return math.prod(shape[a] for a in input_axes), math.prod(shape[a] for a in output_axes)
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    receptive = math.prod(shape[:-2])
    return shape[-2] * receptive, shape[-1] * receptive


def _known_bases():
    ki = keras.initializers
    return (SplitFanXavierUniform, ki.VarianceScaling, ki.RandomNormal, ki.TruncatedNormal, ki.RandomUniform)


def _knows(init):
    """Whether `init` is one of the initialisers above and draws as its base class does (a
    subclass with a `__call__` of its own runs as it is)."""
    return any(isinstance(init, base) and type(init).__call__ is base.__call__ for base in _known_bases())


def _distribution(init, shape):
    """(kind, a, b) of the draws a known `init` makes for `shape`: ("uniform", low, high),
    ("normal", mean, stddev) or ("truncated", mean, stddev), truncated at two standard deviations
    (the underlying normal's, as Keras draws it)."""
    ki = keras.initializers
    if isinstance(init, SplitFanXavierUniform):
        limit = init.limit(shape)
        return "uniform", -limit, limit
    if isinstance(init, ki.VarianceScaling):
        fan_in, fan_out = _fans(tuple(shape), init.input_axes, init.output_axes)
        denominator = {"fan_in": fan_in, "fan_out": fan_out}.get(init.mode, (fan_in + fan_out) / 2.0)
        scale = init.scale / max(1.0, denominator)
        if init.distribution == "truncated_normal":
            return "truncated", 0.0, math.sqrt(scale) / 0.87962566103423978  # Keras' unit-variance correction
        if init.distribution == "untruncated_normal":
            return "normal", 0.0, math.sqrt(scale)
        limit = math.sqrt(3.0 * scale)
        return "uniform", -limit, limit
    if isinstance(init, ki.RandomNormal):
        return "normal", init.mean, init.stddev
    if isinstance(init, ki.TruncatedNormal):
        return "truncated", init.mean, init.stddev
    return "uniform", init.minval, init.maxval  # RandomUniform


def _seed_entropy(seed, shape):
    """NumPy seed material for one draw: an integer seed with the shape (same seed and shape,
    same values, as in Keras), else a fresh seed from the generator or from Python's `random`."""
    if isinstance(seed, int) and not isinstance(seed, bool):
        return [seed & 0xFFFFFFFF, *shape]
    if isinstance(seed, keras.random.SeedGenerator):
        return [int(v) & 0xFFFFFFFF for v in keras.ops.convert_to_numpy(seed.next()).ravel()]
    return random.getrandbits(64)


def _draw(kind, a, b, shape, rng):
    if kind == "uniform":
        return rng.uniform(a, b, shape)
    z = rng.standard_normal(shape)
    if kind == "truncated":  # redraw what lies beyond two standard deviations (4.6% a round)
        flat = z.reshape(-1)
        outside = np.flatnonzero(np.abs(flat) > 2.0)
        while outside.size:
            flat[outside] = rng.standard_normal(outside.size)
            outside = outside[np.abs(flat[outside]) > 2.0]
    return z * b + a


@keras.saving.register_keras_serializable(package="keras_vit")
class HostRandom(keras.initializers.Initializer):
    """`initializer`'s distribution drawn with NumPy on the host (see the module docstring)."""

    def __init__(self, initializer):
        self.initializer = keras.initializers.get(initializer)
        if not _knows(self.initializer):
            raise ValueError(f"HostRandom cannot draw for {type(self.initializer).__name__}; use it directly.")

    def __call__(self, shape, dtype=None):
        shape = tuple(int(d) for d in shape)
        kind, a, b = _distribution(self.initializer, shape)
        rng = np.random.default_rng(_seed_entropy(getattr(self.initializer, "seed", None), shape))
        values = _draw(kind, a, b, shape, rng)
        # float32 (Keras casts it to a float16 or bfloat16 variable's dtype)
        dtype = keras.backend.standardize_dtype(dtype or keras.config.floatx())
        return values if dtype == "float64" else values.astype("float32")

    def get_config(self):
        return {"initializer": keras.initializers.serialize(self.initializer)}

    @classmethod
    def from_config(cls, config):
        return cls(keras.initializers.deserialize(config["initializer"]))
