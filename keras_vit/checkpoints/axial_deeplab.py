"""csrhddlam/axial-deeplab's AxialResNet checkpoints -> the AxialResNet weight tree.

Its training script saves `torch.save({"epoch": ..., "state_dict": model.state_dict(),
"optimizer": ...}, "....pth.tar")`, the keys prefixed `module.` when the model ran under
(Distributed)DataParallel; a bare state dict (`torch.save(model.state_dict(), ...)`) reads too.
The files are PyTorch zip files, read by keras_vit.storage.torch_zip (no pickle code runs).

Mapping (PyTorch layout -> Keras layout, module paths kept, '.' -> '/'):

    conv1.weight (64s, 3, 7, 7)                    conv1/kernel (7, 7, 3, 64s)
    *.bn1.weight / bias / running_mean / running_var   */bn1/gamma / beta / moving_mean / moving_variance
    layerI.J.{hight,width}_block.qkv_transform.weight (2c, c_in, 1)   .../qkv_transform/kernel (c_in, 2c)
    layerI.J.{hight,width}_block.relative          .../relative (unchanged)
    layerI.J.downsample.0.weight / downsample.1.*  .../downsample/0/kernel, .../downsample/1/*
    fc.weight (classes, c) / fc.bias               fc/kernel (c, classes) / fc/bias

`flatten_index` buffers are checked against the span (they are derived from it) and dropped, as
are BatchNorm's `num_batches_tracked`. The config is the `AxialResNet` keyword arguments,
inferred from the shapes: blocks per stage, `s` from the stem's width, heads from the
similarity BatchNorm, the image size from the first block's span (4 x span: 224 for the
original's 56).
"""

import os
import re

import numpy as np

from keras_vit.checkpoints.registry import CheckpointFormat, reads_config_object
from keras_vit.errors import CheckpointError
from keras_vit.models.axial_resnet_family import BATCH_NORM_EPSILON, axial_spans
from keras_vit.storage.files import describe_keys, reading
from keras_vit.storage.lazy import materialize
from keras_vit.storage.torch_zip import TorchZipFile, is_torch_zip

_BN = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
_BLOCK = re.compile(r"^layer(\d+)\.(\d+)\.")
_FIRST_RELATIVE = "layer1.0.hight_block.relative"
_BN_MODULES = ("bn1", "bn2", "bn_qkv", "bn_similarity", "bn_output", "downsample.1")


def _strip_module_prefix(state, source):
    prefixed = [k for k in state if k.startswith("module.")]
    if prefixed and len(prefixed) != len(state):
        raise CheckpointError(f"{source}: some keys start with 'module.' and some do not; the state dict is mixed.")
    return {k[len("module."):]: v for k, v in state.items()} if prefixed else dict(state)


def is_axial_state(state):
    keys = set(state)
    return _FIRST_RELATIVE in keys or "module." + _FIRST_RELATIVE in keys


def _tree_key(key):
    """The canonical key of the original's `key`, or None for a buffer that is dropped."""
    module, _, leaf = key.rpartition(".")
    if leaf in ("num_batches_tracked", "flatten_index"):
        return None
    path = module.replace(".", "/")
    if module.endswith(_BN_MODULES) and leaf in _BN:
        return f"{path}/{_BN[leaf]}"
    if leaf == "weight":
        return f"{path}/kernel"
    return f"{path}/{leaf}"


def axial_state_to_tree(state, *, source="checkpoint"):
    """The AxialResNet tree of the original's state dict ({key: array-like, PyTorch layout})."""
    state = _strip_module_prefix(state, source)
    tree = {}
    for key, value in state.items():
        name = _tree_key(key)
        leaf = key.rpartition(".")[2]
        if leaf == "flatten_index":
            _check_flatten_index(state, key, value, source)
        if name is None:
            continue
        dtype = np.dtype(getattr(value, "dtype", np.float32))
        if dtype.kind != "f":
            raise CheckpointError(
                f"{source}: weight {key!r} has dtype {getattr(value, 'torch_dtype', dtype.name)}; AxialResNet's weights "
                "are floating point. The file is corrupt or not a trained axialnet.py model."
            )
        shape = tuple(value.shape)
        if key.endswith("qkv_transform.weight"):
            if len(shape) != 3 or shape[2] != 1:
                raise CheckpointError(f"{source}: {key} has shape {shape}; expected (2 * channels, in, 1).")
            value = value.reshape(shape[0], shape[1]).T
        elif leaf == "weight" and len(shape) == 4:
            value = value.transpose(2, 3, 1, 0)
        elif key == "fc.weight":
            value = value.T
        elif leaf == "weight" and len(shape) != 1:
            raise CheckpointError(f"{source}: {key} has shape {shape}, which no AxialResNet weight of that name has.")
        tree[name] = value
    return tree


def _check_flatten_index(state, key, value, source):
    relative = state.get(key.replace("flatten_index", "relative"))
    if relative is None:
        raise CheckpointError(f"{source}: {key} without its relative embeddings.")
    span = (relative.shape[1] + 1) // 2
    i = np.arange(span)
    expected = (i[:, None] - i[None, :] + span - 1).reshape(-1)
    got = np.asarray(value)
    if got.shape != expected.shape or not np.array_equal(got, expected):
        raise CheckpointError(
            f"{source}: {key} is not the relative index of span {span} that the original derives from its "
            "kernel_size; the file does not come from axialnet.py's AxialAttention."
        )


def infer_axial_config(tree, *, source="checkpoint"):
    """AxialResNet kwargs of a canonical AxialResNet `tree` (shapes only)."""
    stem = tree.get("conv1/kernel")
    if stem is None or len(stem.shape) != 4 or stem.shape[:2] != (7, 7):
        raise CheckpointError(f"{source}: no conv1 of shape (7, 7, in, 64s); this is not an AxialResNet checkpoint.")
    units = {}
    for key in tree:
        m = re.match(r"^layer(\d+)/(\d+)/", key)
        if m:
            stage, unit = int(m.group(1)), int(m.group(2))
            units[stage] = max(units.get(stage, -1), unit)
    if not units or sorted(units) != list(range(1, len(units) + 1)):
        raise CheckpointError(f"{source}: stages {sorted(units)} are not numbered layer1..layerN; the state dict is "
                              "not axialnet.py's AxialResNet (or it was altered). Use the file its training saved.")
    block_units = tuple(units[s] + 1 for s in sorted(units))
    similarity = tree.get("layer1/0/hight_block/bn_similarity/gamma")
    relative = tree.get("layer1/0/hight_block/relative")
    if similarity is None or relative is None:
        raise CheckpointError(f"{source}: layer1.0.hight_block lacks bn_similarity or relative.")
    groups, odd = divmod(int(similarity.shape[0]), 3)
    span = (int(relative.shape[1]) + 1) // 2
    if odd or relative.shape[1] % 2 == 0:
        raise CheckpointError(f"{source}: layer1.0.hight_block's similarity norm or relative table has a shape no "
                              "AxialAttention has.")
    channels = int(stem.shape[-1])
    width = channels / 64
    image_size = 4 * span
    try:
        spans = axial_spans(image_size, block_units)
    except ValueError as err:
        raise CheckpointError(f"{source}: the first block's span {span} gives no valid image size ({err})") from None
    index = 0
    for stage, n in enumerate(block_units):
        for unit in range(n):
            key = f"layer{stage + 1}/{unit}/hight_block/relative"
            if key in tree and (int(tree[key].shape[1]) + 1) // 2 != spans[index][0]:
                raise CheckpointError(
                    f"{source}: {key} has span {(int(tree[key].shape[1]) + 1) // 2}, but a network whose first span is "
                    f"{span} has {spans[index][0]} there; the spans are not the original's per-stage halving."
                )
            index += 1
    head = tree.get("fc/kernel")
    return dict(
        image_size=(image_size, image_size),
        block_units=block_units,
        width_multiplier=int(width) if width.is_integer() else width,
        groups=groups,
        classes=int(head.shape[-1]) if head is not None else None,
        batch_norm_epsilon=BATCH_NORM_EPSILON,
        num_channels=int(stem.shape[2]),
    )


@reads_config_object
def read_axial_deeplab(path, lazy=False):
    """Read an axial-deeplab checkpoint (`.pth.tar` of its training script, or a bare state dict).

    Returns (AxialResNet weight tree, AxialResNetConfig).

    Example:
        >>> tree, config = read_axial_deeplab("axial50s/model_best.pth.tar")   # doctest: +SKIP
        >>> config["block_units"], config["width_multiplier"]
        ((3, 4, 6, 3), 0.5)
    """
    path = os.fspath(path)
    with reading(path):
        state = TorchZipFile(path).state_dict()
        if not is_axial_state(state):
            raise CheckpointError(
                f"{path}: no {_FIRST_RELATIVE!r} in its state dict ({describe_keys(state)}); this is not an "
                "axial-deeplab AxialResNet checkpoint."
            )
        tree = axial_state_to_tree(state, source=path)
        config = infer_axial_config(tree, source=path)
    return (tree if lazy else materialize(tree)), config


def read_axial_deeplab_at(path, image_size=None):
    """`read_axial_deeplab(path, lazy=True)`, refusing an `image_size` whose spans are not the
    checkpoint's: the relative embeddings have one column per offset of the span they were
    trained with, and the original defines no resize of them."""
    tree, config = read_axial_deeplab(path, lazy=True)
    if image_size is not None:
        try:
            same = axial_spans(image_size, config["block_units"]) == axial_spans(config["image_size"], config["block_units"])
        except ValueError as err:
            raise CheckpointError(f"{path}: {err}") from None
        if not same:
            size = config["image_size"][0]
            raise CheckpointError(
                f"{path}: an AxialResNet trained at {size}x{size} px (attention span {size // 4} in its first stage) "
                f"cannot run at image_size={image_size!r}: each attention's relative embeddings cover exactly the span "
                f"it was trained with, and the original defines no resize of them. Load it at image_size={size} (or "
                "leave image_size unset) and resize the images instead."
            )
    return tree, config


def detect(path):
    """A PyTorch zip file whose state dict holds axialnet.py's AxialAttention weights."""
    if not os.path.isfile(path) or not is_torch_zip(path):
        return False
    try:
        return is_axial_state(TorchZipFile(path).state_dict())
    except CheckpointError:
        return False


FORMAT = CheckpointFormat(
    name="axial_deeplab",
    description="an axial-deeplab AxialResNet checkpoint (PyTorch .pth.tar or state dict)",
    detect=detect,
    read=lambda path: read_axial_deeplab(path, lazy=True),
    read_sized=read_axial_deeplab_at,
    numerics=None,
    hub_files=(),
    torch_zip=True,
)
