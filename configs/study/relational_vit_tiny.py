# The CPU default of tools/extrapolation_study.py: a tiny LookHereViT (6 blocks, 96 channels,
# 12 heads, 8 px patches) + a linear (1x1 conv) decoder, trained for 600 iterations of 16
# images on the relational task (research/datasets/relational.py) at 64x64 px and
# evaluated on 100 validation scenes rendered natively at 0.5x..4x (32..256 px: below and
# above the training size), plus the native-aspect rows: 100 other scenes at aspect ratios
# 1:2, 3:4, 4:3 and 2:1 whose longer side is 0.5x..4x the training side.
# The study tool sets model.backbone.pos_encoding per run; everything else stays identical.
# Budget: see docs/extrapolation_study.md (How to run it).
custom_imports = dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)
default_scope = 'mmseg'

# --- the study: dataset generator settings and the test ladder -------------------------
relational = dict(
    num_train=4000,
    num_val=100,
    train_size=(64, 64),
    scales=(0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0),
    seed=0,
    aspect_ratios=(0.5, 0.75, 4 / 3, 2.0),  # width / height, native-aspect rows
    size_multiple=8,
)  # whole patches: no test image is padded
extrapolation = dict(
    ladder='rendered',  # each scale has its own natively rendered val folder
    scales=(0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0),
    train_size=(64, 64),
    val_prefix='val_x{scale:g}',
    native_aspect=True,  # + rows at the scenes' own aspect (val_aspect_x{scale} folders)
    metric='mIoU',
    # PaPE's reference has 50 parabolas per head for ViT-B (head width 64): +13 % parameters,
    # q/k 2.6x wider. 6 parabolas keep that for this trunk (head width 8: +12 %, 8 -> 24
    # channels); 50 would double the trunk (+100 %, 8 -> 112 channels).
    encoding_options=dict(pape=dict(parabolas=6)),
    # --robustness: FGSM and 5-step PGD at 1, 2, 4, 8 /255 on the 1x validation scenes
    robustness=dict(attacks=('fgsm', 'pgd'), eps=(1, 2, 4, 8), steps=5),
)

data_root = 'data/relational'
classes = ('background', 'anchor', 'up-left', 'up-right', 'down-left', 'down-right')
palette = [[0, 0, 0], [255, 255, 255], [230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48]]
metainfo = dict(classes=classes, palette=palette)

# --- model ------------------------------------------------------------------------------
embed_dims = 96
data_preprocessor = dict(
    type='SegDataPreProcessor',
    mean=[127.5, 127.5, 127.5],
    std=[127.5, 127.5, 127.5],
    bgr_to_rgb=True,
    pad_val=0,
    seg_pad_val=255,
    size=(64, 64),
    # the scenes are whole 8-px patches (size_multiple); frames that are not get padded
    # here and cropped back, not padded in the backbone and stretched by the head
    test_cfg=dict(size_divisor=8),
)
model = dict(
    type='EncoderDecoder',
    data_preprocessor=data_preprocessor,
    backbone=dict(
        type='LookHereViT',
        img_size=(64, 64),
        patch_size=8,
        embed_dims=embed_dims,
        num_layers=6,
        num_heads=12,
        mlp_ratio=4,
        init_values=None,
        drop_path_rate=0.0,
        with_cls_token=True,
        final_norm=True,
        out_indices=-1,
        pos_encoding='lookhere',
        preset='lh180',
    ),
    decode_head=dict(  # a per-patch linear classifier: no spatial context in the head
        type='FCNHead',
        in_channels=embed_dims,
        channels=embed_dims,
        num_convs=0,
        concat_input=False,
        in_index=-1,
        dropout_ratio=0.0,
        num_classes=len(classes),
        norm_cfg=None,
        align_corners=False,
        loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0),
    ),
    train_cfg=dict(),
    test_cfg=dict(mode='whole'),
)

# --- data -------------------------------------------------------------------------------
train_pipeline = [  # no flips or crops: they would change the relations
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
dataset = dict(
    type='BaseSegDataset',
    data_root=data_root,
    metainfo=metainfo,
    img_suffix='.png',
    seg_map_suffix='.png',
    reduce_zero_label=False,
)
train_dataloader = dict(
    batch_size=16,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        **dataset,
        data_prefix=dict(img_path='img_dir/train', seg_map_path='ann_dir/train'),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        **dataset,
        data_prefix=dict(img_path='img_dir/val_x1', seg_map_path='ann_dir/val_x1'),
        pipeline=test_pipeline,
    ),
)
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

# --- schedule -----------------------------------------------------------------------------
max_iters = 600
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=1e-3, betas=(0.9, 0.999), weight_decay=0.05),
    clip_grad=dict(max_norm=1.0),
    paramwise_cfg=dict(
        custom_keys={
            'pos_embed': dict(decay_mult=0.0),
            'freqs': dict(decay_mult=0.0),
            'cls_token': dict(decay_mult=0.0),
            'norm': dict(decay_mult=0.0),
            'slopes': dict(decay_mult=0.0),
        }
    ),
)  # learnable LookHere slopes (+learnable_slopes)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-2, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=50, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters + 1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

# --- runtime ------------------------------------------------------------------------------
default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50, log_metric_by_epoch=False),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=-1, save_last=True),
    sampler_seed=dict(type='DistSamplerSeedHook'),
)
env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    dist_cfg=dict(backend='nccl'),
)
vis_backends = [dict(type='LocalVisBackend')]
visualizer = dict(type='SegLocalVisualizer', vis_backends=vis_backends)
log_processor = dict(by_epoch=False)
log_level = 'INFO'
load_from = None
resume = False
randomness = dict(seed=0)
