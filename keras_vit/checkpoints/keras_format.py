"""Keras-native checkpoints: .keras files, .weights.h5 (with a config.json next to them) and
Keras preset folders (config.json, metadata.json, model.weights.h5, README.md).

A preset folder is what `save_preset` writes and what the publishing pipeline uploads:
config.json is `VisionTransformer.get_config()` (so the architecture, the numerics and a possibly
non-square resolution travel with the weights), model.weights.h5 is Keras' own weights file.
"""

import datetime
import io
import json
import math
import mmap
import os
import struct
import zipfile
import zlib

import numpy as np

from keras_vit.checkpoints.common import (
    ARCHITECTURE_FIELDS,
    MAX_DEFLATE_RATIO,
    MAX_JSON_BYTES,
    CheckpointError,
    LazyArray,
    check_finite,
    corrupt_file_error,
    materialize,
    read_json,
    reading,
)
from keras_vit.checkpoints.registry import CheckpointFormat
from keras_vit.models.config import resnet_stride

CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
WEIGHTS_FILE = "model.weights.h5"
README_FILE = "README.md"


_BIT_FIELDS = ("image_size", "block_units", "width_factor", "classes", "num_channels", "group_norm_epsilon",
               "std_conv_epsilon", "std_conv_epsilon_inside_sqrt")


def _unwrap(config, source):
    if not isinstance(config, dict):
        raise CheckpointError(f"{source}: config.json does not hold a JSON object.")
    if "class_name" in config and "config" in config:  # keras.saving.serialize_keras_object form
        if config["class_name"] not in ("VisionTransformer", "BiTResNet"):
            raise CheckpointError(
                f"{source}: config.json describes a {config['class_name']}, not a VisionTransformer or BiTResNet."
            )
        config = config["config"]
    if isinstance(config, dict) and "block_units" in config:  # a BiTResNet
        return config
    if not isinstance(config, dict) or not {"patch_size", "hidden_size", "num_layers", "num_heads", "mlp_dim"} <= set(config):
        raise CheckpointError(
            f"{source}: config.json is not a keras_vit VisionTransformer config (it lacks patch_size, "
            "hidden_size, num_layers, num_heads or mlp_dim)."
        )
    return config


def _positive_int(config, key, source, default=None):
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"{source}: {key} is {str(value)[:40]!r}; expected a positive integer.")
    return value


def check_config_fits(config, weights_bytes, source):
    """Refuse a config whose model could not be stored in `weights_bytes` bytes, before it is built.

    Building allocates every variable, so a config.json claiming hidden_size 10**6 next to a
    small weights file would allocate terabytes before the mismatch shows. The lower bound
    counts the encoder's matmuls, the position embedding, the patch embedding and the head at
    one byte per parameter (int8 kernels are the smallest stored form).
    """
    hidden, layers, mlp, patch = (_positive_int(config, k, source)
                                  for k in ("hidden_size", "num_layers", "mlp_dim", "patch_size"))
    _positive_int(config, "num_heads", source)
    channels = _positive_int(config, "num_channels", source, default=3)
    size = config.get("image_size", 224)
    size = [size, size] if isinstance(size, int) and not isinstance(size, bool) else size
    if not isinstance(size, (list, tuple)) or len(size) != 2 or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in size
    ):
        raise CheckpointError(f"{source}: image_size is {str(size)[:40]!r}; expected a positive int or [height, width].")
    resnet = config.get("resnet")
    if resnet is not None:
        if not (isinstance(resnet, (list, tuple)) and len(resnet) == 2 and isinstance(resnet[0], (list, tuple))
                and all(isinstance(u, int) and not isinstance(u, bool) and 0 <= u <= 64 for u in resnet[0])
                and len(resnet[0]) <= 8 and isinstance(resnet[1], (int, float)) and not isinstance(resnet[1], bool)
                and 0 < resnet[1] <= 16):
            raise CheckpointError(f"{source}: resnet is {str(resnet)[:60]!r}; expected [[units per stage], width].")
    stride = patch * resnet_stride(resnet)
    tokens = (size[0] // stride) * (size[1] // stride) + 1
    params = layers * (4 * hidden * hidden + 2 * hidden * mlp) + tokens * hidden + patch * patch * channels * hidden
    if config.get("include_top", True):
        params += _positive_int(config, "classes", source, default=1000) * hidden
    if params > weights_bytes:
        raise CheckpointError(
            f"{source}: config.json describes a model of at least {params:,} parameters but the weights file holds "
            f"only {weights_bytes:,} bytes; the config does not belong to these weights (or a file is corrupt)."
        )


def _scan_h5(file, limit, source):
    """Check every dataset of a Keras weights file before Keras reads it: declared sizes within
    `limit` bytes (h5py allocates a dataset's declared shape when it is read), float or integer
    values only."""
    import h5py

    total = 0
    try:
        with h5py.File(file, "r") as h5:
            datasets = []
            h5.visititems(lambda name, obj: datasets.append((name, obj)) if isinstance(obj, h5py.Dataset) else None)
            for name, ds in datasets:
                if ds.dtype.kind not in "fiub" or ds.dtype.hasobject:
                    raise CheckpointError(f"{source}: weight {name!r} has dtype {ds.dtype}; expected numbers.")
                total += ds.dtype.itemsize * math.prod(ds.shape or ())
                if total > limit:
                    raise CheckpointError(
                        f"{source}: the weights declare more than {limit:,} bytes of tensors ({name!r} and before), "
                        "more than the file holds; the file is corrupt. Delete it and save or download it again."
                    )
    except CheckpointError:
        raise
    except Exception as err:  # h5py reports format damage as OSError, KeyError, ValueError, ...
        raise corrupt_file_error(source, err) from None


def _checked(model_config, source):
    """`model_config` if it is a valid VisionTransformer config, else a CheckpointError naming
    `source` (checked before any model is built from it)."""
    from keras_vit.models.config import ViTConfig

    if not _is_bit(model_config):
        with reading(source):
            ViTConfig.from_dict(model_config)
    return model_config


def _is_bit(config):
    return "block_units" in config


def checkpoint_config(model_config):
    """The checkpoint config (architecture + numerics, as the other readers infer it) of a
    VisionTransformer (or BiTResNet) `get_config()`: `classes` None when the file has no head,
    and `representation_size` None when it has no `pre_logits` layer."""
    fields = _BIT_FIELDS if _is_bit(model_config) else ARCHITECTURE_FIELDS
    config = {k: model_config[k] for k in fields if k in model_config}
    size = config["image_size"]
    config["image_size"] = (size, size) if isinstance(size, int) else tuple(size)
    if _is_bit(config):
        config["block_units"] = tuple(config["block_units"])
        if not model_config.get("include_top", True):
            config["classes"] = None
        return config
    if config.get("resnet") is not None:
        config["resnet"] = (tuple(config["resnet"][0]), config["resnet"][1])
    include_top = model_config.get("include_top", True)
    if not include_top:
        config["classes"] = None
    if not (include_top or model_config.get("pooling") is not None):
        config["representation_size"] = None
    return config


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

        handle = self._file()
        variables = weight_variables(model)
        tree, problems = {}, []
        for key, path in keras_weight_paths(model).items():
            optional = key.startswith(_MAY_DIFFER)
            dataset = handle.get(path)
            if dataset is None or not hasattr(dataset, "shape"):
                if not key.startswith(("head/", "pre_logits/", "resnet/head/")):
                    problems.append(f"no weight for {key}")
                continue
            if not optional and tuple(dataset.shape) != tuple(variables[key].shape):
                problems.append(f"{key} has shape {tuple(dataset.shape)}, the config implies {tuple(variables[key].shape)}")
                continue
            tree[key] = LazyArray(lambda h=handle, p=path: _read_dataset(h, p, self.source), dataset.shape)
        if problems:
            raise CheckpointError(
                f"{self.source}: the weights in it do not fit its config.json ({'; '.join(problems[:4])}"
                f"{', ...' if len(problems) > 4 else ''}). Save the model again with save_preset() or model.save()."
            )
        return tree

    def materialize(self, config):
        """{canonical key: array} of the file, through a model of `config` (read_checkpoint only)."""
        from keras_vit.layers.init_scope import skip_random_init
        from keras_vit.models.bit import BiTResNet
        from keras_vit.models.vit import VisionTransformer

        with skip_random_init():
            model = (BiTResNet if _is_bit(config) else VisionTransformer)(**_model_kwargs(config))
        return materialize(self.bind(model))


#: Weights whose shape a load may change: the position embedding (resized), the patch embedding
#: (PI-resized to another patch size) and the head (replaced).
_MAY_DIFFER = ("Transformer/posembed_input/", "embedding/kernel", "head/", "resnet/head/")


def _read_dataset(handle, path, source):
    try:
        array = np.asarray(handle[path][()], dtype=np.float32)
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise corrupt_file_error(source, err) from None
    return check_finite(array, path, source)


def _model_kwargs(config):
    """VisionTransformer kwargs that rebuild the file's model from its checkpoint config."""
    kwargs = dict(config)
    kwargs["include_top"] = config.get("classes") is not None
    kwargs["classes"] = config.get("classes") or 1000
    if _is_bit(config):
        kwargs["pooling"] = None
    else:
        kwargs["pooling"] = None if kwargs["include_top"] else (
            config["classifier"] if config.get("representation_size") else None)
    return kwargs


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
        config = _unwrap(read_json(config_path), config_path)
        size = os.path.getsize(path)
        if size == 0:
            raise corrupt_file_error(path, EOFError("empty file"))
        if not _is_bit(config):
            check_config_fits(config, size, config_path)
        _scan_h5(path, size, path)
        return KerasWeights(lambda: path, path), checkpoint_config(_checked(config, config_path))


def read_keras_preset(folder):
    """A Keras preset folder written by `save_preset` -> (KerasWeights, checkpoint config)."""
    folder = os.fspath(folder)
    weights = os.path.join(folder, WEIGHTS_FILE)
    if not os.path.exists(weights):
        raise CheckpointError(f"{folder}: a Keras preset folder needs {WEIGHTS_FILE} next to {CONFIG_FILE}.")
    return read_weights_h5(weights, os.path.join(folder, CONFIG_FILE))


def read_keras_file(path):
    """A .keras file holding a keras_vit VisionTransformer -> (KerasWeights, checkpoint config).

    The weights are read in place from the archive (Keras stores its members uncompressed)."""
    path = os.fspath(path)
    with reading(path):
        weights = _check_keras_archive(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            if CONFIG_FILE not in names or WEIGHTS_FILE not in names:
                raise CheckpointError(f"{path}: not a .keras file (it lacks {CONFIG_FILE} or {WEIGHTS_FILE}).")
            raw = json.loads(archive.read(CONFIG_FILE).decode("utf-8"))
    except (zipfile.BadZipFile, OSError, ValueError, UnicodeDecodeError, RecursionError) as err:
        if isinstance(err, (CheckpointError, FileNotFoundError)):
            raise
        raise corrupt_file_error(path, err) from None
    config = checkpoint_config(_checked(_unwrap(raw, path), path))
    return KerasWeights(lambda: weights, path), config


class _MappedMember(io.RawIOBase):
    """A read-only, seekable file over `size` bytes at `start` of a memory-mapped archive."""

    def __init__(self, mapped, start, size):
        super().__init__()
        self._map, self._view = mapped, memoryview(mapped)
        self._start, self._size, self._pos = start, size, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def tell(self):
        return self._pos

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer):
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), self._size - self._pos))
        begin = self._start + self._pos
        out[:n] = self._view[begin:begin + n]
        self._pos += n
        return n

    def close(self):
        if not self.closed:
            self._view.release()
            self._map.close()
        super().close()


def open_member(path, name):
    """A seekable, read-only file object of the member `name` of the zip archive `path`.

    A stored (uncompressed) member, as Keras writes them, is read in place through a memory map
    of the archive, after its CRC-32 is checked once. zipfile's own reader re-reads a member
    from its start on every backward seek (Python 3.11), and HDF5 seeks back and forth: a
    ViT-B/16 .keras file took 17 s to load that way, and the time grows with the square of the
    file's size. Other members (compressed, encrypted) are read through zipfile."""
    with zipfile.ZipFile(path) as archive:
        info = archive.getinfo(name)
    if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
        return zipfile.ZipFile(path).open(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset)
        header = f.read(_LOCAL_HEADER_SIZE)
        if len(header) != _LOCAL_HEADER_SIZE or header[:4] != b"PK\x03\x04":
            raise corrupt_file_error(path, ValueError(f"bad local header of {name}"))
        name_length, extra_length = struct.unpack("<HH", header[26:30])
        start = info.header_offset + _LOCAL_HEADER_SIZE + name_length + extra_length
        if start + info.file_size > os.fstat(f.fileno()).st_size:
            raise corrupt_file_error(path, EOFError(f"{name} runs past the end of the archive"))
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    member = _MappedMember(mapped, start, info.file_size)
    if zlib.crc32(member._view[start:start + info.file_size]) != info.CRC:
        member.close()
        raise corrupt_file_error(path, ValueError(f"{name} fails the archive's CRC-32 check"))
    return member


#: The fixed part of a zip local file header (signature to extra-field length).
_LOCAL_HEADER_SIZE = 30


def _check_keras_archive(path):
    """The checks `read_weights_h5` makes, on the config.json and model.weights.h5 inside a .keras
    zip, before Keras builds anything from it. Returns model.weights.h5 opened (`open_member`:
    mapped and CRC-checked once), for the load to read from."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise corrupt_file_error(path, err) from None
    with archive:
        infos = {i.filename: i for i in archive.infolist()}
        for name in ("config.json", "model.weights.h5"):
            if name not in infos:
                raise CheckpointError(f"{path}: a .keras file holds config.json and model.weights.h5; {name} is missing.")
            info = infos[name]
            if info.compress_type != zipfile.ZIP_STORED and info.file_size > MAX_DEFLATE_RATIO * max(
                    info.compress_size, 1):
                raise corrupt_file_error(path, ValueError(f"{name} claims more bytes than deflate can expand"))
        if infos["config.json"].file_size > MAX_JSON_BYTES:
            raise CheckpointError(f"{path}: its config.json of {infos['config.json'].file_size:,} bytes is too large.")
        try:
            config = json.loads(archive.read("config.json").decode("utf-8"))
        except (ValueError, RecursionError) as err:
            raise corrupt_file_error(path, err) from None
        if not isinstance(config, dict):
            raise corrupt_file_error(path, ValueError("config.json is not a JSON object"))
        weights_bytes = infos["model.weights.h5"].file_size
        if not _is_bit(_unwrap(config, path)):
            check_config_fits(_unwrap(config, path), weights_bytes, path)
    weights = open_member(path, WEIGHTS_FILE)
    try:
        _scan_h5(weights, weights_bytes, path)
    except BaseException:
        weights.close()
        raise
    return weights


def _is_hdf5(path):
    with open(path, "rb") as f:
        return f.read(8) == b"\x89HDF\r\n\x1a\n"


def _is_keras_zip(path):
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False
    return {CONFIG_FILE, WEIGHTS_FILE} <= names


def _detect_preset(path):
    return (
        os.path.isdir(path)
        and os.path.isfile(os.path.join(path, WEIGHTS_FILE))
        and os.path.isfile(os.path.join(path, CONFIG_FILE))
    )


def _detect_keras(path):
    return os.path.isfile(path) and (path.endswith(".keras") or (not path.endswith(".npz") and _is_keras_zip(path)))


def _detect_weights(path):
    return os.path.isfile(path) and (path.endswith(".h5") or _is_hdf5(path))


FORMATS = (
    CheckpointFormat(
        name="keras_preset",
        description="a Keras preset folder (config.json + model.weights.h5)",
        detect=_detect_preset,
        read=read_keras_preset,
        hub_files=(WEIGHTS_FILE,),
    ),
    CheckpointFormat(
        name="keras",
        description="a .keras file",
        detect=_detect_keras,
        read=read_keras_file,
        hub_files=("*.keras",),
    ),
    CheckpointFormat(
        name="keras_weights",
        description="a .weights.h5 with config.json beside it",
        detect=_detect_weights,
        read=read_weights_h5,
    ),
)


# === Writer ===

_CARD = """---
library_name: keras
tags:
- keras_vit
- vision-transformer
- image-classification
---
# {title}

Vision Transformer weights for [keras_vit](https://github.com/) (Keras 3: JAX, TensorFlow,
PyTorch), from "An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021).

| | |
|---|---|
| architecture | {arch} |
| image size | {image_size} |
| classes | {classes} |
| parameters | {params:,} |
| numerics | LayerNorm eps {layer_norm_epsilon:g}, GELU {gelu}, position-embedding resize "{resize}" |
{extra}
## Usage

```python
import keras_vit

model = keras_vit.load_checkpoint("{source}")
# inputs: channels-last images scaled to [-1, 1] (keras_vit.preprocess_input)
```
"""


def _bit_model_card(model, metadata, folder):
    c = model.get_config()
    text = _BIT_CARD.format(
        title=metadata.get("name") or os.path.basename(os.path.abspath(folder)),
        units=tuple(c["block_units"]),
        width=c["width_factor"],
        image_size="x".join(str(s) for s in c["image_size"]),
        classes=c["classes"] if c["include_top"] else "none (feature extractor)",
        params=model.count_params(),
        gn=c["group_norm_epsilon"],
        ws=c["std_conv_epsilon"],
        extra="".join(
            f"| {k} | {v} |\n" for k, v in metadata.items() if isinstance(v, (str, int, float)) and k != "description"
        ),
        source=metadata.get("hub_id", os.path.abspath(folder)),
    )
    if metadata.get("description"):
        text += "\n" + str(metadata["description"]).strip() + "\n"
    return text


_BIT_CARD = """---
library_name: keras
tags:
- keras_vit
- bit
- resnet
- image-classification
---
# {title}

BiT ResNet-v2 weights for keras_vit (Keras 3: JAX, TensorFlow, PyTorch), the CNN baselines of
"An Image is Worth 16x16 Words" (Dosovitskiy et al., ICLR 2021) from "Big Transfer (BiT)"
(Kolesnikov et al., 2020).

| | |
|---|---|
| architecture | BiT ResNet-v2, units per stage {units}, width x{width} |
| image size | {image_size} |
| classes | {classes} |
| parameters | {params:,} |
| numerics | GroupNorm eps {gn:g}, weight standardisation eps {ws:g} |
{extra}
## Usage

```python
import keras_vit

model = keras_vit.load_checkpoint("{source}")
# inputs: channels-last images scaled to [-1, 1] (keras_vit.preprocess_input)
```
"""


def _model_card(model, metadata, folder):
    if "block_units" in model.get_config():
        return _bit_model_card(model, metadata, folder)
    c = model.get_config()
    arch = f"hidden {c['hidden_size']}, {c['num_layers']} layers, {c['num_heads']} heads, MLP {c['mlp_dim']}, patch {c['patch_size']}"
    if c.get("resnet"):
        arch += f", BiT ResNet stages {tuple(c['resnet'][0])} width x{c['resnet'][1]}"
    if c["classifier"] == "gap":
        arch += ", global average pooling"
    extra = "".join(
        f"| {k} | {v} |\n" for k, v in metadata.items() if isinstance(v, (str, int, float)) and k != "description"
    )
    text = _CARD.format(
        title=metadata.get("name") or os.path.basename(os.path.abspath(folder)),
        arch=arch,
        image_size="x".join(str(s) for s in c["image_size"]),
        classes=c["classes"] if c["include_top"] else "none (feature extractor)",
        params=model.count_params(),
        layer_norm_epsilon=c["layer_norm_epsilon"],
        gelu="tanh approximation" if c["gelu_approximate"] else "exact (erf)",
        resize=c["position_embedding_resize"],
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

    from keras_vit import __version__
    from keras_vit.models.bit import BiTResNet
    from keras_vit.models.vit import VisionTransformer

    if not isinstance(model, (VisionTransformer, BiTResNet)):
        raise TypeError(f"save_preset expects a keras_vit VisionTransformer or BiTResNet; got {type(model).__name__}.")
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


def _json_default(value):
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
