"""LookHere attention: one entry point, several backends that all give the same result.

==============  ==============================================================  ==========
backend         how the bias reaches the softmax                                memory
==============  ==============================================================  ==========
``reference``   materialised ``(heads, T, T)`` bias + plain softmax attention    heads*T^2
``sdpa``        cached materialised bias as ``attn_mask`` of                     heads*T^2
                ``F.scaled_dot_product_attention``
``chunked``     blocks of query rows; each block's bias is gathered from the     heads*T*block
                relative-offset table on the fly; backward recomputes per block
``flex``        ``flex_attention`` with a ``score_mod`` that reads the table     O(T)
                by ``(q_idx, kv_idx)`` and a ``BlockMask`` of the fields of
                view, so fully blocked tiles are skipped (compiled on CUDA)
==============  ==============================================================  ==========

Token order is ``[CLS, patch_0, ..., patch_{N-1}]`` when there is a CLS token (its row and
column carry no bias), otherwise just the patches, row-major over the grid.

:class:`LookHereAttentionEngine` owns the caches (tables per grid, dense biases, block
masks; all bounded, keyed by grid or window size, device and dtype), chooses a backend
per call (``auto``), and is shared by all layers of a model: layers differ only in which
table slice they read. Nothing here is part of a ``state_dict``.
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from .bias import GridBias, LookHereConfig, build_grid_bias
from .cache import BoundedCache
from .windows import padded_grid, window_key_mask, window_partition, window_unpartition

__all__ = ['BACKENDS', 'LookHereAttentionEngine', 'reference_attention', 'sdpa_attention',
           'chunked_attention', 'flex_attention_lookhere', 'flex_available']

BACKENDS = ('auto', 'reference', 'sdpa', 'chunked', 'flex')


def reference_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                        dropout_p: float = 0.0) -> Tensor:
    """Plain softmax attention with an additive bias; the ground truth for tests.

    Args:
        q, k, v: ``(B, heads, T, d)`` (``k``/``v`` may have another length ``S``).
        bias: ``(heads, T, S)`` or broadcastable to ``(B, heads, T, S)``.
        dropout_p: attention dropout probability (applied only if > 0).

    Returns:
        ``(B, heads, T, d)``.
    """
    scale = q.shape[-1] ** -0.5
    logits = (q * scale) @ k.transpose(-2, -1) + bias
    attn = logits.float().softmax(dim=-1).to(q.dtype)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p)
    return attn @ v


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor,
                   dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention`` with the bias as a float ``attn_mask``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype),
                                          dropout_p=dropout_p)


def chunked_attention(q: Tensor, k: Tensor, v: Tensor, grid_bias: GridBias, layer: int,
                      cls_token: bool, block_size: int = 256, dropout_p: float = 0.0,
                      recompute: Optional[bool] = None) -> Tensor:
    """Exact attention over blocks of ``block_size`` query rows.

    Each block's ``(heads, block, T)`` bias is gathered from ``grid_bias``'s relative
    table when the block is computed, so the whole ``(heads, T, T)`` bias never exists.
    With ``recompute`` (default: whenever autograd records) each block runs under
    activation checkpointing, so the backward pass keeps no ``T x T`` attention matrix
    either.

    Returns:
        ``(B, heads, T, d)``.
    """
    total = q.shape[-2]
    if recompute is None:
        recompute = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))

    def block(start: int, q_blk: Tensor, k_: Tensor, v_: Tensor) -> Tensor:
        rows = grid_bias.rows(layer, start, start + q_blk.shape[-2], cls_token)
        return F.scaled_dot_product_attention(q_blk, k_, v_, attn_mask=rows.to(q_blk.dtype),
                                              dropout_p=dropout_p)

    outs = []
    for start in range(0, total, block_size):
        q_blk = q[..., start:start + block_size, :]
        if recompute:
            outs.append(checkpoint(block, start, q_blk, k, v, use_reentrant=False))
        else:
            outs.append(block(start, q_blk, k, v))
    return torch.cat(outs, dim=-2)


# ----------------------------------------------------------------------------------------
# flex_attention
# ----------------------------------------------------------------------------------------
def flex_available() -> bool:
    """Whether ``torch.nn.attention.flex_attention`` can be imported."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:  # pragma: no cover - depends on the torch build
        return False
    return True


def _flex_index(grid_size: Tuple[int, int], cls_token: bool
                ) -> Callable[[Tensor, Tensor], Tuple[Tensor, Tensor, Tensor]]:
    """``(q_idx, kv_idx) -> (is_cls, table_index, key_patch)`` for flex callbacks."""
    height, width = grid_size
    off = int(cls_token)
    table_len = (2 * height - 1) * (2 * width - 1)

    def index(q_idx: Tensor, kv_idx: Tensor):
        qp = q_idx - off
        kp = kv_idx - off
        is_cls = (qp < 0) | (kp < 0)
        qp = qp.clamp(min=0)
        kp = kp.clamp(min=0)
        t = ((kp // width - qp // width + height - 1) * (2 * width - 1)
             + (kp % width - qp % width + width - 1))
        return is_cls, t.clamp(0, table_len - 1), kp

    return index


def flex_score_mod(grid_bias: GridBias, layer: int, cls_token: bool) -> Callable:
    """A flex ``score_mod`` adding layer ``layer``'s LookHere bias from the table."""
    index = _flex_index(grid_bias.grid_size, cls_token)
    table = grid_bias.table[layer].flatten(1).float()
    key_term = None if grid_bias.key_term is None else grid_bias.key_term[layer].float()

    def score_mod(score, b, h, q_idx, kv_idx):
        is_cls, t, kp = index(q_idx, kv_idx)
        bias = table[h, t]
        if key_term is not None:
            bias = bias + key_term[h, kp]
        return torch.where(is_cls, score, score + bias)

    return score_mod


def flex_mask_mod(grid_bias: GridBias, layer: int, cls_token: bool) -> Callable:
    """A flex ``mask_mod``: True where layer ``layer``'s heads see the key."""
    index = _flex_index(grid_bias.grid_size, cls_token)
    visible = grid_bias.visible[layer].flatten(1)

    def mask_mod(b, h, q_idx, kv_idx):
        is_cls, t, _ = index(q_idx, kv_idx)
        return is_cls | visible[h, t]

    return mask_mod


_compiled_flex = None


def _flex_fn(compiled: bool) -> Callable:
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention
    if not compiled:
        return flex_attention
    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def flex_attention_lookhere(q: Tensor, k: Tensor, v: Tensor, grid_bias: GridBias,
                            layer: int, cls_token: bool, block_mask=None,
                            compiled: Optional[bool] = None) -> Tensor:
    """LookHere attention through ``flex_attention`` (fused and tile-skipping when compiled).

    Args:
        block_mask: a ``BlockMask`` from :meth:`LookHereAttentionEngine.block_mask`
            (optional: without it no tile is skipped, the result is the same).
        compiled: run the ``torch.compile``-d kernel. Default: on CUDA only (eager flex
            materialises the scores; it is kept for CPU tests of the callbacks).
    """
    if compiled is None:
        compiled = q.is_cuda
    fn = _flex_fn(compiled)
    with warnings.catch_warnings():
        warnings.filterwarnings('ignore', message='flex_attention called without torch.compile')
        return fn(q, k, v, score_mod=flex_score_mod(grid_bias, layer, cls_token),
                  block_mask=block_mask)


# ----------------------------------------------------------------------------------------
# The engine
# ----------------------------------------------------------------------------------------
class LookHereAttentionEngine:
    """LookHere attention for one model: bias caches and backend choice.

    Args:
        config: the LookHere configuration.
        depth: number of layers that ask for a bias (layer index ``0..depth-1``).
        num_heads: heads per layer.
        backend: one of :data:`BACKENDS`. ``auto`` uses ``sdpa`` with a cached dense bias
            when the dense biases of all layers for the grid fit in ``max_dense_mb``, else
            ``flex`` on CUDA and ``chunked`` elsewhere. Default: ``'auto'``.
        block_size: query rows per block of the ``chunked`` backend. Default: 256.
        max_dense_mb: budget for cached dense biases of one grid (all layers). Default: 1024.
        cache_size: grids / windows kept per cache. Default: 4.
    """

    def __init__(self, config: LookHereConfig, depth: int, num_heads: int,
                 backend: str = 'auto', block_size: int = 256, max_dense_mb: float = 1024,
                 cache_size: int = 4):
        if backend not in BACKENDS:
            raise ValueError(f'unknown LookHere attention backend {backend!r}; '
                             f'allowed: {list(BACKENDS)}')
        if block_size < 1:
            raise ValueError(f'block_size must be >= 1, got {block_size}')
        config.validate(num_heads, depth)
        self.config = config
        self.depth = depth
        self.num_heads = num_heads
        self.backend = backend
        self.block_size = block_size
        self.max_dense_bytes = max_dense_mb * 2 ** 20
        self.tables = BoundedCache(cache_size)
        self.dense = BoundedCache(cache_size * depth)
        self.block_masks = BoundedCache(cache_size * max(1, len(config.direction_strings)))
        self._flex_failed = False

    def reset(self, config: Optional[LookHereConfig] = None) -> None:
        """Drop all caches (and switch to ``config`` if given)."""
        if config is not None:
            config.validate(self.num_heads, self.depth)
            self.config = config
        self.tables.clear()
        self.dense.clear()
        self.block_masks.clear()

    # -- cached pieces -------------------------------------------------------------------
    def grid_bias(self, grid_size: Tuple[int, int], device: torch.device) -> GridBias:
        """Relative tables (float32) of every layer for ``grid_size`` on ``device``."""
        key = (tuple(grid_size), str(device))
        return self.tables.get_or_create(key, lambda: build_grid_bias(
            self.config, tuple(grid_size), self.depth, self.num_heads, device=device,
            dtype=torch.float32))

    def dense_bias(self, layer: int, grid_size: Tuple[int, int], cls_token: bool,
                   device: torch.device, dtype: torch.dtype) -> Tensor:
        """The ``(heads, T, T)`` bias of ``layer`` in ``dtype``, built once per grid."""
        key = (layer, tuple(grid_size), cls_token, str(device), dtype)
        return self.dense.get_or_create(key, lambda: self.grid_bias(grid_size, device).dense(
            layer, cls_token).to(dtype))

    def block_mask(self, layer: int, grid_size: Tuple[int, int], cls_token: bool,
                   device: torch.device):
        """The flex ``BlockMask`` of ``layer``'s fields of view (shared by all layers with
        the same head string), or None when nothing is blocked."""
        gb = self.grid_bias(grid_size, device)
        direction = self.config.layer_direction(layer)
        key = (direction, tuple(grid_size), cls_token, str(device))

        def make():
            from torch.nn.attention.flex_attention import create_block_mask
            if bool(gb.visible[layer].all()):
                return None
            total = gb.num_patches + int(cls_token)
            return create_block_mask(flex_mask_mod(gb, layer, cls_token), None,
                                     self.num_heads, total, total, device=device,
                                     _compile=device.type == 'cuda')

        return self.block_masks.get_or_create(key, make)

    def choose_backend(self, tokens: int, device: torch.device) -> str:
        """The backend ``auto`` picks for a sequence of ``tokens`` on ``device``."""
        if self.backend != 'auto':
            return self.backend
        dense_bytes = self.depth * self.num_heads * tokens * tokens * 4
        if dense_bytes <= self.max_dense_bytes:
            return 'sdpa'
        if device.type == 'cuda' and flex_available() and not self._flex_failed:
            return 'flex'
        return 'chunked'

    # -- attention -----------------------------------------------------------------------
    def __call__(self, q: Tensor, k: Tensor, v: Tensor, layer: int,
                 grid_size: Tuple[int, int], cls_token: bool, dropout_p: float = 0.0,
                 backend: Optional[str] = None) -> Tensor:
        """Attention of ``layer`` for ``q, k, v`` of shape ``(B, heads, T, d)``.

        ``T`` must be ``H*W`` (+1 with ``cls_token``) for ``grid_size = (H, W)``.
        """
        n = grid_size[0] * grid_size[1] + int(cls_token)
        if q.shape[-2] != n or k.shape[-2] != n:
            raise ValueError(f'attention got {q.shape[-2]} tokens but grid {tuple(grid_size)} '
                             f'{"with" if cls_token else "without"} CLS needs {n}')
        if q.shape[1] != self.num_heads:
            raise ValueError(f'attention got {q.shape[1]} heads, the LookHere config was '
                             f'built for {self.num_heads}')
        chosen_by_auto = backend is None and self.backend == 'auto'
        backend = backend or self.choose_backend(n, q.device)
        if backend not in BACKENDS or backend == 'auto':
            raise ValueError(f'unknown LookHere attention backend {backend!r}; '
                             f'allowed: {list(BACKENDS[1:])}')
        if backend in ('reference', 'sdpa'):
            bias = self.dense_bias(layer, grid_size, cls_token, q.device, q.dtype)
            fn = reference_attention if backend == 'reference' else sdpa_attention
            return fn(q, k, v, bias, dropout_p)
        gb = self.grid_bias(grid_size, q.device)
        if backend == 'chunked':
            return chunked_attention(q, k, v, gb, layer, cls_token, self.block_size, dropout_p)
        if dropout_p > 0:
            raise ValueError('the flex backend has no attention dropout; set attn_drop_rate=0 '
                             "or use backend 'chunked'/'sdpa'")
        try:
            mask = self.block_mask(layer, grid_size, cls_token, q.device)
            return flex_attention_lookhere(q, k, v, gb, layer, cls_token, mask)
        except Exception as err:  # pragma: no cover - compile problems are platform specific
            if not chosen_by_auto:
                raise
            self._flex_failed = True
            warnings.warn(f'LookHere flex attention failed ({type(err).__name__}: {err}); '
                          'falling back to the chunked backend for this model')
            return chunked_attention(q, k, v, gb, layer, cls_token, self.block_size, dropout_p)

    def window_attention(self, q: Tensor, k: Tensor, v: Tensor, layer: int,
                         grid_size: Tuple[int, int], window_size: int, cls_token: bool,
                         dropout_p: float = 0.0) -> Tensor:
        """ViTDet-style window attention with the LookHere bias of a window-sized grid.

        Patches attend within their ``window_size`` x ``window_size`` window (grids that
        are not a multiple are padded; padded keys are masked out, so a border window acts
        like a smaller one). The window bias is the bias of a ``(ws, ws)`` grid, the same
        for every window, built once per (window size, layer) and cached.

        With ``cls_token`` the CLS token keeps LookHere's global behaviour: every window
        also sees the CLS key (bias 0), and the CLS query attends to all tokens (bias 0),
        exactly as in a global block.

        Args:
            q, k, v: ``(B, heads, T, d)``, ``T = H*W (+1)``.

        Returns:
            ``(B, heads, T, d)``.
        """
        off = int(cls_token)
        n = grid_size[0] * grid_size[1] + off
        if q.shape[-2] != n:
            raise ValueError(f'window attention got {q.shape[-2]} tokens but grid '
                             f'{tuple(grid_size)} {"with" if cls_token else "without"} CLS '
                             f'needs {n}')
        ws = int(window_size)
        qw, kw, vw = (window_partition(t[:, :, off:], grid_size, ws) for t in (q, k, v))
        if cls_token:
            n_win = qw.shape[1]
            qw, kw, vw = (torch.cat([t[:, None, :, :1].expand(-1, n_win, -1, -1, -1), tw], dim=-2)
                          for t, tw in ((q, qw), (k, kw), (v, vw)))
        mask = self.dense_bias(layer, (ws, ws), cls_token, q.device, q.dtype)
        if padded_grid(grid_size, ws) != tuple(grid_size):
            key = ('window_pad', tuple(grid_size), ws, cls_token, str(q.device), q.dtype)
            pad = self.dense.get_or_create(key, lambda: window_key_mask(
                grid_size, ws, cls_token, q.device, q.dtype))
            mask = mask + pad  # (nWin, heads, T_w, T_w)
        out = F.scaled_dot_product_attention(qw, kw, vw, attn_mask=mask, dropout_p=dropout_p)
        out = window_unpartition(out[..., off:, :], grid_size, ws)
        if cls_token:  # the CLS row of a global block: no bias, all keys
            cls_out = F.scaled_dot_product_attention(q[:, :, :1], k, v, dropout_p=dropout_p)
            out = torch.cat([cls_out, out], dim=-2)
        return out
