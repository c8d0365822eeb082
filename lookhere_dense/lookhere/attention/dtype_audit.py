"""Which dtype each operation produces: a recorder for reduced-precision audits.

:class:`DtypeAudit` is a ``TorchDispatchMode``: inside ``with DtypeAudit() as audit:`` every
ATen operation that runs (after autocast has cast its inputs: the mode sits below the
autocast dispatch key, so it sees the operation that really runs) is recorded with its
name, the dtype, shape and element count of each tensor it returns, and whether that
tensor is new memory or a view / an in-place result of an input. What is recorded is what
the operations *return*; scratch memory inside one kernel (PyTorch's flash kernel, our
compiled ``fused`` kernel) is not seen. ``flex_attention`` cannot run inside the mode (a
higher-order operator without a rule here; with one, PyTorch's eager CPU flex wraps itself
in ``torch.compile(fullgraph=True)``, which refuses a Python dispatch mode). Operations run on other Python threads are not
seen either (the mode is per thread): run the ``tiled`` backend with
``torch.set_num_threads(1)`` to audit it (it then runs on the calling thread).

Used by ``tests/test_autocast_dtypes.py`` to check that no attention path makes a float32
copy of the frame under ``torch.autocast('cpu', torch.bfloat16)``, and usable on any model::

    with torch.autocast('cpu', torch.bfloat16), DtypeAudit() as audit:
        model(x)
    for rec in audit.allocations(torch.float32, min_numel=q_numel):
        print(rec)

It lives in the attention package (torch only, no OpenMMLab) because it is a diagnostic
of the backends' precision, like :func:`~.chooser.explain_backend` is of their choice;
it imports no backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ['OpRecord', 'DtypeAudit']


@dataclass(frozen=True)
class OpRecord:
    """One tensor an operation returned.

    Attributes:
        op: the ATen overload, e.g. ``'aten.mm.default'``.
        dtype: the tensor's dtype.
        shape: its shape.
        numel: its number of elements.
        new: True when the tensor is new memory; False when it is a view of an input or
            the input itself, written in place (``add_``, ``copy_``, ``out=``).
    """

    op: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    numel: int
    new: bool

    def __str__(self) -> str:
        kind = 'new' if self.new else 'alias'
        return f'{self.op} -> {self.dtype} {list(self.shape)} ({self.numel} el, {kind})'


def _aliases(func: Any) -> List[bool]:
    """Per return value of ``func``: it aliases an input (a view, or in place)."""
    schema = getattr(func, '_schema', None)
    if schema is None:
        return []
    return [r.alias_info is not None for r in schema.returns]


class DtypeAudit(TorchDispatchMode):
    """Record the dtype, shape and size of every tensor the operations return inside the
    context (see the module docstring).

    Attributes:
        records: the :class:`OpRecord` list, in the order the operations ran.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: List[OpRecord] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliases = _aliases(func)
        flat = out if isinstance(out, (tuple, list)) else (out,)
        name = str(func)
        for i, item in enumerate(flat):
            alias = aliases[i] if i < len(aliases) else False
            for t in tree_flatten(item)[0]:
                if isinstance(t, Tensor):
                    self.records.append(
                        OpRecord(name, t.dtype, tuple(t.shape), t.numel(), not alias)
                    )
        return out

    def allocations(
        self, dtype: Optional[torch.dtype] = None, min_numel: int = 0
    ) -> List[OpRecord]:
        """The new tensors (views and in-place results left out) of ``dtype`` (None: any)
        with at least ``min_numel`` elements. Default: every new tensor."""
        return [
            r
            for r in self.records
            if r.new and (dtype is None or r.dtype == dtype) and r.numel >= min_numel
        ]

    def largest(self, dtype: torch.dtype) -> int:
        """The element count of the largest new tensor of ``dtype`` (0 if none)."""
        return max((r.numel for r in self.allocations(dtype)), default=0)

    def summary(self, dtype: Optional[torch.dtype] = None, min_numel: int = 0) -> str:
        """:meth:`allocations` as lines (what a failing test prints)."""
        rows = self.allocations(dtype, min_numel)
        return '\n'.join(str(r) for r in rows) if rows else '(none)'
