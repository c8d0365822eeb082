"""The relational dataset and the extrapolation study (:mod:`research.study`; a shrunk
run through the real mmengine Runner and mmseg's dataset, pipeline, model and IoUMetric)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os

import numpy as np
import pytest
from tiny_seg import study_report, write_study_reports

from lookhere_dense.apis.cli import parse_cfg_options
from lookhere_dense.engine.schedules import schedule_to
from lookhere_dense.errors import ConfigError
from research.datasets import fov_scenes
from research.datasets.relational import (
    CLASSES,
    RelationalSettings,
    ensure_relational_dataset,
    render_scene,
    sample_scene,
    settings_from_dict,
    split_name,
)
from research.study.aids import run_specs, split_run_spec
from research.study.encodings import backbone_for, parse_encoding
from research.study.ladders import (
    LADDERS,
    ladder_dataloader,
    ladder_evaluator,
    prepare_data,
    study_settings,
)
from research.study.reports import (
    format_table,
    merge_reports,
    summarise,
    write_outputs,
)
from research.study.runs import RunOptions, run_config, run_study

SMALL = RelationalSettings(num_train=12, num_val=3, train_size=(32, 32), scales=(1.0, 2.0), seed=5)


# -- the generator -------------------------------------------------------------------------
def test_labels_are_the_quadrant_around_the_anchor_centre():
    rng = np.random.default_rng(0)
    for _ in range(20):
        scene = sample_scene(rng, RelationalSettings())
        image, label = render_scene(scene, (96, 80))
        acy, acx = scene.anchor[:2]
        ys, xs = np.nonzero(label >= 2)
        up = (ys + 0.5) / 96 < acy
        left = (xs + 0.5) / 80 < acx
        expected = 2 + 2 * (~up).astype(int) + (~left).astype(int)
        np.testing.assert_array_equal(label[ys, xs], expected)
        anchor = label == 1
        assert anchor.any() and (image[anchor] >= 230).all()  # white (+ small noise)
        assert image.dtype == np.uint8 and image.shape == (96, 80, 3)


def test_colour_alone_does_not_give_the_class():
    """Every object colour appears in every quadrant class (over a few hundred scenes)."""
    rng = np.random.default_rng(1)
    seen = {}
    for _ in range(300):
        for _, _, _, _, _, rgb, cls in sample_scene(rng, RelationalSettings()).objects:
            seen.setdefault(rgb, set()).add(cls)
    assert all(classes == {2, 3, 4, 5} for classes in seen.values()), seen


def test_the_same_scene_at_twice_the_size_has_the_same_labels():
    scene = sample_scene(np.random.default_rng(2), RelationalSettings())
    _, small = render_scene(scene, (64, 64))
    _, big = render_scene(scene, (128, 128))
    agree = (big.reshape(64, 2, 64, 2) == small[:, None, :, None]).mean()
    assert agree > 0.97


def test_dataset_folder_loads_with_mmseg(tmp_path):
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS

    init_default_scope('mmseg')
    root = str(tmp_path / 'rel')
    meta = ensure_relational_dataset(root, SMALL)
    assert meta['splits']['val_x2']['size'] == [64, 64]
    ds = DATASETS.build(
        dict(
            type='BaseSegDataset',
            data_root=root,
            metainfo=dict(classes=CLASSES),
            img_suffix='.png',
            seg_map_suffix='.png',
            data_prefix=dict(
                img_path=f'img_dir/{split_name(2.0)}', seg_map_path=f'ann_dir/{split_name(2.0)}'
            ),
            pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations'),
                dict(type='PackSegInputs'),
            ],
        )
    )
    assert len(ds) == 3
    sample = ds[0]
    assert tuple(sample['inputs'].shape) == (3, 64, 64)
    labels = sample['data_samples'].gt_sem_seg.data
    assert labels.max() < len(CLASSES) and (labels == 1).any()
    # not rewritten when the settings are the same; rewritten when they change
    stamp = os.path.getmtime(os.path.join(root, 'meta.json'))
    ensure_relational_dataset(root, SMALL)
    assert os.path.getmtime(os.path.join(root, 'meta.json')) == stamp
    ensure_relational_dataset(root, dataclasses.replace(SMALL, num_val=2))
    assert len(os.listdir(os.path.join(root, 'img_dir', 'val_x1'))) == 2
    with pytest.raises(ValueError, match=r"unknown relational dataset settings \['size'\]"):
        settings_from_dict(dict(size=3))


# -- the study's pieces ------------------------------------------------------------------
def test_encoding_specs():
    assert parse_encoding('lookhere:lh45') == ('lookhere', 'lh45')
    assert parse_encoding('alibi2d') == ('alibi2d', None)
    bb = dict(type='LookHereViT', preset='lh180', embed_dims=8)
    assert backbone_for(bb, 'rope2d') == dict(
        type='LookHereViT', embed_dims=8, pos_encoding='rope2d'
    )
    assert backbone_for(bb, 'lookhere')['preset'] == 'lh180'
    assert backbone_for({**bb, 'lh_config': dict(global_slope=2.0)}, 'lookhere:lh90') == dict(
        type='LookHereViT', embed_dims=8, preset='lh90', pos_encoding='lookhere'
    )
    with pytest.raises(ValueError, match='unknown encoding .sincos.'):
        parse_encoding('sincos')
    with pytest.raises(ValueError, match='only lookhere takes a preset'):
        parse_encoding('abs:lh90')
    with pytest.raises(ValueError, match="unknown LookHere preset 'lh30'"):
        parse_encoding('lookhere:lh30')
    with pytest.raises(ValueError, match="needs model.backbone.type='LookHereViT'"):
        backbone_for(dict(type='VisionTransformer'), 'abs')


def test_summary_mean_and_std_over_seeds():
    runs = [
        dict(encoding='abs', seed=s, eval={'1': {'mIoU': v}, '2': {'mIoU': v / 2}})
        for s, v in enumerate([40.0, 50.0, 60.0])
    ]
    summary = summarise(runs, 'mIoU')
    assert summary['abs']['1']['mean'] == 50.0 and summary['abs']['1']['std'] == 10.0
    assert summary['abs']['2']['n'] == 3 and summary['abs']['2']['mean'] == 25.0
    table = format_table(summary, dict(scales=(1.0, 2.0), train_size=(32, 32)))
    assert '| abs | 50.00 ± 10.00 | 25.00 ± 5.00 |' in table


def test_resize_ladder_scales_the_test_pipeline():
    from mmengine.config import Config

    cfg = Config(
        dict(
            val_dataloader=dict(
                dataset=dict(
                    type='ADE20KDataset',
                    pipeline=[
                        dict(type='LoadImageFromFile'),
                        dict(type='Resize', scale=(2048, 512), keep_ratio=True),
                        dict(type='LoadAnnotations'),
                    ],
                )
            )
        )
    )
    dl = ladder_dataloader(cfg, dict(ladder='resize'), 2.0)
    assert dl['dataset']['pipeline'][1]['scale'] == (4096, 1024)
    assert cfg.val_dataloader.dataset.pipeline[1].scale == (2048, 512)  # config untouched
    cfg.val_dataloader.dataset.pipeline.pop(1)
    with pytest.raises(ValueError, match='needs a Resize'):
        ladder_dataloader(cfg, dict(ladder='resize'), 2.0)
    rendered = ladder_dataloader(cfg, dict(ladder='rendered', val_prefix='val_x{scale:g}'), 1.5)
    assert rendered['dataset']['data_prefix'] == dict(
        img_path='img_dir/val_x1.5', seg_map_path='ann_dir/val_x1.5'
    )


# -- a shrunk study through the real Runner -------------------------------------------------
def test_shrunk_study_end_to_end(tmp_path):
    data = tmp_path / 'data'
    out = tmp_path / 'out'
    report = run_study(
        encodings=['lookhere', 'rope2d'],
        seeds=[7],
        options=RunOptions(iters=3, batch_size=4),
        scales=[1, 2],
        work_dir=str(tmp_path / 'work'),
        native_aspect=False,
        cfg_options=parse_cfg_options(
            [
                f'train_dataloader.dataset.data_root={data}',
                f'val_dataloader.dataset.data_root={data}',
                'relational.num_train=16',
                'relational.num_val=2',
                'relational.train_size=(32,32)',
                'extrapolation.train_size=(32,32)',
                'model.backbone.img_size=(32,32)',
                'model.data_preprocessor.size=(32,32)',
                'model.backbone.num_layers=2',
                'val_dataloader.batch_size=2',
            ]
        ),
    )
    write_outputs(report, str(out), 'tiny')
    assert [(r['encoding'], r['seed']) for r in report['runs']] == [('lookhere', 7), ('rope2d', 7)]
    for run in report['runs']:
        assert set(run['eval']) == {'1', '2'}
        for metrics in run['eval'].values():
            assert 0 <= metrics['mIoU'] <= 100 and 0 <= metrics['aAcc'] <= 100
            assert {f'IoU.{c}' for c in CLASSES} <= set(metrics)
    saved = json.loads((out / 'tiny.json').read_text())
    assert saved['settings']['seeds'] == [7] and saved['settings']['iters'] == 3
    assert saved['settings']['dataset']['splits']['val_x2']['size'] == [64, 64]
    assert saved['summary']['rope2d']['2']['mean'] == report['runs'][1]['eval']['2']['mIoU']
    rows = list(csv.DictReader((out / 'tiny.csv').open()))
    assert len(rows) == 4 and {r['test_h'] for r in rows} == {'32', '64'}
    assert (out / 'tiny.png').stat().st_size > 10_000
    assert '| lookhere |' in (out / 'tiny_table.md').read_text()
    assert os.path.isfile(tmp_path / 'work' / 'rope2d' / 'seed7' / 'iter_3.pth')


def test_full_scale_segmenter_config_builds_every_encoding_and_scales_its_ladder(repo_root):
    from mmengine.config import Config
    from mmseg.registry import MODELS

    cfg = Config.fromfile(
        str(repo_root / 'configs' / 'study' / 'segmenter_vit-b_ade20k_ladder.py')
    )
    assert cfg.model.test_cfg == dict(mode='whole') and cfg.model.pretrained is None
    settings = study_settings(cfg)
    assert settings['ladder'] == 'resize' and settings['train_size'] == (512, 512)
    dl = ladder_dataloader(cfg, settings, 3.0)
    assert [t['scale'] for t in dl['dataset']['pipeline'] if t['type'] == 'Resize'] == [
        (6144, 1536)
    ]
    for spec in ('lookhere', 'abs', 'rope2d_mixed', 'alibi2d'):
        backbone = backbone_for(cfg.model.backbone, spec)
        model = MODELS.build({**backbone, 'num_layers': 1})  # one block keeps the test small
        assert model.pos_encoding == spec and model.embed_dims == 768


def test_iters_override_stretches_and_clips_iteration_schedules():
    from mmengine.config import Config

    cfg = Config(
        dict(
            train_cfg=dict(max_iters=600),
            param_scheduler=[
                dict(type='LinearLR', by_epoch=False, begin=0, end=50),
                dict(type='CosineAnnealingLR', by_epoch=False, begin=50, end=600),
            ],
        )
    )
    schedule_to(cfg, 2000)
    assert [(s.begin, s.end) for s in cfg.param_scheduler] == [(0, 50), (50, 2000)]
    schedule_to(cfg, 20)
    assert cfg.train_cfg.max_iters == 20
    assert [(s.begin, s.end) for s in cfg.param_scheduler] == [(0, 20), (19, 20)]


def test_example_sheet(tmp_path):
    from PIL import Image

    from research.datasets.relational import save_examples

    save_examples(str(tmp_path / 'ex.png'), num=3, scales=(1, 2), settings=SMALL)
    assert Image.open(tmp_path / 'ex.png').size == (3 * (64 + 4), 4 * (64 + 4))


def test_merge_combines_seeds_and_refuses_other_settings(tmp_path):
    runs = [(0, 40.0, 10), (1, 60.0, 10), (1, 50.0, 10), (2, 50.0, 99)]
    paths = write_study_reports(tmp_path, runs)
    merged = write_outputs(merge_reports([paths[0], paths[1]], 'x'), str(tmp_path / 'm'), 'merged')
    assert merged['settings']['seeds'] == [0, 1] and len(merged['merged_from']) == 2
    assert merged['summary']['abs']['1'] == dict(
        values=[40.0, 60.0], n=2, mean=50.0, std=pytest.approx(14.14, abs=0.01)
    )
    assert (tmp_path / 'm' / 'merged.png').is_file()
    with pytest.raises(ValueError, match='appears twice'):
        merge_reports([paths[1], paths[2]], 'x')
    with pytest.raises(ValueError, match=r"settings differ in \['iters'\]"):
        merge_reports([paths[0], paths[3]], 'x')


def test_merge_takes_another_metric_and_refuses_one_the_runs_lack(tmp_path):
    """``--merge ... --metric aAcc`` tabulates aAcc (it was ignored: the table stayed
    mIoU); a misspelt metric, a report named twice and a missing one are refused."""
    from lookhere_dense.errors import ConfigError

    paths = write_study_reports(tmp_path, [(0, 40.0), (1, 60.0)])
    merged = write_outputs(merge_reports(paths, 'x', 'aAcc'), str(tmp_path / 'm'), 'merged')
    assert merged['settings']['metric'] == 'aAcc'
    assert merged['summary']['abs']['1']['values'] == [90.0, 90.0]
    with pytest.raises(ConfigError, match=r"--metric 'miou'.*did you mean 'mIoU'.*aAcc, mIoU"):
        merge_reports(paths, 'x', 'miou')
    with pytest.raises(ConfigError, match='a report is named twice'):
        merge_reports([paths[0], paths[0]], 'x')
    with pytest.raises(FileNotFoundError, match='not found'):
        merge_reports([paths[0], str(tmp_path / 'nope.json')], 'x')


def test_ladder_settings_and_the_per_class_evaluator():
    from mmengine.config import Config
    from mmseg.registry import METRICS

    from lookhere_dense.evaluation.metrics import PerClassIoUMetric

    assert set(LADDERS) == {'rendered', 'resize', 'fov'}
    cfg = Config(
        dict(
            extrapolation=dict(ladder='zoom'),
            model=dict(backbone=dict(img_size=32)),
            val_evaluator=dict(type='IoUMetric', iou_metrics=['mIoU']),
        )
    )
    with pytest.raises(
        ValueError,
        match=r"unknown extrapolation.ladder 'zoom'; allowed: "
        r"\['rendered', 'resize', 'fov'\]",
    ):
        study_settings(cfg)
    cfg.extrapolation.ladder = 'rendered'
    settings = study_settings(cfg, scales=[2, 1], metric='aAcc')
    assert settings == dict(
        ladder='rendered',
        scales=(2.0, 1.0),
        metric='aAcc',
        train_size=(32, 32),
        val_prefix='val_x{scale:g}',
    )
    with pytest.raises(ValueError, match='scales must be positive'):
        study_settings(cfg, scales=[1, 0])
    # a misspelt metric is refused before any training (it gave a table of '-' at the end)
    with pytest.raises(ValueError, match=r"--metric 'miou'.*did you mean 'mIoU'\?\); available"):
        study_settings(cfg, metric='miou')
    assert study_settings(cfg, metric='IoU.sky')['metric'] == 'IoU.sky'  # per class
    assert study_settings(cfg, metric='sec_per_img')['metric'] == 'sec_per_img'  # a row key
    from research.study.ladders import evaluator_metrics

    cfg.val_evaluator = dict(type='IoUMetric', iou_metrics='mDice', prefix='val')  # a string
    assert evaluator_metrics(cfg)[:3] == ['val/aAcc', 'val/mDice', 'val/mAcc']
    assert study_settings(cfg, metric='val/mDice')['metric'] == 'val/mDice'
    cfg.val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
    # the fov ladder widens the view: below 1 is refused with the scales given (the dataset's
    # check quoted its own, merged list)
    with pytest.raises(ValueError, match=r"scales \['0.5', '1'\]: the fov ladder widens"):
        study_settings(cfg, scales=[0.5, 1], ladder='fov')
    ev = ladder_evaluator(cfg)
    assert ev == dict(type='PerClassIoUMetric', iou_metrics=['mIoU'])
    assert cfg.val_evaluator.type == 'IoUMetric'  # config untouched
    assert isinstance(METRICS.build(dict(ev, _scope_='mmseg')), PerClassIoUMetric)


# -- the field-of-view task -----------------------------------------------------------------
FOV_SMALL = fov_scenes.FovSceneSettings(
    num_train=6, num_val=2, crop=(32, 32), train_scale=2, scales=(1, 2), seed=3
)


def _grid(h: int, w: int):
    return np.mgrid[0:h, 0:w]


def test_fov_labels_follow_the_horizon_and_the_side_of_the_tower():
    rng = np.random.default_rng(0)
    for scale in (1, 2, 4):
        for _ in range(4):
            scene = fov_scenes.sample_scene(rng, (64 * scale, 48 * scale))
            image, label = fov_scenes.render_scene(scene)
            rows, cols = _grid(*scene.size)
            x0, width = scene.tower
            tower = (cols >= x0) & (cols < x0 + width)
            assert (label[tower] == 2).all() and (image[tower] >= 210).all()
            background = label <= 1
            np.testing.assert_array_equal(
                label[background], (rows[background] >= scene.horizon).astype(np.uint8)
            )
            ys, xs = np.nonzero(label >= 3)
            np.testing.assert_array_equal(
                label[ys, xs], np.where(xs + 0.5 < scene.tower_centre, 3, 4)
            )
            assert image.dtype == np.uint8 and image.shape == (*scene.size, 3)


def test_fov_appearance_says_nothing_about_sky_road_or_side():
    rng = np.random.default_rng(2)
    seen = {}
    for _ in range(150):
        for _, _, _, _, _, rgb, cls in fov_scenes.sample_scene(rng, (64, 128)).objects:
            seen.setdefault(rgb, set()).add(cls)
    assert all(classes == {3, 4} for classes in seen.values()), seen
    scene = fov_scenes.sample_scene(np.random.default_rng(3), (256, 256))
    image, label = fov_scenes.render_scene(scene)
    rows, _ = _grid(256, 256)
    off_line = np.abs(rows - scene.horizon) > 2
    sky, road = image[(label == 0) & off_line], image[(label == 1) & off_line]
    assert abs(float(sky.mean()) - float(road.mean())) < 1.0
    assert abs(float(sky.std()) - float(road.std())) < 1.0


def test_fov_frames_show_more_of_the_world_at_one_pixel_scale():
    settings = fov_scenes.FovSceneSettings()
    rng = np.random.default_rng(1)
    count = {}
    for scale in (1, 4):
        scenes = [
            fov_scenes.sample_scene(rng, settings.size_at(scale), settings) for _ in range(30)
        ]
        count[scale] = np.mean([len(s.objects) for s in scenes])
        for s in scenes:  # sizes in px, whatever the frame
            assert 4 <= s.tower[1] <= 6
            assert all(4 <= o[3] <= 8 and 4 <= o[4] <= 8 for o in s.objects)
    assert 12 < count[4] / count[1] < 20  # 16 x the area, about 16 x the objects


def test_fov_dataset_folder_and_settings(tmp_path):
    meta = fov_scenes.ensure_fov_dataset(str(tmp_path / 'fov'), FOV_SMALL)
    assert meta['splits']['train']['size'] == [64, 64]  # train_scale x the crop
    assert meta['splits']['val_x1']['size'] == [32, 32]
    assert meta['splits']['val_x2']['size'] == [64, 64]
    assert meta['classes'] == list(fov_scenes.CLASSES)
    with pytest.raises(ValueError, match=r"unknown fov_scenes settings \['size'\]"):
        fov_scenes.settings_from_dict(dict(size=3))
    with pytest.raises(ValueError, match='scales must be >= 1'):
        fov_scenes.FovSceneSettings(scales=(0.5,))
    fov_scenes.save_examples(str(tmp_path / 'ex.png'), scales=(1, 2), settings=FOV_SMALL)
    from PIL import Image

    assert Image.open(tmp_path / 'ex.png').size == (32 + 64 + 4 * 4, 2 * 64 + 3 * 4)


# -- aids ---------------------------------------------------------------------------------------
def test_run_specs_with_aids():
    assert split_run_spec('lookhere:lh45+mixed_crops') == ('lookhere:lh45', ('mixed_crops',))
    assert run_specs(['abs', 'rope2d+mixed_crops'], ['log_n', 'mixed_crops']) == [
        'abs+mixed_crops',
        'rope2d+mixed_crops',
    ]
    assert run_specs(['abs', 'none'], ['log_n']) == ['abs', 'none']
    with pytest.raises(ValueError, match="'log_n' is a test-time aid"):
        split_run_spec('abs+log_n')
    with pytest.raises(ValueError, match="unknown training aid 'flip'"):
        split_run_spec('abs+flip')
    with pytest.raises(ValueError, match='names an aid twice'):
        split_run_spec('abs+mixed_crops+mixed_crops')
    with pytest.raises(ValueError, match=r"unknown aid\(s\) \['zoom'\]"):
        run_specs(['abs'], ['zoom'])
    with pytest.raises(ValueError, match='name one run twice'):
        run_specs(['abs', 'abs+mixed_crops'], ['mixed_crops'])
    with pytest.raises(ValueError, match='unknown encoding'):
        split_run_spec('sincos+mixed_crops')


def test_mixed_crops_aid_rewrites_the_run_config(repo_root, tmp_path):
    from mmengine.config import Config

    cfg = Config.fromfile(str(repo_root / 'configs' / 'study' / 'fov_vit_tiny.py'))
    run = run_config(cfg, 'abs+mixed_crops', 0, RunOptions(), str(tmp_path))
    crop = [t for t in run.train_dataloader.dataset.pipeline if t['type'] == 'RandomCrop']
    assert crop[0]['crop_size'] == (128, 128)
    dp = run.model.data_preprocessor
    assert dp['type'] == 'MixedCropSegDataPreProcessor' and dp['size'] == (128, 128)
    assert dp['crop_sizes'] == [[64, 64], [96, 96], [128, 128]]
    assert run.model.backbone.pos_encoding == 'abs'
    plain = run_config(cfg, 'abs', 0, RunOptions(), str(tmp_path))
    assert plain.model.data_preprocessor['type'] == 'SegDataPreProcessor'
    cfg.train_dataloader.dataset.pipeline = cfg.train_dataloader.dataset.pipeline[:2]
    with pytest.raises(ValueError, match='needs a RandomCrop in the training pipeline'):
        run_config(cfg, 'abs+mixed_crops', 0, RunOptions(), str(tmp_path))


def test_run_options_refuse_zero_instead_of_reading_it_as_the_configs(repo_root, tmp_path):
    """``RunOptions(iters=0)`` from the Python API trained the config's own schedule (0 was
    read as "not given"): refused like the tool's flags; None keeps the config's value."""
    from mmengine.config import Config

    for name, value in (
        ('iters', 0),
        ('batch_size', 0),
        ('val_interval', 0),
        ('iters', 2.5),
        ('lr', 0),
        ('lr', float('nan')),
    ):
        with pytest.raises(ConfigError, match=f'RunOptions.{name} must be'):
            RunOptions(**{name: value})
    cfg = Config.fromfile(str(repo_root / 'configs' / 'study' / 'fov_vit_tiny.py'))
    run = run_config(cfg, 'abs', 0, RunOptions(), str(tmp_path))
    assert run.train_dataloader.batch_size == cfg.train_dataloader.batch_size
    assert run.train_cfg.val_interval == cfg.train_cfg.max_iters + 1
    assert run.train_cfg.val_begin == cfg.train_cfg.max_iters + 1  # else it validates at the end
    run = run_config(cfg, 'abs', 0, RunOptions(batch_size=1, lr=0.5), str(tmp_path))
    assert run.train_dataloader.batch_size == 1 and run.optim_wrapper.optimizer.lr == 0.5


# -- a shrunk field-of-view study through the real Runner --------------------------------------
def _tiny_fov(data) -> dict:
    """The ``--cfg-options`` of a tiny field-of-view study on generated scenes in ``data``
    (4 training and 2 validation scenes at 1x and 2x, a one-block trunk)."""
    return parse_cfg_options(
        [
            f'train_dataloader.dataset.data_root={data}',
            f'val_dataloader.dataset.data_root={data}',
            'fov_scenes.num_train=4',
            'fov_scenes.num_val=2',
            'fov_scenes.scales=(1,2)',
            'model.backbone.num_layers=1',
        ]
    )


def test_shrunk_fov_study_end_to_end(tmp_path):
    data, out = tmp_path / 'data', tmp_path / 'out'
    report = run_study(
        ladder='fov',
        encodings=['lookhere:lh45'],
        aids=['log_n', 'mixed_crops'],
        seeds=[1],
        options=RunOptions(iters=2, batch_size=2),
        scales=[1, 2],
        work_dir=str(tmp_path / 'work'),
        cfg_options=_tiny_fov(data),
    )
    write_outputs(report, str(out), 'fov')
    settings = report['settings']
    assert settings['ladder'] == 'fov' and settings['modes'] == ['whole', 'slide', 'log_n']
    assert settings['slide'] == dict(crop=[64, 64], stride=[43, 43])
    assert settings['encodings'] == ['lookhere:lh45+mixed_crops']
    (run,) = report['runs']
    assert set(run['eval']) == {'1', '2'} and set(run['modes']) == {'slide', 'log_n'}
    for mode in ('slide', 'log_n'):  # one window / a scale of exactly 1 at the crop size
        assert run['modes'][mode]['1']['mIoU'] == run['eval']['1']['mIoU']
    for metrics in [run['eval']['2'], *(m['2'] for m in run['modes'].values())]:
        assert (metrics['input_h'], metrics['input_w']) == (128, 128)  # 2 x the crop
        assert metrics['sec_per_img'] > 0 and metrics['peak_mem_mb'] > 0
        assert metrics['images'] == 2 and {f'IoU.{c}' for c in fov_scenes.CLASSES} <= set(metrics)
    assert os.path.isfile(tmp_path / 'work' / 'lookhere-lh45+mixed_crops' / 'seed1' / 'iter_2.pth')
    rows = list(csv.DictReader((out / 'fov.csv').open()))
    assert len(rows) == 6 and {r['mode'] for r in rows} == {'whole', 'slide', 'log_n'}
    assert {(r['test_h'], r['scale']) for r in rows} == {('64', '1'), ('128', '2')}
    table = (out / 'fov_table.md').read_text()
    assert '| lookhere:lh45+mixed_crops | whole |' in table and '|  | whole + log-n |' in table
    assert 'seconds per frame' in table and ' s, ' in report['cost_table']
    assert (out / 'fov.png').stat().st_size > 10_000
    saved = json.loads((out / 'fov.json').read_text())
    assert saved['summary_modes']['slide']['lookhere:lh45+mixed_crops']['2']['n'] == 1
    # seeds merge as for the zoom ladders
    other = json.loads((out / 'fov.json').read_text())
    other['runs'][0]['seed'] = 2
    (out / 'other.json').write_text(json.dumps(other))
    merged = write_outputs(
        merge_reports([str(out / 'fov.json'), str(out / 'other.json')], 'x'), str(out), 'merged'
    )
    assert merged['settings']['seeds'] == [1, 2]
    assert merged['summary_modes']['slide']['lookhere:lh45+mixed_crops']['1']['n'] == 2


def test_a_rung_over_the_memory_budget_is_refused_and_the_others_run(tmp_path):
    """A budget of 8 MiB between the 2x whole frame's estimate (10.8 MiB) and the 2x
    sliding windows' (7.4 MiB): the whole (and whole + log-n) 2x rungs are refused before
    they allocate and shown as ``refused``; every other rung runs and is scored."""
    data, out = tmp_path / 'data', tmp_path / 'out'
    report = run_study(
        ladder='fov',
        encodings=['lookhere:lh45'],
        aids=['log_n'],
        seeds=[1],
        options=RunOptions(iters=2, batch_size=2),
        scales=[1, 2],
        work_dir=str(tmp_path / 'work'),
        max_memory='8M',
        cfg_options=_tiny_fov(data),
    )
    write_outputs(report, str(out), 'fov')
    (run,) = report['runs']
    evals = dict(whole=run['eval'], **run['modes'])
    for mode in ('whole', 'log_n'):
        refused = evals[mode]['2']
        assert 'mIoU' not in refused and refused['limit_mb'] == 8.0
        assert refused['refused'].startswith('inference of a (1, 3, 128, 128) input refused')
        assert 'the --max-memory budget is 8.0 MiB' in refused['refused']
    for mode, scale in (('whole', '1'), ('slide', '1'), ('slide', '2'), ('log_n', '1')):
        assert 0 <= evals[mode][scale]['mIoU'] <= 100 and 'refused' not in evals[mode][scale]
    table = (out / 'fov_table.md').read_text()
    whole = next(line for line in table.splitlines() if line.startswith('| lookhere:lh45 |'))
    assert whole.endswith('| refused |') and whole.count('refused') == 1
    assert '|  | whole + log-n |' in table and table.count('refused') == 3  # + cost table
    rows = list(csv.DictReader((out / 'fov.csv').open()))
    assert sum(bool(r['refused']) for r in rows) == 2
    with pytest.raises(ConfigError, match="--max-memory '8 apples' is not a size"):
        run_study(ladder='fov', max_memory='8 apples', work_dir=str(tmp_path / 'never'))
    assert not (tmp_path / 'never').exists()


def test_a_zoom_report_with_a_test_time_aid(tmp_path):
    report = study_report(0, 50.0)
    report['settings'].update(scales=[1.0, 2.0], modes=['test', 'log_n'])
    report['runs'][0].update(
        eval={'1': {'mIoU': 50.0}, '2': {'mIoU': 40.0}},
        modes={'log_n': {'1': {'mIoU': 50.0}, '2': {'mIoU': 42.0}}},
    )
    out = write_outputs(report, str(tmp_path), 'z')
    assert '| abs | test | 50.00 | 40.00 |' in out['table']
    assert '|  | test + log-n | 50.00 | 42.00 |' in out['table'] and 'cost_table' not in out
    rows = list(csv.DictReader((tmp_path / 'z.csv').open()))
    assert [(r['mode'], r['scale'], r['mIoU']) for r in rows] == [
        ('test', '1', '50.0'),
        ('test', '2', '40.0'),
        ('log_n', '1', '50.0'),
        ('log_n', '2', '42.0'),
    ]
    assert (tmp_path / 'z.png').is_file()


def test_log_n_mode_evaluates_with_the_option_on_and_restores_it(repo_root, tmp_path):
    """The study's ``log_n`` mode predicts with ``log_n_scaling`` on (other predictions than
    ``whole`` on a larger frame, the same on the training crop) and switches it back off."""
    import types

    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    from research.study.runs import evaluate_rung

    init_default_scope('mmseg')
    data = str(tmp_path / 'data')
    cfg = Config.fromfile(str(repo_root / 'configs' / 'study' / 'fov_vit_tiny.py'))
    cfg.merge_from_dict(
        parse_cfg_options(
            [
                f'train_dataloader.dataset.data_root={data}',
                f'val_dataloader.dataset.data_root={data}',
                'fov_scenes.num_train=1',
                'fov_scenes.num_val=2',
                'fov_scenes.scales=(1,2)',
                'model.backbone.num_layers=2',
            ]
        )
    )
    study = study_settings(cfg, scales=[1, 2])
    prepare_data(cfg, study, progress=False)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    with torch.no_grad():  # sharp attention, as after training, so a query scale shows
        for blk in model.backbone.blocks:
            blk.attn.qkv.weight.mul_(6.0)
    runner = types.SimpleNamespace(model=model.eval())
    for scale, differ in ((1, False), (2, True)):
        whole = evaluate_rung(runner, cfg, study, scale, 'whole')
        log_n = evaluate_rung(runner, cfg, study, scale, 'log_n')
        keys = [k for k in whole if k.startswith('IoU.') or k in ('mIoU', 'aAcc')]
        assert ([whole[k] for k in keys] != [log_n[k] for k in keys]) == differ
        assert model.backbone.log_n_scaling is False


# -- below 1x, native aspect, encoding options, learnable slopes, robustness -------------------
def test_native_aspect_scenes_keep_the_task_at_their_own_aspect(tmp_path):
    from research.datasets.relational import aspect_size, aspect_split_name

    settings = dataclasses.replace(SMALL, scales=(0.5, 1.0), aspect_ratios=(0.5, 2.0))
    assert [aspect_size(settings, 1.0, r) for r in (0.5, 2.0, 1.0)] == [
        (32, 16),
        (16, 32),
        (32, 32),
    ]
    assert 'aspect_ratios' not in SMALL.to_json()  # folders written before still match
    root = str(tmp_path / 'rel')
    meta = ensure_relational_dataset(root, settings)
    assert meta['splits'][aspect_split_name(0.5)]['size'] == [16, 16]  # (long, long)
    from PIL import Image

    sizes = [
        Image.open(os.path.join(root, 'img_dir', 'val_aspect_x1', f'{i:05d}.png')).size
        for i in range(3)
    ]
    assert sizes == [(16, 32), (32, 16), (16, 32)]  # (W, H): aspect 0.5, 2, 0.5
    # the same native-aspect scenes at every scale; labels still the quadrant classes
    small = np.asarray(Image.open(os.path.join(root, 'ann_dir', 'val_aspect_x0.5', '00001.png')))
    big = np.asarray(Image.open(os.path.join(root, 'ann_dir', 'val_aspect_x1', '00001.png')))
    assert small.shape == (8, 16)
    assert (big.reshape(8, 2, 16, 2) == small[:, None, :, None]).mean() > 0.9
    # shapes are as large in pixels as in the square image of the same longer side
    square = dataclasses.replace(SMALL, train_size=(64, 64))
    wide = sample_scene(np.random.default_rng(4), square, aspect=2.0)
    _, label = render_scene(wide, aspect_size(square, 1.0, 2.0))
    side = wide.anchor[2] * 2 * 32
    assert 0.12 * 64 - 1 <= side <= 0.18 * 64 + 1 and (label == 1).sum() >= (0.12 * 64 - 1) ** 2
    with pytest.raises(ValueError, match=r'scales \[0.05\] render'):
        dataclasses.replace(SMALL, scales=(0.05, 1.0))


def test_size_multiple_keeps_every_test_image_in_whole_patches(repo_root):
    from mmengine.config import Config

    from research.datasets.relational import aspect_size

    eight = dataclasses.replace(
        SMALL,
        train_size=(64, 64),
        scales=(0.75, 1.0),
        aspect_ratios=(0.75, 4 / 3),
        size_multiple=8,
    )
    # 48 * 3/4 = 36 px would be padded to 40 by the backbone: rounded to 40 (halves up)
    assert aspect_size(eight, 0.75, 0.75) == (48, 40) and aspect_size(eight, 0.75, 4 / 3) == (
        40,
        48,
    )
    assert aspect_size(eight, 1.0, 0.75) == (64, 48)
    assert aspect_size(dataclasses.replace(eight, size_multiple=1), 0.75, 0.75) == (48, 36)
    assert 'size_multiple' not in SMALL.to_json() and eight.to_json()['size_multiple'] == 8
    with pytest.raises(
        ValueError,
        match=r'scale 0.7 renders 45x45 px images, not whole '
        r'multiples of size_multiple=8',
    ):
        dataclasses.replace(eight, scales=(0.7, 1.0))
    with pytest.raises(
        ValueError,
        match=r'scale 0.125 at aspect 0.2 has a shorter side of '
        r'1.6 px, below one size_multiple=8',
    ):
        dataclasses.replace(eight, scales=(0.125, 1.0), aspect_ratios=(0.2,))
    with pytest.raises(ValueError, match='size_multiple must be an int'):
        dataclasses.replace(eight, size_multiple=0)
    # the default study: every square and native-aspect test image is whole 8 px patches
    cfg = Config.fromfile(os.path.join(repo_root, 'configs/study/relational_vit_tiny.py'))
    settings = RelationalSettings(**cfg.relational)
    assert settings.size_multiple == cfg.model.backbone.patch_size == 8
    for scale in settings.scales:
        for aspect in settings.aspect_ratios:
            assert all(side % 8 == 0 for side in aspect_size(settings, scale, aspect))


def test_below_1x_and_native_aspect_rungs():
    from mmengine.config import Config

    pipe = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(2048, 512), keep_ratio=True),
        dict(type='LoadAnnotations'),
    ]
    cfg = Config(
        dict(
            model=dict(backbone=dict(img_size=512)),
            extrapolation=dict(ladder='resize', native_aspect=True),
            val_dataloader=dict(batch_size=4, dataset=dict(type='ADE20KDataset', pipeline=pipe)),
        )
    )
    study = study_settings(cfg, scales=[0.25, 0.5, 1])
    assert study['scales'] == (0.25, 0.5, 1.0) and study['native_aspect']
    assert ladder_dataloader(cfg, study, 0.25)['dataset']['pipeline'][1]['scale'] == (512, 128)
    from research.study.ladders import ladder_modes, native_aspect_dataloader

    assert ladder_modes(study) == ('test', 'native_aspect')
    dl = native_aspect_dataloader(cfg, study, 0.75)
    assert dl['batch_size'] == 1 and dl['dataset']['pipeline'][1] == dict(
        type='Resize', scale=(384, 384), keep_ratio=True
    )
    cfg.extrapolation.ladder = 'rendered'
    study = study_settings(cfg, scales=[0.5])
    assert native_aspect_dataloader(cfg, study, 0.5)['dataset']['data_prefix'] == dict(
        img_path='img_dir/val_aspect_x0.5', seg_map_path='ann_dir/val_aspect_x0.5'
    )
    assert 'native_aspect' not in study_settings(cfg, native_aspect=False)
    with pytest.raises(ValueError, match="native aspect needs a zoom ladder.*'fov'"):
        study_settings(cfg, ladder='fov')
    cfg.relational = dict(num_train=1, num_val=1, train_size=(512, 512))
    cfg.train_dataloader = dict(dataset=dict(data_root='x'))
    with pytest.raises(
        ValueError,
        match='native aspect needs scenes at other aspect ratios: set relational.aspect_ratios',
    ):
        prepare_data(cfg, study)
    rob = study_settings(cfg, robustness=True)['robustness']
    assert rob['attacks'] == ['fgsm', 'pgd'] and rob['steps'] == 5
    cfg.extrapolation.robustness = dict(eps=(3,), attack='x')
    with pytest.raises(ValueError, match="unknown robustness settings \\['attack'\\]"):
        study_settings(cfg, robustness=True)


def test_encoding_options_and_the_learnable_slopes_run(repo_root, tmp_path):
    from mmengine.config import Config
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import init_default_scope
    from mmseg.registry import MODELS

    init_default_scope('mmseg')
    bb = dict(type='LookHereViT', preset='lh180', embed_dims=8)
    opts = dict(pape=dict(parabolas=6))
    assert backbone_for(bb, 'pape', opts)['pos_encoding'] == dict(type='pape', parabolas=6)
    assert backbone_for(bb, 'rope2d', opts)['pos_encoding'] == 'rope2d'
    with pytest.raises(
        ValueError,
        match=r"pape: unknown options \['width'\]; allowed: "
        r"\['parabolas'\]",
    ):
        backbone_for(bb, 'pape', dict(pape=dict(width=2)))
    with pytest.raises(ValueError, match="unknown encoding 'papa'"):
        backbone_for(bb, 'pape', dict(papa={}))
    assert run_specs(
        ['lookhere', 'lookhere:lh45+learnable_slopes', 'alibi2d'], ['learnable_slopes']
    ) == [
        'lookhere+learnable_slopes',
        'lookhere:lh45+learnable_slopes',
        'alibi2d+learnable_slopes',
    ]
    with pytest.raises(
        ValueError,
        match="run 'rope2d\\+learnable_slopes': learnable_slopes "
        "learns the slopes of \\['lookhere', 'alibi2d'\\]",
    ):
        run_specs(['lookhere', 'rope2d'], ['learnable_slopes'])
    cfg = Config.fromfile(str(repo_root / 'configs' / 'study' / 'relational_vit_tiny.py'))
    cfg.model.backbone.num_layers = 2
    fixed = run_config(cfg, 'lookhere:lh45', 0, RunOptions(), str(tmp_path))
    run = run_config(cfg, 'lookhere:lh45+learnable_slopes', 0, RunOptions(), str(tmp_path))
    assert run.model.backbone.preset == 'lh45'
    assert run.model.backbone.lh_config == dict(learnable_slopes=True)
    assert 'lh_config' not in fixed.model.backbone and not fixed.get('custom_hooks')
    assert [h['type'] for h in run.custom_hooks] == ['LookHereSlopeLoggerHook']
    model = MODELS.build(run.model)
    slopes = {id(p) for n, p in model.named_parameters() if '.slopes.' in n}
    assert len(slopes) == 1 + 2 + 2  # global, per layer, per layer's heads

    def decay(optim_cfg):
        wrapper = build_optim_wrapper(model, optim_cfg)
        return {
            g['weight_decay']
            for g in wrapper.optimizer.param_groups
            if any(id(p) in slopes for p in g['params'])
        }

    assert decay(run.optim_wrapper) == {0.0}  # the study config keeps decay off the slopes
    del run.optim_wrapper.paramwise_cfg.custom_keys['slopes']
    assert decay(run.optim_wrapper) == {0.05}  # the constructor would decay them otherwise
    cfg.optim_wrapper.paramwise_cfg.custom_keys.pop('slopes')  # a config without the key
    assert run_config(
        cfg, 'lookhere+learnable_slopes', 0, RunOptions(), str(tmp_path)
    ).optim_wrapper.paramwise_cfg.custom_keys['slopes'] == dict(decay_mult=0.0)
    cfg.model.backbone.lh_config = 'lh45'
    with pytest.raises(ValueError, match="lh_config is 'lh45', not a dict"):
        run_config(cfg, 'lookhere+learnable_slopes', 0, RunOptions(), str(tmp_path))


def test_default_studies_compare_the_new_encodings_at_a_comparable_size(repo_root):
    from mmengine.config import Config
    from mmseg.registry import MODELS

    from research.study.encodings import DEFAULT_ENCODINGS

    assert {'pape', 'rope_dinov3'} <= set(DEFAULT_ENCODINGS)
    cfg = Config.fromfile(str(repo_root / 'configs' / 'study' / 'relational_vit_tiny.py'))
    fov = Config.fromfile(str(repo_root / 'configs' / 'study' / 'fov_vit_tiny.py'))
    assert {'pape', 'rope_dinov3'} <= set(fov.extrapolation.encodings)
    assert 'encodings' not in cfg.extrapolation  # the zoom study uses DEFAULT_ENCODINGS
    study = study_settings(cfg)
    assert study['scales'][0] == 0.5 and study['scales'][-1] == 4 and study['native_aspect']
    assert 'native_aspect' not in study_settings(fov)
    for c in (cfg, fov):
        # learnable slopes set with --cfg-options (not the run spec) get no weight decay
        assert c.optim_wrapper.paramwise_cfg.custom_keys['slopes'] == dict(decay_mult=0.0)
        opts = c.extrapolation.encoding_options

        def params(spec, c=c, opts=opts):
            return sum(
                p.numel()
                for p in MODELS.build(backbone_for(c.model.backbone, spec, opts)).parameters()
            )

        trunk = params('none')
        assert 1.05 < params('pape') / trunk < 1.2, params('pape') / trunk  # 50 would be ~2x
        assert params('rope_dinov3') == trunk


def test_shrunk_study_below_1x_native_aspect_robustness_and_learned_slopes(tmp_path):
    data, out = tmp_path / 'data', tmp_path / 'out'
    report = run_study(
        encodings=['lookhere+learnable_slopes', 'pape'],
        seeds=[3],
        options=RunOptions(iters=2, batch_size=4),
        scales=[0.5, 1],
        work_dir=str(tmp_path / 'work'),
        robustness=True,
        cfg_options=parse_cfg_options(
            [
                f'train_dataloader.dataset.data_root={data}',
                f'val_dataloader.dataset.data_root={data}',
                'relational.num_train=8',
                'relational.num_val=2',
                'relational.train_size=(32,32)',
                'extrapolation.train_size=(32,32)',
                'model.backbone.img_size=(32,32)',
                'model.data_preprocessor.size=(32,32)',
                'model.backbone.num_layers=1',
                'val_dataloader.batch_size=2',
                'extrapolation.robustness.eps=[4]',
                'extrapolation.robustness.steps=1',
            ]
        ),
    )
    write_outputs(report, str(out), 'small')
    settings = report['settings']
    assert settings['modes'] == ['test', 'native_aspect'] and settings['scales'] == [0.5, 1.0]
    assert settings['native_aspect']['aspect_ratios'] == [0.5, 0.75, 4 / 3, 2.0]
    assert settings['encoding_options'] == dict(pape=dict(parabolas=6))
    assert settings['robustness']['eps'] == [4.0] and settings['dataset']['splits']['val_x0.5'][
        'size'
    ] == [16, 16]
    slopes, pape = report['runs']
    for run in report['runs']:
        assert set(run['eval']) == set(run['modes']['native_aspect']) == {'0.5', '1'}
        rob = run['robustness']
        assert set(rob) == {'clean', 'fgsm', 'pgd'} and rob['fgsm']['4']['images'] == 2
        # the attack's clean row is the ladder's 1x evaluation (the same test path)
        scores = {k: v for k, v in run['eval']['1'].items() if k in ('aAcc', 'mIoU', 'mAcc')}
        scores.update({k: v for k, v in run['eval']['1'].items() if k.startswith('IoU.')})
        assert len(scores) > 3 and {k: rob['clean'][k] for k in scores} == scores
        # the zoom rungs are timed and metered like the field-of-view rungs
        assert run['eval']['1']['sec_per_img'] > 0 and run['eval']['1']['peak_mem_mb'] > 0
        assert run['modes']['native_aspect']['1']['images'] > 0
        assert rob['clean']['loss'] < rob['fgsm']['4']['loss']
    assert len(slopes['slopes']['layer']) == 1 and 'slopes' not in pape
    rows = list(csv.DictReader((out / 'small.csv').open()))
    assert {(r['mode'], r['scale'], r['test_h']) for r in rows if r['encoding'] == 'pape'} == {
        ('test', '0.5', '16'),
        ('test', '1', '32'),
        ('native_aspect', '0.5', ''),
        ('native_aspect', '1', ''),
    }
    text = (out / 'small_table.md').read_text()
    assert '| pape | test |' in text and '|  | native aspect |' in text
    assert "longer side the column's scale x 32 px" in text
    assert '| encoding | clean | fgsm 4/255 | fgsm mean | pgd 4/255 | pgd mean |' in text
    assert '| lookhere+learnable_slopes | 3 |' in text  # the learned slopes
    assert report['summary_robustness']['pape']['fgsm']['4']['n'] == 1
    rob_rows = list(csv.DictReader((out / 'small_robustness.csv').open()))
    assert [(r['attack'], r['eps']) for r in rob_rows[:3]] == [
        ('clean', '0'),
        ('fgsm', '4'),
        ('pgd', '4'),
    ]
    assert (out / 'small_robustness.png').stat().st_size > 10_000


def test_the_study_tool_ends_a_wrong_argument_in_one_error_line(tmp_path):
    """``tools/extrapolation_study.py`` under ``run_main``: a mistake is one ``error:`` line
    and status 2 (tracebacks before), before anything trains."""
    import subprocess
    import sys

    from tiny_seg import REPO, env

    cases = {
        ('--encodings', 'lookhere', 'rope'): "error: unknown encoding 'rope'; allowed:",
        ('--metric', 'miou', '--iters', '1'): "error: --metric 'miou': the config's val_",
        ('--merge', str(tmp_path / 'nope.json')): "error: --merge: report '",
    }
    for args, expected in cases.items():
        res = subprocess.run(
            [sys.executable, 'tools/extrapolation_study.py', *args, '--work-dir', str(tmp_path)],
            cwd=REPO,
            env=env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert res.returncode == 2 and 'Traceback' not in res.stderr, res.stderr[-2000:]
        lines = [ln for ln in res.stderr.splitlines() if ln.startswith('error: ')]
        assert len(lines) == 1 and lines[0].startswith(expected), res.stderr[-2000:]


def _study_tool():
    import importlib.util

    from tiny_seg import REPO

    spec = importlib.util.spec_from_file_location(
        'extrapolation_study_tool', os.path.join(REPO, 'tools', 'extrapolation_study.py')
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    'args,expected',
    [  # values once read as "the config's", and a seed twice (two runs in one work dir)
        (['--iters', '0'], 'argument --iters: must be >= 1, got 0'),
        (['--batch-size', '-2'], 'argument --batch-size: must be >= 1, got -2'),
        (['--val-interval', '0'], 'argument --val-interval: must be >= 1, got 0'),
        (['--lr', '0'], 'argument --lr: must be > 0, got 0'),
        (['--lr', 'nan'], 'argument --lr: must be > 0, got nan'),
        (
            ['--seeds', '0', '1', '0'],
            '--seeds 0 1 0: seed 0 is given twice (each seed is one run per encoding, in one '
            'work dir)',
        ),
    ],
)
def test_the_study_tool_refuses_values_it_would_ignore_when_parsing(args, expected, capsys):
    with pytest.raises(SystemExit) as exit_:
        _study_tool().parse_args(args)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f'error: {expected}')


def test_the_study_tool_does_not_replace_another_studys_report(tmp_path):
    """A study takes minutes to hours: ``<out-dir>/<name>.json`` of another command is
    not replaced (its .csv, _table.md and .png went with it); the same command (a rerun)
    replaces its own."""
    from lookhere_dense.errors import ToolError

    tool = _study_tool()
    other = 'python tools/extrapolation_study.py --ladder fov'
    (tmp_path / 'study.json').write_text(json.dumps(dict(command=other)))
    with pytest.raises(ToolError) as err:
        tool.check_outputs(str(tmp_path), 'study', 'python tools/extrapolation_study.py')
    assert str(err.value).startswith(
        f"'{tmp_path}/study.json' is the report of another study ({other}); this one would "
        'replace it and its .csv, _table.md and .png: give it another --name or --out-dir'
    )
    tool.check_outputs(str(tmp_path), 'study', other)  # a rerun
    # a --merge of that report (with others) into its own name: it was read first
    merged = [str(tmp_path / 'study.json'), str(tmp_path / 'seed1.json')]
    tool.check_outputs(str(tmp_path), 'study', 'python x --merge', merged)
    tool.check_outputs(str(tmp_path), 'other_name', 'python tools/extrapolation_study.py')
