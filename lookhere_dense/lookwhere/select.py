"""How many patches, which ones, and moving tokens between the grid and the kept set.

Torch alone.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Optional

import torch
from torch import Tensor

__all__ = ['resolve_k', 'top_k_patches', 'gather_patches', 'scatter_patches']


def resolve_k(
    num_patches: int,
    k: Optional[int] = None,
    k_ratio: Optional[float] = None,
    default_k: Optional[int] = None,
    default_ratio: Optional[float] = None,
) -> int:
    """The number of kept patches for a grid of ``num_patches``.

    A per-call ``k`` or ``k_ratio`` wins over the defaults (``default_k``, else
    ``default_ratio``). ``k_ratio`` keeps ``ceil(k_ratio * N)`` patches (at least 1).

    Args:
        num_patches: ``N``, the patches of the high-resolution grid.
        k: kept patches, an int in ``[1, N]``. Default: None.
        k_ratio: kept fraction, a number in ``(0, 1]``. Default: None.
        default_k, default_ratio: the model's defaults (same rules). Default: None.

    Returns:
        ``k`` in ``[1, N]``.

    Raises:
        ValueError / TypeError: both ``k`` and ``k_ratio``, neither (and no default),
            a ``k`` that is no int or out of ``[1, N]``, a ``k_ratio`` that is no number
            or out of ``(0, 1]``; each naming the value and ``N``.
    """
    if k is not None and k_ratio is not None:
        raise ValueError(
            f'LookWhere: give k or k_ratio, not both (got k={k!r}, k_ratio={k_ratio!r})'
        )
    if k is None and k_ratio is None:
        k, k_ratio = default_k, default_ratio
        if k is None and k_ratio is None:
            raise ValueError('LookWhere: no k or k_ratio given and the model has no default')
    if k is not None:
        if isinstance(k, bool) or not isinstance(k, Integral):
            raise TypeError(f'LookWhere: k must be an int, got {k!r} ({type(k).__name__})')
        if not 1 <= int(k) <= num_patches:
            raise ValueError(
                f'LookWhere: k={int(k)} is outside [1, {num_patches}] (the high-resolution '
                f'grid has {num_patches} patches)'
            )
        return int(k)
    if isinstance(k_ratio, bool) or not isinstance(k_ratio, Real):
        raise TypeError(f'LookWhere: k_ratio must be a number, got {k_ratio!r}')
    if not (math.isfinite(k_ratio) and 0 < k_ratio <= 1):
        raise ValueError(f'LookWhere: k_ratio={k_ratio!r} is outside (0, 1]')
    return max(1, min(num_patches, math.ceil(k_ratio * num_patches - 1e-9)))


def top_k_patches(scores: Tensor, k: int) -> Tensor:
    """The ``k`` highest-scoring patches of each image, in row-major order.

    Args:
        scores: ``(B, N)`` selector scores.
        k: kept patches, ``1 <= k <= N``.

    Returns:
        ``(B, k)`` int64 patch indices, ascending (so the kept sequence keeps the grid's
        reading order; ties go to the lower index as in ``torch.topk``'s stable order).
    """
    if scores.dim() != 2:
        raise ValueError(f'scores must be (B, N), got {tuple(scores.shape)}')
    idx = torch.topk(scores.detach(), k, dim=1, sorted=False).indices
    return idx.sort(dim=1).values


def gather_patches(tokens: Tensor, keep: Tensor) -> Tensor:
    """``tokens (B, N, D)`` at ``keep (B, K)`` -> ``(B, K, D)``."""
    return tokens.gather(1, keep[..., None].expand(-1, -1, tokens.shape[-1]))


def scatter_patches(values: Tensor, keep: Tensor, num_patches: int) -> Tensor:
    """``values (B, K, D)`` written at ``keep (B, K)`` into zeros ``(B, N, D)`` (the
    inverse of :func:`gather_patches` on the kept positions)."""
    b, _, d = values.shape
    out = values.new_zeros(b, num_patches, d)
    return out.scatter(1, keep[..., None].expand(-1, -1, d), values)
