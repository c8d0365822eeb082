# Mask R-CNN + SimpleFPN + LookHere ViT-B/16 (window + global attention) on Cityscapes
# instances (8 thing classes), ViTDet recipe: LSJ with 1024x1024 crops from the 2048x1024
# scale, AdamW, layer-wise lr decay 0.7, AMP; 24k iterations at batch 16 (8 GPUs x 2),
# about 130 epochs -- a starting point, not a tuned schedule.
# Training sees 1024x1024 crops; testing runs on the full 2048x1024 frames (a 64x128 patch
# grid): windowed blocks keep their 14x14 window bias, global blocks get the bias of the
# larger grid (LookHere extrapolates; no position embedding to resize).
# Annotations: mmdet's tools/dataset_converters/cityscapes.py writes
# annotations/instancesonly_filtered_gtFine_{train,val}.json.
# AmpOptimWrapper: float16 on a GPU; on a CPU this project's tools train in bfloat16 in its
# place (docs/vitdet.md); float32: --cfg-options optim_wrapper.type=OptimWrapper.
_base_ = [
    './_base_/mask_rcnn_lookhere_vit-b_sfpn.py',
    'mmdet::_base_/default_runtime.py',
]

crop_size = (1024, 1024)
model = dict(
    data_preprocessor=dict(
        batch_augments=[dict(type='BatchFixedSizePad', size=crop_size, pad_mask=True)]
    ),
    roi_head=dict(bbox_head=dict(num_classes=8), mask_head=dict(num_classes=8)),
)

dataset_type = 'CityscapesDataset'
data_root = 'data/cityscapes/'
backend_args = None

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=(2048, 1024), ratio_range=(0.1, 2.0), keep_ratio=True),
    dict(
        type='RandomCrop',
        crop_type='absolute_range',
        crop_size=crop_size,
        recompute_bbox=True,
        allow_negative_crop=True,
    ),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(2048, 1024), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'),
    ),
]

train_dataloader = dict(
    batch_size=2,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='InfiniteSampler', shuffle=True),  # an iteration-based loop (mmdet's ms-90k)
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='annotations/instancesonly_filtered_gtFine_train.json',
        data_prefix=dict(img='leftImg8bit/train/'),
        filter_cfg=dict(filter_empty_gt=True, min_size=32),
        pipeline=train_pipeline,
        backend_args=backend_args,
    ),
)
val_dataloader = dict(
    batch_size=1,
    num_workers=2,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='annotations/instancesonly_filtered_gtFine_val.json',
        data_prefix=dict(img='leftImg8bit/val/'),
        test_mode=True,
        filter_cfg=dict(filter_empty_gt=True, min_size=32),
        pipeline=test_pipeline,
        backend_args=backend_args,
    ),
)
test_dataloader = val_dataloader

# COCO-style AP on the converted annotations. With cityscapesscripts installed, add
# dict(type='CityScapesMetric', seg_prefix=data_root + 'gtFine/val',
#      outfile_prefix='./work_dirs/cityscapes_metric/instance') for the official AP.
val_evaluator = dict(
    type='CocoMetric',
    ann_file=data_root + 'annotations/instancesonly_filtered_gtFine_val.json',
    metric=['bbox', 'segm'],
    backend_args=backend_args,
)
test_evaluator = val_evaluator

optim_wrapper = dict(
    type='AmpOptimWrapper',
    constructor='LookHereLayerDecayOptimizerConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.1),
    paramwise_cfg=dict(decay_rate=0.7),
)

max_iters = 24000
interval = 2000
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=interval)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=250),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_iters,
        by_epoch=False,
        milestones=[21000, 23000],  # ~88% and ~96% of the schedule, as ViTDet
        gamma=0.1,
    ),
]

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=50),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, save_last=True, interval=interval, max_keep_ckpts=3
    ),
)
log_processor = dict(type='LogProcessor', window_size=50, by_epoch=False)

auto_scale_lr = dict(enable=False, base_batch_size=16)
