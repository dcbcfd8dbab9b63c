"""Progress kept out of the core: a bar object that is tqdm when wanted, a no-op otherwise."""

from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["progress_bar"]


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


def progress_bar(enabled: bool, desc: str, total: Optional[int] = None, unit: str = "it") -> Any:
    """A tqdm bar on stderr, or a silent stand-in with the same methods."""
    if not enabled:
        return _Silent()
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                unit_scale=True, mininterval=0.5)
