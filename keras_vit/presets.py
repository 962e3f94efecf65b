"""Named weights: preset tags -> upstream Hub repos, and `weights=` for the constructors."""


def build_with_weights(architecture, weights, kwargs):
    """Build `architecture` (a models.config.Architecture) with VisionTransformer `kwargs` and load
    `weights` (a tag, an alias, a local path or "hf://owner/repo") into it."""
    raise NotImplementedError(
        f"Loading weights={weights!r} is not available yet; pass weights=None for a randomly "
        "initialised model."
    )
