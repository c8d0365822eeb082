"""Mask R-CNN + SimpleFPN + LookHereViT through the real mmengine Runner.

* the COCO config, shrunk, trains a few iterations on a generated COCO-format dataset
  (mmdet's CocoDataset, LSJ pipeline, layer-decay AdamW) and ``runner.test()`` reports COCO
  bbox / segm metrics through mmdet's CocoMetric;
* the Cityscapes config, shrunk, runs inference on a 2048x1024 frame on CPU: windowed
  blocks use the cached window bias only (no full-grid dense bias), and the global blocks
  at that size fall back to the memory-lean ``chunked`` backend by themselves.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from lookhere_dense.lookhere.fused import fused_available
from research.datasets.synthetic_coco import (
    CITYSCAPES_THING_CLASSES,
    SHAPE_CLASSES,
    make_cityscapes_instances,
    make_coco_instances,
)

REPO = Path(__file__).resolve().parents[1]
COCO_CFG = REPO / 'configs' / 'mask_rcnn_lookhere-b16_sfpn_lsj-1024-100e_coco.py'
CITY_CFG = REPO / 'configs' / 'mask_rcnn_lookhere-b16_sfpn_lsj-1024-24k_cityscapes.py'
LAYERS, HEADS, DIMS, CH = 3, 6, 48, 32
WINDOWED = [0, 1]  # block 2 is global


def pipeline_step(pipeline, type_: str) -> dict:
    steps = [s for s in pipeline if s['type'] == type_]
    assert len(steps) == 1, f'{type_} not once in the pipeline'
    return steps[0]


def shrink(cfg: Config, work_dir: Path, num_classes: int, window_size: int) -> Config:
    """The config's model at toy width/depth (same structure), CPU optimizer wrapper."""
    m = cfg.model
    m.backbone.update(
        embed_dims=DIMS,
        num_layers=LAYERS,
        num_heads=HEADS,
        init_cfg=None,
        out_indices=(LAYERS - 1,),
        window_size=window_size,
        window_block_indexes=WINDOWED,
        drop_path_rate=0.0,
    )
    m.neck.update(in_channels=DIMS, out_channels=CH)
    m.rpn_head.update(in_channels=CH, feat_channels=CH)
    m.roi_head.bbox_roi_extractor.out_channels = CH
    m.roi_head.mask_roi_extractor.out_channels = CH
    m.roi_head.bbox_head.update(
        in_channels=CH, conv_out_channels=CH, fc_out_channels=64, num_classes=num_classes
    )
    m.roi_head.mask_head.update(in_channels=CH, conv_out_channels=CH, num_classes=num_classes)
    m.train_cfg.rpn.sampler.num = 64
    m.train_cfg.rcnn.sampler.num = 64
    m.test_cfg.rpn.update(nms_pre=200, max_per_img=100)
    m.test_cfg.rcnn.max_per_img = 10
    cfg.optim_wrapper.type = 'OptimWrapper'  # AmpOptimWrapper needs a GPU
    cfg.optim_wrapper.paramwise_cfg.num_layers = LAYERS
    cfg.work_dir = str(work_dir)
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger.interval = 1
    cfg.log_level = 'WARNING'
    cfg.randomness = dict(seed=0)
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].update(num_workers=0, persistent_workers=False)
    return cfg


def point_data(cfg: Config, root: Path, classes, train_ann=None, test_ann=None) -> None:
    if train_ann is not None:
        cfg.train_dataloader.dataset.update(
            data_root=str(root), ann_file=str(train_ann), metainfo=dict(classes=classes)
        )
    cfg.test_dataloader.dataset.update(
        data_root=str(root), ann_file=str(test_ann), metainfo=dict(classes=classes)
    )
    cfg.val_dataloader = cfg.test_dataloader
    cfg.test_evaluator.ann_file = str(test_ann)
    cfg.val_evaluator = cfg.test_evaluator


# ----------------------------------------------------------------------------------------
# COCO: train a few iterations, then test with COCO metrics
# ----------------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def coco_run(tmp_path_factory):
    root = tmp_path_factory.mktemp('coco')
    anns = make_coco_instances(
        root, splits={'train2017': 4, 'val2017': 3}, image_size=(160, 128), seed=0
    )
    cfg = shrink(
        Config.fromfile(str(COCO_CFG)), root / 'work_dir', len(SHAPE_CLASSES), window_size=3
    )
    size = (128, 128)  # LSJ at 128 instead of 1024: a 8x8 patch grid, 3x3 windows padded
    train = cfg.train_dataloader.dataset.pipeline
    pipeline_step(train, 'RandomResize').scale = size
    pipeline_step(train, 'RandomCrop').crop_size = size
    cfg.model.data_preprocessor.batch_augments[0].size = size
    pipeline_step(cfg.test_dataloader.dataset.pipeline, 'Resize').scale = size
    cfg.train_dataloader.batch_size = 2
    point_data(cfg, root, SHAPE_CLASSES, anns['train2017'], anns['val2017'])
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=3, val_interval=1000)
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=3)]
    runner = Runner.from_cfg(cfg)
    model = runner.model
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    runner.train()
    metrics = runner.test()
    return runner, before, metrics


def test_runner_trains_with_loss_and_backward(coco_run):
    runner, before, _ = coco_run
    assert runner.iter == 3
    hub = runner.message_hub
    for key in ('loss', 'loss_rpn_cls', 'loss_rpn_bbox', 'loss_cls', 'loss_bbox', 'loss_mask'):
        value = hub.get_scalar(f'train/{key}').current()
        assert math.isfinite(value), key
    assert hub.get_scalar('train/loss').current() > 0
    moved = {n for n, p in runner.model.named_parameters() if not torch.equal(p, before[n])}
    for part in (
        'backbone.patch_embed.',
        'backbone.cls_token',
        'backbone.blocks.0.attn.',
        'backbone.blocks.2.mlp.',
        'neck.lateral_convs.0.',
        'rpn_head.',
        'roi_head.bbox_head.',
        'roi_head.mask_head.',
    ):
        assert any(n.startswith(part) for n in moved), f'{part} did not train'


def test_runner_uses_layer_decay_groups(coco_run):
    runner, _, _ = coco_run
    groups = runner.optim_wrapper.optimizer.param_groups
    lr = {g['layer_id']: g['lr'] for g in groups}
    assert sorted(lr) == list(range(LAYERS + 2))
    for layer, value in lr.items():  # the scheduler scales every group alike
        assert value / lr[LAYERS + 1] == pytest.approx(0.7 ** (LAYERS + 1 - layer), rel=1e-9)
    no_decay = {n for g in groups if g['weight_decay'] == 0 for n in g['param_names']}
    assert 'backbone.cls_token' in no_decay and 'backbone.blocks.0.ls1.gamma' in no_decay
    assert 'backbone.blocks.0.attn.qkv.weight' not in no_decay


def test_runner_test_reports_coco_bbox_and_segm_metrics(coco_run):
    _, _, metrics = coco_run
    for kind in ('bbox', 'segm'):
        for stat in ('mAP', 'mAP_50', 'mAP_75', 'mAP_s', 'mAP_m', 'mAP_l'):
            value = metrics[f'coco/{kind}_{stat}']
            assert isinstance(value, float) and -1.0 <= value <= 1.0, (kind, stat, value)


def test_window_blocks_ran_padded_and_bias_stayed_window_sized(coco_run):
    runner, _, _ = coco_run
    backbone = runner.model.backbone
    assert [b.window_size for b in backbone.blocks] == [3, 3, 0]
    engine = backbone.pos_enc.engine
    keys = list(engine.dense.keys())
    assert {k[0] for k in keys if k[1] == (3, 3)} == set(WINDOWED)
    assert any(k[0] == 'window_pad' and k[1] == (8, 8) for k in keys)  # 8 = 2*3 + 2
    assert not any(k[0] in WINDOWED and k[1] != (3, 3) for k in keys)


# ----------------------------------------------------------------------------------------
# Cityscapes: inference on a 2048 x 1024 frame on CPU
# ----------------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def cityscapes_highres(tmp_path_factory):
    root = tmp_path_factory.mktemp('cityscapes')
    anns = make_cityscapes_instances(root, splits={'val': 1}, image_size=(2048, 1024), seed=3)
    cfg = shrink(
        Config.fromfile(str(CITY_CFG)),
        root / 'work_dir',
        len(CITYSCAPES_THING_CLASSES),
        window_size=14,
    )  # the config's window
    point_data(cfg, root, CITYSCAPES_THING_CLASSES, test_ann=anns['val'])
    cfg.train_dataloader = None
    cfg.train_cfg = None
    cfg.optim_wrapper = None
    cfg.param_scheduler = None
    runner = Runner.from_cfg(cfg)
    engine = runner.model.backbone.pos_enc.engine
    grid = (1024 // 16, 2048 // 16)
    tokens = grid[0] * grid[1] + 1
    full_bias_numel = HEADS * tokens * tokens
    metrics = runner.test()
    return runner, metrics, engine, grid, full_bias_numel


def test_highres_inference_produces_full_size_results(cityscapes_highres):
    runner, metrics, _, _, _ = cityscapes_highres
    assert 'coco/segm_mAP' in metrics and 'coco/bbox_mAP' in metrics
    # the single image was evaluated at its full 2048 x 1024 size
    dataset = runner.test_dataloader.dataset
    sample = dataset[0]['data_samples']
    assert sample.img_shape == (1024, 2048) and sample.ori_shape == (1024, 2048)


def test_highres_windowed_blocks_never_build_a_full_grid_bias(cityscapes_highres):
    _, _, engine, grid, full_numel = cityscapes_highres
    keys = list(engine.dense.keys())
    window_keys = [k for k in keys if isinstance(k[0], int)]
    # dense biases exist for the windowed layers only, at the window size
    assert {(k[0], k[1]) for k in window_keys} == {(i, (14, 14)) for i in WINDOWED}
    # the padding mask of the 64x128 grid (padded to 70x140): 5 x 10 windows
    pad = [engine.dense.get_or_create(k, None) for k in keys if k[0] == 'window_pad']
    assert len(pad) == 1 and pad[0].shape == (50, 1, 197, 197)
    for k in keys:
        assert engine.dense.get_or_create(k, None).numel() < full_numel / 50, k
    # global blocks took the fused kernel (tiled where it is not built): the relative
    # table of the grid, no dense bias
    cpu_backend = 'fused' if fused_available() else 'tiled'
    assert engine.choose_backend(grid[0] * grid[1] + 1, torch.device('cpu')) == cpu_backend
    assert engine.last_backend == cpu_backend
    f32 = torch.float32
    assert set(engine.tables.keys()) == {((14, 14), 'cpu', f32), (grid, 'cpu', f32)}
    table = engine.tables.get_or_create((grid, 'cpu', f32), None).table
    assert table.shape == (LAYERS, HEADS, 2 * grid[0] - 1, 2 * grid[1] - 1)
