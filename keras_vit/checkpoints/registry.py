"""The registry of checkpoint formats: each format is one module that declares a `FORMAT`
(or a tuple `FORMATS`) of `CheckpointFormat` records, and one line of `_MODULES` below.

A record states everything the rest of the package needs to know about its format: how to
recognise a local file or folder, how to read it into the canonical weight tree (lazily), how
to write it back (where a writer exists), the numerics of the framework that produced it, and
which files of a Hub repository hold it. Detection tries the formats in `_MODULES` order, so a
format with a narrower test (e.g. timm's BiT ResNets) is listed before a broader one (timm's
ViTs).

    fmt = detect_format("vit_base_patch16_224/")          # -> the "timm" record
    tree, config = fmt.read_at("vit_base_patch16_224/")    # lazy canonical tree + ViTConfig
"""

import dataclasses
import functools
import importlib
import os
from typing import Callable, Optional

from keras_vit.errors import CheckpointError
from keras_vit.models.config import NUMERICS
from keras_vit.models.family import config_object
from keras_vit.storage.files import check_file_name, endings
from keras_vit.storage.json_files import read_json_object
from keras_vit.storage.lazy import materialize
from keras_vit.storage.safetensors import SafetensorsFile

#: Format modules under keras_vit.checkpoints, in detection order. A new format: one module
#: declaring FORMAT = CheckpointFormat(...), plus one line here.
_MODULES = (
    "keras_format",
    "bit",
    "timm_efficientnet",  # before "timm": its folders are timm folders too
    "timm",
    "transformers",
    "axial_deeplab",  # before "npz", which takes any zip: its PyTorch zip files may carry any name
    "big_vision",  # before "npz": both are .npz files, big_vision's told apart by its member names
    "npz",
)

#: Names of pickles (PyTorch's and plain ones), which only the restricted torch zip reader opens.
_PICKLES = endings("pytorch", "pickle")


@dataclasses.dataclass(frozen=True)
class CheckpointFormat:
    """One checkpoint format.

    Attributes:
        name: short name ("npz", "timm", ...), as `detect_format` reports it.
        description: what the user would call it, for error messages.
        detect: path -> bool, cheap (file names, magic bytes, a config.json), never raising for
            a file of another format.
        read: path -> (canonical tree, checkpoint config dict). Tree values may be lazy (read from
            the file when assigned), or the tree may be bound to the model being built (`bind`).
            `read_at` gives the config as the family's config object.
        write: (tree, path) -> path, where the format has a writer.
        numerics: the row of keras_vit.models.config.NUMERICS its framework computes with
            (None where the file states its own, as Keras-native files do).
        hub_files: glob patterns of the files a Hub repository in this format needs.
        hub_fallback_files: glob patterns of the files fetched from a Hub repository only when it
            holds none of the `hub_files` (a `pytorch_model.bin` beside which a repository's
            safetensors make it redundant: never both are downloaded).
        patch_resize_rule: the pixel resize (a `keras_vit.layers.resize.PATCH_RESIZE_RULES` name)
            whose effect a load at another patch size inverts (FlexiViT's PI-resize), as the
            format's framework does it; None: timm's rule, the default of `load_checkpoint`.
        torch_zip: whether its files are PyTorch zip files (`.pth`, `.pth.tar`, `.bin`, ...), read
            by storage.torch_zip; only such formats are asked about one.
        read_sized: (path, image_size) -> (tree, config dict), for formats whose grid the load's
            `image_size` may have to decide (see `read_at`).
        license: path -> the licence the file's own metadata names (timm's config.json
            `pretrained_cfg.license`), or None.
    """

    name: str
    description: str
    detect: Callable[[str], bool]
    read: Callable[[str], tuple]
    write: Optional[Callable] = None
    numerics: Optional[str] = None
    hub_files: tuple = ()
    hub_fallback_files: tuple = ()
    patch_resize_rule: Optional[str] = None
    read_sized: Optional[Callable] = None
    torch_zip: bool = False
    license: Optional[Callable] = None

    def read_at(self, path, image_size=None):
        """(canonical tree, the family's config object: `ViTConfig`, `BiTConfig`, ...) of the
        checkpoint at `path`: `read(path)`, or for a format whose files may not tell their own grid
        (a big_vision position embedding that is not square), `read_sized(path, image_size)`: the
        resolution the load asks for decides it where the file's shape fits it.

        Raises:
            CheckpointError also when the config the reader infers is no valid config of its family.
        """
        if self.read_sized is not None:
            tree, config = self.read_sized(path, image_size)
        else:
            tree, config = self.read(path)
        return tree, _config_object(config, path)

    @property
    def resize_rule(self):
        """The position-embedding resize rule of the format's framework (None: stated per file)."""
        return NUMERICS[self.numerics]["position_embedding_resize"] if self.numerics else None


def _config_object(config, path):
    """The family's config object of a reader's config (a dict, or one already), or a CheckpointError."""
    try:
        return config_object(config)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{path}: the checkpoint's configuration is not valid: {err}") from None


def reads_config_object(read):
    """A reader `read(path, ...) -> (tree, config dict)` made to give the family's config object
    (`ViTConfig`, `BiTConfig`, ...) instead of the dict: the public `read_*` functions of the
    format modules, as `CheckpointFormat.read_at` does for every format."""

    @functools.wraps(read)
    def reader(path, *args, **kwargs):
        tree, config = read(path, *args, **kwargs)
        return tree, _config_object(config, os.fspath(path))

    return reader


_REGISTRY = {}
#: The names of the formats `register_format` added.
_ADDED = set()


def formats():
    """{name: CheckpointFormat} of every registered format, in detection order."""
    if not _REGISTRY:
        for module_name in _MODULES:
            module = importlib.import_module(f"keras_vit.checkpoints.{module_name}")
            declared = getattr(module, "FORMATS", None) or (module.FORMAT,)
            for fmt in declared:
                _REGISTRY[fmt.name] = fmt
    return dict(_REGISTRY)


def register_format(fmt, *, before=None):
    """Add a `CheckpointFormat` at run time (a reader defined outside keras_vit: a plugin's, a
    test's), detected after the registered ones, or just before the format called `before` (a
    narrower test than that format's). `unregister_format(fmt.name)` takes it away.

    Raises:
        ValueError when a format of that name is registered, or `before` names none.
    """
    table = formats()
    if fmt.name in table:
        raise ValueError(f"A checkpoint format {fmt.name!r} is registered already ({table[fmt.name].description}).")
    if before is not None and before not in table:
        raise ValueError(f"Unknown checkpoint format {before!r} to detect before; known: {', '.join(table)}.")
    order = [(name, f) for name, f in table.items()]
    index = len(order) if before is None else [name for name, _ in order].index(before)
    order.insert(index, (fmt.name, fmt))
    _REGISTRY.clear()
    _REGISTRY.update(order)
    _ADDED.add(fmt.name)
    return fmt


def unregister_format(name):
    """Remove the format called `name` that `register_format` added."""
    if name not in _ADDED:
        raise ValueError(f"No checkpoint format {name!r} was added with register_format.")
    _ADDED.discard(name)
    return _REGISTRY.pop(name)


def get_format(name):
    """The CheckpointFormat called `name`."""
    table = formats()
    if name not in table:
        raise ValueError(f"Unknown checkpoint format {name!r}; known: {', '.join(table)}.")
    return table[name]


def hub_file_patterns():
    """The files worth downloading from a checkpoint repository: the union of every format's."""
    patterns = ["*.json", "*.md"]
    for fmt in formats().values():
        patterns += [p for p in fmt.hub_files if p not in patterns]
    return patterns


def hub_fallback_patterns():
    """The files fetched from a checkpoint repository only when it holds none of
    `hub_file_patterns()`'s weights (keras_vit.hub.fetch's `fallback_patterns`): the union of
    every format's `hub_fallback_files`."""
    patterns = []
    for fmt in formats().values():
        patterns += [p for p in fmt.hub_fallback_files if p not in patterns]
    return patterns


def supported_description():
    return ", ".join(fmt.description for fmt in formats().values())


def detect_format(path):
    """The CheckpointFormat of the local file or folder `path`.

    Raises:
        FileNotFoundError when nothing exists at `path`; CheckpointError for a file whose content
        is another kind than its name says (`common.misnamed_error`), for pickles other than
        PyTorch zip files (never loaded: unpickling can run arbitrary code), for PyTorch zip files
        whose pickle names anything but tensors and containers, and for anything no format
        recognises.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"No checkpoint at {path!r}.")
    if os.path.isfile(path):
        # A file whose content is another kind than its name says (a .npz saved as .pth, a
        # PyTorch file as .safetensors) is named as such, not parsed by the wrong reader.
        check_file_name(path)
    if os.path.isfile(path) and path.endswith(_PICKLES):
        # PyTorch zip files are read by a restricted unpickler that runs nothing from the file
        # (storage.torch_zip); legacy torch files and other pickles are never unpickled.
        from keras_vit.storage.torch_zip import TorchZipFile, is_legacy_torch_file, is_torch_zip, legacy_error

        if is_legacy_torch_file(path):
            raise legacy_error(path)
        if not is_torch_zip(path):
            raise CheckpointError(
                f"{path!r} is a pickle, not a PyTorch zip file; this package never unpickles (it can run arbitrary "
                "code). Convert it to safetensors (save_pretrained(..., safe_serialization=True), or timm's "
                "save_for_hf(..., safe_serialization=True))."
            )
        TorchZipFile(path)  # refuses a pickle that names anything but tensors and containers, naming it
        for fmt in formats().values():
            if fmt.torch_zip and fmt.detect(path):
                return fmt
        raise CheckpointError(
            f"{path!r} is a PyTorch zip file of no model family this package reads on its own. For timm or "
            "transformers weights (pytorch_model.bin) pass the folder that holds it with its config.json."
        )
    for fmt in formats().values():
        if fmt.detect(path):
            return fmt
    what = "folder" if os.path.isdir(path) else "file"
    raise CheckpointError(
        f"Unknown checkpoint format of the {what} {path!r}: it holds no checkpoint this package reads. "
        f"Expected one of: {supported_description()}."
    )


def read_checkpoint(path, image_size=None):
    """Read a local checkpoint into (canonical weight tree, the family's config object).

    The config object (`ViTConfig`, `BiTConfig`, ...) holds the architecture inferred from the
    checkpoint itself (shapes and its own config file) and the numerics of its source framework;
    a checkpoint without a head has `include_top=False` and `classes=None`. Read its fields as
    attributes; it is also a read-only mapping (`config["num_heads"]`, `dict(config)`). The
    tree's values are float32 numpy arrays (use `keras_vit.load_checkpoint` to load into a model
    without this full copy). `image_size` is needed only where the file cannot tell its
    position-embedding grid (a big_vision file whose grid is not square; the error says so).

    Example:
        >>> tree, config = keras_vit.read_checkpoint("vit_tiny_patch16_224/")   # doctest: +SKIP
        >>> config.num_heads, config.gelu_approximate, config.image_size
        (3, False, (224, 224))
    """
    tree, config = detect_format(path).read_at(os.fspath(path), image_size)
    if hasattr(tree, "bind"):
        tree = tree.materialize(config)
    return materialize(tree), config


# === Which library wrote a safetensors file ===


def safetensors_flavour(path):
    """"transformers" or "timm", from the tensor names of a .safetensors (or its index); "timm"
    also for a file too damaged to tell (its reader then says what is wrong with it)."""
    try:
        if path.endswith(".index.json"):
            keys = list(read_json_object(path, missing={}, malformed={}).get("weight_map", {}))
        else:
            keys = SafetensorsFile(path).keys()
    except CheckpointError:
        return "timm"
    if any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in keys):
        return "transformers"
    return "timm"
