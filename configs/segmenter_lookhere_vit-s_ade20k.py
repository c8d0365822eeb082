# Segmenter, mask decoder, LookHere ViT-S/16 (384 dims, 12 layers), ADE20K 512x512.
# 12 heads of 32 dims instead of DeiT-S's 6 heads: every preset (lh180 / lh90 / lh45)
# fits 12 heads (lh180 / lh90 also fit 6, lh45 needs 12 or 16).
# No official LookHere ViT-S weights exist: trains from scratch. To start from DeiT-III
# ViT-S weights (timm deit3_small_*: 6 heads of 64 dims), build their 6 heads (a file of
# another head count is refused):
#   --cfg-options model.pretrained=PATH model.backbone.num_heads=6   (preset lh180 or lh90)
_base_ = ['./segmenter_lookhere_ade20k.py']
model = dict(
    pretrained=None,
    backbone=dict(embed_dims=384, num_heads=12),
    decode_head=dict(in_channels=384, channels=384, num_heads=6, embed_dims=384),
)
