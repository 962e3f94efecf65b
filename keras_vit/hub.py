"""Hugging Face Hub downloads and integrity checks: the bottom layer of the loading path.

Downloads go through huggingface_hub itself (`snapshot_download`): its progress bars, its cache
(HF_HOME / HF_HUB_CACHE), its offline mode (HF_HUB_OFFLINE=1) and its endpoint (HF_ENDPOINT).
Every downloaded file is checked against the hash the Hub names it by (sha256 for LFS files, the
git blob sha1 for the others) and against the sha256 the preset table knows, if any; a bad file
is removed from the Hub cache so that the next try downloads it again.

Nothing is converted or copied: the checkpoint readers read the Hub cache's files in place,
lazily, straight into the model. keras_vit keeps only small records under `cache_dir()`
($KERAS_VIT_CACHE, default ~/.cache/keras_vit): which snapshot files were verified (`verified/`)
and the lock files that serialise concurrent loads of one repository (`locks/`).

This module imports nothing else of keras_vit but keras_vit.names (the checks on names).
"""

import fnmatch
import hashlib
import json
import logging
import os
import re

from keras_vit import names
from keras_vit.storage.json_files import read_json_object

logger = logging.getLogger("keras_vit")

#: Files worth downloading from a checkpoint repository by default (not the PyTorch pickles, Flax
#: msgpack or TensorFlow .h5 that transformers repositories also hold). The loading path passes
#: the checkpoint formats' own patterns (keras_vit.checkpoints.registry.hub_file_patterns).
ALLOW_PATTERNS = ["*.json", "*.safetensors", "model.weights.h5", "*.npz", "*.keras", "*.md"]
#: Files fetched only from a repository that holds no weights file of ALLOW_PATTERNS: a PyTorch
#: zip `pytorch_model.bin` (read without unpickling code, keras_vit.storage.torch_zip) of an
#: older timm or transformers repository. Never downloaded beside safetensors.
FALLBACK_PATTERNS = ["pytorch_model.bin"]
#: Patterns of the files that describe a checkpoint (configs, shard indexes, model cards) rather
#: than hold its weights.
METADATA_PATTERNS = ["*.json", "*.md"]
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_SHA1 = re.compile(r"^[0-9a-f]{40}$")


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
    """("owner/repo", revision or None) of "hf://owner/repo[@revision]"; ValueError otherwise
    (names that could escape the cache are refused: see keras_vit.names)."""
    try:
        return names.parse_hf_handle(source)
    except names.InvalidNameError as err:
        raise names.InvalidNameError(
            f"{str(source)!r} is not a Hub handle: {err} Expected 'hf://owner/repo' or 'hf://owner/repo@revision' "
            "(e.g. 'hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k')."
        ) from None


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
            candidates = [p for p in files if p.endswith((".safetensors", ".h5", ".npz", ".keras", ".bin"))] or files
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


def download(repo_id, revision=None, *, what=None, allow_patterns=None):
    """Snapshot of `repo_id` at `revision` in the huggingface_hub cache -> (folder, commit).

    Only checkpoint files are fetched (`allow_patterns`, default ALLOW_PATTERNS). `what` names
    the request in errors (e.g. "weights='augreg_in21k' of ViTB16").

    Raises:
        RepositoryNotFoundError, OfflineError, IntegrityError (truncated transfer), HubError.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hf_errors

    what = what or f"hf://{repo_id}"
    revision = revision or "main"
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=allow_patterns or ALLOW_PATTERNS)
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


# === Verified snapshots ===


def _marker_path(repo_id, commit):
    return os.path.join(cache_dir(), "verified", repo_id.replace("/", "--"), commit + ".json")


def _stat_record(path):
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns, st.st_ino]


def _read_marker(path):
    return read_json_object(path, missing={}, malformed={})


def _write_marker(path, record):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    os.replace(tmp, path)  # atomic: a killed process leaves the old marker or none


def _snapshot_files(folder):
    files = []
    for root, _, names in os.walk(folder):
        files += [os.path.join(root, n) for n in names]
    return sorted(files)


def _unchanged_since_verified(folder, marker, sha256):
    """Whether every file of the snapshot is the one verified before (same size, modification
    time and inode as recorded when it was hashed), so hashing it again can be skipped."""
    if not marker or marker.get("sha256") != sha256:
        return False
    files = marker.get("files", {})
    current = _snapshot_files(folder)
    if sorted(files) != sorted(os.path.relpath(p, folder) for p in current):
        return False
    try:
        return all(_stat_record(p) == files[os.path.relpath(p, folder)] for p in current)
    except OSError:
        return False


def _hf_repo_folder(repo_id):
    """The folder of a model repository inside huggingface_hub's cache ("models--owner--name")."""
    return "models--" + repo_id.replace("/", "--")


def _remove_orphaned_partials(repo_id):
    """Delete the partial downloads of `repo_id` that no process is writing any more.

    huggingface_hub writes each download to a file named `<etag>.<random>.incomplete` next to the
    blob and renames it when complete; a process killed mid-download leaves that file behind and
    no later download reuses it. A partial file is orphaned when huggingface_hub's own per-blob
    lock (`.locks/<repo folder>/<etag>.lock`, held for the whole download) can be taken at once.
    """
    from filelock import FileLock, Timeout
    from huggingface_hub import constants

    repo_folder = _hf_repo_folder(repo_id)
    blobs = os.path.join(constants.HF_HUB_CACHE, repo_folder, "blobs")
    try:
        partials = [n for n in os.listdir(blobs) if n.endswith(".incomplete")]
    except OSError:
        return
    for name in partials:
        etag = name.split(".", 1)[0]
        lock = FileLock(os.path.join(constants.HF_HUB_CACHE, ".locks", repo_folder, f"{etag}.lock"))
        try:
            with lock.acquire(timeout=0):
                os.unlink(os.path.join(blobs, name))
        except (Timeout, OSError):
            continue


def _lock(repo_id):
    from filelock import FileLock

    path = os.path.join(cache_dir(), "locks", repo_id.replace("/", "--") + ".lock")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return FileLock(path)


def _holds_weights(folder, patterns):
    """Whether the snapshot `folder` holds a file matching `patterns` that is not metadata."""
    for path in _snapshot_files(folder):
        name = os.path.relpath(path, folder).replace(os.sep, "/")
        if any(fnmatch.fnmatch(name, p) for p in patterns) and not any(
            fnmatch.fnmatch(name, p) for p in METADATA_PATTERNS
        ):
            return True
    return False


def _download_weights(repo_id, revision, what, allow_patterns, fallback_patterns):
    """`download` of `allow_patterns`; then, when the snapshot holds no weights file, of
    `fallback_patterns` too -> (folder, commit, the patterns the snapshot was fetched with)."""
    folder, commit = download(repo_id, revision, what=what, allow_patterns=allow_patterns)
    if not fallback_patterns:
        return folder, commit, allow_patterns
    patterns = list(allow_patterns) + [p for p in fallback_patterns if p not in allow_patterns]
    if not _holds_weights(folder, patterns):
        folder, commit = download(repo_id, revision, what=what, allow_patterns=patterns)
    return folder, commit, patterns


def fetch(repo_id, revision=None, *, sha256=None, weights_file=None, what=None, allow_patterns=None,
          fallback_patterns=None):
    """A verified local snapshot of `repo_id` at `revision`: (folder, commit).

    Only the files of `allow_patterns` are fetched (default ALLOW_PATTERNS), and those of
    `fallback_patterns` (default with the default ALLOW_PATTERNS: FALLBACK_PATTERNS) only when
    the repository holds no weights file of `allow_patterns`: a repository with only
    `pytorch_model.bin` gets it downloaded, one with `model.safetensors` beside it does not.

    Downloads through huggingface_hub (its cache, progress bars, offline mode). Every file is
    checked against the hash the Hub stores it under (and `sha256`, when given, against
    `weights_file`) the first time; the sizes, modification times and inodes seen then are
    recorded under `cache_dir()/verified/`, and a later load re-hashes only files whose record
    changed (KERAS_VIT_VERIFY=always re-hashes every file on every load). A file that no longer
    matches (a bit flip, a truncation) is removed from the cache and downloaded again; offline,
    the error names the file and the fix.

    Concurrent loads of one repository (threads or processes) take turns on a file lock, so the
    files are downloaded and hashed once.

    Raises:
        RepositoryNotFoundError, OfflineError, IntegrityError, HubError.
    """
    names.validate_repo_id(repo_id)
    names.validate_revision(revision)
    if allow_patterns is None:
        allow_patterns = ALLOW_PATTERNS
        fallback_patterns = FALLBACK_PATTERNS if fallback_patterns is None else fallback_patterns
    with _lock(repo_id):
        folder, commit, patterns = _download_weights(repo_id, revision, what, allow_patterns, fallback_patterns)
        _remove_orphaned_partials(repo_id)
        marker_path = _marker_path(repo_id, commit)
        always = os.environ.get("KERAS_VIT_VERIFY", "").lower() == "always"
        if not always and _unchanged_since_verified(folder, _read_marker(marker_path), sha256):
            return folder, commit
        try:
            verify_snapshot(folder, repo_id, sha256=sha256, weights_file=weights_file)
        except IntegrityError as err:
            from huggingface_hub import constants

            if constants.HF_HUB_OFFLINE:
                raise IntegrityError(
                    f"{err} Offline (HF_HUB_OFFLINE=1), it cannot be downloaded again: go online once, or "
                    f"delete {os.path.join(constants.HF_HUB_CACHE, _hf_repo_folder(repo_id))} and download it anew."
                ) from None
            logger.warning("%s Downloading it again.", err)
            folder, commit = download(repo_id, revision, what=what, allow_patterns=patterns)
            verify_snapshot(folder, repo_id, sha256=sha256, weights_file=weights_file)
        record = {os.path.relpath(p, folder): _stat_record(p) for p in _snapshot_files(folder)}
        _write_marker(_marker_path(repo_id, commit), {"sha256": sha256, "files": record})
        return folder, commit
