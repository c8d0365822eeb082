"""The shipped Mask R-CNN configs: full-size models build, and the ViTDet recipe is there.

(Training and testing through the Runner, at toy size, is in ``test_det_mask_rcnn.py``.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope

from lookhere_dense.models import LookHereViT, SimpleFPN

#: the full-size ViTDet configs (the toy ``*_tiny-*`` smoke-run one: test_det_tiny_config.py)
CONFIGS = sorted(
    p
    for p in (Path(__file__).resolve().parents[1] / 'configs').glob('mask_rcnn_*.py')
    if '_tiny-' not in p.name
)


def test_there_are_coco_and_cityscapes_configs():
    names = [c.name for c in CONFIGS]
    assert any(n.endswith('_coco.py') for n in names)
    assert any(n.endswith('_cityscapes.py') for n in names)


@pytest.mark.parametrize('path', CONFIGS, ids=[c.stem for c in CONFIGS])
def test_config_builds_full_size_vitdet_model(path):
    cfg = Config.fromfile(str(path))
    assert cfg.default_scope == 'mmdet'
    assert 'lookhere_dense.openmmlab' in cfg.custom_imports.imports
    with DefaultScope.overwrite_default_scope('mmdet'):
        model = MODELS.build(cfg.model)  # no init_weights: the checkpoint is not here
    assert type(model).__name__ == 'MaskRCNN'
    backbone, neck = model.backbone, model.neck
    assert isinstance(backbone, LookHereViT) and isinstance(neck, SimpleFPN)
    assert (backbone.embed_dims, backbone.num_layers, backbone.num_heads) == (768, 12, 12)
    assert [i for i, b in enumerate(backbone.blocks) if not b.window_size] == [2, 5, 8, 11]
    assert {b.window_size for b in backbone.blocks} == {0, 14}
    assert cfg.model.backbone.init_cfg.type == 'Pretrained'
    assert (neck.num_outs, neck.scale_factors) == (5, (4.0, 2.0, 1.0, 0.5))
    assert model.rpn_head.num_convs == 2
    assert type(model.roi_head.bbox_head).__name__ == 'Shared4Conv1FCBBoxHead'
    norms = {type(m).__name__ for m in model.roi_head.modules() if 'Norm' in type(m).__name__}
    assert norms == {'LayerNorm2d'}
    # ViTDet recipe: LSJ at 1024, AdamW + layer decay 0.7, AMP
    pipeline = cfg.train_dataloader.dataset.pipeline
    resize = [s for s in pipeline if s.type == 'RandomResize'][0]
    crop = [s for s in pipeline if s.type == 'RandomCrop'][0]
    assert resize.ratio_range == (0.1, 2.0) and tuple(crop.crop_size) == (1024, 1024)
    pad = cfg.model.data_preprocessor.batch_augments[0]
    assert pad.type == 'BatchFixedSizePad' and tuple(pad.size) == (1024, 1024)
    ow = cfg.optim_wrapper
    assert ow.type == 'AmpOptimWrapper'
    assert ow.constructor == 'LookHereLayerDecayOptimizerConstructor'
    assert ow.optimizer.type == 'AdamW' and ow.paramwise_cfg.decay_rate == 0.7
    # the optimizer builds from the config (OptimWrapper: AMP needs a GPU)
    ow = dict(ow, type='OptimWrapper')
    with DefaultScope.overwrite_default_scope('mmdet'):
        wrapper = build_optim_wrapper(model, ow)
    n_params = sum(p.numel() for g in wrapper.optimizer.param_groups for p in g['params'])
    assert n_params == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert len({g['layer_id'] for g in wrapper.optimizer.param_groups}) == 14


def test_cityscapes_config_has_eight_classes_and_full_frame_testing():
    path = [c for c in CONFIGS if c.name.endswith('_cityscapes.py')][0]
    cfg = Config.fromfile(str(path))
    assert cfg.model.roi_head.bbox_head.num_classes == 8
    assert cfg.model.roi_head.mask_head.num_classes == 8
    resize = [s for s in cfg.test_dataloader.dataset.pipeline if s.type == 'Resize'][0]
    assert tuple(resize.scale) == (2048, 1024)
    assert cfg.test_dataloader.dataset.type == 'CityscapesDataset'
