# The demo / CI model: segmenter_lookhere_vit-t_ade20k.py (mask decoder, LookHere
# ViT-T/16) shrunk 4x in pixels for a CPU: crops of 128x128 (8x8 patch grid), images
# resized around a 128 px short side, 300 iterations from scratch on the tiny
# ADE20K-layout dataset of research.datasets.synthetic_seg (tools/demo.py makes it
# in data/ade/ADEChallengeData2016 and runs everything).
# From scratch on a tiny task AdamW with warm-up converges in a few hundred steps where
# the fine-tuning recipe (SGD 1e-3) would not; everything else is the real config.
_base_ = ['./segmenter_lookhere_vit-t_ade20k.py']
crop_size = (128, 128)
max_iters = 300
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegLabels', num_classes=150),
    dict(type='RandomResize', scale=(512, 128), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(512, 128), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='CheckSegLabels', num_classes=150),
    dict(type='PackSegInputs'),
]
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(img_size=crop_size, drop_path_rate=0.0),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(120, 120)),
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
