# What-where distillation of a LookWhere student (lookhere_dense/lookwhere) from a frozen
# LookHere ViT-T teacher on the images of the tiny ADE20K-layout set (no labels are read:
# the pipeline never loads annotations). The selector learns the teacher's CLS attention
# map (KL), the extractor the teacher's patch and CLS features (MSE of the dense map).
#
#   python tools/lookwhere_study.py distill configs/lookwhere_distill_vit-t_tiny-ade.py \
#       --cfg-options model.teacher.checkpoint=work_dirs/demo/ade20k/iter_300.pth \
#                     model.teacher.prefix=backbone.
#
# (the teacher: the backbone of a trained Segmenter, e.g. the demo's ViT-T; without a
# checkpoint the teacher is randomly initialised, which only exercises the machinery).
# Then fine-tune for segmentation with the selector frozen (the paper's recipe):
#   python tools/train.py configs/segmenter_lookwhere_vit-t_tiny-ade.py --cfg-options \
#       model.backbone.init_cfg.type=Pretrained \
#       model.backbone.init_cfg.checkpoint=work_dirs/lookwhere_distill/iter_200.pth \
#       model.backbone.init_cfg.prefix=student. model.backbone.freeze_selector=True
custom_imports = dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)
default_scope = 'mmseg'
crop_size = (128, 128)
max_iters = 200
trunk = dict(img_size=crop_size, patch_size=16, embed_dims=192, num_layers=12, num_heads=12)
model = dict(
    type='LookWhereDistiller',
    data_preprocessor=dict(
        type='SegDataPreProcessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_val=0,
        seg_pad_val=255,
        size=crop_size,
    ),
    teacher=dict(trunk, checkpoint=None, prefix=None),
    student=dict(
        selector=dict(input_size=(64, 64), embed_dims=192, num_layers=3, num_heads=12),
        extractor=dict(trunk, out_indices=-1),
        k_ratio=0.25,
        fill='nearest',
    ),
    init_extractor_from_teacher=True,
    select_by='teacher',
)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomResize', scale=(512, 128), ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        type='ADE20KDataset',
        data_root='data/ade/ADEChallengeData2016',
        data_prefix=dict(img_path='images/training', seg_map_path='annotations/training'),
        pipeline=train_pipeline,
    ),
)
optim_wrapper = dict(
    type='OptimWrapper',
    clip_grad=dict(max_norm=1.0),
    optimizer=dict(type='AdamW', lr=5e-4, betas=(0.9, 0.999), weight_decay=0.01),
)
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=20)]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters)
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, interval=max_iters, max_keep_ckpts=1, save_last=True
    ),
)
env_cfg = dict(cudnn_benchmark=False, dist_cfg=dict(backend='gloo'))
log_processor = dict(by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0)
work_dir = 'work_dirs/lookwhere_distill'
# the student's extractor keeps its own CLS token, which no loss reaches while it starts
# from the selector's prefix tokens: DDP must be told
model_wrapper_cfg = dict(type='MMDistributedDataParallel', find_unused_parameters=True)
