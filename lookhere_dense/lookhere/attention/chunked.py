"""The ``chunked`` backend: exact LookHere attention over blocks of query rows.

Each block's bias rows are copied from the relative-offset table into one reused buffer
(:func:`~.bias.gather_block`), so the ``(heads, T, T)`` bias never exists; runs of heads
that only look up (down) attend only to the key rows above (below) the block
(:func:`head_runs`); with autograd each block is recomputed in backward.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..bias import GridBias, num_prefix_tokens
from .common import AttentionCall, AttentionRequest, biased_sdpa, gather_block

__all__ = [
    'NAME',
    'can_run',
    'attend',
    'chunked_attention',
    'key_row_groups',
    'head_runs',
    'auto_block_rows',
]


NAME = 'chunked'


def can_run(request: AttentionRequest) -> Optional[str]:
    """Runs everywhere, with everything (dropout, slope gradients): the last resort of
    ``auto``."""
    return None


def key_row_groups(visible: Tensor) -> List[Tuple[Tuple[int, ...], int, int]]:
    """Heads grouped by the vertical extent of their fields of view.

    A head that can only look up (``up``, ``corners`` up-left/up-right, ``tri_up``, ...)
    sees, from a block of query rows, only the key rows above the block's last row; a
    head that looks down only the rows below its first row. The chunked backend uses
    this to hand each group of heads just the key rows it can see.

    Args:
        visible: ``(heads, 2H-1, 2W-1)`` bool fields of view of one layer.

    Returns:
        ``[(heads, dy_min, dy_max)]``: head indices (ascending) sharing the smallest and
        largest visible row offset ``dy``; groups ordered by their first head.
    """
    height = (visible.shape[-2] + 1) // 2
    rows = visible.any(dim=-1).cpu()  # (heads, 2H-1)
    groups: Dict[Tuple[int, int], List[int]] = {}
    for h in range(rows.shape[0]):
        seen = rows[h].nonzero().flatten()  # never empty: (0, 0) is always visible
        extent = (int(seen.min()) - (height - 1), int(seen.max()) - (height - 1))
        groups.setdefault(extent, []).append(h)
    return [(tuple(hs), lo, hi) for (lo, hi), hs in groups.items()]


def head_runs(visible: Tensor) -> List[Tuple[int, int, int, int]]:
    """:func:`key_row_groups` split into runs of consecutive heads (so that every run is
    a view of ``q``, ``k``, ``v``), ordered by head.

    Returns:
        ``[(h0, h1, dy_min, dy_max)]``: heads ``h0:h1`` share the visible row offsets
        ``dy_min..dy_max``.
    """
    runs = []
    for heads, lo, hi in key_row_groups(visible):
        start = heads[0]
        for prev, h in zip(heads, heads[1:] + (None,)):
            if h != prev + 1:  # a run ends at prev
                runs.append((start, prev + 1, lo, hi))
                start = h
    return sorted(runs)


def auto_block_rows(q: Tensor, run_heads: int, grid_width: int) -> int:
    """Query rows per block of :func:`chunked_attention` when none is given.

    The bias block (``run_heads x rows x T``) is kept no larger than the MLP hidden
    activation of the same tokens (``B x T x 4C`` with ``C = heads x d``), which a ViT
    block holds anyway, so the attention phase does not set the model's peak memory;
    at least 64 rows (the CPU kernel slows down on short query blocks), rounded to
    whole grid rows when a row is shorter (tighter key ranges): down, unless that
    would drop below 64.

    Args:
        q: ``(B, heads, T, d)``.
        run_heads: the most heads that share one block's bias.
        grid_width: ``W`` of the patch grid.
    """
    batch, heads, _, dim = q.shape
    rows = max(64, 4 * batch * heads * dim // max(run_heads, 1))
    if rows < grid_width:
        return rows
    whole = rows - rows % grid_width
    return whole if whole >= 64 else whole + grid_width


def _key_span(
    lo: int, hi: int, height: int, width: int, off: int, qy0: int, qy1: int
) -> Tuple[Tuple[int, int], Tuple[int, int], Optional[str]]:
    """What a run of heads sees from query rows ``qy0..qy1``.

    Keys live in the layout ``[P, patches, P]`` with ``P`` the ``off`` global prefix
    tokens (CLS / Jumbo; at both ends when ``off``): heads that see every row above
    (``dy_min = -(H-1)``) take a prefix ``[P, rows 0..r1)``, the others a suffix
    ``[rows r0..H-1, P]``.

    Returns:
        ``((r0, r1), (k0, k1), cls_key)``: key grid rows, key tokens in the layout, and
        where the prefix columns of the bias go (``'first'`` / ``'last'`` / None).
    """
    if lo == -(height - 1) or hi < height - 1:
        r1 = min(height, qy1 + hi + 1)
        return (0, r1), (0, off + r1 * width), 'first' if off else None
    r0 = max(0, qy0 + lo)
    return (r0, height), (off + r0 * width, off + height * width + off), 'last' if off else None


def chunked_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    block_size: Optional[int] = None,
    dropout_p: float = 0.0,
    recompute: Optional[bool] = None,
) -> Tensor:
    """Exact attention over blocks of ``block_size`` query rows, bias gathered per block.

    Each block's bias is copied from ``grid_bias``'s relative table when the block is
    computed (:func:`~.bias.gather_block`, queries in reversed order so that the copy is
    a few strided slices), so the whole ``(heads, T, T)`` bias never exists. Heads are
    grouped by the vertical extent of their fields of view (:func:`head_runs`); each
    run of heads attends only to the key rows it can see from the block (a prefix for
    upward-looking heads, a suffix for downward-looking ones), which skips the fully
    blocked part of the grid: for LH-90 / LH-45 a third of the attention work and of
    the bias. Every block also sees the global prefix keys (CLS / Jumbo, bias 0); the
    prefix queries (bias 0, all keys) run as one plain SDPA call.

    Without autograd one buffer holds every block's bias and the blocks are written
    straight into the result. With ``recompute`` (default: whenever autograd records,
    also for a table that requires grad: learnable slopes) each block runs under
    activation checkpointing, so the backward pass keeps no bias rows and no attention
    matrix either; the table's gradient is accumulated block by block.

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = J + H*W``.
        grid_bias: tables of the grid (best in ``q``'s dtype; cast otherwise).
        layer: which layer's table to use.
        cls_token: number ``J`` of global prefix tokens at the front (CLS, or Jumbo
            tokens; True = 1).
        block_size: query rows per block; None or 0: :func:`auto_block_rows`.
            Default: None.
        dropout_p: attention dropout. Default: 0.
        recompute: checkpoint each block. Default: when autograd records.

    Returns:
        ``(B, heads, T, d)``.
    """
    height, width = grid_bias.grid_size
    n = height * width
    off = num_prefix_tokens(cls_token)
    records = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, grid_bias.table, grid_bias.key_term)
    )  # + learnable slopes
    if recompute is None:
        recompute = records
    table = grid_bias.table[layer].to(q.dtype)
    key_term = None if grid_bias.key_term is None else grid_bias.key_term[layer].to(q.dtype)
    runs = head_runs(grid_bias.visible[layer])
    widest = max(h1 - h0 for h0, h1, _, _ in runs)
    rows = block_size or auto_block_rows(q, widest, width)
    rows = max(1, min(rows, n))
    buffer = None if recompute else table.new_empty(widest * rows * (n + 2 * off))
    # without autograd, every block is written straight into the result
    result = None if records else q.new_empty(*q.shape[:-1], v.shape[-1])
    if off and any(
        _key_span(lo, hi, height, width, off, 0, 0)[2] == 'last' for _, _, lo, hi in runs
    ):
        k_ext, v_ext = (torch.cat([t, t[:, :, :off]], dim=2) for t in (k, v))  # [P, N, P]
    else:
        k_ext, v_ext = k, v

    def block(
        h0: int,
        h1: int,
        s: int,
        e: int,
        key_rows: Tuple[int, int],
        cls_key: Optional[str],
        q_blk: Tensor,
        k_blk: Tensor,
        v_blk: Tensor,
    ) -> Tensor:
        shape = (h1 - h0, e - s, k_blk.shape[-2])
        out = None if buffer is None else buffer[: math.prod(shape)].view(shape)
        bias = gather_block(
            table[h0:h1],
            (height, width),
            s,
            e,
            key_rows,
            cls_key,
            None if key_term is None else key_term[h0:h1],
            out=out,
            reverse_queries=True,
            num_prefix=off,
        )
        return biased_sdpa(q_blk.flip(2), k_blk, v_blk, bias.unsqueeze(0), dropout_p).flip(2)

    outs = []
    for h0, h1, lo, hi in runs:
        blocks = []
        for s in range(0, n, rows):
            e = min(n, s + rows)
            key_rows, (k0, k1), cls_key = _key_span(
                lo, hi, height, width, off, s // width, (e - 1) // width
            )
            args = (
                h0,
                h1,
                s,
                e,
                key_rows,
                cls_key,
                q[:, h0:h1, off + s : off + e],
                k_ext[:, h0:h1, k0:k1],
                v_ext[:, h0:h1, k0:k1],
            )
            if recompute:
                blocks.append(checkpoint(block, *args, use_reentrant=False))
            elif result is None:
                blocks.append(block(*args))
            else:
                result[:, h0:h1, off + s : off + e] = block(*args)
        if blocks:
            outs.append(blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2))
    if off:  # the prefix queries: bias 0 to every key
        cls_out = F.scaled_dot_product_attention(q[:, :, :off], k, v, dropout_p=dropout_p)
        if result is not None:
            result[:, :, :off] = cls_out
    if result is not None:
        return result
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return torch.cat([cls_out, out], dim=2) if off else out


def attend(call: AttentionCall) -> Tensor:
    """:func:`chunked_attention` with the engine's tables (or the slopes' table) and its
    ``block_size``."""
    grid_bias, index = call.tables()
    args = (grid_bias, index, call.cls_token, call.engine.block_size, call.dropout_p)
    return chunked_attention(call.q, call.k, call.v, *args)
