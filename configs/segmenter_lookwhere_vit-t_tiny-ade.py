# LookWhere on the tiny ADE20K-layout task: segmenter_lookhere_vit-t_tiny-ade.py with the
# backbone replaced by LookWhereViT (lookhere_dense/lookwhere): a 3-block selector sees a
# 64x64 copy of each crop and picks k_ratio of the 16x16 patches; the LookHere ViT-T
# extractor (12 blocks, 192 dims, 12 heads) runs on those patches only, the bias of every
# kept pair built from their grid coordinates; every other patch takes the features of the
# nearest kept one, so the Segmenter mask head is unchanged.
#
#   python tools/train.py configs/segmenter_lookwhere_vit-t_tiny-ade.py
#
# Trained this way the selector's head gets no gradient (top-k is no differentiable
# function of its scores) and keeps its random initialisation: it picks arbitrary patches.
# Its blocks and CLS token train through the prefix tokens it gives the extractor. For a
# selection that means something, distil first (below); model_wrapper_cfg lets DDP run
# with the parameters no loss reaches (the head; the extractor's own CLS token).
#
# Fine-tuning a distilled student (selector frozen, as in the paper; the distillation:
# configs/lookwhere_distill_vit-t_tiny-ade.py):
#   --cfg-options model.backbone.init_cfg.type=Pretrained \
#       model.backbone.init_cfg.checkpoint=work_dirs/lookwhere_distill/iter_N.pth \
#       model.backbone.init_cfg.prefix=student. model.backbone.freeze_selector=True
# Change k per test: --cfg-options model.backbone.k_ratio=0.1 (or model.backbone.k=16
# model.backbone.k_ratio=None: one of the two).
_base_ = ['./segmenter_lookhere_vit-t_tiny-ade.py']
crop_size = (128, 128)
model = dict(
    backbone=dict(
        _delete_=True,
        type='LookWhereViT',
        selector=dict(
            input_size=(64, 64), embed_dims=192, num_layers=3, num_heads=12, patch_size=16
        ),
        extractor=dict(
            img_size=crop_size,
            patch_size=16,
            embed_dims=192,
            num_layers=12,
            num_heads=12,
            out_indices=-1,
            drop_path_rate=0.0,
        ),
        k_ratio=0.25,
        fill='nearest',
        freeze_selector=False,
        init_cfg=None,
    ),
)
model_wrapper_cfg = dict(type='MMDistributedDataParallel', find_unused_parameters=True)
