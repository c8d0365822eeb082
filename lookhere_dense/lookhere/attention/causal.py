"""The ``causal`` backend family: causal attention in the raster order of the patch grid
(LEDiT's attention, ``pos_encoding='ledit'``; :mod:`~lookhere_dense.lookhere.pos_encoding.ledit`
owns the encoding and its caches), ``prefix`` global tokens first.

==============  ===========================================================================
``sdpa``        ``F.scaled_dot_product_attention(is_causal=True)`` over the whole sequence
                (prefix first, so every patch sees every prefix key), the ``J`` prefix
                query rows recomputed without mask (fused flash / memory-efficient kernels)
``chunked``     blocks of query rows; a block attends only to the keys up to its last row,
                with a causal mask on its own part; activation checkpointing per block
                while autograd records (memory-lean at high resolution)
``flex``        ``flex_attention`` with a causal ``mask_mod`` and a ``BlockMask`` built
                tile by tile from the causal structure (tiles above the diagonal skipped);
                compiled on CUDA, eager (forward only) on CPU
``reference``   an explicit boolean mask and a plain softmax in float32 / float64: the
                ground truth
``auto``        ``sdpa`` (the fused causal kernels are the fastest and hold no ``T x T``
                matrix)
==============  ===========================================================================

The backend interface of the package: ``NAME``, ``can_run(request: CausalRequest)``
(None, or why the request's variant cannot run) and ``attend(call: CausalCall)``; the
variants' forwards are :data:`VARIANTS`, and ``causal_reference`` / ``causal_sdpa`` /
``causal_chunked`` / ``causal_flex`` are :func:`causal_attention` with one variant.

Window blocks (ViTDet) are causal in each window's own raster order
(:func:`causal_window_attention`), whatever the backend.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .common import (
    FLEX_BLOCK,
    AttentionRequest,
    block_mask_from_tiles,
    check_flex_call,
    flex_available,
    flex_function,
)
from .windows import attend_in_windows, window_valid

__all__ = [
    'NAME',
    'CAUSAL_BACKENDS',
    'CausalRequest',
    'CausalCall',
    'VARIANTS',
    'can_run',
    'attend',
    'causal_attention',
    'causal_mask',
    'causal_reference',
    'causal_sdpa',
    'causal_chunked',
    'causal_flex',
    'causal_block_mask',
    'causal_window_attention',
    'window_causal_mask',
]

NAME = 'causal'

#: the values of ``attn_backend`` ``'ledit'`` (causal attention) runs with
CAUSAL_BACKENDS = ('auto', 'reference', 'sdpa', 'chunked', 'flex')


@dataclass(frozen=True)
class CausalRequest(AttentionRequest):
    """An :class:`~.common.AttentionRequest` for causal attention, with the variant asked
    about.

    Attributes:
        variant: one of :data:`CAUSAL_BACKENDS` (``'auto'``: ``'sdpa'``). Default: ``'auto'``.
    """

    variant: str = 'auto'


@dataclass(eq=False)
class CausalCall:
    """One causal attention call (what :func:`attend` runs).

    Attributes:
        q, k, v: ``(B, heads, T, d)`` with ``T = J + N``, the ``J = prefix`` tokens first.
        prefix: ``J``. Default: 0.
        global_prefix: the prefix queries see every key (False: causal among the prefix).
            Default: True.
        dropout_p: attention dropout. Default: 0.
        variant: one of :data:`CAUSAL_BACKENDS`. Default: ``'sdpa'``.
        block_size: query rows per block of ``'chunked'`` (None or 0: ``max(64, 4 *
            head_dim)``). Default: None.
        block_mask: a cached :func:`causal_block_mask` for ``'flex'`` (None: built).
            Default: None.
        recompute: ``'chunked'`` checkpoints each block (None: whenever autograd records).
            Default: None.
        compiled: ``'flex'`` runs the ``torch.compile``-d kernel (None: on CUDA only; eager
            flex is forward only on CPU and materialises the scores). Default: None.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    prefix: int = 0
    global_prefix: bool = True
    dropout_p: float = 0.0
    variant: str = 'sdpa'
    block_size: Optional[int] = None
    block_mask: Any = None
    recompute: Optional[bool] = None
    compiled: Optional[bool] = None


def can_run(request: CausalRequest) -> Optional[str]:
    """None when ``request.variant`` can run the call, else why not: every variant runs
    everywhere except ``flex`` (needs ``flex_attention``, no dropout, no training on CPU)."""
    variant = getattr(request, 'variant', 'auto')
    if variant not in CAUSAL_BACKENDS:
        return f'unknown causal backend {variant!r}; allowed: {list(CAUSAL_BACKENDS)}'
    if variant != 'flex':
        return None
    if not flex_available():
        return f'torch {torch.__version__} has no torch.nn.attention.flex_attention'
    if request.dropout_p:
        return 'flex has no attention dropout'
    if request.training and request.on_cpu:
        return "PyTorch's flex_attention has no CPU backward"
    return None


# -- global causal attention ---------------------------------------------------------------
def causal_mask(tokens: int, prefix: int, global_prefix: bool = True, device=None) -> Tensor:
    """The boolean ``(T, T)`` visibility of causal attention (True: the query sees the key).

    Key ``j <= i`` for query ``i``; with ``global_prefix`` the first ``prefix`` query rows
    see every key (the prefix keys come first, so every query sees them anyway).
    """
    idx = torch.arange(tokens, device=device)
    visible = idx[None, :] <= idx[:, None]
    if global_prefix and prefix:
        visible[:prefix] = True
    return visible


def _prefix_rows(
    q: Tensor, k: Tensor, v: Tensor, prefix: int, global_prefix: bool, dropout_p: float
) -> Tensor:
    """The output rows of the ``prefix`` queries: every key (global) or causal among the
    prefix keys."""
    if global_prefix:
        return F.scaled_dot_product_attention(q[:, :, :prefix], k, v, dropout_p=dropout_p)
    return F.scaled_dot_product_attention(
        q[:, :, :prefix],
        k[:, :, :prefix],
        v[:, :, :prefix],
        dropout_p=dropout_p,
        is_causal=True,
    )


def _reference(call: CausalCall) -> Tensor:
    """An explicit boolean mask (:func:`causal_mask`) and a plain softmax in float32
    (float64 for float64 inputs): the ground truth."""
    q, k, v = call.q, call.k, call.v
    work = torch.promote_types(q.dtype, torch.float32)
    logits = (q.to(work) * q.shape[-1] ** -0.5) @ k.to(work).transpose(-2, -1)
    visible = causal_mask(q.shape[-2], call.prefix, call.global_prefix, q.device)
    attn = logits.masked_fill(~visible, float('-inf')).softmax(dim=-1)
    if call.dropout_p > 0:
        attn = F.dropout(attn, p=call.dropout_p)
    return (attn @ v.to(work)).to(q.dtype)


def _sdpa(call: CausalCall) -> Tensor:
    """``F.scaled_dot_product_attention(is_causal=True)``.

    ``is_causal`` over the whole sequence is exact for the patch rows: the prefix comes
    first, so patch query ``i`` (sequence index ``J + i``) sees the ``J`` prefix keys and
    the patch keys ``0..i``. With ``global_prefix`` the ``J`` prefix rows (which
    ``is_causal`` limits to the prefix keys up to themselves) are recomputed without a mask.
    """
    q, k, v, prefix, p = call.q, call.k, call.v, call.prefix, call.dropout_p
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    if prefix and call.global_prefix:
        head = _prefix_rows(q, k, v, prefix, True, p)
        out = torch.cat([head, out[:, :, prefix:]], dim=2)
    return out


def _auto_rows(q: Tensor) -> int:
    """Query rows per chunked block: the ``(B, heads, rows, T)`` scores of a block no
    larger than the MLP activation of the tokens (``B x T x 4C``), at least 64."""
    return max(64, 4 * q.shape[-1])


def _chunked(call: CausalCall) -> Tensor:
    """Blocks of query rows (memory-lean).

    The patch queries ``s..e-1`` attend only to the keys ``0..J+e-1`` (every prefix key
    and the patches up to the block's last row), with the causal mask on the block's own
    diagonal part; the keys after the block are never touched. With ``recompute``
    (default: whenever autograd records) every block runs under activation checkpointing,
    so backward keeps no block's scores. The prefix query rows run as one call
    (:func:`_prefix_rows`).
    """
    q, k, v, prefix, dropout_p = call.q, call.k, call.v, call.prefix, call.dropout_p
    total = q.shape[-2]
    n = total - prefix
    records = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    recompute = records if call.recompute is None else call.recompute
    rows = max(1, min(call.block_size or _auto_rows(q), max(n, 1)))

    def block(q_blk: Tensor, k_blk: Tensor, v_blk: Tensor) -> Tensor:
        length, keys = q_blk.shape[-2], k_blk.shape[-2]
        qi = torch.arange(keys - length, keys, device=q_blk.device)
        mask = torch.arange(keys, device=q_blk.device)[None, :] <= qi[:, None]
        return F.scaled_dot_product_attention(
            q_blk, k_blk, v_blk, attn_mask=mask, dropout_p=dropout_p
        )

    # without autograd (and checkpointing), every block is written straight into the result
    result = None if records or recompute else q.new_empty(*q.shape[:-1], v.shape[-1])
    blocks = []
    if prefix:
        head = _prefix_rows(q, k, v, prefix, call.global_prefix, dropout_p)
        if result is None:
            blocks.append(head)
        else:
            result[:, :, :prefix] = head
    for s in range(0, n, rows):
        e = min(n, s + rows)
        args = (q[:, :, prefix + s : prefix + e], k[:, :, : prefix + e], v[:, :, : prefix + e])
        if recompute:
            blocks.append(checkpoint(block, *args, use_reentrant=False))
        elif result is None:
            blocks.append(block(*args))
        else:
            result[:, :, prefix + s : prefix + e] = block(*args)
    if result is not None:
        return result
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)


def causal_block_mask(
    tokens: int,
    prefix: int = 0,
    global_prefix: bool = True,
    device=None,
    block: int = FLEX_BLOCK,
):
    """The flex ``BlockMask`` of causal attention over ``tokens`` (:func:`causal_mask`),
    built tile by tile from the causal structure (no ``T x T`` mask, no compilation).

    Query tile ``i`` (rows ``r0..r1``) and key tile ``j`` (keys ``c0..c1``): some key is
    visible when ``c0 <= r1`` or a row is a global prefix row (``r0 < J``); every key is
    visible when all rows are prefix rows or ``c1 <= max(r0, J)`` (the first non-prefix
    row sees the tile's last key), and the tile is whole (a ragged last tile, past ``T``,
    stays partial). Equal to ``create_block_mask(mask_mod, None, None, T, T,
    BLOCK_SIZE=block)`` with the causal mask_mod (``tests/test_ledit.py``).
    """
    n_tiles = -(-tokens // block)
    start = torch.arange(n_tiles, device=device) * block
    last = torch.clamp(start + block - 1, max=tokens - 1)
    r0, r1 = start[:, None], last[:, None]
    c0, c1 = start[None, :], last[None, :]
    glob = prefix if global_prefix else 0
    some = (c0 <= r1) | (r0 < glob)
    whole = (last - start + 1) == block  # the ragged last tile is never full (as flex's)
    every = ((r1 < glob) | (c1 <= torch.clamp(r0, min=glob))) & whole[:, None] & whole[None, :]
    partial = some & ~every

    return block_mask_from_tiles(
        partial[None, None],
        every[None, None],
        block,
        tokens,
        _flex_mask_mod(prefix, global_prefix),
    )


def _flex_mask_mod(prefix: int, global_prefix: bool):
    glob = prefix if global_prefix else 0

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (q_idx < glob)

    return mask_mod


def _flex(call: CausalCall) -> Tensor:
    """``flex_attention`` with a causal ``mask_mod`` and the tile-skipping ``block_mask``
    (:func:`causal_block_mask`, built when the call has none); refuses dropout and CPU
    training (:func:`~.common.check_flex_call`)."""
    q, k, v = call.q, call.k, call.v
    who = "pos_encoding='ledit' with attn_backend='flex'"
    check_flex_call(q, k, v, call.dropout_p, who, "'auto', 'sdpa' or 'chunked'")
    compiled = q.is_cuda if call.compiled is None else call.compiled
    block_mask = call.block_mask
    if block_mask is None:
        block_mask = causal_block_mask(q.shape[-2], call.prefix, call.global_prefix, q.device)
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')
        return flex_function(compiled)(q, k, v, block_mask=block_mask)


#: the forward of each variant (``'auto'`` is ``'sdpa'``: the fused causal kernels are the
#: fastest and hold no ``T x T`` matrix)
VARIANTS: Dict[str, Callable[[CausalCall], Tensor]] = {
    'auto': _sdpa,
    'reference': _reference,
    'sdpa': _sdpa,
    'chunked': _chunked,
    'flex': _flex,
}


def attend(call: CausalCall) -> Tensor:
    """Causal attention (raster order, the prefix tokens first) of ``call`` through its
    variant: ``(B, heads, T, d)`` -> ``(B, heads, T, d)`` in ``q``'s dtype.

    Raises:
        ValueError: an unknown variant; ``'flex'`` with dropout, or training on CPU.
    """
    if call.variant not in VARIANTS:
        raise ValueError(
            f"pos_encoding='ledit': unknown attention backend {call.variant!r}; "
            f'allowed: {list(CAUSAL_BACKENDS)}'
        )
    return VARIANTS[call.variant](call)


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix: int = 0,
    global_prefix: bool = True,
    dropout_p: float = 0.0,
    backend: str = 'sdpa',
    **options: Any,
) -> Tensor:
    """:func:`attend` of one :class:`CausalCall` (``backend`` is its ``variant``;
    ``options`` its ``block_size``, ``block_mask``, ``recompute``, ``compiled``)."""
    return attend(CausalCall(q, k, v, prefix, global_prefix, dropout_p, backend, **options))


#: :func:`causal_attention` through one variant (the old names; same arguments)
causal_reference = functools.partial(causal_attention, backend='reference')
causal_sdpa = functools.partial(causal_attention, backend='sdpa')
causal_chunked = functools.partial(causal_attention, backend='chunked')
causal_flex = functools.partial(causal_attention, backend='flex')


# -- windows -------------------------------------------------------------------------------
def window_causal_mask(
    grid_size: Tuple[int, int], window_size: int, prefix: int, device=None
) -> Tensor:
    """Boolean visibility ``(nWin, T_w, T_w)`` (``T_w = J + ws*ws``) of causal window
    attention, in each window's own raster order with the ``J`` prefix tokens first.

    A query sees the prefix keys and the real patch keys of its window up to itself;
    padded keys (border windows of a grid that is not a multiple of ``ws``) are hidden from
    every other query, so every row sees at least itself: no row is empty, no NaN, forward
    or backward (the caller drops the padded and prefix rows of the windows).
    """
    valid = window_valid(grid_size, window_size, prefix, device)
    idx = torch.arange(valid.shape[1], device=device)
    earlier = idx[None, :] <= idx[:, None]
    return earlier[None] & (
        valid[:, None, :] | torch.eye(len(idx), dtype=torch.bool, device=device)
    )


def causal_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_size: Tuple[int, int],
    window_size: int,
    prefix: int = 0,
    global_prefix: bool = True,
    dropout_p: float = 0.0,
    mask: Optional[Tensor] = None,
) -> Tensor:
    """ViTDet window attention, causal in each window's raster order.

    The frame of every encoding's window attention
    (:func:`~.windows.attend_in_windows`: patches split into
    ``window_size`` windows, zero-padded at the bottom / right, the ``J`` prefix tokens at
    the front of every window); inside a window a patch sees the prefix keys and its
    window's real patches up to itself (:func:`window_causal_mask`). The prefix queries
    attend as in a global block (every token with ``global_prefix``, else causally among
    the prefix). A window covering the grid is global causal attention (the window's
    raster order is the grid's).

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = J + H*W``.
        mask: a cached :func:`window_causal_mask` (built when None).

    Returns:
        ``(B, heads, T, d)``.
    """
    ws = int(window_size)
    if mask is None:
        mask = window_causal_mask(grid_size, ws, prefix, q.device)

    def attend(qw: Tensor, kw: Tensor, vw: Tensor) -> Tensor:
        batch, n_win, heads, tw, dim = qw.shape
        attn_mask = mask[None, :, None].expand(batch, -1, -1, -1, -1).reshape(-1, 1, tw, tw)
        out = F.scaled_dot_product_attention(
            *(t.reshape(batch * n_win, heads, tw, -1) for t in (qw, kw, vw)),
            attn_mask=attn_mask,
            dropout_p=dropout_p,
        )
        return out.view(batch, n_win, heads, tw, -1)

    return attend_in_windows(
        q,
        k,
        v,
        grid_size,
        ws,
        prefix,
        attend,
        dropout_p,
        prefix_rows=lambda q, k, v: _prefix_rows(q, k, v, prefix, global_prefix, dropout_p),
    )
