"""From the kept patches' features to a dense NCHW map of every patch.

* :func:`idw_fill` -- every patch takes the inverse-distance-weighted mean of its ``K = 5``
  nearest kept patches (weights ``1 / (d + 1e-8)``, Euclidean distance on the patch grid):
  the official LookWhere's dense output (``upsample_grid_nn`` of ``antofuller/lookwhere``,
  its ``K`` and ``distance_power`` defaults); a kept patch keeps its own features up to
  that ``1e-8``;
* :func:`nearest_fill` -- every patch takes the features of the nearest kept patch
  (Euclidean distance, ties to the lower kept index): ``K = 1`` of the same, exact;
* :class:`PropagateFill` -- region growing: unkept patches take the mean of their already
  filled 3x3 neighbours, ring by ring outwards from the kept ones, then a learned depthwise
  3x3 + pointwise correction (initialised to zero, so it starts as the plain propagation)
  on the unkept patches only.

``nearest`` and ``propagate`` return the kept patches' own features unchanged. Torch alone.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .select import scatter_patches

__all__ = [
    'idw_fill',
    'nearest_fill',
    'nearest_kept',
    'PropagateFill',
    'FILL_MODES',
    'build_fill',
    'IDW_NEIGHBOURS',
]

#: the dense-output modes (``'idw'``: the official LookWhere's)
FILL_MODES = ('nearest', 'idw', 'propagate')
#: kept patches :func:`idw_fill` averages (the official ``upsample_grid_nn``'s ``K``)
IDW_NEIGHBOURS = 5
#: added to the distances before they are inverted (the official ``epsilon``)
_IDW_EPSILON = 1e-8


def _coords(index: Tensor, width: int) -> Tensor:
    return torch.stack([index.div(width, rounding_mode='floor'), index.remainder(width)], -1)


def _check_some_kept(keep: Tensor, who: str) -> None:
    """Refuse a ``keep`` ``(B, 0)``: no kept patch to fill from (``argmin`` over an empty
    axis was torch's IndexError)."""
    if keep.dim() != 2 or keep.shape[1] == 0:
        raise ValueError(
            f'LookWhere {who}: keep must be (B, K) with K >= 1 kept patches, got '
            f'{tuple(keep.shape)}: every patch is filled from the kept ones, give at '
            'least one per image'
        )


def nearest_kept(keep: Tensor, grid_size: Tuple[int, int], chunk: int = 4096) -> Tensor:
    """For every patch of the grid, the position (in ``keep``'s order) of the nearest
    kept patch.

    Args:
        keep: ``(B, K)`` kept patch indices.
        grid_size: ``(H, W)``.
        chunk: grid patches per distance block (bounds memory to ``B * chunk * K``).

    Returns:
        ``(B, H*W)`` int64 in ``[0, K)``.

    Raises:
        ValueError: ``keep`` is no ``(B, K)`` with ``K >= 1``.
    """
    _check_some_kept(keep, 'nearest fill')
    height, width = grid_size
    n = height * width
    kept = _coords(keep, width).float()  # (B, K, 2)
    out = []
    for start in range(0, n, chunk):
        pos = _coords(torch.arange(start, min(n, start + chunk), device=keep.device), width)
        dist = torch.cdist(pos.float()[None].expand(keep.shape[0], -1, -1), kept)
        out.append(dist.argmin(-1))
    return torch.cat(out, 1)


def nearest_fill(values: Tensor, keep: Tensor, grid_size: Tuple[int, int]) -> Tensor:
    """Every patch gets the features of its nearest kept patch.

    Args:
        values: ``(B, K, D)`` features of the kept patches.
        keep: ``(B, K)`` their indices on the grid.
        grid_size: ``(H, W)``.

    Returns:
        ``(B, D, H, W)``.
    """
    height, width = grid_size
    src = nearest_kept(keep, grid_size)  # (B, N)
    dense = values.gather(1, src[..., None].expand(-1, -1, values.shape[-1]))
    return dense.transpose(1, 2).reshape(values.shape[0], values.shape[-1], height, width)


def idw_fill(
    values: Tensor,
    keep: Tensor,
    grid_size: Tuple[int, int],
    neighbours: int = IDW_NEIGHBOURS,
    power: float = 1.0,
    max_pairs: int = 1 << 22,
) -> Tensor:
    """Every patch gets the inverse-distance-weighted mean of its ``neighbours`` nearest
    kept patches: weights ``1 / (d**power + 1e-8)`` normalised to sum to 1 (the official
    LookWhere's ``upsample_grid_nn`` with its defaults ``K=5``, ``distance_power=1``;
    ties in distance go to the earlier kept patch, where the official's unstable
    ``argsort`` over its score-ordered ``keep`` may take either: on an integer grid ties
    at the fifth neighbour are common, and with the same kept patches 22 of 242 patches
    at 154 px differed from the official's output). A kept patch (distance 0, weight 1e8)
    keeps its own features up to a relative 1e-8 of its neighbours'.

    Args:
        values: ``(B, K, D)`` features of the kept patches.
        keep: ``(B, K)`` their indices on the grid.
        grid_size: ``(H, W)``.
        neighbours: kept patches per mean (fewer when fewer are kept). Default: 5.
        power: the distance's exponent. Default: 1.
        max_pairs: (patch, kept patch) pairs per block of grid patches: a block's
            distances and sort keys take about ``24 * max_pairs`` bytes (the features
            ``B * block * D`` per neighbour). Default: 2**22 (about 100 MB).

    Returns:
        ``(B, D, H, W)`` in ``values``' dtype (the weights are computed in float32).

    Raises:
        ValueError: ``keep`` is no ``(B, K)`` with ``K >= 1``.
    """
    _check_some_kept(keep, 'idw fill')
    height, width = grid_size
    b, k, d = values.shape
    n = height * width
    m = min(int(neighbours), k)
    kept = _coords(keep, width).double()  # (B, K, 2): exact integers
    order = torch.arange(k, device=keep.device, dtype=torch.float64)
    chunk = max(1, min(n, max_pairs // max(1, b * k)))
    out = []
    for start in range(0, n, chunk):
        pos = _coords(torch.arange(start, min(n, start + chunk), device=keep.device), width)
        pos = pos.double()
        squared = (pos[None, :, None, 0] - kept[:, None, :, 0]).square_()  # (B, c, K)
        squared += (pos[None, :, None, 1] - kept[:, None, :, 1]).square_()  # exact integers
        # nearest first, ties to the earlier kept patch: one integer key per pair
        _, idx = (squared * k + order).topk(m, dim=-1, largest=False, sorted=True)
        dist = squared.gather(-1, idx).sqrt().float()  # (B, c, m)
        del squared
        if power != 1:
            dist = dist**power
        weights = 1.0 / (dist + _IDW_EPSILON)
        weights = (weights / weights.sum(-1, keepdim=True)).to(values.dtype)
        c = idx.shape[1]
        block = values.new_zeros(b, c, d)
        for j in range(m):  # one neighbour at a time: B * c * D, not m times that
            near = values.gather(1, idx[..., j, None].expand(b, c, d))
            block = block + weights[..., j, None] * near
        out.append(block)
    if not out:  # an empty grid
        return values.new_zeros(b, d, height, width)
    dense = torch.cat(out, 1)  # (B, N, D)
    return dense.transpose(1, 2).reshape(b, d, height, width)


class PropagateFill(nn.Module):
    """Region-growing fill with a learned correction of the unkept patches.

    Args:
        embed_dims: feature channels ``D``.
        max_rings: the most growing steps; patches still empty after them take the
            nearest kept patch. Default: 64.

    Forward: ``values (B, K, D)``, ``keep (B, K)`` (``K >= 1``), ``grid_size`` ->
    ``(B, D, H, W)``.

    A file without its parameters (a student distilled with ``fill='nearest'``, fine-tuned
    with ``'propagate'``) still loads strictly: the fill starts afresh
    (``restart_when_missing``, :func:`~lookhere_dense.checkpoint.load_state_dict_strict`).
    """

    #: the strict loader restarts it when a file has none of its parameters
    restart_when_missing = True

    def __init__(self, embed_dims: int, max_rings: int = 64):
        super().__init__()
        self.max_rings = int(max_rings)
        self.dw = nn.Conv2d(embed_dims, embed_dims, 3, padding=1, groups=embed_dims)
        self.pw = nn.Conv2d(embed_dims, embed_dims, 1)
        self.init_weights()

    def init_weights(self) -> None:
        """The correction starts at zero (``pw`` zero): the output is the propagation."""
        nn.init.zeros_(self.pw.weight)
        nn.init.zeros_(self.pw.bias)

    def reset_parameters(self) -> None:
        """A fresh start: ``dw`` drawn as a new layer's, the correction at zero."""
        self.dw.reset_parameters()
        self.init_weights()

    def forward(self, values: Tensor, keep: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """``values (B, K, D)``, ``keep (B, K)`` (``K >= 1``), ``grid_size`` ->
        ``(B, D, H, W)``."""
        _check_some_kept(keep, 'propagate fill')
        height, width = grid_size
        b, k, d = values.shape
        n = height * width
        dense = scatter_patches(values, keep, n).transpose(1, 2).reshape(b, d, height, width)
        mask = torch.zeros(b, 1, n, dtype=values.dtype, device=values.device)
        mask = mask.scatter(2, keep[:, None, :], 1.0).reshape(b, 1, height, width)
        kept = mask
        filled = mask
        ones = torch.ones(1, 1, 3, 3, dtype=values.dtype, device=values.device)
        for _ in range(self.max_rings):
            if bool(filled.min() > 0):
                break
            total = F.conv2d(dense, ones.expand(d, 1, 3, 3), padding=1, groups=d)
            count = F.conv2d(filled, ones, padding=1)
            new = (count > 0).to(values.dtype) * (1 - filled)
            dense = dense + new * total / count.clamp_min(1)
            filled = filled + new
        if not bool(filled.min() > 0):  # far from every kept patch: the nearest one
            near = nearest_fill(values, keep, grid_size)
            dense = dense + (1 - filled) * near
        return dense + (1 - kept) * self.pw(self.dw(dense))


def build_fill(mode: str, embed_dims: int) -> nn.Module:
    """The fill module of ``mode`` (:data:`FILL_MODES`); ``'nearest'`` and ``'idw'`` have no
    parameters."""
    if mode == 'nearest':
        return _NearestFill()
    if mode == 'idw':
        return _IdwFill()
    if mode == 'propagate':
        return PropagateFill(embed_dims)
    raise ValueError(f'LookWhere: fill={mode!r} is not one of {list(FILL_MODES)}')


class _NearestFill(nn.Module):
    """:func:`nearest_fill` as a module."""

    def forward(self, values: Tensor, keep: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        return nearest_fill(values, keep, grid_size)


class _IdwFill(nn.Module):
    """:func:`idw_fill` (the official LookWhere's dense output) as a module."""

    def forward(self, values: Tensor, keep: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        return idw_fill(values, keep, grid_size)
