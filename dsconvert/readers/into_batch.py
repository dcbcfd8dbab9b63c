"""A batch decoded straight into one tensor, that torch's ``default_collate`` hands on as it is.

torch's DataLoader calls a Dataset's ``__getitems__`` once per batch, then its ``collate_fn``
on the list of samples; ``default_collate`` stacks the images into a new tensor (in shared
memory inside a worker), a copy of every sample's pixels. Where every image of a batch has one
known shape (``decode="fused"`` with a crop, ending in ``PILToTensor``), the Dataset allocates
that tensor itself, in shared memory inside a worker as ``default_collate`` would, decodes each
image into its row, and returns a :class:`RowsOfBatch`: a list of ``(image, label)`` tuples
whose images are views of the rows. ``default_collate`` recognises them (their type is
registered in torch's ``default_collate_fn_map``, the extension point ``collate`` looks up
first) and returns ``[images, labels]`` without a copy; the labels are collated by torch as
before. The user's own ``collate_fn`` gets ordinary ``(tensor, label)`` tuples; a list that is
not the one returned, whole and in order, is collated as plain tuples (a copy, as before).
"""

from __future__ import annotations

import ctypes
import functools
import math
import mmap
import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils.data import get_worker_info
from torch.utils.data._utils.collate import collate, default_collate_fn_map

from .batch_pages import batch_pages

__all__ = ["BatchRow", "RowsOfBatch", "new_batch"]


class BatchRow(tuple):
    """One sample, ``(image, label)``, whose image is a row of its batch's tensor."""


class RowsOfBatch(List[Any]):
    """The samples of one batch, each a :class:`BatchRow` of ``images``."""

    def __init__(self, images: torch.Tensor, labels: Sequence[Any]):
        rows = [BatchRow((image, label)) for image, label in zip(images, labels)]
        super().__init__(rows)
        self.images = images
        self.labels = list(labels)
        self._rows = tuple(rows)

    def intact(self) -> bool:
        """Whether this is the list as returned: the same rows, all of them, in order."""
        return len(self) == len(self._rows) and all(a is b for a, b in zip(self, self._rows))


def new_batch(n: int, shape: Tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor of ``n`` images of ``shape``: in shared memory inside a
    DataLoader worker (as ``default_collate`` allocates its output there), so the batch reaches
    the trainer without a copy; there, a segment no process holds any more is written again
    (:mod:`dsconvert.readers.batch_pages`: no new pages to allocate and zero, none to free).
    Its pages are made present at once (:func:`_populate`)."""
    if get_worker_info() is not None:
        size = n * math.prod(shape)
        reused = batch_pages().tensor(size)
        if reused is not None:
            _populate(reused.data_ptr(), size)
            return reused.view(n, *shape)
        empty = torch.empty(0, dtype=torch.uint8)
        storage = empty._typed_storage()._new_shared(size, device=empty.device)
        batch = empty.new(storage).resize_(n, *shape)
        _populate(batch.data_ptr(), size)
        return batch
    return torch.empty((n, *shape), dtype=torch.uint8)


MADV_POPULATE_WRITE = 23  # Linux 5.14+


@functools.lru_cache(maxsize=1)
def _madvise() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _populate(address: int, size: int) -> bool:
    """Fault in a new shared mapping's pages in one call (``MADV_POPULATE_WRITE``) rather than
    one trap per 4 kB page as the decoder first writes each: a fresh batch of 64 images of 224 x
    224 is 2,352 pages, and a trap each cost ~80 us of CPU a sample against ~60 populated at
    once. A kernel without it (EINVAL) faults them in as before. Returns whether it did."""
    madvise = _madvise()
    return madvise is not None and address % mmap.PAGESIZE == 0 and madvise(address, size, MADV_POPULATE_WRITE) == 0


def _collate_rows(batch: List[Any], *, collate_fn_map: Optional[Dict[Any, Callable]] = None) -> Any:
    """``default_collate`` of a :class:`RowsOfBatch`: its tensor, and the labels as torch
    collates them; any other list of rows as plain tuples."""
    if isinstance(batch, RowsOfBatch) and batch.intact():
        return [batch.images, collate(batch.labels, collate_fn_map=collate_fn_map)]
    return collate([tuple(row) for row in batch], collate_fn_map=collate_fn_map)


default_collate_fn_map[BatchRow] = _collate_rows
