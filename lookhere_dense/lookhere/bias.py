"""The LookHere bias: the relative-offset tables and their materialisations.

For layer ``l``, head ``h``, query patch ``q`` and key patch ``k`` LookHere adds to the
attention logits::

    bias[l, h, q, k] = -(global_slope * layer_slope[l]) * (head_slope[h] * d(q, k))

inside the head's field of view (see :mod:`.directions`) and blocks the key outside it.
The rows and columns of the global prefix tokens at the front of the sequence (CLS, or
``J`` Jumbo tokens; :mod:`.prefix_tokens`) are 0. ``d`` is the Euclidean patch
distance, optionally passed through ``sqrt`` or ``square``.

Because the field of view and ``d`` depend only on the offset ``(dy, dx) = k - q``, the
whole ``(N, N)`` bias of an ``H x W`` grid is determined by a table of shape
``(heads, 2H-1, 2W-1)`` per layer (:func:`relative_bias_table`). That table is the single
source of truth: :class:`GridBias` produces the full bias, a block of query rows, or
(through a window-sized grid) a window's bias from it by index arithmetic; attention
backends, benchmarks and plots all go through it.

Two departures from the official code, both on purpose and both documented:

* blocked entries hold ``-inf`` (the official code writes ``-bfloat16.max``; both give an
  attention weight of exactly 0);
* a slope of exactly 0 leaves blocked keys blocked (the official code turns ``0 * inf``
  into ``nan`` and then into 0, silently removing the mask).

``center`` heads are the one non-translation-equivariant type: their bias is the distance
from the *grid centre* to the key. They are carried as a separate per-key term
(:attr:`GridBias.key_term`) that is added to the relative table's value.

The slopes enter in one place, :func:`bias_from_distances`, applied to the slope-free
:class:`DistanceTable` of a head string (distances and fields of view): at the config's
slopes for the fixed tables, at the current parameter values for learnable slopes
(:mod:`.slopes`).

Which bias (the config, presets, head layouts) is :mod:`.config`. Torch alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import LookHereConfig, head_layout, layer_slopes
from .directions import head_blocked, relative_offsets
from .prefix_tokens import num_prefix_tokens, prefix_phrase  # also importable from here

__all__ = [
    'relative_bias_table',
    'key_bias_table',
    'GridBias',
    'build_grid_bias',
    'cast_bias',
    'lookhere_bias',
    'pair_index',
    'offset_index',
    'query_windows',
    'gather_rows',
    'gather_block',
    'DistanceTable',
    'distance_table',
    'bias_from_distances',
    'num_prefix_tokens',
    'prefix_phrase',
]


# ----------------------------------------------------------------------------------------
# Tables
# ----------------------------------------------------------------------------------------
def _distance(r: Tensor, kind: str) -> Tensor:
    if kind == 'linear':
        return r
    if kind == 'sqrt':
        return r.sqrt()
    return r.square()


@dataclass(eq=False)
class DistanceTable:
    """The slope-free part of one head string's bias on one grid: what the slopes multiply.

    The bias of a layer is :func:`bias_from_distances` of this table with that layer's
    slopes; the fields of view (``visible``) do not depend on the slopes.

    Attributes:
        distance: ``(heads, 2H-1, 2W-1)`` float64 ``d(q, k)`` per relative offset (0 for
            ``zero`` and ``center`` heads; the ``fill_with`` value where a head's mask
            blocks the key, 0 there with ``fill_with='inf'``).
        visible: ``(heads, 2H-1, 2W-1)`` bool, False where the key is blocked (only with
            ``fill_with='inf'``).
        key: ``(heads, H, W)`` float64 distance of each key from the grid centre for
            ``center`` heads (0 for the others), or None when the string has no ``center``.
        head_slopes: ``(heads,)`` float64, the official head slopes of the string.
    """

    distance: Tensor
    visible: Tensor
    key: Optional[Tensor]
    head_slopes: Tensor


def distance_table(
    config: LookHereConfig, direction_string: str, num_heads: int, grid_size: Tuple[int, int]
) -> DistanceTable:
    """The slope-free distances and fields of view of ``direction_string`` (float64).

    Uses ``config.distance`` and ``config.fill_with``; the slopes of ``config`` are not
    read (``head_slopes`` are the string's official ones).
    """
    height, width = grid_size
    specs, head_slopes, _ = head_layout(direction_string, num_heads)
    dy, dx = relative_offsets(height, width)
    dist = _distance(torch.sqrt((dy * dy + dx * dx).double()), config.distance)
    grid_max = dist.max()  # the largest entry of the N x N distance matrix

    rel = dist.expand(num_heads, -1, -1).clone()
    visible = torch.ones(rel.shape, dtype=torch.bool)
    key = torch.zeros(num_heads, height, width, dtype=torch.float64)
    ky, kx = torch.meshgrid(torch.arange(height), torch.arange(width), indexing='ij')
    center_dist = torch.sqrt(
        (kx - (width - 1) / 2).double() ** 2 + (ky - (height - 1) / 2).double() ** 2
    )
    for h, spec in enumerate(specs):  # per head: at most 16 iterations, each vectorised
        if 'zero' in spec:
            rel[h] = 0.0
        if 'center' in spec:  # official: overwritten by the (linear) centre distance
            rel[h] = 0.0
            key[h] = center_dist
        blocked = head_blocked(spec, dy, dx)
        if config.fill_with == 'inf':
            rel[h][blocked] = 0.0
            visible[h][blocked] = False
        elif config.fill_with == 'zero':
            rel[h][blocked] = 0.0
        else:  # 'max': the largest value of this head's distance matrix
            rel[h][blocked] = 0.0 if 'zero' in spec else grid_max
    has_center = 'center' in direction_string.split('-')
    return DistanceTable(rel, visible, key if has_center else None, head_slopes)


def bias_from_distances(
    distance: Tensor,
    head_slopes: Tensor,
    scale: Union[float, Tensor],
    rounding: str,
    visible: Optional[Tensor] = None,
) -> Tensor:
    """THE formula of the bias: ``-(scale * (head_slope * d))``, ``-inf`` where not visible.

    Fixed slopes (:func:`relative_bias_table`) and learnable ones
    (:class:`~.slopes.LookHereSlopes`) both go through it, with the same operations in the
    same order, so a learnable model at its initial slopes has the fixed model's bias bit
    for bit. Differentiable in ``head_slopes`` and ``scale``; with ``rounding='bfloat16'``
    the forward rounds like the official code and the gradient passes straight through
    the rounding (the cast's gradient is the identity). Blocked entries take no part in
    the product, so their gradient is 0, never ``0 * inf``.

    Args:
        distance: ``(heads, ...)`` float64 slope-free distances (:class:`DistanceTable`).
        head_slopes: ``(heads,)``.
        scale: ``global_slope * layer_slope``, a number or a 0-d tensor.
        rounding: one of :data:`BIAS_ROUNDINGS`.
        visible: bool like ``distance``; None: everything visible. Default: None.

    Returns:
        ``distance``'s shape and dtype.
    """
    out = scale * (head_slopes.view(-1, *([1] * (distance.dim() - 1))) * distance)
    if rounding == 'bfloat16':
        out = out.to(torch.bfloat16).to(distance.dtype)
    out = -out
    return out if visible is None else torch.where(visible, out, -math.inf)


#: the largest bias magnitude a table may hold (float32 / bfloat16 reach 3.4e38)
_BIAS_MAX = 1e30


def _check_range(bias: Tensor, table: DistanceTable, scale: float, key: bool = False) -> Tensor:
    """``bias`` itself, when its finite entries stay below :data:`_BIAS_MAX`."""
    values = bias if key else bias[table.visible]
    if values.numel() and not (torch.isfinite(values).all() and values.abs().max() <= _BIAS_MAX):
        base = table.key if key else table.distance
        largest = (table.head_slopes.view(-1, 1, 1) * base).max().item()
        raise ValueError(
            f'LookHere slopes too large: global_slope * layer slope = {scale:g} '
            f'times distances up to {largest:g} exceeds '
            f'{_BIAS_MAX:g} (float32 / bfloat16 would turn it into -inf, i.e. '
            'block the key); use smaller slopes'
        )
    return bias


def cast_bias(
    bias: Tensor, dtype: torch.dtype, device: Union[torch.device, str, None] = None
) -> Tensor:
    """``bias`` (a float64 table, ``-inf`` where blocked) moved to ``device`` in ``dtype``;
    a finite entry beyond float16's range (65504) is refused when ``dtype`` is float16:
    the cast would make it ``-inf``, i.e. block a key the model sees (a row of such keys
    gives NaN), without a word.

    Raises:
        ValueError: naming the largest bias and the way out (bfloat16 or float32, or
            smaller slopes).
    """
    if dtype == torch.float16:
        finite = bias.detach()[torch.isfinite(bias.detach())]
        limit = torch.finfo(torch.float16).max
        if finite.numel() and finite.abs().max().item() > limit:
            raise ValueError(
                f'LookHere distance bias reaches {finite.abs().max().item():g}, beyond '
                f'float16 ({limit:g}): in float16 those keys would be blocked (-inf) instead '
                'of penalised; run in bfloat16 (torch.autocast(..., dtype=torch.bfloat16)) '
                'or float32, or use smaller slopes'
            )
    return bias.to(device=device, dtype=dtype)


def relative_bias_table(
    config: LookHereConfig, grid_size: Tuple[int, int], depth: int, num_heads: int
) -> Tensor:
    """The relative-offset bias table of every layer, at the config's slopes.

    Args:
        config: the LookHere configuration.
        grid_size: ``(H, W)`` of the patch grid (or of a window).
        depth: number of layers.
        num_heads: heads per layer.

    Returns:
        float64 tensor ``(depth, heads, 2H-1, 2W-1)``; entry ``[l, h, dy+H-1, dx+W-1]`` is
        the bias from a query to the key ``(dy, dx)`` away, ``-inf`` where blocked.
    """
    grid = _check_grid(grid_size)
    config.validate(num_heads, depth)
    out = []
    for table, scale in _layer_tables(config, grid, depth, num_heads):
        out.append(
            _check_range(
                bias_from_distances(
                    table.distance, table.head_slopes, scale, config.bias_rounding, table.visible
                ),
                table,
                scale,
            )
        )
    return torch.stack(out)


def key_bias_table(
    config: LookHereConfig, grid_size: Tuple[int, int], depth: int, num_heads: int
) -> Optional[Tensor]:
    """The per-key term of ``center`` heads, ``(depth, heads, H, W)`` float64, or None."""
    if not any('center' in s.split('-') for s in config.direction_strings):
        return None
    height, width = _check_grid(grid_size)
    out = []
    for table, scale in _layer_tables(config, (height, width), depth, num_heads):
        key = (
            table.key
            if table.key is not None
            else torch.zeros(num_heads, height, width, dtype=torch.float64)
        )
        out.append(
            _check_range(
                bias_from_distances(key, table.head_slopes, scale, config.bias_rounding),
                table,
                scale,
                key=True,
            )
        )
    return torch.stack(out) + 0.0  # turn -0.0 into 0.0


def _layer_tables(
    config: LookHereConfig, grid: Tuple[int, int], depth: int, num_heads: int
) -> List[Tuple[DistanceTable, float]]:
    """Per layer: the distance table of its direction string (built once per string) and
    its slope scale (``global_slope`` times the layer's slope)."""
    slopes = layer_slopes(config, depth)
    base = {s: distance_table(config, s, num_heads, grid) for s in config.direction_strings}
    return [
        (base[config.layer_direction(l)], config.global_slope * slopes[l]) for l in range(depth)
    ]


def _check_grid(grid_size: Sequence[int]) -> Tuple[int, int]:
    if len(grid_size) != 2 or any(
        not isinstance(g, int) or isinstance(g, bool) or g < 1 for g in grid_size
    ):
        raise ValueError(f'grid_size must be (H, W) with positive ints, got {grid_size!r}')
    return int(grid_size[0]), int(grid_size[1])


# ----------------------------------------------------------------------------------------
# Materialisation
# ----------------------------------------------------------------------------------------
def pair_index(grid_size: Tuple[int, int], query: Tensor, key: Tensor) -> Tensor:
    """Flat index into a ``(2H-1) x (2W-1)`` relative table for query / key patch pairs.

    The one statement of the token-pair -> table-entry map: the entry of the offset
    ``(dy, dx) = (k_y - q_y, k_x - q_x)`` is ``(dy + H-1) * (2W-1) + (dx + W-1)``.
    Element-wise with broadcasting, so it serves a ``(Q, 1)`` x ``(K,)`` outer product
    (:func:`offset_index`, the flex block mask) as well as the scalar-shaped index tensors
    of flex's ``score_mod`` / ``mask_mod`` callbacks.

    Args:
        grid_size: ``(H, W)``.
        query: patch indices (row-major, ``y * W + x``; no CLS), any integer shape.
        key: patch indices, broadcastable against ``query``.

    Returns:
        int64 (the inputs' integer dtype), the broadcast shape of ``query`` and ``key``.
    """
    height, width = grid_size
    return (key // width - query // width + height - 1) * (2 * width - 1) + (
        key % width - query % width + width - 1
    )


def offset_index(grid_size: Tuple[int, int], query: Tensor, key: Tensor) -> Tensor:
    """Flat table index of every (query, key) pair: :func:`pair_index` as an outer product.

    Not used on the hot paths (:func:`gather_rows` needs only a ``(Q,)`` index); the plain
    statement of the dense bias, e.g. for tests.

    Args:
        grid_size: ``(H, W)``.
        query: ``(Q,)`` patch indices (row-major, ``y * W + x``).
        key: ``(K,)`` patch indices.

    Returns:
        int64 ``(Q, K)``.
    """
    return pair_index(grid_size, query[:, None], key[None, :])


def query_windows(table: Tensor, grid_size: Tuple[int, int]) -> Tensor:
    """Every query's ``H x W`` window of a relative table, as a view (no copy).

    For a query at ``(qy, qx)`` the keys of the grid are the table entries
    ``[H-1-qy : 2H-1-qy, W-1-qx : 2W-1-qx]``, a plain 2-D slice. ``unfold`` exposes all
    these slices at once; the query axes come out mirrored (index ``H-1-qy``,
    ``W-1-qx``), because a view cannot have negative strides.

    Args:
        table: ``(..., 2H-1, 2W-1)``.
        grid_size: ``(H, W)``.

    Returns:
        view ``(..., H, W, H, W)`` with ``[..., a, b, ky, kx] = table[..., a+ky, b+kx]``,
        i.e. the row of query ``(H-1-a, W-1-b)``.
    """
    height, width = grid_size
    return table.unfold(-2, height, 1).unfold(-2, width, 1)


def gather_rows(
    table: Tensor,
    grid_size: Tuple[int, int],
    start: int,
    stop: int,
    cls_token: Union[bool, int] = False,
    key_term: Optional[Tensor] = None,
    cls_value: Union[float, bool] = 0,
    out: Optional[Tensor] = None,
) -> Tensor:
    """Rows ``start:stop`` of the token-pair matrix of one layer's relative table.

    One gather with a ``(Q,)`` index from :func:`query_windows` (no ``(Q, N)`` index
    tensor, no intermediate copies), written straight into the result; the rows and
    columns of the prefix tokens are filled with ``cls_value``. Works for any table dtype
    (float biases, bool fields of view).

    Args:
        table: ``(heads, 2H-1, 2W-1)``.
        grid_size: ``(H, W)``.
        start, stop: token rows, ``0 <= start <= stop <= T`` with ``T = J + H*W``.
        cls_token: number ``J`` of global prefix tokens at the front (CLS, or Jumbo
            tokens; True = 1): the sequence is ``[p_0..p_{J-1}, patch_0, ...]``.
        key_term: optional ``(heads, H*W)`` added to every row (``center`` heads).
        cls_value: value of the prefix rows and columns. Default: 0.
        out: optional ``(heads, stop-start, T)`` tensor to write into.

    Returns:
        ``(heads, stop-start, T)`` in ``table``'s dtype (``out`` when given).
    """
    height, width = grid_size
    n = height * width
    off = num_prefix_tokens(cls_token)
    total = n + off
    if not 0 <= start <= stop <= total:
        raise ValueError(f'rows {start}:{stop} outside a sequence of {total} tokens')
    heads = table.shape[0]
    shape = (heads, stop - start, total)
    if out is None:
        out = table.new_empty(shape)
    elif tuple(out.shape) != shape or out.dtype != table.dtype:
        raise ValueError(f'out must be {shape} {table.dtype}, got {tuple(out.shape)} {out.dtype}')
    first = max(start - off, 0)  # first patch query
    skip = max(0, min(stop, off) - start)  # prefix rows inside the block
    if skip:
        out[:, :skip] = cls_value
    gather_block(
        table,
        grid_size,
        first,
        max(stop - off, first),
        (0, height),
        'first' if off else None,
        key_term,
        cls_value,
        out=out[:, skip:],
        num_prefix=off,
    )
    return out


def gather_block(
    table: Tensor,
    grid_size: Tuple[int, int],
    q_start: int,
    q_stop: int,
    key_rows: Tuple[int, int],
    cls_key: Optional[str] = None,
    key_term: Optional[Tensor] = None,
    cls_value: Union[float, bool] = 0,
    out: Optional[Tensor] = None,
    reverse_queries: bool = False,
    num_prefix: int = 1,
) -> Tensor:
    """Bias of patch queries ``q_start:q_stop`` against the patch keys of grid rows
    ``key_rows[0]:key_rows[1]``, plus optional prefix key columns (CLS / Jumbo).

    The building block of :func:`gather_rows` and of the key-range-restricted chunked
    attention: one gather with a ``(Q,)`` index from :func:`query_windows`, restricted to
    the key rows, written straight into ``out``. Differentiable in ``table`` and
    ``key_term`` (learnable slopes).

    Args:
        table: ``(heads, 2H-1, 2W-1)``.
        grid_size: ``(H, W)``.
        q_start, q_stop: patch indices (no CLS), ``0 <= q_start <= q_stop <= H*W``.
        key_rows: ``(r0, r1)``, grid rows of the keys, ``0 <= r0 <= r1 <= H``.
        cls_key: ``'first'`` / ``'last'``: ``num_prefix`` prefix key columns (value
            ``cls_value``) before / after the patch keys; None: no prefix columns.
        key_term: optional ``(heads, H*W)`` per-key term (``center`` heads).
        cls_value: value of the prefix columns. Default: 0.
        out: optional ``(heads, Q, K)`` tensor to write into (its last dim contiguous).
        reverse_queries: return the rows in reversed query order (``q_stop - 1`` first).
            :func:`query_windows` holds the queries mirrored, so in this order the rows
            are plain strided slices of the table: at most three ``copy_`` calls with
            contiguous runs of ``W`` values instead of an element-wise gather (2-4x
            faster on CPU). Default: False.
        num_prefix: prefix key columns ``J`` with ``cls_key`` (CLS: 1, Jumbo: ``J``).
            Default: 1.

    Returns:
        ``(heads, Q, K)`` with ``Q = q_stop - q_start``, ``K = (r1 - r0) * W (+ J)``.
    """
    height, width = grid_size
    r0, r1 = key_rows
    if not 0 <= q_start <= q_stop <= height * width:
        raise ValueError(f'patch queries {q_start}:{q_stop} outside a {height}x{width} grid')
    if not 0 <= r0 <= r1 <= height:
        raise ValueError(f'key rows {r0}:{r1} outside a grid of {height} rows')
    if cls_key not in (None, 'first', 'last'):
        raise ValueError(f"cls_key must be None, 'first' or 'last', got {cls_key!r}")
    extra = 0 if cls_key is None else num_prefix_tokens(num_prefix)
    if not extra:
        cls_key = None
    heads = table.shape[0]
    num_q = q_stop - q_start
    shape = (heads, num_q, (r1 - r0) * width + extra)
    if out is not None and (tuple(out.shape) != shape or out.dtype != table.dtype):
        raise ValueError(f'out must be {shape} {table.dtype}, got {tuple(out.shape)} {out.dtype}')
    if torch.is_grad_enabled() and (
        table.requires_grad or (key_term is not None and key_term.requires_grad)
    ):  # learnable slopes
        queries = torch.arange(q_start, q_stop, device=table.device)
        queries = queries.flip(0) if reverse_queries else queries
        prefix = (cls_key, extra, cls_value)
        block = _gather_block_with_grad(table, grid_size, queries, key_rows, prefix, key_term)
        return block if out is None else out.copy_(block)
    if out is None:
        out = table.new_empty(shape)
    patch = out
    if cls_key == 'first':
        out[:, :, :extra] = cls_value
        patch = out[:, :, extra:]
    elif cls_key == 'last':
        out[:, :, -extra:] = cls_value
        patch = out[:, :, :-extra]
    if num_q and r1 > r0:
        windows = query_windows(table, grid_size)[..., r0:r1, :]  # (heads, H, W, r1-r0, W)
        target = patch.view(heads, num_q, r1 - r0, width)
        if reverse_queries:
            _copy_mirrored_rows(windows, height * width - q_stop, height * width - q_start, target)
        else:
            q = torch.arange(q_start, q_stop, device=table.device)
            iy = (height - 1) - q.div(width, rounding_mode='floor')
            ix = (width - 1) - q.remainder(width)
            torch.ops.aten.index.Tensor_out(windows, [None, iy, ix], out=target)
        if key_term is not None:
            patch += key_term[:, None, r0 * width : r1 * width]
    return out


def _gather_block_with_grad(
    table: Tensor,
    grid_size: Tuple[int, int],
    queries: Tensor,
    key_rows: Tuple[int, int],
    prefix: Tuple[Optional[str], int, Union[float, bool]],
    key_term: Optional[Tensor],
) -> Tensor:
    """:func:`gather_block` for autograd (learnable slopes): the same values, built out of
    place (``out=`` kernels have no autograd, and PyTorch refuses a later in-place add on a
    view written through another view) by one ``index_select`` of the flattened table at
    :func:`pair_index`, whose backward (``index_add_``) is 4-20x faster on CPU than that of
    the :func:`query_windows` gather. ``queries``: ``(Q,)`` patch indices in the order of
    the rows; ``prefix``: ``(cls_key, J, cls_value)`` of :func:`gather_block`."""
    cls_key, j, cls_value = prefix
    width = grid_size[1]
    r0, r1 = key_rows
    heads = table.shape[0]
    q = queries
    keys = torch.arange(r0 * width, r1 * width, device=table.device)
    index = pair_index(grid_size, q[:, None], keys[None, :])  # (Q, K)
    flat = table.flatten(1)
    term = None if key_term is None else key_term[:, r0 * width : r1 * width]
    if cls_key is not None:  # one more table entry: the prefix columns' value
        column = index.new_full((q.numel(), j), flat.shape[1])
        index = torch.cat([column, index] if cls_key == 'first' else [index, column], dim=1)
        flat = torch.cat([flat, flat.new_full((heads, 1), cls_value)], dim=1)
        if term is not None:
            term = F.pad(term, (j, 0) if cls_key == 'first' else (0, j))
    out = flat.index_select(1, index.flatten()).view(heads, q.numel(), index.shape[1])
    return out if term is None else out + term[:, None, :]


def _copy_mirrored_rows(windows: Tensor, m_start: int, m_stop: int, target: Tensor) -> None:
    """Copy rows ``m_start:m_stop`` of the mirrored query axes of :func:`query_windows`.

    Args:
        windows: ``(heads, H, W, R, W)`` view; mirrored query ``m = a * W + b``.
        m_start, m_stop: range of ``m`` (row-major over ``(a, b)``).
        target: ``(heads, m_stop - m_start, R, W)``.
    """
    width = int(windows.shape[2])  # a plain int also under torch.jit.trace
    a0, b0 = divmod(m_start, width)
    a1, b1 = divmod(m_stop, width)
    if a0 == a1:  # inside one grid row
        target.copy_(windows[:, a0, b0:b1])
        return
    i = 0
    if b0:  # tail of the first row
        target[:, : width - b0].copy_(windows[:, a0, b0:])
        i, a0 = width - b0, a0 + 1
    if a1 > a0:  # whole rows
        n = (a1 - a0) * width
        target[:, i : i + n].view(target.shape[0], a1 - a0, width, *target.shape[2:]).copy_(
            windows[:, a0:a1]
        )
        i += n
    if b1:  # head of the last row
        target[:, i:].copy_(windows[:, a1, :b1])


@dataclass(eq=False)
class GridBias:
    """The LookHere bias of every layer for one grid, kept as relative-offset tables.

    Attributes:
        grid_size: ``(H, W)``.
        table: ``(depth, heads, 2H-1, 2W-1)`` in the compute dtype/device, ``-inf`` blocked.
        key_term: ``(depth, heads, H*W)`` for ``center`` heads, else None.
        visible: ``(depth, heads, 2H-1, 2W-1)`` bool, the fields of view (for masks);
            computed from ``table`` when not given (learnable slopes pass the slope-free
            one of :class:`DistanceTable`, which needs no pass over the table).
    """

    grid_size: Tuple[int, int]
    table: Tensor
    key_term: Optional[Tensor] = None
    visible: Optional[Tensor] = None

    def __post_init__(self):
        if self.visible is None:
            self.visible = ~torch.isneginf(self.table)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_heads(self) -> int:
        return self.table.shape[1]

    @property
    def depth(self) -> int:
        return self.table.shape[0]

    def rows(
        self, layer: int, start: int, stop: int, cls_token: Union[bool, int] = False
    ) -> Tensor:
        """Bias rows ``start:stop`` of the token sequence for ``layer``.

        ``cls_token``: number ``J`` of global prefix tokens at the front (CLS, or Jumbo
        tokens; True = 1): the sequence is ``[p_0..p_{J-1}, patch_0, ..., patch_{N-1}]``;
        the prefix rows and columns are 0.

        Returns:
            ``(heads, stop-start, T)`` with ``T = J + N``, in the table's dtype.
        """
        return gather_rows(
            self.table[layer],
            self.grid_size,
            start,
            stop,
            cls_token,
            None if self.key_term is None else self.key_term[layer],
        )

    def dense(self, layer: int, cls_token: Union[bool, int] = False) -> Tensor:
        """The full ``(heads, T, T)`` bias of ``layer`` (``T = J + N`` with ``J`` =
        ``cls_token`` global prefix tokens, see :meth:`rows`)."""
        return self.rows(layer, 0, self.num_patches + num_prefix_tokens(cls_token), cls_token)


def build_grid_bias(
    config: LookHereConfig,
    grid_size: Tuple[int, int],
    depth: int,
    num_heads: int,
    device: Union[torch.device, str, None] = None,
    dtype: torch.dtype = torch.float32,
) -> GridBias:
    """Tables for one grid, moved to ``device`` and cast to ``dtype``."""
    table = relative_bias_table(config, grid_size, depth, num_heads)
    key = key_bias_table(config, grid_size, depth, num_heads)
    table = cast_bias(table, dtype, device)
    if key is not None:
        key = cast_bias(key.flatten(2), dtype, device)
    return GridBias(tuple(grid_size), table, key)


def lookhere_bias(
    config: LookHereConfig,
    grid_size: Tuple[int, int],
    depth: int,
    num_heads: int,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The full patch-to-patch bias, ``(depth, heads, H*W, H*W)``, without prefix tokens.

    The counterpart of the official ``create_lh_bias_tensor`` (which returns the same
    values, with ``-bfloat16.max`` where this has ``-inf``).
    """
    gb = build_grid_bias(config, grid_size, depth, num_heads, dtype=dtype)
    n = gb.num_patches
    out = gb.table.new_empty(depth, num_heads, n, n)
    for layer in range(depth):
        gather_rows(
            gb.table[layer],
            gb.grid_size,
            0,
            n,
            key_term=None if gb.key_term is None else gb.key_term[layer],
            out=out[layer],
        )
    return out
