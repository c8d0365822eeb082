"""ViTDet-style non-overlapping windows over a patch grid (pure tensor reshapes).

A grid that is not a multiple of the window size is padded at the bottom/right; the
padding is tracked so attention can ignore it (:func:`window_key_mask`). Global
prefix tokens (CLS, or Jumbo tokens) join every window (:func:`attend_in_windows`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..bias import num_prefix_tokens
from ..prefix_tokens import check_tokens
from .common import biased_sdpa

__all__ = [
    'padded_grid',
    'window_partition',
    'window_unpartition',
    'window_valid',
    'window_key_mask',
    'effective_window',
    'window_cut_exact',
    'attend_in_windows',
    'sdpa_in_windows',
]


def effective_window(grid_size: Tuple[int, int], window_size: int, config: Any = None) -> int:
    """The window side a grid is split with: ``window_size``, or the grid's longer side
    where the window is larger and the cut changes nothing. A window at least as large as
    the grid is one window over the grid either way (the padded keys are masked), and
    padding the grid up to it was work on nothing -- ``window_size=64`` (pixels meant,
    not patches) on an 8x8 grid attended over 4,096-token windows for 64 tokens, ~150x the
    time. The result is the same up to float32 rounding where the window's bias depends on
    relative positions only: every position encoding but a LookHere ``config``
    (:func:`window_cut_exact`) with ``center`` heads (their distance is from the window's
    centre) or ``fill_with='max'`` (the window's largest distance): those keep
    ``window_size`` (``tests/test_windows.py``)."""
    if config is not None and not window_cut_exact(config):
        return int(window_size)
    h, w = grid_size
    return min(int(window_size), max(int(h), int(w)))


def window_cut_exact(config: Any) -> bool:
    """Whether a LookHere config's window bias depends on relative positions only, so a
    window cut to the grid (:func:`effective_window`) gives the same result: not with
    ``center`` heads (distance from the grid's centre) or ``fill_with='max'`` (blocked
    keys get the grid's largest distance)."""
    strings = getattr(config, 'direction_strings', ())
    return getattr(config, 'fill_with', 'inf') != 'max' and not any('center' in s for s in strings)


def padded_grid(grid_size: Tuple[int, int], window_size: int) -> Tuple[int, int]:
    """``(Hp, Wp)``: the grid rounded up to a multiple of ``window_size``."""
    h, w = grid_size
    return math.ceil(h / window_size) * window_size, math.ceil(w / window_size) * window_size


def window_partition(x: Tensor, grid_size: Tuple[int, int], window_size: int) -> Tensor:
    """Split patch tokens into windows.

    Args:
        x: ``(B, heads, H*W, d)`` tokens, row-major over the grid.
        grid_size: ``(H, W)``.
        window_size: window side ``ws``.

    Returns:
        ``(B, nWin, heads, ws*ws, d)`` with ``nWin = (Hp/ws) * (Wp/ws)``, windows in
        row-major order, zero-padded at the bottom/right.
    """
    b, nh, _, d = x.shape
    h, w = grid_size
    hp, wp = padded_grid(grid_size, window_size)
    x = x.reshape(b, nh, h, w, d)
    if (hp, wp) != (h, w):
        x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
    ws = window_size
    x = x.reshape(b, nh, hp // ws, ws, wp // ws, ws, d)
    return x.permute(0, 2, 4, 1, 3, 5, 6).reshape(b, (hp // ws) * (wp // ws), nh, ws * ws, d)


def window_unpartition(x: Tensor, grid_size: Tuple[int, int], window_size: int) -> Tensor:
    """Inverse of :func:`window_partition`:
    ``(B, nWin, heads, ws*ws, d)`` -> ``(B, heads, H*W, d)``."""
    b, _, nh, _, d = x.shape
    h, w = grid_size
    hp, wp = padded_grid(grid_size, window_size)
    ws = window_size
    x = x.reshape(b, hp // ws, wp // ws, nh, ws, ws, d).permute(0, 3, 1, 4, 2, 5, 6)
    x = x.reshape(b, nh, hp, wp, d)[:, :, :h, :w]
    return x.reshape(b, nh, h * w, d)


def window_valid(
    grid_size: Tuple[int, int], window_size: int, cls_token: Union[bool, int], device=None
) -> Tensor:
    """Which tokens of each window are real: boolean ``(nWin, J + ws*ws)``, the ``J``
    prefix tokens (CLS / Jumbo; True = 1) first and always real, then the window's patches
    in its raster order, False for the padding of border windows."""
    h, w = grid_size
    hp, wp = padded_grid(grid_size, window_size)
    ws = window_size
    valid = torch.zeros(hp, wp, dtype=torch.bool, device=device)
    valid[:h, :w] = True
    valid = valid.reshape(hp // ws, ws, wp // ws, ws).permute(0, 2, 1, 3).reshape(-1, ws * ws)
    off = num_prefix_tokens(cls_token)
    if off:
        valid = torch.cat([valid.new_ones(valid.shape[0], off), valid], dim=1)
    return valid


def window_key_mask(
    grid_size: Tuple[int, int],
    window_size: int,
    cls_token: Union[bool, int],
    device=None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Additive mask hiding padded keys from the real queries of each window.

    ``cls_token``: number ``J`` of global prefix tokens at the front of every window (CLS,
    or Jumbo tokens; True = 1); they are never padding.

    Returns:
        ``(nWin, 1, T, T)`` with ``T = J + ws*ws``: ``-inf`` where the key is padding and
        the query is another token, else 0. A padded query still sees itself, so no row
        is ever fully masked (no NaN, in forward or backward); padded outputs are dropped.
    """
    valid = window_valid(grid_size, window_size, cls_token, device)
    t = valid.shape[1]
    eye = torch.eye(t, dtype=torch.bool, device=device)
    hidden = ~valid[:, None, :] & ~eye[None]
    mask = torch.zeros(hidden.shape, dtype=dtype, device=device)
    mask.masked_fill_(hidden, float('-inf'))
    return mask[:, None]


def attend_in_windows(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_size: Tuple[int, int],
    window_size: int,
    cls_token: Union[bool, int],
    attend: Callable[[Tensor, Tensor, Tensor], Tensor],
    dropout_p: float = 0.0,
    prefix_rows: Optional[Callable[[Tensor, Tensor, Tensor], Tensor]] = None,
) -> Tensor:
    """The frame of ViTDet window attention shared by every position encoding.

    Splits the patch tokens into windows, puts the ``J`` global prefix tokens (CLS, or
    Jumbo tokens; if any) at the front of every window, lets ``attend`` compute the
    attention inside the windows, puts the windows back and gives the prefix queries
    global attention over all tokens (no bias), as in a global block.

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = J + H*W`` for ``grid_size = (H, W)``.
        cls_token: number ``J`` of global prefix tokens at the front (True = 1).
        attend: ``(qw, kw, vw)`` of shape ``(B, nWin, heads, T_w, d)`` -> the same shape,
            ``T_w = J + ws*ws``; it owns the window bias and the padding mask.
        dropout_p: attention dropout of the prefix rows.
        prefix_rows: ``(q, k, v) -> (B, heads, J, d)``, the prefix queries' output from
            the whole sequence; None: global attention over every token (a plain SDPA).
            Default: None.

    Returns:
        ``(B, heads, T, d)``.
    """
    off = num_prefix_tokens(cls_token)
    check_tokens('window attention', q.shape[-2], grid_size, off)
    ws = int(window_size)
    qw, kw, vw = (window_partition(t[:, :, off:], grid_size, ws) for t in (q, k, v))
    if off:
        n_win = qw.shape[1]
        qw, kw, vw = (
            torch.cat([t[:, None, :, :off].expand(-1, n_win, -1, -1, -1), tw], dim=-2)
            for t, tw in ((q, qw), (k, kw), (v, vw))
        )
    out = window_unpartition(attend(qw, kw, vw)[..., off:, :], grid_size, ws)
    if off:
        if prefix_rows is None:
            cls_out = F.scaled_dot_product_attention(q[:, :, :off], k, v, dropout_p=dropout_p)
        else:
            cls_out = prefix_rows(q, k, v)
        out = torch.cat([cls_out, out], dim=-2)
    return out


def sdpa_in_windows(
    qw: Tensor,
    kw: Tensor,
    vw: Tensor,
    bias: Optional[Tensor] = None,
    pad: Optional[Tensor] = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """``F.scaled_dot_product_attention`` inside windows, in 4-D calls only: with 5-D
    inputs PyTorch takes its unfused "math" kernel, which materialises the scores and, in
    bfloat16 / float16 on CPU, float32 copies of ``q, k, v`` (docs/mixed_precision.md).

    Args:
        qw, kw, vw: ``(B, nWin, heads, T_w, d)``.
        bias: ``(heads, T_w, T_w)``, the same for every window; None: none. Default: None.
        pad: the padding mask of border windows ``(nWin, 1, T_w, T_w)``
            (:func:`window_key_mask`); None: no padding. Default: None.
        dropout_p: attention dropout. Default: 0.

    Returns:
        ``(B, nWin, heads, T_w, d)``; windows as one batch, or one call per image when
        ``pad`` (which differs per window) is given.
    """
    batch, n_win = qw.shape[:2]
    if batch == 0:  # an empty batch: an empty result
        return vw.new_empty(vw.shape)
    if pad is not None:
        mask = pad if bias is None else bias + pad  # (nWin, heads | 1, T_w, T_w)
        return torch.stack(
            [biased_sdpa(qw[i], kw[i], vw[i], mask, dropout_p) for i in range(batch)]
        )
    q, k, v = qw.flatten(0, 1), kw.flatten(0, 1), vw.flatten(0, 1)
    if bias is None:
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    else:
        out = biased_sdpa(q, k, v, bias.unsqueeze(0), dropout_p)
    return out.view(batch, n_win, *out.shape[1:])
