"""FLOP counts with the attention included (lookhere_dense.engine.complexity)."""

from __future__ import annotations

import torch

from lookhere_dense.engine.complexity import SDPA_OP, flop_analyzer
from lookhere_dense.models.backbones import LookHereViT


def test_the_attention_is_counted_as_mmseg_vits_is():
    """mmengine's counter skips aten::scaled_dot_product_attention (a LookHere ViT-S at
    256x256 counted 0.61 G short); with the handle it counts what mmseg's
    VisionTransformer of the same shape counts through its matmuls, to the FLOP."""
    from mmengine.analysis import FlopAnalyzer
    from mmseg.models.backbones import VisionTransformer

    x = torch.randn(1, 3, 128, 128)
    args = dict(img_size=128, embed_dims=192, num_layers=2, num_heads=6)
    ours = LookHereViT(**args, final_norm=True).eval()
    stock = VisionTransformer(**args, final_norm=True)
    stock.eval()
    plain = FlopAnalyzer(ours, (x,))
    plain.total()
    assert plain.unsupported_ops()[SDPA_OP] == 2  # what mmengine's own leaves out
    counted = flop_analyzer(ours, (x,))
    counted.total()
    assert SDPA_OP not in counted.unsupported_ops()
    tokens, head_dims = 8 * 8 + 1, 32
    attention = 2 * 6 * tokens * tokens * (head_dims + head_dims)  # 2 layers, 6 heads
    assert counted.total() - plain.total() == attention
    assert counted.total() == FlopAnalyzer(stock, (x,)).total()
