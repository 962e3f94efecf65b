"""Fine-tuning and pre-training set-ups: a pretrained model re-made for a new task, the losses."""

import os

import keras
from keras import ops

from keras_vit.geometry import as_pair
from keras_vit.models.vit import VisionTransformer  # noqa: F401  (the docstring's example)
from keras_vit.models.weight_tree import get_weight_tree

register = keras.saving.register_keras_serializable(package="keras_vit")

#: Dropout of the paper's pre-training runs: 0.1 for ViT-L/16 and ViT-H/14, 0 elsewhere
#: (fine-tuning always uses 0). Keys are constructor names.
PRETRAIN_DROPOUT = {"ViTL16": 0.1, "ViTH14": 0.1}

_KEEP = object()


def for_finetuning(
    model,
    *,
    image_size=None,
    classes,
    classifier_activation=_KEEP,
    keep_representation=False,
    dropout_rate=None,
    attention_dropout_rate=None,
    drop_path_rate=None,
    patch_drop_rate=None,
    remat=None,
    name=None,
):
    """A new model for fine-tuning `model` at another resolution and class count, of any family.

    The new model has `model`'s architecture and numerics, the new image size and a fresh
    zero-initialised head of `classes` outputs. Every other weight is streamed through the
    canonical weight tree, position embeddings resized with the checkpoint's rule. What else
    fine-tuning means is the family's (`keras_vit.models.transfer.Transfer`): a ViT or Axial-ViT
    fine-tunes without dropout, an EfficientNet with its own dropout, a BiT ResNet and an
    EfficientNet at any size (fully convolutional), an AxialResNet at its own size only. As in
    the paper, a ViT's `pre_logits` representation layer is dropped (keep it with
    `keep_representation=True`). The head policy is keras_vit.loading's.

    Args:
        model: a keras_vit model of any family (any include_top / pooling), e.g. a pre-trained
            one or a masked-patch-prediction encoder; or any weights source
            `keras_vit.load_checkpoint` accepts (a preset name, "hf://owner/repo", a path),
            loaded straight at the new size.
        image_size: int or (height, width); default: the model's.
        classes: outputs of the new head.
        classifier_activation: default: the model's ("softmax" unless changed); None for logits.
        keep_representation: keep `pre_logits` (Dense + tanh) instead of dropping it.
        dropout_rate, attention_dropout_rate, drop_path_rate: default: the family's (0 for the
            transformers, the model's own for an EfficientNet); a family without the argument
            refuses it.
        patch_drop_rate: a ViT's patch dropout in training (timm's `patch_drop_rate`, e.g. 0.5
            for FLIP-style fast fine-tuning); default 0.
        remat: recompute each encoder block in the backward pass (`VisionTransformer(remat=True)`):
            the same gradients with the activation memory of one block, for about a third more
            compute; for big models at high resolution (ViT-H/14 at 518 px). Default: the model's
            setting (False for a weights source).

    Example:
        >>> base = VisionTransformer(image_size=32, patch_size=8, hidden_size=16, num_layers=1,
        ...                          num_heads=2, mlp_dim=32, classes=10)
        >>> ft = for_finetuning(base, image_size=48, classes=3)
        >>> ft.grid_size, ft.output_shape
        ((6, 6), (None, 3))
    """
    from keras_vit import loading
    from keras_vit.checkpoints.keras_format import checkpoint_config
    from keras_vit.models.family import family_of

    common = dict(classes=int(classes), include_top=True, keep_representation=keep_representation, fresh_head=True,
                  warn=False)  # a new head is the point of fine-tuning
    asked = dict(dropout_rate=dropout_rate, attention_dropout_rate=attention_dropout_rate,
                 drop_path_rate=drop_path_rate, patch_drop_rate=patch_drop_rate, remat=remat)
    asked = {k: v for k, v in asked.items() if v is not None}
    if isinstance(model, (str, os.PathLike)):
        resolved = loading.resolve(model, image_size=image_size)
        tree, config = resolved.format.read_at(resolved.path, image_size)
        source, source_config = resolved.source, config
        activation = "softmax" if classifier_activation is _KEEP else classifier_activation
        extra = dict(source=source, patch_resize_rule=resolved.format.patch_resize_rule)
    else:
        try:
            family = family_of(model)
        except ValueError:
            family = None
        if family is None or not hasattr(model, "get_config"):
            raise TypeError(
                f"for_finetuning needs a keras_vit model or a weights source, got {type(model).__name__}. "
                "Load checkpoints with keras_vit.load_checkpoint() or a constructor such as keras_vit.ViTB16()."
            )
        source_config = model.get_config()
        config = family.config_object(checkpoint_config(source_config))
        tree, source = get_weight_tree(model), None
        activation = source_config["classifier_activation"] if classifier_activation is _KEEP else classifier_activation
        extra = dict(name=name or f"{model.name}_finetune", dtype=source_config.get("dtype"))
    family = family_of(config)
    transfer = family.transfer
    refused = sorted(set(asked) - set(transfer.options))
    if refused:
        allowed = ", ".join(transfer.options) or "none"
        raise ValueError(
            f"{family.title} models have no {', '.join(refused)} to set for fine-tuning (what they take: {allowed}): "
            f"leave {' and '.join(refused)} unset."
        )
    own = config.image_size  # the config object's (height, width)
    if image_size is not None and not transfer.resizable and None not in own and as_pair(image_size) != own:
        raise ValueError(
            f"{family.title} models fine-tune at their checkpoint's resolution {own[0]}x{own[1]} only (their weights "
            f"are laid out for that size), not {image_size}: pass image_size={own[0]} or leave it unset."
        )
    settings = transfer.model_settings(source_config)
    settings.update(asked)
    if name is not None:
        extra["name"] = name
    return loading.build_from_checkpoint(tree, config, image_size=image_size, classifier_activation=activation,
                                         **common, **settings, **extra)


@register
class ClassificationCrossentropy(keras.losses.Loss):
    """Softmax cross-entropy with label smoothing for integer or one-hot labels.

    Keras' SparseCategoricalCrossentropy has no label smoothing; this loss accepts integer labels
    (shape (batch,) or (batch, 1)) or one-hot/soft labels (batch, classes) and smooths them as
    y * (1 - s) + s / classes. A row whose label is outside [0, classes) (or whose target row is
    all zeros) has a NaN loss, where a one-hot encoding would make it silently 0.

    Example:
        >>> import numpy as np
        >>> loss = ClassificationCrossentropy(label_smoothing=0.1, from_logits=True)
        >>> round(float(loss(np.array([1]), np.array([[0.0, 0.0]]))), 4)
        0.6931
    """

    def __init__(self, label_smoothing=0.0, from_logits=False, name="classification_crossentropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = float(label_smoothing)
        self.from_logits = bool(from_logits)

    def call(self, y_true, y_pred):
        classes = y_pred.shape[-1]
        y_pred = ops.cast(y_pred, "float32")
        if len(y_true.shape) == len(y_pred.shape) and y_true.shape[-1] == classes and classes != 1:
            target = ops.cast(y_true, "float32")
            valid = ops.sum(target, axis=-1) > 0  # tf.one_hot of a label outside the classes: a row of zeros
        else:
            labels = ops.reshape(ops.cast(y_true, "int32"), ops.shape(y_pred)[:-1])
            valid = ops.logical_and(labels >= 0, labels < classes)
            # PyTorch's one_hot fails on a label past the classes (a device assert on GPU): encode 0 there.
            target = ops.one_hot(ops.where(valid, labels, 0), classes, dtype="float32")
        if self.label_smoothing:
            target = target * (1.0 - self.label_smoothing) + self.label_smoothing / classes
        loss = keras.losses.categorical_crossentropy(target, y_pred, from_logits=self.from_logits)
        # A label outside [0, classes) would add 0 to the loss, silently: NaN shows it (a compiled
        # step cannot raise; keras_vit models' `fit` refuses such labels where it can see them).
        return ops.where(valid, loss, ops.full_like(loss, float("nan")))

    def get_config(self):
        config = super().get_config()
        config.update(label_smoothing=self.label_smoothing, from_logits=self.from_logits)
        return config


def classification_loss(model=None, *, label_smoothing=0.0, from_logits=None):
    """Softmax cross-entropy for `model`'s outputs (logits when its classifier_activation is
    None/linear, probabilities otherwise), for integer or one-hot labels, with label smoothing.

    Example:
        >>> loss = classification_loss(label_smoothing=0.1, from_logits=True)
    """
    if from_logits is None:
        activation = getattr(model, "classifier_activation", "softmax") if model is not None else "softmax"
        from_logits = activation in (None, "linear")
    return ClassificationCrossentropy(label_smoothing=label_smoothing, from_logits=from_logits)
