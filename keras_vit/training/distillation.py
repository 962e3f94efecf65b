"""DeiT's hard-label distillation (Touvron et al. 2021, "Training data-efficient image
transformers & distillation through attention") through `model.fit`.

A distilled ViT (`distillation_token=True`) has two heads: `head` on the class token and
`head_dist` on the distillation token. DeiT trains the first on the labels and the second on the
teacher's hard decisions:

    loss = 0.5 * CE(head(cls), y) + 0.5 * CE(head_dist(dist), argmax teacher(x))

and predicts with the mean of the two heads' logits (the distilled model's own output).
"""

import keras
from keras import ops

from keras_vit.backend_workarounds import TraceTrainStepOnce
from keras_vit.training.recipes import ClassificationCrossentropy


class HardDistillation(TraceTrainStepOnce, keras.Model):
    """Trains a distilled ViT's two heads as DeiT's hard distillation does, with `fit`.

    The model's outputs are the two heads' logits [class head, distillation head] (whatever the
    student's `classifier_activation`); the loss is 0.5 * CE(class head, y) + 0.5 *
    CE(distillation head, argmax of the teacher's output), plus the student's own losses. The
    teacher is either a model run on the same images (frozen, in inference mode) or, without one,
    its stored outputs fed with the labels: `fit(images, (labels, teacher_logits))`. Compiled
    metrics see the labels and the mean of the two heads' logits (the distilled model's
    prediction). The student is trained in place: save or use `student` itself afterwards.

    Args:
        student: a keras_vit ViT with a distillation token and its heads
            (`VisionTransformer(distillation_token=True)`, a DeiT distilled checkpoint).
        teacher: a Keras model of the same images -> class scores (logits or probabilities), or
            None to take the teacher's stored logits from the targets.
        label_smoothing: label smoothing of the class head's loss (DeiT: 0.1); the distillation
            head's hard targets are never smoothed.

    Example:
        >>> import numpy as np
        >>> student = keras_vit.VisionTransformer(image_size=16, patch_size=8, hidden_size=16,
        ...     num_layers=1, num_heads=2, mlp_dim=32, classes=3, distillation_token=True)
        >>> trainer = HardDistillation(student)
        >>> trainer.compile(optimizer="sgd")
        >>> images, labels = np.zeros((4, 16, 16, 3), "float32"), np.array([0, 1, 2, 0])
        >>> teacher_logits = np.eye(3, dtype="float32")[[2, 1, 0, 0]]
        >>> history = trainer.fit(images, (labels, teacher_logits), verbose=0)
    """

    def __init__(self, student, teacher=None, *, label_smoothing=0.0, name="hard_distillation", **kwargs):
        super().__init__(name=name, **kwargs)
        config = getattr(student, "config", None)
        if not getattr(config, "distillation_token", False) or not getattr(config, "include_top", False):
            raise ValueError(
                "HardDistillation trains the class and distillation heads of a distilled ViT; the student needs "
                "distillation_token=True and include_top=True, e.g. VisionTransformer(..., distillation_token=True) "
                "or a DeiT distilled checkpoint (deit_*_distilled_*)."
            )
        self.label_smoothing = float(label_smoothing)
        # The two heads' logits, sharing every layer (and weight) of the student.
        self.heads = keras.Model(
            student.input, [student.get_layer("head").output, student.get_layer("head_dist").output],
            name=f"{student.name}_heads",
        )
        self.student = student  # the same layers as `heads`
        if teacher is not None:
            teacher.trainable = False
        self.teacher = teacher
        self._class_loss = ClassificationCrossentropy(label_smoothing=self.label_smoothing, from_logits=True)
        if teacher is not None and not teacher.built:
            raise ValueError("HardDistillation's teacher must be built (call it on a batch of images first).")
        self.built = True  # every weight exists: the student's (functional) and the teacher's

    def call(self, images, training=None):
        return self.heads(images, training=training)

    def _targets(self, images, y):
        """(labels, the teacher's hard labels)."""
        if self.teacher is not None:
            if isinstance(y, (tuple, list)):
                raise ValueError(
                    "HardDistillation has a teacher model, so the targets are the labels alone; got a pair. Pass "
                    "teacher=None to take the teacher's stored logits from (labels, teacher_logits) instead."
                )
            scores = ops.stop_gradient(self.teacher(images, training=False))
            return y, ops.argmax(scores, axis=-1)
        if isinstance(y, dict):
            y = (y.get("labels"), y.get("teacher_logits"))
        if not isinstance(y, (tuple, list)) or len(y) != 2 or y[1] is None:
            raise ValueError(
                "HardDistillation without a teacher model takes the teacher's stored logits with the labels: "
                "fit(images, (labels, teacher_logits)); or pass HardDistillation(student, teacher=model)."
            )
        return y[0], ops.argmax(y[1], axis=-1)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        labels, hard = self._targets(x, y)
        logits, logits_dist = (ops.cast(t, "float32") for t in y_pred)
        per_example = 0.5 * self._class_loss.call(labels, logits) + 0.5 * keras.losses.sparse_categorical_crossentropy(
            ops.cast(hard, "int32"), logits_dist, from_logits=True
        )
        if sample_weight is not None:
            per_example = per_example * ops.reshape(ops.cast(sample_weight, "float32"), ops.shape(per_example))
        loss = ops.mean(per_example)
        for extra in self.losses:
            loss = loss + self._aggregate_additional_loss(extra)
        return loss

    def compute_metrics(self, x, y, y_pred, sample_weight=None):
        labels = y if self.teacher is not None else (y.get("labels") if isinstance(y, dict) else y[0])
        logits, logits_dist = y_pred
        return super().compute_metrics(x, labels, (logits + logits_dist) / 2.0, sample_weight)
