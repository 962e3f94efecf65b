"""Checks for the names a user hands to the Hub side: repository ids, revisions, tags and
preset names, and the "hf://owner/repo[@revision]" handles that carry them.

Each name ends up in a path of the cache or a URL, so a name is refused, before anything is
fetched or written, unless it is plainly a name: ASCII letters, digits, "_", "-" and ".", no "..",
no path separators other than the one "/" of "owner/repo", no NUL or other control characters.
The rules follow the Hugging Face Hub's own (repository ids of at most 96 characters per part,
no "--" or ".." inside, not starting or ending with "-" or ".") and git's for revisions.

Example:
    >>> parse_hf_handle("hf://timm/vit_base_patch16_224.augreg2_in21k_ft_in1k@main")
    ('timm/vit_base_patch16_224.augreg2_in21k_ft_in1k', 'main')
    >>> validate_repo_id("../../etc")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    ...
    InvalidNameError: Invalid Hub repository id '../../etc': ...
"""

import re

HF_PREFIX = "hf://"

_PART = re.compile(r"[A-Za-z0-9_.\-]{1,96}")
_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}")
# git check-ref-format, plus a length bound; "/" separates the parts of a branch such as "refs/pr/1".
_REVISION_PART = re.compile(r"[A-Za-z0-9_.\-+]{1,128}")


class InvalidNameError(ValueError):
    """A repository id, revision, tag or preset name that cannot be used safely."""


def _fail(what, name, why):
    shown = repr(name) if len(repr(name)) <= 120 else repr(name)[:117] + "..."
    return InvalidNameError(f"Invalid {what} {shown}: {why}.")


def _require_text(name, what):
    if not isinstance(name, str):
        raise InvalidNameError(f"Invalid {what}: expected a string, got {type(name).__name__}.")
    if not name:
        raise _fail(what, name, "it is empty")
    bad = sorted({c for c in name if ord(c) < 32 or ord(c) == 127})
    if bad:
        raise _fail(what, name, "it contains control characters (" + ", ".join(f"U+{ord(c):04X}" for c in bad) + ")")
    if "\\" in name:
        raise _fail(what, name, "it contains a backslash; names use '/' only between owner and repository")


def validate_repo_id(repo_id):
    """`repo_id` ("owner/name" or "name") if it is a valid Hub repository id, else InvalidNameError.

    Example:
        >>> validate_repo_id("google/vit-base-patch16-224")
        'google/vit-base-patch16-224'
    """
    what = "Hub repository id"
    _require_text(repo_id, what)
    hint = "use 'owner/name' with letters, digits, '_', '-' and '.' (e.g. 'timm/vit_base_patch16_224.augreg_in21k')"
    if repo_id.startswith("/") or repo_id.endswith("/"):
        raise _fail(what, repo_id, f"it starts or ends with '/' (an absolute path is not a repository); {hint}")
    parts = repo_id.split("/")
    if len(parts) > 2:
        raise _fail(what, repo_id, f"it has {len(parts) - 1} '/' but an id has at most one; {hint}")
    for part in parts:
        if part in (".", ".."):
            raise _fail(what, repo_id, f"{part!r} is a path step, not a name; {hint}")
        if not _PART.fullmatch(part):
            raise _fail(what, repo_id, f"{part!r} holds characters other than letters, digits, '_', '-', '.' "
                        f"or more than 96 of them; {hint}")
        if ".." in part or "--" in part:
            raise _fail(what, repo_id, f"{part!r} contains '..' or '--'; {hint}")
        if part[0] in "-." or part[-1] in "-.":
            raise _fail(what, repo_id, f"{part!r} starts or ends with '-' or '.'; {hint}")
    if repo_id.endswith(".git"):
        raise _fail(what, repo_id, f"it ends with '.git'; {hint}")
    return repo_id


def validate_revision(revision):
    """`revision` (a branch, tag or commit; None for the default branch) if it is safe, else
    InvalidNameError.

    Example:
        >>> validate_revision("refs/pr/1")
        'refs/pr/1'
    """
    if revision is None:
        return None
    what = "Hub revision"
    _require_text(revision, what)
    hint = "pass a branch, tag or commit hash such as 'main' or 'refs/pr/1'"
    if revision.startswith("/") or revision.endswith("/"):
        raise _fail(what, revision, f"it starts or ends with '/'; {hint}")
    for part in revision.split("/"):
        if part in ("", ".", "..") or ".." in part or part.startswith(".") or part.endswith((".", ".lock")):
            raise _fail(what, revision, f"{part!r} is not a valid part of a git reference; {hint}")
        if not _REVISION_PART.fullmatch(part):
            raise _fail(what, revision, f"{part!r} holds characters outside letters, digits, '_', '-', '+', '.'; "
                        f"{hint}")
    return revision


def check_name(name, what="tag"):
    """`name` if it is a plain tag or preset name ("augreg_in21k", "ViTB16.augreg2_in21k_ft_in1k",
    "vit_base_patch16_384.augreg_in21k_ft_in1k"), else InvalidNameError.

    Example:
        >>> check_name("augreg_in21k")
        'augreg_in21k'
    """
    _require_text(name, what)
    if ".." in name or "/" in name or not _TAG.fullmatch(name):
        raise _fail(what, name, "a tag or preset name is letters, digits, '_', '-' and single '.' (no '/', "
                    "'..' or other characters), at most 128 long; see keras_vit.list_presets()")
    return name


def parse_hf_handle(handle):
    """(repo_id, revision) of "hf://owner/repo[@revision]", both checked (revision None when absent).

    Example:
        >>> parse_hf_handle("hf://google/vit-base-patch16-224")
        ('google/vit-base-patch16-224', None)
    """
    _require_text(handle, "hf:// handle")
    if not handle.startswith(HF_PREFIX):
        raise _fail("hf:// handle", handle, "it does not start with 'hf://'; write 'hf://owner/repo[@revision]'")
    body = handle[len(HF_PREFIX):]
    repo_id, at, revision = body.partition("@")
    if at and not revision:
        raise _fail("hf:// handle", handle, "it ends with '@' but names no revision; write 'hf://owner/repo@main'")
    return validate_repo_id(repo_id), validate_revision(revision if at else None)
