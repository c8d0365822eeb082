"""LookHere attention: the backends, and the two dense ones.

Every backend gives the same result; they differ in how the bias reaches the softmax:

==============  ==============================================================  ==============
backend         how the bias reaches the softmax                                extra memory
==============  ==============================================================  ==============
``reference``   materialised ``(heads, T, T)`` bias + plain softmax attention    heads*T^2 (x2)
                (:func:`reference_attention`, here)
``sdpa``        cached materialised bias as a 4-D ``attn_mask`` of              heads*T^2 per
                ``F.scaled_dot_product_attention`` (fused kernel on CPU/GPU)     layer, cached
                (:func:`sdpa_attention`, here)
``chunked``     blocks of query rows; each block's bias rows are copied from    heads*T*block
                the relative-offset table into one reused buffer; runs of
                heads that only look up (down) attend only to the key rows
                above (below) the block; backward recomputes per block
                (:mod:`.chunked`)
``tiled``       CPU: per head group with one field of view, blocks of query     O(T) + one
                patches against the key strips / rows they can see; the bias   re-pitched
                is a strided view of a re-pitched table, partial results are   table
                merged by their log-sum-exp; flash-style backward
                (:mod:`.tiled`)
``buffered``    CPU: per chunk of heads, the dense bias copied from a           one chunk's
                re-pitched table into one reused buffer right before a fused    bias (<= 32
                flash call, and again in backward; nothing kept per layer       MB) for all
                (:mod:`.buffered`)                                              layers
``fused``       CPU, a compiled kernel of ours: per 8x8 query tile an online     keys / values
                softmax over only the 8x8 key tiles the head can see, the      of a few heads
                bias read from the table in the pass that takes the row        in tile order
                maximum; flash backward (:mod:`.fused`)                        (<= 32 MB)
``flex``        ``flex_attention`` with a ``score_mod`` that reads the table     O(T) + tiles
                by ``(q_idx, kv_idx)`` and a ``BlockMask`` of the fields of
                view, so fully blocked tiles are skipped (compiled on CUDA)
                (:mod:`.flex`)
==============  ==============================================================  ==============

Token order is ``[p_0, ..., p_{J-1}, patch_0, ..., patch_{N-1}]``: ``J >= 0`` global prefix
tokens (every backend's ``cls_token``: CLS is ``J = 1``, Jumbo tokens ``J``; their rows and
columns carry no bias) before the patches, row-major over the grid.

Masks go to ``F.scaled_dot_product_attention`` as 4-D ``(1, heads, Tq, Tk)`` tensors and
windows as a 4-D batch: with a 3-D mask or 5-D inputs PyTorch silently drops to its
unfused "math" kernel (2-8x slower on CPU, and it materialises the attention matrix).

:class:`~.engine.LookHereAttentionEngine` (:mod:`.engine`) chooses a backend per call and
owns the caches.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ['BACKENDS', 'reference_attention', 'sdpa_attention']

#: Values of the engine's ``backend`` (and the backbone's ``attn_backend``).
BACKENDS = ('auto', 'reference', 'sdpa', 'chunked', 'flex', 'tiled', 'buffered', 'fused')


def _as_4d(mask: Tensor) -> Tensor:
    """``(heads, T, S)`` -> ``(1, heads, T, S)`` (a view); 4-D masks pass through."""
    return mask.unsqueeze(0) if mask.dim() == 3 else mask


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout_p: float = 0.0
) -> Tensor:
    """Plain softmax attention with an additive bias; the ground truth for tests.

    Computed in float32 (float64 for float64 inputs) whatever the inputs' dtype, and
    returned in that dtype, so low-precision runs of the other backends can be checked
    against it.

    Args:
        q, k, v: ``(B, heads, T, d)`` (``k``/``v`` may have another length ``S``).
        bias: ``(heads, T, S)`` or broadcastable to ``(B, heads, T, S)``.
        dropout_p: attention dropout probability (applied only if > 0).

    Returns:
        ``(B, heads, T, d)`` in ``q``'s dtype.
    """
    work = torch.promote_types(q.dtype, torch.float32)
    scale = q.shape[-1] ** -0.5
    logits = (q.to(work) * scale) @ k.to(work).transpose(-2, -1) + bias.to(work)
    attn = logits.softmax(dim=-1)
    if dropout_p > 0:
        attn = F.dropout(attn, p=dropout_p)
    return (attn @ v.to(work)).to(q.dtype)


def sdpa_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout_p: float = 0.0
) -> Tensor:
    """``F.scaled_dot_product_attention`` with the bias as a 4-D float ``attn_mask``.

    Args:
        q, k, v: ``(B, heads, T, d)``.
        bias: ``(heads, T, S)`` or ``(1 | B, heads, T, S)``.

    Returns:
        ``(B, heads, T, d)``.
    """
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=_as_4d(bias).to(q.dtype), dropout_p=dropout_p
    )
