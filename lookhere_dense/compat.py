"""The few version fixes lookhere-dense needs, all in one place.

Applied once by :func:`lookhere_dense.register_all_modules` (:func:`apply`); the torch-only
checkpoint reader (:mod:`lookhere_dense.checkpoint`) relies on it for Runner checkpoints. Each fix is narrow:
it changes behaviour only for the objects it names.

1. **mmengine 0.10.7 checkpoints under torch >= 2.6.** mmengine calls ``torch.load``
   without ``weights_only``; torch now defaults to ``weights_only=True`` and refuses the
   Python objects mmengine writes into its own checkpoints (the message-hub
   ``HistoryBuffer`` and the numpy arrays/scalars/dtypes it holds), so ``load_from=``
   and ``--resume`` fail with ``UnpicklingError: Unsupported global``. Fix: add exactly
   those classes to torch's weights-only allow-list
   (``torch.serialization.add_safe_globals``), plus ``builtins.getattr``: a
   ``HistoryBuffer`` pickles its bound statistics methods as ``getattr(buffer, 'min')``.
   ``weights_only`` stays on for everything; no other class becomes loadable, and
   ``getattr`` can only reach attributes of objects built from the allowed classes.
"""

from __future__ import annotations

from typing import List

__all__ = ['apply', 'mmengine_checkpoint_safe_globals']

_applied = False


def mmengine_checkpoint_safe_globals() -> List[object]:
    """The classes mmengine 0.10.x pickles into checkpoints besides tensors."""
    import builtins

    import numpy as np
    from mmengine.logging.history_buffer import HistoryBuffer

    try:  # numpy >= 2
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core.multiarray import _reconstruct, scalar
    dtype_classes = [getattr(np.dtypes, name) for name in dir(np.dtypes) if name.endswith('DType')]
    return [
        HistoryBuffer,
        np.ndarray,
        np.dtype,
        _reconstruct,
        scalar,
        builtins.getattr,
        *dtype_classes,
    ]


def apply() -> None:
    """Apply every fix above (idempotent; nothing to allow where mmengine is not
    installed: no file then holds its classes that could be read anyway)."""
    global _applied
    if _applied:
        return
    import torch

    try:
        import mmengine  # noqa: F401
    except ImportError:
        return

    if hasattr(torch.serialization, 'add_safe_globals'):
        torch.serialization.add_safe_globals(mmengine_checkpoint_safe_globals())
    _applied = True
