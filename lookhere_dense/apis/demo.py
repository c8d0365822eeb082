"""The end-to-end demo on CPU (``tools/demo.py``): tiny datasets, train, validate,
extrapolation report.

1. :func:`generate_dataset` writes a tiny ADE20K-layout dataset (and a Cityscapes-layout
   one) of procedurally drawn scenes (:mod:`lookhere_dense.data.synthetic_seg`);
2. :func:`run_demo` trains a LookHere ViT-T Segmenter on each
   (:func:`lookhere_dense.apis.train.train_model`: mmengine Runner, mmseg's IoUMetric
   validation at the end), runs the extrapolation report on each checkpoint
   (:func:`lookhere_dense.evaluation.extrapolation.extrapolation_report`) and writes
   ``<work_dir>/demo_summary.json`` with the validation mIoU next to chance levels
   (:func:`lookhere_dense.evaluation.chance.chance_levels`) of the same validation labels.
"""
from __future__ import annotations

import functools
import gc
import glob
import json
import os
import os.path as osp
import time
from typing import Any, Callable, Dict, Optional, Sequence

__all__ = ['DEMOS', 'generate_dataset', 'last_val_miou', 'run_demo']

#: Per dataset: config, dataset folder under the data root, validation labels (glob),
#: how the labels are read, default extrapolation tests.
DEMOS: Dict[str, Dict[str, Any]] = {
    'ade20k': dict(
        config='configs/segmenter_lookhere_vit-t_tiny-ade.py',
        folder='ade/ADEChallengeData2016',
        val_labels='annotations/validation/*.png', reduce_zero_label=True,
        tests=['slide@x1', 'whole@x1', 'whole@x1.5', 'whole@x2', 'whole@x3']),
    'cityscapes': dict(
        config='configs/segmenter_lookhere_vit-t_tiny-cityscapes.py',
        folder='cityscapes',
        val_labels='gtFine/val/*/*_gtFine_labelTrainIds.png', reduce_zero_label=False,
        tests=['slide@x1', 'whole@x1', 'whole@x2']),
}

_print = functools.partial(print, flush=True)


def generate_dataset(name: str, data_root: str, num_train: Optional[int] = None,
                     num_val: Optional[int] = None, regenerate: bool = False,
                     log: Callable[[str], None] = _print) -> str:
    """Write the tiny dataset of demo ``name`` into ``data_root`` (kept if it is already
    there, unless ``regenerate``).

    Args:
        name: a key of :data:`DEMOS`.
        data_root: folder the configs' ``data_root`` live in (``data``).
        num_train / num_val: images to generate. Default: None (96 / 16 ADE20K, 48 / 8
            Cityscapes).
        regenerate: rewrite an existing dataset. Default: False.
        log: progress lines. Default: print.

    Returns:
        The dataset's root folder.
    """
    from lookhere_dense.data.synthetic_seg import make_ade20k_like, make_cityscapes_like

    root = osp.join(data_root, DEMOS[name]['folder'])
    if osp.isdir(root) and not regenerate:
        log(f'[demo] {name}: using the existing dataset in {root} (--regenerate rewrites it)')
        return root
    kw = {k: v for k, v in (('num_train', num_train), ('num_val', num_val)) if v is not None}
    t0 = time.time()
    make = make_ade20k_like if name == 'ade20k' else make_cityscapes_like
    root = str(make(data_root, **kw))
    log(f'[demo] {name}: wrote a tiny dataset in {root} ({time.time() - t0:.1f} s)')
    return root


def last_val_miou(log_dir: str) -> float:
    """The last validation mIoU a Runner wrote to ``<log_dir>/vis_data/scalars.json``.

    Raises:
        RuntimeError: the run never validated.
    """
    last = None
    with open(osp.join(log_dir, 'vis_data', 'scalars.json')) as f:
        for line in f:
            rec = json.loads(line)
            if 'mIoU' in rec:
                last = float(rec['mIoU'])
    if last is None:
        raise RuntimeError(f'no validation mIoU in {log_dir}: did training validate?')
    return last


def run_demo(roots: Dict[str, str], work_dir: str = 'work_dirs/demo', iters: int = 300,
             tests: Optional[Sequence[str]] = None, cfg_options: Sequence[str] = (),
             log: Callable[[str], None] = _print) -> Dict[str, Any]:
    """Train, validate and report every demo of ``roots``; write
    ``<work_dir>/demo_summary.json``.

    Args:
        roots: ``{demo name: dataset root}`` (:func:`generate_dataset`).
        work_dir: checkpoints, logs and reports (``<work_dir>/<name>``). Default:
            ``'work_dirs/demo'``.
        iters: training iterations per dataset. Default: 300.
        tests: extrapolation tests. Default: None (the demo's own, :data:`DEMOS`).
        cfg_options: extra ``KEY=VALUE`` overrides for training and the report (e.g. to
            shrink the model in tests). Default: none.
        log: progress lines. Default: print.

    Returns:
        The summary (``iters``, ``datasets: {name: {config, checkpoint, train_seconds,
        report_seconds, val_mIoU, chance, report_json, report_png, rows}}``), as written.
    """
    import lookhere_dense
    lookhere_dense.register_all_modules()

    from lookhere_dense.cli import REPO, parse_cfg_options
    from lookhere_dense.evaluation.chance import chance_levels
    from lookhere_dense.evaluation.extrapolation import extrapolation_report

    from .train import train_model

    summary: Dict[str, Any] = dict(iters=iters, datasets={})
    for name, root in roots.items():
        demo = DEMOS[name]
        # relative when run from the repository root, so the reports name it portably
        cfg_path = demo['config'] if osp.isfile(demo['config']) \
            else osp.join(REPO, demo['config'])
        work = osp.join(work_dir, name)
        roots_opts = [f'{split}_dataloader.dataset.data_root={root}'
                      for split in ('train', 'val', 'test')]
        iter_opts = [f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
                     f'default_hooks.checkpoint.interval={iters}']
        t0 = time.time()
        log(f'[demo] {name}: training {iters} iterations with tools/train.py')
        runner = train_model(cfg_path, work_dir=work, cfg_options=parse_cfg_options(
            [*roots_opts, *iter_opts, *cfg_options]))
        log_dir = runner.log_dir
        del runner  # frees the model, optimizer and dataloader workers before the report
        gc.collect()
        train_s = time.time() - t0
        ckpt = osp.join(work, f'iter_{iters}.pth')
        demo_tests = list(tests or demo['tests'])
        t0 = time.time()
        log(f'[demo] {name}: extrapolation report with tools/extrapolate.py')
        report_opts = [*roots_opts, *cfg_options]
        report = extrapolation_report(
            cfg_path, ckpt, demo_tests, out_dir=work,
            cfg_options=parse_cfg_options(report_opts),
            command='python tools/extrapolate.py ' + ' '.join(
                [cfg_path, ckpt, '--out-dir', work, '--tests', *demo_tests, '--cfg-options',
                 *report_opts]))
        labels = sorted(glob.glob(osp.join(root, demo['val_labels'])))
        summary['datasets'][name] = dict(
            config=demo['config'], checkpoint=ckpt, train_seconds=round(train_s, 1),
            report_seconds=round(time.time() - t0, 1), val_mIoU=last_val_miou(log_dir),
            chance=chance_levels(labels, demo['reduce_zero_label']),
            report_json=report['json'], report_png=report['png'], rows=report['rows'])
    os.makedirs(work_dir, exist_ok=True)
    path = osp.join(work_dir, 'demo_summary.json')
    with open(path, 'w') as f:
        json.dump(summary, f, indent=2)
    return summary
