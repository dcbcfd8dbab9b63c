"""``mix`` and ``subsample``: a mixture's arguments checked and made into its
:class:`dsconvert.readers.mix_draws.Mixture`, and the Dataset that reads it
(:mod:`dsconvert.readers.mix_datasets`). Torch-free to import (``import dsconvert`` exports them)."""

from __future__ import annotations

import numbers
import reprlib
import sys
from fractions import Fraction
from typing import Any, Dict, List, Optional, Sequence, Union

from ..errors import OptionError
from .mix_draws import Mixture, apportion, exact

MAX_LENGTH = 1 << 62  # positions and epochs are int64 (shared with workers)

__all__ = ["mix", "subsample", "mixture_of"]


def _whole(value: Any) -> bool:
    """An int (numpy's included), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _magnitude(count: int) -> str:
    """A count for a message: exact, or its power of ten when it is beyond any dataset."""
    return f"{count:,}" if count < 10 ** 15 else f"about 10**{len(str(count)) - 1}"


def _share(value: Any) -> Optional[Fraction]:
    """A weight or an epoch count as an exact fraction; None for anything but a finite real >= 0."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return None
    try:
        share = exact(value)
    except (ValueError, OverflowError, TypeError):  # NaN, infinities
        return None
    return share if share >= 0 else None


def _identity(ds: Any) -> Optional[str]:
    manifest = getattr(ds, "manifest", None)
    ident = getattr(manifest, "identity", None) or getattr(ds, "identity", None)
    ident = ident() if callable(ident) else ident
    return ident if isinstance(ident, str) else None


def _sized(datasets: Sequence[Any]) -> List[int]:
    sizes = []
    torch_data = sys.modules.get("torch.utils.data")  # a torch Dataset is made only where torch is imported
    for k, ds in enumerate(datasets):
        iterable = torch_data is not None and isinstance(ds, torch_data.IterableDataset)
        if iterable or not (hasattr(ds, "__len__") and hasattr(ds, "__getitem__")):
            raise OptionError(f"source {k} ({type(ds).__name__}) is not map-style (len and indexing): open "
                              "dsconvert outputs with open_dataset(..., stream=False) to mix them; mix(..., "
                              "stream=True) streams the mixture itself")
        sizes.append(len(ds))
    return sizes


def mixture_of(datasets: Sequence[Any], weights: Optional[Sequence[float]] = None,
               epochs: Optional[Sequence[float]] = None, length: Optional[int] = None,
               seed: object = 0, replacement: bool = False) -> Mixture:
    """The :class:`Mixture` :func:`mix` reads (its arguments, checked)."""
    datasets = list(datasets)
    sizes = _sized(datasets)
    k = len(datasets)
    if not k:
        raise OptionError("mix() needs at least one dataset")
    if not sum(sizes):
        raise OptionError("every dataset to mix is empty")
    if weights is not None and epochs is not None:
        raise OptionError("give weights= (shares of the draws) or epochs= (epochs of each source), not both")
    shares: Dict[str, List[Fraction]] = {}
    for name, values in (("weights", weights), ("epochs", epochs)):
        if values is not None:
            values = list(values)
            if len(values) != k:
                raise OptionError(f"{name} needs one value per dataset: {len(values)} for {k} datasets")
            exact_values = [_share(v) for v in values]
            shares[name] = [v for v in exact_values if v is not None]
            if len(shares[name]) != k or not sum(shares[name]):
                raise OptionError(f"{name} must be finite numbers >= 0, not all 0: {reprlib.repr(values)}")
    if length is not None and (not _whole(length) or not 1 <= length <= MAX_LENGTH):
        raise OptionError(f"length must be a positive int up to 2**62, not {reprlib.repr(length)}")
    if epochs is not None:
        if length is not None:
            raise OptionError("epochs= fixes the mixture's length (the sum of epochs x sizes): leave length= out")
        counts = [round(e * n) for e, n in zip(shares["epochs"], sizes)]
    else:
        total = int(length) if length is not None else sum(sizes)
        counts = apportion(total, shares["weights"] if weights is not None else sizes)
    if not sum(counts):
        raise OptionError("this mixture draws no sample: raise length, weights or epochs")
    if sum(counts) > MAX_LENGTH:
        raise OptionError(f"these epochs draw {_magnitude(sum(counts))} samples an epoch, more than a mixture "
                          "can count (2**62): lower them")
    if replacement and any(c and not n for c, n in zip(counts, sizes)):
        raise OptionError("an empty source cannot be drawn from")
    identities = [_identity(ds) or str(n) for ds, n in zip(datasets, sizes)]
    return Mixture(sizes, counts, seed, replacement, identities=identities)


def mix(datasets: Sequence[Any], weights: Optional[Sequence[float]] = None, *,
        epochs: Optional[Sequence[float]] = None, length: Optional[int] = None, seed: object = 0,
        replacement: bool = False, stream: bool = False, infinite: bool = False,
        rank: Optional[int] = None, world_size: Optional[int] = None, even: Optional[str] = "pad") -> Any:
    """A weighted mixture of map-style datasets (``open_dataset`` results, or any with ``len``
    and indexing), deterministic from ``seed``.

    ``weights``: each source's share of the draws (normalised); ``epochs``: how many of its own
    epochs each source gives (``[2, 0.5]``: all of the first twice, half of the second); neither:
    every source once. ``length``: draws per epoch of the mixture (default: the sources' total;
    not with ``epochs``). A source drawn more than its size repeats its samples, each once
    before any twice; ``replacement=True`` draws each sample independently instead.

    Map-style by default (:class:`dsconvert.readers.mix_datasets.MixedDataset`): ``len``, ``ds[i]``,
    so ``DataLoader(shuffle=True)``, ``DistributedSampler`` and
    :class:`dsconvert.data.ResumableSampler` work, and a resume is exact; ``set_epoch(e)`` draws
    epoch e's samples (a subsample or a repeat takes the next part of each source's order).
    ``stream=True`` or ``infinite=True``: an IterableDataset
    (:class:`dsconvert.readers.mix_datasets.MixedStream`) dealing each epoch's draws over ranks and
    DataLoader workers (``rank``, ``world_size``, ``even`` as ``open_dataset``'s streams), with
    ``state_dict``/``load_state_dict``; ``infinite=True`` never ends, one epoch after another.
    See :mod:`dsconvert.readers.mix_draws` for the arithmetic.
    """
    mixture = mixture_of(datasets, weights, epochs, length, seed, replacement)
    from .mix_datasets import MixedDataset, MixedStream  # here: the Dataset modules import torch

    if stream or infinite:
        return MixedStream(list(datasets), mixture, infinite=infinite, rank=rank, world_size=world_size, even=even)
    for name, value, default in (("rank", rank, None), ("world_size", world_size, None), ("even", even, "pad")):
        if value != default:
            raise OptionError(f"{name}= is for mix(..., stream=True); a map-style mixture is shared out by its "
                              "sampler (DistributedSampler, ResumableSampler)")
    return MixedDataset(list(datasets), mixture)


def subsample(dataset: Any, size: Union[int, float], seed: object = 0, replacement: bool = False) -> Any:
    """A seeded subset of a map-style dataset: ``size`` samples (an int) or that fraction of it
    (a float in (0, 1]); with ``replacement``, ``size`` independent draws (an int may then
    exceed ``len(dataset)``, a float 1). A :class:`dsconvert.readers.mix_datasets.MixedDataset` of one
    source: ``set_epoch(e)`` takes the next part of the dataset's seeded order."""
    n = _sized([dataset])[0]
    if isinstance(size, numbers.Real) and not _whole(size):
        share = _share(size)
        if share is None or not 0 < share <= (share if replacement else 1):
            raise OptionError(f"a fraction to subsample is within (0, 1] (any finite size > 0 with replacement), "
                              f"not {size}")
        count = round(share * n)
    elif _whole(size) and size >= 1:
        count = int(size)
    else:
        raise OptionError(f"subsample size must be a positive int or a fraction, not {reprlib.repr(size)}")
    if count > MAX_LENGTH:
        raise OptionError(f"a subsample of {_magnitude(count)} samples is more than a mixture can count (2**62)")
    if count > n and not replacement:
        raise OptionError(f"cannot take {count} samples of {n} without replacement: pass replacement=True, or "
                          "use mix([ds], length=N) to repeat it")
    return mix([dataset], length=max(1, count), seed=seed, replacement=replacement)
