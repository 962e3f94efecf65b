"""What every keras_vit model built from a frozen config class shares: its Keras config round
trip, the config's fields read as model attributes, and the constructor signature help() shows."""

import inspect

import keras

from keras_vit.models.config import KERAS_MODEL_ARGS


def model_from_config(cls, config):
    """`cls(**config)` for a get_config() dict, with a serialised dtype policy deserialised."""
    config = dict(config)
    if "dtype" in config and isinstance(config["dtype"], dict):
        config["dtype"] = keras.dtype_policies.deserialize(config["dtype"])
    return cls(**config)


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
            for f in config_class.__dataclass_fields__.values()
        ]
        + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in KERAS_MODEL_ARGS[:2]]
        + [inspect.Parameter("trainable", inspect.Parameter.KEYWORD_ONLY, default=True)]
    )
