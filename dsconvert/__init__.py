"""dsconvert: find and remove the data-loading bottleneck in deep-learning training.

Public API::

    from dsconvert import DataLoadingMonitor, convert, open_dataset
    convert("/data/train", "/ssd/train-wds", format="wds")
    ds = open_dataset("/ssd/train-wds", transform=my_transform)
    for batch in DataLoadingMonitor().wrap(DataLoader(ds, num_workers=8)): ...
"""

from __future__ import annotations

from .convert import ConvertResult, convert  # noqa: E402
from .errors import (  # noqa: E402
    BadInputError,
    DsconvertError,
    FusedFallbackWarning,
    InsufficientSpaceError,
    ManifestError,
    MissingDependencyError,
    MissingExtensionWarning,
    NotRegularFileError,
    OfflineCacheWarning,
    OptionError,
    OutputExistsError,
    OutputLockedError,
    SourceError,
    UpgradeWarning,
)
from .manifest import Manifest  # noqa: E402
from .monitor import DataLoadingMonitor  # noqa: E402
from .readers.mix import mix, subsample  # noqa: E402
from .readers.open import open_dataset, open_source  # noqa: E402
from .source import scan  # noqa: E402
from .version import __version__
from .writer import Writer, optimize  # noqa: E402

__all__ = [
    "__version__",
    "convert",
    "ConvertResult",
    "open_dataset",
    "open_source",
    "mix",
    "subsample",
    "scan",
    "Writer",
    "optimize",
    "DataLoadingMonitor",
    "Manifest",
    "DsconvertError",
    "FusedFallbackWarning",
    "InsufficientSpaceError",
    "SourceError",
    "ManifestError",
    "OptionError",
    "OutputExistsError",
    "OutputLockedError",
    "BadInputError",
    "MissingDependencyError",
    "MissingExtensionWarning",
    "NotRegularFileError",
    "OfflineCacheWarning",
    "UpgradeWarning",
]
