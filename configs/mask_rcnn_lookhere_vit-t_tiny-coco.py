# The smoke-run detector for a CPU: mask_rcnn_lookhere-b16_sfpn_lsj-1024-100e_coco.py
# (Mask R-CNN + SimpleFPN + a LookHere ViT with window and global blocks, layer-wise lr
# decay) at toy width and depth, LSJ at 128 px, trained from scratch for 40 iterations on
# the generated COCO-layout data of research.datasets.synthetic_coco (3 shape classes):
#
#   python -c "from research.datasets.synthetic_coco import make_coco_instances; \
#       make_coco_instances('data/coco_tiny', {'train2017': 8, 'val2017': 4})"
#   python tools/train.py configs/mask_rcnn_lookhere_vit-t_tiny-coco.py
#   python tools/test.py configs/mask_rcnn_lookhere_vit-t_tiny-coco.py \
#       work_dirs/mask_rcnn_lookhere_vit-t_tiny-coco/iter_40.pth
#
# Everything but the sizes is the real config (pipelines, heads, optimizer constructor,
# COCO metric). Another folder: --cfg-options for the two dataloaders' data_root and the
# evaluators' ann_file (joined with data_root when the config is read).
_base_ = ['./mask_rcnn_lookhere-b16_sfpn_lsj-1024-100e_coco.py']

image_size = (128, 128)
classes = ('box', 'disc', 'triangle')
data_root = 'data/coco_tiny/'
dims, layers, heads, channels = 96, 4, 6, 64

model = dict(
    data_preprocessor=dict(
        batch_augments=[dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)]
    ),
    backbone=dict(
        img_size=image_size[0],
        embed_dims=dims,
        num_layers=layers,
        num_heads=heads,
        drop_path_rate=0.0,
        out_indices=(layers - 1,),
        window_size=4,  # 128 px -> an 8x8 grid: four 4x4 windows
        window_block_indexes=[0, 2],  # blocks 1 and 3 are global
        init_cfg=None,  # from scratch
    ),
    neck=dict(in_channels=dims, out_channels=channels),
    rpn_head=dict(in_channels=channels, feat_channels=channels),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=channels),
        mask_roi_extractor=dict(out_channels=channels),
        bbox_head=dict(
            in_channels=channels,
            conv_out_channels=channels,
            fc_out_channels=128,
            num_classes=len(classes),
        ),
        mask_head=dict(in_channels=channels, conv_out_channels=channels, num_classes=len(classes)),
    ),
    train_cfg=dict(rpn=dict(sampler=dict(num=64)), rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=200, max_per_img=100), rcnn=dict(max_per_img=10)),
)

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='RandomResize', scale=image_size, ratio_range=(0.5, 2.0), keep_ratio=True),
    dict(
        type='RandomCrop',
        crop_type='absolute_range',
        crop_size=image_size,
        recompute_bbox=True,
        allow_negative_crop=True,
    ),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-2, 1e-2)),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'),
    ),
]
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=dict(classes=classes),
        filter_cfg=dict(filter_empty_gt=True, min_size=8),
        pipeline=train_pipeline,
    ),
)
val_dataloader = dict(
    num_workers=0,
    persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=dict(classes=classes), pipeline=test_pipeline),
)
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(lr=1e-3, weight_decay=0.01),
    paramwise_cfg=dict(num_layers=layers),
)
max_iters = 40
train_cfg = dict(
    _delete_=True, type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters
)
param_scheduler = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=10)]
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=max_iters, max_keep_ckpts=1),
)
randomness = dict(seed=0)
