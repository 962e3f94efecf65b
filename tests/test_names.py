"""Names that reach the cache or a URL: repository ids, revisions, tags, hf:// handles.

Bad names tried (each must raise InvalidNameError naming the problem): the BAD_* lists below
(path escapes, absolute paths, backslashes, NUL and control characters, odd characters, empty
and over-long names), plus 300 hypothesis-generated strings per checker that must either be
refused or be accepted by huggingface_hub's own repo-id rule and stay inside a cache folder.
"""

import os

import pytest
from huggingface_hub.utils import HFValidationError
from huggingface_hub.utils import validate_repo_id as hf_validate_repo_id
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_vit.names import InvalidNameError, check_name, parse_hf_handle, validate_repo_id, validate_revision

pytestmark = pytest.mark.backend_independent

GOOD_REPOS = ["google/vit-base-patch16-224", "timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "gpt2", "a/b",
              "Owner_1/x.y-z"]
BAD_REPOS = ["", "..", "../x", "x/..", "../../etc/passwd", "/abs/path", "/etc", "owner/", "a/b/c", "a\\b",
             "..\\..\\x", "a/b\x00", "a\x00b", "a\nb", "a/b c", "a/b;rm", "a/b?x", "a/~", "~/x", "a/b%2e",
             "a/..b", "a/b--c", "a/-b", "a/b.", ".hidden/x", "a/" + "x" * 97, "a/b.git", "ünï/côde", "C:\\x",
             "C:/x", "a:b/c"]
GOOD_REVISIONS = [None, "main", "v1.0", "refs/pr/1", "0123456789abcdef0123456789abcdef01234567"]
BAD_REVISIONS = ["", "..", "../main", "main/..", "/main", "main/", "a//b", "a\\b", "a\x00", "a b", "a~1",
                 "a^", "a:b", "a?", "a*", "a[", "@{0}", ".hidden", "x.lock", "a\x7f"]
GOOD_TAGS = ["augreg_in21k", "ViTB16.augreg2_in21k_ft_in1k", "vit_base_patch16_384.augreg_in21k_ft_in1k", "imagenet"]
BAD_TAGS = ["", "..", "../x", "a/b", "/abs", "a\\b", "a\x00", "x" * 200, ".x", "a..b", "a b", "a:b", "a\n"]


@pytest.mark.parametrize("repo", GOOD_REPOS)
def test_good_repo_ids_pass_and_huggingface_hub_agrees(repo):
    assert validate_repo_id(repo) == repo
    hf_validate_repo_id(repo)


@pytest.mark.parametrize("repo", BAD_REPOS)
def test_bad_repo_ids_are_refused_clearly(repo):
    with pytest.raises(InvalidNameError, match="Invalid Hub repository id") as info:
        validate_repo_id(repo)
    assert "owner/name" in str(info.value) or "empty" in str(info.value) or "control" in str(info.value) \
        or "backslash" in str(info.value)


@pytest.mark.parametrize("revision", GOOD_REVISIONS)
def test_good_revisions(revision):
    assert validate_revision(revision) == revision


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_bad_revisions_are_refused(revision):
    with pytest.raises(InvalidNameError, match="Invalid Hub revision"):
        validate_revision(revision)


@pytest.mark.parametrize("tag", GOOD_TAGS)
def test_good_tags(tag):
    assert check_name(tag) == tag


@pytest.mark.parametrize("tag", BAD_TAGS)
def test_bad_tags_are_refused(tag):
    with pytest.raises(InvalidNameError, match="Invalid tag"):
        check_name(tag)


def test_hf_handles():
    assert parse_hf_handle("hf://a/b") == ("a/b", None)
    assert parse_hf_handle("hf://a/b@refs/pr/1") == ("a/b", "refs/pr/1")
    for bad in ["a/b", "hf://", "hf://a/b@", "hf://../x", "hf:///etc/passwd", "hf://a/b@../../x", "hf://a\\b",
                "hf://a/b@main\x00"]:
        with pytest.raises(InvalidNameError):
            parse_hf_handle(bad)
    with pytest.raises(InvalidNameError, match="expected a string"):
        validate_repo_id(b"a/b")


def _inside(root, name):
    path = os.path.realpath(os.path.join(root, name))
    return os.path.commonpath([path, os.path.realpath(root)]) == os.path.realpath(root)


_ALPHABET = st.sampled_from(list("aZ09_-./\\:~@ \x00\n%é") + ["..", "--", "/..", "../"])
_NAMES = st.lists(_ALPHABET, max_size=24).map("".join) | st.text(max_size=40)


@settings(max_examples=300, deadline=2000)
@given(_NAMES)
def test_any_accepted_repo_id_is_valid_on_the_hub_and_stays_in_the_cache(name):
    try:
        validate_repo_id(name)
    except InvalidNameError:
        return
    hf_validate_repo_id(name)  # raises HFValidationError if our rule were looser than the Hub's
    assert _inside("/tmp/cache", name) and _inside("/tmp/cache", name.replace("/", "--"))


@settings(max_examples=300, deadline=2000)
@given(_NAMES)
def test_any_accepted_revision_or_tag_stays_in_the_cache(name):
    for check in (validate_revision, check_name):
        try:
            check(name)
        except InvalidNameError:
            continue
        assert "\x00" not in name and "\\" not in name and ".." not in name
        assert _inside("/tmp/cache", name)


def test_hf_validation_error_is_not_what_we_raise():
    # Callers catch one type: ours (a ValueError), never huggingface_hub's.
    assert issubclass(InvalidNameError, ValueError)
    with pytest.raises(HFValidationError):
        hf_validate_repo_id("a/b/c")
