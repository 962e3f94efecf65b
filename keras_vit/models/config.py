"""What every model family's configuration shares: the numerics of each upstream framework, the
field-group config base class and the checks of keyword arguments (sizes and the resize rules'
names come from `keras_vit.geometry`). Each family's own config class and architecture table live in its
family file (`keras_vit.models.<family>_family`)."""

import dataclasses
import functools
from collections.abc import Mapping

from keras_vit.geometry import RESIZE_RULES, as_pair  # noqa: F401  (re-exported)

# === Numerics per source ===

#: The numerics each upstream framework computes with. Carried into the model as config fields
#: (never global constants) so a converted model reproduces its source exactly.
NUMERICS = {
    "original": dict(
        layer_norm_epsilon=1e-6,
        gelu_approximate=True,
        group_norm_epsilon=1e-6,
        std_conv_epsilon=1e-5,
        std_conv_epsilon_inside_sqrt=False,
        position_embedding_resize="original",
    ),
    "timm": dict(
        layer_norm_epsilon=1e-6,
        gelu_approximate=False,
        group_norm_epsilon=1e-5,
        std_conv_epsilon=1e-8,
        std_conv_epsilon_inside_sqrt=True,
        position_embedding_resize="bicubic_antialias",
    ),
    "transformers": dict(
        layer_norm_epsilon=1e-12,
        gelu_approximate=False,
        group_norm_epsilon=1e-6,
        std_conv_epsilon=1e-5,
        std_conv_epsilon_inside_sqrt=False,
        position_embedding_resize="bicubic",
    ),
}
#: google-research/big_vision computes with the original Flax numerics (flax.linen defaults) and
#: resizes position embeddings by the original's rule (`resample_posemb`: scipy.ndimage.zoom, order=1).
NUMERICS["big_vision"] = dict(NUMERICS["original"])


# === The model's configuration ===


#: keras.Model keyword arguments a model passes on to Keras (not config fields).
KERAS_MODEL_ARGS = ("name", "dtype", "trainable")
#: The key of a config dict that names its model family ("vit", "bit", ...). Every model's
#: `get_config()` writes it, so presets' config.json and .keras files carry it.
FAMILY_KEY = "family"


def config_field(group, default=dataclasses.MISSING, doc=""):
    """A dataclass field of a config class in field group `group` (see `FieldGroupConfig`)."""
    return dataclasses.field(default=default, metadata={"group": group, "doc": doc})


def suggest(name, known):
    """" (did you mean 'x'?)" for the closest of `known` to `name`, or ""."""
    import difflib

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    if not close:  # typos that drop a suffix: "dropout" for "dropout_rate"
        close = [k for k in known if k.startswith(name) or name.startswith(k)][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


class UnknownArgumentError(TypeError, ValueError):
    """An unknown keyword argument (a TypeError as Python raises for one; also a ValueError)."""


def check_keywords(given, known, what):
    """Raise UnknownArgumentError naming every key of `given` not in `known`, with suggestions.

    Example:
        >>> check_keywords({"dropout": 0.1}, ("dropout_rate",), "f")
        Traceback (most recent call last):
        ...
        keras_vit.models.config.UnknownArgumentError: f got unknown keyword argument(s): 'dropout' (did you mean 'dropout_rate'?). Valid: dropout_rate.
    """
    unknown = [k for k in given if k not in known]
    if unknown:
        listed = "; ".join(f"{k!r}{suggest(k, known)}" for k in unknown)
        raise UnknownArgumentError(
            f"{what} got unknown keyword argument(s): {listed}. Valid: {', '.join(sorted(known))}."
        )


@functools.lru_cache(maxsize=None)
def _field_names(config_class):
    """{field name: None} of a config class, in declaration order (its ClassVars are no fields)."""
    return dict.fromkeys(f.name for f in dataclasses.fields(config_class))


class FieldGroupConfig(Mapping):
    """What every model's frozen config dataclass shares: its fields grouped by each field's
    `metadata["group"]` ("architecture", "numerics", ...), built from a dict and copied with
    changes, unknown names refused with a suggestion.

    Read a config's fields as attributes (`config.num_heads`). A config is also a read-only
    mapping of its fields (`config["num_heads"]`, `config.get("resnet")`, `dict(config)`), so code
    written for the plain dicts checkpoint readers once returned keeps working. Sizes
    (`image_size` and other (rows, cols) fields) are normalised to pairs when the config is made.

    Example:
        >>> from keras_vit.models.bit_family import BiTConfig
        >>> config = BiTConfig(image_size=64, block_units=[1, 1], width_factor=0.5)
        >>> config.image_size, config["block_units"], "width_factor" in config
        ((64, 64), (1, 1), True)
    """

    # --- the read-only mapping of the fields -------------------------------------------------------

    def __getitem__(self, key):
        if not isinstance(key, str) or key not in _field_names(type(self)):
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(_field_names(type(self)))

    def __len__(self):
        return len(_field_names(type(self)))

    @classmethod
    def fields(cls, *groups):
        """Names of the fields in `groups` (all fields when none is given), in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls) if not groups or f.metadata["group"] in groups)

    @classmethod
    def architecture_fields(cls):
        """The fields a checkpoint determines: its architecture and its numerics."""
        return cls.fields("architecture", "numerics")

    @classmethod
    def from_dict(cls, config, *, ignore=KERAS_MODEL_ARGS):
        """A config from a dict (the model's `get_config()`, a checkpoint config).

        Keys in `ignore` (Keras' own model arguments by default) and the `family` key are
        dropped; any other key that is not a field raises a TypeError with a suggestion.

        Example:
            >>> from keras_vit.models.vit_family import ViTConfig
            >>> ViTConfig.from_dict({"image_size": [32, 48], "patch_size": 8, "hidden_size": 16,
            ...                      "num_layers": 1, "num_heads": 2, "mlp_dim": 32}).grid_size
            (4, 6)
        """
        config = {k: v for k, v in dict(config).items() if k not in ignore and k != FAMILY_KEY}
        check_keywords(config, cls.fields(), cls.__name__)
        return cls(**config)

    @classmethod
    def head_pooling(cls, arguments):
        """The pooling a model of `arguments` reads its features with when it has no head
        (`classes=0`): global average pooling unless the config class says otherwise."""
        return "avg"

    def replace(self, **changes):
        """A copy with `changes` applied (validated again); unknown names raise with a suggestion."""
        check_keywords(changes, self.fields(), f"{type(self).__name__}.replace")
        return dataclasses.replace(self, **changes)


def without_head(config_class, arguments):
    """Model arguments with timm's `num_classes=0` read as Keras says it: `classes=0` means no head,
    the features pooled as the head would have read them (`include_top=False` and the pooling
    `config_class.head_pooling` gives, unless `pooling` is set). Other arguments come back as
    they are.

    Example:
        >>> from keras_vit.models.bit_family import BiTConfig
        >>> without_head(BiTConfig, {"classes": 0, "block_units": [1]})
        {'block_units': [1], 'include_top': False, 'pooling': 'avg'}
    """
    classes = arguments.get("classes")
    if isinstance(classes, bool) or classes != 0:
        return arguments
    out = {k: v for k, v in arguments.items() if k != "classes"}
    out["include_top"] = False
    if out.get("pooling") is None:
        out["pooling"] = config_class.head_pooling(out)
    return out
