"""How many patches, which ones, and moving tokens between the grid and the kept set.

Torch alone.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

__all__ = [
    'resolve_k',
    'top_k_patches',
    'lattice_patches',
    'top_k_with_coverage',
    'gather_patches',
    'scatter_patches',
]


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
        return _check_k(k, num_patches)
    if isinstance(k_ratio, bool) or not isinstance(k_ratio, Real):
        raise TypeError(f'LookWhere: k_ratio must be a number, got {k_ratio!r}')
    if not (math.isfinite(k_ratio) and 0 < k_ratio <= 1):
        raise ValueError(f'LookWhere: k_ratio={k_ratio!r} is outside (0, 1]')
    return max(1, min(num_patches, math.ceil(k_ratio * num_patches - 1e-9)))


def _check_k(k: Any, num_patches: int, who: str = '') -> int:
    """``k`` as an int in ``[1, N]``: the kept count :func:`resolve_k` takes (``who``
    empty: its messages name the high-resolution grid), or the ``k`` a selection function
    ``who`` is given (its messages name the scores; torch's ``topk`` gave duplicated or
    empty selections, or its own 'selected index k out of range', for the others)."""
    name = f'LookWhere {who}' if who else 'LookWhere'
    if isinstance(k, bool) or not isinstance(k, Integral):
        raise TypeError(f'{name}: k must be an int, got {k!r} ({type(k).__name__})')
    if not 1 <= int(k) <= num_patches:
        where = (
            f'[1, N={num_patches}] (the scores have {num_patches} patches): give 1 <= k <= '
            'N, e.g. resolve_k(N, k_ratio=...)'
            if who
            else f'[1, {num_patches}] (the high-resolution grid has {num_patches} patches)'
        )
        raise ValueError(f'{name}: k={int(k)} is outside {where}')
    return int(k)


def top_k_patches(scores: Tensor, k: int) -> Tensor:
    """The ``k`` highest-scoring patches of each image, in row-major order.

    Args:
        scores: ``(B, N)`` selector scores.
        k: kept patches, ``1 <= k <= N`` (others: ValueError / TypeError naming ``k``
            and ``N``).

    Returns:
        ``(B, k)`` int64 patch indices, ascending (so the kept sequence keeps the grid's
        reading order). Which of tied scores is kept is ``torch.topk``'s choice, not the
        lower index (``top_k_patches(torch.zeros(1, 64), 8)`` keeps 40-47 on this CPU) and
        may differ between devices.
    """
    if scores.dim() != 2:
        raise ValueError(f'scores must be (B, N), got {tuple(scores.shape)}')
    _check_k(k, scores.shape[1], 'top_k_patches')
    idx = torch.topk(scores.detach(), k, dim=1, sorted=False).indices
    return idx.sort(dim=1).values


def lattice_patches(grid_size: Tuple[int, int], k: int, device=None) -> Tensor:
    """About ``k`` patches on a regular lattice over the grid (coverage, no content).

    ``ny = round(sqrt(k * H / W))`` rows and ``nx = ceil(k / ny)`` columns, each at the
    centre of its band (``floor((i + 0.5) * H / ny)``), capped at the grid's rows and
    columns; the first ``k`` of them in row-major order when there are more.

    Returns:
        ``(min(k, ny * nx),)`` int64 patch indices, ascending.
    """
    height, width = int(grid_size[0]), int(grid_size[1])
    ny = max(1, min(height, round(math.sqrt(k * height / width))))
    nx = max(1, min(width, math.ceil(k / ny)))
    ys = ((torch.arange(ny, device=device) + 0.5) * height / ny).floor().long()
    xs = ((torch.arange(nx, device=device) + 0.5) * width / nx).floor().long()
    return (ys[:, None] * width + xs[None, :]).flatten()[:k]


def top_k_with_coverage(
    scores: Tensor, k: int, grid_size: Tuple[int, int], coverage: float
) -> Tensor:
    """Top-k with a share of the budget on a regular lattice: ``round(coverage * k)``
    patches of :func:`lattice_patches`, the rest the highest-scoring other patches.

    A nearest-kept fill paints every patch from the closest kept one, so a kept set that
    leaves large regions empty paints them from far away; the lattice bounds that
    distance (``docs/lookwhere.md``, the diagnosis).

    Args:
        scores: ``(B, N)``.
        k: kept patches, ``1 <= k <= N`` (others: ValueError / TypeError naming ``k``
            and ``N``).
        grid_size: ``(H, W)`` with ``H * W = N``.
        coverage: the lattice's share of ``k``, in ``[0, 1]``; 0 is :func:`top_k_patches`.

    Returns:
        ``(B, k)`` int64, ``k`` distinct patches per image, ascending (also where scores
        are ``-inf``: the lattice's patches are never picked twice).
    """
    if not 0 <= coverage <= 1:
        raise ValueError(f'LookWhere: coverage={coverage!r} is outside [0, 1]')
    if scores.dim() != 2 or scores.shape[1] != int(grid_size[0]) * int(grid_size[1]):
        raise ValueError(
            f'scores must be (B, {int(grid_size[0]) * int(grid_size[1])}) for grid '
            f'{tuple(grid_size)}, got {tuple(scores.shape)}'
        )
    _check_k(k, scores.shape[1], 'top_k_with_coverage')
    k_lattice = round(coverage * k)
    if not k_lattice:
        return top_k_patches(scores, k)
    lattice = lattice_patches(grid_size, k_lattice, scores.device)
    # the lattice's patches below every other score, -inf ones too (a -inf score tied
    # with the lattice's -inf, and topk could pick a lattice patch twice)
    rest = scores.detach().float().clamp(min=torch.finfo(torch.float32).min)
    rest[:, lattice] = float('-inf')
    other = torch.topk(rest, k - lattice.numel(), dim=1, sorted=False).indices
    keep = torch.cat([lattice[None].expand(scores.shape[0], -1), other], 1)
    return keep.sort(dim=1).values


def gather_patches(tokens: Tensor, keep: Tensor) -> Tensor:
    """``tokens (B, N, D)`` at ``keep (B, K)`` -> ``(B, K, D)``."""
    return tokens.gather(1, keep[..., None].expand(-1, -1, tokens.shape[-1]))


def scatter_patches(values: Tensor, keep: Tensor, num_patches: int) -> Tensor:
    """``values (B, K, D)`` written at ``keep (B, K)`` into zeros ``(B, N, D)`` (the
    inverse of :func:`gather_patches` on the kept positions)."""
    b, _, d = values.shape
    out = values.new_zeros(b, num_patches, d)
    return out.scatter(1, keep[..., None].expand(-1, -1, d), values)
