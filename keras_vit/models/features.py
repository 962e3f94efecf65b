"""Dense features of every model family: the outputs of chosen blocks or stages as (batch, H, W, C)
maps, the contract of timm's `forward_intermediates` with Keras' channels-last layout.

Every keras_vit model class mixes in `FeatureMaps`, which gives it:

- `model.feature_info`: one entry per feature the model offers (a ViT's blocks, a CNN's stem and
  stages), each {"index", "layer", "channels", "reduction"} (reduction: input pixels per map
  position);
- `model.feature_extractor(indices=None, *, norm=False, return_prefix_tokens=False,
  output="nhwc")`: a keras.Model sharing the weights, for dense heads;
- `model.forward_intermediates(images, ...)`: the same run on `images`, as timm's method of that
  name returns it ((final features, intermediates), or the intermediates alone).

What a family's model states (`_feature_endpoints`, `_final_feature_layer`): the layers whose
outputs are the features, with their reductions, and the norm `norm=True` applies to them.
"""

import dataclasses

import keras
from keras import ops

register = keras.saving.register_keras_serializable(package="keras_vit")

OUTPUTS = ("nhwc", "tokens")


# === Layers ===


@register
class TokensToGrid(keras.layers.Layer):
    """(batch, prefix + rows * cols, C) tokens -> (batch, rows, cols, C), prefix tokens dropped.

    With `stride` set (models with `dynamic_image_size`), the layer is called as
    `layer(tokens, images)` and the grid is (height // stride, width // stride) of the images.
    """

    def __init__(self, grid_size, num_prefix_tokens=1, stride=None, **kwargs):
        super().__init__(**kwargs)
        self.grid_size = tuple(int(g) for g in grid_size)
        self.num_prefix_tokens = int(num_prefix_tokens)
        self.stride = None if stride is None else int(stride)

    def call(self, tokens, images=None):
        rows, cols = self.grid_size
        if self.stride is not None:
            shape = ops.shape(images)
            rows, cols = shape[1] // self.stride, shape[2] // self.stride
        return ops.reshape(tokens[:, self.num_prefix_tokens :], (-1, rows, cols, tokens.shape[-1]))

    def compute_output_spec(self, tokens, images=None):
        grid = self.grid_size if self.stride is None else (None, None)
        return keras.KerasTensor((tokens.shape[0], *grid, tokens.shape[-1]), dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(grid_size=list(self.grid_size), num_prefix_tokens=self.num_prefix_tokens)
        if self.stride is not None:
            config.update(stride=self.stride)
        return config


@register
class TokenSlice(keras.layers.Layer):
    """tokens[:, start:stop] of a (batch, tokens, C) sequence: a ViT's prefix tokens (class,
    distillation, registers) or its patch tokens."""

    def __init__(self, start=0, stop=None, **kwargs):
        super().__init__(**kwargs)
        self.start = int(start)
        self.stop = None if stop is None else int(stop)

    def call(self, tokens):
        return tokens[:, self.start : self.stop]

    def compute_output_spec(self, tokens):
        length = tokens.shape[1]
        if length is not None:
            length = len(range(length)[self.start : self.stop])
        elif self.stop is not None and self.stop >= 0 and self.start >= 0:
            length = self.stop - self.start
        return keras.KerasTensor((tokens.shape[0], length, tokens.shape[-1]), dtype=self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "start": self.start, "stop": self.stop}


# === What a model states ===


@dataclasses.dataclass(frozen=True)
class FeatureEndpoint:
    """One feature a model offers: the layer whose output it is, input pixels per position, and
    the layer `norm=True` applies to it (None: none)."""

    layer: str
    reduction: int
    norm: str = None


def take_indices(count, indices):
    """Absolute feature indices of `indices` among `count` features (timm's `feature_take_indices`):
    None -> all, an int n -> the last n, a list -> those (negative counts from the end)."""
    if indices is None:
        indices = count
    if isinstance(indices, bool):
        raise TypeError(f"indices must be None, an int (the last n features) or a list of indices; got {indices!r}.")
    if isinstance(indices, int):
        if not 0 < indices <= count:
            raise ValueError(
                f"indices={indices} asks for the last {indices} features; the model has {count} (1 to {count}). "
                "Pass a list such as [-1] for chosen features."
            )
        return list(range(count - indices, count))
    out = []
    for index in indices:
        if isinstance(index, str):
            out.append(index)
            continue
        absolute = count + index if index < 0 else index
        if not 0 <= absolute < count:
            raise ValueError(f"Feature index {index} is out of range for a model of {count} features "
                             f"(0 to {count - 1}, or -{count} to -1).")
        out.append(int(absolute))
    if not out:
        raise ValueError("indices is an empty list; pass None (all features), an int or a list of indices.")
    return out


def _named_layer(model, name):
    names = [x.name for x in model.layers]
    if name not in names:
        from keras_vit.models.config import suggest

        raise ValueError(
            f"{model.name} has no layer {name!r}{suggest(str(name), names)}; pass feature indices (0, -1, ...) or "
            "names of layers such as 'encoderblock_3' or 'encoder_norm'."
        )
    return model.get_layer(name)


class FeatureMaps:
    """Mixin of every keras_vit model class: `feature_info`, `feature_extractor` and
    `forward_intermediates` (see the module docstring). A model class implements
    `_feature_endpoints()` and `_final_feature_layer()`."""

    def _feature_endpoints(self):
        raise NotImplementedError

    def _final_feature_layer(self):
        raise NotImplementedError

    @property
    def feature_info(self):
        """[{"index", "layer", "channels", "reduction"}] of every feature the model offers, in
        order (the indices `feature_extractor` takes)."""
        return [
            dict(index=i, layer=e.layer, channels=int(self.get_layer(e.layer).output.shape[-1]), reduction=e.reduction)
            for i, e in enumerate(self._feature_endpoints())
        ]

    def feature_extractor(self, indices=None, *, norm=False, return_prefix_tokens=False, output="nhwc",
                          include_final=False, name=None):
        """A keras.Model (sharing this model's weights) giving chosen features; see
        `keras_vit.models.features.feature_extractor`."""
        return feature_extractor(self, indices, norm=norm, return_prefix_tokens=return_prefix_tokens, output=output,
                                 include_final=include_final, name=name)

    def forward_intermediates(self, images, indices=None, *, norm=False, return_prefix_tokens=False, output="nhwc",
                              intermediates_only=False):
        """timm's `forward_intermediates` on `images` (batch, height, width, channels), channels last.

        Returns the list of chosen features ((map, prefix tokens) pairs with `return_prefix_tokens`
        on a model with prefix tokens), preceded, unless `intermediates_only`, by the final
        features: `(final, intermediates)`. The final features are what the model's head reads
        (a ViT's normed token sequence, prefix tokens included; a CNN's last map after its final
        norm). Arguments as for `feature_extractor`.

        Example:
            >>> vit = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,  # doctest: +SKIP
            ...                                   num_layers=4, num_heads=2, mlp_dim=32)
            >>> final, maps = vit.forward_intermediates(np.zeros((1, 32, 32, 3)), indices=2)  # doctest: +SKIP
            >>> final.shape, [m.shape for m in maps]  # doctest: +SKIP
            ((1, 17, 16), [(1, 4, 4, 16), (1, 4, 4, 16)])
        """
        key = (repr(indices), bool(norm), bool(return_prefix_tokens), output, bool(intermediates_only))
        cache = self.__dict__.setdefault("_feature_models", {})
        if key not in cache:
            cache[key] = feature_extractor(self, indices, norm=norm, return_prefix_tokens=return_prefix_tokens,
                                           output=output, include_final=not intermediates_only)
        out = cache[key](images, training=False)
        # Keras gives a one-output model's output itself: one feature is still a list here.
        single = len(take_indices(len(self._feature_endpoints()), [indices] if isinstance(indices, str) else indices)) == 1
        if intermediates_only:
            return [out] if single else list(out)
        final, intermediates = out
        return final, [intermediates] if single else list(intermediates)


def _as_map(model, tokens, layer_name, output, return_prefix, prefix):
    """A token sequence (batch, prefix + patches, C) or a grid (batch, H, W, C) as the chosen
    output: a grid or patch tokens, with the prefix tokens alongside when asked."""
    if len(tokens.shape) == 4:  # a grid already
        if output == "tokens":
            tokens = keras.layers.Reshape((-1, tokens.shape[-1]), name=f"{layer_name}_tokens")(tokens)
        return tokens
    if output == "nhwc":
        if getattr(model, "dynamic_image_size", False):  # the grid follows each batch's images
            grid = TokensToGrid(model.grid_size, prefix, model.stride, name=f"{layer_name}_grid")(
                tokens, model.inputs[0])
        else:
            grid = TokensToGrid(model.grid_size, prefix, name=f"{layer_name}_grid")(tokens)
    else:
        grid = TokenSlice(prefix, name=f"{layer_name}_patches")(tokens) if prefix else tokens
    if return_prefix and prefix:
        return [grid, TokenSlice(0, prefix, name=f"{layer_name}_prefix")(tokens)]
    return grid


def feature_extractor(model, indices=None, *, norm=False, return_prefix_tokens=False, output="nhwc",
                      include_final=False, name=None):
    """A keras.Model giving the outputs of `model`'s chosen blocks or stages, for dense heads.

    The contract of timm's `forward_intermediates`, channels last: the same indices, the same
    norm rule, the same prefix-token split, so a model converted from timm gives timm's
    intermediates (transposed to NHWC).

    Args:
        model: a keras_vit model of any family (`model.feature_info` lists its features: a ViT's
            or Axial-ViT's blocks; BiT's and AxialResNet's stem and stages; EfficientNet's stage
            ends at each reduction).
        indices: None (every feature), an int n (the last n), or a list of feature indices
            (negative counts from the end) or names of the model's layers (e.g. "encoder_norm").
            The outputs come in the list's order (timm's in increasing order: pass them so to
            match it).
        norm: apply the model's final norm to the features it fits, as timm does: a ViT's or
            Axial-ViT's final norm (`encoder_norm`) to every block (none when the model has no
            final norm or pools before it, `fc_norm`); BiT's final GroupNorm+ReLU to its last
            stage; EfficientNet and AxialResNet have no such norm (no effect).
        return_prefix_tokens: for a ViT with prefix tokens (class, distillation, registers, in
            that order), each output becomes a pair [map, prefix tokens (batch, prefix, C)].
            Prefix tokens never appear in the maps.
        output: "nhwc" (batch, rows, cols, C) maps, or "tokens" (batch, rows * cols, C), row-major
            (timm's "NLC").
        include_final: also return the final features (what the head reads: a ViT's normed token
            sequence with its prefix tokens, a CNN's last map after its final norm) first:
            outputs [final, [features...]].
        name: name of the new model (default "<model>_features").

    Returns:
        A keras.Model on the same input (sharing the weights) whose outputs are a list with one
        entry per index (Keras gives a model of one output that output itself).

    Example:
        >>> vit = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,  # doctest: +SKIP
        ...                                   num_layers=4, num_heads=2, mlp_dim=32)
        >>> features = feature_extractor(vit, [1, 3])  # doctest: +SKIP
        >>> [tuple(t.shape) for t in features.outputs]  # doctest: +SKIP
        [(None, 4, 4, 16), (None, 4, 4, 16)]
    """
    if output not in OUTPUTS:
        raise ValueError(f"output must be 'nhwc' or 'tokens'; got {output!r}.")
    if not isinstance(model, FeatureMaps):
        raise TypeError(
            f"feature_extractor needs a keras_vit model (VisionTransformer, BiTResNet, ...); got {type(model).__name__}."
        )
    endpoints = model._feature_endpoints()
    if isinstance(indices, str):
        indices = [indices]
    chosen = take_indices(len(endpoints), indices)
    prefix = int(getattr(model, "num_prefix_tokens", 0))
    outputs = []
    for index in chosen:
        if isinstance(index, str):
            layer = _named_layer(model, index)
            tokens = layer.output
            if len(tokens.shape) not in (3, 4):
                raise ValueError(f"Layer {index!r} outputs neither tokens nor a map (shape {tokens.shape}).")
            if len(tokens.shape) == 3 and not hasattr(model, "grid_size"):
                raise ValueError(f"Layer {index!r} outputs a sequence that is no patch grid (shape {tokens.shape}).")
        else:
            endpoint = endpoints[index]
            layer = model.get_layer(endpoint.layer)
            tokens = layer.output
            if norm and endpoint.norm is not None:
                tokens = model.get_layer(endpoint.norm)(tokens)
        outputs.append(_as_map(model, tokens, layer.name + ("_normed" if norm else ""), output,
                               return_prefix_tokens, prefix))
    if include_final:
        outputs = [model.get_layer(model._final_feature_layer()).output, outputs]
    inputs = model.inputs[0] if len(model.inputs) == 1 else model.inputs
    return keras.Model(inputs, outputs, name=name or f"{model.name}_features")
