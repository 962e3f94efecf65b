"""What every keras_vit model built from a frozen config class shares: its Keras config round
trip, the config's fields read as model attributes, and the constructor signature help() shows."""

import dataclasses
import inspect

import keras

from keras_vit.models.config import FAMILY_KEY, KERAS_MODEL_ARGS, check_keywords, without_head


def config_from_arguments(config_class, config, kwargs, what, required=()):
    """The `config_class` instance a model constructor was given: `config` itself (a
    `config_class`, with `kwargs` applied), a dict such as `get_config()` (Keras' own arguments
    dropped), or None for `kwargs` alone, which must then hold the `required` fields. Unknown
    keywords raise a TypeError with a suggestion.

    Example:
        >>> from keras_vit.models.bit_family import BiTConfig
        >>> config_from_arguments(BiTConfig, {"block_units": [1], "name": "m"}, {"width_factor": 0.5}, "f").block_units
        (1,)
    """
    check_keywords(kwargs, config_class.fields() + KERAS_MODEL_ARGS + (FAMILY_KEY,), what)
    kwargs = without_head(config_class, kwargs)  # classes=0: no head, pooled features (timm's num_classes=0)
    family = kwargs.pop(FAMILY_KEY, None)
    if isinstance(config, dict):
        config = dict(config)
        family = config.pop(FAMILY_KEY, family)
    if family is not None and family != config_class.family:
        raise ValueError(
            f"{what} builds {config_class.family!r} models; the config names family {family!r}. Build it with "
            f"that family's model class (keras_vit.models.family.get_family({family!r}).build(**config))."
        )
    if config is None:
        missing = [f for f in required if f not in kwargs]
        if missing:
            raise TypeError(f"{what} needs {', '.join(missing)} (missing: {', '.join(missing)}).")
        return config_class(**kwargs)
    if isinstance(config, dict):
        return config_class.from_dict({**config, **kwargs})
    if isinstance(config, config_class):
        return config.replace(**kwargs) if kwargs else config
    article = "an" if config_class.__name__[0] in "AEIOU" else "a"
    raise TypeError(
        f"{what} takes {article} {config_class.__name__} or keyword arguments; got {type(config).__name__}."
    )


def serialized_activation(activation):
    """`activation` (a name, a callable or None) as a model config keeps it: Keras' serialised
    form ("softmax"; "linear" for None)."""
    return keras.activations.serialize(keras.activations.get(activation))


def model_config(model):
    """A model's `get_config()`: its family, its config's fields, and Keras' name and trainable."""
    return {FAMILY_KEY: model.config.family, **model.config.to_dict(), "name": model.name, "trainable": model.trainable}


def model_from_config(cls, config):
    """`cls(**config)` for a get_config() dict, with a serialised dtype policy deserialised."""
    config = dict(config)
    if "dtype" in config and isinstance(config["dtype"], dict):
        config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
    return cls(**config)


class ConfigModel:
    """Mixin of every keras_vit model class (listed before `keras.Model`): the model's config object,
    `model.config` (the constructor keeps it as `self._model_config`), and its Keras config round
    trip, `get_config()` (`model_config`) and `from_config` (`model_from_config`); `_keep_config`
    keeps a config whose classifier activation is to be stored in its serialised form."""

    @property
    def config(self):
        """The model's config object (every constructor argument, normalised)."""
        return self._model_config

    def _keep_config(self, config):
        """Keep `config` as `model.config`, its classifier activation in Keras' serialised form
        (`serialized_activation`)."""
        self._model_config = config.replace(classifier_activation=serialized_activation(config.classifier_activation))

    def get_config(self):
        return model_config(self)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return model_from_config(cls, config)


def _field_property(field):
    return property(lambda self: getattr(self.config, field), doc=f"The config's `{field}`.")


def expose_config_fields(model_class, config_class):
    """Make every field of `config_class` (a dataclass) a read-only attribute of `model_class`
    (model.image_size, ...), and show the fields as keyword arguments of its constructor in
    help() and IDEs."""
    for field in config_class.fields():
        setattr(model_class, field, _field_property(field))
    model_class.__init__.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
        + [
            inspect.Parameter(
                f.name,
                inspect.Parameter.KEYWORD_ONLY,
                default=inspect.Parameter.empty if f.default is f.default_factory else f.default,
            )
            for f in dataclasses.fields(config_class)
        ]
        + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in KERAS_MODEL_ARGS[:2]]
        + [inspect.Parameter("trainable", inspect.Parameter.KEYWORD_ONLY, default=True)]
    )
