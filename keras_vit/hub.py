"""Hugging Face Hub downloads, integrity checks and the cache of converted Keras presets.

Downloads go through huggingface_hub itself (`snapshot_download`): its progress bars, its cache
(HF_HOME / HF_HUB_CACHE), its offline mode (HF_HUB_OFFLINE=1) and its endpoint (HF_ENDPOINT).
Every downloaded file is checked against the hash the Hub names it by (sha256 for LFS files, the
git blob sha1 for the others) and against the sha256 the preset table knows, if any; a bad file
is removed from the Hub cache so that the next try downloads it again.

A repository that is not already a Keras preset is converted once (read with
`keras_vit.checkpoints`, saved with `save_preset`) into

    $KERAS_VIT_CACHE/presets/<owner>--<name>/<commit>/      (default ~/.cache/keras_vit)

written in a temporary folder and renamed into place, so a failed conversion leaves nothing
behind and a second load (also offline) converts nothing.
"""

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile

logger = logging.getLogger("keras_vit")

#: Files worth downloading from a checkpoint repository (not the PyTorch pickles, Flax msgpack or
#: TensorFlow .h5 that transformers repositories also hold).
ALLOW_PATTERNS = ["*.json", "*.safetensors", "model.weights.h5", "*.npz", "*.keras", "*.md"]
#: What makes a folder a Keras preset (keras_vit.checkpoints.save_preset writes these).
_PRESET_FILES = ("config.json", "metadata.json", "model.weights.h5")
_HF_HANDLE = re.compile(r"^hf://(?P<repo>[A-Za-z0-9][\w.\-]*/[\w.\-]+)(?:@(?P<revision>[\w.\-/]+))?$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")
_COMPLETE = ".complete"


# === Errors ===


class HubError(OSError):
    """Weights could not be fetched from the Hub (the message says why and what to do)."""


class RepositoryNotFoundError(HubError, FileNotFoundError):
    """The repository (or revision) does not exist on the endpoint."""


class OfflineError(HubError, ConnectionError):
    """The Hub cannot be reached (or HF_HUB_OFFLINE=1) and the weights are not cached."""


class IntegrityError(HubError):
    """A downloaded file does not match its expected hash or size."""


# === Cache ===


def cache_dir():
    """The keras_vit cache: $KERAS_VIT_CACHE, else $XDG_CACHE_HOME/keras_vit, else ~/.cache/keras_vit."""
    root = os.environ.get("KERAS_VIT_CACHE")
    if not root:
        root = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keras_vit")
    return os.path.abspath(os.path.expanduser(root))


def parse_hf_handle(source):
    """("owner/repo", revision or None) of "hf://owner/repo[@revision]"; ValueError otherwise."""
    match = _HF_HANDLE.match(str(source))
    if not match:
        raise ValueError(
            f"{source!r} is not a Hub handle; expected 'hf://owner/repo' or 'hf://owner/repo@revision' "
            "(e.g. 'hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k')."
        )
    return match["repo"], match["revision"]


def is_keras_preset(folder):
    """Whether `folder` holds a Keras preset (config.json, metadata.json, model.weights.h5)."""
    return os.path.isdir(folder) and all(os.path.isfile(os.path.join(folder, f)) for f in _PRESET_FILES)


# === Integrity ===


def file_sha256(path, chunk=1 << 22):
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _git_blob_sha1(path, chunk=1 << 22):
    digest = hashlib.sha1(f"blob {os.path.getsize(path)}\0".encode())
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _remove_cached_file(link):
    # Drop both the snapshot entry and the blob it points to, so a retry downloads it again.
    blob = os.path.realpath(link)
    for path in {link, blob}:
        try:
            os.remove(path)
        except OSError:
            pass


def verify_snapshot(folder, repo_id, *, sha256=None, weights_file=None):
    """Check every file of a Hub-cache snapshot against the hash the Hub stores it under.

    In the huggingface_hub cache each snapshot file links to `blobs/<etag>`, and the Hub's etag is
    the sha256 of an LFS file and the git blob sha1 of any other. `sha256`, when given, must also
    match `weights_file` (default: the largest file). A mismatching file is removed from the cache.

    Raises:
        IntegrityError naming the file, both hashes and the fix.
    """
    files = []
    for root, _, names in os.walk(folder):
        files += [os.path.join(root, n) for n in names]
    for path in files:
        etag = os.path.basename(os.path.realpath(path))
        if _SHA256.match(etag):
            actual, kind = file_sha256(path), "sha256"
        elif _SHA1.match(etag):
            actual, kind = _git_blob_sha1(path), "git sha1"
        else:
            continue  # not a Hub-cache blob (a plain local folder): nothing to compare with
        if actual != etag:
            _remove_cached_file(path)
            raise IntegrityError(
                f"Corrupt download of {os.path.relpath(path, folder)!r} from {repo_id}: its {kind} is {actual}, "
                f"but the Hub lists {etag}. The file was removed from the Hugging Face cache; try again "
                "(a flaky connection or proxy usually causes this)."
            )
    if sha256:
        target = weights_file and os.path.join(folder, weights_file)
        if not target:
            candidates = [p for p in files if p.endswith((".safetensors", ".h5", ".npz", ".keras"))] or files
            target = max(candidates, key=os.path.getsize) if candidates else None
        if target is None or not os.path.exists(target):
            raise IntegrityError(f"{repo_id} has no weights file {weights_file!r} to check against sha256 {sha256}.")
        actual = file_sha256(target)
        if actual != sha256.lower():
            _remove_cached_file(target)
            raise IntegrityError(
                f"sha256 mismatch for {os.path.relpath(target, folder)!r} of {repo_id}: got {actual}, the preset "
                f"table expects {sha256}. The file was removed from the Hugging Face cache. If the upstream "
                "repository was updated on purpose, pin the old revision with 'hf://owner/repo@revision'."
            )


# === Download ===


def download(repo_id, revision=None, *, what=None):
    """Snapshot of `repo_id` at `revision` in the huggingface_hub cache -> (folder, commit).

    Only checkpoint files are fetched (ALLOW_PATTERNS). `what` names the request in errors
    (e.g. "weights='augreg_in21k' of ViTB16").

    Raises:
        RepositoryNotFoundError, OfflineError, IntegrityError (truncated transfer), HubError.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hf_errors

    what = what or f"hf://{repo_id}"
    revision = revision or "main"
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=ALLOW_PATTERNS)
    except hf_errors.RevisionNotFoundError as err:
        raise RepositoryNotFoundError(
            f"Revision {revision!r} of {repo_id} does not exist on {constants.ENDPOINT} (for {what}). "
            "Check the branch, tag or commit name."
        ) from err
    except hf_errors.RepositoryNotFoundError as err:
        raise RepositoryNotFoundError(
            f"The Hub repository {repo_id!r} does not exist on {constants.ENDPOINT} (or is private) (for {what}). "
            "Check the name, e.g. with keras_vit.list_presets(), or log in with `hf auth login` for private repos."
        ) from err
    except (hf_errors.LocalEntryNotFoundError, hf_errors.OfflineModeIsEnabled) as err:
        mode = (
            "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else f"the Hub ({constants.ENDPOINT}) cannot be reached"
        )
        raise OfflineError(
            f"Cannot load {what}: {mode} and {repo_id} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}). "
            "Download it once while online (unset HF_HUB_OFFLINE, or set HF_ENDPOINT to a reachable mirror), "
            "or pass weights=None for a randomly initialised model."
        ) from err
    except OSError as err:
        if "Consistency check failed" in str(err):
            raise IntegrityError(
                f"Truncated download from {repo_id} (for {what}): {str(err).splitlines()[0]} "
                "Nothing was kept; try again."
            ) from err
        raise HubError(f"Downloading {repo_id} failed (for {what}): {err}") from err
    commit = os.path.basename(os.path.normpath(folder))
    return folder, commit


def _read_text(path):
    with open(path) as f:
        return f.read()


def _converted_dir(repo_id, commit):
    return os.path.join(cache_dir(), "presets", repo_id.replace("/", "--"), commit)


def fetch_preset(repo_id, revision=None, *, sha256=None, weights_file=None, what=None, metadata=None):
    """A local Keras preset folder holding `repo_id` at `revision`, converted once and cached.

    Keras-preset repositories are used straight from the Hub cache; any other checkpoint
    repository (timm, transformers, original .npz) is verified, converted with
    `keras_vit.checkpoints` and cached under `cache_dir()`.
    """
    folder, commit = download(repo_id, revision, what=what)
    target = _converted_dir(repo_id, commit)
    if os.path.exists(os.path.join(target, _COMPLETE)):
        logger.info("Using the cached conversion of %s@%s at %s", repo_id, commit[:12], target)
        return target
    if is_keras_preset(folder):
        # Used in place; verified once per commit (hashing a large file on every load is slow).
        marker = os.path.join(cache_dir(), "verified", repo_id.replace("/", "--"), commit)
        if not os.path.exists(marker) or (sha256 and _read_text(marker) != sha256):
            verify_snapshot(folder, repo_id, sha256=sha256, weights_file=weights_file)
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w") as f:
                f.write(sha256 or "")
        return folder
    verify_snapshot(folder, repo_id, sha256=sha256, weights_file=weights_file)
    return convert_to_preset(
        folder,
        target,
        metadata={"hub_id": f"hf://{repo_id}", "source_repo": repo_id, "source_commit": commit, **(metadata or {})},
    )


def model_from_checkpoint(path, image_size=None):
    """The model a local checkpoint holds, as it is: its head if it has one (logits), else its
    features and `pre_logits` (include_top=False, pooled as the checkpoint's classifier)."""
    from keras_vit import checkpoints

    tree, config = checkpoints.read_checkpoint(path)
    has_head = config.get("classes") is not None
    features = "avg" if "block_units" in config else config.get("classifier", "token")  # BiT: pooled features
    return checkpoints.build_model(
        tree,
        config,
        image_size=image_size,
        include_top=has_head,
        pooling=None if has_head else features,
    )


def convert_to_preset(source, target, metadata=None):
    """Convert the checkpoint at `source` into a Keras preset folder `target`, atomically.

    Written in a temporary sibling folder and renamed into place: a failure leaves nothing at
    `target`, and a concurrent conversion of the same source simply wins the race.
    """
    from keras_vit import checkpoints

    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".converting-", dir=parent)
    try:
        logger.info("Converting %s to a Keras preset at %s", source, target)
        checkpoints.save_preset(model_from_checkpoint(source), tmp, metadata=dict(metadata or {}))
        with open(os.path.join(tmp, _COMPLETE), "w") as f:
            json.dump({"source": os.fspath(source)}, f)
        try:
            os.rename(tmp, target)
        except OSError:
            if not os.path.exists(os.path.join(target, _COMPLETE)):
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # another process converted it meanwhile
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            os.rmdir(parent)  # only when empty: the repository's folder created above
        except OSError:
            pass
        raise
    return target
