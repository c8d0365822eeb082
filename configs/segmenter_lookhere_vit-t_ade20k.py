# Segmenter, mask decoder, LookHere ViT-T/16 (192 dims, 12 layers), ADE20K 512x512.
# 12 heads of 16 dims instead of DeiT-T's 3: the LookHere head layouts need 6, 12 or
# 16 heads (12 or 16 for lh45). No official ViT-T weights: trains from scratch.
_base_ = ['./segmenter_lookhere_ade20k.py']
model = dict(
    pretrained=None,
    backbone=dict(embed_dims=192, num_heads=12),
    decode_head=dict(in_channels=192, channels=192, num_heads=3, embed_dims=192),
)
