"""``LeanSegmenterMaskTransformerHead``: mmseg's Segmenter mask-transformer head with
fused attention.

mmseg's ``SegmenterMaskTransformerHead`` runs its transformer layers through mmcv's
``MultiheadAttention``, i.e. ``torch.nn.MultiheadAttention`` with attention weights
returned, which materialises the ``(B * heads, N + K, N + K)`` attention matrix (and its
softmax) for ``N`` patch tokens and ``K`` class tokens. On a whole 1024x2048 Cityscapes
frame (N = 8192, ViT-B, 12 heads) that is 3.2 GB per matrix, and the decode head, not the
backbone, sets the model's peak memory.

This head is the drop-in for it: same constructor arguments, same submodules and
parameter names (an mmseg Segmenter ``state_dict`` loads into it with ``strict=True``),
same initialisation (same random stream: a model built with the same seed has the same
weights), same outputs; only the attention runs through
``F.scaled_dot_product_attention`` on 4-D ``(B, heads, T, d)`` inputs without a mask, so
PyTorch picks a fused kernel (flash / memory-efficient on CUDA, the flash kernel on CPU)
that never holds the ``T x T`` matrix. Swap it in with one key::

    decode_head=dict(type='LeanSegmenterMaskTransformerHead', ...)   # was SegmenterMaskTransformerHead

Attention dropout (``attn_drop_rate > 0``, training only) is passed to SDPA as
``dropout_p``; the CPU kernels then fall back to the unfused one (as PyTorch documents),
which is still never worse than mmseg's.
"""

from __future__ import annotations

from typing import Optional

import torch.nn as nn
import torch.nn.functional as F
from mmcv.cnn.bricks.transformer import MultiheadAttention
from mmseg.models.decode_heads import SegmenterMaskTransformerHead
from mmseg.registry import MODELS
from torch import Tensor

from ...lookhere.export import query_blocked_attention

__all__ = ['LeanSegmenterMaskTransformerHead', 'FusedSelfAttention', 'fused_self_attention']


def fused_self_attention(
    x: Tensor,
    attn: nn.MultiheadAttention,
    training: bool,
    query_block_budget_mb: Optional[float] = None,
) -> Tensor:
    """Self-attention of ``x`` with the weights of ``attn``, through fused SDPA.

    Equal to ``attn(x, x, x)[0]`` (batch-first), without the ``(B * heads, T, T)`` weights.

    Args:
        x: ``(B, T, C)`` tokens.
        attn: a ``torch.nn.MultiheadAttention`` with packed input projection
            (``in_proj_weight`` ``(3C, C)``, ``in_proj_bias`` ``(3C,)`` or None) and no
            ``bias_k`` / ``bias_v`` / ``add_zero_attn``.
        training: apply ``attn.dropout`` to the attention weights.
        query_block_budget_mb: attend in chained query blocks of at most this many MiB of
            logits (:func:`~lookhere_dense.lookhere.export.query_blocked_attention`, what an
            export asks for); inference only. Default: None (one SDPA call).

    Returns:
        ``(B, T, C)``: ``out_proj(softmax(q k^T / sqrt(d)) v)``.
    """
    if not attn._qkv_same_embed_dim or attn.bias_k is not None or attn.add_zero_attn:
        raise ValueError(
            'fused_self_attention supports nn.MultiheadAttention with a packed '
            'in_proj_weight and no bias_k / bias_v / add_zero_attn'
        )
    b, t, c = x.shape
    h = attn.num_heads
    qkv = F.linear(x, attn.in_proj_weight, attn.in_proj_bias)  # (B, T, 3C)
    q, k, v = qkv.view(b, t, 3, h, c // h).permute(2, 0, 3, 1, 4)  # 3 x (B, h, T, d)
    if query_block_budget_mb is not None and not training:
        out = query_blocked_attention(q, k, v, query_block_budget_mb)
    else:
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=attn.dropout if training else 0.0
        )  # (B, h, T, d)
    out = out.transpose(1, 2).reshape(b, t, c)
    return attn.out_proj(out)


class FusedSelfAttention(nn.Module):
    """mmcv's ``MultiheadAttention`` (self-attention use, with identity shortcut) on fused SDPA.

    Adopts the submodules of an existing mmcv ``MultiheadAttention`` -- ``attn`` (the
    ``nn.MultiheadAttention`` holding the weights), ``proj_drop``, ``dropout_layer`` --
    so parameter names (``attn.in_proj_weight``, ``attn.out_proj.weight``, ...) and values
    are unchanged. Forward: ``identity + dropout_layer(proj_drop(attention(query)))`` as
    mmcv's, for self-attention without masks or positional terms (what mmseg's ViT
    encoder layer uses); anything else raises.

    While a model is exported (:func:`~lookhere_dense.lookhere.export.static_grid_attention`)
    ``query_block_budget_mb`` is set and the attention runs in chained query blocks, so
    onnxruntime never holds the whole ``T x T`` probabilities.

    Args:
        mmcv_attn: the mmcv ``MultiheadAttention`` to take over.
    """

    def __init__(self, mmcv_attn: MultiheadAttention):
        super().__init__()
        self.embed_dims = mmcv_attn.embed_dims
        self.num_heads = mmcv_attn.num_heads
        self.batch_first = mmcv_attn.batch_first
        self.attn = mmcv_attn.attn
        self.proj_drop = mmcv_attn.proj_drop
        self.dropout_layer = mmcv_attn.dropout_layer
        self.query_block_budget_mb: Optional[float] = None  # set by an export

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        identity: Optional[Tensor] = None,
        query_pos: Optional[Tensor] = None,
        key_pos: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        **kwargs,
    ) -> Tensor:
        """``query``: ``(B, T, C)`` if ``batch_first`` else ``(T, B, C)``; same shape out."""
        unsupported = dict(
            key=key,
            value=value,
            query_pos=query_pos,
            key_pos=key_pos,
            attn_mask=attn_mask,
            key_padding_mask=key_padding_mask,
        )
        given = [
            name
            for name, v in unsupported.items()
            if v is not None and not (name in ('key', 'value') and v is query)
        ] + sorted(kwargs)
        if given:
            raise ValueError(
                f'FusedSelfAttention is self-attention without masks or '
                f'positional terms; got {given}'
            )
        if identity is None:
            identity = query
        x = query if self.batch_first else query.transpose(0, 1)
        out = fused_self_attention(x, self.attn, self.training, self.query_block_budget_mb)
        if not self.batch_first:
            out = out.transpose(0, 1)
        return identity + self.dropout_layer(self.proj_drop(out))


@MODELS.register_module()
class LeanSegmenterMaskTransformerHead(SegmenterMaskTransformerHead):
    """Segmenter's mask-transformer head (Strudel et al., ICCV 2021) with fused attention.

    The drop-in for mmseg's ``SegmenterMaskTransformerHead``: the same arguments (see
    there: ``in_channels``, ``num_layers``, ``num_heads``, ``embed_dims``, ``mlp_ratio=4``,
    ``drop_path_rate=0.1``, ``drop_rate=0.0``, ``attn_drop_rate=0.0``, ``num_fcs=2``,
    ``qkv_bias=True``, ``act_cfg=dict(type='GELU')``, ``norm_cfg=dict(type='LN')``,
    ``init_std=0.02`` and ``BaseDecodeHead``'s), the same parameters under the same names,
    the same outputs; the attention of each transformer layer goes through
    :class:`FusedSelfAttention` (``F.scaled_dot_product_attention``, never a
    ``(heads, N+K, N+K)`` matrix).

    Only registered in mmseg's ``MODELS`` (a semantic-segmentation decode head).
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for layer in self.layers:
            layer.attn = FusedSelfAttention(layer.attn)
