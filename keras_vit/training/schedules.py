"""Learning-rate schedules of the paper's recipes: linear warm-up, then cosine or linear decay.

The formula is the original code's (google-research/vision_transformer `vit_jax/utils.py`
`create_learning_rate_schedule`; big_vision's is the same), evaluated at the update number
t = 0, 1, ..., total_steps - 1, the count optax's schedule state holds when update t is made:

    progress = clip((t - warmup_steps) / (total_steps - warmup_steps), 0, 1)
    cosine:  lr = base * 0.5 * (1 + cos(pi * progress))
    linear:  lr = end + (base - end) * (1 - progress)          (end: `linear_end`, 1e-5)
    then     lr = lr * min(1, t / warmup_steps)                (when warmup_steps > 0)

So a run with warm-up makes its first update with rate 0 and reaches `base` at update
`warmup_steps`. Keras calls a schedule with `optimizer.iterations`, the number of updates
already applied (0 for the first), which is t: update t uses the original's rate for t.
"""

import math

import keras
from keras import ops

register = keras.saving.register_keras_serializable(package="keras_vit")


def warmup_decay_value(step, base_learning_rate, total_steps, warmup_steps=0, decay="cosine",
                       end_learning_rate=0.0):
    """The rate of update number `step` (counted from 0), in plain Python: the formula above.

    Example:
        >>> round(warmup_decay_value(50, 0.01, 1000, warmup_steps=100), 6)
        0.005
        >>> warmup_decay_value(0, 0.01, 1000, warmup_steps=100)   # the first update
        0.0
    """
    progress = (step - warmup_steps) / float(max(1, total_steps - warmup_steps))
    progress = min(max(progress, 0.0), 1.0)
    if decay == "cosine":
        lr = base_learning_rate * 0.5 * (1.0 + math.cos(math.pi * progress))
    elif decay == "linear":
        lr = end_learning_rate + (base_learning_rate - end_learning_rate) * (1.0 - progress)
    else:
        raise ValueError(f"decay must be 'cosine' or 'linear'; got {decay!r}.")
    if warmup_steps:
        lr *= min(1.0, step / warmup_steps)
    return lr


@register
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up over `warmup_steps` updates, then cosine or linear decay to the end.

    Args:
        base_learning_rate: the peak learning rate, reached at the end of warm-up.
        total_steps: the number of updates of the whole run (the decay ends there; later steps
            keep the final value).
        warmup_steps: updates of linear warm-up from 0 (0: none).
        decay: "cosine" (fine-tuning recipe) or "linear" (pre-training recipe).
        end_learning_rate: final value of linear decay (the original code's `linear_end`, 1e-5);
            cosine decays to 0.

    Called with the number of updates already applied (`optimizer.iterations`; with gradient
    accumulation, the keras_vit optimizers pass applied updates, not micro-batches), so
    `total_steps` counts updates.

    Example:
        >>> schedule = WarmupDecay(0.01, total_steps=1000, warmup_steps=100)
        >>> round(float(schedule(50)), 6)   # update 50: half-way through warm-up
        0.005
    """

    def __init__(self, base_learning_rate, total_steps, warmup_steps=0, decay="cosine", end_learning_rate=0.0,
                 name=None):
        if decay not in ("cosine", "linear"):
            raise ValueError(f"decay must be 'cosine' or 'linear'; got {decay!r}.")
        if int(total_steps) < 1:
            raise ValueError(f"total_steps must be a positive number of updates; got {total_steps!r}.")
        if not 0 <= int(warmup_steps) <= int(total_steps):
            raise ValueError(
                f"warmup_steps must be between 0 and total_steps ({total_steps}); got {warmup_steps!r}. "
                "Use fewer warm-up steps or train longer."
            )
        self.base_learning_rate = float(base_learning_rate)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.end_learning_rate = float(end_learning_rate)
        self.name = name

    def __call__(self, step):
        s = ops.cast(step, "float32")
        span = float(max(1, self.total_steps - self.warmup_steps))
        progress = ops.clip((s - float(self.warmup_steps)) / span, 0.0, 1.0)
        if self.decay == "cosine":
            lr = self.base_learning_rate * 0.5 * (1.0 + ops.cos(math.pi * progress))
        else:
            lr = self.end_learning_rate + (self.base_learning_rate - self.end_learning_rate) * (1.0 - progress)
        if self.warmup_steps:
            lr = lr * ops.minimum(1.0, s / float(self.warmup_steps))
        return lr

    def get_config(self):
        return {
            "base_learning_rate": self.base_learning_rate,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "end_learning_rate": self.end_learning_rate,
            "name": self.name,
        }


@register
class WarmupCosineDecay(WarmupDecay):
    """Linear warm-up then cosine decay to 0: the fine-tuning schedule (500 warm-up steps).

    Example:
        >>> schedule = WarmupCosineDecay(0.003, total_steps=10_000, warmup_steps=500)
        >>> keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule)).total_steps
        10000
    """

    def __init__(self, base_learning_rate, total_steps, warmup_steps=0, name=None, **kwargs):
        kwargs.pop("decay", None)
        kwargs.pop("end_learning_rate", None)
        super().__init__(base_learning_rate, total_steps, warmup_steps, decay="cosine", name=name)

    def get_config(self):
        config = super().get_config()
        del config["decay"], config["end_learning_rate"]
        return config


@register
class WarmupLinearDecay(WarmupDecay):
    """Linear warm-up then linear decay to `end_learning_rate`: the pre-training schedule
    (10k warm-up steps; the original's end value 1e-5).

    Example:
        >>> schedule = WarmupLinearDecay(1e-3, total_steps=100, warmup_steps=10)
        >>> round(float(schedule(100)), 8)   # the end value, from update total_steps on
        1e-05
    """

    def __init__(self, base_learning_rate, total_steps, warmup_steps=0, end_learning_rate=1e-5, name=None, **kwargs):
        kwargs.pop("decay", None)
        super().__init__(
            base_learning_rate, total_steps, warmup_steps, decay="linear", end_learning_rate=end_learning_rate,
            name=name,
        )

    def get_config(self):
        config = super().get_config()
        del config["decay"]
        return config
