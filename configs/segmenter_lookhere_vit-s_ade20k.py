# Segmenter, mask decoder, LookHere ViT-S/16 (384 dims, 12 layers), ADE20K 512x512.
# 12 heads of 32 dims instead of DeiT-S's 6 heads: every preset (lh180 / lh90 / lh45)
# needs 12 or 16 heads for its head layout (lh180 / lh90 would also fit 6).
# No official LookHere ViT-S weights exist: trains from scratch unless you set
# --cfg-options model.pretrained=PATH (a LookHere / timm / DeiT-III ViT-S file).
_base_ = ['./segmenter_lookhere_ade20k.py']
model = dict(
    pretrained=None,
    backbone=dict(embed_dims=384, num_heads=12),
    decode_head=dict(in_channels=384, channels=384, num_heads=6, embed_dims=384))
