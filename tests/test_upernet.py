"""The shipped UPerNet + SimpleFPN + LookHereViT configs (ADE20K, Cityscapes).

Each config builds its full-size segmentor; shrunk through config options (same structure,
toy widths, BN for SyncBN) it takes a training step through the real data preprocessor and
the config's layer-decay optimizer, and predicts whole images larger than the crop.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import DefaultScope
from mmengine.structures import PixelData
from mmseg.registry import MODELS
from mmseg.structures import SegDataSample

from lookhere_dense.models import LookHereViT, SimpleFPN

CONFIGS = sorted((Path(__file__).resolve().parents[1] / 'configs').glob('upernet_*.py'))
IDS = [c.stem for c in CONFIGS]


def build(model_cfg):
    with DefaultScope.overwrite_default_scope('mmseg'):
        return MODELS.build(model_cfg)


def test_there_are_ade20k_and_cityscapes_configs():
    assert any('ade20k' in c.name for c in CONFIGS)
    assert any('cityscapes' in c.name for c in CONFIGS)


@pytest.mark.parametrize('path', CONFIGS, ids=IDS)
def test_config_builds_full_size_segmentor(path):
    cfg = Config.fromfile(str(path))
    assert cfg.default_scope == 'mmseg'
    model = build(cfg.model)
    assert type(model).__name__ == 'EncoderDecoder'
    assert isinstance(model.backbone, LookHereViT) and isinstance(model.neck, SimpleFPN)
    assert (model.backbone.embed_dims, model.backbone.num_layers) == (768, 12)
    assert [i for i, b in enumerate(model.backbone.blocks) if not b.window_size] == [2, 5, 8, 11]
    assert model.neck.num_outs == 4
    assert type(model.decode_head).__name__ == 'UPerHead'
    assert model.decode_head.in_channels == [256] * 4
    num_classes = 150 if 'ade20k' in path.name else 19
    assert model.decode_head.num_classes == model.auxiliary_head.num_classes == num_classes
    assert cfg.model.test_cfg.mode == 'whole'
    ow = cfg.optim_wrapper
    assert ow.type == 'AmpOptimWrapper'
    assert ow.constructor == 'LookHereLayerDecayOptimizerConstructor'


def shrunk(path: Path, crop=(64, 64)) -> Config:
    cfg = Config.fromfile(str(path))
    bn = dict(type='BN', requires_grad=True)
    cfg.merge_from_dict(
        {
            'model.backbone.embed_dims': 48,
            'model.backbone.num_layers': 3,
            'model.backbone.num_heads': 6,
            'model.backbone.window_size': 3,
            'model.backbone.window_block_indexes': [0, 1],
            'model.backbone.init_cfg': None,
            'model.backbone.out_indices': (2,),
            'model.backbone.drop_path_rate': 0.0,
            'model.neck.in_channels': 48,
            'model.neck.out_channels': 16,
            'model.decode_head.in_channels': [16] * 4,
            'model.decode_head.channels': 16,
            'model.decode_head.norm_cfg': bn,
            'model.auxiliary_head.in_channels': 16,
            'model.auxiliary_head.channels': 8,
            'model.auxiliary_head.norm_cfg': bn,
            'model.data_preprocessor.size': crop,
            'optim_wrapper.type': 'OptimWrapper',
            'optim_wrapper.paramwise_cfg.num_layers': 3,
        }
    )
    return cfg


def sample(h, w, num_classes, seed):
    g = torch.Generator().manual_seed(seed)
    img = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
    seg = torch.randint(0, num_classes, (1, h, w), generator=g)
    ds = SegDataSample(gt_sem_seg=PixelData(data=seg))
    ds.set_metainfo(dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(h, w)))
    return img, ds


@pytest.fixture(scope='module', params=CONFIGS, ids=IDS)
def trained(request):
    path = request.param
    cfg = shrunk(path)
    torch.manual_seed(0)
    model = build(cfg.model)
    model.init_weights()
    with DefaultScope.overwrite_default_scope('mmseg'):
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    num_classes = cfg.model.decode_head.num_classes
    batch = [sample(64, 64, num_classes, 0), sample(56, 48, num_classes, 1)]  # 2nd is padded
    data = dict(inputs=[b[0] for b in batch], data_samples=[b[1] for b in batch])
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    logs = [model.train_step(data, wrapper)]
    return model, logs, before, num_classes


def test_training_step_computes_losses_and_updates_every_part(trained):
    model, logs, before, _ = trained
    for log in logs:
        for key in ('loss', 'decode.loss_ce', 'aux.loss_ce'):
            assert math.isfinite(float(log[key].detach())), key
    for part in (
        'backbone.patch_embed.',
        'backbone.blocks.0.',
        'backbone.blocks.2.',
        'neck.',
        'decode_head.',
        'auxiliary_head.',
    ):
        assert any(
            not torch.equal(p, before[n])
            for n, p in model.named_parameters()
            if n.startswith(part)
        ), f'{part} did not train'


def test_whole_image_prediction_beyond_the_crop_size(trained):
    model, _, _, num_classes = trained
    model.eval()
    img, ds = sample(96, 144, num_classes, 2)  # 6 x 9 patches, 3x3 windows; crop was 4x4
    with torch.no_grad():
        out = model.test_step(dict(inputs=[img], data_samples=[ds]))
    pred = out[0].pred_sem_seg.data
    assert pred.shape == (1, 96, 144)
    assert 0 <= int(pred.min()) and int(pred.max()) < num_classes
    assert out[0].seg_logits.data.shape == (num_classes, 96, 144)
