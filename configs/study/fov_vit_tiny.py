# The CPU default of `tools/extrapolation_study.py --ladder fov`: the field-of-view regime.
# A tiny LookHereViT (6 blocks, 96 channels, 12 heads, 8 px patches) + a linear (1x1 conv)
# decoder, trained for 600 iterations of 12 random 64x64 crops of 2000 128x128 scenes of
# the landmark task (research/datasets/fov_scenes.py: sky / road split by a horizon
# line, objects classed by the side of a tower they stand on), then tested on other scenes
# (24 per size) whose frames are 1x, 2x, 3x and 4x the crop side at the SAME pixel scale
# (64..256 px: more of the world, landmarks farther away), each predicted whole (one
# pass), with mmseg's sliding windows of the 64 px training crop (stride 43), and -- the
# log-n aid -- whole with log_n_scaling.
# The study tool sets model.backbone.pos_encoding per run; everything else stays identical.
# Budget: see docs/extrapolation_study.md (field of view).
_base_ = ['./relational_vit_tiny.py']

relational = None  # this study writes the fov_scenes dataset instead
fov_scenes = dict(
    num_train=2000, num_val=24, crop=(64, 64), train_scale=2.0, scales=(1.0, 2.0, 3.0, 4.0), seed=0
)
extrapolation = dict(
    ladder='fov',  # whole frames vs sliding windows of the training crop
    scales=(1.0, 2.0, 3.0, 4.0),
    train_size=(64, 64),
    val_prefix='val_x{scale:g}',
    metric='mIoU',
    slide_stride=None,  # None: 2/3 of the crop (43 px), mmseg's Cityscapes ratio
    aids=('log_n',),  # test-time: every run is also evaluated with log_n_scaling
    mixed_crop_scales=(1.0, 1.5, 2.0),  # the mixed_crops aid (--aids log_n mixed_crops)
    native_aspect=False,  # a zoom-ladder row; frames here are crops of a wider world
    encodings=(
        'lookhere:lh180',
        'lookhere:lh90',
        'lookhere:lh45',
        'rope2d',
        'rope2d_mixed',
        'rope_dinov3',
        'pape',
        'abs',
        'alibi2d',
        'none',
    ),
)
# (PaPE's parabola count, the robustness settings and the slopes' weight decay come from
# relational_vit_tiny.py)

data_root = 'data/fov_scenes'
classes = ('sky', 'road', 'tower', 'left-of-tower', 'right-of-tower')
palette = [[110, 170, 235], [120, 95, 70], [255, 255, 255], [230, 25, 75], [60, 180, 75]]
metainfo = dict(classes=classes, palette=palette)

model = dict(decode_head=dict(num_classes=len(classes)))

train_pipeline = [  # no flips: a mirrored scene would swap left and right of the tower
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='RandomCrop', crop_size=(64, 64)),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=12, dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=train_pipeline)
)
val_dataloader = dict(dataset=dict(data_root=data_root, metainfo=metainfo, pipeline=test_pipeline))
test_dataloader = val_dataloader

# 600 iterations as the zoom study, of 12 crops (not 16) and 24 scenes per size keep a run
# near 1.5 min of CPU: the ladder predicts every frame three times, and a whole 256 px
# frame costs ~30x a crop. At 400 iterations of 16 no encoding had learned the side of the
# tower yet (left/right IoU 35-55 at 1x; docs/extrapolation_study.md, field of view).
max_iters = 600
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-2, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', eta_min=1e-5, by_epoch=False, begin=50, end=max_iters),
]
train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters + 1)
