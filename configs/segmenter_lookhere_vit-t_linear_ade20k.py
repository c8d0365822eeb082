# Segmenter, linear decoder, LookHere ViT-T/16 (192 dims, 12 heads), ADE20K 512x512.
_base_ = ['./segmenter_lookhere_linear_ade20k.py']
model = dict(
    pretrained=None,
    backbone=dict(embed_dims=192, num_heads=12),
    decode_head=dict(in_channels=192, channels=192),
)
