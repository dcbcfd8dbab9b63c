"""What a path holds, from file headers alone: :func:`detect`.

``dsconvert analyze`` calls it first, so that data already converted (a dsconvert output, a
folder of decoded ``.npy`` arrays, WebDataset shards, an HDF5 file...) is named for what it
is instead of being measured as loose files.

Recognition is by content (magic bytes and headers); a file's extension is only a hint, used
to name a file whose content matches nothing (then it is reported *damaged*) and to pick which
files of a big folder to sniff. Reading is bounded: a few KiB from the head and the tail of a
sampled set of files, the tar headers of a few shards, HDF5 and Parquet metadata through their
libraries, never a whole data file. Symlinks that lead out of the tree are not followed. Every
byte may be hostile: whatever a file holds, :func:`detect` returns a :class:`Detected` and
never raises (a file h5py refuses is "damaged", not an exception). One caveat: h5py's C
library parses HDF5 metadata in this process, and a crafted file that crashes libhdf5 itself
is out of reach of any ``except``.

The package, by layer: :mod:`.limits` (every bound) and :mod:`.kinds` (the kinds named,
:class:`Detected`, text helpers) at the bottom; :mod:`.crc` and :mod:`.walk` (the bounded
listing); :mod:`.sniffers` (one function per format, in an ordered table); :mod:`.details`
(the dominant kind's files read further); :mod:`.describe` (the description text and
advice); :mod:`.classify` (:func:`detect`, putting it together).
"""

from .classify import detect
from .crc import crc32c, masked_crc32c
from .kinds import KINDS, Detected

__all__ = ["Detected", "detect", "KINDS", "crc32c", "masked_crc32c"]
