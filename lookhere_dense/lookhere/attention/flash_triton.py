"""The ``triton`` backend: a flash-attention forward written in Triton for LookHere
(:mod:`.triton_kernels`), on CUDA.

Why beside ``flex``: on the one GPU the project was lent (an H200, docs/gpu.md), LookHere
through compiled ``flex_attention`` took 12-14x the time of the same trunk with flash
attention, and lh45 (7/8 of the tiles skipped) took the time of lh90 -- the time did not
follow the work. This kernel does only what LookHere needs: per query tile it loops over
the key tiles the head's field of view reaches (:func:`~.common.visible_tiles`, in
:func:`~.common.tile_order`), reads each pair's bias from the relative table with one
subtraction of per-token codes (:func:`~.common.token_codes`) and keeps an online softmax
in float32. No ``torch.compile``, no callbacks, no bounds asserts.

**Status.** Forward only (inference: ``torch.no_grad`` / ``inference_mode``; training
and learnable-slope gradients stay with ``flex`` / ``chunked``). Proven on CPU: the same
kernel runs in Triton's interpreter against the float32 reference (``float32``,
``float16``: the interpreter's ``bfloat16`` dot is broken in Triton 3.8), and compiles
for a Hopper GPU (sm_90) to machine code in ``bfloat16``, ``float16`` and ``float32``
(``tests/test_triton_backend.py``). **It has not run on a GPU**, so ``auto`` does not
choose it: name it (``attn_backend='triton'``); ``tools/gpu_check.sh`` times it against
flex and flash attention. On CPU, named, it runs in Triton's interpreter (numpy; for
tests: seconds for a few hundred tokens) where Python started with ``TRITON_INTERPRET=1``:
Triton fixes the mode at its import.
"""

from __future__ import annotations

import importlib.util
import math
import os
from typing import Any, Dict, Optional, Tuple, Union

import torch
from torch import Tensor

from ...errors import ConfigError
from ..bias import GridBias, num_prefix_tokens, pair_index
from .common import (
    FLEX_BLOCK,
    AttentionCall,
    AttentionRequest,
    inverse_order,
    ordered_blocks,
    tile_order,
    token_codes,
    visible_tiles,
)

__all__ = [
    'NAME',
    'can_run',
    'attend',
    'triton_available',
    'TritonPlan',
    'triton_plan',
    'triton_attention_lookhere',
    'TRITON_TILES',
]

NAME = 'triton'

#: ``(BLOCK_M, BLOCK_N)`` of the kernel: queries per program and keys per step; both
#: divide the skipping tile (:data:`~.common.FLEX_BLOCK`, 128 tokens), both >= 16 (Triton's
#: dot). 64 x 64 in 4 warps is the flash-attention tutorial's shape for head dim 64 on
#: Ampere / Hopper; untimed here (no GPU).
TRITON_TILES: Tuple[int, int] = (64, 64)


#: the values of ``TRITON_INTERPRET`` that turn Triton's interpreter on, as Triton reads
#: the variable (``triton.knobs``' booleans: case-insensitive)
_TRITON_ON = ('1', 'true', 'yes', 'on', 'y')


def interpret_requested() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (read as Triton reads it,
    without importing it; Triton fixes the mode at its import)."""
    return os.environ.get('TRITON_INTERPRET', '').lower() in _TRITON_ON


def triton_available() -> bool:
    """Whether the ``triton`` package is installed (it is not imported here)."""
    return importlib.util.find_spec('triton') is not None


class TritonPlan:
    """What the kernel needs of one grid and one field-of-view layout, built once
    (:func:`triton_plan`; the engine's ``triton_plans`` cache).

    Attributes:
        order: int64 ``(T,)``: kernel position -> the model's token (prefix tokens last).
        inverse: int64 ``(T,)``: the model's token -> kernel position.
        code, key_patch: int32 ``(T,)`` (:func:`~.common.token_codes`).
        tiles: None (every key visible: every tile computed), or int32 ``(part_num,
            part_idx, full_num, full_idx)``: per head and query tile, the partial and the
            full key tiles (``(heads, nT)`` counts, ``(heads, nT, nT)`` indices first).
        patches: ``N``; the prefix tokens are the positions ``>= N``.
        centre: the table entry of offset ``(0, 0)``.
    """

    def __init__(
        self,
        order: Tensor,
        code: Tensor,
        key_patch: Tensor,
        tiles: Optional[Tuple[Tensor, Tensor, Tensor, Tensor]],
        patches: int,
        centre: int,
    ):
        self.order = order
        self.inverse = inverse_order(order)
        self.code, self.key_patch, self.tiles = code, key_patch, tiles
        self.patches, self.centre = patches, centre


def triton_plan(
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    order: Optional[Tensor] = None,
) -> TritonPlan:
    """The :class:`TritonPlan` of ``layer``'s fields of view on ``grid_bias``'s grid.

    Args:
        order: the token order (:func:`~.common.tile_order`, prefix last); None: the
            model's row-major order with the prefix tokens moved last (nothing else
            changes; fewer tiles are skipped).
    """
    device = grid_bias.visible.device
    off = num_prefix_tokens(cls_token)
    total = grid_bias.num_patches + off
    if order is None:
        order = torch.cat([torch.arange(off, total), torch.arange(0, off)]).to(device)
    order = order.to(device=device, dtype=torch.int64)
    code, key_patch = token_codes(grid_bias.grid_size, cls_token, order, device)
    tiles = visible_tiles(grid_bias, layer, cls_token, FLEX_BLOCK, order)
    packed = None
    if tiles is not None:
        partial, full = tiles
        part_num, part_idx = ordered_blocks(partial)
        full_num, full_idx = ordered_blocks(full)
        packed = tuple(t.contiguous() for t in (part_num, part_idx, full_num, full_idx))
    centre = int(pair_index(grid_bias.grid_size, 0, 0))
    return TritonPlan(order, code, key_patch, packed, grid_bias.num_patches, centre)


def triton_attention_lookhere(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    plan: Optional[TritonPlan] = None,
    tiles: Tuple[int, int] = TRITON_TILES,
) -> Tensor:
    """LookHere attention (forward) through the Triton kernel.

    Args:
        q, k, v: ``(B, heads, T, d)``, ``T = J + H*W`` in the model's order (prefix
            first), float32 / bfloat16 / float16, one dtype.
        grid_bias: the tables of the grid (float32 for the bias: it is read as float32).
        layer: the table's layer.
        cls_token: ``J`` global prefix tokens (True = 1).
        plan: a cached :func:`triton_plan` (None: built here, in tile order).
        tiles: ``(BLOCK_M, BLOCK_N)``. Default: :data:`TRITON_TILES`.

    Returns:
        ``(B, heads, T, d)`` in ``q``'s dtype.

    Raises:
        lookhere_dense.errors.ConfigError: inputs that need a gradient (forward only), a
            CPU tensor outside Triton's interpreter (or a CUDA one inside it).
        ValueError: mismatched dtypes.
    """
    from .triton_kernels import forward_kernel, interpreting

    if any(t.requires_grad for t in (q, k, v)) and torch.is_grad_enabled():
        raise ConfigError(
            "attn_backend='triton' has a forward only: run it under torch.no_grad() / "
            "inference_mode(), or train with 'auto' (or 'chunked' / 'sdpa' / 'flex'; on "
            "CPU 'fused')"
        )
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in _DTYPES:
        raise ValueError(
            f"attn_backend='triton' takes float32 / bfloat16 / float16 q, k, v of one dtype, "
            f'got {q.dtype}, {k.dtype}, {v.dtype}'
        )
    interpret = interpreting()
    if interpret and q.dtype == torch.bfloat16:
        raise ValueError(f"attn_backend='triton': {_INTERPRETER_BF16}")
    if (q.device.type == 'cpu') != interpret:
        raise ConfigError(
            f"attn_backend='triton' runs on CUDA, or on CPU in Triton's interpreter (Python "
            f'started with TRITON_INTERPRET=1); here q is on {q.device} and the interpreter is '
            + ('on' if interpret else 'off')
            + ("; on CPU use 'auto'" if q.device.type == 'cpu' else '')
        )
    if plan is None:
        plan = triton_plan(
            grid_bias,
            layer,
            cls_token,
            tile_order(grid_bias.grid_size, cls_token, device=grid_bias.visible.device),
        )
    block_m, block_n = tiles
    if FLEX_BLOCK % block_m or FLEX_BLOCK % block_n or min(block_m, block_n) < 16:
        raise ValueError(f'tiles must divide {FLEX_BLOCK} and be >= 16, got {tiles}')
    batch, heads, total, dim = q.shape
    qo, ko, vo = (t.index_select(2, plan.order).contiguous() for t in (q, k, v))
    out = torch.empty_like(qo)
    table = grid_bias.table[layer].float().flatten(1).contiguous()
    key_term = (
        None if grid_bias.key_term is None else grid_bias.key_term[layer].float().contiguous()
    )
    dummy = plan.code
    part_num, part_idx, full_num, full_idx = plan.tiles or (dummy,) * 4
    n_tiles = math.ceil(total / FLEX_BLOCK)
    launch: Dict[str, Any] = {} if interpret else dict(num_warps=4, num_stages=2)
    forward_kernel()[(math.ceil(total / block_m), batch * heads)](
        qo,
        ko,
        vo,
        out,
        plan.code,
        plan.key_patch,
        table,
        dummy if key_term is None else key_term,
        part_num,
        part_idx,
        full_num,
        full_idx,
        *qo.stride()[:3],
        *ko.stride()[:3],
        *vo.stride()[:3],
        *out.stride()[:3],
        table.stride(0),
        0 if key_term is None else key_term.stride(0),
        part_num.stride(0) if plan.tiles else 0,
        part_idx.stride(0) if plan.tiles else 0,
        part_idx.stride(1) if plan.tiles else 0,
        heads,
        total,
        plan.patches,
        plan.centre,
        n_tiles,
        dim**-0.5 * 1.4426950408889634,
        HEAD_DIM=dim,
        BLOCK_D=max(16, 1 << (dim - 1).bit_length()),
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        MASK_BLOCK=FLEX_BLOCK,
        HAS_MASK=plan.tiles is not None,
        HAS_KEY_TERM=key_term is not None,
        IEEE=q.dtype == torch.float32,
        **launch,
    )
    return out.index_select(2, plan.inverse)


_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Triton's interpreter multiplies bfloat16 tiles wrongly (Triton 3.8: ``tl.dot`` of two
#: bfloat16 16 x 16 tiles was off by 1e10), so the simulation refuses them
_INTERPRETER_BF16 = (
    "Triton's interpreter computes bfloat16 dot products wrongly (Triton 3.8): simulate "
    'in float16 / float32 (the GPU compiles bfloat16)'
)


def can_run(request: AttentionRequest) -> Optional[str]:
    """Needs Triton; never chosen by ``auto`` (not yet timed on a GPU); CUDA, or CPU through
    Triton's interpreter (tests); forward only (no training, dropout or slope
    gradients)."""
    if not triton_available():
        return 'Triton is not installed'
    if request.auto:
        return "not timed on a GPU yet: auto never chooses it (name it: attn_backend='triton')"
    if request.training or request.slope_grads:
        return 'forward only (inference): no backward'
    if request.dropout_p:
        return 'has no attention dropout'
    if request.dtype not in _DTYPES:
        return f'takes float32 / bfloat16 / float16, not {request.dtype}'
    device = torch.device(request.device).type
    interpret = interpret_requested()
    if device == 'cpu' and not interpret:
        return "CUDA only (on CPU: Triton's interpreter, Python started with TRITON_INTERPRET=1)"
    if device not in ('cuda', 'cpu') or (device == 'cuda' and interpret):
        return 'CUDA only (and not under TRITON_INTERPRET=1)'
    if interpret and request.dtype == torch.bfloat16:
        return _INTERPRETER_BF16
    return None


def attend(call: AttentionCall) -> Tensor:
    """:func:`triton_attention_lookhere` with the engine's float32 tables and its
    ``triton_plans`` cache (per field-of-view layout, grid, prefix and device, in the
    engine's tile order)."""
    q, engine = call.q, call.engine
    if call.dropout_p:
        raise ValueError(
            "attn_backend='triton' has no attention dropout (forward only, for inference); "
            "use 'flex' / 'auto' where it is on"
        )
    grid_bias, index = engine.layer_bias(
        call.layer, call.grid_size, q.device, torch.float32, call.slopes
    )
    key = (
        engine.config.layer_direction(call.layer),
        tuple(call.grid_size),
        call.cls_token,
        str(q.device),
    )
    plan = engine.triton_plans.get_or_create(
        key,
        lambda: triton_plan(
            engine.grid_bias(call.grid_size, q.device),  # the fields of view: slope-free
            call.layer,
            call.cls_token,
            engine.flex_order(call.grid_size, call.cls_token, q.device),
        ),
    )
    return triton_attention_lookhere(q, call.k, call.v, grid_bias, index, call.cls_token, plan)
