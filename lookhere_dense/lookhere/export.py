"""Exact LookHere attention for export (ONNX, ``torch.export``): one static grid per file,
the bias computed in the graph from the small per-layer tables, never stored as an
``N x N`` constant.

:class:`StaticGridAttention` stands in for a model's
:class:`~lookhere_dense.lookhere.engine.LookHereAttentionEngine` (same calls) for one grid;
:func:`static_grid_attention` swaps it into every LookHere ViT of a model for the time of
an export. The file then holds the weights, one ``(heads, 2H, 2W-1)`` table per layer
(the relative-offset table plus one row, below) and two small shared int64 index tables;
windowed blocks hold their window-sized bias.

How one global layer is computed (``N = H*W`` patches, ``T = J + N`` with ``J`` global
prefix tokens in front: CLS is ``J = 1``, Jumbo tokens ``J``):

* the patch queries run in blocks of ``cols`` grid **columns** (queries ordered column by
  column inside a block). A block's bias ``(heads, cols*H, (H+1)*W)`` comes from the table
  by two gathers of small index tensors (:func:`column_block_bias`): the table's columns
  for the block's ``qx`` (``cols*W*R`` values), then one gather of whole rows with the
  shared ``(H, H+1)`` row index, whose output is the block in its final layout (runs of
  ``W`` contiguous floats, the fast kind of gather in onnxruntime);
* prefix tokens without a pad copy: the table gets one more offset row (index ``2H-1``)
  that is 0 at ``dx = 0`` and ``-inf`` elsewhere, and the keys are
  ``[patches, p_0 x W, ..., p_{J-1} x W]`` (each prefix key and value repeated ``W``
  times, the row index one column ``2H-1`` per prefix token): query ``qx`` sees exactly
  one copy of each, with bias 0 (:func:`extend_table`). The prefix queries are one
  unmasked attention call;
* ``F.scaled_dot_product_attention(q_block, keys, values, attn_mask=bias)``: ONNX
  ``Attention`` from opset 23 (fused; onnxruntime's CPU kernel keeps one bias-sized
  scratch), MatMul / Softmax below.

Two things keep exporters and runtimes from turning this back into dense constants:

* a **runtime zero** (:func:`runtime_zero`: ``x > x`` is False for every float, NaN too)
  is added to the small index tensors *before* they are broadcast. Without it every bias
  block is a function of constants alone: onnxscript folds the small ones, and
  onnxruntime's session constant folding (no size limit) folds every block of every layer
  when the session loads -- the dense biases, in RAM;
* the blocks are **chained**: block ``i+1``'s zero comes from block ``i``'s output and is
  added to its queries, so a runtime runs the blocks one after the other (unchained,
  onnxruntime ran every block's ``Q . K^T`` first and held all the logits of a layer).

Torch alone (what is traced is plain tensor code; the tables are built eagerly, before
tracing, from :mod:`.bias`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention.windows import attend_in_windows, effective_window, padded_grid, window_key_mask
from .bias import build_grid_bias
from .pos_encoding import PositionEncoding
from .prefix_tokens import num_prefix_tokens, prefix_phrase
from .vit import LookHereVisionTransformer

__all__ = [
    'StaticGridAttention',
    'static_grid_attention',
    'runtime_zero',
    'offset_indices',
    'extend_table',
    'column_block_bias',
    'static_grid_global_attention',
    'auto_columns',
    'query_blocked_attention',
    'QUERY_BLOCK_BUDGET',
    'DEFAULT_BUDGET_MB',
]

#: the default block budget in MiB (the largest bias / probability block of one attention
#: call in an exported graph). 16 was tried: onnxruntime's peak for the 1024x2048
#: Cityscapes ViT-B Segmenter was 1,763 MiB against 1,733 with 48 (``docs/deploy.md``;
#: measured with buffer reuse on and the arena off, the session settings of the time)
DEFAULT_BUDGET_MB = 48.0

QUERY_BLOCK_BUDGET = 'query_block_budget_mb'
"""The attribute by which other modules take part in :func:`static_grid_attention`: a module
of the model with this attribute (None outside an export) gets the block budget in MiB for
the time of the export and attends through :func:`query_blocked_attention` (the Segmenter
mask head's unmasked attention over patches and class tokens does)."""


def runtime_zero(t: Tensor) -> Tensor:
    """An int64 scalar 0 that no graph optimiser can prove constant: it depends on ``t``."""
    x = t.reshape(-1)[:1]
    return (x > x).to(torch.int64).reshape(())


def offset_indices(grid: Tuple[int, int], device=None, prefix: int = 1) -> Tuple[Tensor, Tensor]:
    """``iy (H, H+J)``: ``ky - qy + H-1``, plus ``J = prefix`` last columns ``2H-1`` (the
    prefix row of :func:`extend_table`, one per prefix token); ``ix (W, W)``:
    ``kx - qx + W-1``. int64, built once per grid and shared by every block and layer."""
    height, width = grid
    ay, ax = torch.arange(height, device=device), torch.arange(width, device=device)
    iy = ay[None, :] - ay[:, None] + (height - 1)
    iy = torch.cat([iy, torch.full((height, prefix), 2 * height - 1, device=device)], 1)
    return iy, ax[None, :] - ax[:, None] + (width - 1)


def extend_table(table: Tensor) -> Tensor:
    """``(heads, 2H-1, 2W-1)`` -> ``(heads, 2H, 2W-1)``: one more offset row, 0 at ``dx = 0``
    and ``-inf`` elsewhere (each prefix key, repeated ``W`` times, see the module
    docstring)."""
    heads, _, cols = table.shape
    row = torch.full((heads, 1, cols), -math.inf, dtype=table.dtype, device=table.device)
    row[:, :, cols // 2] = 0
    return torch.cat([table, row], dim=1)


def column_block_bias(
    table: Tensor,
    grid: Tuple[int, int],
    c0: int,
    c1: int,
    iy: Tensor,
    zero: Optional[Tensor] = None,
    key_term: Optional[Tensor] = None,
) -> Tensor:
    """The bias of the queries in grid columns ``c0:c1`` (all rows; ordered ``(qx, qy)``)
    against the keys ``[patches, p_0 x W, ..., p_{J-1} x W]``.

    Args:
        table: :func:`extend_table`'s ``(heads, R, 2W-1)`` (or a table without the prefix
            row, with ``iy[:, :H]``).
        grid: ``(H, W)``.
        c0, c1: the block's grid columns.
        iy: the row index of :func:`offset_indices` ``(H, K)``.
        zero: :func:`runtime_zero`, added to the small indices. Default: None.
        key_term: ``(heads, H*W)`` per-key term of ``center`` heads. Default: None.

    Returns:
        ``(heads, (c1-c0) * H, K * W)``.
    """
    height, width = grid
    heads, rows, _ = table.shape
    c, keys = c1 - c0, iy.shape[1]
    qx = torch.arange(c0, c1, device=table.device)
    kx = torch.arange(width, device=table.device)
    ixc = kx[None, :] - qx[:, None] + (width - 1)  # (c, W)
    if zero is not None:
        ixc, iy = ixc + zero, iy + zero
    t = table.index_select(2, ixc.reshape(-1)).reshape(heads, rows, c, width)
    t = t.permute(0, 2, 1, 3)  # (heads, c, R, W): small
    bias = t.index_select(2, iy.reshape(-1)).reshape(heads, c * height, keys * width)
    if key_term is not None:
        bias = bias + F.pad(key_term, (0, bias.shape[-1] - key_term.shape[-1]))[:, None]
    return bias


def auto_columns(
    heads: int, grid: Tuple[int, int], budget_mb: float = DEFAULT_BUDGET_MB, prefix: int = 1
) -> int:
    """Grid columns per block so that one fp32 bias block ``(heads, c*H, (H+J)*W)`` (``J =
    prefix`` tokens) stays within ``budget_mb`` (at least one; onnxruntime's cost per query
    is flat from about 128 queries per block on)."""
    height, width = grid
    per_column = heads * height * (height + prefix) * width * 4
    return max(1, min(width, int(budget_mb * 2**20 // per_column)))


def static_grid_global_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor,
    grid: Tuple[int, int],
    cls_token: Union[bool, int],
    columns: int,
    indices: Tuple[Tensor, Tensor],
    key_term: Optional[Tensor] = None,
) -> Tensor:
    """Exact LookHere attention of one global layer for a static grid, traceable.

    Args:
        q, k, v: ``(B, heads, T, d)``, ``T = J + H*W``.
        table: the layer's :func:`extend_table` ``(heads, 2H, 2W-1)``, in ``q``'s dtype.
        grid: ``(H, W)``.
        cls_token: number ``J`` of global prefix tokens at the front (CLS, or Jumbo
            tokens; True = 1).
        columns: grid columns per block.
        indices: :func:`offset_indices` with at least ``J`` prefix columns.
        key_term: ``(heads, H*W)`` of ``center`` heads. Default: None.

    Returns:
        ``(B, heads, T, d)``.
    """
    height, width = grid
    off = num_prefix_tokens(cls_token)
    b, h, _, d = q.shape
    if indices[0].shape[1] < height + off:
        raise ValueError(
            f'offset_indices were built for {indices[0].shape[1] - height} prefix tokens, '
            f'the attention has {off}'
        )
    zero = runtime_zero(q)
    iy = indices[0] if indices[0].shape[1] == height + off else indices[0][:, : height + off]
    if not off:
        table = table[:, : 2 * height - 1]
    keys, values = k, v
    if off == 1:  # keys [patches, CLS x W]
        keys, values = (
            torch.cat([t[:, :, 1:], t[:, :, :1].expand(b, h, width, d)], dim=2) for t in (k, v)
        )
    elif off:  # keys [patches, p_0 x W, ..., p_{J-1} x W]
        keys, values = (
            torch.cat(
                [t[:, :, off:], t[:, :, :off, None].expand(b, h, off, width, d).flatten(2, 3)],
                dim=2,
            )
            for t in (k, v)
        )
    grid_q = q[:, :, off:].reshape(b, h, height, width, d)
    outs: List[Tensor] = []
    for c0 in range(0, width, columns):
        c1 = min(width, c0 + columns)
        bias = column_block_bias(table, grid, c0, c1, iy, zero, key_term)
        qb = grid_q[:, :, :, c0:c1].transpose(2, 3).reshape(b, h, (c1 - c0) * height, d)
        if c0:  # after the previous block: no runtime runs every block's Q.K^T at once
            qb = qb + zero.to(qb.dtype)
        out = F.scaled_dot_product_attention(qb, keys, values, attn_mask=bias.unsqueeze(0))
        outs.append(out)
        zero = runtime_zero(out)
    res = torch.cat(outs, dim=2).reshape(b, h, width, height, d).transpose(2, 3)
    res = res.reshape(b, h, height * width, d)
    if not off:
        return res
    return torch.cat([F.scaled_dot_product_attention(q[:, :, :off], k, v), res], dim=2)


def query_blocked_attention(
    q: Tensor, k: Tensor, v: Tensor, budget_mb: float = DEFAULT_BUDGET_MB
) -> Tensor:
    """Unmasked attention, traceable, in chained blocks of queries.

    ``F.scaled_dot_product_attention(q, k, v)`` exports as one ONNX ``Attention`` whose
    onnxruntime CPU kernel holds the whole ``(B, heads, Tq, Tk)`` probabilities (3.2 GB for
    the Segmenter mask head on a 1024x2048 frame); here the queries run in blocks whose
    logits stay within ``budget_mb`` (at least 128 queries), chained like the bias blocks
    of :func:`static_grid_global_attention` (the module docstring) so a runtime runs them
    one after the other. Same values as one call.

    Args:
        q: ``(B, heads, Tq, d)``; k, v: ``(B, heads, Tk, d)``.
        budget_mb: the largest fp32 logits block. Default: 48.

    Returns:
        ``(B, heads, Tq, d)``.
    """
    b, h, tq, _ = q.shape
    per_query = b * h * k.shape[2] * 4
    block = max(128, int(budget_mb * 2**20 // per_query))
    if block >= tq:
        return F.scaled_dot_product_attention(q, k, v)
    outs: List[Tensor] = []
    zero = None
    for s0 in range(0, tq, block):
        qb = q[:, :, s0 : s0 + block]
        if zero is not None:
            qb = qb + zero.to(qb.dtype)
        out = F.scaled_dot_product_attention(qb, k, v)
        outs.append(out)
        zero = runtime_zero(out)
    return torch.cat(outs, dim=2)


class StaticGridAttention:
    """A stand-in for a :class:`~lookhere_dense.lookhere.engine.LookHereAttentionEngine`
    (same calls) that serves one input grid with export-friendly code.

    Everything that depends on the grid is built here, eagerly (outside any tracing): one
    :func:`extend_table` per layer (at the engine's config, or at the current values of
    learnable ``slopes``), the shared indices, and for ``window_size > 0`` the window-sized
    bias of every layer and the padding mask. Nothing enters a ``state_dict``.

    Args:
        engine: the model's engine (its config, depth and head count).
        grid: ``(H, W)`` of the exported input.
        window_size: the window of the model's windowed blocks (0: none). Default: 0.
        cls_token: number ``J`` of global prefix tokens of the model (CLS: True = 1,
            Jumbo: ``J``; 0: none); the calls must pass the same. Default: True.
        slopes: the encoding's learnable slopes, if any. Default: None.
        dtype: the tables' dtype (the model's). Default: float32.
        budget_mb: the largest bias block of a global layer. Default: 48.
    """

    def __init__(
        self,
        engine: Any,
        grid: Tuple[int, int],
        window_size: int = 0,
        cls_token: Union[bool, int] = True,
        slopes: Optional[nn.Module] = None,
        dtype: torch.dtype = torch.float32,
        budget_mb: float = DEFAULT_BUDGET_MB,
    ):
        self.config, self.depth, self.num_heads = engine.config, engine.depth, engine.num_heads
        self.grid = (int(grid[0]), int(grid[1]))
        self.window_size = (
            effective_window(self.grid, window_size, self.config) if window_size else 0
        )
        self.prefix = num_prefix_tokens(cls_token)
        self.last_backend = 'static_grid'
        with torch.no_grad():
            if slopes is None:
                gb = build_grid_bias(
                    self.config, self.grid, self.depth, self.num_heads, dtype=dtype
                )
                tables = [gb.table[layer] for layer in range(self.depth)]
                keys = None if gb.key_term is None else list(gb.key_term)
            else:
                per_layer = [
                    engine.slope_bias(layer, self.grid, 'cpu', dtype, slopes)
                    for layer in range(self.depth)
                ]
                tables = [g.table[0] for g in per_layer]
                keys = (
                    None if per_layer[0].key_term is None else [g.key_term[0] for g in per_layer]
                )
            self.tables = [extend_table(t).clone() for t in tables]
            self.key_terms = keys
            self.indices = offset_indices(self.grid, prefix=max(1, self.prefix))
            self.columns = auto_columns(
                self.num_heads, self.grid, budget_mb, prefix=max(1, self.prefix)
            )
            self.window_bias: List[Tensor] = []
            self.window_pad = None
            if self.window_size:
                ws = self.window_size
                if slopes is None:
                    wb = build_grid_bias(
                        self.config, (ws, ws), self.depth, self.num_heads, dtype=dtype
                    )
                    self.window_bias = [
                        wb.dense(layer, self.prefix) for layer in range(self.depth)
                    ]
                else:
                    self.window_bias = [
                        engine.slope_bias(layer, (ws, ws), 'cpu', dtype, slopes).dense(
                            0, self.prefix
                        )
                        for layer in range(self.depth)
                    ]
                if padded_grid(self.grid, ws) != self.grid:
                    self.window_pad = window_key_mask(self.grid, ws, self.prefix, dtype=dtype)

    def _check(self, grid_size, dropout_p: float, cls_token: Union[bool, int]) -> None:
        if tuple(grid_size) != self.grid:
            raise ValueError(
                f'this attention was prepared for the patch grid {self.grid}, '
                f'got {tuple(grid_size)}: export at the input size it serves'
            )
        if dropout_p:
            raise ValueError('static-grid (export) attention is for inference: no dropout')
        for device in ('cpu', 'cuda'):
            if torch.is_autocast_enabled(device):
                dtype = torch.get_autocast_dtype(device)
                raise ValueError(
                    f'static-grid (export) attention under torch.autocast ({device}, {dtype}): '
                    'an exporter records a graph that mixes dtypes (bias and queries) and '
                    "fails when run (torch's ONNX exporter writes one onnxruntime cannot load): "
                    f'convert the model instead (model.to({dtype}); .half() for ONNX) and '
                    'export without autocast'
                )
        if num_prefix_tokens(cls_token) != self.prefix:
            raise ValueError(
                f'this attention was prepared {prefix_phrase(self.prefix)} (CLS / '
                f'jumbo_tokens), got a call {prefix_phrase(num_prefix_tokens(cls_token))}'
            )

    def __call__(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size,
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        backend: Optional[str] = None,
        slopes: Optional[nn.Module] = None,
    ) -> Tensor:
        """Global attention of ``layer`` (the engine's call)."""
        self._check(grid_size, dropout_p, cls_token)
        key_term = None if self.key_terms is None else self.key_terms[layer].to(q.dtype)
        return static_grid_global_attention(
            q,
            k,
            v,
            self.tables[layer].to(q.dtype),
            self.grid,
            cls_token,
            self.columns,
            self.indices,
            key_term,
        )

    def window_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size,
        window_size: int,
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        slopes: Optional[nn.Module] = None,
    ) -> Tensor:
        """Window attention of ``layer`` with the window-sized bias built here (the
        engine's call; the same frame and arithmetic as the engine's)."""
        self._check(grid_size, dropout_p, cls_token)
        if int(window_size) != self.window_size:
            raise ValueError(f'prepared for windows of {self.window_size}, got {window_size}')
        bias = self.window_bias[layer].to(q.dtype)
        pad = None if self.window_pad is None else self.window_pad.to(q.dtype)

        def attend(qw: Tensor, kw: Tensor, vw: Tensor) -> Tensor:
            batch, n_win = qw.shape[:2]
            flat = [t.flatten(0, 1) for t in (qw, kw, vw)]
            mask = bias.unsqueeze(0) if pad is None else (bias + pad).repeat(batch, 1, 1, 1)
            out = F.scaled_dot_product_attention(*flat, attn_mask=mask)
            return out.view(batch, n_win, *out.shape[1:])

        return attend_in_windows(q, k, v, self.grid, self.window_size, cls_token, attend)

    def reset(self, config=None) -> None:
        """Nothing is cached here (the engine's ``reset``)."""


@contextlib.contextmanager
def static_grid_attention(
    model: nn.Module, image_size: Tuple[int, int], budget_mb: float = DEFAULT_BUDGET_MB
) -> Iterator[List[StaticGridAttention]]:
    """Inside the block every LookHere ViT of ``model`` (``lookhere`` / ``alibi2d``
    encodings) attends through a :class:`StaticGridAttention` for the patch grid of
    ``image_size``; the engines, and empty position-encoding caches, are back afterwards.

    Every position encoding's caches are emptied before and after (a cache filled while an
    exporter traces would hold its tracing tensors). Modules with a
    :data:`QUERY_BLOCK_BUDGET` attribute get ``budget_mb`` for the time of the block.

    Yields:
        The stand-ins put in place.
    """
    swapped = []
    blocked = [m for m in model.modules() if hasattr(m, QUERY_BLOCK_BUDGET)]
    for module in model.modules():
        if isinstance(module, PositionEncoding):
            module.clear_caches()
    try:
        for module in blocked:
            setattr(module, QUERY_BLOCK_BUDGET, float(budget_mb))
        for vit in (m for m in model.modules() if isinstance(m, LookHereVisionTransformer)):
            enc = vit.pos_enc
            engine = getattr(enc, 'engine', None)
            if engine is None or not hasattr(engine, 'slope_bias'):
                continue
            grid = tuple(math.ceil(s / vit.patch_size) for s in image_size)
            dtype = next(vit.parameters()).dtype
            stand_in = StaticGridAttention(
                engine,
                grid,
                vit.window_size if vit.window_block_indexes else 0,
                vit.num_prefix_tokens,
                getattr(enc, 'slopes', None),
                dtype,
                budget_mb,
            )
            swapped.append((enc, engine))
            enc.engine = stand_in
        yield [enc.engine for enc, _ in swapped]
    finally:
        for module in blocked:
            setattr(module, QUERY_BLOCK_BUDGET, None)
        for enc, engine in swapped:
            enc.engine = engine
        for module in model.modules():
            if isinstance(module, PositionEncoding):
                module.clear_caches()
