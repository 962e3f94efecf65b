"""The paper's optimizers: SGD with momentum for fine-tuning, Adam with decoupled weight decay
for pre-training, both with global-norm clipping, optional gradient accumulation and Polyak
averaging (EMA).

They are Keras' own `SGD` and `AdamW` with corrections, so `model.fit` runs them compiled on
JAX, TensorFlow and PyTorch:

- With `gradient_accumulation_steps=N` Keras averages N micro-batch gradients and applies one
  update (clipping the averaged gradient), which is one step on the N-times larger batch. But
  Keras 3 evaluates a learning-rate schedule at the micro-step count (so warm-up and decay
  would run N times too fast), and its EMA moves on every micro-batch (decaying with
  momentum**N per update). Here the schedule sees applied updates and the EMA moves only when
  an update is applied: N accumulated micro-batches then equal one large-batch step exactly
  (tests/test_training_fit.py).
- `AdamW` decays only variables whose name matches `weight_decay_pattern` (default: kernels),
  the rule of big_vision (`.*/kernel$`): biases, LayerNorm/GroupNorm scales, the class token and
  the position embedding are not decayed. The 2020 code (flax.optim.Adam(weight_decay=...))
  decayed every parameter; pass `weight_decay_pattern=None` for that.

- On JAX, Keras' `finalize_variable_values` (end of `fit` with use_ema) assigns the averages'
  own arrays to the model variables; both are donated to the next train step, so a second
  `fit` fails. Copies are assigned here.

Keras decays as w <- w - lr * wd * w (decoupled, scaled by the current learning rate), which is
flax.optim.Adam's weight decay. Keras' SGD momentum keeps lr inside the velocity
(v <- m v - lr g; w <- w + v), the original (optax/flax momentum) outside (v <- m v + g;
w <- w - lr v): identical for a constant rate, slightly different while the schedule moves.
"""

import re

import keras
from keras import ops

from keras_vit.training.schedules import WarmupCosineDecay, WarmupLinearDecay

register = keras.saving.register_keras_serializable(package="keras_vit")


class _AccumulationFixes:
    """Mixin: under gradient accumulation, the schedule sees applied updates and the EMA moves
    only on steps that apply an update."""

    def _get_current_learning_rate(self):
        # Keras 3 evaluates a schedule at the micro-step counter `_iterations`, although its
        # docs promise `iterations` (= micro-steps // N): N accumulated micro-batches would
        # then use the rate of step N*k instead of k. Use the applied-update count.
        if self.gradient_accumulation_steps and isinstance(
            self._learning_rate, keras.optimizers.schedules.LearningRateSchedule
        ):
            return self._learning_rate(self.iterations)
        return super()._get_current_learning_rate()

    def _update_model_variables_moving_average(self, trainable_variables):
        if not self.use_ema:
            return
        if not self.gradient_accumulation_steps:
            return super()._update_model_variables_moving_average(trainable_variables)
        steps = self.gradient_accumulation_steps
        # Runs before the micro-step counter is incremented: this micro-step applies an update
        # when (micro-steps so far + 1) is a multiple of N; `self.iterations` is then the number
        # of updates applied before this one.
        is_update = ops.equal(ops.mod(self._iterations + 1, steps), 0)
        not_first = ops.not_equal(self.iterations, 0)
        for var, average in zip(trainable_variables, self._model_variables_moving_average):
            if average is None:
                continue
            momentum = ops.cast(not_first, var.dtype) * ops.cast(self.ema_momentum, var.dtype)
            moved = momentum * average.value + (1.0 - momentum) * var.value
            average.assign(ops.where(is_update, moved, average.value))

    def _overwrite_model_variables_with_average_value(self, trainable_variables):
        # Copies, not the averages' own arrays: JAX donates both buffers to the next train step.
        if keras.backend.backend() != "jax":
            return super()._overwrite_model_variables_with_average_value(trainable_variables)
        for var, average in zip(trainable_variables, self._model_variables_moving_average):
            if average is not None:
                var.assign(ops.copy(average.value))


@register
class SGD(_AccumulationFixes, keras.optimizers.SGD):
    """keras.optimizers.SGD whose EMA moves once per applied update under gradient accumulation.

    Example:
        >>> opt = SGD(0.01, momentum=0.9, global_clipnorm=1.0, use_ema=True, gradient_accumulation_steps=4)
    """


@register
class AdamW(_AccumulationFixes, keras.optimizers.AdamW):
    """keras.optimizers.AdamW that decays only variables whose name matches `weight_decay_pattern`.

    Args:
        weight_decay_pattern: regular expression searched in each variable's name (without a
            ":0" suffix); default "kernel$" (dense, attention and conv kernels). None decays all.
        Other arguments: those of keras.optimizers.AdamW.

    Example:
        >>> opt = AdamW(1e-3, weight_decay=0.1)
        >>> opt.weight_decay_pattern
        'kernel$'
    """

    def __init__(self, *args, weight_decay_pattern="kernel$", **kwargs):
        super().__init__(*args, **kwargs)
        self.weight_decay_pattern = weight_decay_pattern
        self._weight_decay_regex = None if weight_decay_pattern is None else re.compile(weight_decay_pattern)

    def _use_weight_decay(self, variable):
        if not super()._use_weight_decay(variable):
            return False
        if self._weight_decay_regex is None:
            return True
        name = str(variable.name).split(":")[0].split("/")[-1]
        return self._weight_decay_regex.search(name) is not None

    def get_config(self):
        config = super().get_config()
        config["weight_decay_pattern"] = self.weight_decay_pattern
        return config


def _schedule(learning_rate, total_steps, warmup_steps, schedule_cls, **kwargs):
    if isinstance(learning_rate, keras.optimizers.schedules.LearningRateSchedule) or callable(learning_rate):
        return learning_rate
    if total_steps is None:
        raise ValueError(
            "total_steps is needed to build the warm-up + decay schedule (the number of optimizer "
            "updates of the run, e.g. 10_000 for CIFAR fine-tuning); or pass a schedule as learning_rate."
        )
    return schedule_cls(learning_rate, total_steps, warmup_steps, **kwargs)


def finetune_optimizer(
    learning_rate=0.003,
    total_steps=None,
    warmup_steps=500,
    *,
    momentum=0.9,
    global_clipnorm=1.0,
    gradient_accumulation_steps=None,
    use_ema=False,
    ema_momentum=0.9999,
):
    """The paper's fine-tuning optimizer: SGD momentum 0.9, global-norm clip 1.0, no weight
    decay, linear warm-up then cosine decay.

    Args:
        learning_rate: base learning rate (the paper sweeps {0.001, 0.003, 0.01, 0.03}) or a
            ready LearningRateSchedule.
        total_steps: optimizer updates of the run (CIFAR 10k, ImageNet 20k, Pets/Flowers 500).
        warmup_steps: linear warm-up updates (500; 100 for the 500-step runs).
        gradient_accumulation_steps: average the gradients of this many micro-batches per update
            (the paper's batch 512 as e.g. 8 x 64). Steps above count updates, not micro-batches.
        use_ema, ema_momentum: Polyak averaging of the weights (the paper's 0.9999 for Table 2);
            evaluate/save with it through `SwapEMAWeights` / `ema_weights`. At the end of `fit`
            Keras leaves the averaged weights in the model.

    Example:
        >>> opt = finetune_optimizer(0.01, total_steps=500, warmup_steps=100)
        >>> opt.momentum, opt.global_clipnorm
        (0.9, 1.0)
    """
    return SGD(
        learning_rate=_schedule(learning_rate, total_steps, warmup_steps, WarmupCosineDecay),
        momentum=momentum,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps,
        use_ema=use_ema,
        ema_momentum=ema_momentum,
    )


def pretrain_optimizer(
    learning_rate=1e-3,
    total_steps=None,
    warmup_steps=10_000,
    *,
    weight_decay=0.1,
    beta_1=0.9,
    beta_2=0.999,
    end_learning_rate=1e-5,
    global_clipnorm=1.0,
    weight_decay_pattern="kernel$",
    gradient_accumulation_steps=None,
    use_ema=False,
    ema_momentum=0.9999,
):
    """The paper's pre-training optimizer: Adam (0.9, 0.999) with decoupled weight decay 0.1,
    global-norm clip 1.0, linear warm-up (10k steps) then linear decay to 1e-5.

    Weight decay applies to kernels only (see `AdamW`); `weight_decay_pattern=None` decays all.

    Example:
        >>> opt = pretrain_optimizer(1e-3, total_steps=100_000)
        >>> opt.weight_decay
        0.1
    """
    return AdamW(
        learning_rate=_schedule(
            learning_rate, total_steps, warmup_steps, WarmupLinearDecay, end_learning_rate=end_learning_rate
        ),
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        global_clipnorm=global_clipnorm,
        weight_decay_pattern=weight_decay_pattern,
        gradient_accumulation_steps=gradient_accumulation_steps,
        use_ema=use_ema,
        ema_momentum=ema_momentum,
    )
