"""Keras-native checkpoints: .keras files, .weights.h5 (with a config.json next to them) and
Keras preset folders (config.json, metadata.json, model.weights.h5, README.md).

A preset folder is what `save_preset` writes and what the publishing pipeline uploads:
config.json is the model's `get_config()` (so its family, the architecture, the numerics and a possibly
non-square resolution travel with the weights), model.weights.h5 is Keras' own weights file.
"""

import dataclasses
import datetime
import json
import os

import numpy as np

from keras_vit.checkpoints.registry import CheckpointFormat, reads_config_object
from keras_vit.errors import CheckpointError
from keras_vit.storage.files import corrupt_file_error, file_kind, reading
from keras_vit.storage.json_files import read_json_object
from keras_vit.storage.keras_archive import (
    check_h5_datasets,
    check_members,
    is_zip_with,
    open_member,
    read_h5_dataset,
    read_member_json,
)
from keras_vit.storage.lazy import LazyArray, materialize

CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "model.weights.h5"
README_FILE = "README.md"


def _family(config, source):
    """The model family of a saved model's config (a CheckpointError when it has none)."""
    from keras_vit.models.family import family_of

    try:
        return family_of(config)
    except ValueError as err:
        raise CheckpointError(f"{source}: config.json {err}") from None


def _unwrap(config, source):
    """The model's own config of a config.json: `get_config()`, or the `config` of Keras'
    serialised {"class_name", "config"} form (whose class must be a keras_vit model)."""
    if not isinstance(config, dict):
        raise CheckpointError(f"{source}: config.json does not hold a JSON object.")
    if "class_name" in config and "config" in config:  # keras.saving.serialize_keras_object form
        from keras_vit.models.family import families

        if not isinstance(config["config"], dict) or not any(config["class_name"] == f.class_name for f in families()):
            known = ", ".join(f.class_name for f in families())
            raise CheckpointError(f"{source}: config.json describes a {config['class_name']}, not a keras_vit model ({known}).")
        family = _family(config, source)
        config = config["config"]
    else:
        family = _family(config, source)
    required = [f.name for f in dataclasses.fields(family.config_class)
                if f.default is dataclasses.MISSING and f.name != "image_size"]
    if any(k not in config for k in required):
        raise CheckpointError(
            f"{source}: config.json is not a keras_vit {family.class_name} config (it lacks "
            f"{', '.join(k for k in required if k not in config)})."
        )
    return config


def check_config_fits(config, weights_bytes, source):
    """Refuse a config whose model could not be stored in `weights_bytes` bytes, before it is built.

    Building allocates every variable, so a config.json claiming hidden_size 10**6 next to a
    small weights file would allocate terabytes before the mismatch shows. The family gives the
    fewest bytes its weights can occupy (`ModelFamily.weights_lower_bound`).
    """
    params = _family(config, source).minimum_weight_bytes(config, source)
    if params is not None and params > weights_bytes:
        raise CheckpointError(
            f"{source}: config.json describes a model of at least {params:,} parameters but the weights file holds "
            f"only {weights_bytes:,} bytes; the config does not belong to these weights (or a file is corrupt)."
        )


def _checked(model_config, source):
    """`model_config` if it is a valid config of its model family, else a CheckpointError naming
    `source` (checked before any model is built from it)."""
    family = _family(model_config, source)
    with reading(source):
        family.validate(model_config)
    return model_config


def checkpoint_config(model_config):
    """The checkpoint config (architecture + numerics, as the other readers infer it) of a keras_vit
    model's `get_config()`: `classes` None when the file has no head (and, for ViTs,
    `representation_size` None when it has no `pre_logits` layer)."""
    return _family(model_config, "config.json").checkpoint_config(model_config)


def keras_weight_paths(model):
    """{canonical key: path of its dataset in a Keras weights file saved from `model`}.

    Keras names the datasets of `save_weights` by walking the model's layers (class names with
    counters, then attribute names), not by layer names. The same walk, with Keras' own saving
    code recording instead of writing, gives the path of every variable. Layers present in both
    the saved model and `model` get the same paths: the only layers that can differ between
    them (pooling, pre_logits, head) come last.
    """
    from keras.src.saving import saving_lib  # Keras' own saving walk (no public API exposes the paths)

    from keras_vit.models.weight_tree import weight_variables

    recorder = saving_lib.NpzIOStore("", mode="w")  # write mode keeps everything in memory
    saving_lib._save_state(model, recorder, None, "", set())
    paths = {}
    for inner, values in recorder.contents.items():
        prefix = "vars" if inner == "__root__" else f"{inner}/vars"
        for index, value in values.items():
            paths[id(value)] = f"{prefix}/{index}"
    return {key: paths[id(var)] for key, var in weight_variables(model).items() if id(var) in paths}


class KerasWeights:
    """The weights of a Keras-native file, read lazily by canonical key once bound to a model.

    A Keras weights file names its datasets after the structure of the model that saved it, so
    the canonical names are known only next to a model of that structure: `bind(model)` gives
    {canonical key: LazyArray} for the model being loaded (the one model a load builds).
    """

    def __init__(self, open_h5, source):
        self._open = open_h5
        self.source = source

    def _file(self):
        import h5py

        try:
            return h5py.File(self._open(), "r")
        except (OSError, ValueError) as err:
            raise corrupt_file_error(self.source, err) from None

    def bind(self, model):
        """{canonical key: LazyArray} of the file's weights that `model` holds.

        Raises:
            CheckpointError when the file lacks a weight its config.json implies, or holds one in
            another shape (only the position embedding and the head may differ from `model`'s).
        """
        from keras_vit.models.weight_tree import weight_variables

        from keras_vit.models.family import family_of

        family = family_of(model)
        optional_weights, may_differ = family.optional_weights, family.resizable_weights
        handle = self._file()
        variables = weight_variables(model)
        tree, problems = {}, []
        for key, path in keras_weight_paths(model).items():
            optional = key.startswith(may_differ)
            dataset = handle.get(path)
            if dataset is None or not hasattr(dataset, "shape"):
                if not key.startswith(optional_weights):
                    problems.append(f"no weight for {key}")
                continue
            if not optional and tuple(dataset.shape) != tuple(variables[key].shape):
                problems.append(f"{key} has shape {tuple(dataset.shape)}, the config implies {tuple(variables[key].shape)}")
                continue
            tree[key] = LazyArray(lambda h=handle, p=path: read_h5_dataset(h, p, self.source), dataset.shape)
        if problems:
            raise CheckpointError(
                f"{self.source}: the weights in it do not fit its config.json ({'; '.join(problems[:4])}"
                f"{', ...' if len(problems) > 4 else ''}). Save the model again with save_preset() or model.save()."
            )
        return tree

    def materialize(self, config):
        """{canonical key: array} of the file, through a model of `config` (read_checkpoint only)."""
        from keras_vit.layers.init_scope import skip_random_init

        family = _family(config, self.source)
        with skip_random_init():
            model = family.build(**family.model_kwargs(config))
        return materialize(self.bind(model))


@reads_config_object
def read_weights_h5(path, config_path=None):
    """A .weights.h5 (Keras' save_weights) with the VisionTransformer config.json beside it ->
    (KerasWeights, checkpoint config)."""
    path = os.fspath(path)
    config_path = config_path or os.path.join(os.path.dirname(path), CONFIG_FILE)
    if not os.path.exists(config_path):
        raise CheckpointError(
            f"{path}: a .weights.h5 file holds no architecture; put the model's config.json "
            "(VisionTransformer.get_config()) next to it, or save the model with save_preset()."
        )
    with reading(config_path):
        config = _unwrap(read_json_object(config_path), config_path)
        size = os.path.getsize(path)
        if size == 0:
            raise corrupt_file_error(path, EOFError("empty file"))
        check_config_fits(config, size, config_path)
        check_h5_datasets(path, size, path)
        return KerasWeights(lambda: path, path), checkpoint_config(_checked(config, config_path))


def read_keras_preset(folder):
    """A Keras preset folder written by `save_preset` -> (KerasWeights, checkpoint config)."""
    folder = os.fspath(folder)
    weights = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.exists(weights):
        raise CheckpointError(f"{folder}: a Keras preset folder needs {WEIGHTS_FILE} next to {CONFIG_FILE}.")
    return read_weights_h5(weights, os.path.join(folder, CONFIG_FILE))


@reads_config_object
def read_keras_file(path):
    """A .keras file holding a keras_vit VisionTransformer -> (KerasWeights, checkpoint config).

    The weights are read in place from the archive (Keras stores its members uncompressed)."""
    path = os.fspath(path)
    with reading(path):
        weights, raw = _check_keras_archive(path)
    config = checkpoint_config(_checked(_unwrap(raw, path), path))
    return KerasWeights(lambda: weights, path), config


def _check_keras_archive(path):
    """The checks `read_weights_h5` makes, on the config.json and model.weights.h5 inside a .keras
    zip, before Keras builds anything from it. Returns (model.weights.h5 opened (`open_member`:
    mapped and CRC-checked once), for the load to read from; the config.json object)."""
    infos = check_members(path, (CONFIG_FILE, WEIGHTS_FILE), "a .keras file")
    config = read_member_json(path, CONFIG_FILE)
    weights_bytes = infos[WEIGHTS_FILE].file_size
    check_config_fits(_unwrap(config, path), weights_bytes, path)
    weights = open_member(path, WEIGHTS_FILE)
    try:
        check_h5_datasets(weights, weights_bytes, path)
    except BaseException:
        weights.close()
        raise
    return weights, config


def license_of(path):
    """The licence a Keras-native checkpoint records for its weights (`metadata.json`'s "license":
    a preset folder's, the one inside a .keras archive, or the one beside a .weights.h5), or None."""
    path = os.fspath(path)
    try:
        if os.path.isdir(path):
            metadata = read_json_object(os.path.join(path, METADATA_FILE), missing={}, malformed={})
        elif _detect_keras(path):
            metadata = read_member_json(path, METADATA_FILE) if is_zip_with(path, (METADATA_FILE,)) else {}
        else:
            metadata = read_json_object(os.path.join(os.path.dirname(path), METADATA_FILE), missing={}, malformed={})
    except CheckpointError:  # a damaged metadata.json states no licence; the weights' own checks still run
        return None
    license = metadata.get("license") if isinstance(metadata, dict) else None
    return license if isinstance(license, str) and license else None


def _detect_preset(path):
    return (
        os.path.isdir(path)
        and os.path.isfile(os.path.join(path, WEIGHTS_FILE))
        and os.path.isfile(os.path.join(path, CONFIG_FILE))
    )


def _detect_keras(path):
    return os.path.isfile(path) and (path.endswith(".keras") or (not path.endswith(".npz") and is_zip_with(path, (CONFIG_FILE, WEIGHTS_FILE))))


def _detect_weights(path):
    return os.path.isfile(path) and (path.endswith(".h5") or file_kind(path) == "hdf5")


FORMATS = (
    CheckpointFormat(
        name="keras_preset",
        description="a Keras preset folder (config.json + model.weights.h5)",
        detect=_detect_preset,
        read=read_keras_preset,
        hub_files=(WEIGHTS_FILE,),
        license=license_of,
    ),
    CheckpointFormat(
        name="keras",
        description="a .keras file",
        detect=_detect_keras,
        read=read_keras_file,
        hub_files=("*.keras",),
        license=license_of,
    ),
    CheckpointFormat(
        name="keras_weights",
        description="a .weights.h5 with config.json beside it",
        detect=_detect_weights,
        read=read_weights_h5,
        license=license_of,
    ),
)


# === Writer ===

_CARD = """---
library_name: keras
tags:
- keras_vit
{tags}
- image-classification
---
# {title}

{introduction}

| | |
|---|---|
{rows}| image size | {image_size} |
| classes | {classes} |
| parameters | {params:,} |
{extra}
## Usage

```python
import keras_vit

model = keras_vit.load_checkpoint("{source}")
# inputs: channels-last images scaled to [-1, 1] (keras_vit.preprocess_input)
```
"""


def _model_card(model, metadata, folder):
    """The README.md of a preset folder: the family's text and table rows, then the shared ones."""
    from keras_vit.models.family import family_of

    c = model.config  # the config object: sizes are (height, width) pairs
    tags, introduction, rows = family_of(model).model_card(c)
    extra = "".join(
        f"| {k} | {v} |\n" for k, v in metadata.items() if isinstance(v, (str, int, float)) and k != "description"
    )
    text = _CARD.format(
        tags="".join(f"- {t}\n" for t in tags).rstrip("\n"),
        title=metadata.get("name") or os.path.basename(os.path.abspath(folder)),
        introduction=introduction,
        rows="".join(f"| {k} | {v} |\n" for k, v in rows),
        image_size="x".join(str(s) for s in c["image_size"]),
        classes=c["classes"] if c["include_top"] else "none (feature extractor)",
        params=model.count_params(),
        extra=extra,
        source=metadata.get("hub_id", os.path.abspath(folder)),
    )
    if metadata.get("description"):
        text += "\n" + str(metadata["description"]).strip() + "\n"
    return text


def _write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def save_preset(model, folder, metadata=None, readme=True):
    """Save a keras_vit model as a Keras preset folder that `load_checkpoint` reads back.

    Writes config.json (the model's get_config()), model.weights.h5, metadata.json (versions,
    parameter count, date and the given `metadata`: e.g. source, license, sha256 of the upstream
    file) and, unless `readme=False`, a README.md model card.

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...     num_layers=1, num_heads=2, mlp_dim=32, classes=3)
        >>> save_preset(model, "/tmp/tiny_preset", metadata={"source": "random"})
        >>> keras_vit.load_checkpoint("/tmp/tiny_preset").output_shape
        (None, 3)
    """
    import keras

    from keras_vit.version import __version__
    from keras_vit.models.family import families, family_of

    try:
        family_of(model)
    except ValueError:
        known = ", ".join(f.class_name for f in families())
        raise TypeError(f"save_preset expects a keras_vit model ({known}); got {type(model).__name__}.") from None
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    metadata = dict(metadata or {})
    config = model.get_config()
    weights = os.path.join(folder, WEIGHTS_FILE)
    tmp = os.path.join(folder, "tmp." + WEIGHTS_FILE)
    model.save_weights(tmp)
    os.replace(tmp, weights)
    _write_text(os.path.join(folder, CONFIG_FILE), json.dumps(config, indent=2, default=_json_default) + "\n")
    meta = {
        "keras_vit_version": __version__,
        "keras_version": keras.__version__,
        "parameter_count": int(model.count_params()),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **metadata,
    }
    _write_text(os.path.join(folder, METADATA_FILE), json.dumps(meta, indent=2, default=_json_default) + "\n")
    if readme:
        _write_text(os.path.join(folder, README_FILE), _model_card(model, metadata, folder))
    return folder


def save_keras_file(model, path, metadata=None):
    """`model.save(path)` (a .keras file), with `metadata` (e.g. {"license": "cc-by-nc-4.0"})
    added to the archive's own metadata.json, where `load_checkpoint` reads the licence back.

    Example:
        >>> model = keras_vit.VisionTransformer(image_size=32, patch_size=8, hidden_size=16,
        ...     num_layers=1, num_heads=2, mlp_dim=32, classes=3)
        >>> save_keras_file(model, "/tmp/tiny.keras", {"license": "apache-2.0"})   # doctest: +SKIP
        >>> license_of("/tmp/tiny.keras")   # doctest: +SKIP
        'apache-2.0'
    """
    import shutil
    import zipfile

    path = os.fspath(path)
    if not metadata:
        model.save(path)
        return path
    saved, tmp = path + ".part.keras", path + ".tmp"
    try:
        model.save(saved)
        # A zip member cannot be rewritten in place: the archive is copied, metadata.json extended.
        with zipfile.ZipFile(saved) as source, zipfile.ZipFile(tmp, "w") as target:
            for info in source.infolist():
                if info.filename == METADATA_FILE:
                    merged = {**json.loads(source.read(info)), **metadata}
                    target.writestr(info, json.dumps(merged, indent=2, default=_json_default))
                    continue
                with source.open(info) as reader, target.open(info, "w", force_zip64=info.file_size > 2**31) as writer:
                    shutil.copyfileobj(reader, writer, 1 << 20)
        os.replace(tmp, path)
    finally:
        for leftover in (saved, tmp):
            if os.path.exists(leftover):
                os.remove(leftover)
    return path


def _json_default(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
