"""The C extensions: region decoding through libjpeg's own API (dsconvert/_jpeg_region.c) and
torch's antialiased uint8 resize of an output window (dsconvert/_resize.c).

Both optional: they need a C compiler (and, for the first, libjpeg's headers: Debian
``apt-get install -y gcc libjpeg62-turbo-dev``). Where one does not build, the install still
succeeds and ``decode="fused"`` decodes with PyTurboJPEG or Pillow, or resizes with torch: the
same samples, slower. pip hides a failed optional build, so the first use of the fused path
says it instead, in one line with the packages that build them
(:func:`dsconvert.optional.warn_missing_extensions`), and ``dsconvert analyze``/``bench`` note it.
Everything else about the package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("dsconvert._jpeg_region", ["dsconvert/_jpeg_region.c"], libraries=["jpeg"], optional=True),
    Extension("dsconvert._resize", ["dsconvert/_resize.c"], optional=True),
])
