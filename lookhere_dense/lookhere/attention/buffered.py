"""The ``buffered`` backend: CPU flash attention with the layer's dense bias rebuilt into a
reused buffer at every call (forward, and again in backward).

For grids of about a thousand tokens (a 512x512 crop at patch 16: 32x32 patches) the
tiled plan skips little (its blocks cover most pairs) and pays for many small calls and
their merges, while a cached dense bias per layer (``sdpa``) costs ``heads x T^2`` floats
per layer for as long as the model lives (600 MB for ViT-B at 512x512). This backend keeps
none: the heads are cut into even chunks whose bias stays under :data:`MAX_CALL_BYTES`
(:func:`head_chunks`; ViT-B at 512x512: 2 x 6 heads), and right before each chunk's
kernel call its bias is copied into one buffer, shared by all chunks, layers and both
passes (25 MB for ViT-B at 512x512).

The copy needs no gather
    With the patch keys in *reversed* order (patch ``N-1-i`` at key position ``i``, i.e.
    row ``H-1-y``, column ``W-1-x``), the bias of query ``(qy, qx)`` against key
    position ``(y', x')`` is ``F[qy + y', qx + x']``, ``F`` the relative table flipped in
    both axes. With ``U[h, qx, r, c] = F[h, r, qx + c]`` (``(heads, W, 2H-1, W)``, built
    once per call from the small table) the bias row of query ``(qy, qx)`` is the
    contiguous run ``U[h, qx, qy : qy + H]`` of ``H*W`` values, so the whole patch block
    is a strided view of ``U`` copied in one pass. ``center`` heads' per-key term is
    added to the block; prefix rows and columns are 0.

Saved for backward
    ``q, k, v``, the output and its log-sum-exp (what plain SDPA saves); the backward
    reverses the keys again and, chunk by chunk, rebuilds the bias into the buffer and
    runs the CPU flash backward. No bias is kept between calls.

Limits (refused with a ValueError; ``auto`` does not choose it then): CUDA tensors,
attention dropout, and a table that requires grad while autograd records (the flash
backward gives the bias no gradient: learnable slopes while they train).
"""

from __future__ import annotations

import math
import threading
from typing import List, Optional, Tuple, Union

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..bias import GridBias
from ..cache import BoundedCache
from .common import FLASH, FLASH_BWD, AttentionCall, AttentionRequest, flash_layer_inputs

__all__ = [
    'NAME',
    'BUFFERED_MIN_TOKENS',
    'BUFFERED_MAX_TOKENS',
    'can_run',
    'attend',
    'buffered_attention',
    'dense_bias_reversed',
    'reverse_patches',
    'head_chunks',
    'BiasBuffers',
    'MAX_CALL_BYTES',
]


NAME = 'buffered'

#: ``auto`` (where the ``fused`` kernel is not built) uses ``buffered`` while training from
#: this many tokens (``tiled``'s threshold) up to :data:`BUFFERED_MAX_TOKENS`: a few kernel
#: calls with the dense bias rebuilt into a reused buffer beat the tiled plan's small calls
#: for lh180 at 1025 tokens and tied for lh90; at 1601 ``tiled`` won for lh90
#: (docs/performance.md, "Training crops")
BUFFERED_MIN_TOKENS = 1024
#: see :data:`BUFFERED_MIN_TOKENS`
BUFFERED_MAX_TOKENS = 1300


def can_run(request: AttentionRequest) -> Optional[str]:
    """CPU, no attention dropout, no slope gradients; ``auto`` while training with
    :data:`BUFFERED_MIN_TOKENS` to :data:`BUFFERED_MAX_TOKENS` tokens."""
    if not request.on_cpu:
        return f'runs on CPU only (the call is on {request.device})'
    if request.dropout_p:
        return 'has no attention dropout'
    if request.slope_grads:
        return 'gives the bias table no gradient (learnable slopes while they train)'
    if request.auto and not request.training:
        return 'auto uses it while training only'
    if request.auto and not BUFFERED_MIN_TOKENS <= request.tokens <= BUFFERED_MAX_TOKENS:
        return (
            f'{request.tokens} tokens outside {BUFFERED_MIN_TOKENS}..{BUFFERED_MAX_TOKENS} '
            '(BUFFERED_MIN_TOKENS..BUFFERED_MAX_TOKENS)'
        )
    return None


#: the most bytes of one call's bias: heads are split into even chunks below it
MAX_CALL_BYTES = 32 * 2**20


#: one lock for every engine's buffers (module level, so that models stay deep-copyable)
_TAKE_LOCK = threading.Lock()


class BiasBuffers(BoundedCache):
    """The reused bias buffers of one engine: one per (shape, dtype, thread), the least
    recently used dropped first (a model called from two threads gets two buffers). A
    buffer larger than ``max_bytes`` (one head's bias of a large grid) is handed out
    fresh and not kept."""

    def __init__(self, maxsize: int = 2, max_bytes: Optional[int] = None):
        super().__init__(maxsize, max_bytes=2 * MAX_CALL_BYTES if max_bytes is None else max_bytes)

    def take(self, shape: Tuple[int, ...], dtype: torch.dtype) -> Tensor:
        """The buffer of ``shape`` and ``dtype`` for the calling thread (uninitialised; a
        normal tensor even when first asked for under ``torch.inference_mode``, so that
        later training calls can write it)."""

        def make() -> Tensor:
            with torch.inference_mode(False):
                return torch.empty(shape, dtype=dtype)

        key = (tuple(shape), dtype, threading.get_ident())
        with _TAKE_LOCK:
            return self.get_or_create(key, make)


def reverse_patches(t: Tensor, prefix: int) -> Tensor:
    """``(B, heads, J + N, d)`` -> the same with the ``N`` patch tokens in reversed order
    (the ``J`` prefix tokens stay in front); its own inverse. One gather into one new
    tensor (no intermediate copy)."""
    total = t.shape[2]
    index = torch.cat([torch.arange(prefix), torch.arange(total - 1, prefix - 1, -1)])
    return t.index_select(2, index.to(t.device))


def dense_bias_reversed(
    table: Tensor,
    key_term: Optional[Tensor],
    grid_size: Tuple[int, int],
    prefix: int,
    out: Optional[Tensor] = None,
) -> Tensor:
    """The ``(1, heads, T, T)`` bias of one layer for queries in the model's order and
    keys with the patches reversed (:func:`reverse_patches`), written into ``out``.

    Args:
        table: ``(heads, 2H-1, 2W-1)`` relative table of the layer.
        key_term: ``(heads, H*W)`` per-key term (``center`` heads) or None.
        grid_size: ``(H, W)``.
        prefix: number ``J`` of prefix tokens (rows and columns of 0).
        out: ``(1, heads, T, T)`` buffer in ``table``'s dtype; None: allocated.
    """
    height, width = grid_size
    heads, n = table.shape[0], height * width
    total = n + prefix
    if out is None:
        out = table.new_empty(1, heads, total, total)
    flipped = table.flip(-2, -1)
    u = flipped.unfold(-1, width, 1).permute(0, 2, 1, 3).contiguous()  # (heads, W, 2H-1, W)
    rows = u.as_strided((heads, height, width, n), (u.stride(0), width, u.stride(1), 1))
    block = out[0, :, prefix:, prefix:]
    block.view(heads, height, width, n).copy_(rows)
    if key_term is not None:
        block += key_term.flip(-1)[:, None, :]
    if prefix:
        out[0, :, :prefix].zero_()
        out[0, :, prefix:, :prefix].zero_()
    return out


def head_chunks(heads: int, tokens: int, itemsize: int) -> List[slice]:
    """Even chunks of the heads whose ``(chunk, T, T)`` bias stays within
    :data:`MAX_CALL_BYTES` (at least one head per chunk). ViT-B at 512x512 (1025 tokens,
    fp32): two chunks of 6 heads, a 25 MB buffer."""
    per_head = tokens * tokens * itemsize
    calls = math.ceil(heads / max(1, min(heads, MAX_CALL_BYTES // per_head)))
    size = math.ceil(heads / calls)
    return [slice(h, min(heads, h + size)) for h in range(0, heads, size)]


class _Calls:
    """The kernel calls of one layer: per head chunk, its bias written into the buffer
    (or a fresh tensor) right before the call."""

    def __init__(self, table, key_term, grid_size, prefix, buffers, dtype):
        self.table, self.key_term = table, key_term
        self.grid, self.prefix, self.buffers, self.dtype = grid_size, prefix, buffers, dtype
        heads = table.shape[0]
        self.total = grid_size[0] * grid_size[1] + prefix
        itemsize = torch.empty((), dtype=dtype).element_size()
        self.chunks = head_chunks(heads, self.total, itemsize)

    def bias(self, chunk: slice) -> Tensor:
        size = self.chunks[0].stop - self.chunks[0].start
        n = chunk.stop - chunk.start
        out = None
        if self.buffers is not None:
            out = self.buffers.take((1, size, self.total, self.total), self.dtype)[:, :n]
        key = None if self.key_term is None else self.key_term[chunk]
        return dense_bias_reversed(self.table[chunk], key, self.grid, self.prefix, out)

    def forward(self, q: Tensor, kr: Tensor, vr: Tensor) -> Tuple[Tensor, Tensor]:
        """Output ``(B, heads, T, d)`` (laid out ``(B, T, heads, d)`` like SDPA's, so the
        model's reshape to ``(B, T, C)`` is a view) and log-sum-exp ``(B, heads, T)``."""
        if len(self.chunks) == 1:
            return FLASH(q, kr, vr, attn_mask=self.bias(self.chunks[0]))
        batch, heads, total, _ = q.shape
        out = q.new_empty(batch, total, heads, vr.shape[-1]).permute(0, 2, 1, 3)
        lse = q.new_empty(batch, heads, total, dtype=torch.promote_types(q.dtype, torch.float32))
        for c in self.chunks:
            o, l = FLASH(q[:, c], kr[:, c], vr[:, c], attn_mask=self.bias(c))
            out[:, c] = o
            lse[:, c] = l
        return out, lse

    def backward(self, dout, q, kr, vr, out, lse) -> Tuple[Tensor, Tensor, Tensor]:
        """``dq`` and the gradients of the reversed ``kr, vr``."""
        grads = [torch.empty_like(t) for t in (q, kr, vr)] if len(self.chunks) > 1 else None
        for c in self.chunks:
            g = FLASH_BWD(
                dout[:, c],
                q[:, c],
                kr[:, c],
                vr[:, c],
                out[:, c],
                lse[:, c],
                0.0,
                False,
                attn_mask=self.bias(c),
            )
            if grads is None:
                return g
            for dst, src in zip(grads, g):
                dst[:, c] = src
        return tuple(grads)


class _BufferedAttention(torch.autograd.Function):
    """Flash attention with the dense bias rebuilt in backward: saves ``q, k, v``, the
    output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, calls):
        kr, vr = reverse_patches(k, calls.prefix), reverse_patches(v, calls.prefix)
        out, lse = calls.forward(q, kr, vr)
        del kr, vr
        # the model's k, v (views of its qkv projection, alive anyway), not the reversed
        # copies: reversing again in backward is cheaper than keeping them per layer
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.calls = calls
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        calls = ctx.calls
        kr, vr = reverse_patches(k, calls.prefix), reverse_patches(v, calls.prefix)
        dq, dkr, dvr = calls.backward(dout.to(q.dtype).contiguous(), q, kr, vr, out, lse)
        dk, dv = reverse_patches(dkr, calls.prefix), reverse_patches(dvr, calls.prefix)
        return dq, dk, dv, None


def buffered_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    dropout_p: float = 0.0,
    buffers: Optional[BiasBuffers] = None,
) -> Tensor:
    """Exact LookHere attention: CPU flash calls (one per chunk of heads) with the layer's
    dense bias copied into a reused buffer (see the module docstring).

    Args:
        q, k, v: ``(B, heads, T, d)`` on CPU with ``T = J + H*W``; float32, float64,
            bfloat16 or float16.
        grid_bias: tables of the grid (in ``q``'s dtype).
        layer: which layer's table to use.
        cls_token: number ``J`` of global prefix tokens at the front (CLS, or Jumbo
            tokens; True = 1), bias 0 to and from everything.
        dropout_p: must be 0 (use ``chunked`` or ``sdpa`` for attention dropout).
        buffers: the engine's :class:`BiasBuffers`; None: a fresh bias every call.

    Returns:
        ``(B, heads, T, d)`` in ``q``'s dtype. Differentiable in ``q, k, v`` (not in the
        table: a table that requires grad while autograd records is refused).
    """
    prefix, table, key_term = flash_layer_inputs(
        'buffered', q, k, grid_bias, layer, cls_token, dropout_p
    )
    table = table.to(q.dtype)
    key_term = None if key_term is None else key_term.to(q.dtype)
    calls = _Calls(table, key_term, grid_bias.grid_size, prefix, buffers, q.dtype)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _BufferedAttention.apply(q, k, v, calls)
    kr, vr = reverse_patches(k, prefix), reverse_patches(v, prefix)
    return calls.forward(q, kr, vr)[0]


def attend(call: AttentionCall) -> Tensor:
    """:func:`buffered_attention` with the engine's tables and reused bias buffers."""
    grid_bias, index = call.tables()
    args = (grid_bias, index, call.cls_token, call.dropout_p)
    return buffered_attention(call.q, call.k, call.v, *args, call.engine.bias_buffers)
