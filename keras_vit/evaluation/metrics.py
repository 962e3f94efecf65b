"""Classification metrics in NumPy, accumulated batch by batch: top-1, top-k, per-class accuracy,
loss, and the ReaL top-1 of Beyer et al. 2020 ("Are we done with ImageNet?").

    metrics = ClassificationMetrics(num_classes=1000, real=True)
    for scores, labels, real in batches:      # scores (B, K): probabilities or logits
        metrics.update(scores, labels, real=real)
    metrics.result()   # {"top1": ..., "top5": ..., "real_top1": ..., "examples": ..., ...}

ReaL: an image counts only when it has at least one ReaL label, and its prediction is right
when its top-1 class is among them. `real` is given per batch as a (B, K) 0/1 matrix (row i:
the ReaL labels of image i; an all-zero row: none) or as a list of label lists.
"""

import numpy as np

from keras_vit.errors import DataError


def softmax(scores):
    """Row-wise softmax of (N, K) logits, in float64."""
    scores = np.asarray(scores, np.float64)
    shifted = np.exp(scores - scores.max(1, keepdims=True))
    return shifted / shifted.sum(1, keepdims=True)


def as_probabilities(scores, atol=1e-3):
    """`scores` when they are already probabilities (non-negative rows summing to 1), else their softmax."""
    scores = np.asarray(scores, np.float64)
    if scores.min() >= 0 and np.allclose(scores.sum(1), 1.0, atol=atol):
        return scores
    return softmax(scores)


def top_k_indices(scores, k):
    """(N, min(k, K)) class indices, best first; ties go to the lower index (stable sort)."""
    scores = np.asarray(scores)
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, : min(k, scores.shape[1])]


def top_k_correct(scores, labels, k):
    """(N,) bool: is each label among its row's k best classes."""
    labels = np.asarray(labels).reshape(-1)
    return np.any(top_k_indices(scores, k) == labels[:, None], axis=1)


def _check_real_type(real):
    if isinstance(real, (str, bytes, dict)) or not hasattr(real, "__len__"):
        raise ValueError(f"ReaL labels must be one list of class indices per image; got {type(real).__name__}.")


def real_multi_hot(real, num_classes):
    """ReaL labels as a (B, num_classes) bool matrix, from a 0/1 (or bool) matrix of that width or
    a list of label lists (or a (B, n) integer array of them, padded with -1). A bool matrix of
    another width, a label outside [0, num_classes) or a label that is not a whole number is an
    error."""
    if isinstance(real, np.ndarray) and real.ndim == 2 and real.shape[1] == num_classes:
        return real.astype(bool)
    if isinstance(real, np.ndarray) and real.dtype == bool:
        raise ValueError(f"ReaL labels as a bool matrix of shape {real.shape}: expected (batch, {num_classes}), one "
                         "column per class.")
    _check_real_type(real)
    matrix = np.zeros((len(real), num_classes), bool)
    for row, labels in enumerate(real):
        try:
            values = np.asarray(labels).reshape(-1)
            whole = values.astype(np.int64)
        except (TypeError, ValueError):
            whole = values = None
        if values is None or (values.size and not np.array_equal(whole, values)):
            raise ValueError(f"ReaL labels of image {row} are not whole class indices: {labels!r}.")
        whole = whole[whole >= 0]  # padding
        if whole.size and whole.max() >= num_classes:
            raise ValueError(f"ReaL label {int(whole.max())} of image {row} is outside [0, {num_classes}): the labels "
                             f"are not of these {num_classes} classes.")
        matrix[row, whole] = True
    return matrix


def real_top1_correct(scores, real, num_classes=None):
    """(counted (B,) bool, correct (B,) bool): which images have ReaL labels, and which of them
    have their top-1 class among those labels."""
    scores = np.asarray(scores)
    if scores.ndim != 2:
        raise ValueError(f"scores of shape {scores.shape}: expected (batch, classes).")
    _check_real_type(real)
    if len(real) != len(scores):
        raise ValueError(f"ReaL labels for {len(real)} images but scores for {len(scores)}: give one entry (a list of "
                         "labels, empty for none) per image.")
    matrix = real_multi_hot(real, num_classes or scores.shape[1])
    counted = matrix.any(1)
    top1 = top_k_indices(scores, 1)[:, 0]
    correct = matrix[np.arange(len(top1)), top1] & counted
    return counted, correct


class ClassificationMetrics:
    """Accumulates the predictions of a classifier over batches.

    Args:
        num_classes: K, the number of classes (columns of `scores`).
        top_k: the k of the top-k accuracy (5).
        real: also compute the ReaL top-1 (each `update` then takes `real=`).

    Example:
        >>> m = ClassificationMetrics(3, top_k=2)
        >>> m.update(np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]]), np.array([0, 1]))
        >>> r = m.result()
        >>> r["top1"], r["top2"], r["examples"]
        (0.5, 1.0, 2)
    """

    def __init__(self, num_classes, *, top_k=5, real=False):
        self.num_classes = int(num_classes)
        self.top_k = int(top_k)
        self.real = bool(real)
        self.confusion = np.zeros((self.num_classes, self.num_classes), np.int64)
        self.top_k_hits = 0
        self.loss_sum = 0.0
        self.examples = 0
        self.real_counted = 0
        self.real_hits = 0
        self.batches = 0

    def update(self, scores, labels, *, real=None):
        scores = np.asarray(scores, np.float64)
        labels = np.asarray(labels).reshape(-1).astype(np.int64)
        if scores.ndim != 2 or scores.shape[1] != self.num_classes:
            raise ValueError(f"scores of shape {scores.shape} for {self.num_classes} classes: expected (batch, "
                             f"{self.num_classes}).")
        if len(labels) != len(scores):
            raise ValueError(f"{len(scores)} rows of scores but {len(labels)} labels.")
        first = self.examples
        self.batches += 1
        outside = (labels < 0) | (labels >= self.num_classes)
        if outside.any():
            label = int(labels[outside][0])
            raise DataError(
                f"Label {label} in batch {self.batches} (images {first}-{first + len(labels) - 1}) is outside [0, "
                f"{self.num_classes}): the model has {self.num_classes} classes. Evaluate on data with these classes, "
                "or a model whose head has as many classes as the data."
            )
        bad = ~np.isfinite(scores).all(1)
        if bad.any():
            raise DataError(
                f"The model's outputs are not finite (NaN or infinity) in {int(bad.sum())} of the {len(scores)} rows of "
                f"batch {self.batches} (images {first}-{first + len(labels) - 1}, first row {first + int(bad.argmax())}):"
                " its weights or inputs hold NaN or overflow (a diverged run, or float16 without loss scaling); no "
                "accuracy is computed from them."
            )
        top1 = top_k_indices(scores, 1)[:, 0]
        np.add.at(self.confusion, (labels, top1), 1)
        self.top_k_hits += int(top_k_correct(scores, labels, self.top_k).sum())
        probabilities = as_probabilities(scores)
        self.loss_sum += float(-np.log(np.maximum(probabilities[np.arange(len(labels)), labels], 1e-12)).sum())
        self.examples += len(labels)
        if self.real:
            if real is None:
                raise ValueError("ClassificationMetrics(real=True).update needs the ReaL labels (real=...).")
            counted, correct = real_top1_correct(scores, real, self.num_classes)
            self.real_counted += int(counted.sum())
            self.real_hits += int(correct.sum())

    def per_class(self, class_names=None):
        """One row per class: name, examples, correct, accuracy (None without examples)."""
        names = class_names or [str(c) for c in range(self.num_classes)]
        rows = []
        for c in range(self.num_classes):
            total = int(self.confusion[c].sum())
            hits = int(self.confusion[c, c])
            rows.append({"class": names[c], "examples": total, "correct": hits,
                         "accuracy": hits / total if total else None})
        return rows

    def result(self):
        """top1, top{k}, loss, examples, mean per-class accuracy (over classes with examples) and,
        with `real`, real_top1 and real_examples (the images with ReaL labels). No examples is a
        DataError: an accuracy of nothing is not 0."""
        if not self.examples:
            raise DataError("No examples were evaluated: an empty split has no accuracy. Check the split and the data.")
        n = self.examples
        per_class = [r["accuracy"] for r in self.per_class() if r["accuracy"] is not None]
        out = {
            "top1": float(np.trace(self.confusion) / n),
            f"top{self.top_k}": float(self.top_k_hits / n),
            "loss": float(self.loss_sum / n),
            "examples": int(self.examples),
            "mean_per_class_accuracy": float(np.mean(per_class)) if per_class else None,
        }
        if self.real:
            out["real_top1"] = float(self.real_hits / self.real_counted) if self.real_counted else None
            out["real_examples"] = int(self.real_counted)
        return out
