"""The ``reference`` backend: the materialised ``(heads, T, T)`` bias and a plain softmax
in float32 (float64 for float64 inputs); the ground truth of the tests, never chosen by
``auto``."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .common import AttentionCall, AttentionRequest

__all__ = ['NAME', 'can_run', 'attend', 'reference_attention']

NAME = 'reference'


def can_run(request: AttentionRequest) -> Optional[str]:
    """Runs everywhere, with everything; ``auto`` never picks it (it is the slowest)."""
    if request.auto:
        return 'the ground truth of the tests: never chosen by auto'
    return None


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


def attend(call: AttentionCall) -> Tensor:
    """:func:`reference_attention` with the engine's dense bias of the layer."""
    q = call.q
    bias = call.engine.dense_or_slope_bias(
        call.layer, call.grid_size, call.cls_token, q.device, q.dtype, call.slopes
    )
    return reference_attention(q, call.k, call.v, bias, call.dropout_p)
