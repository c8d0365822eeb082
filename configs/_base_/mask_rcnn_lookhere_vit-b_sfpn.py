# Mask R-CNN, ViTDet style (Li et al., ECCV 2022), with a LookHere ViT-B/16 backbone:
# plain backbone with window + global LookHere attention -> SimpleFPN (strides 4..64)
# -> RPN with 2 convs -> 4conv1fc box head and mask head, LayerNorm (LN2d) everywhere.
# Model only; data, schedule and runtime are in the configs that inherit this one.
_base_ = ['mmdet::_base_/models/mask-rcnn_r50_fpn.py']

custom_imports = dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)

# Official LookHere ImageNet weights (the LookHere config is read from the file).
pretrained = 'checkpoints/LH_180_weights_and_config.pth'
norm_cfg = dict(type='LN2d', requires_grad=True)

model = dict(
    data_preprocessor=dict(pad_size_divisor=32, pad_mask=True),
    backbone=dict(
        _delete_=True,
        type='LookHereViT',
        img_size=1024,
        patch_size=16,
        embed_dims=768,
        num_layers=12,
        num_heads=12,
        mlp_ratio=4,
        drop_path_rate=0.1,
        with_cls_token=True,  # the pretrained CLS token: global in every block
        out_indices=(11,),  # SimpleFPN reads the last map only
        window_size=14,  # 14x14-patch windows (1024 px -> 64x64 grid, padded to 70)
        window_block_indexes=[0, 1, 3, 4, 6, 7, 9, 10],  # blocks 2, 5, 8, 11 are global
        init_cfg=dict(type='Pretrained', checkpoint=pretrained),
    ),
    neck=dict(
        _delete_=True,
        type='SimpleFPN',
        in_channels=768,
        out_channels=256,
        scale_factors=(4.0, 2.0, 1.0, 0.5),
        num_outs=5,  # + P6 (max-pool) for the RPN's stride-64 anchors
        norm_cfg=norm_cfg,
    ),
    rpn_head=dict(num_convs=2),
    roi_head=dict(
        bbox_head=dict(type='Shared4Conv1FCBBoxHead', conv_out_channels=256, norm_cfg=norm_cfg),
        mask_head=dict(norm_cfg=norm_cfg),
    ),
)
