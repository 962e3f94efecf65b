"""Scale-out with Keras' own engine: a `keras.distribution.LayoutMap` for every model family.

`get_layout_map(device_mesh)` returns the tensor-parallel layout of the model's variables on the
mesh's model axis; `keras.distribution.ModelParallel` applies it (JAX backend). The rules are
the family's (`ModelFamily.sharding`, in its family file, which explains them): a Vision
Transformer's (and an Axial-ViT block's) attention is split along heads and its MLP along its
hidden units (one all-reduce per sublayer, "Megatron"); EfficientNet's and AxialResNet's 1x1
expansions along their output channels and the projections after them along their input
channels; a BiT ResNet's convolutions along their output channels.

Every variable is matched by exactly one rule (replication is a rule, never a miss). Keys are
regular expressions on `Variable.path` (`encoderblock_3/MlpBlock_3/Dense_1/kernel`, ...),
optionally under any name scope, so a model built here, loaded from a checkpoint
(`keras_vit.load_checkpoint`, `keras.saving.load_model`) or from a constructor gets the same
layout: the paths are the layer names of the original checkpoints.

Jobs of several processes (the hosts of a pod slice): `join_processes`, `data_parallel`,
`process_shard` (for `keras_vit.data.load_dataset(shard=...)`), `is_first_process` (who writes
files) and `without_distribution` (process 0 saving alone); see the section below and
docs/TPU.md, section 3.
"""

import contextlib
import math
import os
import sys
import threading
import warnings
from collections.abc import Mapping

import keras

def _family_and_dims(config):
    """(family, {group: size} or None) of `config`: None is the default family's rules, split
    everywhere; a model, its get_config() dict or an architecture name add the sizes the fallback
    rule checks."""
    from keras_vit.models.family import default_family, family_of, get_architecture

    if config is None:
        return default_family(), None
    if isinstance(config, str):
        row = get_architecture(config.replace("-", "").replace("/", "").replace("+", ""))
        family, config = family_of(row), row.kwargs()
    elif isinstance(config, keras.Model):
        family, config = family_of(config), config.get_config()
    elif isinstance(config, Mapping):  # a get_config() dict or a config object
        family = family_of(config)
    else:
        raise TypeError(
            "config must be None, a keras_vit model, its get_config() dict or config object, or an architecture name such as "
            f"'ViTL16'; got {type(config).__name__}."
        )
    return family, family.sharding_rules().dims(config)


def get_layout_map(device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="batch", *, config=None):
    """The tensor-parallel `keras.distribution.LayoutMap` of a model on `device_mesh`, by its
    family's sharding rules (`ModelFamily.sharding`; without `config`, the default family's).

    For a Vision Transformer, attention is split along heads and the MLP along its hidden units
    on the mesh axis `model_parallel_dim_name` (one all-reduce per sublayer), embeddings along
    hidden, pre_logits by columns and the head by rows; norms and the hybrid ResNet stem are
    replicated. The outputs of each block's attention and MLP branches are laid out
    (batch, None, None), with batch the `data_parallel_dim_name` axis; no weight is split on that
    axis. The family file says why. The other families (pass `config`: without it the map is
    the default family's) split as docs/TPU.md's table says: Axial-ViT as a ViT, EfficientNet's
    inverted residuals and AxialResNet's blocks by their 1x1 expansions' output channels and the
    following projections' input channels, BiT's convolutions by output channels.

    A split needs the model axis size to divide the dimension it splits (JAX refuses uneven
    shards). Pass `config` to apply the fallback rule: a group whose size the axis does not
    divide (for a ViT: the attention (num_heads), the MLP (mlp_dim), the embeddings
    (hidden_size), pre_logits (representation_size), the head (its input width)) is replicated
    as a whole on the model axis, with a warning naming it. Without `config`, every group is
    split and the model axis must divide them (for a ViT: num_heads, mlp_dim and hidden_size;
    true for ViT-B on 2/4, ViT-L and ViT-H on 2/4/8/16, not for ViT-Ti's 3 heads).

    Args:
        device_mesh: a `keras.distribution.DeviceMesh`, e.g. shape (2, 4) with axis names
            ("batch", "model").
        model_parallel_dim_name: the mesh axis the weights are split on.
        data_parallel_dim_name: the mesh axis the batch is split on (None: no data axis).
        config: None, a keras_vit model, its `get_config()` dict, or an architecture name
            ("ViTL16", "ViT-L/16", "R50ViTB16", "BiTResNet50x1", "EfficientNetB7").

    Returns:
        A `keras.distribution.LayoutMap` for `keras.distribution.ModelParallel`.

    Example:
        >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
        >>> layout_map = keras_vit.get_layout_map(mesh, config="ViTL16")
        >>> keras.distribution.set_distribution(
        ...     keras.distribution.ModelParallel(layout_map=layout_map, batch_dim_name="batch"))
        >>> model = keras_vit.ViTL16(weights=None)     # built sharded
    """
    axes = tuple(device_mesh.axis_names)
    if model_parallel_dim_name not in axes:
        raise ValueError(
            f"The device mesh has axes {axes}, not the model axis {model_parallel_dim_name!r}. Name the mesh "
            f"axes e.g. ('batch', 'model') or pass model_parallel_dim_name= one of {axes}."
        )
    if data_parallel_dim_name is not None and data_parallel_dim_name not in axes:
        raise ValueError(
            f"The device mesh has axes {axes}, not the data axis {data_parallel_dim_name!r}. Pass "
            f"data_parallel_dim_name= one of {axes}, or None for a mesh without a data axis."
        )
    if data_parallel_dim_name == model_parallel_dim_name:
        raise ValueError(f"The data and model axes must differ; both are {model_parallel_dim_name!r}.")
    size = int(device_mesh.shape[axes.index(model_parallel_dim_name)])
    family, dims = _family_and_dims(config)
    sharding = family.sharding_rules()

    replicated = {}
    layout_map = keras.distribution.LayoutMap(device_mesh)
    for group, pattern, spec in sharding.rules(model_parallel_dim_name):
        if group is not None and dims is not None:
            n = dims[group]
            if n is None or n % size:
                if n is not None:
                    replicated[group] = n
                spec = (None,) * len(spec)
        layout_map[pattern] = spec
    for pattern, spec in sharding.outputs(data_parallel_dim_name):
        layout_map[pattern] = spec

    if replicated:
        detail = "; ".join(f"{sharding.groups[g]}: {g}={n}" for g, n in replicated.items())
        warnings.warn(
            f"The model axis {model_parallel_dim_name!r} has {size} devices, which does not divide {detail}. "
            "Those weights are replicated on the model axis (still split by nothing, trained data-parallel). "
            f"Choose a model axis size that divides them to shard them.",
            stacklevel=2,
        )
    return layout_map


def rule_for(layout_map, path):
    """The key of `layout_map` whose regex matches the variable path `path` in full, or None.

    Raises ValueError when several keys match (as `LayoutMap` itself does).
    """
    import re

    keys = [k for k in layout_map if re.fullmatch(k, path)]
    if len(keys) > 1:
        raise ValueError(f"Variable path {path!r} matches several layout rules: {keys}.")
    return keys[0] if keys else None


# === Several processes (hosts): data parallelism ===
#
# A job of several processes (the hosts of a TPU pod slice, the nodes of a GPU cluster, or
# processes on one machine) runs the same program in every process. keras_vit's part:
# `join_processes` connects them (keras.distribution.initialize), `data_parallel` replicates the
# weights over every device of every process, `process_shard` tells `keras_vit.data.load_dataset`
# which rows of each global batch this process reads, and `is_first_process` says who writes
# files. These are the JAX backend's (keras.distribution is implemented for JAX only).


def _jax_if_loaded():
    """The jax module when the JAX backend is in use and loaded, else None (imports nothing)."""
    import sys

    jax = sys.modules.get("jax")
    if jax is None or keras.backend.backend() != "jax":
        return None
    return jax


def _joined(jax):
    is_initialized = getattr(jax.distributed, "is_initialized", None)
    return bool(is_initialized()) if is_initialized is not None else jax.process_count() > 1


def process_count():
    """How many processes the job has: `jax.process_count()` once `join_processes` has run, else 1.

    Example:
        >>> process_count()
        1
    """
    jax = _jax_if_loaded()
    return jax.process_count() if jax is not None and _joined(jax) else 1


def process_index():
    """This process's index in the job (0 to `process_count() - 1`): 0 outside a job of several
    processes and on backends other than JAX. Asking starts no backend.

    Example:
        >>> process_index()
        0
    """
    jax = _jax_if_loaded()
    return jax.process_index() if jax is not None and _joined(jax) else 0


def is_first_process():
    """True in process 0, the one that writes run folders, checkpoints and models (every process
    holds the same replicated weights; the others write nothing).

    Example:
        >>> is_first_process()
        True
    """
    return process_index() == 0


def process_shard():
    """(process_count, process_index) for `keras_vit.data.load_dataset(shard=...)` in a job of
    several processes, None in a single process.

    Example:
        >>> process_shard() is None        # a single process
        True
    """
    count = process_count()
    return (count, process_index()) if count > 1 else None


def _require_jax(what):
    if keras.backend.backend() != "jax":
        raise ValueError(
            f"{what} runs on the JAX backend (keras.distribution is implemented for JAX only); this process runs "
            f"Keras on {keras.backend.backend()!r}. Set KERAS_BACKEND=jax (TensorFlow scales out with "
            "tf.distribute strategies instead, see docs/TPU.md)."
        )


class NoJobFoundError(ValueError):
    """`join_processes()` without arguments found no job of several processes in the environment."""


#: Seconds `join_processes` waits for the job's processes by default (JAX's own default).
JOIN_TIMEOUT = 300


def join_processes(coordinator_address=None, num_processes=None, process_id=None, *, timeout=JOIN_TIMEOUT,
                   program="keras_vit"):
    """Connect this process to the other processes of its job (`jax.distributed.initialize`, then
    Keras' common random seed, as `keras.distribution.initialize` does).

    Call it first thing, in every process, before anything runs on the devices. With no
    arguments the environment decides, as `keras.distribution.initialize()` reads it: on a
    Cloud TPU pod slice (and under SLURM or Open MPI) JAX finds the coordinator, the process
    count and this process's index by itself; elsewhere set KERAS_DISTRIBUTION_JOB_ADDRESSES
    (the coordinator's host:port), KERAS_DISTRIBUTION_NUM_PROCESSES and
    KERAS_DISTRIBUTION_PROCESS_ID, or pass them. `num_processes=1` joins nothing (a single
    process using its own devices). Joining twice is a no-op.

    JAX aborts the process (a C++ check failure) when the job has not formed in time; instead,
    when `timeout` seconds pass without every process joining, this process ends (exit status 1)
    with one line on stderr, starting with `program`, that names the coordinator and the timeout.

    Args:
        coordinator_address: "host:port" of process 0, reachable from every process.
        num_processes: the number of processes of the job.
        process_id: this process's index, 0 to num_processes - 1.
        timeout: seconds to wait for every process of the job to join.
        program: the name that starts the line of a timeout.

    Returns:
        The number of processes of the job.

    Example:
        >>> join_processes(num_processes=1)
        1
    """
    _require_jax("join_processes")
    import jax

    if num_processes == 1 or _joined(jax):
        return process_count()
    explicit = any(v is not None for v in (coordinator_address, num_processes, process_id))
    # What keras.distribution.initialize reads for an argument not given.
    if coordinator_address is None:
        coordinator_address = os.environ.get("KERAS_DISTRIBUTION_JOB_ADDRESSES")
    if num_processes is None and "KERAS_DISTRIBUTION_NUM_PROCESSES" in os.environ:
        num_processes = int(os.environ["KERAS_DISTRIBUTION_NUM_PROCESSES"])
    if process_id is None and "KERAS_DISTRIBUTION_PROCESS_ID" in os.environ:
        process_id = int(os.environ["KERAS_DISTRIBUTION_PROCESS_ID"])
    if coordinator_address and "," in coordinator_address:  # every job address given: the first coordinates
        addresses = coordinator_address.split(",")
        if num_processes is not None and num_processes != len(addresses):
            raise ValueError(f"{len(addresses)} job addresses ({coordinator_address}) for {num_processes} processes: "
                             "give one address per process, or the coordinator's alone.")
        coordinator_address = addresses[0]
    joined = threading.Event()
    where = f"the coordinator {coordinator_address}" if coordinator_address else "the environment's coordinator"
    job = f"{num_processes} processes" if num_processes else "the job's processes"

    def give_up():
        if not joined.wait(timeout):
            sys.stderr.write(
                f"{program}: error: process {process_id if process_id is not None else '?'} waited {timeout:g} s for "
                f"{job} at {where} and none joined in time: start the same command in every process of the job, "
                "with the same coordinator address, or raise the timeout.\n")
            sys.stderr.flush()
            os._exit(1)

    threading.Thread(target=give_up, name="join_processes timeout", daemon=True).start()
    try:
        # JAX's own deadline comes later: the line above ends the process first.
        jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                                   process_id=process_id, initialization_timeout=int(math.ceil(timeout)) + 30)
    except ValueError as error:
        joined.set()
        if explicit or "coordinator_address" not in str(error):
            raise
        raise NoJobFoundError(
            "No job of several processes found in the environment (a Cloud TPU pod slice, SLURM, Open MPI, or the "
            "KERAS_DISTRIBUTION_JOB_ADDRESSES / _NUM_PROCESSES / _PROCESS_ID variables). Pass the coordinator "
            "(host:port of process 0), the number of processes and this process's index, or 1 process to use this "
            "machine's devices alone."
        ) from error
    except BaseException:
        joined.set()
        raise
    joined.set()
    # What keras.distribution.initialize does after JAX's: one random seed for every process.
    from keras.src.backend.jax.distribution_lib import initialize_rng

    initialize_rng()
    return process_count()


def data_parallel():
    """`keras.distribution.DataParallel` over every device of every process, for a pipeline
    that reads each process's own share of every global batch (`auto_shard_dataset=False`).

    The weights are replicated on every device (so process 0 alone can save them: no collective
    is needed); each step splits the global batch over all devices, and the gradients are
    averaged over all of them, so a step computes what one device computes on the whole batch.
    Feed `fit` with `keras_vit.data.load_dataset(..., batch_size=GLOBAL, shard=process_shard())`:
    each process then reads and preprocesses only its rows, and Keras assembles the per-process
    batches into the global one. (A pipeline that yields the global batch in every process needs
    Keras' own sharding instead: `keras.distribution.DataParallel(devices=...)`.)

    Example:
        >>> distribution = data_parallel()
        >>> keras.distribution.set_distribution(distribution)     # doctest: +SKIP
    """
    _require_jax("data_parallel")
    return keras.distribution.DataParallel(devices=keras.distribution.list_devices(), auto_shard_dataset=False)


@contextlib.contextmanager
def without_distribution():
    """Lift the current `keras.distribution` for the duration of the block: Keras then creates
    variables on this process's default device.

    For process 0 saving replicated weights alone (`data_parallel`): every value is local, but
    Keras' saving creates a throwaway optimizer to list what to skip, and under a distribution
    of several processes placing its variables is a collective that the other processes,
    not saving, would never join.

    Example:
        >>> with without_distribution():
        ...     keras.distribution.distribution() is None
        True
    """
    current = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        yield
    finally:
        keras.distribution.set_distribution(current)


def barrier(name):
    """Wait until every process of the job has reached the barrier `name` (no-op in one process).

    Example:
        >>> barrier("run folder written")
    """
    if process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def processes_where(flag):
    """The indices of the processes in which `flag` is true (every process calls it: a
    collective in a job of several processes).

    Example:
        >>> processes_where(False)
        []
    """
    if process_count() == 1:
        return [0] if flag else []
    import numpy as np
    from jax.experimental import multihost_utils

    flags = np.asarray(multihost_utils.process_allgather(np.asarray([bool(flag)], np.int32))).reshape(-1)
    return [int(i) for i in np.flatnonzero(flags)]
