"""How much :func:`~dsconvert.analyze.detect.detect` reads: every bound in one place (read as
``limits.NAME`` at call time, so a test may lower one)."""

MAX_ENTRIES = 100_000  # folder entries listed before the walk stops
MAX_SNIFF = 256  # files whose first bytes are read, over the whole folder
SNIFF_PER_GROUP = 8  # ... and per extension
MAX_DETAIL = 4  # files of the dominant kind read further (HDF5 datasets, tar headers, footers)
MAX_TAR_MEMBERS = 50_000  # tar headers read per shard (tarfile reads ~25,000 a second), then counted in proportion
GZ_TAR_BUDGET = 16 << 20  # compressed bytes read from one .tar.gz to count its members
TAR_INFLATE_BUDGET = 1 << 30  # ... and the bytes inflated from them (a gzip bomb inflates a thousandfold)
TAR_HEADER_BUDGET = 128 << 20  # header bytes read from one plain tar
MAX_MANIFEST = 64 << 20
MAX_FOOTER = 64 << 20  # a Parquet footer longer than this is not handed to pyarrow
MAX_ZIP_DIRECTORY = 16 << 20  # a zip central directory longer than this is not parsed
MAX_H5_DATASETS = 64
MAX_NESTED = 64  # dsconvert outputs in subfolders read by their manifests
SCAN_FILES = 20_000  # a "files" tree this small is scanned by dsconvert.source.scan for its sample count
HEAD = 16 << 10
