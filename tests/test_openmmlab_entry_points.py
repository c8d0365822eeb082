"""OpenMMLab's own entry points on every config family we ship, run with their code, not
ours, in fresh interpreters and in both import orders (``import lookhere_dense`` first, as
a notebook does, and never: the configs' ``custom_imports`` registers).

* mmseg: ``init_model`` / ``inference_model`` (an image path and an ndarray; the prediction
  at the image's size) / ``show_result_pyplot`` (a picture file), ``MMSegInferencer``
  (prediction and visualisation file) -- Segmenter mask and linear, ADE20K and Cityscapes,
  the ``_whole`` variants, UPerNet; mmseg's shipped ``tools/train.py`` and
  ``tools/test.py`` (run from the installed package) on generated data in the real
  layouts;
* mmdet: ``init_detector`` / ``inference_detector`` and ``DetInferencer`` -- Mask R-CNN
  (COCO and Cityscapes).

The shipped configs are used as they are, only shrunk for a CPU (1-3 blocks, small images,
crops and windows; single-process loaders; BN for SyncBN) and dumped with mmengine's
``Config.dump``; weights are random (a checkpoint of the built model, with its
``dataset_meta``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
#: config families: (shipped config, scope)
SEG = [
    'segmenter_lookhere_ade20k.py',
    'segmenter_lookhere_linear_ade20k.py',
    'segmenter_lookhere_cityscapes.py',
    'segmenter_lookhere_cityscapes_whole.py',
    'segmenter_lookhere_linear_cityscapes.py',
    'segmenter_lookhere_linear_cityscapes_whole.py',
    'upernet_lookhere-b16_sfpn_8xb2-160k_ade20k-512x512.py',
    'upernet_lookhere-b16_sfpn_8xb1-80k_cityscapes-512x1024.py',
]
DET = [
    'mask_rcnn_lookhere-b16_sfpn_lsj-1024-100e_coco.py',
    'mask_rcnn_lookhere-b16_sfpn_lsj-1024-24k_cityscapes.py',
]
#: the families trained with mmseg's tools/train.py (the _whole variants test their weights)
TRAINED = {
    'segmenter_lookhere_ade20k.py': None,
    'segmenter_lookhere_linear_ade20k.py': None,
    'segmenter_lookhere_cityscapes.py': None,
    'segmenter_lookhere_cityscapes_whole.py': 'segmenter_lookhere_cityscapes.py',
    'segmenter_lookhere_linear_cityscapes.py': None,
    'segmenter_lookhere_linear_cityscapes_whole.py': 'segmenter_lookhere_linear_cityscapes.py',
    'upernet_lookhere-b16_sfpn_8xb2-160k_ade20k-512x512.py': None,
    'upernet_lookhere-b16_sfpn_8xb1-80k_cityscapes-512x1024.py': None,
}
IMAGE_HW = (96, 160)


def _walk_pipelines(cfg):
    for key in ('train_pipeline', 'test_pipeline'):
        if cfg.get(key):
            yield cfg[key]
    for split in ('train', 'val', 'test'):
        dl = cfg.get(f'{split}_dataloader') or {}
        ds = dl.get('dataset') or {}
        while 'dataset' in ds:  # wrappers
            ds = ds['dataset']
        if ds.get('pipeline'):
            yield ds['pipeline']


def shrink(cfg, data_root: str = '') -> None:
    """The shipped config shrunk for a CPU: fewer blocks, small images / crops / windows,
    BN instead of SyncBN, single-process loaders, 2 training iterations."""
    bb = cfg.model.backbone
    if bb.get('window_size'):
        bb.update(num_layers=3, window_size=4, window_block_indexes=[0, 1], out_indices=(2,))
    else:
        bb.update(num_layers=1, out_indices=-1)
    bb.init_cfg = None
    det = cfg.get('default_scope') == 'mmdet'
    if not det:
        cfg.model.pretrained = None
    crop = (64, 64)
    for pipeline in _walk_pipelines(cfg):
        for t in pipeline:
            if t.get('type') in ('Resize', 'RandomResize'):
                t['scale'] = (128, 128) if det else (256, 64 if 'ade' in str(data_root) else 128)
            if t.get('type') == 'RandomCrop':
                t['crop_size'] = crop
    dp = cfg.model.data_preprocessor
    if dp.get('size'):
        dp['size'] = crop
    for aug in dp.get('batch_augments') or []:
        aug['size'] = (128, 128)
    if cfg.model.get('test_cfg', {}).get('mode') == 'slide':
        cfg.model.test_cfg.update(crop_size=crop, stride=(48, 48))
    for head in ('decode_head', 'auxiliary_head'):
        norm = (cfg.model.get(head) or {}).get('norm_cfg')
        if norm and norm.get('type') == 'SyncBN':
            norm['type'] = 'BN'
    for split in ('train', 'val', 'test'):
        dl = cfg.get(f'{split}_dataloader')
        if dl:
            dl.update(
                batch_size=1 if split != 'train' else 2, num_workers=0, persistent_workers=False
            )
            if data_root:
                dl.dataset.data_root = data_root
    if cfg.get('train_cfg'):
        cfg.train_cfg.update(max_iters=2, val_interval=2)
    cfg.default_hooks.checkpoint.update(interval=2, by_epoch=False)
    cfg.default_hooks.logger.update(interval=1)
    paramwise = cfg.get('optim_wrapper', {}).get('paramwise_cfg') or {}
    if 'num_layers' in paramwise:  # layer-wise lr decay counts the blocks
        paramwise['num_layers'] = bb.num_layers
    if cfg.get('optim_wrapper', {}).get('type') == 'AmpOptimWrapper':  # needs a GPU
        cfg.optim_wrapper.type = 'OptimWrapper'
        cfg.optim_wrapper.pop('loss_scale', None)
    cfg.param_scheduler = []


def _data_root(name: str, datasets: Dict[str, str]) -> str:
    return datasets['cityscapes' if 'cityscapes' in name else 'ade']


@pytest.fixture(scope='module')
def setup(tmp_path_factory) -> Dict[str, Any]:
    """Shrunk configs, random-weight checkpoints (with dataset_meta), generated data and a
    test image."""
    import cv2
    import torch
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from lookhere_dense.swap import model_registry
    from research.datasets.synthetic_seg import (
        make_ade20k_like,
        make_cityscapes_like,
    )

    root = tmp_path_factory.mktemp('entry_points')
    make_ade20k_like(str(root / 'data'), num_train=2, num_val=1)
    make_cityscapes_like(str(root / 'data'), num_train=2, num_val=1)
    datasets = {
        'ade': str(root / 'data' / 'ade' / 'ADEChallengeData2016'),
        'cityscapes': str(root / 'data' / 'cityscapes'),
    }
    out: Dict[str, Any] = {'root': str(root), 'configs': {}, 'datasets': datasets}
    for name in SEG + DET:
        cfg = Config.fromfile(str(REPO / 'configs' / name))
        shrink(cfg, '' if name in DET else _data_root(name, datasets))
        path = root / name
        cfg.dump(str(path))
        scope = cfg.get('default_scope') or 'mmseg'
        init_default_scope(scope)
        torch.manual_seed(0)
        model = model_registry(scope).build(cfg.model)
        n = (
            cfg.model.decode_head.num_classes
            if scope == 'mmseg'
            else cfg.model.roi_head.bbox_head.num_classes
        )
        meta = dict(
            classes=[f'class{i}' for i in range(n)],
            palette=[[(37 * i) % 256, (91 * i) % 256, (53 * i) % 256] for i in range(n)],
        )
        ckpt = root / (name[:-3] + '.pth')
        torch.save({'state_dict': model.state_dict(), 'meta': {'dataset_meta': meta}}, ckpt)
        out['configs'][name] = dict(config=str(path), checkpoint=str(ckpt), scope=scope)
    rng = np.random.default_rng(0)
    img = rng.integers(0, 255, (*IMAGE_HW, 3), dtype=np.uint8)
    out['image'] = str(root / 'image.png')
    cv2.imwrite(out['image'], img)
    return out


SCRIPT = r"""
import json, os, sys
import numpy as np
spec = json.load(open(sys.argv[1]))
order = sys.argv[2]
if order == 'lookhere_dense_first':
    import lookhere_dense                          # a notebook's first line
    import lookhere_dense.lookhere                 # a submodule too: registers nothing
    assert 'mmseg' not in sys.modules and 'mmengine' not in sys.modules, 'not light'
import cv2
img_path = spec['image']
img = cv2.imread(img_path)                         # BGR, as LoadImageFromFile reads it
results = {}
for name, c in spec['configs'].items():
    out_dir = os.path.join(spec['out'], order, name[:-3])
    os.makedirs(out_dir, exist_ok=True)
    r = {}
    if c['scope'] == 'mmseg':
        from mmseg.apis import MMSegInferencer, inference_model, init_model, show_result_pyplot
        model = init_model(c['config'], c['checkpoint'], device='cpu')
        by_path = inference_model(model, img_path)
        by_array = inference_model(model, img)
        r['path_shape'] = list(by_path.pred_sem_seg.data.shape)
        r['array_shape'] = list(by_array.pred_sem_seg.data.shape)
        r['same'] = bool((by_path.pred_sem_seg.data == by_array.pred_sem_seg.data).all())
        r['backbone'] = type(model.backbone).__name__
        pic = os.path.join(out_dir, 'show.png')
        show_result_pyplot(model, img_path, by_path, show=False, out_file=pic)
        r['show_file'] = os.path.getsize(pic)
        inferencer = MMSegInferencer(model=c['config'], weights=c['checkpoint'], device='cpu')
        res = inferencer(img_path, out_dir=out_dir, return_datasamples=True)
        r['inferencer_shape'] = list(res.pred_sem_seg.data.shape)
        vis = os.path.join(out_dir, 'vis')
        r['vis_files'] = sorted(os.listdir(vis)) if os.path.isdir(vis) else []
        if 'nan' not in results:  # float images with NaN pixels: refused by name
            bad = img.astype(np.float32)
            bad[5, 7, 1] = np.nan
            try:
                inference_model(model, bad)
                results['nan'] = 'no error'
            except Exception as err:
                results['nan'] = f'{type(err).__name__}: {err}'
    else:
        from mmdet.apis import DetInferencer, inference_detector, init_detector
        model = init_detector(c['config'], c['checkpoint'], device='cpu')
        det = inference_detector(model, img_path)
        r['backbone'] = type(model.backbone).__name__
        r['img_shape'] = list(det.metainfo['ori_shape'])
        r['has_instances'] = 'pred_instances' in det
        inferencer = DetInferencer(model=c['config'], weights=c['checkpoint'], device='cpu',
                                   show_progress=False)
        res = inferencer(img_path, out_dir=out_dir, no_save_vis=False, pred_score_thr=0.0)
        r['inferencer_predictions'] = len(res['predictions'])
        vis = os.path.join(out_dir, 'vis')
        r['vis_files'] = sorted(os.listdir(vis)) if os.path.isdir(vis) else []
    results[name] = r
print('RESULT ' + json.dumps(results))
"""


def _env() -> Dict[str, str]:
    return dict(
        os.environ,
        PYTHONPATH=str(REPO) + os.pathsep + os.environ.get('PYTHONPATH', ''),
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1',
    )


def _run_script(script: str, args: List[str], cwd: Path) -> Any:
    """Run ``script`` (``python -c``) with ``args`` in ``cwd`` (one thread, the checkout on
    ``PYTHONPATH``) and return its last ``RESULT <json>`` line, parsed; a non-zero exit
    fails the test with the end of the script's stderr."""
    proc = subprocess.run(
        [sys.executable, '-c', script, *args],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('RESULT ')][-1]
    return json.loads(line[len('RESULT ') :])


@pytest.mark.parametrize('order', ['lookhere_dense_first', 'never_imported'])
def test_mmseg_and_mmdet_apis_on_every_config_family(setup, order, tmp_path: Path):
    spec = dict(setup, out=str(tmp_path))
    spec_path = tmp_path / 'spec.json'
    spec_path.write_text(json.dumps(spec))
    results = _run_script(SCRIPT, [str(spec_path), order], tmp_path)
    for name in SEG:
        r = results[name]
        assert r['backbone'] == 'LookHereViT', (name, r)
        assert r['path_shape'] == r['array_shape'] == [1, *IMAGE_HW], (name, r)
        assert r['same'], name  # the path and the ndarray give one prediction
        assert r['show_file'] > 0 and r['inferencer_shape'] == [1, *IMAGE_HW], (name, r)
        assert r['vis_files'] == ['image.png'], (name, r)
    for name in DET:
        r = results[name]
        assert r['backbone'] == 'LookHereViT' and r['has_instances'], (name, r)
        assert r['img_shape'] == list(IMAGE_HW), (name, r)
        assert r['inferencer_predictions'] == 1 and r['vis_files'] == ['image.png'], (name, r)
    assert re.match(
        r'NonFiniteInputError: LookHereViT: the input images hold \d+ NaN / '
        r'infinite values',
        results['nan'],
    ), results['nan']


def _mim_tool(package: str, name: str) -> str:
    import importlib

    path = Path(importlib.import_module(package).__file__).parent / '.mim' / 'tools' / name
    if not path.is_file():
        pytest.fail(f'{package} ships no {path}')
    return str(path)


#: runs mmseg's shipped scripts one after the other in one interpreter (runpy: their own
#: code, as ``python tools/train.py ...`` runs it, without a fresh start per run)
TOOLS_SCRIPT = r"""
import json, runpy, sys, traceback
jobs = json.load(open(sys.argv[1]))
done = {}
for job in jobs:
    sys.argv = [job['script'], *job['args']]
    try:
        runpy.run_path(job['script'], run_name='__main__')
        done[job['name']] = 'ok'
    except SystemExit as err:
        done[job['name']] = 'ok' if err.code in (0, None) else f'exit {err.code}'
    except Exception:
        done[job['name']] = traceback.format_exc()[-3000:]
print('RESULT ' + json.dumps(done))
"""


def test_mmseg_shipped_train_and_test_tools(setup, tmp_path: Path):
    """mmseg's own tools/train.py (2 iterations, validation, checkpoint) and tools/test.py on
    every segmentation family, the scripts of the installed mmseg package run as they are;
    the _whole variants test the weights of their slide configs."""
    train, test = _mim_tool('mmseg', 'train.py'), _mim_tool('mmseg', 'test.py')
    jobs = []
    for name, weights_of in TRAINED.items():
        cfg = setup['configs'][name]['config']
        work = tmp_path / name[:-3]
        if weights_of is None:
            jobs.append(
                dict(name=f'train {name}', script=train, args=[cfg, '--work-dir', str(work)])
            )
        ckpt = tmp_path / (weights_of or name)[:-3] / 'iter_2.pth'
        jobs.append(
            dict(
                name=f'test {name}',
                script=test,
                args=[cfg, str(ckpt), '--work-dir', str(work / 'test')],
            )
        )
    spec = tmp_path / 'jobs.json'
    spec.write_text(json.dumps(jobs))
    done = _run_script(TOOLS_SCRIPT, [str(spec)], tmp_path)
    failed = {k: v for k, v in done.items() if v != 'ok'}
    assert not failed, '\n\n'.join(f'{k}: {v}' for k, v in failed.items())
    assert len(done) == len(jobs)
    for name, weights_of in TRAINED.items():
        if weights_of is None:
            assert (tmp_path / name[:-3] / 'iter_2.pth').is_file(), name
        logs = list((tmp_path / name[:-3] / 'test').glob('*/*.log'))
        assert logs and 'mIoU' in logs[0].read_text(), (name, logs)
