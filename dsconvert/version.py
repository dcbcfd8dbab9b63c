"""The installed dsconvert's version: the ground floor's, so that any layer may record it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["__version__"]

try:
    __version__ = version("dsconvert")  # pyproject.toml's, as installed: the one place it is written
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"
