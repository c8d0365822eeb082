# Segmenter, mask decoder, LookHere ViT-B/16, Cityscapes, 768x768 crops (the LookHere
# paper's Cityscapes setting), 80k iterations, Segmenter recipe (SGD lr 1e-2, PolyLR,
# batch 8 = 8 GPUs x 1). Test: slide at the training crop (768, stride 512) over the
# 1024x2048 frame. segmenter_lookhere_cityscapes_whole.py tests the whole frame at once
# (grid 64x128 from a 48x48 training grid). Weights: as segmenter_lookhere_ade20k.py.
_base_ = [
    './_base_/models/segmenter_lookhere_vit-b16_mask.py',
    './_base_/datasets/cityscapes_768x768_checked.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py',
]
crop_size = (768, 768)
lh_checkpoint = 'checkpoints/LH_180_weights_and_config.pth'
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=lh_checkpoint,
    backbone=dict(img_size=crop_size),
    decode_head=dict(num_classes=19),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(512, 512)),
)
optimizer = dict(lr=0.01, weight_decay=0.0)
optim_wrapper = dict(type='OptimWrapper', optimizer=optimizer)
train_dataloader = dict(batch_size=1)  # per GPU; 8 GPUs
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
