"""The tensorflow-datasets sources of the paper: names, splits, label keys, class counts.

One table, `TFDS_DATASETS`, says for every dataset of the paper's transfer experiments which
tfds builder it is, which splits train / validation / test are, which feature holds the label
and how many classes it has. The VTAB-1k tasks follow the benchmark's protocol: each task has a
`train` and a `val` split defined on the tfds data (below); `train800` is the first 800 examples
of `train`, `val200` the first 200 of `val`, `train800val200` both (1000 examples), and `test`
the task's test split.

Nothing here downloads: tfds data must be prepared beforehand (`tfds build NAME` on a machine
with internet, or imagenet2012's manual download); `read_tfds_split` says so when it is not.
"""

import dataclasses


@dataclasses.dataclass(frozen=True)
class TfdsSource:
    """One dataset: `builder` is the tfds name (with config), `splits` maps our split names to
    tfds split strings, `label` is the label feature (or a function of the example for the
    VTAB structured tasks), `classes` the number of classes."""

    name: str
    builder: str
    splits: dict
    classes: int
    label: object = "label"
    image: str = "image"
    vtab: str = None  # "natural" | "specialized" | "structured" for VTAB-1k tasks
    pixel_scale: int = 1  # dsprites stores 0/1 pixels: x255 brings them to [0, 255]
    note: str = ""
    prepare: str = ""  # the command that prepares the data, when it is not `tfds build BUILDER`


def _vtab(name, builder, train, val, test, classes, group, label="label", note="", pixel_scale=1):
    splits = {
        "train": train,
        "val": val,
        "trainval": f"{train}+{val}",
        "test": test,
        # VTAB-1k: first 800 of train, first 200 of val (sliced in keras_vit.data.pipeline).
        "train800": (train, 800),
        "val200": (val, 200),
        "train800val200": ((train, 800), (val, 200)),
    }
    return TfdsSource(name, builder, splits, classes, label=label, vtab=group, note=note, pixel_scale=pixel_scale)


def _std(train, val, test):
    # A held-out "val" cut from the training data (the original repo's minival), "trainval" both.
    return {"train": train, "val": val, "trainval": f"{train}+{val}", "test": test}


def _clevr_count(example):
    import tensorflow as tf

    return tf.size(example["objects"]["size"]) - 3  # 3..10 objects -> 8 classes


def _clevr_distance(example):
    import tensorflow as tf

    depth = tf.reduce_min(example["objects"]["pixel_coords"][:, 2])
    thresholds = tf.constant([0.0, 8.0, 8.5, 9.0, 9.5, 10.0, 100.0])
    return tf.reduce_max(tf.where(thresholds - depth < 0))


def _binned(feature, original, classes):
    def label(example):
        import tensorflow as tf

        value = tf.cast(example[feature], tf.float32)
        return tf.cast(tf.math.floordiv(value, original / classes), tf.int64)

    label.__name__ = f"{feature}_binned_{classes}"
    return label


def _kitti_closest_vehicle(example):
    import tensorflow as tf

    objects = example["objects"]
    vehicles = tf.where(objects["type"] < 3)  # Car, Van, Truck
    depth = tf.gather(objects["location"][:, 2], vehicles[:, 0])
    depth = tf.reduce_min(tf.concat([depth, [1000.0]], 0))
    thresholds = tf.constant([-100.0, 8.0, 20.0, 999.0])
    return tf.reduce_max(tf.where(thresholds - depth < 0))


# tfds percent slices stand in for the benchmarks' 98% / 90% / 80% / 60% train-val cuts.
TFDS_DATASETS = {
    s.name: s
    for s in [
        # --- Standard transfer datasets of the paper ---
        TfdsSource("cifar10", "cifar10", _std("train[:98%]", "train[98%:]", "test"), 10),
        TfdsSource("cifar100", "cifar100", _std("train[:98%]", "train[98%:]", "test"), 100),
        TfdsSource("oxford_iiit_pet", "oxford_iiit_pet", _std("train[:90%]", "train[90%:]", "test"), 37),
        TfdsSource(
            "oxford_flowers102", "oxford_flowers102", _std("train", "validation", "test"), 102,
        ),
        TfdsSource(
            "imagenet2012", "imagenet2012", _std("train[:99%]", "train[99%:]", "validation"), 1000,
            note="needs the manual download of ILSVRC2012 into tfds' manual_dir",
            prepare="tfds build imagenet2012 --manual_dir DIR (DIR holds ILSVRC2012_img_train.tar and "
            "ILSVRC2012_img_val.tar from image-net.org)",
        ),
        # --- ImageNet evaluation sets: ReaL labels of the validation images, ImageNet-V2 ---
        TfdsSource(
            "imagenet2012_real", "imagenet2012_real", {"validation": "validation", "test": "validation"}, 1000,
            label="original_label",
            note="needs the manual download of the ILSVRC2012 validation images into tfds' manual_dir",
            prepare="tfds build imagenet2012_real --manual_dir DIR (DIR holds ILSVRC2012_img_val.tar from "
            "image-net.org)",
        ),
        TfdsSource("imagenet_v2", "imagenet_v2/matched-frequency", {"test": "test"}, 1000),
        TfdsSource("imagenet_v2/matched-frequency", "imagenet_v2/matched-frequency", {"test": "test"}, 1000),
        TfdsSource("imagenet_v2/threshold-0.7", "imagenet_v2/threshold-0.7", {"test": "test"}, 1000),
        TfdsSource("imagenet_v2/topimages", "imagenet_v2/topimages", {"test": "test"}, 1000),
        # --- VTAB-1k: natural ---
        _vtab("vtab/caltech101", "caltech101:3.*.*", "train[:90%]", "train[90%:]", "test", 102, "natural"),
        _vtab("vtab/cifar100", "cifar100", "train[:90%]", "train[90%:]", "test", 100, "natural"),
        _vtab("vtab/dtd", "dtd", "train", "validation", "test", 47, "natural"),
        _vtab("vtab/oxford_flowers102", "oxford_flowers102", "train", "validation", "test", 102, "natural"),
        _vtab("vtab/oxford_iiit_pet", "oxford_iiit_pet", "train[:80%]", "train[80%:]", "test", 37, "natural"),
        _vtab("vtab/sun397", "sun397/tfds", "train", "validation", "test", 397, "natural"),
        _vtab("vtab/svhn", "svhn_cropped", "train[:90%]", "train[90%:]", "test", 10, "natural"),
        # --- VTAB-1k: specialized ---
        _vtab("vtab/patch_camelyon", "patch_camelyon", "train", "validation", "test", 2, "specialized"),
        _vtab("vtab/eurosat", "eurosat/rgb", "train[:60%]", "train[60%:80%]", "train[80%:]", 10, "specialized"),
        _vtab("vtab/resisc45", "resisc45", "train[:60%]", "train[60%:80%]", "train[80%:]", 45, "specialized"),
        _vtab(
            "vtab/diabetic_retinopathy", "diabetic_retinopathy_detection/btgraham-300",
            "train", "validation", "test", 5, "specialized",
        ),
        # --- VTAB-1k: structured ---
        _vtab("vtab/clevr_count", "clevr:3.*.*", "train[:90%]", "train[90%:]", "validation", 8, "structured",
              label=_clevr_count),
        _vtab("vtab/clevr_distance", "clevr:3.*.*", "train[:90%]", "train[90%:]", "validation", 6, "structured",
              label=_clevr_distance),
        _vtab("vtab/dmlab", "dmlab", "train", "validation", "test", 6, "structured"),
        _vtab("vtab/dsprites_location", "dsprites", "train[:80%]", "train[80%:90%]", "train[90%:]", 16,
              "structured", label=_binned("label_x_position", 32, 16), pixel_scale=255),
        _vtab("vtab/dsprites_orientation", "dsprites", "train[:80%]", "train[80%:90%]", "train[90%:]", 16,
              "structured", label=_binned("label_orientation", 40, 16), pixel_scale=255),
        _vtab("vtab/smallnorb_azimuth", "smallnorb", "train", "test[:50%]", "test[50%:]", 18, "structured",
              label="label_azimuth"),
        _vtab("vtab/smallnorb_elevation", "smallnorb", "train", "test[:50%]", "test[50%:]", 9, "structured",
              label="label_elevation"),
        _vtab("vtab/kitti_distance", "kitti:3.*.*", "train", "validation", "test", 4, "structured",
              label=_kitti_closest_vehicle),
    ]
}

VTAB_TASKS = tuple(name for name, s in TFDS_DATASETS.items() if s.vtab)


class DatasetNotPreparedError(RuntimeError):
    """A tensorflow-datasets dataset that is not downloaded and prepared on this machine."""


def get_tfds_source(name):
    """The TfdsSource called `name` ("cifar100", "vtab/dtd", ...); any other tfds builder name is
    accepted as a plain image/label dataset with splits train/test."""
    if name in TFDS_DATASETS:
        return TFDS_DATASETS[name]
    if name.startswith("vtab/"):
        import difflib

        close = difflib.get_close_matches(name, VTAB_TASKS, n=3)
        raise ValueError(
            f"Unknown VTAB-1k task {name!r}." + (f" Did you mean {', '.join(close)}?" if close else "")
            + f" Known: {', '.join(VTAB_TASKS)}."
        )
    return TfdsSource(name, name, {"train": "train", "test": "test"}, classes=None)


def tfds_builder(source, data_dir=None):
    """The tfds builder of `source` (built from tfds' code and metadata only: nothing downloads)."""
    import tensorflow_datasets as tfds

    try:
        return tfds.builder(source.builder, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        import difflib

        name = source.builder.split("/")[0].split(":")[0]
        known = list(dict.fromkeys([*TFDS_DATASETS, *tfds.list_builders(with_community_datasets=False)]))
        close = difflib.get_close_matches(name, known, n=3)
        raise ValueError(
            f"tensorflow-datasets has no dataset {name!r}." + (f" Did you mean {', '.join(close)}?" if close else "")
            + f" Pass tfds:NAME with a tfds dataset name (e.g. {', '.join(list(TFDS_DATASETS)[:4])}); "
            "`tfds.list_builders()` lists them."
        ) from None
    except Exception as error:  # unavailable config, ...
        name, _, config = source.builder.split(":")[0].partition("/")
        configs = _builder_configs(name) if config else []
        if configs and config not in configs:
            raise ValueError(
                f"tensorflow-datasets' {name} has no config {config!r}; its configs: {', '.join(configs)}. Pass "
                f"tfds:{name}/CONFIG with one of them, e.g. tfds:{name}/{configs[0]}."
            ) from None
        first = " ".join(str(error).strip().splitlines()[:1])
        first = first.split(" Here are ", 1)[0].rstrip(". ")  # tfds' list of close names is cut off in its message
        raise ValueError(f"tensorflow-datasets has no dataset {source.builder!r}: {first}.") from None


def _builder_configs(name):
    """The config names of tfds dataset `name` (an empty list when it has none or is unknown)."""
    import tensorflow_datasets as tfds

    try:
        return [config.name for config in (tfds.builder_cls(name).BUILDER_CONFIGS or ())]
    except Exception:  # noqa: BLE001 - an unknown name: the caller's message stands
        return []


def read_tfds_split(source, builder, split):
    """`builder.as_dataset(split)` (no file shuffling: the order, hence VTAB's slices, is fixed),
    raising DatasetNotPreparedError when the data was never prepared on this machine."""
    try:
        return builder.as_dataset(split=split, shuffle_files=False)
    except AssertionError as error:
        if "could not find data" not in str(error):
            raise
        extra = f" ({source.note})" if source.note else ""
        command = source.prepare or f"tfds build {source.builder.split(':')[0]}"
        raise DatasetNotPreparedError(
            f"tfds dataset {source.builder!r} is not prepared in {builder.data_dir!r}{extra}: dataset not prepared; "
            f"run `{command}` on a machine with internet (this package never downloads at run time), then point "
            "data_dir= / --data-dir (or TFDS_DATA_DIR) at that directory."
        ) from None
