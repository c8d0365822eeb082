"""``'ledit'``: LEDiT's position sense without a position encoding (Zhang et al. 2025,
"LEDiT: Your Length-Extrapolatable Diffusion Transformer without Positional Encoding",
arXiv 2503.04344).

LEDiT "needs no explicit PEs": "causal attention [...] implicitly impart[s] global
positional information to tokens, while enhancing locality [...] precisely distinguish[es]
adjacent tokens"; the project page: "the main difference lies in the incorporation of
causal attention and convolution after patchification". Here:

* no position embedding is added to any token;
* every layer attends causally in the raster (row-major) order of the patch grid: patch
  query ``i`` sees patch keys ``j <= i`` (:func:`causal_attention`);
* a locality module after the patch embedding (:class:`LocalityConv`, the encoding's
  :meth:`~LEDiTPositionEncoding.add_to_tokens` hook): a residual depthwise ``k x k``
  convolution over the token grid, zero-initialised (the identity at initialisation),
  optionally the sum of several dilations.

The choices the paper's text (as read for this module: its abstract and project page; the
method section was not available) leaves open are written down in
``docs/position_encodings.md`` (section ``ledit``) and in the class docstring.

Prefix tokens (``cls_token`` = ``J``: CLS, or ``J`` Jumbo tokens at the front) are global by
default: every patch query sees all prefix keys and the prefix queries attend to every
token; with ``global_prefix=False`` they are the first ``J`` tokens of the causal order
(a prefix query sees only the prefix keys up to itself), which makes the attention strictly
causal; the locality convolution still reaches ``d * (k // 2)`` patches ahead
(``locality=False`` for a strictly causal trunk).

Backends (``attn_backend``), all exact (the same result up to rounding):

==============  ===========================================================================
``sdpa``        ``F.scaled_dot_product_attention(is_causal=True)`` over the whole sequence
                (prefix first, so every patch sees every prefix key), the ``J`` prefix
                query rows recomputed without mask (fused flash / memory-efficient kernels)
``chunked``     blocks of query rows; a block attends only to the keys up to its last row,
                with a causal mask on its own part; activation checkpointing per block
                while autograd records (memory-lean at high resolution)
``flex``        ``flex_attention`` with a causal ``mask_mod`` and a ``BlockMask`` built
                tile by tile from the causal structure (tiles above the diagonal skipped);
                compiled on CUDA, eager (forward only) on CPU
``reference``   an explicit boolean mask and a plain softmax in float32 / float64: the
                ground truth
``auto``        ``sdpa`` (the fused causal kernels are the fastest and hold no ``T x T``
                matrix)
==============  ===========================================================================

Window blocks (ViTDet) are causal in each window's own raster order, with the padded keys
of border windows masked and the prefix tokens global as in a global block
(:func:`causal_window_attention`), whatever the backend.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from lookhere_dense.validation import check_bool, check_int

from ..bias import num_prefix_tokens, prefix_phrase
from ..cache import BoundedCache
from ..flex import FLEX_BLOCK, check_flex_call, flex_available
from ..windows import attend_in_windows, window_valid
from .base import PositionEncoding, Trunk

__all__ = [
    'LEDiTPositionEncoding',
    'LocalityConv',
    'LEDIT_BACKENDS',
    'causal_attention',
    'causal_mask',
    'causal_reference',
    'causal_sdpa',
    'causal_chunked',
    'causal_flex',
    'causal_block_mask',
    'causal_window_attention',
    'window_causal_mask',
]

#: the values of ``attn_backend`` ``'ledit'`` runs with
LEDIT_BACKENDS = ('auto', 'reference', 'sdpa', 'chunked', 'flex')


def _check_tokens(q: Tensor, k: Tensor, grid_size: Tuple[int, int], prefix: int) -> None:
    n = grid_size[0] * grid_size[1] + prefix
    if q.shape[-2] != n or k.shape[-2] != n:
        raise ValueError(
            f'ledit attention got {q.shape[-2]} tokens but grid {tuple(grid_size)} '
            f'{prefix_phrase(prefix)} needs {n}'
        )


# -- global causal attention ---------------------------------------------------------------
def causal_mask(tokens: int, prefix: int, global_prefix: bool = True, device=None) -> Tensor:
    """The boolean ``(T, T)`` visibility of causal attention (True: the query sees the key).

    Key ``j <= i`` for query ``i``; with ``global_prefix`` the first ``prefix`` query rows
    see every key (the prefix keys come first, so every query sees them anyway).
    """
    idx = torch.arange(tokens, device=device)
    visible = idx[None, :] <= idx[:, None]
    if global_prefix and prefix:
        visible[:prefix] = True
    return visible


def _prefix_rows(
    q: Tensor, k: Tensor, v: Tensor, prefix: int, global_prefix: bool, dropout_p: float
) -> Tensor:
    """The output rows of the ``prefix`` queries: every key (global) or causal among the
    prefix keys."""
    if global_prefix:
        return F.scaled_dot_product_attention(q[:, :, :prefix], k, v, dropout_p=dropout_p)
    return F.scaled_dot_product_attention(
        q[:, :, :prefix],
        k[:, :, :prefix],
        v[:, :, :prefix],
        dropout_p=dropout_p,
        is_causal=True,
    )


def causal_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix: int = 0,
    global_prefix: bool = True,
    dropout_p: float = 0.0,
) -> Tensor:
    """Causal attention with an explicit boolean mask (:func:`causal_mask`) and a plain
    softmax in float32 (float64 for float64 inputs): the ground truth.

    Args:
        q, k, v: ``(B, heads, T, d)``, the ``prefix`` tokens first.

    Returns:
        ``(B, heads, T, d)`` in ``q``'s dtype.
    """
    work = torch.promote_types(q.dtype, torch.float32)
    logits = (q.to(work) * q.shape[-1] ** -0.5) @ k.to(work).transpose(-2, -1)
    visible = causal_mask(q.shape[-2], prefix, global_prefix, q.device)
    attn = logits.masked_fill(~visible, float('-inf')).softmax(dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p)
    return (attn @ v.to(work)).to(q.dtype)


def causal_sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix: int = 0,
    global_prefix: bool = True,
    dropout_p: float = 0.0,
) -> Tensor:
    """Causal attention through ``F.scaled_dot_product_attention(is_causal=True)``.

    ``is_causal`` over the whole sequence is exact for the patch rows: the prefix comes
    first, so patch query ``i`` (sequence index ``J + i``) sees the ``J`` prefix keys and
    the patch keys ``0..i``. With ``global_prefix`` the ``J`` prefix rows (which
    ``is_causal`` limits to the prefix keys up to themselves) are recomputed without a mask.
    """
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if prefix and global_prefix:
        head = _prefix_rows(q, k, v, prefix, True, dropout_p)
        out = torch.cat([head, out[:, :, prefix:]], dim=2)
    return out


def _auto_rows(q: Tensor) -> int:
    """Query rows per chunked block: the ``(B, heads, rows, T)`` scores of a block no
    larger than the MLP activation of the tokens (``B x T x 4C``), at least 64."""
    return max(64, 4 * q.shape[-1])


def causal_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix: int = 0,
    global_prefix: bool = True,
    dropout_p: float = 0.0,
    block_size: Optional[int] = None,
    recompute: Optional[bool] = None,
) -> Tensor:
    """Causal attention over blocks of query rows (memory-lean).

    The patch queries ``s..e-1`` attend only to the keys ``0..J+e-1`` (every prefix key
    and the patches up to the block's last row), with the causal mask on the block's own
    diagonal part; the keys after the block are never touched. With ``recompute``
    (default: whenever autograd records) every block runs under activation checkpointing,
    so backward keeps no block's scores. The prefix query rows run as one call
    (:func:`_prefix_rows`).

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = J + N``.
        block_size: query rows per block; None or 0: ``max(64, 4 * head_dim)``.
            Default: None.
        recompute: checkpoint each block. Default: when autograd records.

    Returns:
        ``(B, heads, T, d)``.
    """
    total = q.shape[-2]
    n = total - prefix
    records = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if recompute is None:
        recompute = records
    rows = max(1, min(block_size or _auto_rows(q), max(n, 1)))

    def block(q_blk: Tensor, k_blk: Tensor, v_blk: Tensor) -> Tensor:
        length, keys = q_blk.shape[-2], k_blk.shape[-2]
        qi = torch.arange(keys - length, keys, device=q_blk.device)
        mask = torch.arange(keys, device=q_blk.device)[None, :] <= qi[:, None]
        return F.scaled_dot_product_attention(
            q_blk, k_blk, v_blk, attn_mask=mask, dropout_p=dropout_p
        )

    # without autograd (and checkpointing), every block is written straight into the result
    result = None if records or recompute else q.new_empty(*q.shape[:-1], v.shape[-1])
    blocks = []
    if prefix:
        head = _prefix_rows(q, k, v, prefix, global_prefix, dropout_p)
        if result is None:
            blocks.append(head)
        else:
            result[:, :, :prefix] = head
    for s in range(0, n, rows):
        e = min(n, s + rows)
        args = (q[:, :, prefix + s : prefix + e], k[:, :, : prefix + e], v[:, :, : prefix + e])
        if recompute:
            blocks.append(checkpoint(block, *args, use_reentrant=False))
        elif result is None:
            blocks.append(block(*args))
        else:
            result[:, :, prefix + s : prefix + e] = block(*args)
    if result is not None:
        return result
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)


def causal_block_mask(
    tokens: int,
    prefix: int = 0,
    global_prefix: bool = True,
    device=None,
    block: int = FLEX_BLOCK,
):
    """The flex ``BlockMask`` of causal attention over ``tokens`` (:func:`causal_mask`),
    built tile by tile from the causal structure (no ``T x T`` mask, no compilation).

    Query tile ``i`` (rows ``r0..r1``) and key tile ``j`` (keys ``c0..c1``): some key is
    visible when ``c0 <= r1`` or a row is a global prefix row (``r0 < J``); every key is
    visible when all rows are prefix rows or ``c1 <= max(r0, J)`` (the first non-prefix
    row sees the tile's last key), and the tile is whole (a ragged last tile, past ``T``,
    stays partial). Equal to ``create_block_mask(mask_mod, None, None, T, T,
    BLOCK_SIZE=block)`` with the causal mask_mod (``tests/test_ledit.py``).
    """
    import inspect

    from torch.nn.attention.flex_attention import BlockMask

    n_tiles = -(-tokens // block)
    start = torch.arange(n_tiles, device=device) * block
    last = torch.clamp(start + block - 1, max=tokens - 1)
    r0, r1 = start[:, None], last[:, None]
    c0, c1 = start[None, :], last[None, :]
    glob = prefix if global_prefix else 0
    some = (c0 <= r1) | (r0 < glob)
    whole = (last - start + 1) == block  # the ragged last tile is never full (as flex's)
    every = ((r1 < glob) | (c1 <= torch.clamp(r0, min=glob))) & whole[:, None] & whole[None, :]
    partial = some & ~every

    def ordered(tiles: Tensor) -> Tuple[Tensor, Tensor]:
        as_int = tiles[None, None].to(torch.int32)
        return (
            as_int.sum(-1).to(torch.int32),
            torch.argsort(as_int, dim=-1, descending=True, stable=True).to(torch.int32),
        )

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(every)
    lengths = {}
    if 'seq_lengths' in inspect.signature(BlockMask.from_kv_blocks).parameters:
        lengths['seq_lengths'] = (tokens, tokens)
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=block,
        mask_mod=_flex_mask_mod(prefix, global_prefix),
        **lengths,
    )


def _flex_mask_mod(prefix: int, global_prefix: bool):
    glob = prefix if global_prefix else 0

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) | (q_idx < glob)

    return mask_mod


def causal_flex(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix: int = 0,
    global_prefix: bool = True,
    block_mask=None,
    compiled: Optional[bool] = None,
) -> Tensor:
    """Causal attention through ``flex_attention`` with a causal ``mask_mod`` and the
    tile-skipping ``block_mask`` (:func:`causal_block_mask`, built when None).

    Args:
        compiled: run the ``torch.compile``-d kernel (the project's one,
            :mod:`lookhere_dense.lookhere.flex`). Default: on CUDA only (eager flex is
            forward only on CPU and materialises the scores; kept for tests).
    """
    from ..flex import _flex_fn

    if compiled is None:
        compiled = q.is_cuda
    if block_mask is None:
        block_mask = causal_block_mask(q.shape[-2], prefix, global_prefix, q.device)
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')
        return _flex_fn(compiled)(q, k, v, block_mask=block_mask)


def causal_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prefix: int = 0,
    global_prefix: bool = True,
    dropout_p: float = 0.0,
    backend: str = 'sdpa',
    block_size: Optional[int] = None,
    block_mask=None,
) -> Tensor:
    """Causal attention (raster order, ``prefix`` tokens first) with one of
    :data:`LEDIT_BACKENDS` (``'auto'``: ``'sdpa'``). ``block_size``: rows per block of
    ``'chunked'``; ``block_mask``: a cached :func:`causal_block_mask` for ``'flex'``.

    Raises:
        ValueError: an unknown backend; ``'flex'`` with dropout, or training on CPU.
    """
    if backend == 'auto':
        backend = 'sdpa'
    if backend == 'sdpa':
        return causal_sdpa(q, k, v, prefix, global_prefix, dropout_p)
    if backend == 'chunked':
        return causal_chunked(q, k, v, prefix, global_prefix, dropout_p, block_size)
    if backend == 'reference':
        return causal_reference(q, k, v, prefix, global_prefix, dropout_p)
    if backend == 'flex':
        check_flex_call(
            q,
            k,
            v,
            dropout_p,
            "pos_encoding='ledit' with attn_backend='flex'",
            "'auto', 'sdpa' or 'chunked'",
        )
        return causal_flex(q, k, v, prefix, global_prefix, block_mask)
    raise ValueError(
        f"pos_encoding='ledit': unknown attention backend {backend!r}; "
        f'allowed: {list(LEDIT_BACKENDS)}'
    )


# -- windows -------------------------------------------------------------------------------
def window_causal_mask(
    grid_size: Tuple[int, int], window_size: int, prefix: int, device=None
) -> Tensor:
    """Boolean visibility ``(nWin, T_w, T_w)`` (``T_w = J + ws*ws``) of causal window
    attention, in each window's own raster order with the ``J`` prefix tokens first.

    A query sees the prefix keys and the real patch keys of its window up to itself;
    padded keys (border windows of a grid that is not a multiple of ``ws``) are hidden from
    every other query, so every row sees at least itself: no row is empty, no NaN, forward
    or backward (the caller drops the padded and prefix rows of the windows).
    """
    valid = window_valid(grid_size, window_size, prefix, device)
    idx = torch.arange(valid.shape[1], device=device)
    earlier = idx[None, :] <= idx[:, None]
    return earlier[None] & (
        valid[:, None, :] | torch.eye(len(idx), dtype=torch.bool, device=device)
    )


def causal_window_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    grid_size: Tuple[int, int],
    window_size: int,
    prefix: int = 0,
    global_prefix: bool = True,
    dropout_p: float = 0.0,
    mask: Optional[Tensor] = None,
) -> Tensor:
    """ViTDet window attention, causal in each window's raster order.

    The frame of every encoding's window attention
    (:func:`~lookhere_dense.lookhere.windows.attend_in_windows`: patches split into
    ``window_size`` windows, zero-padded at the bottom / right, the ``J`` prefix tokens at
    the front of every window); inside a window a patch sees the prefix keys and its
    window's real patches up to itself (:func:`window_causal_mask`). The prefix queries
    attend as in a global block (every token with ``global_prefix``, else causally among
    the prefix). A window covering the grid is global causal attention (the window's
    raster order is the grid's).

    Args:
        q, k, v: ``(B, heads, T, d)`` with ``T = J + H*W``.
        mask: a cached :func:`window_causal_mask` (built when None).

    Returns:
        ``(B, heads, T, d)``.
    """
    ws = int(window_size)
    if mask is None:
        mask = window_causal_mask(grid_size, ws, prefix, q.device)

    def attend(qw: Tensor, kw: Tensor, vw: Tensor) -> Tensor:
        batch, n_win, heads, tw, dim = qw.shape
        attn_mask = mask[None, :, None].expand(batch, -1, -1, -1, -1).reshape(-1, 1, tw, tw)
        out = F.scaled_dot_product_attention(
            *(t.reshape(batch * n_win, heads, tw, -1) for t in (qw, kw, vw)),
            attn_mask=attn_mask,
            dropout_p=dropout_p,
        )
        return out.view(batch, n_win, heads, tw, -1)

    return attend_in_windows(
        q,
        k,
        v,
        grid_size,
        ws,
        prefix,
        attend,
        dropout_p,
        prefix_rows=lambda q, k, v: _prefix_rows(q, k, v, prefix, global_prefix, dropout_p),
    )


# -- the locality module -------------------------------------------------------------------
class LocalityConv(nn.Module):
    """The locality module after the patch embedding: ``x + sum_d conv_d(x)``, a
    ``kernel_size`` convolution over the token grid per dilation ``d`` (``'same'`` zero
    padding, so any grid ``H, W >= 1`` keeps its shape), one bias.

    Args:
        channels: token channels ``D``.
        kernel_size: odd kernel side. Default: 3.
        dilations: one branch per dilation rate, summed. Default: ``(1,)``.
        depthwise: one ``k x k`` filter per channel (``groups = D``); False: a full
            ``D -> D`` convolution. Default: True.
        zero_init: weights and bias start at zero (the module starts as the identity, so
            a pretrained trunk's features are unchanged at the start of fine-tuning);
            False: PyTorch's ``Conv2d`` initialisation. Default: True.

    Parameters:
        weight: ``(len(dilations), D, 1 or D, k, k)``.
        bias: ``(D,)``.
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int = 3,
        dilations: Sequence[int] = (1,),
        depthwise: bool = True,
        zero_init: bool = True,
    ):
        super().__init__()
        self.channels = check_int('ledit channels', channels)
        self.kernel_size = check_int('pos_encoding ledit kernel_size', kernel_size)
        if kernel_size % 2 == 0:
            raise ValueError(
                f'pos_encoding ledit kernel_size must be odd (a centred kernel), got {kernel_size}'
            )
        if isinstance(dilations, int) and not isinstance(dilations, bool):
            dilations = (dilations,)
        if not isinstance(dilations, (list, tuple)) or not dilations:
            raise ValueError(
                f'pos_encoding ledit dilations must be a positive int or a non-empty '
                f'list of them, got {dilations!r}'
            )
        for d in dilations:
            check_int('pos_encoding ledit dilations entry', d)
        if len(set(dilations)) != len(dilations):
            raise ValueError(f'pos_encoding ledit dilations repeat a rate: {list(dilations)}')
        self.dilations = tuple(int(d) for d in dilations)
        self.depthwise = check_bool('pos_encoding ledit depthwise', depthwise)
        self.zero_init = check_bool('pos_encoding ledit zero_init', zero_init)
        fan = 1 if depthwise else channels
        self.weight = nn.Parameter(
            torch.zeros(len(self.dilations), channels, fan, kernel_size, kernel_size)
        )
        self.bias = nn.Parameter(torch.zeros(channels))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        if self.zero_init:
            self.weight.zero_()
            self.bias.zero_()
            return
        fan_in = self.weight.shape[2] * self.kernel_size**2
        for w in self.weight:  # nn.Conv2d's default, per branch
            nn.init.kaiming_uniform_(w, a=5**0.5)
        bound = fan_in**-0.5
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """``(B, H*W, D)`` patch tokens (row-major) -> the same shape."""
        h, w = (int(s) for s in grid_size)
        if x.dim() != 3 or x.shape[1] != h * w or x.shape[2] != self.channels:
            raise ValueError(
                f'ledit locality module got tokens of shape {tuple(x.shape)}, expected '
                f'(B, {h}*{w}, {self.channels}) for the grid {(h, w)}'
            )
        img = x.transpose(1, 2).reshape(x.shape[0], self.channels, h, w)
        weight = self.weight.to(x.dtype)
        groups = self.channels if self.depthwise else 1
        pad = self.kernel_size // 2
        out = None
        for i, d in enumerate(self.dilations):
            y = F.conv2d(img, weight[i], None, padding=d * pad, dilation=d, groups=groups)
            out = y if out is None else out + y
        out = out + self.bias.to(x.dtype)[:, None, None]
        return x + out.flatten(2).transpose(1, 2)

    def extra_repr(self) -> str:
        return (
            f'channels={self.channels}, kernel_size={self.kernel_size}, '
            f'dilations={self.dilations}, depthwise={self.depthwise}, '
            f'zero_init={self.zero_init}'
        )


# -- the encoding --------------------------------------------------------------------------
class LEDiTPositionEncoding(PositionEncoding):
    """``'ledit'``: no position embedding, causal attention in the patch grid's raster
    order, and a locality module after the patch embedding (LEDiT, Zhang et al. 2025).

    Decisions (the paper states causal attention, no explicit PE and "convolution after
    patchification"; the rest is this implementation's):

    * causal in every layer, row-major order over the grid of each forward (any size: a
      larger grid is a longer sequence, nothing to extrapolate);
    * prefix tokens (``cls_token`` = ``J``) global by default (``global_prefix``); their
      keys are seen by every patch, their queries see every token. Through them a patch
      can learn of later patches one layer later, so only ``global_prefix=False`` (or
      ``J = 0``) makes the attention strictly causal (the locality convolution still sees
      ``d * (k // 2)`` patches ahead; ``locality=False`` for a strictly causal trunk);
    * windows: causal in each window's own raster order, padded keys masked, prefix global;
    * the locality module (:class:`LocalityConv`): residual, depthwise ``3 x 3``, every
      channel, zero-initialised, applied to the patch tokens only (prefix tokens have no
      grid position) -- all options.

    Args:
        embed_dims: token channels ``D``.
        attn_backend: one of :data:`LEDIT_BACKENDS`. Default: ``'auto'``.
        block_size: query rows per block of ``'chunked'``; None or 0: automatic.
            Default: None.
        kernel_size, dilations, depthwise, zero_init: of :class:`LocalityConv`.
        locality: build the locality module; False: causal attention only (an ablation;
            no parameters). Default: True.
        global_prefix: prefix queries attend to every token; False: causally among the
            prefix. Default: True.

    Parameters:
        locality.weight, locality.bias: see :class:`LocalityConv` (with ``locality``).
    """

    name = 'ledit'
    options = ('kernel_size', 'dilations', 'depthwise', 'zero_init', 'locality', 'global_prefix')

    def __init__(
        self,
        embed_dims: int,
        attn_backend: str = 'auto',
        block_size: Optional[int] = None,
        kernel_size: int = 3,
        dilations: Union[int, Sequence[int]] = (1,),
        depthwise: bool = True,
        zero_init: bool = True,
        locality: bool = True,
        global_prefix: bool = True,
    ):
        super().__init__()
        if attn_backend not in LEDIT_BACKENDS:
            raise ValueError(
                f"pos_encoding='ledit' cannot run attn_backend={attn_backend!r}; allowed: "
                f'{list(LEDIT_BACKENDS)} (causal masking is exact in each)'
            )
        if attn_backend == 'flex' and not flex_available():
            raise ValueError(
                f"pos_encoding='ledit' with attn_backend='flex' needs torch's "
                f'flex_attention (torch >= 2.5), not in torch {torch.__version__}'
            )
        if block_size is not None:
            check_int('ledit attn_block_size', block_size, minimum=0, description='>= 0')
        self.attn_backend = attn_backend
        self.block_size = block_size or None
        self.global_prefix = check_bool('pos_encoding ledit global_prefix', global_prefix)
        check_bool('pos_encoding ledit locality', locality)
        self.locality: Optional[LocalityConv] = (
            LocalityConv(embed_dims, kernel_size, dilations, depthwise, zero_init)
            if locality
            else None
        )
        self.last_backend: Optional[str] = None
        #: window masks and flex block masks per (kind, grid / tokens, J, device)
        self._cache = BoundedCache(8)

    @classmethod
    def from_spec(
        cls, options: Mapping[str, Any], trunk: Trunk, **spec: Any
    ) -> 'LEDiTPositionEncoding':
        return cls(trunk.embed_dims, trunk.attn_backend, trunk.attn_block_size, **options)

    def add_to_tokens(self, x: Tensor, grid_size: Tuple[int, int]) -> Tensor:
        """The locality module on the patch tokens ``(B, H*W, D)`` (identity without it)."""
        return x if self.locality is None else self.locality(x, grid_size)

    def choose_backend(self) -> str:
        """The backend of the next call: the configured one; ``'auto'`` -> ``'sdpa'``."""
        return 'sdpa' if self.attn_backend == 'auto' else self.attn_backend

    def forward(
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
        _check_tokens(q, k, grid_size, prefix)
        backend = self.choose_backend()
        self.last_backend = backend
        mask = None
        if backend == 'flex':
            mask = self._cache.get_or_create(
                ('flex', q.shape[-2], prefix, self.global_prefix, str(q.device)),
                lambda: causal_block_mask(q.shape[-2], prefix, self.global_prefix, q.device),
            )
        return causal_attention(
            q, k, v, prefix, self.global_prefix, dropout_p, backend, self.block_size, mask
        )

    def window_attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        layer: int,
        grid_size: Tuple[int, int],
        window_size: int,
        cls_token: Union[bool, int],
        dropout_p: float = 0.0,
        tokens: Optional[Tensor] = None,
    ) -> Tensor:
        prefix = num_prefix_tokens(cls_token)
        _check_tokens(q, k, grid_size, prefix)
        ws = check_int('ledit window_size', window_size)
        grid = (int(grid_size[0]), int(grid_size[1]))
        mask = self._cache.get_or_create(
            ('window', grid, ws, prefix, str(q.device)),
            lambda: window_causal_mask(grid, ws, prefix, q.device),
        )
        return causal_window_attention(
            q, k, v, grid, ws, prefix, self.global_prefix, dropout_p, mask
        )

    def reset_parameters(self) -> None:
        if self.locality is not None:
            self.locality.reset_parameters()

    def clear_caches(self) -> None:
        """Drop the cached window masks and flex block masks."""
        self._cache.clear()

    def extra_repr(self) -> str:
        return (
            f'name={self.name!r}, attn_backend={self.attn_backend!r}, '
            f'global_prefix={self.global_prefix}'
        )
