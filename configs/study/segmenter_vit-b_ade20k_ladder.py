# Full-scale path of tools/extrapolation_study.py (GPU): mmseg's Segmenter ViT-B/16 mask
# transformer on ADE20K at 512x512, with LookHereViT as the backbone. The study tool swaps
# model.backbone.pos_encoding per run and tests every run on the ADE20K val set resized to
# 0.5x..4x (every Resize of the test pipeline multiplied; whole-image inference).
#
#   python tools/extrapolation_study.py --config configs/study/segmenter_vit-b_ade20k_ladder.py \
#       --encodings lookhere abs rope2d rope2d_mixed rope_dinov3 pape alibi2d --seeds 0 \
#       --iters 160000 --robustness \
#       --cfg-options train_dataloader.batch_size=8 --out-dir docs --name study_ade20k
#
# Weights: by default every encoding trains from the same random trunk (a controlled but
# expensive comparison). To fine-tune from ImageNet weights instead, give each run its own
# file (official LookHere weights load only into pos_encoding='lookhere'; DeiT-III / timm
# weights with pos_embed into 'abs'), e.g. one study call per encoding with
#   --cfg-options model.backbone.init_cfg.type=Pretrained model.backbone.init_cfg.checkpoint=PATH
# ViT-B has 12 heads, so every encoding (alibi2d needs a multiple of 4 heads) fits.
_base_ = ['mmseg::segmenter/segmenter_vit-b_mask_8xb1-160k_ade20k-512x512.py']
custom_imports = dict(imports=['lookhere_dense.openmmlab'], allow_failed_imports=False)

# 0.5x..4x of the test scale (256..2048 px short side) and the native-aspect rows: every val
# image at its own aspect with the longer side 256..2048 px (as ImageNet-Val at 384 px)
# (--robustness: FGSM / 5-step PGD at 1, 2, 4, 8 /255 on the first 200 val images)
extrapolation = dict(
    ladder='resize',
    scales=(0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0),
    train_size=(512, 512),
    native_aspect=True,
    metric='mIoU',
    robustness=dict(max_images=200),
)
# lookhere-dense's lean drop-ins for mmseg's EncoderDecoder / SegmenterMaskTransformerHead
# (same weights and outputs; the head's attention through the fused SDPA kernel, so the
# whole-image tests at 2x-4x do not materialise a (heads, N, N) attention).
model = dict(
    type='LeanEncoderDecoder',
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='LookHereViT',
        img_size=(512, 512),
        patch_size=16,
        embed_dims=768,
        num_layers=12,
        num_heads=12,
        mlp_ratio=4,
        drop_path_rate=0.1,
        with_cls_token=True,
        final_norm=True,
        norm_cfg=dict(type='LN', eps=1e-6),
        init_values=1e-4,
        pos_encoding='lookhere',
        preset='lh180',
    ),
    decode_head=dict(type='LeanSegmenterMaskTransformerHead'),
    # whole frames padded to a patch multiple (the padding is cropped off the prediction)
    data_preprocessor=dict(test_cfg=dict(size_divisor=16)),
    test_cfg=dict(_delete_=True, mode='whole'),
)
