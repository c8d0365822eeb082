"""lookhere_dense.evaluation: the one test-time resize rewrite, the extrapolation report's
test specs and clean-slate step, the per-class IoU metric; and the inference pipeline that
uses the same rewrite."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from lookhere_dense.apis.inference import inference_pipeline, inference_test_cfg
from lookhere_dense.errors import ConfigError
from lookhere_dense.evaluation.resize import (
    exact_resize,
    find_resize,
    is_resize,
    long_side_resize,
    replace_resize,
    scale_resizes,
    short_side_resize,
)
from research.evaluate import clear_position_caches
from research.extrapolation import (
    format_table,
    parse_spec,
    slide_settings,
    spec_pipeline,
)

PIPE = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]


# -- the resize rewrite ---------------------------------------------------------------------
def test_resize_type_names_are_matched_one_way():
    class Resize:  # a class as ``type`` (pure-Python configs)
        pass

    for kind in ('Resize', 'mmseg.Resize', 'mmcv.Resize', Resize):
        assert is_resize(dict(type=kind))
    for kind in ('RandomResize', 'mmseg.RandomResize', 'ResizeToMultiple', 'LoadImageFromFile'):
        assert not is_resize(dict(type=kind))
    assert not is_resize(dict(scale=(1, 2)))
    assert find_resize([dict(type='RandomResize'), dict(type='mmcv.Resize')]) == 1
    assert find_resize([dict(type='LoadImageFromFile')]) is None


def test_scale_resizes_multiplies_every_resize_and_keeps_the_rest():
    pipe = [
        dict(type='LoadImageFromFile'),
        dict(type='mmseg.Resize', scale=(2048, 511), keep_ratio=True, interpolation='area'),
        dict(type='RandomResize', scale=(10, 10)),
        dict(type='mmcv.Resize', scale=300),
        dict(type='Resize', scale_factor=(0.5, 0.25)),
    ]
    out, n = scale_resizes(pipe, 1.5)
    assert n == 3
    assert out[1] == dict(
        type='mmseg.Resize', scale=(3072, 766), keep_ratio=True, interpolation='area'
    )
    assert out[2] == dict(type='RandomResize', scale=(10, 10))  # not a Resize
    assert out[3]['scale'] == 450
    assert out[4]['scale_factor'] == (0.75, 0.375)
    assert pipe[1]['scale'] == (2048, 511) and pipe[3]['scale'] == 300  # input untouched
    assert scale_resizes([dict(type='LoadImageFromFile')], 2.0)[1] == 0


def test_replace_resize_replaces_inserts_or_removes():
    assert short_side_resize(768) == dict(type='Resize', scale=(1 << 20, 768), keep_ratio=True)
    assert exact_resize((1024, 2048)) == dict(type='Resize', scale=(2048, 1024), keep_ratio=False)
    out = replace_resize(PIPE, exact_resize((64, 32)))
    assert out[1] == dict(type='Resize', scale=(32, 64), keep_ratio=False) and len(out) == 4
    no_resize = [PIPE[0], PIPE[2], PIPE[3]]
    assert replace_resize(no_resize, short_side_resize(8))[1]['scale'] == (1 << 20, 8)
    assert [t['type'] for t in replace_resize(PIPE, None)] == [
        'LoadImageFromFile',
        'LoadAnnotations',
        'PackSegInputs',
    ]
    assert PIPE[1]['scale'] == (2048, 512)


# -- the extrapolation report's pieces ------------------------------------------------------
def test_extrapolate_spec_parsing_and_pipelines():
    assert parse_spec('whole@x1.5').factor == 1.5
    assert parse_spec('slide@768').short_side == 768
    assert parse_spec('whole@1024x2048').size == (1024, 2048)
    with pytest.raises(ConfigError, match='MODE@SIZE'):
        parse_spec('whole:2x')
    for bad in ('whole@x0', 'slide@0', 'whole@0x2048'):
        with pytest.raises(ConfigError, match='must be positive'):
            parse_spec(bad)
    pipe = [dict(t) for t in PIPE]
    assert spec_pipeline(pipe, parse_spec('whole@x2'))[1]['scale'] == (4096, 1024)
    assert spec_pipeline(pipe, parse_spec('whole@1024x2048'))[1] == dict(
        type='Resize', scale=(2048, 1024), keep_ratio=False
    )
    assert spec_pipeline(pipe, parse_spec('whole@768'))[1]['scale'][1] == 768
    assert pipe[1]['scale'] == (2048, 512)  # the config's pipeline is not changed
    with pytest.raises(ConfigError, match='whole@x2: the test pipeline has no Resize scale'):
        spec_pipeline([PIPE[0], PIPE[3]], parse_spec('whole@x2'))


def test_below_training_size_and_native_aspect_specs():
    assert parse_spec('whole@x0.5').factor == 0.5
    assert spec_pipeline(PIPE, parse_spec('whole@x0.25'))[1]['scale'] == (512, 128)
    spec = parse_spec('slide@long384')
    assert (spec.mode, spec.long_side, spec.short_side, spec.factor) == ('slide', 384, None, None)
    assert spec_pipeline(PIPE, spec)[1] == dict(type='Resize', scale=(384, 384), keep_ratio=True)
    assert long_side_resize(512) == dict(type='Resize', scale=(512, 512), keep_ratio=True)
    with pytest.raises(ConfigError, match='must be positive'):
        parse_spec('whole@long0')
    with pytest.raises(ConfigError, match='long<long side>'):
        parse_spec('whole@long')


def test_resizes_to_zero_px_or_below_one_patch_are_refused():
    """A test resized to a side of 0 px (OpenCV's ``inv_scale_x > 0``) or below one patch
    (the backbone's error) is a config error naming the spec, the size and the patch."""
    from mmengine.config import Config

    from research.extrapolation import config_patch_size

    for text, size in (('whole@x0.0001', '(0, 0)'), ('whole@x0.05', '(102, 26)')):
        with pytest.raises(
            ConfigError,
            match=rf'{text}: the test Resize scale \(2048, 512\) '
            rf'x {text[7:]} = {re.escape(size)} has a side of',
        ):
            spec_pipeline(PIPE, parse_spec(text), patch_size=32)
    for text, side in (
        ('slide@x0.01', 5),
        ('whole@8', 8),
        ('whole@long15', 15),
        ('whole@16x12', 12),
    ):
        with pytest.raises(
            ConfigError,
            match=rf'{text}: .* a side of {side} px, below one '
            r'patch of the model \(16 px\)',
        ):
            spec_pipeline(PIPE, parse_spec(text), patch_size=16)
    # one rule with tools/infer.py's --size (check_resize_sides), the advice a test's
    with pytest.raises(
        ConfigError, match=r'whole@8: the short side 8 px .*: test at 16 px or more$'
    ):
        spec_pipeline(PIPE, parse_spec('whole@8'), patch_size=16)
    assert spec_pipeline(PIPE, parse_spec('whole@16x16'), 16)[1]['scale'] == (16, 16)
    assert spec_pipeline(PIPE, parse_spec('whole@x0.0625'), 16)[1]['scale'] == (128, 32)
    # the patch unknown: only 0 px is refused
    assert spec_pipeline(PIPE, parse_spec('whole@x0.01'))[1]['scale'] == (20, 5)
    with pytest.raises(ConfigError, match='has a side of 0 px: test at 1 px or more'):
        spec_pipeline(PIPE, parse_spec('whole@x0.0001'))
    assert config_patch_size(Config(dict(model=dict(backbone=dict(patch_size=8))))) == 8
    assert config_patch_size(Config(dict(model=dict(backbone=dict(type='ResNet'))))) is None


def test_the_report_refuses_a_test_below_one_patch_before_any_evaluation(tmp_path, repo_root):
    """Checked right after the config is read: no data (the pre-flight data check would
    fail) and no model (the file is not a checkpoint) are needed to get the error."""
    from research.extrapolation import extrapolation_report

    not_a_checkpoint = tmp_path / 'x.pth'
    not_a_checkpoint.write_text('not a checkpoint')
    config = str(repo_root / 'configs' / 'segmenter_lookhere_vit-t_tiny-ade.py')
    with pytest.raises(
        ConfigError,
        match=r'whole@x0\.05: the test Resize scale \(512, 128\) x '
        r'0\.05 = \(26, 6\) has a side of 6 px, below one patch of the model '
        r'\(16 px\)',
    ):
        extrapolation_report(
            config,
            str(not_a_checkpoint),
            ['whole@x1', 'whole@x0.05'],
            out_dir=str(tmp_path / 'out'),
        )
    assert not (tmp_path / 'out').exists()


def test_a_report_of_another_checkpoint_is_not_replaced(tmp_path, repo_root):
    """Two checkpoints of one config (e.g. two position encodings) evaluated with the
    defaults: the second run is refused before any work, naming both checkpoints and
    --name / --out-dir (it replaced the first report without a word); the same checkpoint
    again passes the check (here it then fails as no checkpoint, later)."""
    import json

    from lookhere_dense.errors import ToolError
    from research.extrapolation import extrapolation_report
    from research.reporting import position_encoding_label

    config = str(repo_root / 'configs' / 'segmenter_lookhere_vit-t_tiny-ade.py')
    out = tmp_path / 'out'
    out.mkdir()
    first = tmp_path / 'lookhere.pth'
    (out / 'extrapolation.json').write_text(json.dumps(dict(checkpoint=str(first))))
    second = tmp_path / 'rope.pth'
    second.write_text('not a checkpoint')
    with pytest.raises(
        ToolError,
        match=r"is the extrapolation report of '.*lookhere\.pth'; "
        r"this one, of '.*rope\.pth', would replace it: give it another --name",
    ):
        extrapolation_report(config, str(second), ['whole@x1'], out_dir=str(out))
    first.write_text('not a checkpoint either')
    with pytest.raises(Exception) as exc:
        extrapolation_report(config, str(first), ['whole@x1'], out_dir=str(out))
    assert not isinstance(exc.value, ToolError) or 'would replace it' not in str(exc.value)
    from mmengine.config import Config

    assert position_encoding_label(Config.fromfile(config)) == 'lookhere'
    rope = Config(dict(model=dict(backbone=dict(type='LookHereViT', pos_encoding='rope2d'))))
    assert position_encoding_label(rope) == 'rope2d'
    lh90 = Config(dict(model=dict(backbone=dict(type='LookHereViT', preset='lh90'))))
    assert position_encoding_label(lh90) == 'lookhere lh90'
    assert position_encoding_label(Config(dict(model=dict(backbone=dict(type='ResNet'))))) is None


def test_long_side_resize_keeps_the_aspect_and_sets_the_longer_side():
    """mmcv's own Resize with the long-side dict: the longer side becomes exactly N (larger
    and smaller images alike), the shorter one follows the aspect."""
    from mmcv.transforms import Resize

    resize = Resize(**{k: v for k, v in long_side_resize(64).items() if k != 'type'})
    for (h, w), want in (
        ((100, 50), (64, 32)),
        ((30, 60), (32, 64)),
        ((20, 20), (64, 64)),
        ((300, 400), (48, 64)),
    ):
        out = resize(dict(img=np.zeros((h, w, 3), np.uint8)))
        assert out['img'].shape[:2] == want, (h, w)


def test_slide_settings_and_table():
    from mmengine.config import Config

    cfg = Config(
        dict(model=dict(test_cfg=dict(mode='slide', crop_size=(96, 96), stride=(64, 64))))
    )
    assert slide_settings(cfg) == ((96, 96), (64, 64))
    cfg = Config(
        dict(model=dict(test_cfg=dict(mode='whole'), data_preprocessor=dict(size=(96, 120))))
    )
    assert slide_settings(cfg) == ((96, 120), (64, 80))
    with pytest.raises(ConfigError, match='slide tests need a crop'):
        slide_settings(Config(dict(model=dict())))
    row = dict(
        test='slide@x1',
        mode='slide',
        input_h=128,
        input_w=256,
        grid_h=6,
        grid_w=6,
        mIoU=12.345,
        aAcc=50.0,
        sec_per_img=0.1234,
        peak_mem_mb=812.4,
        memory_kind='process_rss',
    )
    table = format_table([row], (6, 6))
    assert (
        '| test | input (median HxW) | patch grid | mIoU | aAcc | s / img | peak RSS MiB |'
        in table
    )
    assert '| slide@x1 | 128x256 | 6x6 (windows) | 12.35 | 50.00 | 0.123 | 812 |' in table
    assert table.endswith("training crop grid: 6x6 patches (the config's data_preprocessor.size)")
    assert 'peak GPU MiB' in format_table([dict(row, memory_kind='cuda_max_allocated')], None)


def test_the_training_crop_is_the_checkpoint_s_own_when_it_stored_its_config(tmp_path, repo_root):
    """A checkpoint trained at another crop than the config given now (``--cfg-options``
    at training): the report's training grid is the crop of the training config that
    mmengine's Runner stored as text in ``meta['cfg']`` (read with ``ast``, never run),
    labelled so; a weights-only file, or a stored config without a crop, gives the config's."""
    from mmengine.config import Config

    from research.extrapolation import CHECKPOINT_CROP, CONFIG_CROP, stored_value, training_crop

    config = Config.fromfile(str(repo_root / 'configs' / 'segmenter_lookhere_vit-t_tiny-ade.py'))
    trained = Config.fromfile(str(repo_root / 'configs' / 'segmenter_lookhere_vit-t_tiny-ade.py'))
    trained.model.data_preprocessor.size = (64, 96)
    ckpt = tmp_path / 'iter_1.pth'
    torch.save(dict(meta=dict(cfg=trained.pretty_text, iter=1), state_dict={}), ckpt)
    assert training_crop(config, str(ckpt)) == ((64, 96), CHECKPOINT_CROP)
    weights = tmp_path / 'weights.pth'
    torch.save(dict(state_dict={}), weights)
    assert training_crop(config, str(weights)) == ((128, 128), CONFIG_CROP)
    odd = tmp_path / 'odd.pth'
    torch.save(dict(meta=dict(cfg='model = dict(type=Foo)')), odd)
    assert training_crop(config, str(odd)) == ((128, 128), CONFIG_CROP)
    # parsed, not run: a call in the text is no literal, an import is never executed
    assert stored_value('import os\nmodel = dict(a=os.getcwd())', ('model', 'a')) is None
    assert stored_value(
        "model = {'data_preprocessor': {'size': [3, 4]}}", ('model', 'data_preprocessor', 'size')
    ) == [3, 4]
    table = format_table([], (4, 6), CHECKPOINT_CROP)
    assert table.endswith(
        "training crop grid: 4x6 patches (the checkpoint's training config: "
        'data_preprocessor.size)'
    )


def test_clean_slate_clears_every_position_encoding_cache():
    from lookhere_dense.lookhere.pos_encoding import PositionEncoding

    class CountingEncoding(PositionEncoding):
        def __init__(self):
            super().__init__()
            self.cleared = 0

        def clear_caches(self):
            self.cleared += 1

    class NotAnEncoding(nn.Module):
        def __init__(self):
            super().__init__()
            self.cleared = 0

        def clear_caches(self):
            self.cleared += 1

    model = nn.Sequential(CountingEncoding(), nn.Sequential(CountingEncoding()), NotAnEncoding())
    assert clear_position_caches(model) == 2
    assert [model[0].cleared, model[1][0].cleared, model[2].cleared] == [1, 1, 0]


def test_clean_slate_empties_a_backbone_s_caches():
    """After a forward the backbone's encoding holds cached biases; the clean slate leaves
    none (through ``PositionEncoding.clear_caches``, where the encoding has it)."""
    from lookhere_dense.lookhere.pos_encoding import PositionEncoding
    from lookhere_dense.models import LookHereViT

    if not callable(getattr(PositionEncoding, 'clear_caches', None)):
        pytest.skip('PositionEncoding.clear_caches() is not there yet')
    model = LookHereViT(
        img_size=(32, 32),
        patch_size=16,
        embed_dims=24,
        num_layers=1,
        num_heads=6,
        out_indices=(0,),
    )
    with torch.no_grad():
        model(torch.zeros(1, 3, 32, 32))
    engine = model.pos_enc.engine
    assert len(engine.tables) > 0
    assert clear_position_caches(model) >= 1
    assert len(engine.tables) == 0


# -- the per-class IoU metric ---------------------------------------------------------------
def test_per_class_iou_metric_is_registered_and_reports_every_class(tmp_path):
    from mmseg.registry import METRICS

    from lookhere_dense.evaluation.metrics import PerClassIoUMetric
    from lookhere_dense.registry import REGISTERING_MODULES

    assert 'lookhere_dense.evaluation.metrics' in REGISTERING_MODULES
    assert METRICS.get('PerClassIoUMetric') is PerClassIoUMetric
    metric = METRICS.build(dict(type='PerClassIoUMetric', _scope_='mmseg'))
    metric.dataset_meta = dict(classes=('sky', 'road', 'car'))
    pred = torch.tensor([[0, 0, 1, 1]])
    label = torch.tensor([[0, 1, 1, 1]])
    metric.process([], [dict(pred_sem_seg=dict(data=pred), gt_sem_seg=dict(data=label))])
    out = metric.compute_metrics(metric.results)
    # sky: 1 / 2, road: 2 / 3, car: never predicted nor present -> None
    assert out['IoU.sky'] == 50.0 and out['IoU.road'] == pytest.approx(66.67)
    assert out['IoU.car'] is None
    assert out['mIoU'] == pytest.approx((50.0 + 66.67) / 2, abs=0.01)
    # IoUMetric's options: nan_to_num for the absent class, format_only (no labels)
    metric = METRICS.build(dict(type='PerClassIoUMetric', nan_to_num=1, _scope_='mmseg'))
    metric.dataset_meta = dict(classes=('sky', 'road', 'car'))
    metric.process([], [dict(pred_sem_seg=dict(data=pred), gt_sem_seg=dict(data=label))])
    out = metric.compute_metrics(metric.results)
    # on IoUMetric's scale: its mIoU counts the absent class as 100
    assert out['IoU.car'] == 100.0 and out['IoU.sky'] == 50.0
    assert out['mIoU'] == pytest.approx((50.0 + 66.67 + 100.0) / 3, abs=0.01)
    metric = METRICS.build(
        dict(type='PerClassIoUMetric', format_only=True, output_dir=str(tmp_path), _scope_='mmseg')
    )
    assert metric.compute_metrics([]) == {}  # it crashed on the empty results


# -- the inference pipeline (same rewrite) --------------------------------------------------
def test_inference_pipeline_and_test_cfg():
    from mmengine.config import Config

    cfg = Config(
        dict(
            test_dataloader=dict(
                dataset=dict(
                    pipeline=[
                        dict(type='LoadImageFromFile'),
                        dict(type='mmseg.Resize', scale=(512, 128), keep_ratio=True),
                        dict(type='PackSegInputs'),
                    ]
                )
            ),
            model=dict(
                test_cfg=dict(mode='slide', crop_size=(96, 96), stride=(64, 64)),
                data_preprocessor=dict(size=(96, 96)),
            ),
        )
    )
    steps = inference_pipeline(cfg)
    assert [t['type'] for t in steps] == ['LoadImageFromFile', 'mmseg.Resize', 'PackSegInputs']
    assert steps[1]['scale'] == (512, 128)
    assert inference_pipeline(cfg, native=True) == [
        dict(type='LoadImageFromFile'),
        dict(type='PackSegInputs'),
    ]
    assert inference_pipeline(cfg, short_side=200)[1] == short_side_resize(200)
    assert inference_pipeline(cfg, size=(320, 400))[1] == exact_resize((320, 400))
    assert inference_test_cfg(cfg, whole=True) == dict(mode='whole')
    assert inference_test_cfg(cfg) == dict(mode='slide', crop_size=(96, 96), stride=(64, 64))
    assert inference_test_cfg(cfg, crop=(48, 48)) == dict(
        mode='slide', crop_size=(48, 48), stride=(32, 32)
    )
    whole_cfg = Config(dict(model=dict(test_cfg=dict(mode='whole'))))
    assert inference_test_cfg(whole_cfg) == dict(mode='whole')
    with pytest.raises(ConfigError, match='--slide needs --crop'):
        inference_test_cfg(whole_cfg, slide=True)


def test_overlay_blends_only_palette_classes():
    from lookhere_dense.apis.inference import overlay

    rgb = np.full((1, 3, 3), 100, np.uint8)
    labels = np.array([[0, 1, 255]], np.uint8)
    out = overlay(rgb, labels, [[200, 0, 0]], opacity=0.5)
    assert out[0, 0].tolist() == [150, 50, 50]
    assert out[0, 1].tolist() == [100, 100, 100] and out[0, 2].tolist() == [100, 100, 100]


def test_tests_below_the_training_size_run_whole_and_slide(tmp_path, repo_root):
    """Below the training crop: a slide window larger than the image is the image (slide =
    whole), and a 4x3-patch grid or a native-aspect frame runs through the real test path.
    ``long48`` on portrait and landscape scenes sets their *longer* side (a short-side
    resize would give 96x48 from 64x32), and the report's input is the size of the median
    image by area (36x48), not the median H and median W apart (48x48: no image has it)."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from lookhere_dense.apis.cli import parse_cfg_options
    from research.datasets.relational import (
        RelationalSettings,
        aspect_split_name,
        ensure_relational_dataset,
    )
    from research.extrapolation import evaluate_spec

    init_default_scope('mmseg')
    root = str(tmp_path / 'rel')
    aspects = (0.5, 0.75, 4 / 3, 2.0)  # width / height: 64x32, 64x48, 48x64, 32x64 at 1x
    ensure_relational_dataset(
        root, RelationalSettings(num_train=1, num_val=4, scales=(1.0,), aspect_ratios=aspects)
    )
    cfg = Config.fromfile(str(repo_root / 'configs' / 'study' / 'relational_vit_tiny.py'))
    cfg.merge_from_dict(
        parse_cfg_options(
            [f'val_dataloader.dataset.data_root={root}', 'model.backbone.num_layers=1']
        )
    )
    torch.manual_seed(0)
    model = MODELS.build(cfg.model).eval()
    rows = {
        t: evaluate_spec(model, cfg, parse_spec(t), 'val', 'cpu', None, 8)
        for t in ('slide@32', 'whole@32', 'whole@24x40')
    }
    assert (rows['slide@32']['input_h'], rows['slide@32']['grid_h']) == (32, 4)
    assert rows['slide@32']['mIoU'] == rows['whole@32']['mIoU']  # one window: the image
    assert (rows['whole@24x40']['grid_h'], rows['whole@24x40']['grid_w']) == (3, 5)
    assert all(r['images'] == 4 and r['input_sizes'] == 1 for r in rows.values())
    split = aspect_split_name(1.0)
    cfg.val_dataloader.dataset.data_prefix = dict(
        img_path=f'img_dir/{split}', seg_map_path=f'ann_dir/{split}'
    )
    long48 = evaluate_spec(model, cfg, parse_spec('whole@long48'), 'val', 'cpu', None, 8)
    # 48x24, 48x36, 36x48, 24x48: long side 48, aspect kept; the median image by area
    assert (long48['input_h'], long48['input_w'], long48['grid_h'], long48['grid_w']) == (
        36,
        48,
        5,
        6,
    )
    assert (long48['input_sizes'], long48['input_h_range'], long48['input_w_range']) == (
        4,
        [24, 48],
        [24, 48],
    )
    table = format_table([long48, rows['whole@32']], None)
    assert '| whole@long48 | 36x48 (median of 4 sizes: H 24-48, W 24-48) | 5x6 |' in table
    assert '| whole@32 | 32x32 | 4x4 |' in table


def test_a_large_frame_is_announced_before_its_pass():
    """The evaluation loop's progress counts whole images: one 25600 x 6400 frame printed
    nothing for minutes. A batch from 2048 x 2048 px on gets one line first."""
    import torch

    from research.evaluate import large_frame_note

    small = dict(inputs=[torch.zeros(3, 1024, 2048, dtype=torch.uint8)])
    big = dict(inputs=[torch.zeros(3, 25600, 6400, dtype=torch.uint8, device='meta')])
    assert large_frame_note(small, 'whole@x1') is None
    assert large_frame_note(big, 'whole@x50') == (
        'whole@x50: a 25600x6400 px image (640,000 patches of 16 px): one pass may take '
        'minutes on a CPU; the progress counts whole images'
    )
    assert large_frame_note({}, '') is None
    stacked = dict(inputs=torch.zeros(2, 3, 4096, 4096, device='meta'))  # default_collate
    assert large_frame_note(stacked, 'x').startswith('x: a 4096x4096 px image')
