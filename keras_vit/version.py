"""The package's version (pyproject.toml states the same), in a module of its own so that a
writer of files records it without importing the package's public API."""

__version__ = "0.1.0"
