# UPerNet + SimpleFPN + LookHere ViT-B/16 (window + global attention) on Cityscapes:
# 512x1024 crops, 80k iterations at batch 8 (8 GPUs x 1), AdamW with layer-wise lr decay
# 0.65 and AMP. Inference on the whole 2048x1024 frame (a 64x128 patch grid, 4x the
# training tokens): LookHere extrapolates, so no sliding window is needed.
# On CPU use optim_wrapper.type=OptimWrapper (AmpOptimWrapper needs a GPU).
_base_ = [
    './_base_/upernet_lookhere_vit-b_sfpn.py',
    'mmseg::_base_/datasets/cityscapes.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
]
crop_size = (512, 1024)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(img_size=crop_size),
    decode_head=dict(num_classes=19),
    auxiliary_head=dict(num_classes=19),
)

optim_wrapper = dict(
    _delete_=True,
    type='AmpOptimWrapper',
    constructor='LookHereLayerDecayOptimizerConstructor',
    optimizer=dict(type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.05),
    paramwise_cfg=dict(decay_rate=0.65),
)
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=80000, by_epoch=False),
]

train_dataloader = dict(batch_size=1)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
