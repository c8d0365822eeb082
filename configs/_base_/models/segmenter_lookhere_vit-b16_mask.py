# Segmenter (mask-transformer decoder, Strudel et al. 2021) on a LookHere ViT-B/16.
# The backbone replaces mmseg's VisionTransformer: no position embedding, the LookHere
# bias (preset lh180 unless the pretrained checkpoint stores another) gives position.
# LeanEncoderDecoder / LeanSegmenterMaskTransformerHead are the drop-ins for mmseg's
# EncoderDecoder / SegmenterMaskTransformerHead (same arguments, weights and outputs) that
# keep whole-frame inference lean: fused attention in the head, no identity resize of the
# full-resolution logits (see docs/performance.md). mmseg Segmenter checkpoints load as they are.
custom_imports = dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)

# The official LookHere ImageNet weights (GreenCUBIC/lookhere: LH_180 / LH_90 / LH_45
# ..._weights_and_config.pth) are trained with ImageNet mean/std.
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    # pad test images to a patch multiple; the padding is cropped off the prediction
    test_cfg=dict(size_divisor=16),
)
model = dict(
    type='LeanEncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='LookHereViT',
        img_size=(512, 512),
        patch_size=16,
        in_channels=3,
        embed_dims=768,
        num_layers=12,
        num_heads=12,
        drop_path_rate=0.1,
        attn_drop_rate=0.0,
        drop_rate=0.0,
        final_norm=True,
        with_cls_token=True,
        out_indices=-1,
        # None: lh180, or the LookHere config stored in the pretrained checkpoint.
        # --cfg-options model.backbone.preset=lh90 (or lh45) switches when training
        # from scratch; a checkpoint's own config must match an explicit preset.
        preset=None,
        init_cfg=None,
    ),
    decode_head=dict(
        type='LeanSegmenterMaskTransformerHead',
        in_channels=768,
        channels=768,
        num_classes=150,
        num_layers=2,
        num_heads=12,
        embed_dims=768,
        dropout_ratio=0.0,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    ),
    train_cfg=dict(),
    test_cfg=dict(mode='slide', crop_size=(512, 512), stride=(480, 480)),
)
