"""Every optional dependency in one place: whether it loads, and what to install if not.

Nothing here is imported at ``import dsconvert`` time; each probe runs on first use and
is cached per process (:class:`dsconvert.processes.ProcessLocal`: a forked worker re-probes,
so C handles never cross a fork). Required dependencies (numpy, Pillow, h5py, fsspec) are
plain imports where they are used.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import MissingDependencyError, MissingExtensionWarning
from .processes import ProcessLocal

__all__ = ["require", "optional_import", "turbojpeg", "simplejpeg", "jpeg_region", "resize_kernel", "INSTALL_HINTS",
           "EXTENSIONS", "BUILD_PACKAGES", "REBUILD", "missing_extensions", "extension_notice",
           "warn_missing_extensions"]

# module name -> what the user should run to get it
INSTALL_HINTS = {
    "torch": "pip install 'dsconvert[torch]'",
    "turbojpeg": "apt-get install -y libturbojpeg0 && pip install 'PyTurboJPEG<2'",
    "simplejpeg": "pip install simplejpeg",
    "skimage.data": "pip install 'dsconvert[demo]'",
    "matplotlib": "pip install 'dsconvert[report]'",
    "distributed": "pip install 'dsconvert[dask]'",
    "zstandard": "pip install 'dsconvert[zstd]'",
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


@functools.cache
def simplejpeg() -> Optional[ModuleType]:
    return optional_import("simplejpeg")


@functools.cache
def jpeg_region() -> Optional[ModuleType]:
    """dsconvert's C extension that decodes only a region of a JPEG through libjpeg's API
    (``dsconvert/_jpeg_region.c``), or None where it was not built (no compiler or no libjpeg
    headers at install) or libjpeg does not load. It holds no state, so it may cross a fork."""
    return optional_import("dsconvert._jpeg_region")


@functools.cache
def resize_kernel() -> Optional[ModuleType]:
    """dsconvert's C kernel for torch's antialiased uint8 resize of an output window
    (``dsconvert/_resize.c``, :mod:`dsconvert.resample`), or None where it was not built (no
    compiler at install). Stateless, so it may cross a fork."""
    return optional_import("dsconvert._resize")


# dsconvert's optional C extensions (setup.py): module -> (what it is, what decode="fused" does without it)
EXTENSIONS: Dict[str, Tuple[str, str]] = {
    "dsconvert._jpeg_region": ("region decoder", "decodes every row and column of a JPEG, not only the crop's"),
    "dsconvert._resize": ("resize kernel", "resizes with torch, not only the crop's pixels"),
}
# what builds them: a C compiler, Python's headers and (for the region decoder) libjpeg's, on
# Debian and Ubuntu; then a build from source
BUILD_PACKAGES = "apt-get install -y gcc libjpeg-dev python3-dev"
REBUILD = "pip install --force-reinstall --no-deps --no-binary dsconvert dsconvert (in a checkout: pip install -e .)"


def missing_extensions() -> List[str]:
    """The C extensions of :data:`EXTENSIONS` that do not load in this process."""
    probes = {"dsconvert._jpeg_region": jpeg_region, "dsconvert._resize": resize_kernel}
    return [name for name in EXTENSIONS if probes[name]() is None]


def extension_notice(missing: Sequence[str]) -> str:
    """One line: which C extensions are missing, what decode="fused" does without them, and the
    packages that build them."""
    parts = [f"{name} ({EXTENSIONS[name][0]}: decode=\"fused\" {EXTENSIONS[name][1]})" for name in missing]
    return (f"dsconvert's C extension{'s' if len(parts) > 1 else ''} {' and '.join(parts)} "
            f"{'are' if len(parts) > 1 else 'is'} not built here: the same samples, slower. "
            f"To build: {BUILD_PACKAGES}, then {REBUILD}")


_warned: Dict[str, bool] = {}  # a plain dict: a forked worker inherits "said" and stays quiet


def warn_missing_extensions() -> Optional[str]:
    """Warn once per process (:class:`dsconvert.errors.MissingExtensionWarning`, one line) when a
    C extension that decode="fused" uses did not build; return the line, or None when both load
    or it was said already. Called on the first use of the fused path."""
    if "said" in _warned:
        return None
    _warned["said"] = True
    missing = missing_extensions()
    if not missing:
        return None
    line = extension_notice(missing)
    # warn_explicit with no source to quote: the warning is this one line, not a line of code after it
    warnings.warn_explicit(line, MissingExtensionWarning, "dsconvert", 0, module="dsconvert")
    return line
