# UPerNet + SimpleFPN + LookHere ViT-B/16 (window + global attention) on ADE20K, 512x512
# crops, 160k iterations at batch 16 (8 GPUs x 2), AdamW with layer-wise lr decay 0.65 and
# AMP (the MAE/BEiT UPerNet recipe). Whole-image inference: LookHere needs no sliding window.
# On CPU use optim_wrapper.type=OptimWrapper (AmpOptimWrapper needs a GPU).
_base_ = [
    './_base_/upernet_lookhere_vit-b_sfpn.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
crop_size = (512, 512)
model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(num_classes=150),
    auxiliary_head=dict(num_classes=150),
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
    dict(type='PolyLR', eta_min=0.0, power=1.0, begin=1500, end=160000, by_epoch=False),
]

train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
