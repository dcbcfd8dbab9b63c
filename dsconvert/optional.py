"""Every optional dependency in one place: whether it loads, and what to install if not.

Nothing here is imported at ``import dsconvert`` time; each probe runs on first use and
is cached per process (:class:`dsconvert.processes.ProcessLocal`: a forked worker re-probes,
so C handles never cross a fork). Required dependencies (numpy, Pillow, h5py, fsspec) are
plain imports where they are used.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType
from typing import Any, Optional

from .errors import MissingDependencyError
from .processes import ProcessLocal

__all__ = ["require", "optional_import", "turbojpeg", "simplejpeg", "jpeg_region", "resize_kernel", "INSTALL_HINTS"]

# module name -> what the user should run to get it
INSTALL_HINTS = {
    "torch": "pip install 'dsconvert[torch]'",
    "turbojpeg": "apt-get install -y libturbojpeg0 && pip install 'PyTurboJPEG<2'",
    "simplejpeg": "pip install simplejpeg",
    "skimage.data": "pip install 'dsconvert[demo]'",
    "matplotlib": "pip install 'dsconvert[report]'",
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


_probed = ProcessLocal()


def turbojpeg() -> Optional[Any]:
    """A ready ``TurboJPEG`` instance, or None when PyTurboJPEG or libturbojpeg is absent.

    PyTurboJPEG 2.x refuses libjpeg-turbo < 3.0 and 1.x loads it; either way the probe
    must not crash, so every failure means "not available".
    """
    if "turbojpeg" not in _probed:
        instance = None
        module = optional_import("turbojpeg")
        if module is not None:
            try:
                instance = module.TurboJPEG()
            except Exception:
                instance = None
        _probed["turbojpeg"] = instance
    return _probed["turbojpeg"]


@functools.lru_cache(maxsize=None)
def simplejpeg() -> Optional[ModuleType]:
    return optional_import("simplejpeg")


@functools.lru_cache(maxsize=None)
def jpeg_region() -> Optional[ModuleType]:
    """dsconvert's C extension that decodes only a region of a JPEG through libjpeg's API
    (``dsconvert/_jpeg_region.c``), or None where it was not built (no compiler or no libjpeg
    headers at install) or libjpeg does not load. It holds no state, so it may cross a fork."""
    return optional_import("dsconvert._jpeg_region")


@functools.lru_cache(maxsize=None)
def resize_kernel() -> Optional[ModuleType]:
    """dsconvert's C kernel for torch's antialiased uint8 resize of an output window
    (``dsconvert/_resize.c``, :mod:`dsconvert.resample`), or None where it was not built (no
    compiler at install). Stateless, so it may cross a fork."""
    return optional_import("dsconvert._resize")
