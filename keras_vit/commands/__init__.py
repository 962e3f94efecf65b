"""Subcommands of the `keras-vit` CLI (see keras_vit/cli.py)."""
