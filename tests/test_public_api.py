"""The public surface is written down: every name in ``dsconvert.__all__`` exists, and every
error and warning class the package raises (dsconvert.errors) is exported from the package."""

from __future__ import annotations

import inspect

import dsconvert
from dsconvert import errors


def test_all_names_exist():
    assert len(set(dsconvert.__all__)) == len(dsconvert.__all__)
    for name in dsconvert.__all__:
        assert hasattr(dsconvert, name), name


def test_every_public_error_is_exported():
    classes = {name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, (Exception, Warning)) and obj.__module__ == errors.__name__
               and not name.startswith("_")}
    assert classes, "dsconvert.errors defines no error classes"
    assert classes <= set(errors.__all__), classes - set(errors.__all__)
    assert classes <= set(dsconvert.__all__), classes - set(dsconvert.__all__)
