"""Fine-tuning and pre-training set-ups: a pretrained model re-made for a new task, the losses."""

import os

import keras
from keras import ops

from keras_vit.models.vit import VisionTransformer
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
    dropout_rate=0.0,
    attention_dropout_rate=0.0,
    remat=None,
    name=None,
):
    """A new VisionTransformer for fine-tuning `model` at another resolution and class count.

    The new model has `model`'s architecture and numerics, the new image size and a fresh
    zero-initialised `head` of `classes` outputs. Every other weight is streamed through the
    canonical weight tree, the position embedding resized with the checkpoint's rule. As in the
    paper, the `pre_logits` representation layer is dropped for fine-tuning (keep it with
    `keep_representation=True`), and dropout is 0. The head policy is keras_vit.loading's.

    Args:
        model: a keras_vit VisionTransformer (any include_top / pooling), e.g. a pre-trained one
            or a masked-patch-prediction encoder; or any weights source `keras_vit.load_checkpoint`
            accepts (a preset name, "hf://owner/repo", a path), loaded straight at the new size.
        image_size: int or (height, width); default: the model's.
        classes: outputs of the new head.
        classifier_activation: default: the model's ("softmax" unless changed); None for logits.
        keep_representation: keep `pre_logits` (Dense + tanh) instead of dropping it.
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

    common = dict(
        image_size=image_size,
        classes=int(classes),
        include_top=True,
        keep_representation=keep_representation,
        fresh_head=True,
        warn=False,  # a new head is the point of fine-tuning
        dropout_rate=float(dropout_rate),
        attention_dropout_rate=float(attention_dropout_rate),
    )
    if remat is not None:
        common["remat"] = bool(remat)
    if isinstance(model, (str, os.PathLike)):
        activation = "softmax" if classifier_activation is _KEEP else classifier_activation
        return loading.load(model, classifier_activation=activation, name=name, **common)
    if not isinstance(model, VisionTransformer):
        raise TypeError(
            f"for_finetuning needs a keras_vit VisionTransformer or a weights source, got {type(model).__name__}. "
            "Load checkpoints with keras_vit.load_checkpoint() or a constructor such as keras_vit.ViTB16()."
        )
    full = model.get_config()
    config = checkpoint_config(full)
    common.setdefault("remat", bool(full.get("remat", False)))
    activation = full["classifier_activation"] if classifier_activation is _KEEP else classifier_activation
    return loading.build_from_checkpoint(
        get_weight_tree(model),
        config,
        classifier_activation=activation,
        name=name or f"{model.name}_finetune",
        dtype=full.get("dtype"),
        **common,
    )


@register
class ClassificationCrossentropy(keras.losses.Loss):
    """Softmax cross-entropy with label smoothing for integer or one-hot labels.

    Keras' SparseCategoricalCrossentropy has no label smoothing; this loss accepts integer labels
    (shape (batch,) or (batch, 1)) or one-hot/soft labels (batch, classes) and smooths them as
    y * (1 - s) + s / classes.

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
        else:
            labels = ops.reshape(ops.cast(y_true, "int32"), ops.shape(y_pred)[:-1])
            target = ops.one_hot(labels, classes, dtype="float32")
        if self.label_smoothing:
            target = target * (1.0 - self.label_smoothing) + self.label_smoothing / classes
        return keras.losses.categorical_crossentropy(target, y_pred, from_logits=self.from_logits)

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
