"""What the tools do, end to end and shrunk, through the package functions they call
(:mod:`lookhere_dense.apis`): the demo writes both tiny datasets, trains a (2-layer)
LookHere Segmenter on each through the real mmengine Runner, validates with IoUMetric and
runs the extrapolation report. Training again, testing and inference then use its
checkpoints. Everything runs once per module. The tools' command lines are tested in
``test_tools_cli.py``."""

from __future__ import annotations

import glob
import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
from tiny_seg import ADE_CFG, SHRINK
from tiny_seg import options as _opts
from tiny_seg import roots as _roots

from lookhere_dense.apis.cli import run_main
from lookhere_dense.apis.inference import list_images, segment_images
from lookhere_dense.apis.test import evaluate_checkpoint
from lookhere_dense.apis.train import train_model
from research.chance import chance_levels
from research.demo import STAMP, generate_dataset, run_demo

ITERS = 3


# one PyTorch thread for the whole module (see conftest.one_torch_thread)
pytestmark = pytest.mark.usefixtures('one_torch_thread')


@pytest.fixture(scope='module')
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp('demo')
    data, work = root / 'data', root / 'work'
    roots = {
        name: generate_dataset(name, str(data), num_train=4, num_val=2)
        for name in ('ade20k', 'cityscapes')
    }
    summary = run_demo(
        roots, str(work), ITERS, tests=['slide@x1', 'whole@x1', 'whole@x2'], cfg_options=SHRINK
    )
    return dict(
        summary=summary,
        data=data,
        work=work,
        ade_root=data / 'ade' / 'ADEChallengeData2016',
        ckpt=str(work / 'ade20k' / f'iter_{ITERS}.pth'),
    )


def test_demo_trains_validates_and_reports_both_datasets(demo):
    summary = demo['summary']
    assert set(summary['datasets']) == {'ade20k', 'cityscapes'}
    for d in summary['datasets'].values():
        assert osp.isfile(d['checkpoint'])
        assert 0.0 <= d['val_mIoU'] <= 100.0  # IoUMetric ran at the end of training
        assert 0.0 < d['chance']['uniform'] < 100.0 and d['chance']['classes'] >= 3
        assert osp.isfile(d['report_png']) and osp.getsize(d['report_png']) > 10_000
        rows = json.load(open(d['report_json']))['rows']
        assert [r['test'] for r in rows] == ['slide@x1', 'whole@x1', 'whole@x2']
        assert rows[2]['grid_h'] * rows[2]['grid_w'] > 3 * rows[1]['grid_h'] * rows[1]['grid_w']
        assert all(r['images'] == 2 and r['sec_per_img'] > 0 for r in rows)
    city = summary['datasets']['cityscapes']['rows']
    assert (city[1]['input_h'], city[1]['input_w']) == (128, 256)  # the whole frame
    assert (city[2]['input_h'], city[2]['input_w']) == (256, 512)
    assert (city[0]['grid_h'], city[0]['grid_w']) == (6, 6)  # 96 px windows
    assert osp.isfile(demo['work'] / 'demo_summary.json')
    view = summary['datasets']['cityscapes']['fov_view']  # whole frame vs slide
    assert '| slide@x1 |' in view['table'] and '| whole@x1 |' in view['table']
    assert osp.getsize(view['png']) > 10_000
    assert 'fov_view' not in summary['datasets']['ade20k']
    env = summary['environment']
    assert env['torch_threads'] == 1 and env['torch'] and env['numpy'] and env['cpu']
    import torch

    assert env['cpu_capability'] == torch.backends.cpu.get_cpu_capability()  # AVX2, AVX512


def _files(root) -> dict:
    return {
        osp.relpath(p, root): open(p, 'rb').read()
        for p in sorted(glob.glob(osp.join(str(root), '**', '*.*'), recursive=True))
    }


def test_demo_gives_the_same_numbers_on_every_run(demo, tmp_path):
    """A second tiny run -- data written anew into another folder, another work dir --
    reproduces the first one's data byte for byte and its metrics exactly."""
    data = tmp_path / 'data'
    root = generate_dataset('cityscapes', str(data), num_train=4, num_val=2)
    assert _files(root) == _files(demo['data'] / 'cityscapes')
    assert (
        json.load(open(osp.join(root, STAMP)))['sha256']
        == demo['summary']['datasets']['cityscapes']['data_sha256']
    )
    summary = run_demo(
        {'cityscapes': root},
        str(tmp_path / 'work'),
        ITERS,
        tests=['slide@x1', 'whole@x1'],
        cfg_options=SHRINK,
    )  # the fov view
    first = demo['summary']['datasets']['cityscapes']
    second = summary['datasets']['cityscapes']
    assert second['val_mIoU'] == first['val_mIoU']
    keys = ('test', 'mIoU', 'aAcc', 'mAcc', 'input_h', 'input_w', 'grid_h', 'grid_w')
    assert [{k: r[k] for k in keys} for r in second['rows']] == [
        {k: r[k] for k in keys} for r in first['rows'][:2]
    ]
    assert second['fov_view']['table'].splitlines()[2:4] != []
    import torch

    a = torch.load(first['checkpoint'], map_location='cpu', weights_only=False)['state_dict']
    b = torch.load(second['checkpoint'], map_location='cpu', weights_only=False)['state_dict']
    assert all(torch.equal(a[k], b[k]) for k in a if isinstance(a[k], torch.Tensor))


def test_demo_data_are_reused_only_with_the_same_stamp(tmp_path, capsys):
    from research.demo import DemoDataError

    logs = []
    root = generate_dataset('cityscapes', str(tmp_path), num_train=2, num_val=3, log=logs.append)
    vals = osp.join(root, 'gtFine', 'val', '*', '*.png')
    assert len(glob.glob(vals)) == 3 and 'wrote' in logs[-1]
    generate_dataset('cityscapes', str(tmp_path), num_train=2, num_val=3, log=logs.append)
    assert 'using the dataset' in logs[-1]
    first = sorted(glob.glob(vals))[0]
    original = open(first, 'rb').read()
    with open(first, 'ab') as f:
        f.write(b'x')  # a changed file is not reused
    generate_dataset('cityscapes', str(tmp_path), num_train=2, num_val=3, log=logs.append)
    assert 'changed since the demo wrote them' in logs[-2] and 'wrote' in logs[-1]
    assert open(first, 'rb').read() == original
    generate_dataset('cityscapes', str(tmp_path), num_train=2, num_val=1, log=logs.append)
    assert 'wrote' in logs[-1] and len(glob.glob(vals)) == 1  # no stale images left
    assert json.load(open(osp.join(root, STAMP)))['settings']['num_val'] == 1
    os.remove(osp.join(root, STAMP))
    err = _error_of(lambda: generate_dataset('cityscapes', str(tmp_path), log=logs.append), capsys)
    assert 'exists but was not written by this demo' in err and '--data-root' in err
    assert len(glob.glob(vals)) == 1  # a folder without a stamp is never touched
    with pytest.raises(DemoDataError):
        generate_dataset('cityscapes', str(tmp_path), regenerate=True, log=logs.append)


def test_chance_levels_match_a_hand_computation(tmp_path):
    chance = chance_levels
    seg = np.zeros((10, 10), np.uint8)
    seg[:, :3] = 1  # shares: class 0: 0.7, class 1: 0.3
    seg[0, 0] = 255  # ignored
    path = str(tmp_path / 'a.png')
    cv2.imwrite(path, seg)
    c = chance([path], reduce_zero_label=False)
    p = np.array([70, 29]) / 99
    expected = np.mean((p / 2) / (p + 0.5 - p / 2)) * 100
    assert c['classes'] == 2 and abs(c['uniform'] - expected) < 1e-6
    assert abs(c['majority'] - 100 * p[0] / 2) < 1e-6
    # reduce_zero_label: 0 and 255 are ignored (mmseg maps 255 back to 255; it was class 254)
    cv2.imwrite(path, np.array([[1, 1, 255, 255], [0, 0, 1, 1]], np.uint8))
    c = chance([path], reduce_zero_label=True)
    assert c == dict(uniform=100.0, majority=100.0, classes=1)


def test_resume_continues_from_the_last_checkpoint(demo, tmp_path):
    import shutil

    work = tmp_path / 'resume'
    shutil.copytree(demo['work'] / 'ade20k', work)
    runner = train_model(
        ADE_CFG,
        work_dir=str(work),
        resume='auto',
        cfg_options=_opts(
            *_roots(demo['ade_root']),
            *SHRINK,
            f'train_cfg.max_iters={ITERS + 2}',
            f'train_cfg.val_interval={ITERS + 2}',
        ),
    )
    assert runner.iter == ITERS + 2
    assert osp.isfile(work / f'iter_{ITERS + 2}.pth')
    logs = sorted(glob.glob(str(work / '*' / '*.log')))
    assert any(f'resumed epoch: 0, iter: {ITERS}' in open(p).read() for p in logs)


def test_test_tool_scores_and_writes_predictions(demo, tmp_path):
    out, show = tmp_path / 'preds', tmp_path / 'vis'
    metrics = evaluate_checkpoint(
        ADE_CFG,
        demo['ckpt'],
        work_dir=str(tmp_path / 'w'),
        out=str(out),
        show_dir=str(show),
        cfg_options=_opts(*_roots(demo['ade_root']), *SHRINK, 'model.test_cfg.mode=whole'),
    )
    assert 0.0 <= metrics['mIoU'] <= 100.0
    preds = sorted(glob.glob(str(out / '*.png')))
    assert len(preds) == 2
    img = cv2.imread(str(demo['ade_root'] / 'images' / 'validation' / 'ADE_val_00000001.jpg'))
    assert cv2.imread(preds[0], cv2.IMREAD_UNCHANGED).shape == img.shape[:2]
    assert len(glob.glob(str(show / '**' / '*.png'), recursive=True)) == 2


def test_test_tool_needs_no_training_data_and_loads_the_checkpoint_under_tta(demo, tmp_path):
    """Two failures of ``tools/test.py`` with the run's own checkpoint: ``--show-dir``
    where the training split is absent (mmseg's visualization hook reads ``runner.iter``,
    which built the train loop and its dataset: "No such file ... images/training"), and
    ``--tta`` (the checkpoint check compared the file with the TTA wrapper's keys,
    ``module.backbone...``: "has none of the model's keys")."""
    show = tmp_path / 'vis'
    metrics = evaluate_checkpoint(
        ADE_CFG,
        demo['ckpt'],
        work_dir=str(tmp_path / 'w'),
        show_dir=str(show),
        tta=True,
        cfg_options=_opts(
            f'test_dataloader.dataset.data_root={demo["ade_root"]}',
            f'train_dataloader.dataset.data_root={tmp_path / "no_training_data"}',
            *SHRINK,
            'model.test_cfg.mode=whole',
        ),
    )
    assert 0.0 <= metrics['mIoU'] <= 100.0
    assert len(glob.glob(str(show / '**' / '*.png'), recursive=True)) == 2


def test_infer_writes_overlays_at_any_resolution(demo, tmp_path):
    folder = demo['ade_root'] / 'images' / 'validation'
    out = tmp_path / 'overlays'
    result = segment_images(
        ADE_CFG,
        demo['ckpt'],
        str(folder),
        out_dir=str(out),
        whole=True,
        size=(320, 400),
        save_labels=True,
        cfg_options=_opts(*SHRINK),
    )
    written = result.paths
    import torch

    assert result.mode == 'whole'
    assert result.device == ('cuda' if torch.cuda.is_available() else 'cpu')
    assert len(written) == 2
    src = cv2.imread(str(folder / 'ADE_val_00000001.jpg'))
    ov = cv2.imread(str(out / 'ADE_val_00000001.png'))
    labels = cv2.imread(str(out / 'ADE_val_00000001_labels.png'), cv2.IMREAD_UNCHANGED)
    assert ov.shape == src.shape and labels.shape == src.shape[:2]
    assert not np.array_equal(ov, src)  # colours were blended in
    # what the model saw of the first image: --size's, which tools/infer.py's last line names
    assert result.sizes == (src.shape[:2], (320, 400))
    not_an_image = tmp_path / 'notes.jpg'
    not_an_image.write_text('not an image')
    with pytest.raises(FileNotFoundError, match='is not an image OpenCV can read'):
        list_images(str(not_an_image))
    # Cityscapes' leftImg8bit/val: one folder per city, the images inside
    city = tmp_path / 'leftImg8bit' / 'val' / 'frankfurt'
    city.mkdir(parents=True)
    cv2.imwrite(str(city / 'frankfurt_000000_000294_leftImg8bit.png'), src)
    with pytest.raises(FileNotFoundError) as err:
        list_images(str(city.parent))
    assert str(err.value).endswith(
        "its subfolders hold 1 (e.g. 'frankfurt/frankfurt_000000_000294_leftImg8bit.png', "
        f'as Cityscapes keeps one folder per city): give a folder of images, e.g. '
        f'{str(city)!r} (folders are not searched recursively)'
    )
    assert list_images(str(city)) == [str(city / 'frankfurt_000000_000294_leftImg8bit.png')]
    slide = segment_images(
        ADE_CFG,
        demo['ckpt'],
        str(folder / 'ADE_val_00000002.jpg'),
        out_dir=str(out / 'slide'),
        slide=True,
        crop=(128, 128),
        stride=(96, 96),
        native=True,
        cfg_options=_opts(*SHRINK),
    )
    one = slide.paths
    assert slide.mode == 'slide'
    assert slide.sizes[0] == slide.sizes[1]  # --native: the image's own size
    assert len(one) == 1 and osp.isfile(one[0])


def _error_of(call, capsys) -> str:
    """The one ``error: ...`` line :func:`run_main` (what every tool runs in) prints for
    the mistake ``call()`` raises, exiting with status 2 without a traceback."""
    with pytest.raises(SystemExit) as exc:
        run_main(lambda argv: call(), None)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert 'Traceback' not in err
    lines = [ln for ln in err.splitlines() if ln.startswith('error: ')]
    assert len(lines) == 1, err
    return lines[0]


def test_train_errors_say_what_to_fix(demo, tmp_path, capsys):
    err = _error_of(
        lambda: train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'a'),
            cfg_options=_opts(*_roots(tmp_path / 'missing'), *SHRINK),
        ),
        capsys,
    )
    assert 'not found' in err and 'missing' in err and 'ADE20K layout' in err
    err = _error_of(
        lambda: train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'b'),
            cfg_options=_opts(
                *_roots(demo['ade_root']), *SHRINK, 'model.backbone.type=VisionTransfomer'
            ),
        ),
        capsys,
    )
    assert "'VisionTransfomer' is not a registered model" in err and 'VisionTransformer' in err
    err = _error_of(
        lambda: train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'c'),
            amp=True,
            amp_dtype='float16',
            cfg_options=_opts(*_roots(demo['ade_root']), *SHRINK),
        ),
        capsys,
    )
    assert '--amp-dtype=float16 on CPU' in err and 'use bfloat16' in err


def test_label_error_inside_training_is_reported_cleanly(demo, tmp_path, capsys):
    """Past the pre-flight scan (skipped here), the CheckSegLabels transform in the
    pipeline stops training at the first bad annotation with the same message."""
    import shutil

    root = tmp_path / 'ade'
    shutil.copytree(demo['ade_root'], root)
    for path in glob.glob(str(root / 'annotations' / 'training' / '*.png')):
        seg = cv2.imread(path, cv2.IMREAD_UNCHANGED)
        seg[0, 0] = 180
        cv2.imwrite(path, seg)
    err = _error_of(
        lambda: train_model(
            ADE_CFG,
            work_dir=str(tmp_path / 'w'),
            check_data=False,
            cfg_options=_opts(*_roots(root), *SHRINK),
        ),
        capsys,
    )
    assert 'label values [179]' in err and 'outside the classes 0..149' in err
