"""Every optional dependency in one place: whether it loads, and what to install if not.

Nothing here is imported at ``import dsconvert`` time; each probe runs on first use and
is cached per process (a forked worker re-probes, so C handles never cross a fork).
"""

from __future__ import annotations

import functools
import importlib
import os
from types import ModuleType
from typing import Any, Optional

from .errors import MissingDependencyError

__all__ = ["require", "optional_import", "turbojpeg", "simplejpeg", "INSTALL_HINTS"]

# module name -> what the user should run to get it
INSTALL_HINTS = {
    "torch": "pip install 'dsconvert[torch]'",
    "turbojpeg": "apt-get install -y libturbojpeg0 && pip install 'PyTurboJPEG<2'",
    "simplejpeg": "pip install simplejpeg",
    "litdata": "pip install 'dsconvert[bench]'",
    "fuse": "apt-get install -y fuse libfuse2 && pip install fusepy",
    "skimage.data": "pip install 'dsconvert[demo]'",
    "h5py": "pip install h5py",
    "matplotlib": "pip install 'dsconvert[report]'",
    "fsspec": "pip install 'dsconvert[s3]'",
    "distributed": "pip install 'dsconvert[dask]'",
}


def optional_import(name: str) -> Optional[ModuleType]:
    """The module, or None when it is not installed (or fails to import)."""
    try:
        return importlib.import_module(name)
    except Exception:  # an installed package can fail on a missing shared library
        return None


def require(name: str, purpose: str) -> ModuleType:
    """Import ``name`` or raise an error that says which command installs it."""
    module = optional_import(name)
    if module is None:
        hint = INSTALL_HINTS.get(name, f"pip install {name}")
        raise MissingDependencyError(f"{purpose} needs the '{name}' package: run `{hint}`")
    return module


_turbo_cache: dict = {}


def turbojpeg() -> Optional[Any]:
    """A ready ``TurboJPEG`` instance, or None when PyTurboJPEG or libturbojpeg is absent.

    PyTurboJPEG 2.x refuses libjpeg-turbo < 3.0 and 1.x loads it; either way the probe
    must not crash, so every failure means "not available".
    """
    pid = os.getpid()
    if pid not in _turbo_cache:
        _turbo_cache.clear()
        instance = None
        module = optional_import("turbojpeg")
        if module is not None:
            try:
                instance = module.TurboJPEG()
            except Exception:
                instance = None
        _turbo_cache[pid] = instance
    return _turbo_cache[pid]


@functools.lru_cache(maxsize=None)
def simplejpeg() -> Optional[ModuleType]:
    return optional_import("simplejpeg")
