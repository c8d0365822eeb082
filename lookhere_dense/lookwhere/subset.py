"""Attention over an arbitrary subset of patches: the LookHere bias built from the kept
patches' coordinates.

LookHere's bias of a query and a key depends only on their offset ``(dy, dx)`` on the
patch grid (plus, for ``center`` heads, on the key's distance from the grid centre), so the
bias of any gathered set of patches is a gather of the grid's relative-offset table
(:func:`lookhere_dense.lookhere.bias.pair_index`, the one statement of the token-pair ->
table-entry map) at the kept patches' coordinates: no interpolated position table, no
re-indexing of the sparse set into a smaller grid.

The fast backends of :class:`~lookhere_dense.lookhere.LookHereAttentionEngine`
(``fused``, ``tiled``, ``chunked``, ``flex``) walk tiles and rows of a
*full* grid; a gathered, non-grid token set has neither, so :class:`SubsetAttention`
falls back explicitly to a dense ``(B, heads, T, T)`` bias built from the coordinates and
``F.scaled_dot_product_attention`` (``last_backend = 'sdpa-coords'``), or, when that bias
would exceed ``max_dense_bias_mb``, to the same per block of query rows with the block's
bias built from the coordinates when it runs (:func:`chunked_subset_attention`,
``last_backend = 'chunked-coords'``: the peak is bounded by the block). When the kept set
is the whole grid in row-major order it hands the call to the trunk's own encoding
(``last_backend = 'engine:<name>'``), i.e. to the fast backends. Torch alone.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..lookhere.bias import num_prefix_tokens, pair_index
from ..lookhere.prefix_tokens import check_tokens

__all__ = [
    'subset_bias',
    'subset_index',
    'chunked_subset_attention',
    'auto_subset_block_rows',
    'SubsetAttention',
    'SUBSET_ENCODINGS',
    'SUBSET_BACKENDS',
    'is_full_grid',
]

#: trunk encodings the subset path supports: the LookHere bias from coordinates
#: (``lookhere``, ``alibi2d``) and encodings that put positions into the tokens before the
#: gather (``abs``) or have none (``none``)
SUBSET_ENCODINGS = ('lookhere', 'alibi2d', 'abs', 'none')
#: the attention paths of :class:`SubsetAttention` (``backend``)
SUBSET_BACKENDS = ('auto', 'coords', 'sdpa-coords', 'chunked-coords')
#: the largest dense bias of one layer (MiB) that ``auto`` / ``coords`` build whole: 12
#: heads at ``K = 2048`` (k_ratio 0.25 of 1024x2048 at patch 16) take 201 MB in float32,
#: at ``K = 4096`` 805 MB (then the chunked path)
DEFAULT_MAX_DENSE_BIAS_MB = 256.0


def subset_index(
    grid_size: Tuple[int, int],
    keep: Tensor,
    num_prefix: int = 0,
    rows: Optional[Tuple[int, int]] = None,
    out: Optional[Tensor] = None,
) -> Tensor:
    """The flat index of every token pair of ``[J prefix, K kept patches]`` into a
    relative-offset table with one extra zero slot at its end (for the pairs with a prefix
    token, which carry no bias).

    :func:`~lookhere_dense.lookhere.bias.pair_index` is ``g(key) - g(query) + c``, linear
    in the two patches, so the ``(K, K)`` block is one broadcast subtraction of the kept
    patches' ``pair_index`` from patch 0 (cheaper than the index of every pair).

    Args:
        grid_size: ``(H, W)``.
        keep: ``(B, K)`` kept patch indices (row-major).
        num_prefix: ``J``. Default: 0.
        rows: ``(start, stop)``: only the query rows ``start <= t < stop`` of the
            ``J + K`` tokens (one block of :func:`chunked_subset_attention`). Default:
            None (every row).
        out: a contiguous 1-D int64 tensor of at least ``B * R * (J + K)`` elements to
            write into (its start; one buffer for every block and layer saves the page
            faults of a fresh one). Default: None (a new one).

    Returns:
        ``(B, R * (J + K))`` int64 in ``[0, (2H-1) * (2W-1)]`` with ``R`` the rows
        (``J + K`` by default); the last value is the zero slot.
    """
    height, width = grid_size
    zero_slot = (2 * height - 1) * (2 * width - 1)
    j = num_prefix_tokens(num_prefix)
    b, k = keep.shape
    start, stop = _check_rows(rows, j + k)
    origin = torch.zeros((), dtype=keep.dtype, device=keep.device)
    from_origin = pair_index(grid_size, origin, keep)  # (B, K): g(k) + c
    to_origin = from_origin - pair_index(grid_size, origin, origin)  # g(q)
    p0, p1 = max(start - j, 0), max(stop - j, 0)  # the block's patch query rows
    shape = (b, stop - start, j + k)
    if out is None:
        index = keep.new_empty(shape)
    elif out.dim() != 1 or out.dtype != torch.int64 or out.numel() < math.prod(shape):
        raise ValueError(
            f'out must be a 1-D int64 tensor of at least {math.prod(shape)} elements, got '
            f'{tuple(out.shape)} {out.dtype}'
        )
    else:
        index = out[: math.prod(shape)].view(shape)
    first = stop - start - (p1 - p0)  # prefix query rows come first
    index[:, :first] = zero_slot
    index[:, first:, :j] = zero_slot
    # (B, P, K) = pair_index of the block's patch queries and every kept key
    torch.sub(from_origin[:, None, :], to_origin[:, p0:p1, None], out=index[:, first:, j:])
    return index.flatten(1)


def _check_rows(rows: Optional[Tuple[int, int]], tokens: int) -> Tuple[int, int]:
    """``rows`` as ``(start, stop)`` within ``[0, tokens]`` (None: every row)."""
    if rows is None:
        return 0, tokens
    start, stop = (int(r) for r in rows)
    if not 0 <= start <= stop <= tokens:
        raise ValueError(f'rows={tuple(rows)} is not a block (start, stop) of the {tokens} tokens')
    return start, stop


def subset_bias(
    table: Tensor,
    grid_size: Tuple[int, int],
    keep: Tensor,
    num_prefix: int = 0,
    key_term: Optional[Tensor] = None,
    index: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
    rows: Optional[Tuple[int, int]] = None,
) -> Tensor:
    """The LookHere bias among the kept patches, from their coordinates on the grid.

    One contiguous 1-D gather per (image, head) straight into the output (the table with
    a zero slot appended for the prefix pairs), the cheapest way found on CPU: a gather
    over the 2-D ``(heads, entries)`` table into a block of a zero-filled output was 4-5x
    slower (``docs/lookwhere.md``).

    Args:
        table: ``(heads, 2H-1, 2W-1)``, one layer's relative-offset table
            (:attr:`~lookhere_dense.lookhere.bias.GridBias.table` ``[layer]``).
        grid_size: ``(H, W)`` of the full patch grid the coordinates live on.
        keep: ``(B, K)`` int64 kept patches, row-major indices ``y * W + x`` (any order).
        num_prefix: ``J`` global prefix tokens in front of the kept patches (0 to and from
            them). Default: 0.
        key_term: optional ``(heads, H*W)`` per-key term of ``center`` heads. Default: None.
        index: :func:`subset_index` of ``keep``, ``num_prefix`` and ``rows``, when
            already computed (it is the same for every layer). Default: None.
        out: a contiguous ``(B, heads, R, J + K)`` tensor of ``table``'s dtype to
            write into (reusing one buffer for every layer saves the page faults of a
            fresh one, about as costly as the gather on CPU); not used when ``table``
            records gradients (learnable slopes: a differentiable gather instead).
            Default: None (a new one).
        rows: ``(start, stop)``: only these query rows of the ``J + K`` tokens
            (``R = stop - start``). Default: None (every row, ``R = J + K``).

    Returns:
        ``(B, heads, R, J + K)`` in ``table``'s dtype (``-inf`` where a head cannot see).
    """
    height, width = grid_size
    if keep.dim() != 2:
        raise ValueError(f'keep must be (B, K) patch indices, got shape {tuple(keep.shape)}')
    if table.dim() != 3 or tuple(table.shape[1:]) != (2 * height - 1, 2 * width - 1):
        raise ValueError(
            f'table of shape {tuple(table.shape)} is not (heads, {2 * height - 1}, '
            f'{2 * width - 1}) for grid {tuple(grid_size)}'
        )
    b, k = keep.shape
    heads = table.shape[0]
    j = num_prefix_tokens(num_prefix)
    start, stop = _check_rows(rows, j + k)
    if index is None:
        index = subset_index(grid_size, keep, j, rows)
    if tuple(index.shape) != (b, (stop - start) * (j + k)):
        raise ValueError(
            f'index of shape {tuple(index.shape)} is not the subset_index (B={b}, '
            f'{(stop - start) * (j + k)}) of {k} kept patches, {j} prefix tokens and query '
            f'rows {start}..{stop}'
        )
    flat = torch.cat([table.flatten(1), table.new_zeros(heads, 1)], 1)  # + the zero slot
    shape = (b, heads, stop - start, j + k)
    if out is not None and (
        tuple(out.shape) != shape or out.dtype != table.dtype or not out.is_contiguous()
    ):
        raise ValueError(
            f'out must be a contiguous {shape} {table.dtype} tensor, got '
            f'{tuple(out.shape)} {out.dtype}'
        )
    if torch.is_grad_enabled() and table.requires_grad:  # learnable slopes: differentiable
        out = torch.stack([flat.index_select(1, index[i]) for i in range(b)]).view(shape)
    else:
        out = table.new_empty(shape) if out is None else out
        for i in range(b):
            for h in range(heads):
                torch.index_select(flat[h], 0, index[i], out=out[i, h].view(-1))
    if key_term is not None:  # on the patch query rows, at the patch keys
        first = max(j - start, 0)
        out[:, :, first:, j:] += key_term[:, keep].transpose(0, 1)[:, :, None, :]
    return out


def auto_subset_block_rows(q: Tensor, block_mb: float = 64.0) -> int:
    """Query rows per block of :func:`chunked_subset_attention` when none is given: as many
    as keep the block's bias (``B x heads x rows x T`` in ``q``'s dtype) within
    ``block_mb`` MiB, at least 64 (the CPU kernel slows down on short query blocks: one
    lh180 layer at ``T = 2049``, 12 heads of 16 dims, took 1.42 s in blocks of 64 rows,
    0.86 s in blocks of 256 and 0.73 s with the dense bias; at ``T = 4097`` blocks of
    256-1024 rows took 2.6-2.8 s and the dense bias 2.9 s; 2 threads, shared CPU).

    Args:
        q: ``(B, heads, T, d)``.
        block_mb: the bias budget of one block in MiB. Default: 64.
    """
    batch, heads, total = q.shape[:3]
    per_row = batch * heads * total * q.element_size()
    return max(64, int(block_mb * 2**20 // max(per_row, 1)))


def _workspace(
    workspace: dict, name: str, numel: int, dtype: torch.dtype, device: torch.device
) -> Tensor:
    """A 1-D buffer of at least ``numel`` elements kept in ``workspace[name]``."""
    buf = workspace.get(name)
    if buf is None or buf.numel() < numel or buf.dtype != dtype or buf.device != device:
        buf = workspace[name] = torch.empty(numel, dtype=dtype, device=device)
    return buf


def chunked_subset_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor,
    grid_size: Tuple[int, int],
    keep: Tensor,
    num_prefix: int = 0,
    key_term: Optional[Tensor] = None,
    block_rows: Optional[int] = None,
    dropout_p: float = 0.0,
    recompute: Optional[bool] = None,
    workspace: Optional[dict] = None,
) -> Tensor:
    """Attention over the gathered tokens in blocks of query rows, each block's bias
    gathered from the coordinates when the block runs (:func:`subset_index` and
    :func:`subset_bias` with ``rows``), so the whole ``(B, heads, T, T)`` bias never
    exists: the peak is ``B x heads x block_rows x T`` floats (plus the block's index).

    Exactly what ``F.scaled_dot_product_attention(q, k, v, attn_mask=subset_bias(...))``
    computes, block by block. Without autograd one buffer holds every block's bias and the
    blocks are written straight into the result; with ``recompute`` (default: whenever
    autograd records, also for a table that requires grad: learnable slopes) each block
    runs under activation checkpointing, so the backward pass keeps no bias block either.

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = J + K``.
        table: ``(heads, 2H-1, 2W-1)``, the layer's relative-offset table.
        grid_size: ``(H, W)`` of the full grid.
        keep: ``(B, K)`` kept patch indices (any order).
        num_prefix: ``J``. Default: 0.
        key_term: optional ``(heads, H*W)`` per-key term of ``center`` heads. Default: None.
        block_rows: query rows per block; None or 0: :func:`auto_subset_block_rows`.
            Default: None.
        dropout_p: attention dropout. Default: 0.
        recompute: checkpoint each block. Default: when autograd records.
        workspace: a dict that keeps the block bias and index buffers between calls
            without autograd (one per layer of a forward: the page faults of fresh
            buffers cost about a third of the gather on CPU). Default: None.

    Returns:
        ``(B, heads, T, d)``.
    """
    check_subset_budget(0.0, block_rows)
    total = q.shape[-2]
    j = num_prefix_tokens(num_prefix)
    if total != j + keep.shape[1]:
        raise ValueError(
            f'chunked subset attention: {total} tokens are not {j} prefix + {keep.shape[1]} kept'
        )
    records = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, v, table, key_term)
    )
    if recompute is None:
        recompute = records
    table = table.to(q.dtype)
    key_term = None if key_term is None else key_term.to(q.dtype)
    rows = max(1, min(block_rows or auto_subset_block_rows(q), total))
    b, heads = q.shape[:2]
    buffer = index_buffer = None
    if not records:  # (with autograd SDPA keeps each block's mask: no reuse)
        ws = {} if workspace is None else workspace
        buffer = _workspace(ws, 'bias', b * heads * rows * total, table.dtype, q.device)
        index_buffer = _workspace(ws, 'index', b * rows * total, torch.int64, q.device)
    result = None if records else q.new_empty(*q.shape[:-1], v.shape[-1])

    def block(start: int, stop: int, q_blk: Tensor, k_all: Tensor, v_all: Tensor) -> Tensor:
        shape = (b, heads, stop - start, total)
        out = None if buffer is None else buffer[: math.prod(shape)].view(shape)
        index = subset_index(grid_size, keep, j, (start, stop), index_buffer)
        bias = subset_bias(table, grid_size, keep, j, key_term, index, out, (start, stop))
        return F.scaled_dot_product_attention(
            q_blk, k_all, v_all, attn_mask=bias, dropout_p=dropout_p
        )

    blocks = []
    for start in range(0, total, rows):
        stop = min(total, start + rows)
        args = (start, stop, q[:, :, start:stop], k, v)
        if recompute:
            blocks.append(checkpoint(block, *args, use_reentrant=False))
        elif result is None:
            blocks.append(block(*args))
        else:
            result[:, :, start:stop] = block(*args)
    if result is not None:
        return result
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)


def check_subset_budget(max_dense_bias_mb: float, block_rows: Optional[int]) -> None:
    """A clear error for a bad ``max_dense_bias_mb`` (a number >= 0) or ``block_rows``
    (None or an int >= 0)."""
    if (
        isinstance(max_dense_bias_mb, bool)
        or not isinstance(max_dense_bias_mb, (int, float))
        or not max_dense_bias_mb >= 0  # also NaN
    ):
        raise ValueError(f'max_dense_bias_mb must be a number >= 0, got {max_dense_bias_mb!r}')
    if block_rows is not None and (
        isinstance(block_rows, bool) or not isinstance(block_rows, int) or block_rows < 0
    ):
        raise ValueError(
            f'block_rows must be None or an int >= 0 (0: automatic), got {block_rows!r}'
        )


def is_full_grid(keep: Tensor, num_patches: int) -> bool:
    """Whether every row of ``keep`` ``(B, K)`` is ``0, 1, ..., N-1`` (the whole grid in
    row-major order)."""
    if keep.shape[1] != num_patches:
        return False
    return bool((keep == torch.arange(num_patches, device=keep.device)).all())


class SubsetAttention:
    """A trunk's position encoding, restricted to a gathered set of patches.

    Called by the trunk's blocks like the encoding itself
    (``pos_enc(q, k, v, layer, grid, cls_token, dropout_p)``; ``grid`` is the full grid
    the kept coordinates live on). For ``lookhere`` / ``alibi2d`` the bias of every layer
    is gathered from the engine's relative tables at the kept coordinates (at the
    learnable slopes' current values when the encoding has them), either whole
    (:func:`subset_bias` + SDPA, ``'sdpa-coords'``) or per block of query rows
    (:func:`chunked_subset_attention`, ``'chunked-coords'``: bounded memory); ``abs``
    added its positions to the tokens before the gather and ``none`` has none, so those
    attend without a bias.

    Args:
        pos_enc: the trunk's ``pos_enc``.
        keep: ``(B, K)`` kept patch indices on ``grid_size``.
        grid_size: ``(H, W)``.
        backend: one of :data:`SUBSET_BACKENDS`: ``'auto'`` (the trunk's own engine when
            ``keep`` is the full grid in order, else the coordinates as ``'coords'``),
            ``'coords'`` (always the coordinates: the dense bias while one layer's
            ``(B, heads, J + K, J + K)`` bias fits ``max_dense_bias_mb``, else the
            chunked path), ``'sdpa-coords'`` (always the dense bias) or
            ``'chunked-coords'`` (always the chunked path). Default: ``'auto'``.
        max_dense_bias_mb (float): the largest dense bias of one layer (MiB, in the
            attention's dtype) that ``auto`` / ``coords`` build whole; with autograd
            every layer's is kept for the backward pass. Default: 256.
        block_rows (int, optional): query rows per block of the chunked path; None:
            :func:`auto_subset_block_rows`. Default: None.

    Attributes:
        last_backend (str): what the last call ran: ``'sdpa-coords'`` (dense bias from
            coordinates + SDPA), ``'chunked-coords'`` (the same per block of query
            rows), ``'sdpa'`` (no bias) or ``'engine:<backend>'`` (the full grid, the
            trunk's engine).
    """

    uses_tokens = False

    def __init__(
        self,
        pos_enc,
        keep: Tensor,
        grid_size: Tuple[int, int],
        backend: str = 'auto',
        max_dense_bias_mb: float = DEFAULT_MAX_DENSE_BIAS_MB,
        block_rows: Optional[int] = None,
    ):
        if backend not in SUBSET_BACKENDS:
            raise ValueError(
                f'subset attention backend must be one of {list(SUBSET_BACKENDS)}, got {backend!r}'
            )
        check_subset_budget(max_dense_bias_mb, block_rows)
        name = getattr(pos_enc, 'name', None)
        if name not in SUBSET_ENCODINGS:
            raise ValueError(
                f'LookWhere extractor: pos_encoding={name!r} cannot attend over a gathered '
                f'patch subset; supported: {list(SUBSET_ENCODINGS)} (LookHere / 2D-ALiBi '
                'build their bias from the kept coordinates, abs adds positions before the '
                'gather)'
            )
        self.pos_enc = pos_enc
        self.keep = keep
        self.grid_size = (int(grid_size[0]), int(grid_size[1]))
        self.backend = backend
        self.max_dense_bias_mb = float(max_dense_bias_mb)
        self.block_rows = block_rows
        self.full = backend == 'auto' and is_full_grid(keep, self.grid_size[0] * self.grid_size[1])
        self.last_backend: Optional[str] = None
        self._index: Optional[Tensor] = None  # subset_index, shared by all layers
        # reused buffers without autograd, for every layer: the dense bias ('dense') and
        # the chunked path's block bias and index ('bias', 'index')
        self._workspace: dict = {}

    def coords_path(self, q: Tensor) -> str:
        """``'sdpa-coords'`` or ``'chunked-coords'`` for queries ``q`` ``(B, heads, T, d)``:
        the backend's choice, or (``auto`` / ``coords``) the dense bias while its
        ``B x heads x T x T`` elements fit ``max_dense_bias_mb``."""
        if self.backend in ('sdpa-coords', 'chunked-coords'):
            return self.backend
        b, heads, t = q.shape[:3]
        mb = b * heads * t * t * q.element_size() / 2**20
        return 'sdpa-coords' if mb <= self.max_dense_bias_mb else 'chunked-coords'

    def _table(
        self, layer: int, device: torch.device, dtype: torch.dtype
    ) -> Tuple[Tensor, Optional[Tensor]]:
        """The layer's relative-offset table and per-key term (``center`` heads)."""
        engine = self.pos_enc.engine
        slopes = getattr(self.pos_enc, 'slopes', None)
        if slopes is None:
            gb = engine.grid_bias(self.grid_size, device, dtype)
            return gb.table[layer], None if gb.key_term is None else gb.key_term[layer]
        gb = engine.slope_bias(layer, self.grid_size, device, dtype, slopes)
        return gb.table[0], None if gb.key_term is None else gb.key_term[0]

    def _bias(self, table: Tensor, key: Optional[Tensor], prefix: int) -> Tensor:
        if self._index is None:
            self._index = subset_index(self.grid_size, self.keep, prefix)
        buffer = None
        if not torch.is_grad_enabled():  # SDPA's backward would keep the mask: no reuse then
            b, k = self.keep.shape
            shape = (b, table.shape[0], prefix + k, prefix + k)
            numel = math.prod(shape)
            flat = _workspace(self._workspace, 'dense', numel, table.dtype, table.device)
            buffer = flat[:numel].view(shape)
        return subset_bias(table, self.grid_size, self.keep, prefix, key, self._index, buffer)

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        tokens: Optional[Tensor] = None,
    ) -> Tensor:
        prefix = num_prefix_tokens(cls_token)
        kept = self.keep.shape[1]
        check_tokens(
            f'subset attention over {kept} kept patches',
            q.shape[-2],
            (1, kept),
            prefix,
            k.shape[-2],
        )
        if self.full:
            out = self.pos_enc(q, k, v, layer, self.grid_size, prefix, dropout_p)
            engine = getattr(self.pos_enc, 'engine', None)
            used = getattr(engine, 'last_backend', None) or 'sdpa'
            self.last_backend = f'engine:{used}'
            return out
        if self.pos_enc.name in ('abs', 'none'):
            self.last_backend = 'sdpa'
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
        table, key = self._table(layer, q.device, q.dtype)
        path = self.coords_path(q)
        self.last_backend = path
        if path == 'chunked-coords':
            return chunked_subset_attention(
                q,
                k,
                v,
                table,
                self.grid_size,
                self.keep,
                prefix,
                key,
                self.block_rows,
                dropout_p,
                workspace=self._workspace,
            )
        bias = self._bias(table, key, prefix)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)

    def window_attention(self, *args, **kwargs):
        raise ValueError(
            'LookWhere extractor: window attention (window_size > 0) is not defined on a '
            'gathered patch subset; use global blocks (window_size=0)'
        )
