"""Few-shot linear evaluation: regularised least squares from frozen features, in closed form.

The paper's few-shot probe (and big_vision's `fewshot_lsr` evaluator): features of a few
training images per class are whitened with their own mean and standard deviation, a constant
feature (`bias`, large so that the intercept is barely regularised) is appended, labels become
{-1, 1}^K targets (2 * one_hot - 1), and W solves

    (X^T X + l2_reg * I) W = X^T Y           (or, with fewer examples than features,
    W = X^T (X X^T + l2_reg * I)^-1 Y,        the same solution through the N x N system).

Test images are classified by argmax(X_test W). Everything here is NumPy (float64).
"""

import numpy as np

#: The value of the appended constant feature: large, so its weight (the bias) is almost
#: unregularised, as in big_vision.
BIAS_FEATURE = 100.0


def _prepare(features, mean, std, bias):
    x = (np.asarray(features, np.float64) - mean) / std
    if bias:
        x = np.concatenate([x, np.full((x.shape[0], 1), float(bias))], axis=1)
    return x


def fewshot_linear_weights(train_features, train_labels, *, num_classes=None, l2_reg=1024.0, normalize=True,
                           bias=BIAS_FEATURE):
    """Closed-form regularised least-squares classifier.

    Args:
        train_features: (N, D) frozen features.
        train_labels: (N,) integer labels in [0, num_classes).
        num_classes: K (default: max label + 1).
        l2_reg: the ridge strength (big_vision picks it from powers of two; 2**10 here).
        normalize: whiten features with the training mean and std (+1e-5).
        bias: value of the appended constant feature (None/0: no intercept).

    Returns:
        dict with "weights" (D [+1], K), "mean", "std", "bias" — what `fewshot_predict` needs.

    Example:
        >>> x = np.random.default_rng(0).normal(size=(20, 5)); y = np.arange(20) % 4
        >>> fewshot_linear_weights(x, y)["weights"].shape
        (6, 4)
    """
    x = np.asarray(train_features, np.float64)
    y = np.asarray(train_labels).astype(np.int64).reshape(-1)
    if x.ndim != 2 or x.shape[0] != y.shape[0]:
        raise ValueError(
            f"train_features must be (N, D) and train_labels (N,); got {x.shape} and {y.shape}."
        )
    num_classes = int(num_classes or y.max() + 1)
    if normalize:
        mean = x.mean(axis=0, keepdims=True)
        std = x.std(axis=0, keepdims=True) + 1e-5
    else:
        mean, std = np.zeros((1, x.shape[1])), np.ones((1, x.shape[1]))
    x = _prepare(x, mean, std, bias)
    targets = 2.0 * np.eye(num_classes)[y] - 1.0
    n, d = x.shape
    if n >= d:
        weights = np.linalg.solve(x.T @ x + l2_reg * np.eye(d), x.T @ targets)
    else:
        weights = x.T @ np.linalg.solve(x @ x.T + l2_reg * np.eye(n), targets)
    return {"weights": weights, "mean": mean, "std": std, "bias": bias}


def fewshot_predict(solution, features):
    """Class scores (N, K) of `features` under a `fewshot_linear_weights` solution."""
    x = _prepare(features, solution["mean"], solution["std"], solution["bias"])
    return x @ solution["weights"]


def fewshot_linear_eval(train_features, train_labels, test_features, test_labels, *, l2_reg=1024.0,
                        num_classes=None, normalize=True, bias=BIAS_FEATURE):
    """Top-1 accuracy of the closed-form least-squares probe trained on the few-shot features.

    Example:
        >>> r = np.random.default_rng(0); centres = r.normal(size=(3, 8)) * 5
        >>> y = np.repeat(np.arange(3), 5); x = centres[y] + r.normal(size=(15, 8))
        >>> fewshot_linear_eval(x, y, x, y, l2_reg=1.0)
        1.0
    """
    test_labels = np.asarray(test_labels).astype(np.int64).reshape(-1)
    if num_classes is None:
        num_classes = int(max(np.max(train_labels), test_labels.max()) + 1)
    solution = fewshot_linear_weights(
        train_features, train_labels, num_classes=num_classes, l2_reg=l2_reg, normalize=normalize, bias=bias
    )
    predictions = np.argmax(fewshot_predict(solution, test_features), axis=1)
    return float(np.mean(predictions == test_labels))


def sample_shots(labels, shots, seed=0):
    """Indices of `shots` examples of every class in `labels` (a fixed random choice).

    Example:
        >>> sample_shots(np.array([0, 1, 0, 1, 0, 1]), 2).shape
        (4,)
    """
    labels = np.asarray(labels).reshape(-1)
    rng = np.random.default_rng(seed)
    chosen = []
    for c in np.unique(labels):
        where = np.flatnonzero(labels == c)
        if len(where) < shots:
            raise ValueError(f"class {c} has {len(where)} examples, fewer than shots={shots}.")
        chosen.append(rng.choice(where, shots, replace=False))
    return np.sort(np.concatenate(chosen))


# === Features from a model ===


def feature_model(model):
    """A keras.Model (sharing weights with `model`) that maps images to pooled features.

    The pooled representation the head reads, from the first of the family's feature layers
    the model has (`keras_vit.models.transfer.Transfer.features`: a ViT's `pre_logits`, else
    its pooled token; a BiT's average pool, ...). A model built with include_top=False and
    pooling returns it already; one with pooling=None returns its tokens or feature map,
    pooled in `extract_features` by the family's rule.
    """
    import keras

    from keras_vit.models.family import family_of

    names = {layer.name for layer in model.layers}
    for layer in family_of(model).transfer.features:
        if layer in names:
            return keras.Model(model.inputs, model.get_layer(layer).output, name=f"{model.name}_features")
    return model  # tokens or a feature map: pooled in extract_features


def _pool_tokens(model, tokens):
    """(N, D) features of a feature model's output: its tokens or feature map pooled by the
    family's `features_pooling` (None: the classifier's rule), a pool's kept 1x1 axes dropped."""
    from keras_vit.models.family import family_of

    if tokens.ndim == 2:
        return tokens
    pooling = family_of(model).features_pooling or getattr(model, "classifier", "token")
    axes = tuple(range(1, tokens.ndim - 1))  # the tokens, or the feature map's height and width
    if pooling == "token":
        return tokens[:, 0]
    if pooling == "max":
        return tokens.max(axis=axes)
    prefix = getattr(model, "num_prefix_tokens", 0) if tokens.ndim == 3 else 0
    return tokens[:, prefix:].mean(axis=axes)


def extract_features(model, data, *, batch_size=64, return_labels=False):
    """Frozen pooled features of `data` as a float32 (N, D) NumPy array.

    Args:
        model: a keras_vit model of any family (any include_top/pooling).
        data: images (N, H, W, C) as a NumPy array, or a tf.data.Dataset / iterable of batches
            (images or (images, labels[, ...])).
        return_labels: with a dataset of (images, labels): also return the labels (N,).

    Example:
        >>> feats = extract_features(model, images)            # doctest: +SKIP
    """
    features_of = feature_model(model)
    labels = []
    if isinstance(data, np.ndarray) or hasattr(data, "__array__") and not hasattr(data, "as_numpy_iterator"):
        if return_labels:
            raise ValueError("return_labels needs a dataset of (images, labels) batches, not an image array.")
        out = features_of.predict(np.asarray(data), batch_size=batch_size, verbose=0)
        return _pool_tokens(model, np.asarray(out, np.float32))
    batches = data.as_numpy_iterator() if hasattr(data, "as_numpy_iterator") else data
    chunks = []
    for batch in batches:
        if isinstance(batch, dict):
            images, y = batch.get("image", batch.get("images")), batch.get("label", batch.get("labels"))
        elif isinstance(batch, (tuple, list)):
            images, y = batch[0], batch[1] if len(batch) > 1 else None
        else:
            images, y = batch, None
        out = features_of.predict_on_batch(np.asarray(images))
        chunks.append(_pool_tokens(model, np.asarray(out, np.float32)))
        if y is not None:
            labels.append(np.asarray(y))
    features = np.concatenate(chunks, axis=0)
    if return_labels:
        if not labels:
            raise ValueError("return_labels=True but the data has no labels; pass (images, labels) batches.")
        y = np.concatenate(labels, axis=0)
        if y.ndim == 2:  # one-hot
            y = np.argmax(y, axis=1)
        return features, y
    return features
