# Segmenter, mask-transformer decoder, LookHere ViT-B/16, ADE20K 512x512, 160k iterations:
# mmseg's Segmenter recipe (SGD lr 1e-3, momentum 0.9, no weight decay, PolyLR, batch
# 8 = 8 GPUs x 1, slide test at crop 512 / stride 480).
#
#   python tools/train.py configs/segmenter_lookhere_ade20k.py      (data in data/ade/...)
#
# Weights (mmseg's `model.pretrained` convention; it becomes the backbone's
# init_cfg=dict(type='Pretrained', checkpoint=...)): the official LookHere ImageNet
# checkpoint below is loaded when the file is there, and its stored LookHere config
# decides the preset. Without the file tools/train.py stops with an error naming it
# (--allow-random-init: warn and train from scratch).
#   another file:          --cfg-options model.pretrained=checkpoints/LH_90_weights_and_config.pth
#   scratch, other preset: --cfg-options model.pretrained=None model.backbone.preset=lh90
_base_ = [
    './_base_/models/segmenter_lookhere_vit-b16_mask.py',
    './_base_/datasets/ade20k_checked.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
]
crop_size = (512, 512)
lh_checkpoint = 'checkpoints/LH_180_weights_and_config.pth'
data_preprocessor = dict(size=crop_size)
model = dict(data_preprocessor=data_preprocessor, pretrained=lh_checkpoint)
optimizer = dict(lr=0.001, weight_decay=0.0)
optim_wrapper = dict(type='OptimWrapper', optimizer=optimizer)
train_dataloader = dict(batch_size=1)  # per GPU; 8 GPUs
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader
