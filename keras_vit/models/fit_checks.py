"""`model.fit` of every keras_vit classifier refuses labels outside [0, classes).

A compiled train step cannot raise, and Keras' one-hot of an integer label outside the classes
is a row of zeros: the loss of that row is silently 0. keras_vit's loss
(`keras_vit.training.classification_loss`) makes it NaN instead, and `fit` checks what it can
see before the step runs:

  * NumPy labels (`fit(x, y)`): every label, before the first step;
  * a tf.data.Dataset of (images, labels): every batch as it is read, by a check inside the
    pipeline (`keras_vit.errors.pipeline_check`), so the run stops at the first bad batch;
  * `validation_data` given as either, the same way.

Either ends in a DataError naming the label and the class count, on every backend (a failed
check inside tf.data is turned into that one line, not TensorFlow's traceback). Generators and
Keras PyDatasets are not read ahead; a bad label there makes the loss NaN.
"""

import sys

import numpy as np

from keras_vit.errors import DataError, data_error


def _outside_message(label, classes, where):
    return (f"Label {label} {where} is outside [0, {classes}): the model's head has {classes} classes. Pass labels "
            f"0 to {classes - 1} (class indices), or a model whose head has as many classes as the data.")


def check_label_array(labels, classes, where="in the labels"):
    """Refuse integer `labels` (any shape; a (N, classes) one-hot matrix is not checked) with a
    value outside [0, classes), naming the first such label and the class count."""
    if not isinstance(labels, np.ndarray) or labels.dtype.kind not in "iu":
        return
    if labels.ndim == 2 and labels.shape[-1] == classes and classes != 1:
        return  # one-hot or soft targets
    flat = labels.reshape(-1)
    outside = (flat < 0) | (flat >= classes)
    if outside.any():
        index = int(outside.argmax())
        raise DataError(_outside_message(int(flat[index]), classes, f"(row {index} {where})"))


def _checked_dataset(ds, classes, what):
    """`ds` (a tf.data.Dataset of (x, integer labels[, weights])) with a check of each batch's labels."""
    import tensorflow as tf

    from keras_vit.errors import pipeline_check

    spec = ds.element_spec
    if not (isinstance(spec, tuple) and len(spec) >= 2 and isinstance(spec[1], tf.TensorSpec)
            and spec[1].dtype.is_integer):
        return ds
    if spec[1].shape.rank == 2 and spec[1].shape[-1] == classes and classes != 1:
        return ds
    message = _outside_message("{}", classes, f"in a batch of the {what}")

    def check(*element):
        labels = tf.cast(tf.reshape(element[1], [-1]), tf.int64)
        valid = (labels >= 0) & (labels < classes)
        first_bad = tf.gather(labels, tf.argmin(tf.cast(valid, tf.int32)))
        with tf.control_dependencies([pipeline_check(tf.reduce_all(valid), message, first_bad)]):
            return (element[0], tf.identity(element[1]), *element[2:])

    return ds.map(check)


class CheckedLabels:
    """keras.Model mixin of every keras_vit model class: `fit` refuses labels outside the head's
    classes (see the module docstring). Models without a classification head: unchanged."""

    def _head_classes(self):
        config = getattr(self, "config", None)
        if not getattr(config, "include_top", False):
            return None
        return int(self.output_shape[-1])

    def fit(self, x=None, y=None, *args, **kwargs):
        classes = self._head_classes()
        if classes is None:
            return super().fit(x, y, *args, **kwargs)
        check_label_array(y, classes, "of the training labels")
        validation = kwargs.get("validation_data")
        if isinstance(validation, (tuple, list)) and len(validation) >= 2:
            check_label_array(validation[1], classes, "of the validation labels")
        tf = sys.modules.get("tensorflow")  # not loaded: no tf.data to check, no TensorFlow error to read
        if tf is None:
            return super().fit(x, y, *args, **kwargs)
        if isinstance(x, tf.data.Dataset) and y is None:
            x = _checked_dataset(x, classes, "training data")
        if isinstance(validation, tf.data.Dataset):
            kwargs["validation_data"] = _checked_dataset(validation, classes, "validation data")
        try:
            return super().fit(x, y, *args, **kwargs)
        except tf.errors.OpError as error:
            found = data_error(error)
            if found is None:
                raise
            raise found from None
