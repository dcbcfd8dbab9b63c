"""The one C extension: region decoding through libjpeg's own API (dsconvert/_jpeg_region.c).

Optional: it needs a C compiler and libjpeg's headers (Debian: ``apt-get install -y gcc
libjpeg62-turbo-dev``). Where it does not build, the install still succeeds and
``decode="fused"`` decodes with PyTurboJPEG or Pillow, as before. Everything else about the
package is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("dsconvert._jpeg_region", ["dsconvert/_jpeg_region.c"], libraries=["jpeg"], optional=True),
    Extension("dsconvert._resize", ["dsconvert/_resize.c"], optional=True),
])
