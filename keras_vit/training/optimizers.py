"""The paper's optimizers, with the original code's arithmetic: SGD momentum in optax's trace
form for fine-tuning, Adam with decoupled weight decay for pre-training, both after a
global-norm clip, with optional gradient accumulation and Polyak averaging (EMA).

They subclass Keras' `SGD` and `AdamW`, so `model.fit` runs them compiled on JAX, TensorFlow
and PyTorch, and Keras' clipping, accumulation, EMA and serialisation apply:

- `SGD` is optax's `sgd(rate, momentum)` after `clip_by_global_norm` (the original fine-tuning
  code, vit_jax/train.py): `trace <- g + momentum * trace; w <- w - rate_t * trace`. The rate is
  applied outside the trace (Keras' own SGD keeps it inside the velocity, v <- m v - rate_t g,
  which differs whenever the schedule moves). `momentum_dtype="bfloat16"` stores the trace in
  bfloat16 as the original's `accumulator_dtype="bfloat16"` does in its compiled (XLA) step:
  the new trace is computed in the gradient's dtype (the stored trace times the momentum rounded
  to bfloat16, the product not rounded, plus the gradient), the update uses it unrounded and the
  stored copy is rounded. The same arithmetic runs on every backend.
- `AdamW` is optax's `adamw` after the clip: moments m, v; m_hat = m / (1 - b1^k),
  v_hat = v / (1 - b2^k) (k = updates including this one); w <- w - rate_t * (m_hat /
  (sqrt(v_hat) + eps) + wd * w) for decayed variables. eps is added outside the bias
  correction (optax; default 1e-8), unlike Keras' Adam. The decay is decoupled and scaled by
  the current rate: big_vision's `wd` (added after its `lr` scale, before the schedule) equals
  `weight_decay * base rate` here (its ImageNet-21k ViT config: lr 1e-3, wd 1e-4 = 0.1 x 1e-3).
  Only variables whose name matches `weight_decay_pattern` (default: kernels) decay, big_vision's
  `.*/kernel$` rule: biases, LayerNorm/GroupNorm scales, the class token and the position
  embedding are not decayed. `weight_decay_pattern=None` decays every parameter.
  `decayed_variables=` names the decayed variables instead; `timm_weight_decay(model)` gives timm's
  rule (`param_groups_weight_decay`: every weight but biases, norms, layer scales and the family's
  `no_weight_decay` tokens and position embedding), which `pretrain_optimizer(...,
  weight_decay_rule="timm", model=model)` uses.
- Gradient accumulation (`gradient_accumulation_steps=N`, fed micro-batches of B / N): Keras
  sums the gradients of N successive micro-batches, divides by N, clips the average and applies
  ONE update, which is the original's `accumulate_gradient` on the batch of B made of those
  micro-batches in order. Keras 3 evaluates a learning-rate schedule at the micro-step count
  and moves its EMA on every micro-batch; here the schedule sees applied updates and the EMA
  moves only when an update is applied.
- Per-variable learning rates (`learning_rate_scales={variable path: scale}`): each variable's
  update uses rate_t * scale (and, for AdamW, decays by rate_t * scale * weight_decay * w), as a
  PyTorch parameter group's `lr_scale` does in timm's layer-wise decay and optax's
  `multi_transform` with per-group scaled rates does. `layer_decay_scales(model, decay)` gives
  timm's `param_groups_layer_decay` scales from the model family's layer grouping.
- On JAX, Keras' `finalize_variable_values` (end of `fit` with use_ema) assigns the averages'
  own arrays to the model variables; both are donated to the next train step, so a second
  `fit` fails. Copies are assigned here.

The update runs per variable in `update_step` (fused by XLA on JAX and TensorFlow), or as
`torch._foreach_*` calls over all variables on PyTorch, as Keras' own optimizers do.
"""

import math
import re
from collections.abc import Mapping

import keras
from keras import ops

from keras_vit.training.schedules import WarmupCosineDecay, WarmupLinearDecay

register = keras.saving.register_keras_serializable(package="keras_vit")


def _torch():
    return keras.backend.backend() == "torch"


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


class _LearningRateScales:
    """Mixin: a learning-rate scale per variable (`learning_rate_scales`, keyed by variable path)."""

    def _init_scales(self, learning_rate_scales):
        self.learning_rate_scales = _normalise_scales(learning_rate_scales)
        self._scale_list = None

    def _build_scales(self, variables):
        """One scale per variable of `variables` (in the optimizer's variable order)."""
        scales = self.learning_rate_scales
        if not scales:
            self._scale_list = None
            return
        paths = [_variable_path(v) for v in variables]
        repeated = sorted({p for p in paths if p in scales and paths.count(p) > 1})
        if repeated:
            raise ValueError(
                f"learning_rate_scales names {', '.join(repeated[:3])}, a path that several trained variables share; "
                "give the model's layers unique names."
            )
        if not set(paths) & set(scales):
            raise ValueError(
                f"learning_rate_scales names none of the variables this optimizer trains (it names e.g. "
                f"{next(iter(scales))!r}; the variables are e.g. {paths[0] if paths else None!r}): compute the scales "
                "from the model being trained, e.g. layer_decay_scales(model, 0.75)."
            )
        self._scale_list = [scales.get(p, 1.0) for p in paths]

    def _variable_scale(self, variable):
        """The variable's scale (a Python float), 1.0 without scales."""
        if not self._scale_list:
            return 1.0
        return self._scale_list[self._get_variable_index(variable)]

    def _scale_groups(self, grads, trainable_variables):
        """[(scale, grads, variables)] grouping the variables of equal scale (the PyTorch path)."""
        groups = {}
        for g, v in zip(grads, trainable_variables):
            entry = groups.setdefault(self._variable_scale(v), ([], []))
            entry[0].append(g)
            entry[1].append(v)
        return [(scale, g, v) for scale, (g, v) in groups.items()]

    def _scales_config(self, config):
        config["learning_rate_scales"] = dict(self.learning_rate_scales) or None
        return config


def _variable_path(variable):
    return getattr(variable, "path", None) or str(variable.name).split(":")[0]


def _normalise_scales(scales):
    """{variable path: float scale} of a mapping keyed by variables or paths (None: {})."""
    if scales is None:
        return {}
    if not isinstance(scales, Mapping):
        raise TypeError(
            "learning_rate_scales must be a mapping {variable or variable path: scale}, e.g. "
            f"layer_decay_scales(model, 0.75); got {type(scales).__name__}."
        )
    out = {}
    for key, scale in scales.items():
        path = key if isinstance(key, str) else _variable_path(key)
        try:
            scale = float(scale)
        except (TypeError, ValueError):
            scale = float("nan")
        if not (math.isfinite(scale) and scale >= 0):
            raise ValueError(f"learning_rate_scales[{path!r}] must be a finite number >= 0; got {scales[key]!r}.")
        out[path] = scale
    return out


def layer_decay_scales(model, layer_decay, *, min_scale=0.0):
    """Layer-wise learning-rate decay (BEiT; the MAE and DINOv2 fine-tuning recipes) as timm's
    `param_groups_layer_decay` computes it: {variable path: scale} for `SGD` / `AdamW`'s
    `learning_rate_scales`.

    The model's family groups its weights from input to output (a ViT: the stem, i.e. patch
    embedding, class/distillation/register tokens, position embedding and `norm_pre`, then one
    group per encoder block, the final norm with the last block, then the head and whatever
    follows the blocks: `fc_norm`, a MAP head, `pre_logits`). With G groups, group g (from 0)
    gets scale max(min_scale, layer_decay ** (G - 1 - g)): the last group trains at the full
    rate, each group before it `layer_decay` times slower.

    Args:
        model: a keras_vit model of a family with a layer grouping (the Vision Transformers and the
            Axial-ViTs, whose layer i groups its row and column blocks; others
            are refused with a ValueError).
        layer_decay: the decay per group, in (0, 1] (0.65 MAE ViT-B, 0.75 BEiT, 0.9 DINOv2's linear
            probes fine-tuned).
        min_scale: the smallest scale (timm's `min_scale`).

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...                                     num_layers=2, num_heads=2, mlp_dim=32, classes=10)
        >>> scales = layer_decay_scales(model, 0.5)
        >>> scales["embedding/kernel"], scales["encoderblock_1/MlpBlock_3/Dense_0/kernel"], scales["head/kernel"]
        (0.125, 0.5, 1.0)
    """
    from keras_vit.models.family import family_of
    from keras_vit.models.weight_tree import weight_variables

    try:
        layer_decay = float(layer_decay)
    except (TypeError, ValueError):
        layer_decay = float("nan")
    if not 0.0 < layer_decay <= 1.0:
        raise ValueError(f"layer_decay must be in (0, 1], e.g. 0.75; got {layer_decay!r}.")
    family = family_of(model)
    variables = weight_variables(model)
    ordinals = family.layer_group_ordinals(variables)
    if ordinals is None:
        raise ValueError(
            f"{family.title} models have no layer grouping for layer-wise learning-rate decay (keras_vit groups the "
            "blocks of the Vision Transformers, as timm does, and the layers of the Axial-ViTs); train them without "
            "layer_decay."
        )
    ranks = {o: i for i, o in enumerate(sorted(set(ordinals.values())))}
    last = len(ranks) - 1
    return {
        _variable_path(var): max(float(min_scale), layer_decay ** (last - ranks[ordinals[key]]))
        for key, var in variables.items()
    }


def timm_weight_decay(model):
    """The variable paths timm's weight-decay rule decays (`param_groups_weight_decay`, the rule of
    timm's `create_optimizer_v2` and of its layer-decay fine-tuning): every weight of 2 or more
    dimensions in timm's layout that is no bias (the query/key/value biases, 2-D here, are 1-D in
    timm), and not one of the family's `no_weight_decay` weights (a ViT's class, register and
    distillation tokens and its position embedding, RoPE-Mixed's rotary frequencies: timm's
    `no_weight_decay()`). Norm scales,
    biases and layer scales are not decayed; kernels and a MAP head's probe are.

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...                                     num_layers=1, num_heads=2, mlp_dim=32, classes=10)
        >>> decayed = timm_weight_decay(model)
        >>> "head/kernel" in decayed, "head/bias" in decayed, "posembed_input/pos_embedding" in decayed
        (True, False, False)
    """
    from keras_vit.models.family import family_of
    from keras_vit.models.weight_tree import weight_variables

    excluded = family_of(model).no_weight_decay
    decayed = []
    for key, var in weight_variables(model).items():
        if len(var.shape) < 2 or key.endswith("/bias"):
            continue
        if any(key == name or (name.endswith("/") and key.startswith(name))
               or (name.startswith("/") and key.endswith(name)) for name in excluded):
            continue
        decayed.append(_variable_path(var))
    return sorted(decayed)


@register
class SGD(_AccumulationFixes, _LearningRateScales, keras.optimizers.SGD):
    """SGD with momentum as optax's `sgd`: the trace of raw gradients, the rate applied outside.

    trace <- g + momentum * trace;  w <- w - rate_t * trace  (Nesterov: w <- w - rate_t *
    (g + momentum * trace)). Clipping, accumulation and EMA are Keras' (see the module notes).

    Args:
        momentum_dtype: dtype of the stored trace. None: the variable's. "bfloat16": the
            original fine-tuning code's `accumulator_dtype` (half the optimizer state); the
            trace is computed in the gradient's dtype and rounded when stored, as the
            original's compiled optax step does.
        learning_rate_scales: {variable or variable path: scale}: those variables are updated at
            rate_t * scale (the others at rate_t), e.g. `layer_decay_scales(model, 0.75)`.
        Other arguments: those of keras.optimizers.SGD.

    Example:
        >>> opt = SGD(0.01, momentum=0.9, momentum_dtype="bfloat16", global_clipnorm=1.0)
        >>> opt.momentum_dtype
        'bfloat16'
    """

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, *, momentum_dtype=None,
                 learning_rate_scales=None, **kwargs):
        super().__init__(learning_rate=learning_rate, momentum=momentum, nesterov=nesterov, **kwargs)
        self._init_scales(learning_rate_scales)
        if momentum_dtype is not None:
            momentum_dtype = keras.backend.standardize_dtype(momentum_dtype)
            if momentum_dtype not in ("float16", "bfloat16", "float32", "float64"):
                raise ValueError(
                    f"momentum_dtype must be a floating dtype such as 'float32' or 'bfloat16' (or None for "
                    f"the variables' own dtype); got {momentum_dtype!r}."
                )
        self.momentum_dtype = momentum_dtype

    def build(self, variables):
        if self.built:
            return
        # Keras' optimizer build (accumulators, EMA, indices); the trace variables are made here.
        super(keras.optimizers.SGD, self).build(variables)
        self._build_scales(variables)
        self.momentums = []
        if self.momentum != 0:
            self.momentums = [self._add_trace(v) for v in variables]

    def _add_trace(self, variable):
        if getattr(variable, "overwrite_with_gradient", False):
            return None
        if self.momentum_dtype is None or self.momentum_dtype == variable.dtype:
            return self.add_variable_from_reference(variable, name="momentum")
        path = getattr(variable, "path", None) or str(variable.name).replace(":", "_")
        make = lambda: self.add_variable(  # noqa: E731
            shape=variable.shape, dtype=self.momentum_dtype, name=f"{path.replace('/', '_')}_momentum",
            layout=getattr(variable, "_layout", None),
        )
        strategy = getattr(self, "_distribution_strategy", None)  # TensorFlow: beside the variable
        if strategy is None:
            return make()
        with strategy.extended.colocate_vars_with(getattr(variable, "value", variable)):
            return make()

    def update_step(self, gradient, variable, learning_rate):
        learning_rate = ops.cast(learning_rate, variable.dtype)
        scale = self._variable_scale(variable)
        if scale != 1.0:
            learning_rate = ops.multiply(learning_rate, ops.cast(scale, variable.dtype))
        gradient = ops.cast(gradient, variable.dtype)
        if self.momentum == 0:
            self.assign_sub(variable, ops.multiply(gradient, learning_rate))
            return
        trace = self.momentums[self._get_variable_index(variable)]
        # optax's `g + momentum * trace` as XLA runs it in the original's compiled step: the
        # momentum is rounded to the stored trace's dtype (a weakly typed constant), the product
        # and the sum are in the gradient's dtype (XLA does not round the product to bfloat16).
        momentum = ops.cast(ops.cast(self.momentum, trace.dtype), gradient.dtype)
        decayed = ops.multiply(ops.cast(trace, gradient.dtype), momentum)
        new_trace = ops.add(gradient, decayed)
        self.assign(trace, new_trace if trace.dtype == new_trace.dtype else ops.cast(new_trace, trace.dtype))
        if self.nesterov:
            new_trace = ops.add(gradient, ops.multiply(new_trace, ops.cast(self.momentum, gradient.dtype)))
        self.assign_sub(variable, ops.multiply(new_trace, learning_rate))

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        traces = [self.momentums[self._get_variable_index(v)] for v in trainable_variables] if self.momentum else []
        same = all(t.dtype == v.dtype for t, v in zip(traces, trainable_variables))
        if not _torch() or not same:
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import torch

        with torch.no_grad():
            for scale, group_grads, group in self._scale_groups(grads, trainable_variables):
                self._torch_update(group_grads, group, -float(learning_rate) * scale, torch)

    def _torch_update(self, grads, variables, rate, torch):
        values = [v.value for v in variables]
        grads = [g.to(v.dtype) for g, v in zip(grads, values)]
        if not self.momentum:
            torch._foreach_add_(values, grads, alpha=rate)
            return
        buffers = [self.momentums[self._get_variable_index(v)].value for v in variables]
        torch._foreach_mul_(buffers, self.momentum)
        torch._foreach_add_(buffers, grads)
        if self.nesterov:
            torch._foreach_add_(values, grads, alpha=rate)
            torch._foreach_add_(values, buffers, alpha=rate * self.momentum)
        else:
            torch._foreach_add_(values, buffers, alpha=rate)

    def get_config(self):
        config = super().get_config()
        config["momentum_dtype"] = self.momentum_dtype
        return self._scales_config(config)


@register
class AdamW(_AccumulationFixes, _LearningRateScales, keras.optimizers.AdamW):
    """Adam with decoupled weight decay as optax's `adamw`, decaying only the variables whose name
    matches `weight_decay_pattern`.

    m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2;  k = updates including this one;
    w <- w - rate_t * (m / (1 - b1^k) / (sqrt(v / (1 - b2^k)) + eps) + weight_decay * w).

    Args:
        epsilon: added to sqrt(v_hat), after the bias correction (optax); default 1e-8.
        weight_decay_pattern: regular expression searched in each variable's name (without a
            ":0" suffix); default "kernel$" (dense, attention and conv kernels). None decays all.
        decayed_variables: the variables (or variable paths) that decay, instead of the pattern,
            e.g. `timm_weight_decay(model)`; None: the pattern decides.
        learning_rate_scales: {variable or variable path: scale}: those variables are updated and
            decayed at rate_t * scale (a PyTorch parameter group's `lr_scale`), e.g.
            `layer_decay_scales(model, 0.75)`.
        Other arguments: those of keras.optimizers.AdamW (amsgrad is not supported).

    Example:
        >>> opt = AdamW(1e-3, weight_decay=0.1)
        >>> opt.weight_decay_pattern, opt.epsilon
        ('kernel$', 1e-08)
    """

    def __init__(self, learning_rate=0.001, weight_decay=0.004, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 amsgrad=False, *, weight_decay_pattern="kernel$", decayed_variables=None, learning_rate_scales=None,
                 **kwargs):
        if amsgrad:
            raise ValueError("keras_vit's AdamW is optax's adamw, without AMSGrad; use keras.optimizers.AdamW"
                             "(amsgrad=True) for that.")
        super().__init__(learning_rate=learning_rate, weight_decay=weight_decay, beta_1=beta_1, beta_2=beta_2,
                         epsilon=epsilon, amsgrad=False, **kwargs)
        self.weight_decay_pattern = weight_decay_pattern
        self._weight_decay_regex = None if weight_decay_pattern is None else re.compile(weight_decay_pattern)
        if decayed_variables is not None and (isinstance(decayed_variables, (str, Mapping))
                                              or not hasattr(decayed_variables, "__iter__")):
            raise TypeError("decayed_variables must be a list of variables or variable paths, e.g. "
                            f"timm_weight_decay(model); got {type(decayed_variables).__name__}.")
        self.decayed_variables = None if decayed_variables is None else sorted(
            {v if isinstance(v, str) else _variable_path(v) for v in decayed_variables})
        self._decayed = None if decayed_variables is None else set(self.decayed_variables)
        self._init_scales(learning_rate_scales)

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._build_scales(variables)

    def _apply_weight_decay(self, variables):
        # With per-variable scales the decay (rate_t * scale * weight_decay * w) is part of the
        # update step, computed from the same w.
        if not self._scale_list:
            super()._apply_weight_decay(variables)

    def _use_weight_decay(self, variable):
        if not super()._use_weight_decay(variable):
            return False
        if self._decayed is not None:
            return _variable_path(variable) in self._decayed
        if self._weight_decay_regex is None:
            return True
        name = str(variable.name).split(":")[0].split("/")[-1]
        return self._weight_decay_regex.search(name) is not None

    def update_step(self, gradient, variable, learning_rate):
        # The decay term (rate_t * weight_decay * w) is Keras' `_apply_weight_decay`, applied
        # before this step from the same w; with per-variable scales it is applied here.
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        if self._scale_list:
            lr = ops.multiply(lr, ops.cast(self._variable_scale(variable), dtype))
            if self.weight_decay and self._use_weight_decay(variable):
                self.assign_sub(variable, ops.multiply(variable, ops.multiply(lr, ops.cast(self.weight_decay, dtype))))
        g = ops.cast(gradient, dtype)
        count = ops.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        new_m = ops.add(ops.multiply(g, 1.0 - self.beta_1), ops.multiply(m, self.beta_1))
        new_v = ops.add(ops.multiply(ops.square(g), 1.0 - self.beta_2), ops.multiply(v, self.beta_2))
        self.assign(m, new_m)
        self.assign(v, new_v)
        m_hat = ops.divide(new_m, 1.0 - ops.power(ops.cast(self.beta_1, dtype), count))
        v_hat = ops.divide(new_v, 1.0 - ops.power(ops.cast(self.beta_2, dtype), count))
        self.assign_sub(variable, ops.multiply(ops.divide(m_hat, ops.add(ops.sqrt(v_hat), self.epsilon)), lr))

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not _torch():
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import torch

        with torch.no_grad():
            for scale, group_grads, group in self._scale_groups(grads, trainable_variables):
                rate = float(learning_rate) * scale
                if self._scale_list and self.weight_decay:
                    decayed = [v.value for v in group if self._use_weight_decay(v)]
                    if decayed:
                        torch._foreach_mul_(decayed, 1.0 - float(self.weight_decay) * rate)
                self._torch_update(group_grads, group, rate, torch)

    def _torch_update(self, grads, variables, rate, torch):
        index = [self._get_variable_index(v) for v in variables]
        values = [v.value for v in variables]
        grads = [g.to(v.dtype) for g, v in zip(grads, values)]
        m_list = [self._momentums[i].value for i in index]
        v_list = [self._velocities[i].value for i in index]
        count = float(self.iterations) + 1.0
        torch._foreach_mul_(m_list, self.beta_1)
        torch._foreach_add_(m_list, grads, alpha=1.0 - self.beta_1)
        torch._foreach_mul_(v_list, self.beta_2)
        torch._foreach_addcmul_(v_list, grads, grads, value=1.0 - self.beta_2)
        denominators = torch._foreach_sqrt(v_list)
        torch._foreach_div_(denominators, (1.0 - self.beta_2**count) ** 0.5)
        torch._foreach_add_(denominators, self.epsilon)
        torch._foreach_addcdiv_(values, m_list, denominators, value=-rate / (1.0 - self.beta_1**count))

    def get_config(self):
        config = super().get_config()
        config["weight_decay_pattern"] = self.weight_decay_pattern
        config["decayed_variables"] = self.decayed_variables
        return self._scales_config(config)


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
    momentum_dtype=None,
    decay="cosine",
    global_clipnorm=1.0,
    gradient_accumulation_steps=None,
    use_ema=False,
    ema_momentum=0.9999,
    layer_decay=None,
    model=None,
):
    """The paper's fine-tuning optimizer, as the original code builds it (vit_jax/train.py:
    `optax.chain(clip_by_global_norm(1.0), sgd(schedule, momentum=0.9))`): SGD momentum 0.9 in
    optax's trace form, global-norm clip 1.0, no weight decay, linear warm-up then cosine decay,
    the rate of update t (from 0) being the original `create_learning_rate_schedule`'s for t.

    Args:
        learning_rate: base learning rate (the paper sweeps {0.001, 0.003, 0.01, 0.03}) or a
            ready LearningRateSchedule.
        total_steps: optimizer updates of the run (CIFAR 10k, ImageNet 20k, Pets/Flowers 500).
        warmup_steps: linear warm-up updates (500; 100 for the 500-step runs).
        momentum_dtype: "bfloat16" stores the momentum trace in bfloat16, as the original code's
            `accumulator_dtype="bfloat16"` (half the optimizer state); None keeps float32.
        decay: "cosine" (the paper's fine-tuning runs) or "linear" (to 1e-5, the original's
            other `decay_type`).
        gradient_accumulation_steps: N micro-batches per update. Feed `fit` micro-batches of
            B / N: N successive ones make one update, equal to the original's
            `accumulate_gradient` with `accum_steps=N` on the batch of B they form (the paper's
            batch 512 as e.g. 8 x 64). total_steps and warmup_steps count updates.
        use_ema, ema_momentum: Polyak averaging of the weights (the paper's 0.9999 for Table 2);
            evaluate/save with it through `SwapEMAWeights` / `ema_weights`. At the end of `fit`
            Keras leaves the averaged weights in the model.
        layer_decay, model: layer-wise learning-rate decay (BEiT, MAE, DINOv2 fine-tuning): each
            variable of `model` at the rate times `layer_decay_scales(model, layer_decay)` (timm's
            `param_groups_layer_decay` scales); None: one rate for all.

    Example:
        >>> opt = finetune_optimizer(0.01, total_steps=500, warmup_steps=100)
        >>> opt.momentum, opt.global_clipnorm
        (0.9, 1.0)
    """
    if decay not in ("cosine", "linear"):
        raise ValueError(f"decay must be 'cosine' or 'linear'; got {decay!r}.")
    schedule_cls = WarmupCosineDecay if decay == "cosine" else WarmupLinearDecay
    return SGD(
        learning_rate=_schedule(learning_rate, total_steps, warmup_steps, schedule_cls),
        momentum=momentum,
        momentum_dtype=momentum_dtype,
        global_clipnorm=global_clipnorm,
        gradient_accumulation_steps=gradient_accumulation_steps,
        use_ema=use_ema,
        ema_momentum=ema_momentum,
        learning_rate_scales=_layer_decay(layer_decay, model, "finetune_optimizer"),
    )


def _layer_decay(layer_decay, model, caller, uses=""):
    if layer_decay is None:
        if model is not None:
            raise ValueError(f"{caller}(model=...) is for layer_decay{uses}; pass layer_decay=0.75 (say) too, or no "
                             "model.")
        return None
    if model is None:
        raise ValueError(
            f"layer_decay needs the model whose variables it scales: {caller}(..., layer_decay={layer_decay!r}, "
            "model=model)."
        )
    return layer_decay_scales(model, layer_decay)


def pretrain_optimizer(
    learning_rate=1e-3,
    total_steps=None,
    warmup_steps=10_000,
    *,
    weight_decay=0.1,
    beta_1=0.9,
    beta_2=0.999,
    epsilon=1e-8,
    end_learning_rate=1e-5,
    global_clipnorm=1.0,
    weight_decay_pattern="kernel$",
    gradient_accumulation_steps=None,
    use_ema=False,
    ema_momentum=0.9999,
    layer_decay=None,
    model=None,
    weight_decay_rule="kernels",
):
    """The paper's pre-training optimizer: Adam (0.9, 0.999) with decoupled weight decay 0.1,
    global-norm clip 1.0, linear warm-up (10k steps) then linear decay to 1e-5; optax's
    `chain(clip_by_global_norm(1.0), adamw(schedule, 0.9, 0.999, eps=1e-8, weight_decay=0.1,
    mask=kernels))`, the same schedule indexing as `finetune_optimizer`.

    The decay is multiplied by the current rate: w <- w - rate_t * (adam_update + 0.1 * w), which
    is big_vision's `wd = 0.1 * base rate` (1e-4 at base 1e-3, its ImageNet-21k ViT setting). It
    applies to kernels only (see `AdamW`); `weight_decay_pattern=None` decays all.
    `layer_decay=` with `model=`: layer-wise rates as `finetune_optimizer`'s (the AdamW fine-tuning
    of BEiT, MAE and DINOv2), the decay scaled with each variable's rate as in timm.
    `weight_decay_rule="timm"` with `model=`: decay the variables timm's rule decays
    (`timm_weight_decay(model)`: every weight but biases, norms, layer scales, tokens and the
    position embedding; for a ViT that is the kernels plus a MAP head's probe), as timm's
    fine-tuning recipes do; the default "kernels" is `weight_decay_pattern`'s (big_vision's).

    Example:
        >>> opt = pretrain_optimizer(1e-3, total_steps=100_000)
        >>> opt.weight_decay
        0.1
    """
    if weight_decay_rule not in ("kernels", "timm"):
        raise ValueError(f"weight_decay_rule must be 'kernels' or 'timm'; got {weight_decay_rule!r}.")
    decayed = None
    if weight_decay_rule == "timm":
        if model is None:
            raise ValueError("weight_decay_rule='timm' decides per variable of the model: pass "
                             "pretrain_optimizer(..., weight_decay_rule='timm', model=model).")
        decayed = timm_weight_decay(model)
    return AdamW(
        learning_rate=_schedule(
            learning_rate, total_steps, warmup_steps, WarmupLinearDecay, end_learning_rate=end_learning_rate
        ),
        decayed_variables=decayed,
        weight_decay=weight_decay,
        beta_1=beta_1,
        beta_2=beta_2,
        epsilon=epsilon,
        global_clipnorm=global_clipnorm,
        weight_decay_pattern=weight_decay_pattern,
        gradient_accumulation_steps=gradient_accumulation_steps,
        use_ema=use_ema,
        ema_momentum=ema_momentum,
        learning_rate_scales=_layer_decay(layer_decay, None if decayed is not None and layer_decay is None else model,
                                          "pretrain_optimizer", " or weight_decay_rule='timm'"),
    )
