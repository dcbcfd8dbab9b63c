"""Conversion on a Dask distributed cluster, through a ``concurrent.futures`` executor.

Conversion is a map of a pure function over shard specs, so a cluster only has to run that
map: ``distributed.Client.get_executor()`` gives a ``concurrent.futures.Executor`` whose
futures complete as shards are written, and ``convert(..., executor=...)`` takes it as it
takes a local process pool. The same spec gives the same bytes on any worker, so the output
is byte-identical to a local run.

``tcp://scheduler:8786`` connects to a running cluster (its workers must reach the source and
the output: shared storage, or URLs such as ``s3://``); ``local:N`` starts a LocalCluster of
N single-threaded worker processes for the duration of the conversion.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

from .errors import OptionError
from .optional import require

__all__ = ["cluster_executor"]


@contextlib.contextmanager
def cluster_executor(address: str) -> Iterator[object]:
    """A ``concurrent.futures`` executor on the Dask cluster at ``address`` (or ``local:N``)."""
    distributed = require("distributed", "--cluster (Dask)")
    cluster = None
    m = re.fullmatch(r"local:(\d+)", address)
    if m:
        n = int(m.group(1))
        if n < 1:
            raise OptionError("--cluster local:N needs N >= 1")
        cluster = distributed.LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
        client = distributed.Client(cluster)
    elif "://" in address or re.fullmatch(r"[\w.-]+:\d+", address):
        try:
            client = distributed.Client(address, timeout="20s")
        except OSError as exc:
            raise OptionError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    else:
        raise OptionError(f"--cluster takes tcp://host:port (a running scheduler) or local:N, not {address!r}")
    try:
        yield client.get_executor()
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
