"""LookHere attention: one entry point, several backends that all give the same result.

==============  ==============================================================  ==============
backend         how the bias reaches the softmax                                extra memory
==============  ==============================================================  ==============
``reference``   materialised ``(heads, T, T)`` bias + plain softmax attention    heads*T^2 (x2)
``sdpa``        cached materialised bias as a 4-D ``attn_mask`` of              heads*T^2 per
                ``F.scaled_dot_product_attention`` (fused kernel on CPU/GPU)     layer, cached
``chunked``     blocks of query rows; each block's bias rows are copied from    heads*T*block
                the relative-offset table into one reused buffer; runs of
                heads that only look up (down) attend only to the key rows
                above (below) the block; backward recomputes per block
``flex``        ``flex_attention`` with a ``score_mod`` that reads the table     O(T) + tiles
                by ``(q_idx, kv_idx)`` and a ``BlockMask`` of the fields of
                view, so fully blocked tiles are skipped (compiled on CUDA)
==============  ==============================================================  ==============

Token order is ``[CLS, patch_0, ..., patch_{N-1}]`` when there is a CLS token (its row and
column carry no bias), otherwise just the patches, row-major over the grid.

Masks go to ``F.scaled_dot_product_attention`` as 4-D ``(1, heads, Tq, Tk)`` tensors and
windows as a 4-D batch: with a 3-D mask or 5-D inputs PyTorch silently drops to its
unfused "math" kernel (2-8x slower on CPU, and it materialises the attention matrix).

:class:`LookHereAttentionEngine` owns the caches (tables per grid and dtype, dense biases,
window biases, flex block masks and score functions; all bounded, keyed by grid or window
size, device and dtype), chooses a backend per call (``auto``), and is shared by all
layers of a model: layers differ only in which table slice they read, and layers with
the same head string share one block mask. Nothing here is part of a ``state_dict``.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .bias import GridBias, LookHereConfig, build_grid_bias, gather_block
from .cache import BoundedCache
from .windows import attend_in_windows, padded_grid, window_key_mask

__all__ = ['BACKENDS', 'LookHereAttentionEngine', 'reference_attention', 'sdpa_attention',
           'chunked_attention', 'flex_attention_lookhere', 'flex_available', 'flex_score_mod',
           'flex_mask_mod', 'lookhere_block_mask', 'key_row_groups', 'head_runs',
           'tile_order']

BACKENDS = ('auto', 'reference', 'sdpa', 'chunked', 'flex')
#: Query/key tile side of the flex kernels and block masks.
FLEX_BLOCK = 128


def _as_4d(mask: Tensor) -> Tensor:
    """``(heads, T, S)`` -> ``(1, heads, T, S)`` (a view); 4-D masks pass through."""
    return mask.unsqueeze(0) if mask.dim() == 3 else mask


def reference_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                        dropout_p: float = 0.0) -> Tensor:
    """Plain softmax attention with an additive bias; the ground truth for tests.

    Computed in float32 (float64 for float64 inputs) whatever the inputs' dtype, and
    returned in that dtype, so low-precision runs of the other backends can be checked
    against it.

    Args:
        q, k, v: ``(B, heads, T, d)`` (``k``/``v`` may have another length ``S``).
        bias: ``(heads, T, S)`` or broadcastable to ``(B, heads, T, S)``.
        dropout_p: attention dropout probability (applied only if > 0).

    Returns:
        ``(B, heads, T, d)`` in ``q``'s dtype.
    """
    work = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5
    logits = (q.to(work) * scale) @ k.to(work).transpose(-2, -1) + bias.to(work)
    attn = logits.softmax(dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p)
    return (attn @ v.to(work)).to(q.dtype)


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                   dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention`` with the bias as a 4-D float ``attn_mask``.

    Args:
        q, k, v: ``(B, heads, T, d)``.
        bias: ``(heads, T, S)`` or ``(1 | B, heads, T, S)``.

    Returns:
        ``(B, heads, T, d)``.
    """
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_as_4d(bias).to(q.dtype),
                                          dropout_p=dropout_p)


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


def _key_span(lo: int, hi: int, height: int, width: int, off: int, qy0: int, qy1: int
              ) -> Tuple[Tuple[int, int], Tuple[int, int], Optional[str]]:
    """What a run of heads sees from query rows ``qy0..qy1``.

    Keys live in the layout ``[CLS, patches, CLS]`` (the CLS key at both ends when
    ``off``): heads that see every row above (``dy_min = -(H-1)``) take a prefix
    ``[CLS, rows 0..r1)``, the others a suffix ``[rows r0..H-1, CLS]``.

    Returns:
        ``((r0, r1), (k0, k1), cls_key)``: key grid rows, key tokens in the layout, and
        where the CLS column of the bias goes (``'first'`` / ``'last'`` / None).
    """
    if lo == -(height - 1) or hi < height - 1:
        r1 = min(height, qy1 + hi + 1)
        return (0, r1), (0, off + r1 * width), 'first' if off else None
    r0 = max(0, qy0 + lo)
    return (r0, height), (off + r0 * width, off + height * width + off), \
        'last' if off else None


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, grid_bias: GridBias, layer: int,
                      cls_token: bool, block_size: Optional[int] = None,
                      dropout_p: float = 0.0, recompute: Optional[bool] = None) -> Tensor:
    """Exact attention over blocks of ``block_size`` query rows, bias gathered per block.

    Each block's bias is copied from ``grid_bias``'s relative table when the block is
    computed (:func:`~.bias.gather_block`, queries in reversed order so that the copy is
    a few strided slices), so the whole ``(heads, T, T)`` bias never exists. Heads are
    grouped by the vertical extent of their fields of view (:func:`head_runs`); each
    run of heads attends only to the key rows it can see from the block (a prefix for
    upward-looking heads, a suffix for downward-looking ones), which skips the fully
    blocked part of the grid: for LH-90 / LH-45 a third of the attention work and of
    the bias. The CLS query (bias 0, all keys) runs as one plain SDPA row.

    Without autograd one buffer holds every block's bias and the blocks are written
    straight into the result. With ``recompute`` (default: whenever autograd records)
    each block runs under activation checkpointing, so the backward pass keeps no bias
    rows and no attention matrix either.

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = H*W (+1)``.
        grid_bias: tables of the grid (best in ``q``'s dtype; cast otherwise).
        layer: which layer's table to use.
        cls_token: token 0 is a CLS token.
        block_size: query rows per block; None or 0: :func:`auto_block_rows`.
            Default: None.
        dropout_p: attention dropout. Default: 0.
        recompute: checkpoint each block. Default: when autograd records.

    Returns:
        ``(B, heads, T, d)``.
    """
    height, width = grid_bias.grid_size
    n = height * width
    off = int(cls_token)
    records = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
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
    if off and any(_key_span(lo, hi, height, width, off, 0, 0)[2] == 'last'
                   for _, _, lo, hi in runs):
        k_ext, v_ext = (torch.cat([t, t[:, :, :off]], dim=2) for t in (k, v))  # [CLS, P, CLS]
    else:
        k_ext, v_ext = k, v

    def block(h0: int, h1: int, s: int, e: int, key_rows: Tuple[int, int],
              cls_key: Optional[str], q_blk: Tensor, k_blk: Tensor, v_blk: Tensor) -> Tensor:
        shape = (h1 - h0, e - s, k_blk.shape[-2])
        out = None if buffer is None else buffer[:math.prod(shape)].view(shape)
        bias = gather_block(table[h0:h1], (height, width), s, e, key_rows, cls_key,
                            None if key_term is None else key_term[h0:h1], out=out,
                            reverse_queries=True)
        return F.scaled_dot_product_attention(q_blk.flip(2), k_blk, v_blk,
                                              attn_mask=bias.unsqueeze(0),
                                              dropout_p=dropout_p).flip(2)

    outs = []
    for h0, h1, lo, hi in runs:
        blocks = []
        for s in range(0, n, rows):
            e = min(n, s + rows)
            key_rows, (k0, k1), cls_key = _key_span(lo, hi, height, width, off, s // width,
                                                    (e - 1) // width)
            args = (h0, h1, s, e, key_rows, cls_key, q[:, h0:h1, off + s:off + e],
                    k_ext[:, h0:h1, k0:k1], v_ext[:, h0:h1, k0:k1])
            if recompute:
                blocks.append(checkpoint(block, *args, use_reentrant=False))
            elif result is None:
                blocks.append(block(*args))
            else:
                result[:, h0:h1, off + s:off + e] = block(*args)
        if blocks:
            outs.append(blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2))
    if off:  # the CLS query: bias 0 to every key
        cls_out = F.scaled_dot_product_attention(q[:, :, :off], k, v, dropout_p=dropout_p)
        if result is not None:
            result[:, :, :off] = cls_out
    if result is not None:
        return result
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
    return torch.cat([cls_out, out], dim=2) if off else out


# ----------------------------------------------------------------------------------------
# flex_attention
# ----------------------------------------------------------------------------------------
def flex_available() -> bool:
    """Whether ``torch.nn.attention.flex_attention`` can be imported."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:  # pragma: no cover - depends on the torch build
        return False
    return True


def tile_order(grid_size: Tuple[int, int], cls_token: bool,
               tile: Tuple[int, int] = (8, 16), device=None) -> Tensor:
    """The token order flex runs in: patches tile by tile, the CLS token last.

    In the model's row-major order a block of 128 tokens is a stripe of whole grid rows,
    so a head that looks up-left skips only the tiles below (about half); in tile order
    a block is an ``8 x 16`` patch of the grid and the same head skips about 3/4 of the
    tiles (a 45-degree head about 7/8). The CLS token goes last so that the patch tiles
    stay aligned to flex's 128-token blocks.

    Args:
        grid_size: ``(H, W)``.
        cls_token: the model's sequence starts with a CLS token.
        tile: ``(th, tw)`` of one block (``th * tw`` should be the flex block, 128).
        device: where the result lives.

    Returns:
        int64 ``(T,)``: position in flex order -> index in the model's order.
    """
    height, width = grid_size
    th, tw = tile
    y = torch.arange(height, device=device)[:, None].expand(height, width)
    x = torch.arange(width, device=device)[None, :].expand(height, width)
    tiles_per_row = -(-width // tw)
    rank = (((y // th) * tiles_per_row + x // tw) * (th * tw)
            + (y % th) * tw + x % tw).flatten()
    order = rank.argsort() + int(cls_token)
    if cls_token:
        order = torch.cat([order, order.new_zeros(1)])
    return order


def _flex_index(grid_size: Tuple[int, int], cls_token: bool, order: Optional[Tensor] = None
                ) -> Callable[[Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]]:
    """``(q_idx, kv_idx) -> (is_cls, table_index, key_patch)`` for flex callbacks.

    ``q_idx``/``kv_idx`` are positions in ``order`` (:func:`tile_order`; None: the
    model's order). ``table_index`` indexes a flattened ``(2H-1) * (2W-1)`` table;
    indices are clamped so that CLS pairs and the padding of a ragged last tile stay in
    range.
    """
    height, width = grid_size
    off = int(cls_token)
    table_len = (2 * height - 1) * (2 * width - 1)
    num_patches = height * width
    total = num_patches + off

    def index(q_idx: Tensor, kv_idx: Tensor):
        if order is not None:
            q_idx = order[q_idx.clamp(0, total - 1)]
            kv_idx = order[kv_idx.clamp(0, total - 1)]
        qp = q_idx - off
        kp = kv_idx - off
        is_cls = (qp < 0) | (kp < 0)
        qp = qp.clamp(0, num_patches - 1)
        kp = kp.clamp(0, num_patches - 1)
        t = ((kp // width - qp // width + height - 1) * (2 * width - 1)
             + (kp % width - qp % width + width - 1))
        return is_cls, t.clamp(0, table_len - 1), kp

    return index


def flex_score_mod(grid_bias: GridBias, layer: int, cls_token: bool,
                   order: Optional[Tensor] = None) -> Callable:
    """A flex ``score_mod`` adding layer ``layer``'s LookHere bias from the table.

    The bias is read from the flattened ``(heads, (2H-1)(2W-1))`` table (float32) at the
    pair's relative offset, plus the per-key term of ``center`` heads; CLS pairs get 0.
    ``order``: the token order of the flex call (:func:`tile_order`), None: the model's.
    """
    index = _flex_index(grid_bias.grid_size, cls_token, order)
    table = grid_bias.table[layer].float().flatten(1).contiguous()
    key_term = (None if grid_bias.key_term is None
                else grid_bias.key_term[layer].float().contiguous())

    def score_mod(score, b, h, q_idx, kv_idx):
        is_cls, t, kp = index(q_idx, kv_idx)
        bias = table[h, t]
        if key_term is not None:
            bias = bias + key_term[h, kp]
        return torch.where(is_cls, score, score + bias)

    return score_mod


def flex_mask_mod(grid_bias: GridBias, layer: int, cls_token: bool,
                  order: Optional[Tensor] = None) -> Callable:
    """A flex ``mask_mod``: True where layer ``layer``'s heads see the key (positions in
    ``order``, None: the model's order)."""
    index = _flex_index(grid_bias.grid_size, cls_token, order)
    visible = grid_bias.visible[layer].flatten(1).contiguous()

    def mask_mod(b, h, q_idx, kv_idx):
        is_cls, t, _ = index(q_idx, kv_idx)
        return is_cls | visible[h, t]

    return mask_mod


def _ordered(blocks: Tensor) -> Tuple[Tensor, Tensor]:
    """``(..., nQ, nK)`` bool tiles -> (count per row, column indices, tiles first), int32."""
    as_int = blocks.to(torch.int32)
    return (as_int.sum(-1).to(torch.int32),
            torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32))


def lookhere_block_mask(grid_bias: GridBias, layer: int, cls_token: bool,
                        block: int = FLEX_BLOCK, order: Optional[Tensor] = None):
    """The flex ``BlockMask`` of layer ``layer``'s fields of view, built tile row by tile row.

    For every tile row of ``block`` queries the ``(heads, block, T)`` visibility is read
    from the boolean relative table (no ``(heads, T, T)`` mask, no compilation) and
    reduced to "some key visible" (partial tile) and "all keys visible" (full tile, no
    ``mask_mod`` call needed); tiles with no visible key are skipped by the kernel.
    Equal to ``create_block_mask(flex_mask_mod(..., order), None, heads, T, T)``.

    Args:
        order: token order of the flex call (:func:`tile_order`); None: the model's.

    Returns:
        A ``BlockMask`` for ``(B=1 broadcast, heads, T, T)``, or None when every head
        sees every key (nothing to skip).
    """
    visible = grid_bias.visible[layer]
    if bool(visible.all()):
        return None
    from torch.nn.attention.flex_attention import BlockMask
    height, width = grid_bias.grid_size
    off = int(cls_token)
    heads = visible.shape[0]
    total = grid_bias.num_patches + off
    flat = visible.flatten(1)
    tokens = (torch.arange(total, device=visible.device) if order is None
              else order.to(visible.device))
    k_cls = tokens < off
    kp = (tokens - off).clamp(min=0)
    ky, kx = kp // width, kp % width
    n_tiles = math.ceil(total / block)
    buf = torch.zeros(heads, block, n_tiles * block, dtype=torch.bool, device=visible.device)
    partial = torch.zeros(heads, n_tiles, n_tiles, dtype=torch.bool, device=visible.device)
    full = torch.zeros_like(partial)
    for i in range(n_tiles):
        s, e = i * block, min(total, (i + 1) * block)
        qy, qx, q_cls = ky[s:e, None], kx[s:e, None], k_cls[s:e, None]
        t = (ky - qy + height - 1) * (2 * width - 1) + (kx - qx + width - 1)  # (Q, T)
        buf[:, :e - s, :total] = flat[:, t] | (q_cls | k_cls)
        if e - s < block:
            buf[:, e - s:] = False  # padding rows of the ragged last tile
        tiles = buf.view(heads, block, n_tiles, block)
        full[:, i] = tiles.all(dim=3).all(dim=1)
        partial[:, i] = tiles.any(dim=3).any(dim=1) & ~full[:, i]
    kv_num, kv_idx = _ordered(partial[None])
    full_num, full_idx = _ordered(full[None])
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block,
                                    mask_mod=flex_mask_mod(grid_bias, layer, cls_token, order),
                                    seq_lengths=(total, total))


_compiled_flex = None


def _flex_fn(compiled: bool) -> Callable:
    """``flex_attention``, eager or ``torch.compile``-d (compiled once per process)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention
    if not compiled:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_attention_lookhere(q: Tensor, k: Tensor, v: Tensor, grid_bias: GridBias,
                            layer: int, cls_token: bool, block_mask=None,
                            compiled: Optional[bool] = None,
                            score_mod: Optional[Callable] = None,
                            order: Optional[Tensor] = None) -> Tensor:
    """LookHere attention through ``flex_attention`` (fused and tile-skipping when compiled).

    Args:
        q, k, v: ``(B, heads, T, d)``.
        grid_bias: tables of the grid.
        layer: which layer's table to use.
        cls_token: token 0 is a CLS token.
        block_mask: a ``BlockMask`` from :func:`lookhere_block_mask` (optional: without it
            no tile is skipped, the result is the same).
        compiled: run the ``torch.compile``-d kernel. Default: on CUDA only (eager flex
            materialises the scores; it is kept for CPU tests of the callbacks). Compiled
            flex also runs on CPU (slow to compile, ~15-30 s per shape).
        score_mod: a cached :func:`flex_score_mod` for this layer (built if None).
        order: run flex in this token order (:func:`tile_order`): ``q, k, v`` are
            permuted before and the output back after; ``block_mask`` and ``score_mod``
            must be built for the same order. None: the model's order.

    Returns:
        ``(B, heads, T, d)``.
    """
    if compiled is None:
        compiled = q.is_cuda
    fn = _flex_fn(compiled)
    if score_mod is None:
        score_mod = flex_score_mod(grid_bias, layer, cls_token, order)
    if order is not None:
        q, k, v = (t.index_select(2, order) for t in (q, k, v))
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')
        out = fn(q, k, v, score_mod=score_mod, block_mask=block_mask)
    if order is not None:
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        out = out.index_select(2, inverse)
    return out


# ----------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------
class LookHereAttentionEngine:
    """LookHere attention for one model: bias caches and backend choice.

    Args:
        config: the LookHere configuration.
        depth: number of layers that ask for a bias (layer index ``0..depth-1``).
        num_heads: heads per layer.
        backend: one of :data:`BACKENDS`. ``auto`` uses ``sdpa`` with cached dense biases
            when the dense biases of all layers for the grid fit in ``max_dense_mb``, else
            ``flex`` on CUDA (without attention dropout) and ``chunked`` elsewhere.
            Default: ``'auto'``.
        block_size: query rows per block of the ``chunked`` backend; None or 0 sizes
            blocks automatically (:func:`auto_block_rows`). Default: None.
        max_dense_mb: budget for the cached dense biases (all layers, all grids; also the
            byte bound of that cache). Default: 1024.
        cache_size: grids / windows kept per cache (times ``depth`` for per-layer
            entries). Default: 4.
        flex_compile: compile ``flex_attention``; None: on CUDA only. Default: None.
        flex_tiles: run flex in tile order (:func:`tile_order`), where directed heads skip
            more tiles; False: the model's row-major order. Default: True.
    """

    def __init__(self, config: LookHereConfig, depth: int, num_heads: int,
                 backend: str = 'auto', block_size: Optional[int] = None,
                 max_dense_mb: float = 1024, cache_size: int = 4,
                 flex_compile: Optional[bool] = None, flex_tiles: bool = True):
        if backend not in BACKENDS:
            raise ValueError(f'unknown LookHere attention backend {backend!r}; '
                             f'allowed: {list(BACKENDS)}')
        if block_size is not None and (not isinstance(block_size, int) or block_size < 0):
            raise ValueError(f'block_size must be None or an int >= 0 (0: automatic), '
                             f'got {block_size!r}')
        if max_dense_mb < 0:
            raise ValueError(f'max_dense_mb must be >= 0, got {max_dense_mb}')
        config.validate(num_heads, depth)
        self.config = config
        self.depth = depth
        self.num_heads = num_heads
        self.backend = backend
        self.block_size = block_size or None
        self.max_dense_bytes = max_dense_mb * 2 ** 20
        self.flex_compile = flex_compile
        self.flex_tiles = flex_tiles
        #: relative tables per (grid, device, dtype)
        self.tables = BoundedCache(2 * cache_size)
        #: dense (heads, T, T) biases per (layer, grid, cls, device, dtype): global layers'
        #: and window-sized ones (a window's bias is the dense bias of a (ws, ws) grid),
        #: plus window padding masks under ('window_pad', grid, ws, cls, device, dtype)
        self.dense = BoundedCache(cache_size * (depth + 1), max_bytes=self.max_dense_bytes)
        #: flex block masks per (head string, grid, cls, device): shared across layers
        self.block_masks = BoundedCache(cache_size * max(1, len(config.direction_strings)))
        #: flex score_mods per (layer, grid, cls, device): one function object per layer
        self.score_mods = BoundedCache(cache_size * depth)
        #: flex token orders per (grid, cls, device)
        self.orders = BoundedCache(cache_size)
        self.last_backend: Optional[str] = None
        self._flex_failed = False

    def _caches(self) -> Dict[str, BoundedCache]:
        return dict(tables=self.tables, dense=self.dense, block_masks=self.block_masks,
                    score_mods=self.score_mods, orders=self.orders)

    def reset(self, config: Optional[LookHereConfig] = None) -> None:
        """Drop all caches (and switch to ``config`` if given)."""
        if config is not None:
            config.validate(self.num_heads, self.depth)
            self.config = config
        for cache in self._caches().values():
            cache.clear()

    def cache_info(self) -> Dict[str, Dict[str, int]]:
        """Per cache: ``size``, ``hits``, ``misses``, ``evictions``, ``bytes``."""
        return {name: cache.stats() for name, cache in self._caches().items()}

    # -- cached pieces -------------------------------------------------------------------
    def grid_bias(self, grid_size: Tuple[int, int], device: torch.device,
                  dtype: torch.dtype = torch.float32) -> GridBias:
        """Relative tables of every layer for ``grid_size`` on ``device`` in ``dtype``.

        Each dtype's tables are cast once from the float64 construction (bf16-rounded
        biases are exact in bfloat16 and float32).
        """
        key = (tuple(grid_size), str(device), dtype)
        return self.tables.get_or_create(key, lambda: build_grid_bias(
            self.config, tuple(grid_size), self.depth, self.num_heads, device=device,
            dtype=dtype))

    def dense_bias(self, layer: int, grid_size: Tuple[int, int], cls_token: bool,
                   device: torch.device, dtype: torch.dtype) -> Tensor:
        """The ``(heads, T, T)`` bias of ``layer`` in ``dtype``, built once per grid
        (unless it alone exceeds ``max_dense_mb``)."""
        key = (layer, tuple(grid_size), cls_token, str(device), dtype)
        return self.dense.get_or_create(key, lambda: self.grid_bias(
            grid_size, device, dtype).dense(layer, cls_token))

    def window_bias(self, layer: int, window_size: int, cls_token: bool,
                    device: torch.device, dtype: torch.dtype) -> Tensor:
        """The ``(heads, T_w, T_w)`` bias of a ``window_size`` x ``window_size`` window
        (the dense bias of a window-sized grid, cached like one)."""
        ws = int(window_size)
        return self.dense_bias(layer, (ws, ws), cls_token, device, dtype)

    def block_mask(self, layer: int, grid_size: Tuple[int, int], cls_token: bool,
                   device: torch.device):
        """The flex ``BlockMask`` of ``layer``'s fields of view (shared by all layers with
        the same head string), or None when nothing is blocked."""
        direction = self.config.layer_direction(layer)
        key = (direction, tuple(grid_size), cls_token, str(device))
        return self.block_masks.get_or_create(key, lambda: lookhere_block_mask(
            self.grid_bias(grid_size, device), layer, cls_token,
            order=self.flex_order(grid_size, cls_token, device)))

    def score_mod(self, layer: int, grid_size: Tuple[int, int], cls_token: bool,
                  device: torch.device) -> Callable:
        """The flex ``score_mod`` of ``layer`` (the same function object on every call)."""
        key = (layer, tuple(grid_size), cls_token, str(device))
        return self.score_mods.get_or_create(key, lambda: flex_score_mod(
            self.grid_bias(grid_size, device), layer, cls_token,
            self.flex_order(grid_size, cls_token, device)))

    def flex_order(self, grid_size: Tuple[int, int], cls_token: bool,
                   device: torch.device) -> Optional[Tensor]:
        """The token order flex runs in (:func:`tile_order`), or None (``flex_tiles=False``)."""
        if not self.flex_tiles:
            return None
        key = (tuple(grid_size), cls_token, str(device))
        return self.orders.get_or_create(key, lambda: tile_order(
            tuple(grid_size), cls_token, device=device))

    def choose_backend(self, tokens: int, device: torch.device,
                       dtype: torch.dtype = torch.float32, dropout_p: float = 0.0) -> str:
        """The backend ``auto`` picks for a sequence of ``tokens`` on ``device``.

        ``sdpa`` (cached dense biases, the fastest where they fit) when all layers' dense
        biases in ``dtype`` fit in ``max_dense_mb``; otherwise ``flex`` on CUDA (unless
        attention dropout is on, or flex failed before) and ``chunked`` elsewhere.
        """
        if self.backend != 'auto':
            return self.backend
        itemsize = torch.empty((), dtype=dtype).element_size()
        dense_bytes = self.depth * self.num_heads * tokens * tokens * itemsize
        if dense_bytes <= self.max_dense_bytes:
            return 'sdpa'
        if (torch.device(device).type == 'cuda' and dropout_p == 0 and flex_available()
                and not self._flex_failed):
            return 'flex'
        return 'chunked'

    # -- attention -----------------------------------------------------------------------
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, layer: int,
                 grid_size: Tuple[int, int], cls_token: bool, dropout_p: float = 0.0,
                 backend: Optional[str] = None) -> Tensor:
        """Attention of ``layer`` for ``q, k, v`` of shape ``(B, heads, T, d)``.

        ``T`` must be ``H*W`` (+1 with ``cls_token``) for ``grid_size = (H, W)``.

        Returns:
            ``(B, heads, T, d)``.
        """
        n = grid_size[0] * grid_size[1] + int(cls_token)
        if q.shape[-2] != n or k.shape[-2] != n:
            raise ValueError(f'attention got {q.shape[-2]} tokens but grid {tuple(grid_size)} '
                             f'{"with" if cls_token else "without"} CLS needs {n}')
        if q.shape[1] != self.num_heads:
            raise ValueError(f'attention got {q.shape[1]} heads, the LookHere config was '
                             f'built for {self.num_heads}')
        if not 0 <= layer < self.depth:
            raise ValueError(f'layer {layer} out of range for depth {self.depth}')
        chosen_by_auto = backend is None and self.backend == 'auto'
        backend = backend or self.choose_backend(n, q.device, q.dtype, dropout_p)
        if backend not in BACKENDS or backend == 'auto':
            raise ValueError(f'unknown LookHere attention backend {backend!r}; '
                             f'allowed: {list(BACKENDS[1:])}')
        self.last_backend = backend
        if backend in ('reference', 'sdpa'):
            bias = self.dense_bias(layer, grid_size, cls_token, q.device, q.dtype)
            fn = reference_attention if backend == 'reference' else sdpa_attention
            return fn(q, k, v, bias, dropout_p)
        if backend == 'chunked':
            return chunked_attention(q, k, v, self.grid_bias(grid_size, q.device, q.dtype),
                                     layer, cls_token, self.block_size, dropout_p)
        if dropout_p > 0:
            raise ValueError('the flex backend has no attention dropout; set attn_drop_rate=0 '
                             "or use backend 'chunked'/'sdpa'")
        if q.device.type == 'cpu' and torch.is_grad_enabled() and any(
                t.requires_grad for t in (q, k, v)):
            raise ValueError("attn_backend='flex' cannot train on CPU (PyTorch's "
                             'flex_attention has no CPU backward); use attn_backend='
                             "'auto' or 'chunked' there, or run under torch.no_grad()")
        try:
            mask = self.block_mask(layer, grid_size, cls_token, q.device)
            mod = self.score_mod(layer, grid_size, cls_token, q.device)
            return flex_attention_lookhere(q, k, v, self.grid_bias(grid_size, q.device),
                                           layer, cls_token, mask, self.flex_compile, mod,
                                           self.flex_order(grid_size, cls_token, q.device))
        except Exception as err:  # pragma: no cover - compile problems are platform specific
            if not chosen_by_auto:
                raise
            self._flex_failed = True
            self.last_backend = 'chunked'
            warnings.warn(f'LookHere flex attention failed ({type(err).__name__}: {err}); '
                          'falling back to the chunked backend for this model')
            return chunked_attention(q, k, v, self.grid_bias(grid_size, q.device, q.dtype),
                                     layer, cls_token, self.block_size, dropout_p)

    def window_attention(self, q: Tensor, k: Tensor, v: Tensor, layer: int,
                         grid_size: Tuple[int, int], window_size: int, cls_token: bool,
                         dropout_p: float = 0.0) -> Tensor:
        """ViTDet-style window attention with the LookHere bias of a window-sized grid.

        Patches attend within their ``window_size`` x ``window_size`` window (grids that
        are not a multiple are padded; padded keys are masked out, so a border window acts
        like a smaller one). The window bias is the bias of a ``(ws, ws)`` grid, the same
        for every window, built once per (window size, layer) and cached.

        With ``cls_token`` the CLS token keeps LookHere's global behaviour: every window
        also sees the CLS key (bias 0), and the CLS query attends to all tokens (bias 0),
        exactly as in a global block.

        Windows run as one 4-D batch ``(B * nWin, heads, T_w, d)`` (with padding: one
        call per image, as the padding mask differs per window).

        Args:
            q, k, v: ``(B, heads, T, d)``, ``T = H*W (+1)``.

        Returns:
            ``(B, heads, T, d)``.
        """
        ws = int(window_size)
        window_bias = self.window_bias(layer, ws, cls_token, q.device, q.dtype)
        pad = None
        if padded_grid(grid_size, ws) != tuple(grid_size):
            key = ('window_pad', tuple(grid_size), ws, cls_token, str(q.device), q.dtype)
            pad = self.dense.get_or_create(key, lambda: window_key_mask(
                grid_size, ws, cls_token, q.device, q.dtype))

        def attend(qw: Tensor, kw: Tensor, vw: Tensor) -> Tensor:
            batch, n_win = qw.shape[:2]
            if pad is not None:
                mask = window_bias + pad  # (nWin, heads, T_w, T_w)
                return torch.stack([F.scaled_dot_product_attention(
                    qw[i], kw[i], vw[i], attn_mask=mask, dropout_p=dropout_p)
                    for i in range(batch)])
            out = F.scaled_dot_product_attention(
                qw.flatten(0, 1), kw.flatten(0, 1), vw.flatten(0, 1),
                attn_mask=window_bias.unsqueeze(0), dropout_p=dropout_p)
            return out.view(batch, n_win, *out.shape[1:])

        return attend_in_windows(q, k, v, grid_size, ws, cls_token, attend, dropout_p)
