"""The package's error types that several layers share (kept at the bottom of the import graph,
so that models/ can raise what checkpoints/ documents without importing it)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: unknown format, truncated or corrupt file, unexpected
    or missing weights, or an architecture outside the ViT family."""


class DataError(ValueError):
    """Data that cannot give the numbers asked of it: an empty split, a label outside
    [0, classes), non-finite model outputs, or a check inside a tf.data pipeline that failed.
    The message names the split, the label and the class count, or the batch."""


#: The prefix of the messages of keras_vit's own checks inside tf.data pipelines
#: (`pipeline_check`); `data_error` finds it in TensorFlow's error text.
PIPELINE_CHECK = "keras_vit data check: "


def pipeline_check(condition, message, value):
    """A tf.data check: an assertion that `condition` holds, whose failure `data_error` turns into
    a DataError of `message` with "{}" replaced by `value` (a scalar tensor, e.g. the label)."""
    import tensorflow as tf

    return tf.debugging.Assert(condition, [PIPELINE_CHECK + message, value])


def data_error(error):
    """The DataError of a failed `pipeline_check` inside a TensorFlow error (its one line, without
    TensorFlow's graph traceback), or None for any other error.

    Example:
        >>> import tensorflow as tf
        >>> text = "assertion failed: [" + PIPELINE_CHECK + "label {} is outside [0, 3)] [7]\\n [[node]]"
        >>> data_error(tf.errors.InvalidArgumentError(None, None, text))
        DataError('label 7 is outside [0, 3)')
    """
    import re

    text = str(getattr(error, "message", None) or error)
    found = re.search(re.escape(PIPELINE_CHECK) + r"(.*?)\] \[([^\]]*)\]", text)
    if found is None:
        return None
    message = found.group(1).replace("\\'", "'").replace('\\"', '"')  # TensorFlow escapes the quotes
    return DataError(message.replace("{}", found.group(2).strip()))
