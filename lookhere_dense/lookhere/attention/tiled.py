"""The ``tiled`` backend: exact, tile-sparse LookHere attention on CPU.

Each head group (heads of a layer with the same field of view, derived from
``GridBias.visible``, never from head names) attends, from each block of query patches,
only to the key rows of the key *strips* it can see; nothing else is computed.

Layout
    Keys are cut into vertical strips of ``s`` grid columns (``s`` divides ``W``;
    ``s = W``: one strip, the whole grid), each strip stored row by row (in reversed
    order, see below), so the keys of a strip between two grid rows are one contiguous
    run. The plan
    (:func:`plan_tiles`) picks ``s`` per group: ``W`` for heads that see whole rows
    (up/down, unrestricted), narrow strips for heads restricted left/right (half planes,
    quadrants, wedges), by a cost model (pairs computed + a cost per kernel call).

Calls
    One call of the CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``,
    which also returns the log-sum-exp) computes a block of ``R`` query rows x ``C``
    query columns against one key run, all heads of the group at once: heads in the
    kernel's batch dimension, query rows in its head dimension (the key run is shared,
    stride 0; consecutive work items are consecutive rows of one head, which share the
    bias rows), columns in its query dimension.

The bias is never gathered
    The keys run in reversed order (row ``H-1-y``, column ``W-1-x``), which makes the bias
    ``F[y' + qy, x' + qx]`` with ``F`` the table flipped in both axes. With a re-pitched
    copy of it, ``U[h, js, r, c] = F[h, r, js + c]`` (``c < s``; ``(2W-s)(2H-1)s`` values
    per head, about ``4 N s`` for narrow strips and ``2 N W`` for whole rows; built once
    per layer and call, at most ``TileOptions.max_table_bytes`` per group), the bias
    of query ``(qy, qx)`` against the keys of reversed strip ``J'`` between reversed rows
    ``r0..r1`` is the contiguous run ``U[h, J' s + qx, r0 + qy : r1 + qy]``, so the mask
    of a call is a strided *view* of ``U`` (strides ``(head, s, (2H-1) s, 1)`` over heads,
    query rows, query columns, keys). No ``(Q, K)`` bias block is ever written;
    consecutive query rows read the same rows of ``U``, which stay in cache. (``center``
    heads' per-key term is added to that view, which materialises the call's block.)
    The queries and the output stay in the model's order (no copies); K and V are
    gathered once per layer into the group's reversed strips (contiguous, which the
    kernel also prefers).

Merges
    Every call returns its partial output and log-sum-exp; they are merged exactly into
    a float32 accumulator (``acc <- lerp(acc, o, sigmoid(l - m))``, ``m <- logaddexp(m,
    l)``) that holds one *unit* (a head group x one block of ``tile_rows`` query rows)
    and is written to the output in the inputs' dtype when the unit is done, so bfloat16
    / float16 inputs never have a float32 copy of the frame (docs/mixed_precision.md).
    Queries that see none of a call's keys (the kernel then returns 0 and lse 0)
    get the lse ``-1e30`` (their weight underflows to exactly 0); the plan knows which
    they are. The ``J`` global prefix keys (CLS, or Jumbo tokens: bias 0 to every patch
    query) are one more partial per unit, in float32; the prefix queries are one plain
    kernel call over all keys.

Backward
    :class:`_TiledAttention` saves ``q, k, v``, the output and the merged log-sum-exp
    (what plain SDPA saves; the output is laid out ``(B, T, heads, d)`` like SDPA's, so
    the model's reshape to ``(B, T, C)`` is a view) and runs the CPU flash backward
    (``_scaled_dot_product_flash_attention_for_cpu_backward``) call by call with the
    *global* output and lse, which makes each call's share of the gradient exact. There
    the block's queries form one query dimension (the backward kernel would give a key
    run shared by several query rows one key gradient per row), so each call's bias is
    copied out of the ``U`` view into a reused buffer first. No dense bias and no
    attention matrix is kept between forward and backward. Gradients accumulate in
    float32 per unit (queries) and per group and worker (keys, values) and are written
    once in the inputs' dtype.

Threads
    The plan splits into independent units (one group x one block of query rows, which
    no other unit writes). With ``torch.get_num_threads() = n > 1`` they run on ``n``
    Python threads with one intra-op thread each (the kernels release the GIL; key
    gradients are accumulated per worker and summed): hundreds of small kernel calls
    that each synchronise two OpenMP threads were slower than one thread on a shared
    machine. In the forward each worker takes the next unit when it is free; the
    backward gives the units out in advance by modelled cost (so the per-worker key
    gradient sums are the same from run to run). Each group's re-pitched table and
    key/value strips exist only while the group is being worked on (the calling thread
    builds the next group's meanwhile), and a group whose table would pass
    ``TileOptions.max_table_bytes`` runs as several groups of fewer heads.

Limits (refused with a ValueError, the engine does not choose ``tiled`` then): CUDA
tensors, attention dropout, and a table that requires grad (learnable slopes while they
train: the flash backward gives no bias gradient; ``auto`` routes those to ``sdpa`` or
``chunked``).
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import List, MutableMapping, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from ..bias import GridBias
from .common import (
    EMPTY_LSE,
    FLASH,
    FLASH_BWD,
    AttentionCall,
    AttentionRequest,
    VisibleCounts,
    cached_plan,
    flash_layer_inputs,
    head_groups,
    last_dim_contiguous,
    merge_partial,
    plan_key,
    work_dtype,
)

__all__ = [
    'NAME',
    'TILED_MIN_TOKENS',
    'can_run',
    'attend',
    'TileOptions',
    'TileCall',
    'GroupPlan',
    'TilePlan',
    'plan_tiles',
    'tiled_attention',
]


NAME = 'tiled'

#: where the ``fused`` kernel is not built, ``auto`` uses the ``tiled`` backend on CPU from
#: this many tokens on (512x512 ViT-B/16 inputs have 1025)
TILED_MIN_TOKENS = 1024


def can_run(request: AttentionRequest) -> Optional[str]:
    """CPU, no attention dropout, no slope gradients; ``auto`` from
    :data:`TILED_MIN_TOKENS` tokens on."""
    if not request.on_cpu:
        return f'runs on CPU only (the call is on {request.device})'
    if request.dropout_p:
        return 'has no attention dropout'
    if request.slope_grads:
        return 'gives the bias table no gradient (learnable slopes while they train)'
    if request.auto and request.tokens < TILED_MIN_TOKENS:
        return f'{request.tokens} tokens < TILED_MIN_TOKENS ({TILED_MIN_TOKENS})'
    return None


@dataclass(frozen=True)
class TileOptions:
    """How :func:`plan_tiles` cuts the work.

    Attributes:
        rows: query grid rows per block before refinement. Default: 8.
        max_keys: the most keys per call (longer key ranges are split into runs of whole
            grid rows and merged): keeps K/V of a call in cache. Default: 2048.
        min_cols: the narrowest query block that refinement makes. Default: 16.
        strips: candidate strip widths besides ``W`` (used where they divide ``W``).
            Default: ``(8, 16, 32)``.
        call_cost: cost of one kernel call (with its merge) in query-key pairs, for the
            refinement and the strip choice. Default: 49152.
        max_table_bytes: the largest re-pitched table (``U``, counted in fp32 bytes;
            float64 inputs take twice that) one group's working state may hold; a group
            of heads whose table would be larger is run as several groups of fewer
            heads (at least one each), with the same calls: whole-row heads on a big
            grid need ``2 N W`` values per head (a 128x256 grid: 64 MiB). A few groups'
            states are held at once (as many as worker threads, and the next).
            Default: 32 MiB.
    """

    rows: int = 8
    max_keys: int = 2048
    min_cols: int = 16
    strips: Tuple[int, ...] = (8, 16, 32)
    call_cost: float = 49152.0
    max_table_bytes: int = 32 * 2**20

    def __post_init__(self):
        for name in ('rows', 'max_keys', 'min_cols', 'max_table_bytes'):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f'TileOptions.{name} must be a positive int, got {value!r}')
        if not all(isinstance(s, int) and s >= 1 for s in self.strips):
            raise ValueError(f'TileOptions.strips must be positive ints, got {self.strips!r}')
        if not self.call_cost >= 0:
            raise ValueError(f'TileOptions.call_cost must be >= 0, got {self.call_cost!r}')


@dataclass(eq=False)
class TileCall:
    """One kernel call: query rows ``y0:y1`` x columns ``x0:x1`` (grid coordinates)
    against strip ``strip``, key rows ``r0:r1``.

    Attributes:
        first: no earlier call of the group touched these queries (the partial is
            written, not merged).
        empty: ``(1, R, C)`` bool, True for the
            queries that see none of the call's keys; None when every query sees one.
    """

    y0: int
    y1: int
    x0: int
    x1: int
    strip: int
    r0: int
    r1: int
    first: bool
    empty: Optional[Tensor] = None


@dataclass(eq=False)
class GroupPlan:
    """The calls of one head group.

    Attributes:
        heads: the group's heads (ascending).
        strip: strip width ``s`` (``W``: row-major keys).
        calls: the kernel calls.
        computed: query-key pairs the calls compute.
        visible: query-key pairs the group can see (patches only).
    """

    heads: Tuple[int, ...]
    strip: int
    calls: List[TileCall]
    computed: int
    visible: int


@dataclass(eq=False)
class TilePlan:
    """The plan of one layer's fields of view on one grid (patch tokens only).

    Attributes:
        grid_size: ``(H, W)``.
        tile_rows: query rows per top-level block (every call lies inside one).
        groups: one :class:`GroupPlan` per head group.
    """

    grid_size: Tuple[int, int]
    tile_rows: int
    groups: List[GroupPlan] = field(default_factory=list)

    def units(self) -> List[Tuple[float, int, List[TileCall]]]:
        """Independent pieces of work: the calls of one group inside one top-level row
        block, which write output rows no other piece writes. ``(cost, group, calls)``,
        the cost in query-key pairs of all the group's heads."""
        out = []
        for gi, group in enumerate(self.groups):
            tiles: dict = {}
            for c in group.calls:
                tiles.setdefault(c.y0 // self.tile_rows, []).append(c)
            for calls in tiles.values():
                cost = sum((c.y1 - c.y0) * (c.x1 - c.x0) * (c.r1 - c.r0) for c in calls)
                out.append((float(cost * group.strip * len(group.heads)), gi, calls))
        return out

    @property
    def calls(self) -> int:
        return sum(len(g.calls) for g in self.groups)

    def fractions(self) -> Tuple[float, float]:
        """``(computed, visible)`` pairs as fractions of the dense patch pairs of all
        heads."""
        n = self.grid_size[0] * self.grid_size[1]
        heads = sum(len(g.heads) for g in self.groups)
        dense = heads * n * n
        return (
            sum(len(g.heads) * g.computed for g in self.groups) / dense,
            sum(len(g.heads) * g.visible for g in self.groups) / dense,
        )


# ----------------------------------------------------------------------------------------
# Plan
# ----------------------------------------------------------------------------------------
def _strip_row_offsets(
    visible: np.ndarray, grid_size: Tuple[int, int], strip: int
) -> Tuple[np.ndarray, np.ndarray]:
    """For every strip ``J`` and query column ``x``: the smallest and the largest row
    offset ``dy`` at which strip ``J`` holds a key that column ``x`` can see.

    Returns:
        ``(lo, hi)``, int64 ``(W/s, W)``; ``lo > hi`` where the strip holds none.
    """
    height, width = grid_size
    ns = width // strip
    sums = np.zeros((2 * height - 1, 2 * width), np.int64)
    sums[:, 1:] = visible.astype(np.int64).cumsum(1)
    first = np.arange(ns)[:, None] * strip - np.arange(width)[None, :] + width - 1
    seen = (sums[:, first + strip] - sums[:, first]) > 0  # (2H-1, nS, W)
    anything = seen.any(0)
    lo = np.where(anything, seen.argmax(0), 2 * height) - (height - 1)
    hi = np.where(anything, 2 * height - 2 - seen[::-1].argmax(0), -1) - (height - 1)
    return lo, hi


def _shape_factor(rows: int, cols: int) -> float:
    """Relative cost per pair of a call with ``rows`` query rows x ``cols`` columns (the
    CPU kernel is slower on short query blocks; measured, see docs/performance.md)."""
    f = 1.0
    if cols <= 16:
        f += 0.12
    elif cols < 32:
        f += 0.05
    if rows == 1:
        f += 0.1
    elif rows < 4:
        f += 0.03
    return f


def _plan_group(
    visible: np.ndarray, grid_size: Tuple[int, int], strip: int, options: TileOptions
) -> Tuple[list, float]:
    """The blocks ``(y0, y1, x0, x1, J, r0, r1)`` of one group for strip width ``strip``
    and their modelled cost."""
    height, width = grid_size
    max_rows = max(1, options.max_keys // strip)
    lo_off, hi_off = _strip_row_offsets(visible, grid_size, strip)
    blocks: list = []

    memo: dict = {}

    def trim(y0, y1, x0, x1, j, lo, hi):
        """The smallest block and key-row range inside the given ones that keep every
        visible pair between them (per column, the visible rows of a strip are taken as
        the interval between their extremes: a superset)."""
        key = (y0, y1, x0, x1, j, lo, hi)
        if key not in memo:
            memo[key] = _trim(y0, y1, x0, x1, j, lo, hi)
        return memo[key]

    def _trim(y0, y1, x0, x1, j, lo, hi):
        for _ in range(3):
            before = (y0, y1, x0, x1, lo, hi)
            dl, dh = lo_off[j, x0:x1], hi_off[j, x0:x1]
            a = np.maximum(lo, y0 + dl)
            b = np.minimum(hi - 1, y1 - 1 + dh)
            ok = np.flatnonzero(a <= b)
            if not ok.size:
                return None
            lo, hi = int(a[ok].min()), int(b[ok].max()) + 1
            x0, x1 = x0 + int(ok[0]), x0 + int(ok[-1]) + 1
            dl, dh = lo_off[j, x0:x1], hi_off[j, x0:x1]
            keep = dl <= dh
            ya = np.maximum(y0, lo - dh[keep])
            yb = np.minimum(y1 - 1, hi - 1 - dl[keep])
            rows = ya <= yb
            if not rows.any():
                return None
            y0, y1 = int(ya[rows].min()), int(yb[rows].max()) + 1
            if (y0, y1, x0, x1, lo, hi) == before:
                break
        return y0, y1, x0, x1, lo, hi

    def cost(box) -> float:
        if box is None:
            return 0.0
        y0, y1, x0, x1, r0, r1 = box
        pairs = (y1 - y0) * (x1 - x0) * (r1 - r0) * strip
        return pairs * _shape_factor(y1 - y0, x1 - x0) + options.call_cost

    def halves(y0, y1, x0, x1):
        out = []
        if y1 - y0 > 1:
            m = (y0 + y1) // 2
            out.append(((y0, m, x0, x1), (m, y1, x0, x1)))
        if x1 - x0 > options.min_cols:
            half = (x1 - x0) // 2
            m = x0 + max(options.min_cols, half - half % options.min_cols)
            if x0 < m < x1:
                out.append(((y0, y1, x0, m), (y0, y1, m, x1)))
        return out

    def refine(y0, y1, x0, x1, j, lo, hi):
        box = trim(y0, y1, x0, x1, j, lo, hi)
        if box is None:
            return
        y0, y1, x0, x1, r0, r1 = box
        if r1 - r0 > max_rows:
            for c in range(r0, r1, max_rows):
                refine(y0, y1, x0, x1, j, c, min(r1, c + max_rows))
            return
        best, best_cost = None, cost(box)
        for pair in halves(y0, y1, x0, x1):
            c = sum(cost(trim(*blk, j, r0, r1)) for blk in pair)
            if c < best_cost:
                best, best_cost = pair, c
        if best is None:
            blocks.append((y0, y1, x0, x1, j, r0, r1))
            return
        for blk in best:
            refine(*blk, j, r0, r1)

    for y0 in range(0, height, options.rows):
        for j in range(width // strip):
            refine(y0, min(height, y0 + options.rows), 0, width, j, 0, height)
    total = sum(cost(b[:4] + b[5:]) for b in blocks)
    # building U and the strip copies of K, V (per head, in pair equivalents)
    total += 0.1 * (
        (2 * width - strip) * (2 * height - 1) * strip
        + (0 if strip == width else 128 * height * width)
    )
    return blocks, total


def _finish_group(
    counts: VisibleCounts,
    grid_size: Tuple[int, int],
    heads: Tuple[int, ...],
    strip: int,
    blocks: list,
) -> GroupPlan:
    """First-write flags, empty queries and pair counts of the chosen blocks (exact)."""
    height, width = grid_size
    covered = np.zeros((height, width), bool)
    calls, computed, visible = [], 0, 0
    for y0, y1, x0, x1, j, r0, r1 in blocks:
        qy = np.arange(y0, y1)[:, None]
        qx = np.arange(x0, x1)[None, :]
        k0 = j * strip
        seen = counts(r0 - qy, r1 - 1 - qy, k0 - qx, k0 + strip - 1 - qx)  # (R, C)
        first = not covered[y0:y1, x0:x1].any()
        covered[y0:y1, x0:x1] = True
        empty = None
        if (seen == 0).any():
            empty = torch.from_numpy(seen == 0)[None]
        calls.append(TileCall(y0, y1, x0, x1, j, r0, r1, first, empty))
        computed += (y1 - y0) * (x1 - x0) * (r1 - r0) * strip
        visible += int(seen.sum())
    return GroupPlan(heads, strip, calls, computed, visible)


def plan_tiles(
    visible: Tensor, grid_size: Tuple[int, int], options: Optional[TileOptions] = None
) -> TilePlan:
    """The tiled plan of one layer: head groups, strip widths and kernel calls.

    Every visible (query patch, key patch) pair of every head is computed by exactly one
    call of its group (tested), and a call's key run covers the key rows any of its
    queries can see in the strip. Blocks start as ``options.rows`` query rows x the whole
    width per strip, are trimmed to the queries and key rows that take part, and are
    halved (rows or columns) while that lowers the modelled cost (pairs computed, scaled
    by the kernel's speed on the block's shape, + ``call_cost`` per call); key ranges
    longer than ``max_keys`` are cut into runs of whole rows. Groups whose fields of view
    are whole rows (up, down, unrestricted) keep ``s = W``. A group whose re-pitched
    table would exceed ``max_table_bytes`` becomes several groups of fewer heads with the
    same calls (:func:`split_heads`), so that the working state stays bounded.

    Args:
        visible: ``(heads, 2H-1, 2W-1)`` bool fields of view of the layer.
        grid_size: ``(H, W)``.
        options: :class:`TileOptions`; None: the defaults.
    """
    options = options or TileOptions()
    height, width = grid_size
    if tuple(visible.shape[-2:]) != (2 * height - 1, 2 * width - 1):
        raise ValueError(f'visible {tuple(visible.shape)} does not fit grid {grid_size}')
    plan = TilePlan((height, width), options.rows)
    vis = visible.cpu().numpy()
    for heads in head_groups(visible):
        v = vis[heads[0]]
        widths = [width]
        if not (v.all(1) | ~v.any(1)).all():  # some row offset is seen only in part
            widths += [s for s in options.strips if s < width and width % s == 0]
        best = None
        for s in widths:
            blocks, c = _plan_group(v, (height, width), s, options)
            if best is None or c < best[2]:
                best = (s, blocks, c)
        group = _finish_group(VisibleCounts(v, (height, width)), (height, width), heads, *best[:2])
        for part in split_heads(heads, table_bytes(grid_size, best[0]), options.max_table_bytes):
            plan.groups.append(replace(group, heads=part))
    return plan


def table_bytes(grid_size: Tuple[int, int], strip: int) -> int:
    """fp32 bytes per head of a group's re-pitched table ``U`` ``(2W-s, 2H-1, s)``."""
    height, width = grid_size
    return (2 * width - strip) * (2 * height - 1) * strip * 4


def split_heads(heads: Tuple[int, ...], per_head: int, budget: int) -> List[Tuple[int, ...]]:
    """``heads`` in the fewest consecutive parts of at most ``budget // per_head`` heads
    (at least one head per part), whose sizes differ by at most one."""
    parts = math.ceil(len(heads) / max(1, min(len(heads), budget // per_head)))
    size, extra = divmod(len(heads), parts)
    out, start = [], 0
    for i in range(parts):
        stop = start + size + (i < extra)
        out.append(heads[start:stop])
        start = stop
    return out


def get_plan(
    grid_bias: GridBias,
    layer: int,
    options: Optional[TileOptions] = None,
    cache: Optional[MutableMapping] = None,
) -> TilePlan:
    """:func:`plan_tiles` of ``layer``, from ``cache`` when given (a dict or an object
    with ``get_or_create``; layers with the same fields of view share one entry)."""
    options = options or TileOptions()
    visible = grid_bias.visible[layer]
    return cached_plan(
        cache,
        plan_key('tiled', visible, grid_bias.grid_size, options) if cache is not None else None,
        lambda: plan_tiles(visible, grid_bias.grid_size, options),
    )


# ----------------------------------------------------------------------------------------
# Execution
# ----------------------------------------------------------------------------------------
def _head_index(heads: Tuple[int, ...]):
    """A slice for heads in arithmetic progression (views of ``q, k, v``; the kernel takes
    any head stride), else an index tensor (copies)."""
    step = heads[1] - heads[0] if len(heads) > 1 else 1
    if step > 0 and all(b - a == step for a, b in zip(heads, heads[1:])):
        return slice(heads[0], heads[-1] + 1, step)
    return torch.tensor(heads, dtype=torch.long)


def _take(t: Tensor, index) -> Tensor:
    return t[index] if isinstance(index, slice) else t.index_select(0, index)


def _put(dst: Tensor, index, value: Tensor, add: bool = False) -> None:
    if isinstance(index, slice):
        if add:
            dst[index] += value
        else:
            dst[index] = value
    elif add:
        dst.index_add_(0, index, value.to(dst.dtype))
    else:
        dst.index_copy_(0, index, value.to(dst.dtype))


class _Group:
    """Per-layer pieces of one head group.

    The calls run with the queries in the model's order and the keys in *reversed* order
    (row ``H-1-y``, column ``W-1-x``; the strip layout is built from the reversed grid).
    Then ``bias(q, k) = F[ky' + qy, kx' + qx]`` with ``F`` the table flipped in both
    axes, so with ``U[h, js, r, c] = F[h, r, js + c]`` (``c < s``; ``(g, 2W-s, 2H-1, s)``)
    the bias of query ``(qy, qx)`` against the keys of reversed strip ``J'``, reversed rows
    ``r0'..r1'`` is the run ``U[h, J' s + qx, r0' + qy : r1' + qy]``: a mask view with
    strides ``(head, s, (2H-1) s, 1)`` over (heads, query rows, query columns, keys).
    """

    def __init__(
        self,
        plan: GroupPlan,
        table: Tensor,
        key_term: Optional[Tensor],
        grid_size: Tuple[int, int],
        dtype: torch.dtype,
    ):
        height, width = grid_size
        self.plan = plan
        self.grid = grid_size
        self.g = len(plan.heads)
        self.s = plan.strip
        self.strips = width // self.s
        self.index = _head_index(plan.heads)
        flipped = _take(table, self.index).to(dtype).flip(-2, -1)
        self.u = flipped.unfold(-1, self.s, 1).permute(0, 2, 1, 3).contiguous()
        self.pitch = (2 * height - 1) * self.s  # stride of js in U
        # the reversed strip layout: position (J', y', c) -> patch (H-1-y', W-1-(J' s + c))
        js = torch.arange(self.strips)[:, None, None]
        ry = torch.arange(height)[None, :, None]
        c = torch.arange(self.s)[None, None, :]
        self.order = ((height - 1 - ry) * width + (width - 1 - (js * self.s + c))).reshape(-1)
        self.key_term = None
        if key_term is not None:
            self.key_term = self.strip_layout(
                _take(key_term, self.index).to(dtype)[..., None], take=False
            )[..., 0]  # (g, nS, H, s)

    def strip_layout(self, t: Tensor, take: bool = True) -> Tensor:
        """``(heads, N, c)`` patches -> this group's reversed strips ``(g, W/s, H, s, c)``
        (one gather; contiguous: the kernel is 10-20% slower on the strided keys of a qkv
        view)."""
        height = self.grid[0]
        t = _take(t, self.index) if take else t
        return t.index_select(1, self.order).view(self.g, self.strips, height, self.s, t.shape[-1])

    def add_from_strips(self, dst: Tensor, t: Tensor) -> None:
        """``dst[heads] += `` the patches of a ``(g, W/s, H, s, c)`` strip tensor."""
        flat = t.reshape(self.g, -1, t.shape[-1])
        value = torch.empty_like(flat).index_copy_(1, self.order, flat)
        _put(dst, self.index, value, add=True)

    def operands(self, call: TileCall, q: Tensor, k_str: Tensor, v_str: Tensor):
        """The kernel operands of a call: the block's slices, ``q`` ``(g, R, C, d)``, the
        key run ``k, v`` ``(g, 1, K, d)`` (expand it over the rows for the forward kernel)
        and the ``(g, R, C, K)`` mask view."""
        height = self.grid[0]
        rows, cols = call.y1 - call.y0, call.x1 - call.x0
        keys = (call.r1 - call.r0) * self.s
        js, r0 = self.strips - 1 - call.strip, height - call.r1
        block = (slice(None), slice(call.y0, call.y1), slice(call.x0, call.x1))
        kv = k_str[:, js, r0 : r0 + call.r1 - call.r0].reshape(self.g, 1, keys, -1)
        vv = v_str[:, js, r0 : r0 + call.r1 - call.r0].reshape(self.g, 1, keys, -1)
        u = self.u
        mask = u.as_strided(
            (self.g, rows, cols, keys),
            (u.stride(0), self.s, self.pitch, 1),
            u.storage_offset() + (js * self.s + call.x0) * self.pitch + (r0 + call.y0) * self.s,
        )
        if self.key_term is not None:
            mask = mask + self.key_term[:, js, r0 : r0 + call.r1 - call.r0].reshape(
                self.g, 1, 1, keys
            )
        return block, q[block], kv, vv, mask


def _grid_view(t: Tensor, grid_size: Tuple[int, int]) -> Tensor:
    """``(heads, N, ...)`` -> ``(heads, H, W, ...)`` (a view)."""
    return t.view(t.shape[0], grid_size[0], grid_size[1], *t.shape[2:])


_POOLS: dict = {}
_POOL_LOCK = threading.Lock()


_BUILDING = object()  # a state that some thread is building


class _Stopped(Exception):
    """Raised to a worker that asks for a state after the run was stopped (another
    thread failed: that thread's error is the one the caller sees)."""


class _GroupStates:
    """Per-group working state, built by ``make(group)`` (once, by whoever needs it
    first: a worker at the group's first unit, or :meth:`prefetch`) and handed to
    ``done(group, state)`` (then dropped) when the group's last unit ends: with the
    units in group order, only the groups being worked on and the next one hold their
    re-pitched table and key / value copies. After :meth:`close` (a failure anywhere),
    :meth:`get` raises :class:`_Stopped` and nothing more is built."""

    def __init__(self, units, make, done):
        self.make, self.done = make, done
        self.left: dict = {}
        for _, gi, _ in units:
            self.left[gi] = self.left.get(gi, 0) + 1
        self.items: dict = {}
        self.begun: set = set()
        self.closed = False
        self.cond = threading.Condition()

    def _build(self, gi):
        """Build ``gi``'s state, claimed (``begun``) by the caller, outside the lock."""
        try:
            state = self.make(gi)
        except BaseException:
            with self.cond:
                self.items.pop(gi, None)
                self.closed = True
                self.cond.notify_all()
            raise
        with self.cond:
            self.items[gi] = state
            self.cond.notify_all()
        return state

    def get(self, gi):
        with self.cond:
            while self.items.get(gi) is _BUILDING and not self.closed:
                self.cond.wait()
            if self.closed:
                raise _Stopped(gi)
            if gi in self.items:
                return self.items[gi]
            self.begun.add(gi)
            self.items[gi] = _BUILDING
        return self._build(gi)

    def release(self, gi) -> None:
        with self.cond:
            self.left[gi] -= 1
            item = self.items.pop(gi) if self.left[gi] == 0 else None
        if item is not None:
            self.done(gi, item)
            with self.cond:  # only now is the state's memory free for the next one
                self.cond.notify_all()

    def close(self) -> None:
        """Stop the run: :meth:`prefetch` returns, :meth:`get` raises."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def prefetch(self, limit: int) -> None:
        """Build the states in group order ahead of the workers while fewer than
        ``limit`` states are held, so that a worker reaching a new group rarely stops to
        build its state (with ``limit`` = the number of workers and the units handed out
        in order, as many states as the workers hold anyway). Returns when every group
        has begun or after :meth:`close`."""
        for gi in sorted(self.left):
            with self.cond:
                while not self.closed and gi not in self.begun and len(self.items) >= limit:
                    self.cond.wait()
                if self.closed:
                    return
                if gi in self.begun:
                    continue
                self.begun.add(gi)
                self.items[gi] = _BUILDING
            self._build(gi)


def _run_units(units, fn, states: _GroupStates, dynamic: bool = False) -> None:
    """Run ``fn(worker, calls, state)`` for every unit of :meth:`TilePlan.units`, with
    the state of the unit's group from ``states``.

    With ``torch.get_num_threads() = n > 1`` the units run on ``n`` Python threads, each
    running its kernels on one intra-op thread (the kernels release the GIL; many small
    kernel calls each synchronising two OpenMP threads were slower than one thread on a
    shared machine), while the calling thread builds the next groups' states
    (:meth:`_GroupStates.prefetch`). The units go group by group, largest first within
    a group, so the workers share at most a few groups' states at a time. ``dynamic``:
    every worker takes the next unit when it is free (the forward: each unit writes its
    own output rows, so the result does not depend on who ran what); otherwise each
    unit is given in advance to the least loaded worker by its modelled cost (the
    backward: key gradients are summed per worker, and a fixed assignment keeps that
    sum the same from run to run). The first failure stops the run and is raised after
    every worker has stopped."""
    workers = min(torch.get_num_threads(), len(units))

    def unit(w, gi, calls):
        fn(w, calls, states.get(gi))
        states.release(gi)

    order = sorted(units, key=lambda u: (u[1], -u[0]))  # stable: plan order among ties
    if workers <= 1:
        for _, gi, calls in order:
            unit(0, gi, calls)
        return
    if dynamic:
        queue = iter(order)
        queue_lock = threading.Lock()

        def jobs(w):
            while not states.closed:
                with queue_lock:
                    item = next(queue, None)
                if item is None:
                    return
                yield item[1:]

    else:
        loads = [0.0] * workers
        assigned: List[list] = [[] for _ in range(workers)]
        for cost, gi, calls in order:
            w = loads.index(min(loads))
            loads[w] += cost
            assigned[w].append((gi, calls))

        def jobs(w):
            return assigned[w]

    with _POOL_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ThreadPoolExecutor(workers, 'lookhere-tiled')
    inference = torch.is_inference_mode_enabled()  # grad modes are per thread

    def job(w):
        try:
            with torch.inference_mode(inference), torch.no_grad():
                for gi, calls in jobs(w):
                    unit(w, gi, calls)
        except BaseException:
            states.close()
            raise

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        futures = [pool.submit(job, w) for w in range(workers)]
        try:
            with torch.inference_mode(inference), torch.no_grad():
                states.prefetch(workers)
        finally:
            errors = [f.exception() for f in futures]  # waits for every worker
            states.close()
        failed = [e for e in errors if e is not None and not isinstance(e, _Stopped)]
        if failed:
            raise failed[0]
    finally:
        torch.set_num_threads(threads)


def _unit_rows(calls: List[TileCall]) -> Tuple[int, int]:
    """The query grid rows ``y0:y1`` a unit's calls cover (its top-level row block)."""
    return min(c.y0 for c in calls), max(c.y1 for c in calls)


def _prefix_partial(q: Tensor, k: Tensor, v: Tensor, work: torch.dtype) -> Tuple[Tensor, Tensor]:
    """The partial ``(out, lse)`` of one unit's queries ``q`` ``(g, R, W, d)`` against the
    ``J`` global prefix keys ``k, v`` ``(g, J, d)`` (bias 0), computed in ``work`` (the
    unit's queries are copied to it: a tensor of the unit accumulator's size, never the
    frame's). Returns ``(g, R, W, d)`` and ``(g, R, W)``."""
    g, rows, cols, dim = q.shape
    kc, vc = k.to(work), v.to(work)
    sc = torch.matmul(q.reshape(g, rows * cols, dim).to(work), kc.transpose(-1, -2))
    sc = sc * dim**-0.5  # (g, R*W, J)
    if k.shape[1] == 1:  # one key: its value, weight 1
        o = vc[:, None, None, 0, :].expand(g, rows, cols, vc.shape[-1])
        return o, sc.view(g, rows, cols)
    o = torch.matmul(sc.softmax(-1), vc).view(g, rows, cols, vc.shape[-1])
    return o, sc.logsumexp(-1).view(g, rows, cols)


def _prefix_grads(
    dout: Tensor, q: Tensor, out: Tensor, lse: Tensor, k: Tensor, v: Tensor, work: torch.dtype
) -> Tuple[Tensor, Tensor, Tensor]:
    """The ``J`` prefix keys' share of one unit's gradients, in ``work``: ``(dq, dk, dv)``
    of shapes ``q``'s ``(g, R, W, d)`` and ``(g, J, d)``, from the *global* ``out`` and
    ``lse`` (the same formulas as the flash backward; the unit's rows are copied to
    ``work``)."""
    g, rows, cols, dim = q.shape
    scale = dim**-0.5
    qw, dow, ow = (t.reshape(g, rows * cols, -1).to(work) for t in (q, dout, out))
    kc, vc = k.to(work), v.to(work)
    p = torch.exp(torch.matmul(qw, kc.transpose(-1, -2)) * scale - lse.reshape(g, -1, 1))
    delta = (dow * ow).sum(-1, keepdim=True)
    ds = p * (torch.matmul(dow, vc.transpose(-1, -2)) - delta)  # (g, R*W, J)
    dq = torch.matmul(ds, kc * scale).view(g, rows, cols, dim)
    dk = torch.matmul(ds.transpose(-1, -2), qw) * scale
    dv = torch.matmul(p.transpose(-1, -2), dow)
    return dq, dk, dv


def _forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor,
    key_term: Optional[Tensor],
    plan: TilePlan,
    off: int,
    want_lse: bool,
) -> Tuple[Tensor, Optional[Tensor]]:
    """The forward: ``(out, lse)``. The partials of a unit (one head group x one block of
    ``plan.tile_rows`` query rows) are merged in a float32 accumulator of that unit only
    (``g x tile_rows x W x d``), which is then written to the output in ``q``'s dtype
    (float32 / float64 inputs accumulate straight into the output): no float32 copy of
    the frame's queries or output exists under bfloat16 / float16."""
    batch, heads, total, dim = q.shape
    grid = plan.grid_size
    work = work_dtype(q.dtype)
    direct = q.dtype == work  # accumulate straight into the output
    # (B, T, heads, d) in memory, like the flash kernel's output: the model's
    # ``out.transpose(1, 2).reshape(B, T, C)`` is then a view, not a copy (which the
    # output projection would also keep for backward)
    shape = (batch, total, heads, v.shape[-1])
    out = (q.new_zeros(shape) if direct else q.new_empty(shape)).permute(0, 2, 1, 3)
    lse = q.new_empty(batch, heads, total, dtype=work)
    units = plan.units()
    for b in range(batch):
        q_all = _grid_view(q[b, :, off:], grid)  # (heads, H, W, d)
        out_all = _grid_view(out[b, :, off:], grid)
        m_all = _grid_view(lse[b, :, off:], grid)
        m_all.fill_(EMPTY_LSE)

        def make(gi):
            grp = _Group(plan.groups[gi], table, key_term, grid, q.dtype)
            prefix = tuple(_take(t[b, :, :off], grp.index) for t in (k, v)) if off else None
            return (
                grp,
                _take(q_all, grp.index),
                _take(out_all, grp.index),
                _take(m_all, grp.index),
                grp.strip_layout(k[b, :, off:]),
                grp.strip_layout(v[b, :, off:]),
                prefix,
            )

        def done(gi, state):
            grp, _, out_g, m = state[:4]
            if not isinstance(grp.index, slice):
                _put(out_all, grp.index, out_g)
                _put(m_all, grp.index, m)

        def run(worker, calls, state):
            grp, qg, out_g, m, k_str, v_str, prefix = state
            y0, y1 = _unit_rows(calls)
            if direct:
                acc = out_g[:, y0:y1]
            else:
                acc = torch.zeros(out_g[:, y0:y1].shape, dtype=work, device=q.device)
            for call in calls:
                block, qv, kv, vv, mask = grp.operands(call, qg, k_str, v_str)
                rows = qv.shape[1]
                o, l = FLASH(
                    qv, kv.expand(-1, rows, -1, -1), vv.expand(-1, rows, -1, -1), attn_mask=mask
                )
                if call.empty is not None:
                    l = l.masked_fill(call.empty, EMPTY_LSE)
                at = (block[0], slice(call.y0 - y0, call.y1 - y0), block[2])
                merge_partial(acc[at], m[block], o, l, call.first)
            if prefix is not None:  # the J prefix keys, bias 0 to every patch query
                o, l = _prefix_partial(qg[:, y0:y1], *prefix, work)
                merge_partial(acc, m[:, y0:y1], o, l, False)
            if not direct:
                out_g[:, y0:y1] = acc

        _run_units(units, run, _GroupStates(units, make, done), dynamic=True)
    if off:  # the prefix queries, bias 0 to every key
        o, l = FLASH(q[:, :, :off], k, v)
        out[:, :, :off] = o
        lse[:, :, :off] = l
    return out, (lse if want_lse else None)


def _backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    table: Tensor,
    key_term: Optional[Tensor],
    plan: TilePlan,
    off: int,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Gradients of ``q, k, v``: the CPU flash backward call by call, with the global
    output and log-sum-exp (each call's share of the gradient is then exact).

    Accumulated in float32 (float64 for float64 inputs) and written in the inputs' dtype:
    a unit's query gradient in a ``g x tile_rows x W x d`` accumulator, a group's key /
    value gradients in its strips (``g x N x d`` per worker thread, summed when the group
    is done); under bfloat16 / float16 no float32 copy of the frame's ``q, k, v`` or of
    their gradients exists."""
    batch, dim = q.shape[0], q.shape[-1]
    grid = plan.grid_size
    work = work_dtype(q.dtype)
    direct = q.dtype == work
    dout = dout.to(q.dtype)
    dq = torch.zeros(q.shape, dtype=q.dtype)
    dk = torch.zeros(k.shape, dtype=k.dtype)
    dv = torch.zeros(v.shape, dtype=v.dtype)
    if off:  # the prefix queries (first: the groups add their key gradients to these)
        gq, gk, gv = FLASH_BWD(
            dout[:, :, :off], q[:, :, :off], k, v, out[:, :, :off], lse[:, :, :off], 0.0, False
        )
        dq[:, :, :off] = gq
        dk.copy_(gk)
        dv.copy_(gv)
    units = plan.units()
    buffers: dict = {}
    for b in range(batch):
        views = [_grid_view(t[b, :, off:], grid) for t in (q, dout, out, lse, dq)]

        def make(gi):
            grp = _Group(plan.groups[gi], table, key_term, grid, q.dtype)
            prefix = tuple(_take(t[b, :, :off], grp.index) for t in (k, v)) if off else None
            return (
                (grp,)
                + tuple(_take(t, grp.index) for t in views)
                + (grp.strip_layout(k[b, :, off:]), grp.strip_layout(v[b, :, off:]), {}, prefix)
            )

        def done(gi, state):
            grp, dqg, key_grads = state[0], state[5], state[8]
            if not isinstance(grp.index, slice):
                _put(views[4], grp.index, dqg)
            # one sum per group in the work dtype (workers in order), one rounding
            sums = [sum(g[i] for _, g in sorted(key_grads.items())) for i in range(4)]
            grp.add_from_strips(dk[b, :, off:], sums[0])
            grp.add_from_strips(dv[b, :, off:], sums[1])
            if off:
                _put(dk[b, :, :off], grp.index, sums[2], add=True)
                _put(dv[b, :, :off], grp.index, sums[3], add=True)

        def run(worker, calls, state):
            grp, qg, dog, og, lg, dqg, k_str, v_str, key_grads, prefix = state
            if worker not in key_grads:
                shapes = (k_str.shape, v_str.shape) + (
                    (prefix[0].shape, prefix[1].shape) if off else ((), ())
                )
                key_grads[worker] = [torch.zeros(s, dtype=work) for s in shapes]
            dk_str, dv_str, dk_pre, dv_pre = key_grads[worker]
            y0, y1 = _unit_rows(calls)
            if direct:
                acc = dqg[:, y0:y1]
            else:
                acc = torch.zeros(dqg[:, y0:y1].shape, dtype=work, device=q.device)
            for call in calls:
                # the block's queries as one query dimension (the flash backward gives
                # a key run shared by several query rows one gradient each: R times the
                # work on dk, dv), so its bias is copied out of the view into a buffer
                block, qv, kv, vv, mask = grp.operands(call, qg, k_str, v_str)
                g, rows, cols, keys = mask.shape
                n_q = rows * cols
                buffer = buffers.get(worker)
                if buffer is None or buffer.numel() < g * n_q * keys:
                    buffer = buffers[worker] = mask.new_empty(g * n_q * keys)
                m = buffer[: g * n_q * keys].view(1, g, n_q, keys)
                m.view(g, rows, cols, keys).copy_(mask)
                flat = [
                    t.reshape(1, g, n_q, *t.shape[3:])
                    for t in (dog[block], qv, og[block], lg[block])
                ]
                gq, gk, gv = FLASH_BWD(
                    flat[0],
                    flat[1],
                    kv.transpose(0, 1),
                    vv.transpose(0, 1),
                    flat[2],
                    flat[3],
                    0.0,
                    False,
                    attn_mask=m,
                )
                acc[:, call.y0 - y0 : call.y1 - y0, call.x0 : call.x1] += gq.view(
                    g, rows, cols, dim
                )
                js, r0 = grp.strips - 1 - call.strip, grid[0] - call.r1
                sl = slice(r0, r0 + call.r1 - call.r0)
                dk_str[:, js, sl] += gk.view(g, -1, grp.s, dim)
                dv_str[:, js, sl] += gv.view(g, -1, grp.s, v.shape[-1])
            if prefix is not None:  # the J prefix keys' share of the unit's queries
                gq, gk, gv = _prefix_grads(
                    *(t[:, y0:y1] for t in (dog, qg, og, lg)), *prefix, work
                )
                acc += gq
                dk_pre += gk
                dv_pre += gv
            if not direct:
                dqg[:, y0:y1] = acc

        _run_units(units, run, _GroupStates(units, make, done))
    return dq, dk, dv


class _TiledAttention(torch.autograd.Function):
    """Tiled attention with a flash-style backward: saves ``q, k, v, out, lse``."""

    @staticmethod
    def forward(ctx, q, k, v, table, key_term, plan, off):
        out, lse = _forward(q, k, v, table, key_term, plan, off, want_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.table, ctx.key_term, ctx.plan, ctx.off = table, key_term, plan, off
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dout = last_dim_contiguous(dout)
        dq, dk, dv = _backward(dout, q, k, v, out, lse, ctx.table, ctx.key_term, ctx.plan, ctx.off)
        return dq, dk, dv, None, None, None, None


def tiled_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    dropout_p: float = 0.0,
    options: Optional[TileOptions] = None,
    plans: Optional[MutableMapping] = None,
) -> Tensor:
    """Exact LookHere attention, computing only the key strips and rows each head group
    can see (see the module docstring).

    Args:
        q, k, v: ``(B, heads, T, d)`` on CPU with ``T = J + H*W``; float32, float64,
            bfloat16 or float16.
        grid_bias: tables of the grid (cast to ``q``'s dtype).
        layer: which layer's table to use.
        cls_token: number ``J`` of global prefix tokens at the front (CLS, or Jumbo
            tokens; True = 1), bias 0 to and from everything.
        dropout_p: must be 0 (attention dropout is not supported: use ``chunked``).
        options: :class:`TileOptions` of the plan; None: the defaults.
        plans: a cache for the plans (dict, or the engine's ``BoundedCache``); None:
            planned on every call.

    Returns:
        ``(B, heads, T, d)`` in ``q``'s dtype. Differentiable in ``q, k, v`` (not in the
        table: a table that requires grad while autograd records is refused).
    """
    off, table, key_term = flash_layer_inputs(
        'tiled', q, k, grid_bias, layer, cls_token, dropout_p
    )
    plan = get_plan(grid_bias, layer, options, plans)
    q, k, v = (last_dim_contiguous(t) for t in (q, k, v))  # the flash kernel assumes it
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _TiledAttention.apply(q, k, v, table, key_term, plan, off)
    return _forward(q, k, v, table, key_term, plan, off, want_lse=False)[0]


def attend(call: AttentionCall) -> Tensor:
    """:func:`tiled_attention` with the engine's tables and plan cache."""
    grid_bias, index = call.tables()
    args = (grid_bias, index, call.cls_token, call.dropout_p)
    return tiled_attention(call.q, call.k, call.v, *args, plans=call.engine.tiled_plans)
