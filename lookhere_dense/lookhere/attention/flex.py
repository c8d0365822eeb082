"""The ``flex`` backend: LookHere attention through PyTorch's ``flex_attention``.

A ``score_mod`` reads the bias from the relative-offset table at the pair's offset
(:func:`flex_score_mod`), a ``BlockMask`` built tile row by tile row from the boolean
fields of view lets the kernel skip fully blocked tiles (:func:`lookhere_block_mask`),
and the tokens run in tile order (:func:`tile_order`), where directed heads skip more
tiles. Compiled on CUDA; eager on CPU, for tests (the forward, and the gradients of
learnable slopes: torch has no CPU backward for ``q, k, v``; docs/gpu.md).

Needs a torch with ``torch.nn.attention.flex_attention`` (>= 2.5, see
:func:`flex_available`); everything else in :mod:`lookhere_dense.lookhere` works without it.
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Tuple, Union

import torch
from torch import Tensor

from ..bias import GridBias, num_prefix_tokens, pair_index
from .common import (
    FLEX_BLOCK,
    FLEX_RECOMPILE_LIMIT,
    AttentionCall,
    AttentionRequest,
    block_mask_from_tiles,
    check_flex_call,
    flex_available,
    flex_function,
    inverse_order,
    raise_recompile_limit,
    tile_order,
    token_codes,
    visible_tiles,
)

__all__ = [
    'NAME',
    'FALLIBLE',
    'can_run',
    'attend',
    'FLEX_BLOCK',
    'flex_available',
    'flex_slope_grads_available',
    'check_flex_call',
    'tile_order',
    'flex_index',
    'FLEX_INDEX_PAD',
    'captured_tensor',
    'flex_score_mod',
    'flex_mask_mod',
    'lookhere_block_mask',
    'flex_attention_lookhere',
    'FLEX_CUDA_KERNEL_OPTIONS',
    'flex_kernel_options',
    'raise_recompile_limit',
    'FLEX_RECOMPILE_LIMIT',
]

NAME = 'flex'
#: compile problems are platform specific: when ``auto`` chose flex and it raised, the
#: engine warns, skips flex for the rest of the model's life and asks the chooser again
FALLIBLE = True


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


#: Triton tile settings of flex's CUDA kernels for bfloat16 / float16 ``q, k, v``, tried in
#: order. Inductor's Hopper default for head dim 64 in 16-bit types (128 x 128 tiles, 3
#: stages) does not fit our ``score_mod``: its bias gather is a ``(BLOCK_M, BLOCK_N)`` float32
#: load per stage, and the forward asked for 249,856 bytes of shared memory where an H200
#: has 232,448 ("No valid triton configs. OutOfMemoryError: out of resource", every
#: bfloat16 / float16 case of the first GPU run, torch 2.11). Float32 keeps inductor's own
#: (128 x 32 tiles: it compiled and passed there). The first entry halves the key tile and
#: drops a stage (the forward's and the backward's); where a kernel still does not fit,
#: the forward is retried with the next (the backward compiles on the first
#: ``.backward()``, outside any retry: it gets the entry that compiled the forward).
FLEX_CUDA_KERNEL_OPTIONS: Tuple[dict, ...] = (
    dict(
        fwd_BLOCK_M=128,
        fwd_BLOCK_N=64,
        fwd_num_stages=2,
        bwd_BLOCK_M1=64,
        bwd_BLOCK_N1=64,
        bwd_BLOCK_M2=64,
        bwd_BLOCK_N2=64,
        bwd_num_stages=2,
    ),
    dict(
        fwd_BLOCK_M=64,
        fwd_BLOCK_N=32,
        fwd_num_stages=1,
        bwd_BLOCK_M1=32,
        bwd_BLOCK_N1=32,
        bwd_BLOCK_M2=32,
        bwd_BLOCK_N2=32,
        bwd_num_stages=1,
    ),
)

#: (dtype, head dim) -> index into FLEX_CUDA_KERNEL_OPTIONS that compiled in this process
_cuda_options_level: dict = {}


#: the first torch whose flex takes ``fwd_`` / ``bwd_`` prefixed kernel options
#: (pytorch/pytorch#139639); before it our options are not passed (inductor's own tiles)
FLEX_PREFIXED_OPTIONS_TORCH = (2, 6)


def flex_kernel_options(
    device_type: str,
    dtype: torch.dtype,
    head_dim: int = 64,
    compiled: bool = True,
    version: Optional[str] = None,
) -> Optional[dict]:
    """The ``kernel_options`` our flex calls pass: None (inductor's own) on CPU, in float32
    and eagerly; on CUDA in bfloat16 / float16 the entry of :data:`FLEX_CUDA_KERNEL_OPTIONS`
    that compiled last for this dtype and head dim (the first until one fails).

    Args:
        device_type: ``'cuda'``, ``'cpu'``, ...
        dtype: the dtype of ``q, k, v``.
        head_dim: ``q``'s last dimension. Default: 64.
        compiled: whether flex runs compiled. Default: True.
        version: a torch version to judge instead of the installed one (tests): None
            before :data:`FLEX_PREFIXED_OPTIONS_TORCH`. Default: None.
    """
    from torch.torch_version import TorchVersion

    if not compiled or device_type != 'cuda' or dtype not in (torch.bfloat16, torch.float16):
        return None
    if TorchVersion(version or torch.__version__) < FLEX_PREFIXED_OPTIONS_TORCH:
        return None
    level = _cuda_options_level.get((dtype, head_dim), 0)
    return dict(FLEX_CUDA_KERNEL_OPTIONS[level])


def _out_of_shared_memory(err: BaseException) -> bool:
    """Whether a compile error is Triton's "out of resource" (shared memory) one."""
    return 'out of resource' in str(err)


#: the callbacks' index arrays are padded to a multiple of this many tokens: a ragged last
#: tile's rows and columns (positions up to the next kernel tile, whose sides divide
#: FLEX_BLOCK) read a valid entry without a clamp per pair
FLEX_INDEX_PAD = 2 * FLEX_BLOCK


def flex_index(
    grid_size: Tuple[int, int],
    cls_token: Union[bool, int],
    order: Optional[Tensor] = None,
    device: Optional[torch.device] = None,
) -> Callable[[Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]]:
    """``(q_idx, kv_idx) -> (is_cls, table_index, key_patch)`` for flex callbacks
    (``is_cls``: the query or the key is one of the ``cls_token`` prefix tokens).

    ``q_idx``/``kv_idx`` are positions in ``order`` (:func:`tile_order`, which puts the
    prefix tokens last; None: the model's order, prefix first). ``table_index`` indexes a
    flattened ``(2H-1) * (2W-1)`` table, ``key_patch`` the key's patch (row-major), both
    int32.

    Flex evaluates the callbacks on every (query, key) pair of every computed tile, so the
    per-pair work is kept to two int32 gathers from per-token arrays (``code = y * (2W-1)
    + x`` and the key's patch, in flex order, built here once), one subtraction and the
    prefix comparisons -- no division, no int64, no clamp: the offset ``(dy, dx)``'s entry
    is ``code[key] - code[query] + (H-1) * (2W-1) + W-1`` (:func:`~..bias.pair_index`),
    which stays inside the table for prefix tokens too (their code is 0) and for the
    padding of a ragged last tile (the arrays are padded to :data:`FLEX_INDEX_PAD`).
    ``device``: where the arrays live (default: ``order``'s, else the CPU).
    """
    height, width = grid_size
    off = num_prefix_tokens(cls_token)
    num_patches = height * width
    total = num_patches + off
    code, key_patch = token_codes(grid_size, cls_token, order, device)
    centre = pair_index(grid_size, 0, 0)
    pad = -(-total // FLEX_INDEX_PAD) * FLEX_INDEX_PAD - total
    code = torch.nn.functional.pad(code, (0, pad))
    key_patch = torch.nn.functional.pad(key_patch, (0, pad))
    prefix_last = order is not None

    def index(q_idx: Tensor, kv_idx: Tensor):
        if prefix_last:
            is_cls = (q_idx >= num_patches) | (kv_idx >= num_patches)
        else:
            is_cls = (q_idx < off) | (kv_idx < off)
        return is_cls, code[kv_idx] - code[q_idx] + centre, key_patch[kv_idx]

    return index


def captured_tensor(t: Tensor) -> Tensor:
    """``t`` as a ``score_mod`` may capture it: contiguous, and, where it requires grad,
    a tensor of its own rather than a view of another.

    Compiled flex in torch 2.8 to 2.13 (probed on CPU: 2.8, 2.11, 2.12, 2.13 under
    ``aot_eager``; 2.14 does not) can give no gradient to a captured tensor that is a
    view of a graph value (a layer's row of the learnable-slopes table,
    ``table[0].flatten(1)``): ``loss.backward()`` left the slopes' ``.grad`` None, with
    no error, even where another captured tensor got its gradient. The H200 run (torch
    2.11, inductor, ``q, k, v`` with gradients) got the slope gradients right, so whole
    models training on a GPU were likely spared; the CPU simulation of the GPU script
    (``q, k, v`` without gradients) was not. A copy of a layer's table is small (``heads
    * (2H-1) * (2W-1)`` floats, once per step); fixed tables (no grad) are captured as
    they are (docs/gpu.md).
    """
    if t.requires_grad and t._base is not None:
        return t.clone(memory_format=torch.contiguous_format)
    return t.contiguous()


def flex_score_mod(
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    order: Optional[Tensor] = None,
    index: Optional[Callable] = None,
) -> Callable:
    """A flex ``score_mod`` adding layer ``layer``'s LookHere bias from the table.

    The bias is read from the flattened ``(heads, (2H-1)(2W-1))`` table (float32) at the
    pair's relative offset, plus the per-key term of ``center`` heads; pairs with one of
    the ``cls_token`` global prefix tokens (CLS / Jumbo) get 0.
    ``order``: the token order of the flex call (:func:`tile_order`), None: the model's.
    ``index``: a :func:`flex_index` for this grid and order (None: built here).
    A table that requires grad (learnable slopes) gets its gradient from flex's backward
    (torch >= 2.6, :func:`flex_slope_grads_available`); the block mask never depends on
    the slopes.

    Precision: the score is taken as float32 (``score.float()``) and the float32 bias
    added to it, so with bfloat16 / float16 ``q, k, v`` the modified score is float32 on
    every path, and so is what the function returns. What flex hands in is already
    float32 where we could check (torch 2.14: the eager math path computes ``q k^T`` in
    float32, the CPU C++ kernel declares the score float32); Triton's CUDA kernel feeds
    its float32 ``q k^T`` accumulator but traces the function with a score in the input
    dtype, where the explicit cast keeps the sum (and the prefix branch) float32. Flex
    then runs the softmax in float32 and rounds only the probabilities before ``P V`` and
    the output to the input dtype (``tests/test_flex_precision.py``).
    """
    table = captured_tensor(grid_bias.table[layer].float().flatten(1))
    if index is None:
        index = flex_index(grid_bias.grid_size, cls_token, order, table.device)
    key_term = (
        None if grid_bias.key_term is None else captured_tensor(grid_bias.key_term[layer].float())
    )

    def score_mod(score, b, h, q_idx, kv_idx):
        is_cls, t, kp = index(q_idx, kv_idx)
        bias = table[h, t]
        if key_term is not None:
            bias = bias + key_term[h, kp]
        score = score.float()  # never the sum in bfloat16 / float16 (see the docstring)
        return torch.where(is_cls, score, score + bias)

    return score_mod


def flex_mask_mod(
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    order: Optional[Tensor] = None,
    index: Optional[Callable] = None,
) -> Callable:
    """A flex ``mask_mod``: True where layer ``layer``'s heads see the key (positions in
    ``order``, None: the model's order; ``index``: a :func:`flex_index` for them, None:
    built here)."""
    visible = grid_bias.visible[layer].flatten(1).contiguous()
    if index is None:
        index = flex_index(grid_bias.grid_size, cls_token, order, visible.device)

    def mask_mod(b, h, q_idx, kv_idx):
        is_cls, t, _ = index(q_idx, kv_idx)
        return is_cls | visible[h, t]

    return mask_mod


def lookhere_block_mask(
    grid_bias: GridBias,
    layer: int,
    cls_token: Union[bool, int],
    block: int = FLEX_BLOCK,
    order: Optional[Tensor] = None,
    index: Optional[Callable] = None,
):
    """The flex ``BlockMask`` of layer ``layer``'s fields of view, built tile row by tile row.

    For every tile row of ``block`` queries the ``(heads, block, T)`` visibility is read
    from the boolean relative table (no ``(heads, T, T)`` mask, no compilation) and
    reduced to "some key visible" (partial tile) and "all keys visible" (full tile, no
    ``mask_mod`` call needed); tiles with no visible key are skipped by the kernel.
    Equal to ``create_block_mask(flex_mask_mod(..., order), None, heads, T, T)``.

    Args:
        order: token order of the flex call (:func:`tile_order`); None: the model's.
        index: the :func:`flex_index` of its ``mask_mod`` (None: built here).

    Returns:
        A ``BlockMask`` for ``(B=1 broadcast, heads, T, T)``, or None when every head
        sees every key (nothing to skip).
    """
    tiles = visible_tiles(grid_bias, layer, cls_token, block, order)
    if tiles is None:
        return None
    partial, full = tiles
    total = grid_bias.num_patches + num_prefix_tokens(cls_token)
    return block_mask_from_tiles(
        partial[None],
        full[None],
        block,
        total,
        flex_mask_mod(grid_bias, layer, cls_token, order, index),
    )


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
    fn = flex_function(compiled, compile_backend)
    if score_mod is None:
        score_mod = flex_score_mod(grid_bias, layer, cls_token, order)
    if order is not None:
        q, k, v = (t.index_select(2, order) for t in (q, k, v))
    with warnings.catch_warnings():
        if not compiled:  # eager on purpose; a compiled call that fell back still warns
            warnings.filterwarnings(
                'ignore', message='flex_attention called without torch.compile'
            )
        out = _call_flex(fn, q, k, v, score_mod, block_mask, compiled)
    if order is not None:
        out = out.index_select(2, inverse_order(order))
    return out


def _call_flex(
    fn: Callable,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    score_mod: Callable,
    block_mask,
    compiled: bool,
    device_type: Optional[str] = None,
) -> Tensor:
    """``fn(q, k, v, ...)`` with :func:`flex_kernel_options`; on CUDA a forward whose kernel
    does not fit in shared memory is compiled again with the next, smaller entry of
    :data:`FLEX_CUDA_KERNEL_OPTIONS` (remembered for the process); the last one's error is
    raised. ``device_type``: the options' device (None: ``q``'s; tests)."""
    key = (q.dtype, q.shape[-1])
    device_type = device_type or q.device.type
    while True:
        options = flex_kernel_options(device_type, q.dtype, q.shape[-1], compiled)
        if options is None:
            return fn(q, k, v, score_mod=score_mod, block_mask=block_mask)
        try:
            return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=options)
        except Exception as err:
            level = _cuda_options_level.get(key, 0)
            if not _out_of_shared_memory(err) or level + 1 >= len(FLEX_CUDA_KERNEL_OPTIONS):
                raise
            warnings.warn(
                f'flex: the CUDA kernel with {FLEX_CUDA_KERNEL_OPTIONS[level]} does not fit in '
                f'shared memory here; compiling again with {FLEX_CUDA_KERNEL_OPTIONS[level + 1]}',
                stacklevel=3,
            )
            _cuda_options_level[key] = level + 1


def can_run(request: AttentionRequest) -> Optional[str]:
    """Needs ``flex_attention``, no attention dropout; ``auto`` on CUDA only (eager flex on
    CPU materialises the scores; the chooser skips it after it failed in this model); slope gradients
    need torch >= 2.6 (:func:`flex_slope_grads_available`), and not compiled on CPU; no
    training on CPU (no CPU backward)."""
    if not flex_available():
        return f'torch {torch.__version__} has no torch.nn.attention.flex_attention'
    if request.dropout_p:
        return 'has no attention dropout'
    if request.auto and torch.device(request.device).type != 'cuda':
        return 'auto uses it on CUDA only (eager flex materialises the scores)'
    if request.slope_grads and not flex_slope_grads_available():
        return f'torch {torch.__version__} cannot give a score_mod table gradients'
    if request.training and request.on_cpu:
        return "PyTorch's flex_attention has no CPU backward"
    if request.slope_grads and request.on_cpu and request.compiled_flex:
        return 'compiled flex_attention has no CPU backward (learnable slopes)'
    return None


def attend(call: AttentionCall) -> Tensor:
    """:func:`flex_attention_lookhere` with the engine's block masks, token orders and
    score functions (a fresh ``score_mod`` at learnable slopes: same code, no
    recompilation)."""
    q, k, v, engine = call.q, call.k, call.v, call.engine
    layer, grid_size, cls_token = call.layer, call.grid_size, call.cls_token
    check_flex_call(q, k, v, call.dropout_p, "attn_backend='flex'", "'auto', 'chunked' or 'sdpa'")
    if call.slope_grads and q.device.type == 'cpu' and engine.flex_compile:
        raise ValueError(
            'compiled flex_attention cannot train learnable LookHere slopes '
            "on CPU (PyTorch's CPU flex kernel has no backward); use "
            "flex_compile=None/False there, or attn_backend='auto' / "
            "'chunked'"
        )
    if call.slope_grads and not flex_slope_grads_available():
        raise ValueError(
            f"attn_backend='flex' cannot train learnable LookHere slopes with "
            f'torch {torch.__version__} (flex_attention gives captured '
            'tensors gradients from torch 2.6 on); use attn_backend='
            "'auto' or 'chunked', or upgrade torch"
        )
    mask = engine.block_mask(layer, grid_size, cls_token, q.device)
    order = engine.flex_order(grid_size, cls_token, q.device)
    if call.slopes is None:
        grid_bias, index = engine.grid_bias(grid_size, q.device), layer
        mod = engine.score_mod(layer, grid_size, cls_token, q.device)
    else:  # the table changes every step: a fresh score_mod (same code, no recompile)
        grid_bias, index = engine.layer_bias(
            layer, grid_size, q.device, torch.float32, call.slopes
        )
        mod = flex_score_mod(
            grid_bias, 0, cls_token, order, engine.flex_index(grid_size, cls_token, q.device)
        )
    return flex_attention_lookhere(
        q,
        k,
        v,
        grid_bias,
        index,
        cls_token,
        mask,
        engine.flex_compile,
        mod,
        order,
        compile_backend=getattr(engine, 'flex_compile_backend', 'inductor'),
    )
