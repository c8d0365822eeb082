"""The ``sdpa`` backend: the cached dense ``(heads, T, T)`` bias of each layer as a 4-D
float ``attn_mask`` of ``F.scaled_dot_product_attention`` (its fused kernels on CPU and
CUDA); the fastest wherever every layer's dense bias fits the engine's budget.

Masks go to ``F.scaled_dot_product_attention`` as 4-D ``(1, heads, Tq, Tk)`` tensors and
windows as a 4-D batch: with a 3-D mask or 5-D inputs PyTorch silently drops to its
unfused "math" kernel (2-8x slower on CPU, and it materialises the attention matrix).
"""

from __future__ import annotations

from typing import Optional

from torch import Tensor

from .common import AttentionCall, AttentionRequest, biased_sdpa

__all__ = ['NAME', 'can_run', 'attend', 'sdpa_attention', 'as_4d']

NAME = 'sdpa'


def can_run(request: AttentionRequest) -> Optional[str]:
    """Runs everywhere; ``auto`` takes it while every layer's dense bias fits
    ``max_dense_mb``."""
    if request.auto and request.dense_bytes > request.max_dense_bytes:
        return (
            f'the dense biases of all layers ({request.dense_bytes / 2**20:.0f} MiB) pass '
            f'max_dense_mb ({request.max_dense_bytes / 2**20:.0f} MiB)'
        )
    return None


def as_4d(mask: Tensor) -> Tensor:
    """``(heads, T, S)`` -> ``(1, heads, T, S)`` (a view); 4-D masks pass through."""
    return mask.unsqueeze(0) if mask.dim() == 3 else mask


def sdpa_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor, dropout_p: float = 0.0
) -> Tensor:
    """``F.scaled_dot_product_attention`` with the bias as a 4-D float ``attn_mask``
    (:func:`~.common.biased_sdpa`: on CPU a bias that needs a gradient stays on the flash
    kernel).

    Args:
        q, k, v: ``(B, heads, T, d)``.
        bias: ``(heads, T, S)`` or ``(1 | B, heads, T, S)``.

    Returns:
        ``(B, heads, T, d)``.
    """
    return biased_sdpa(q, k, v, as_4d(bias), dropout_p)


def attend(call: AttentionCall) -> Tensor:
    """:func:`sdpa_attention` with the engine's cached dense bias of the layer (built every
    call at learnable slopes)."""
    q = call.q
    bias = call.engine.dense_or_slope_bias(
        call.layer, call.grid_size, call.cls_token, q.device, q.dtype, call.slopes
    )
    return sdpa_attention(q, call.k, call.v, bias, call.dropout_p)
