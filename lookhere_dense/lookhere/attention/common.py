"""Shared plumbing of the attention backends (public: the backends import it, never each
other; ``tests/test_layers.py`` checks that with an import-linter contract).

What a backend is
    A module of :mod:`lookhere_dense.lookhere.attention` with ``NAME``, ``can_run(request:
    AttentionRequest) -> Optional[str]`` (None: it can run this call; else the reason it
    cannot: device, dtype, compiler, tokens, dropout, slope gradients, compile support) and
    ``attend(call: AttentionCall) -> Tensor`` (the forward, through the caches of the
    engine that asked; the backward is the backend's own autograd function where it has
    one). :mod:`.chooser` asks them in a documented order.

Here
    :class:`AttentionRequest`, :class:`AttentionCall`; the CPU flash kernel
    (:data:`FLASH`, :data:`FLASH_BWD`), with the bias gradient it does not give
    (:func:`biased_sdpa`, :class:`FlashBiasGrad`, :func:`flash_bias_grad`), and the checks and inputs of the backends that
    drive it (:func:`flash_layer_inputs`, :func:`work_dtype`); tile plans (:func:`head_groups`,
    :class:`VisibleCounts`, :func:`plan_key`, :func:`cached_plan`); the online-softmax
    merge of partial results (:func:`merge_partial`, :data:`EMPTY_LSE`); the bias-table
    gather (:func:`gather_block`, from :mod:`lookhere_dense.lookhere.bias`); and the flex
    plumbing that the LookHere and causal flex paths share (:func:`flex_available`,
    :func:`check_flex_call`, :func:`flex_function`, :func:`block_mask_from_tiles`).
"""

from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, MutableMapping, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor

from ..bias import GridBias, gather_block, num_prefix_tokens, pair_index, prefix_phrase

__all__ = [
    'AttentionRequest',
    'AttentionCall',
    'FLASH',
    'FLASH_BWD',
    'last_dim_contiguous',
    'EMPTY_LSE',
    'biased_sdpa',
    'FLASH_BIAS_GRAD_MIN_PAIRS',
    'FlashBiasGrad',
    'flash_bias_grad',
    'work_dtype',
    'flash_layer_inputs',
    'head_groups',
    'VisibleCounts',
    'plan_key',
    'cached_plan',
    'merge_partial',
    'gather_block',
    'FLEX_BLOCK',
    'flex_available',
    'check_flex_call',
    'flex_function',
    'FLEX_INDUCTOR_OPTIONS',
    'flex_compile_options',
    'raise_recompile_limit',
    'FLEX_RECOMPILE_LIMIT',
    'tile_order',
    'inverse_order',
    'token_codes',
    'visible_tiles',
    'ordered_blocks',
    'block_mask_from_tiles',
]


@dataclass(frozen=True)
class AttentionRequest:
    """What a backend's ``can_run`` is asked about one attention call.

    Attributes:
        tokens: sequence length ``T`` (prefix tokens and patches).
        device: where ``q, k, v`` live.
        dtype: their dtype. Default: float32.
        dropout_p: attention dropout. Default: 0.
        slope_grads: learnable slopes that need gradients this call. Default: False.
        training: autograd records the call. Default: False.
        auto: asked by the chooser (``attn_backend='auto'``): the backends' token
            thresholds and the dense-bias budget apply; False: a backend named by the
            user, only hard limits count. Default: True.
        dense_bytes: bytes of every layer's dense ``(heads, T, T)`` bias in ``dtype``.
            Default: 0.
        max_dense_bytes: the engine's budget for them. Default: inf.
        compiled_flex: the engine compiles flex (None: on CUDA only). Default: None.
        failed: backends that raised before in this model (skipped by ``auto``).
            Default: ().
    """

    tokens: int
    device: torch.device
    dtype: torch.dtype = torch.float32
    dropout_p: float = 0.0
    slope_grads: bool = False
    training: bool = False
    auto: bool = True
    dense_bytes: int = 0
    max_dense_bytes: float = float('inf')
    compiled_flex: Optional[bool] = None
    failed: Tuple[str, ...] = ()

    @property
    def on_cpu(self) -> bool:
        """The call runs on CPU."""
        return torch.device(self.device).type == 'cpu'


@dataclass(eq=False)
class AttentionCall:
    """One call of a backend's ``attend``: the inputs and the engine whose caches it reads
    (``dense_or_slope_bias``, ``layer_bias``, the plan caches, the flex caches; see
    :class:`~lookhere_dense.lookhere.engine.LookHereAttentionEngine`).

    Attributes:
        q, k, v: ``(B, heads, T, d)``, ``T = J + H*W``.
        layer: the layer index.
        grid_size: ``(H, W)``.
        cls_token: ``J``, the global prefix tokens at the front.
        dropout_p: attention dropout.
        slopes: learnable slopes (None: the config's, cached).
        slope_grads: the slopes need gradients this call.
        engine: the engine (its caches).
    """

    q: Tensor
    k: Tensor
    v: Tensor
    layer: int
    grid_size: Tuple[int, int]
    cls_token: int
    dropout_p: float
    slopes: Any
    slope_grads: bool
    engine: Any

    def tables(self) -> Tuple[GridBias, int]:
        """``(tables, index)`` of the call's layer in ``q``'s dtype: the engine's cached
        tables and the layer, or the one-layer table at ``slopes`` and 0."""
        return self.engine.layer_bias(
            self.layer, self.grid_size, self.q.device, self.q.dtype, self.slopes
        )


# -- the CPU flash kernel ----------------------------------------------------------------
#: PyTorch's CPU flash kernel (returns the output and its log-sum-exp)
FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
#: its backward
FLASH_BWD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
#: log-sum-exp of an empty partial: its merge weight underflows to exactly 0
EMPTY_LSE = -1e30


def last_dim_contiguous(t: Tensor) -> Tensor:
    """``t`` with a stride of 1 along its last dimension (a copy only when it has not):
    :data:`FLASH` / :data:`FLASH_BWD` read the head dimension as contiguous without
    checking it, and give wrong results for a ``q`` that is not (e.g. a transposed
    ``(B, heads, d, T)`` tensor transposed back)."""
    return t if t.stride(-1) == 1 else t.contiguous()


#: float32 / float64: (query, key) pairs per head from which :func:`biased_sdpa` takes the
#: flash route for a mask that needs a gradient; below, SDPA's math kernel is as fast or
#: faster there (forward + backward, one thread, B=2, 12 heads of 64, flash / math: 1.0-1.24
#: at 197-513 tokens, 0.92 at 769, 0.77 at 1025; ``python -m
#: research.benchmark.flash_bias_grad``, docs/mixed_precision.md). Reduced precision always
#: takes it (the math kernel would compute in float32 copies).
FLASH_BIAS_GRAD_MIN_PAIRS = 640 * 640


def biased_sdpa(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask=bias)``, through PyTorch's CPU
    flash kernel also when ``bias`` needs a gradient (learnable slopes while they train).

    PyTorch's flash kernel gives no gradient to ``attn_mask``, so for such a mask SDPA takes
    its math kernel, which materialises ``B x heads x T x S`` scores and, for bfloat16 /
    float16, computes in float32 on float32 copies of ``q, k, v``. Here the forward and the
    ``q, k, v`` gradients stay in the flash kernel (in the inputs' dtype) and the mask's
    gradient comes from :func:`flash_bias_grad` (:class:`FlashBiasGrad`). Dropout, CUDA
    (whose SDPA kernels give the mask its gradient), masks without a gradient, and float32 /
    float64 calls under :data:`FLASH_BIAS_GRAD_MIN_PAIRS` pairs per head (there the math
    kernel is faster and computes in the inputs' dtype anyway) go to SDPA unchanged.

    Args:
        q, k, v: ``(B, heads, T, d)``, ``(B, heads, S, d)``.
        bias: ``(1 | B, heads, T, S)`` float mask (cast to ``q``'s dtype; a bool mask
            passes as it is).
        dropout_p: attention dropout. Default: 0.

    Returns:
        ``(B, heads, T, d)``.
    """
    mask = bias.to(q.dtype) if bias.is_floating_point() else bias
    if (
        q.device.type == 'cpu'
        and not dropout_p
        and torch.is_grad_enabled()
        and mask.requires_grad
        and mask.dim() == 4
        and mask.shape[1:] == (q.shape[1], q.shape[2], k.shape[2])
        and mask.shape[0] in (1, q.shape[0])
        and (
            q.dtype in (torch.bfloat16, torch.float16)
            or q.shape[-2] * k.shape[-2] >= FLASH_BIAS_GRAD_MIN_PAIRS
        )
    ):
        q, k, v, mask = (last_dim_contiguous(t) for t in (q, k, v, mask))
        return FlashBiasGrad.apply(q, k, v, mask)
    return torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p
    )


class FlashBiasGrad(torch.autograd.Function):
    """Attention with an additive float mask that gets its gradient, on the CPU flash kernel.

    Forward: :data:`FLASH` (output and log-sum-exp). Backward: :data:`FLASH_BWD` for
    ``q, k, v``; the mask's gradient from :func:`flash_bias_grad`. Everything of
    activation size stays in the inputs' dtype (see :func:`flash_bias_grad` for the
    float32 temporaries).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        out, lse = FLASH(q, k, v, attn_mask=mask)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        q, k, v, mask, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq, dk, dv = FLASH_BWD(grad_out, q, k, v, out, lse, 0.0, False, attn_mask=mask)
        dmask = None
        if ctx.needs_input_grad[3]:
            dmask = flash_bias_grad(q, k, v, mask, out, lse, grad_out)
        return dq, dk, dv, dmask


def flash_bias_grad(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor, out: Tensor, lse: Tensor, grad_out: Tensor
) -> Tensor:
    """The gradient of attention ``softmax(q k^T / sqrt(d) + mask) v`` with respect to the
    additive ``mask``: ``dS = P * (dO v^T - rowsum(dO * O))``, summed over the batch where
    the mask is broadcast over it.

    Computed per head in blocks of ``d`` query rows, in float32 from the saved log-sum-exp
    (``P = exp(S - lse)``): the float32 temporaries are one head's keys and values
    (``B x S x d``) and one block's scores (``B x d x S``), each at most one head's share of
    ``q`` when ``S = T``; the result is written into a tensor of the mask's shape and
    dtype.

    Args:
        q, k, v: ``(B, heads, T, d)``, ``(B, heads, S, d)``, ``(B, heads, S, dv)``.
        mask: ``(1 | B, heads, T, S)``, the mask the forward used.
        out: ``(B, heads, T, dv)``, the forward's output.
        lse: ``(B, heads, T)`` float32, the forward's log-sum-exp (of the scaled scores
            plus the mask).
        grad_out: ``(B, heads, T, dv)``.

    Returns:
        ``(1 | B, heads, T, S)`` in ``mask``'s dtype.
    """
    batch, heads, tokens, dim = q.shape
    f32 = work_dtype(q.dtype)
    scale = dim**-0.5
    rows = max(1, dim)
    grad = torch.empty_like(mask)
    per_sample = mask.shape[0] != 1 or batch == 1
    for h in range(heads):
        kh, vh = k[:, h].to(f32), v[:, h].to(f32)  # (B, S, d)
        mh = mask[:, h]
        for r0 in range(0, tokens, rows):
            r1 = min(tokens, r0 + rows)
            scores = torch.baddbmm(
                mh[:, r0:r1].to(f32).expand(batch, -1, -1),
                q[:, h, r0:r1].to(f32),
                kh.transpose(1, 2),
                alpha=scale,
            )
            p = scores.sub_(lse[:, h, r0:r1, None].to(f32)).exp_()  # (B, rows, S)
            do = grad_out[:, h, r0:r1].to(f32)
            row = (do * out[:, h, r0:r1].to(f32)).sum(-1, keepdim=True)
            ds = p.mul_(torch.bmm(do, vh.transpose(1, 2)).sub_(row))
            grad[:, h, r0:r1] = ds if per_sample else ds.sum(0, keepdim=True)
    return grad


def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the CPU flash backends compute in: float64 stays, the rest float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def flash_layer_inputs(
    backend: str,
    q: Tensor,
    k: Tensor,
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    dropout_p: float,
    bias_grads: bool = False,
) -> Tuple[int, Tensor, Optional[Tensor]]:
    """The checks of the CPU backends (``tiled``, ``fused``) and what they read:
    ``(J, table, key_term)`` of ``layer``, detached unless ``bias_grads``.

    Refused with a ValueError naming ``backend``: attention dropout, non-CPU tensors, a
    token count that does not fit the grid, and, unless ``bias_grads`` (the backend gives
    the table and the key term their gradients), a table that requires grad while autograd
    records (learnable slopes while they train).
    """
    if dropout_p:
        raise ValueError(
            f'the {backend} LookHere backend has no attention dropout; set '
            "attn_drop_rate=0 or model.backbone.attn_backend='auto' (or 'chunked'/'sdpa')"
        )
    if q.device.type != 'cpu':
        raise ValueError(
            f'the {backend} LookHere backend runs on CPU only (got {q.device}); set '
            "model.backbone.attn_backend='auto' (or 'flex'/'sdpa'/'chunked' on CUDA)"
        )
    height, width = grid_bias.grid_size
    off = num_prefix_tokens(cls_token)
    if q.shape[-2] != height * width + off or k.shape[-2] != q.shape[-2]:
        raise ValueError(
            f'{backend} attention got {q.shape[-2]} queries / {k.shape[-2]} keys '
            f'for grid {grid_bias.grid_size} {prefix_phrase(off)}'
        )
    key_term = None if grid_bias.key_term is None else grid_bias.key_term[layer]
    table = grid_bias.table[layer]
    if bias_grads:
        return off, table, key_term
    if torch.is_grad_enabled() and (
        table.requires_grad or (key_term is not None and key_term.requires_grad)
    ):
        raise ValueError(
            f'the {backend} LookHere backend gives no gradient to the bias table '
            '(learnable slopes while they train); use backend '
            "'fused', 'chunked' or 'sdpa' (attn_backend='auto' routes them there)"
        )
    return off, table.detach(), None if key_term is None else key_term.detach()


# -- tile plans ---------------------------------------------------------------------------
def head_groups(visible: Tensor) -> List[Tuple[int, ...]]:
    """Heads with identical fields of view, each group ascending, ordered by first head.

    Args:
        visible: ``(heads, 2H-1, 2W-1)`` bool of one layer.
    """
    flat = visible.reshape(visible.shape[0], -1).cpu()
    groups: dict = {}
    for h in range(flat.shape[0]):
        groups.setdefault(flat[h].numpy().tobytes(), []).append(h)
    return [tuple(hs) for hs in groups.values()]


class VisibleCounts:
    """Visible offsets in rectangles of the ``(2H-1, 2W-1)`` field of view (an integral
    image), vectorised over numpy arrays of inclusive offset ranges."""

    def __init__(self, visible: np.ndarray, grid_size: Tuple[int, int]):
        self.height, self.width = grid_size
        integral = np.zeros((visible.shape[0] + 1, visible.shape[1] + 1), np.int64)
        integral[1:, 1:] = visible.astype(np.int64).cumsum(0).cumsum(1)
        self.integral = integral

    def __call__(self, dy0, dy1, dx0, dx1) -> np.ndarray:
        h, w = self.height, self.width
        a = np.clip(dy0 + h - 1, 0, 2 * h - 1)
        b = np.maximum(np.clip(dy1 + h, 0, 2 * h - 1), a)
        c = np.clip(dx0 + w - 1, 0, 2 * w - 1)
        e = np.maximum(np.clip(dx1 + w, 0, 2 * w - 1), c)
        s = self.integral
        return s[b, e] - s[a, e] - s[b, c] + s[a, c]


def plan_key(kind: str, visible: Tensor, grid_size: Tuple[int, int], options) -> tuple:
    """The cache key of a plan of ``kind`` for fields of view ``visible`` on ``grid_size``
    with ``options`` (layers with the same fields of view share it)."""
    digest = hashlib.blake2b(visible.cpu().numpy().tobytes(), digest_size=16).hexdigest()
    return (kind, tuple(grid_size), tuple(visible.shape), digest, options)


def cached_plan(cache: Optional[MutableMapping], key: tuple, make):
    """``make()``, kept in ``cache`` under ``key`` when a cache is given (a dict or an
    object with ``get_or_create``, like the engine's ``BoundedCache``)."""
    if cache is None:
        return make()
    if hasattr(cache, 'get_or_create'):
        return cache.get_or_create(key, make)
    if key not in cache:
        cache[key] = make()
    return cache[key]


# -- the online-softmax merge ----------------------------------------------------------------
def merge_partial(acc: Tensor, lse: Tensor, out: Tensor, part_lse: Tensor, first: bool) -> None:
    """Merge a partial ``(out, part_lse)`` into ``(acc, lse)`` in place (exact):
    ``acc <- lerp(acc, out, sigmoid(part_lse - lse))``, ``lse <- logaddexp(...)``."""
    if first:
        acc.copy_(out)
        lse.copy_(part_lse)
        return
    weight = torch.sigmoid(part_lse - lse)
    acc.lerp_(out.to(acc.dtype), weight.unsqueeze(-1))
    torch.logaddexp(lse, part_lse, out=lse)


# -- flex ---------------------------------------------------------------------------------
#: Query/key tile side of the flex kernels and block masks.
FLEX_BLOCK = 128


def flex_available() -> bool:
    """Whether ``torch.nn.attention.flex_attention`` can be imported."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:  # pragma: no cover - depends on the torch build
        return False
    return True


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


#: inductor settings of our flex compiles. ``assert_indirect_indexing`` off: inductor checks
#: every read through a computed index (our callbacks' table / visibility / per-token
#: gathers) inside the kernel's inner loop -- a ``TORCH_CHECK`` per vector on CPU, and on
#: CUDA it compiles the whole kernel in Triton's debug mode (device asserts, integer
#: overflow checks). Our indices are in range by construction: every (query, key)
#: position a kernel tile can reach, prefix and padding included, maps inside the table
#: (:func:`~.flex.flex_index`; ``tests/test_compile.py`` checks the extremes of every
#: pair for ragged grids and prefixes)
FLEX_INDUCTOR_OPTIONS: Dict[str, Any] = {'assert_indirect_indexing': False}


def flex_compile_options(backend: str = 'inductor') -> Optional[Dict[str, Any]]:
    """The ``options`` our ``torch.compile`` of flex passes: :data:`FLEX_INDUCTOR_OPTIONS`
    (the keys this torch's inductor knows) for ``'inductor'``, None for other backends."""
    if backend != 'inductor':
        return None
    import torch._inductor.config as inductor_config

    return {k: v for k, v in FLEX_INDUCTOR_OPTIONS.items() if hasattr(inductor_config, k)}


def flex_function(compiled: bool, backend: str = 'inductor') -> Callable:
    """``flex_attention``, eager or ``torch.compile``-d with ``backend`` and
    :func:`flex_compile_options` (one compiled wrapper per backend and process; the
    recompile limit raised, see :data:`FLEX_RECOMPILE_LIMIT`)."""
    from torch.nn.attention.flex_attention import flex_attention

    if not compiled:
        return flex_attention
    if backend not in _compiled_flex:
        raise_recompile_limit()
        _compiled_flex[backend] = torch.compile(
            flex_attention, dynamic=False, backend=backend, options=flex_compile_options(backend)
        )
    return _compiled_flex[backend]


def tile_order(
    grid_size: Tuple[int, int],
    cls_token: Union[bool, int],
    tile: Tuple[int, int] = (8, 16),
    device=None,
) -> Tensor:
    """The token order of the tile-skipping kernels (flex, triton): patches tile by tile, the prefix tokens (CLS /
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


def inverse_order(order: Tensor) -> Tensor:
    """The inverse permutation of ``order`` (:func:`tile_order`): the model's token ->
    its position in ``order``, to put a kernel's output back in the model's order."""
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return inverse


def token_codes(
    grid_size: Tuple[int, int],
    cls_token: Union[bool, int],
    order: Optional[Tensor] = None,
    device: Optional[torch.device] = None,
) -> Tuple[Tensor, Tensor]:
    """Per-token ``(code, key_patch)``, int32 ``(T,)``, in ``order`` (:func:`tile_order`:
    prefix tokens last; None: the model's order, prefix first).

    ``code = y * (2W-1) + x`` of a patch (0 for a prefix token): the table entry of a
    (query, key) pair is ``code[key] - code[query] + pair_index(grid, 0, 0)``
    (:func:`~..bias.pair_index` is linear in the key's code), so a kernel computes each
    pair's entry with one subtraction; ``key_patch`` is the patch index (row-major; 0 for
    a prefix token), which reads a ``center`` head's per-key term. ``device``: where the
    arrays live (default: ``order``'s, else the CPU).

    Raises:
        ValueError: ``order`` is not a permutation of ``T`` positions with the prefix last.
    """
    height, width = grid_size
    off = num_prefix_tokens(cls_token)
    num_patches = height * width
    total = num_patches + off
    if order is None:
        model_index = torch.arange(total, device=device)
    else:
        model_index = order.long()
        if model_index.numel() != total or (
            off and bool((model_index[num_patches:] >= off).any())
        ):
            raise ValueError(
                f'tile token order: expected {total} positions with the {off} prefix token(s) '
                f'last (tile_order), got {model_index.numel()}'
            )
    patch = model_index - off
    is_patch = patch >= 0
    patch = patch.clamp(min=0)
    centre = pair_index(grid_size, 0, 0)
    code = torch.where(is_patch, pair_index(grid_size, 0, patch) - centre, 0)
    key_patch = torch.where(is_patch, patch, 0)
    code, key_patch = code.to(torch.int32), key_patch.to(torch.int32)
    if device is not None:
        code, key_patch = code.to(device), key_patch.to(device)
    return code, key_patch


def visible_tiles(
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    block: int = FLEX_BLOCK,
    order: Optional[Tensor] = None,
) -> Optional[Tuple[Tensor, Tensor]]:
    """Which ``block x block`` tiles of layer ``layer``'s attention a tile-skipping kernel
    computes, built tile row by tile row from the boolean relative table (no ``(heads, T,
    T)`` mask).

    Args:
        order: the token order of the kernel (:func:`tile_order`); None: the model's.

    Returns:
        ``(partial, full)``, bool ``(heads, nT, nT)`` with ``nT = ceil(T / block)``:
        ``partial``: some but not every (query, key) pair of the tile visible; ``full``:
        every pair visible (padding rows of a ragged last tile do not count). None when
        every head sees every key (nothing to skip).
    """
    visible = grid_bias.visible[layer]
    if bool(visible.all()):
        return None
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
    return partial, full


def ordered_blocks(blocks: Tensor) -> Tuple[Tensor, Tensor]:
    """``(..., nQ, nK)`` bool tiles -> (count per row, column indices, tiles first), int32."""
    as_int = blocks.to(torch.int32)
    return (
        as_int.sum(-1).to(torch.int32),
        torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32),
    )


def block_mask_from_tiles(
    partial: Tensor, full: Tensor, block: int, tokens: int, mask_mod: Callable
):
    """A flex ``BlockMask`` from ``(..., nQ, nK)`` bool tiles (``partial``: some key
    visible, ``mask_mod`` called; ``full``: every key visible), ``block`` tokens per tile,
    ``tokens`` in all (the sequence lengths where this torch takes them, >= 2.6)."""
    from torch.nn.attention.flex_attention import BlockMask

    kv_num, kv_idx = ordered_blocks(partial)
    full_num, full_idx = ordered_blocks(full)
    lengths = {}
    if 'seq_lengths' in inspect.signature(BlockMask.from_kv_blocks).parameters:
        lengths['seq_lengths'] = (tokens, tokens)  # torch >= 2.6; older: whole tiles
    return BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod, **lengths
    )
