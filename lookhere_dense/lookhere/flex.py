"""The ``flex`` backend: LookHere attention through PyTorch's ``flex_attention``.

A ``score_mod`` reads the bias from the relative-offset table at the pair's offset
(:func:`flex_score_mod`), a ``BlockMask`` built tile row by tile row from the boolean
fields of view lets the kernel skip fully blocked tiles (:func:`lookhere_block_mask`),
and the tokens run in tile order (:func:`tile_order`), where directed heads skip more
tiles. Compiled on CUDA; eager (forward only) on CPU, for tests.

Needs a torch with ``torch.nn.attention.flex_attention`` (>= 2.5, see
:func:`flex_available`); everything else in :mod:`lookhere_dense.lookhere` works without it.
"""

from __future__ import annotations

import inspect
import math
import warnings
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from .bias import GridBias, num_prefix_tokens, pair_index

__all__ = [
    'FLEX_BLOCK',
    'flex_available',
    'flex_slope_grads_available',
    'check_flex_call',
    'tile_order',
    'flex_score_mod',
    'flex_mask_mod',
    'lookhere_block_mask',
    'flex_attention_lookhere',
    'raise_recompile_limit',
    'FLEX_RECOMPILE_LIMIT',
]

#: Query/key tile side of the flex kernels and block masks.
FLEX_BLOCK = 128


def flex_available() -> bool:
    """Whether ``torch.nn.attention.flex_attention`` can be imported."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:  # pragma: no cover - depends on the torch build
        return False
    return True


#: the first torch whose flex_attention gives tensors captured by a ``score_mod`` gradients
#: (eager, and the compiled CUDA kernel: pytorch/pytorch#136910, #137452)
FLEX_SLOPE_GRADS_TORCH = (2, 6)


def flex_slope_grads_available(version: Optional[str] = None) -> bool:
    """Whether ``flex_attention`` can give the table of a learnable-slopes ``score_mod``
    gradients (captured tensors that require grad): torch >= 2.6 with flex.

    Args:
        version: a torch version string to judge instead of the installed one (tests).
            Default: None.
    """
    from torch.torch_version import TorchVersion

    if version is None and not flex_available():
        return False
    return TorchVersion(version or torch.__version__) >= FLEX_SLOPE_GRADS_TORCH


def check_flex_call(
    q: Tensor, k: Tensor, v: Tensor, dropout_p: float, who: str, instead: str
) -> None:
    """Refuse what PyTorch's ``flex_attention`` cannot do here, naming the setting: attention
    dropout, and training on CPU (no CPU backward for ``q, k, v``).

    Args:
        who: how the message names the caller, e.g. ``"attn_backend='flex'"``.
        instead: the backends to name instead, e.g. ``"'auto' or 'chunked'"``.

    Raises:
        ValueError: naming the setting and the backends that can do it.
    """
    if dropout_p > 0:
        raise ValueError(
            f'{who} has no attention dropout; set attn_drop_rate=0 or use attn_backend={instead}'
        )
    if (
        q.device.type == 'cpu'
        and torch.is_grad_enabled()
        and any(t.requires_grad for t in (q, k, v))
    ):
        raise ValueError(
            f"{who} cannot train on CPU (PyTorch's flex_attention has no CPU backward); "
            f'use attn_backend={instead} there, or run under torch.no_grad()'
        )


def tile_order(
    grid_size: Tuple[int, int],
    cls_token: Union[bool, int],
    tile: Tuple[int, int] = (8, 16),
    device=None,
) -> Tensor:
    """The token order flex runs in: patches tile by tile, the prefix tokens (CLS /
    Jumbo) last.

    In the model's row-major order a block of 128 tokens is a stripe of whole grid rows,
    so a head that looks up-left skips only the tiles below (about half); in tile order
    a block is an ``8 x 16`` patch of the grid and the same head skips about 3/4 of the
    tiles (a 45-degree head about 7/8). The prefix tokens go last (in their order) so
    that the patch tiles stay aligned to flex's 128-token blocks.

    Args:
        grid_size: ``(H, W)``.
        cls_token: number ``J`` of global prefix tokens the model's sequence starts with
            (CLS, or Jumbo tokens; True = 1).
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
    rank = (((y // th) * tiles_per_row + x // tw) * (th * tw) + (y % th) * tw + x % tw).flatten()
    off = num_prefix_tokens(cls_token)
    order = rank.argsort() + off
    if off:
        order = torch.cat([order, torch.arange(off, dtype=order.dtype, device=order.device)])
    return order


def _flex_index(
    grid_size: Tuple[int, int], cls_token: Union[bool, int], order: Optional[Tensor] = None
) -> Callable[[Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]]:
    """``(q_idx, kv_idx) -> (is_cls, table_index, key_patch)`` for flex callbacks
    (``is_cls``: the query or the key is one of the ``cls_token`` prefix tokens).

    ``q_idx``/``kv_idx`` are positions in ``order`` (:func:`tile_order`; None: the
    model's order). ``table_index`` indexes a flattened ``(2H-1) * (2W-1)`` table;
    indices are clamped so that prefix pairs and the padding of a ragged last tile stay in
    range.
    """
    height, width = grid_size
    off = num_prefix_tokens(cls_token)
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
        t = pair_index(grid_size, qp, kp)
        return is_cls, t.clamp(0, table_len - 1), kp

    return index


def flex_score_mod(
    grid_bias: GridBias, layer: int, cls_token: Union[bool, int], order: Optional[Tensor] = None
) -> Callable:
    """A flex ``score_mod`` adding layer ``layer``'s LookHere bias from the table.

    The bias is read from the flattened ``(heads, (2H-1)(2W-1))`` table (float32) at the
    pair's relative offset, plus the per-key term of ``center`` heads; pairs with one of
    the ``cls_token`` global prefix tokens (CLS / Jumbo) get 0.
    ``order``: the token order of the flex call (:func:`tile_order`), None: the model's.
    A table that requires grad (learnable slopes) gets its gradient from flex's backward
    (torch >= 2.6, :func:`flex_slope_grads_available`); the block mask never depends on
    the slopes.
    """
    index = _flex_index(grid_bias.grid_size, cls_token, order)
    table = grid_bias.table[layer].float().flatten(1).contiguous()
    key_term = (
        None if grid_bias.key_term is None else grid_bias.key_term[layer].float().contiguous()
    )

    def score_mod(score, b, h, q_idx, kv_idx):
        is_cls, t, kp = index(q_idx, kv_idx)
        bias = table[h, t]
        if key_term is not None:
            bias = bias + key_term[h, kp]
        return torch.where(is_cls, score, score + bias)

    return score_mod


def flex_mask_mod(
    grid_bias: GridBias, layer: int, cls_token: Union[bool, int], order: Optional[Tensor] = None
) -> Callable:
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
    return (
        as_int.sum(-1).to(torch.int32),
        torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32),
    )


def lookhere_block_mask(
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    block: int = FLEX_BLOCK,
    order: Optional[Tensor] = None,
):
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

    off = num_prefix_tokens(cls_token)
    heads = visible.shape[0]
    total = grid_bias.num_patches + off
    flat = visible.flatten(1)
    tokens = (
        torch.arange(total, device=visible.device) if order is None else order.to(visible.device)
    )
    k_cls = tokens < off
    kp = (tokens - off).clamp(min=0)
    n_tiles = math.ceil(total / block)
    buf = torch.zeros(heads, block, n_tiles * block, dtype=torch.bool, device=visible.device)
    partial = torch.zeros(heads, n_tiles, n_tiles, dtype=torch.bool, device=visible.device)
    full = torch.zeros_like(partial)
    for i in range(n_tiles):
        s, e = i * block, min(total, (i + 1) * block)
        t = pair_index(grid_bias.grid_size, kp[s:e, None], kp)  # (Q, T)
        buf[:, : e - s, :total] = flat[:, t] | (k_cls[s:e, None] | k_cls)
        if e - s < block:
            buf[:, e - s :] = False  # padding rows of the ragged last tile
        tiles = buf.view(heads, block, n_tiles, block)
        full[:, i] = tiles.all(dim=3).all(dim=1)
        partial[:, i] = tiles.any(dim=3).any(dim=1) & ~full[:, i]
    kv_num, kv_idx = _ordered(partial[None])
    full_num, full_idx = _ordered(full[None])
    lengths = {}
    if 'seq_lengths' in inspect.signature(BlockMask.from_kv_blocks).parameters:
        lengths['seq_lengths'] = (total, total)  # torch >= 2.6; older: whole tiles
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        mask_mod=flex_mask_mod(grid_bias, layer, cls_token, order),
        **lengths,
    )


#: ``torch.compile``-d ``flex_attention`` per compile backend (one wrapper per process)
_compiled_flex: dict = {}

#: dynamo recompiles allowed per code object when flex is compiled (torch's default is 8):
#: flex compiles once per (shape, dtype, grad mode), so a process that meets 5 sizes in
#: inference and training needs 10 entries; past the limit dynamo silently runs flex
#: eagerly, which materialises the ``(heads, T, T)`` scores (hundreds of GiB at 32k tokens)
FLEX_RECOMPILE_LIMIT = 64


def raise_recompile_limit(limit: int = FLEX_RECOMPILE_LIMIT) -> int:
    """Raise dynamo's per-code-object recompile limit to at least ``limit`` (never lower it);
    ``recompile_limit`` from torch 2.7, ``cache_size_limit`` before. Returns the limit now set.

    Args:
        limit: the smallest limit wanted. Default: :data:`FLEX_RECOMPILE_LIMIT`.
    """
    import torch._dynamo.config as dynamo_config

    name = 'recompile_limit' if hasattr(dynamo_config, 'recompile_limit') else 'cache_size_limit'
    value = max(int(getattr(dynamo_config, name)), int(limit))
    setattr(dynamo_config, name, value)
    return value


def _flex_fn(compiled: bool, backend: str = 'inductor') -> Callable:
    """``flex_attention``, eager or ``torch.compile``-d with ``backend`` (one compiled
    wrapper per backend and process; the recompile limit raised, see
    :data:`FLEX_RECOMPILE_LIMIT`)."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if backend not in _compiled_flex:
        raise_recompile_limit()
        _compiled_flex[backend] = torch.compile(flex_attention, dynamic=False, backend=backend)
    return _compiled_flex[backend]


def flex_attention_lookhere(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    block_mask=None,
    compiled: Optional[bool] = None,
    score_mod: Optional[Callable] = None,
    order: Optional[Tensor] = None,
    compile_backend: str = 'inductor',
) -> Tensor:
    """LookHere attention through ``flex_attention`` (fused and tile-skipping when compiled).

    Args:
        q, k, v: ``(B, heads, T, d)``, ``T = J + H*W``.
        grid_bias: tables of the grid.
        layer: which layer's table to use.
        cls_token: number ``J`` of global prefix tokens at the front (CLS, or Jumbo
            tokens; True = 1).
        block_mask: a ``BlockMask`` from :func:`lookhere_block_mask` (optional: without it
            no tile is skipped, the result is the same).
        compiled: run the ``torch.compile``-d kernel. Default: on CUDA only (eager flex
            materialises the scores; it is kept for CPU tests of the callbacks). Compiled
            flex also runs on CPU (slow to compile, ~15-30 s per shape).
        score_mod: a cached :func:`flex_score_mod` for this layer (built if None).
        order: run flex in this token order (:func:`tile_order`): ``q, k, v`` are
            permuted before and the output back after; ``block_mask`` and ``score_mod``
            must be built for the same order. None: the model's order.
        compile_backend: the ``torch.compile`` backend when ``compiled`` (``'aot_eager'``
            traces and guards exactly like ``'inductor'`` without generating code: the
            CPU simulation of ``tools/gpu_check.sh``). Default: ``'inductor'``.

    Returns:
        ``(B, heads, T, d)``.
    """
    if compiled is None:
        compiled = q.is_cuda
    fn = _flex_fn(compiled, compile_backend)
    if score_mod is None:
        score_mod = flex_score_mod(grid_bias, layer, cls_token, order)
    if order is not None:
        q, k, v = (t.index_select(2, order) for t in (q, k, v))
    with warnings.catch_warnings():
        if not compiled:  # eager on purpose; a compiled call that fell back still warns
            warnings.filterwarnings(
                'ignore', message='flex_attention called without torch.compile'
            )
        out = fn(q, k, v, score_mod=score_mod, block_mask=block_mask)
    if order is not None:
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        out = out.index_select(2, inverse)
    return out
