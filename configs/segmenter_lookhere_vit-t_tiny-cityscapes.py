# The demo / CI model for the Cityscapes layout: a mask-decoder LookHere ViT-T/16 on
# the tiny Cityscapes-layout dataset of research.datasets.synthetic_seg (128x256
# frames, 1/8 of 1024x2048), trained on 96x96 crops (a 6x6 patch grid; the real
# config's 768 crop is 48x48). Tests: slide at the training crop, or the whole 128x256
# frame (grid 8x16), like the real config's slide-768 vs whole 1024x2048 (64x128).
# As in mmseg's Cityscapes configs, training resizes the frames by 0.5-2x around the
# test scale (RandomResize scale=(256, 128), like (2048, 1024) for 1024x2048 frames), so
# whole-frame and sliding-window tests see the pixel scale the model trained at.
_base_ = [
    './_base_/models/segmenter_lookhere_vit-b16_mask.py',
    './_base_/datasets/cityscapes_768x768_checked.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
]
crop_size = (96, 96)
max_iters = 300
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='CheckSegLabels', num_classes=19),
    dict(type='RandomResize', scale=(256, 128), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(256, 128), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='CheckSegLabels', num_classes=19),
    dict(type='PackSegInputs'),
]
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(img_size=crop_size, embed_dims=192, num_heads=12, drop_path_rate=0.0),
    decode_head=dict(in_channels=192, channels=192, num_heads=3, embed_dims=192, num_classes=19),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(64, 64)),
)
train_dataloader = dict(
    batch_size=4, num_workers=2, persistent_workers=True, dataset=dict(pipeline=train_pipeline)
)
val_dataloader = dict(
    batch_size=1, num_workers=1, persistent_workers=True, dataset=dict(pipeline=test_pipeline)
)
test_dataloader = val_dataloader
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    clip_grad=dict(max_norm=1.0),
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.01),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=30),
    dict(type='PolyLR', eta_min=1e-5, power=0.9, by_epoch=False, begin=30, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=25, log_metric_by_epoch=False),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1, save_last=True
    ),
)
randomness = dict(seed=0)
