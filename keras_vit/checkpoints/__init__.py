"""Checkpoint readers and writers: every upstream format <-> the canonical weight tree."""


def build_with_weights(architecture, weights, kwargs):
    """Build `architecture` with `kwargs` and load `weights` (tag, path or hf:// handle) into it."""
    raise NotImplementedError(
        f"Loading weights={weights!r} is not available yet; pass weights=None for a randomly "
        "initialised model."
    )
