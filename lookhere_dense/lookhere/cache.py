"""A small bounded LRU cache for per-grid / per-window LookHere data.

Keys are plain tuples such as ``('grid', (H, W), device, dtype)``; values are whatever a
factory builds (a :class:`~.bias.GridBias`, a dense bias, a flex ``BlockMask``). The cache
lives on a module as a plain attribute, never as a buffer: nothing in it is part of a
``state_dict``.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator, Tuple

__all__ = ['BoundedCache']


class BoundedCache:
    """Least-recently-used cache holding at most ``maxsize`` entries.

    Args:
        maxsize: the most entries kept; the least recently used one is dropped first.
            Default: 8.
    """

    def __init__(self, maxsize: int = 8):
        if maxsize < 1:
            raise ValueError(f'maxsize must be >= 1, got {maxsize}')
        self.maxsize = maxsize
        self._data: 'OrderedDict[Hashable, Any]' = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get_or_create(self, key: Hashable, factory: Callable[[], Any]) -> Any:
        """The value for ``key``, built with ``factory()`` (and kept) on a miss."""
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        value = factory()
        self._data[key] = value
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        """Drop every entry (e.g. after the LookHere config changed)."""
        self._data.clear()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> Iterator[Hashable]:
        return iter(list(self._data.keys()))

    def __repr__(self) -> str:
        return (f'BoundedCache(maxsize={self.maxsize}, size={len(self)}, hits={self.hits}, '
                f'misses={self.misses})')
