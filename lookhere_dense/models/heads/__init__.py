"""Decode heads (registered in mmseg's ``MODELS``)."""

from .segmenter_mask_head import (
    FusedSelfAttention,
    LeanSegmenterMaskTransformerHead,
    fused_self_attention,
)

__all__ = ['LeanSegmenterMaskTransformerHead', 'FusedSelfAttention', 'fused_self_attention']
