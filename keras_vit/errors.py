"""The package's error types that several layers share (kept at the bottom of the import graph,
so that models/ can raise what checkpoints/ documents without importing it)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be read: unknown format, truncated or corrupt file, unexpected
    or missing weights, or an architecture outside the ViT family."""
