"""A small bounded LRU cache for per-grid / per-window LookHere data.

Keys are plain tuples such as ``('grid', (H, W), device, dtype)``; values are whatever a
factory builds (a :class:`~.bias.GridBias`, a dense bias, a flex ``BlockMask``). The cache
lives on a module as a plain attribute, never as a buffer: nothing in it is part of a
``state_dict``.

The cache is bounded by a number of entries and, optionally, by the bytes of the tensors
its values hold (:func:`tensor_bytes`); the least recently used entries go first.

Values are built outside inference mode (also when looked up under
``torch.inference_mode()``): they are shared by inference and training calls, and autograd
refuses to save an inference tensor for backward.

Under ``torch.compile`` a lookup is not traced (``torch.compiler.disable``): its result is
an input of the compiled graph, so the cache's changing state (entries, counters, LRU
order) never becomes a guard that recompiles the model at every call. Under
``torch.jit.trace`` (and what traces with it: mmengine's FLOP counter) a value is built
outside the trace, so it is a constant of the traced graph whether the lookup hits or
misses (the check that traces a module twice then sees one graph; the values depend on
the grid and the config, never on a parameter).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from typing import Any, Callable, Dict, Hashable, Iterator, Optional

import torch

__all__ = ['BoundedCache', 'tensor_bytes']


def tensor_bytes(value: Any, _seen: Optional[set] = None) -> int:
    """Bytes of the tensor storages reachable from ``value`` (each storage counted once).

    Follows tensors, lists / tuples / dicts and the attributes (``__dict__``) of plain
    objects such as :class:`~.bias.GridBias` or a flex ``BlockMask``; views count their
    storage once.
    """
    seen = set() if _seen is None else _seen
    if isinstance(value, torch.Tensor):
        try:
            storage = value.untyped_storage()
            key = (storage.data_ptr(), value.device.type)
        except (RuntimeError, NotImplementedError):  # tensors without data: an exporter's
            return value.numel() * value.element_size()  # fake tensors, exotic ones
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v, seen) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v, seen) for v in value.values())
    attrs = getattr(value, '__dict__', None)
    if attrs is not None and not callable(value):
        return sum(tensor_bytes(v, seen) for v in attrs.values())
    return 0


@contextlib.contextmanager
def _not_jit_traced() -> Iterator[None]:
    """Suspend ``torch.jit.trace``'s recording for the block (nothing to do when no trace
    runs): what it builds enters a trace as constants."""
    state = torch._C._get_tracing_state()
    if state is None:
        yield
        return
    torch._C._set_tracing_state(None)
    try:
        yield
    finally:
        torch._C._set_tracing_state(state)


class BoundedCache:
    """Least-recently-used cache holding at most ``maxsize`` entries (and ``max_bytes``).

    Args:
        maxsize: the most entries kept; the least recently used one is dropped first.
            Default: 8.
        max_bytes: optional bound on the summed :func:`tensor_bytes` of the values. A
            value larger than this on its own is returned but not kept (so it does not
            flush everything else). Default: None (no byte bound).
    """

    def __init__(self, maxsize: int = 8, max_bytes: Optional[float] = None):
        if maxsize < 1:
            raise ValueError(f'maxsize must be >= 1, got {maxsize}')
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f'max_bytes must be >= 0, got {max_bytes}')
        self.maxsize = maxsize
        self.max_bytes = max_bytes
        self._data: 'OrderedDict[Hashable, Any]' = OrderedDict()
        self._bytes: Dict[Hashable, int] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    @property
    def nbytes(self) -> int:
        """Summed tensor bytes of the values held now."""
        return sum(self._bytes.values())

    @torch.compiler.disable
    def get_or_create(self, key: Hashable, factory: Callable[[], Any]) -> Any:
        """The value for ``key``, built with ``factory()`` (and kept) on a miss."""
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        # built outside inference mode even when looked up inside it: a tensor made under
        # torch.inference_mode() cannot be saved for backward, so a value cached during
        # inference would break the first training step on the same grid afterwards
        with torch.inference_mode(False), _not_jit_traced():
            value = factory()
        size = tensor_bytes(value)
        if self.max_bytes is not None and size > self.max_bytes:
            return value  # too large to keep without flushing the whole cache
        self._data[key] = value
        self._bytes[key] = size
        while len(self._data) > self.maxsize or (
            self.max_bytes is not None and self.nbytes > self.max_bytes
        ):
            old, _ = self._data.popitem(last=False)
            del self._bytes[old]
            self.evictions += 1
        return value

    def clear(self) -> None:
        """Drop every entry (e.g. after the LookHere config changed)."""
        self._data.clear()
        self._bytes.clear()

    def stats(self) -> Dict[str, int]:
        """``{'size', 'hits', 'misses', 'evictions', 'bytes'}``."""
        return dict(
            size=len(self),
            hits=self.hits,
            misses=self.misses,
            evictions=self.evictions,
            bytes=self.nbytes,
        )

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> Iterator[Hashable]:
        """The keys, least recently used first."""
        return iter(list(self._data.keys()))

    def __repr__(self) -> str:
        return (
            f'BoundedCache(maxsize={self.maxsize}, max_bytes={self.max_bytes}, '
            f'size={len(self)}, hits={self.hits}, misses={self.misses})'
        )
