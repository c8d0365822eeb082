# UPerNet with a LookHere ViT-B/16 backbone (window + global attention, ViTDet style) and a
# SimpleFPN turning its last map into strides 4, 8, 16, 32. Model only.
custom_imports = dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)

# Official LookHere ImageNet weights (the LookHere config is read from the file).
pretrained = 'checkpoints/LH_180_weights_and_config.pth'
norm_cfg = dict(type='SyncBN', requires_grad=True)
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    # pad test images to a patch multiple; the padding is cropped off the prediction
    # (without it, the backbone pads and the head stretches the padded grid over the image)
    test_cfg=dict(size_divisor=16),
)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='LookHereViT',
        img_size=(512, 512),
        patch_size=16,
        embed_dims=768,
        num_layers=12,
        num_heads=12,
        mlp_ratio=4,
        drop_path_rate=0.1,
        with_cls_token=True,
        out_indices=(11,),
        # 16x16-patch windows divide 512-px crops (32x32 grid) and 2048x1024 frames
        # (64x128); window_size=0 makes every block global (BEiT/MAE-style UPerNet).
        window_size=16,
        window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10],
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(
        type='SimpleFPN',
        in_channels=768,
        out_channels=256,
        scale_factors=(4.0, 2.0, 1.0, 0.5),
        norm_cfg=dict(type='LN2d', requires_grad=True),
    ),
    decode_head=dict(
        type='UPerHead',
        in_channels=[256, 256, 256, 256],
        in_index=[0, 1, 2, 3],
        pool_scales=(1, 2, 3, 6),
        channels=512,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    ),
    auxiliary_head=dict(
        type='FCNHead',
        in_channels=256,
        in_index=2,  # the stride-16 level
        channels=256,
        num_convs=1,
        concat_input=False,
        dropout_ratio=0.1,
        num_classes=150,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=0.4),
    ),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'),
)
