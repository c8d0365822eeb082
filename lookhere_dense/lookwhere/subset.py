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
``F.scaled_dot_product_attention`` (``last_backend = 'sdpa-coords'``). When the kept set
is the whole grid in row-major order it hands the call to the trunk's own encoding
(``last_backend = 'engine:<name>'``), i.e. to the fast backends. Torch alone.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ..lookhere.bias import num_prefix_tokens, pair_index
from ..lookhere.prefix_tokens import check_tokens

__all__ = ['subset_bias', 'subset_index', 'SubsetAttention', 'SUBSET_ENCODINGS', 'is_full_grid']

#: trunk encodings the subset path supports: the LookHere bias from coordinates
#: (``lookhere``, ``alibi2d``) and encodings that put positions into the tokens before the
#: gather (``abs``) or have none (``none``)
SUBSET_ENCODINGS = ('lookhere', 'alibi2d', 'abs', 'none')


def subset_index(grid_size: Tuple[int, int], keep: Tensor, num_prefix: int = 0) -> Tensor:
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

    Returns:
        ``(B, (J + K) * (J + K))`` int64 in ``[0, (2H-1) * (2W-1)]``; the last value is
        the zero slot.
    """
    height, width = grid_size
    zero_slot = (2 * height - 1) * (2 * width - 1)
    origin = torch.zeros((), dtype=keep.dtype, device=keep.device)
    from_origin = pair_index(grid_size, origin, keep)  # (B, K): g(k) + c
    to_origin = from_origin - pair_index(grid_size, origin, origin)  # g(q)
    block = from_origin[:, None, :] - to_origin[:, :, None]  # (B, K, K) = pair_index
    j = num_prefix_tokens(num_prefix)
    if not j:
        return block.flatten(1)
    b, k = keep.shape
    out = block.new_full((b, j + k, j + k), zero_slot)
    out[:, j:, j:] = block
    return out.flatten(1)


def subset_bias(
    table: Tensor,
    grid_size: Tuple[int, int],
    keep: Tensor,
    num_prefix: int = 0,
    key_term: Optional[Tensor] = None,
    index: Optional[Tensor] = None,
    out: Optional[Tensor] = None,
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
        index: :func:`subset_index` of ``keep`` and ``num_prefix``, when already computed
            (it is the same for every layer). Default: None.
        out: a contiguous ``(B, heads, J + K, J + K)`` tensor of ``table``'s dtype to
            write into (reusing one buffer for every layer saves the page faults of a
            fresh one, about as costly as the gather on CPU). Default: None (a new one).

    Returns:
        ``(B, heads, J + K, J + K)`` in ``table``'s dtype (``-inf`` where a head cannot see).
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
    if index is None:
        index = subset_index(grid_size, keep, j)
    if tuple(index.shape) != (b, (j + k) ** 2):
        raise ValueError(
            f'index of shape {tuple(index.shape)} is not the subset_index (B={b}, '
            f'{(j + k) ** 2}) of {k} kept patches and {j} prefix tokens'
        )
    flat = torch.cat([table.flatten(1), table.new_zeros(heads, 1)], 1)  # + the zero slot
    shape = (b, heads, j + k, j + k)
    if out is None:
        out = table.new_empty(shape)
    elif tuple(out.shape) != shape or out.dtype != table.dtype or not out.is_contiguous():
        raise ValueError(
            f'out must be a contiguous {shape} {table.dtype} tensor, got '
            f'{tuple(out.shape)} {out.dtype}'
        )
    for i in range(b):
        for h in range(heads):
            torch.index_select(flat[h], 0, index[i], out=out[i, h].view(-1))
    if key_term is not None:
        out[:, :, j:, j:] += key_term[:, keep].transpose(0, 1)[:, :, None, :]
    return out


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
    is gathered from the engine's relative tables at the kept coordinates
    (:func:`subset_bias`; at the learnable slopes' current values when the encoding has
    them); ``abs`` added its positions to the tokens before the gather and ``none`` has
    none, so those attend without a bias.

    Args:
        pos_enc: the trunk's ``pos_enc``.
        keep: ``(B, K)`` kept patch indices on ``grid_size``.
        grid_size: ``(H, W)``.
        backend: ``'auto'`` (the trunk's own engine when ``keep`` is the full grid in
            order, else the dense bias from coordinates) or ``'coords'`` (always the
            dense bias from coordinates). Default: ``'auto'``.

    Attributes:
        last_backend (str): what the last call ran: ``'sdpa-coords'`` (dense bias from
            coordinates + SDPA, the explicit fallback for gathered non-grid token sets),
            ``'sdpa'`` (no bias) or ``'engine:<backend>'`` (the full grid, the trunk's
            engine).
    """

    uses_tokens = False

    def __init__(
        self,
        pos_enc,
        keep: Tensor,
        grid_size: Tuple[int, int],
        backend: str = 'auto',
    ):
        if backend not in ('auto', 'coords'):
            raise ValueError(
                f"subset attention backend must be 'auto' or 'coords', got {backend!r}"
            )
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
        self.full = backend == 'auto' and is_full_grid(keep, self.grid_size[0] * self.grid_size[1])
        self.last_backend: Optional[str] = None
        self._index: Optional[Tensor] = None  # subset_index, shared by all layers
        self._buffer: Optional[Tensor] = None  # the bias of every layer without autograd

    def _bias(self, layer: int, prefix: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        engine = self.pos_enc.engine
        slopes = getattr(self.pos_enc, 'slopes', None)
        if slopes is None:
            gb = engine.grid_bias(self.grid_size, device, dtype)
            table = gb.table[layer]
            key = None if gb.key_term is None else gb.key_term[layer]
        else:
            gb = engine.slope_bias(layer, self.grid_size, device, dtype, slopes)
            table = gb.table[0]
            key = None if gb.key_term is None else gb.key_term[0]
        if self._index is None:
            self._index = subset_index(self.grid_size, self.keep, prefix)
        buffer = None
        if not torch.is_grad_enabled():  # SDPA's backward would keep the mask: no reuse then
            b, k = self.keep.shape
            shape = (b, table.shape[0], prefix + k, prefix + k)
            if self._buffer is None or tuple(self._buffer.shape) != shape:
                self._buffer = table.new_empty(shape)
            buffer = self._buffer if self._buffer.dtype == table.dtype else None
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
        bias = self._bias(layer, prefix, q.device, q.dtype)
        self.last_backend = 'sdpa-coords'
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)

    def window_attention(self, *args, **kwargs):
        raise ValueError(
            'LookWhere extractor: window attention (window_size > 0) is not defined on a '
            'gathered patch subset; use global blocks (window_size=0)'
        )
