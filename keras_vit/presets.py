"""Named weights: the preset table (tag -> upstream Hub repository) and the choice of a row.

This module is data and lookups only; `keras_vit.loading` turns a name into files and a model.
Every published checkpoint of every constructor is one row of its family's preset rows
(`ModelFamily.presets`, in the family file), gathered in `PRESETS` below: the constructor,
timm's tag, the resolution, the head size, the ImageNet-1k top-1 its source reports (timm's
results-imagenet.csv; None where none is reported, e.g. for ImageNet-21k heads), the Hub
repository, and the original Flax .npz in the `gs://vit_models/` bucket it came from.

The names `weights=` and `load_checkpoint` accept besides paths and "hf://owner/repo":
- a tag of the constructor ("augreg_in21k_ft_in1k", "orig_in21k", ...; `list_presets("ViTB16")`);
- an alias: "imagenet" (the best ImageNet-1k fine-tuned weights published for the architecture,
  at the requested resolution when published there; "imagenet21k" where no fine-tuned ones
  exist) and "imagenet21k" (the ImageNet-21k pre-trained weights: AugReg's, with their trained
  21,843-class head, where published, else the original ones, which have no head);
- a preset name "<Constructor>.<tag>" (e.g. "ViTB16.augreg2_in21k_ft_in1k"), or a timm name
  "<timm_architecture>.<tag>" (e.g. "vit_base_patch16_384.augreg_in21k_ft_in1k").
Where a tag is published at several resolutions, the repository whose resolution is closest to
the requested input size is used (224 vs 384); position embeddings are resized for any other.
"""

import collections.abc
import dataclasses
import difflib

from keras_vit.geometry import as_pair
from keras_vit.models.family import all_architectures, constructor_names, families


def _known(architecture):
    return architecture in all_architectures()


@dataclasses.dataclass(frozen=True)
class Preset:
    """One published checkpoint: `architecture` (constructor name) + `tag` at `resolution`."""

    architecture: str
    tag: str
    resolution: int
    classes: int  # 0: no classification head (features, or pre_logits only)
    top1: float  # ImageNet-1k top-1 (%) reported by the source; None when not reported
    repo: str  # Hub repository "owner/name"
    original: str = None  # the original Flax .npz this was converted from, if any
    revision: str = None  # a pinned revision (branch, tag or commit); None: main
    sha256: str = None  # sha256 of the weights file, where known
    weights_file: str = None  # the file `sha256` refers to (default: the largest weights file)
    source: str = "timm"  # "timm", "transformers", "keras" (the repository's layout)
    license: str = None  # the weights' licence (timm's pretrained_cfg `license`, e.g. "apache-2.0"); None: unknown
    mean: tuple = (0.5, 0.5, 0.5)  # the input normalisation the weights expect, per channel of [0, 1]
    std: tuple = (0.5, 0.5, 0.5)  # pixels: (pixels / 255 - mean) / std; 0.5 / 0.5 is [-1, 1]
    timm_name: str = None  # timm's "<architecture>.<tag>" name, where it is not the repository's name
    config: tuple = ()  # ((field, value), ...) the architecture changes in the repository's config

    @property
    def name(self):
        return f"{self.architecture}.{self.tag}"

    @property
    def upstream_name(self):
        """The name upstream gives these weights (timm's "<architecture>.<tag>")."""
        return self.timm_name or self.repo.split("/", 1)[-1]

    @property
    def non_commercial(self):
        """Whether the licence restricts the weights to non-commercial use."""
        return is_non_commercial(self.license)

    @property
    def normalization(self):
        """(mean, std) of [0, 1] pixels, or None for [-1, 1] (0.5 / 0.5: `preprocess_input`'s default)."""
        if all(v == 0.5 for v in (*self.mean, *self.std)):
            return None
        return tuple(self.mean), tuple(self.std)

    @property
    def dataset(self):
        return "ImageNet-21k" if self.classes != 1000 else "ImageNet-1k"


#: Licences that allow no commercial use (a model loaded from such weights says so once).
NON_COMMERCIAL_LICENSES = ("cc-by-nc-4.0", "cc-by-nc-sa-4.0", "cc-by-nc-nd-4.0", "cc-by-nc-3.0", "apple-amlr")


def is_non_commercial(license):
    """Whether the licence name `license` (a Hub licence id) restricts use to non-commercial."""
    return license is not None and (str(license).lower() in NON_COMMERCIAL_LICENSES
                                    or str(license).lower().startswith("cc-by-nc"))


def _preset(row):
    a, t, r, c, top1, repo, original, source, *extra = row
    return Preset(a, t, r, c, top1, repo, original, source=source, **(extra[0] if extra else {}))


#: The table itself: {Hub repository: Preset}, rebuilt by `_table` when the families change.
_ROWS = {}


class _PresetTable(collections.abc.Mapping):
    """A read-only view of the table that is current on every access: a family registered or
    unregistered after keras_vit was imported adds or takes away its rows."""

    def __getitem__(self, repo):
        return _table()[repo]

    def __iter__(self):
        return iter(_table())

    def __len__(self):
        return len(_table())

    def __repr__(self):
        return f"<keras_vit presets: {len(self)} rows>"


#: Every preset of every registered model family, keyed by its Hub repository, in table order
#: (read-only; extend it with `register_preset`).
PRESETS = _PresetTable()
#: The presets by upstream name (timm's "<architecture>.<tag>", else the repository name without
#: the owner).
_BY_REPO_NAME = {}
#: The rows `register_preset` added, in order, and the families whose rows PRESETS holds.
_REGISTERED = []
_GATHERED = []


def _table():
    """The table's rows, holding the rows of every registered family (one registered after this module
    was imported, `keras_vit.models.family.register_family`, too) and `register_preset`'s."""
    current = list(families())
    if current != _GATHERED:
        rows = [_preset(row) for family in current for row in family.preset_rows()]
        _ROWS.clear()
        _BY_REPO_NAME.clear()
        for preset in rows:
            _ROWS[preset.repo] = preset
            _BY_REPO_NAME[preset.upstream_name] = preset
        _GATHERED[:] = current
        for preset in _REGISTERED:
            _add(preset)
    return _ROWS


def _add(preset):
    for key, p in list(_ROWS.items()):
        if (p.architecture, p.tag, p.resolution) == (preset.architecture, preset.tag, preset.resolution):
            del _ROWS[key]
            _BY_REPO_NAME.pop(p.upstream_name, None)
    _ROWS[preset.repo] = preset
    _BY_REPO_NAME[preset.upstream_name] = preset


_table()

#: The aliases every constructor accepts besides its tags.
ALIASES = ("imagenet", "imagenet21k")
_ALIAS_TEXT = {"imagenet": "ImageNet(-1k)", "imagenet21k": "ImageNet-21k"}


def register_preset(architecture, tag, resolution, repo, *, classes, top1=None, **fields):
    """Add a row to the preset table (e.g. your own fine-tuned weights on the Hub). `fields` are
    further `Preset` fields: license, mean, std, revision, sha256, source, ...

    Example:
        >>> register_preset("ViTB16", "my_pets", 384, "me/vit-b16-pets", classes=37)  # doctest: +SKIP
        >>> model = keras_vit.ViTB16(weights="my_pets", input_shape=(384, 384, 3), classes=37)  # doctest: +SKIP
    """
    if not _known(architecture):
        raise ValueError(f"Unknown architecture {architecture!r}; known: {', '.join(constructor_names())}.")
    if tag in ALIASES:
        raise ValueError(f"{tag!r} is an alias ({', '.join(ALIASES)}); choose another tag.")
    preset = Preset(architecture, tag, int(resolution), int(classes), top1, repo, **fields)
    _table()
    _REGISTERED.append(preset)
    _add(preset)
    return preset


def list_presets(architecture=None):
    """The published weights, as `Preset` rows (architecture, tag, resolution, classes, top1, repo, ...).

    Args:
        architecture: a constructor name ("ViTB16") to list only its presets.

    Example:
        >>> [(p.tag, p.resolution) for p in list_presets("ViTL32")]
        [('orig_in21k_ft_in1k', 384), ('orig_in21k', 224), ('google_in21k_ft_in1k', 384), ('google_in21k', 224)]
    """
    if architecture is not None and not _known(architecture):
        known = constructor_names()
        close = difflib.get_close_matches(str(architecture), known, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise ValueError(f"Unknown architecture {architecture!r}.{hint} Known: {', '.join(known)}.")
    return [p for p in _table().values() if architecture is None or p.architecture == architecture]


def tags(architecture):
    """The tags (without aliases) published for `architecture`, in table order."""
    return list(dict.fromkeys(p.tag for p in list_presets(architecture)))


# === Choosing a row ===


def _side(image_size):
    return None if image_size is None else max(as_pair(image_size))


def _closest(rows, image_size):
    """The row whose resolution is nearest to `image_size` (None: prefer 224, the default input)."""
    side = _side(image_size) or 224
    return min(rows, key=lambda p: (abs(p.resolution - side), -p.resolution))


def _alias_rows(architecture, alias, image_size):
    rows = list_presets(architecture)
    in1k = [p for p in rows if p.classes == 1000 and "in1k" in p.tag]
    in21k = [p for p in rows if p.tag.endswith("in21k")]
    if alias == "imagenet" and in1k:
        side = _side(image_size) or 224
        at_size = [p for p in in1k if p.resolution == side] or in1k
        best = max(at_size, key=lambda p: (p.top1 or 0.0, p.source == "timm"))
        return [p for p in in1k if p.tag == best.tag]
    # "imagenet21k" (and "imagenet" where nothing was fine-tuned): AugReg's trained 21k head first.
    for tag in ("augreg_in21k", "orig_in21k", "google_in21k", "goog_in21k"):
        chosen = [p for p in in21k if p.tag == tag]
        if chosen:
            return chosen
    return []


def find_preset(architecture, weights, image_size=None):
    """The `Preset` row for `weights` (a tag or an alias) of `architecture` at `image_size`.

    Raises:
        ValueError for an unknown tag, naming the valid ones and the closest matches.
    """
    rows = _alias_rows(architecture, weights, image_size) if weights in ALIASES else [
        p for p in list_presets(architecture) if p.tag == weights
    ]
    if rows:
        return _closest(rows, image_size)
    valid = tags(architecture)
    if not valid:
        raise ValueError(
            f"No pretrained weights are published for {architecture}, so weights={weights!r} cannot be loaded. "
            "Pass a local checkpoint path or 'hf://owner/repo', or weights=None for a randomly initialised model."
        )
    # Only the aliases that name weights of this architecture are offered (EfficientNet has no
    # ImageNet-21k weights, so "imagenet21k" is not valid for it).
    aliases = [a for a in ALIASES if _alias_rows(architecture, a, image_size)]
    listed = ", ".join(["None", *aliases, *valid])
    see = (f"a local checkpoint path or 'hf://owner/repo'. See keras_vit.list_presets({architecture!r}).")
    if weights in ALIASES:
        raise ValueError(
            f"No {_ALIAS_TEXT[weights]} weights are published for {architecture}, so weights={weights!r} cannot be "
            f"loaded. Valid: {listed}, {see}"
        )
    close = difflib.get_close_matches(str(weights), valid + aliases, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"Unknown weights {weights!r} for {architecture}.{hint} Valid: {listed}, {see}")


def preset_by_name(name, image_size=None):
    """The `Preset` a name means: "<Constructor>.<tag or alias>" (at the row closest to
    `image_size`) or a repository name ("vit_base_patch16_384.augreg_in21k_ft_in1k",
    "vit-base-patch16-224"); None when it names no preset.

    Raises:
        ValueError for a known constructor with an unknown tag (naming the valid ones).
    """
    arch, _, tag = str(name).partition(".")
    if _known(arch):
        return find_preset(arch, tag, image_size)
    _table()
    return _BY_REPO_NAME.get(name)


def suggest(name, n=3):
    """The preset names closest to `name` (for "did you mean" hints)."""
    names = [p.name for p in _table().values()] + list(_BY_REPO_NAME)
    return difflib.get_close_matches(str(name), names, n=n, cutoff=0.6)
