"""Checkpoint readers and writers: every upstream format <-> the canonical weight tree."""
