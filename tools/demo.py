#!/usr/bin/env python
"""The end-to-end demo on CPU, in minutes: tiny datasets, train, validate, extrapolation report.

1. writes a tiny ADE20K-layout dataset (and a Cityscapes-layout one) of procedurally drawn
   scenes (``lookhere_dense.data.synthetic_seg``) into ``--data-root``;
2. trains a LookHere ViT-T Segmenter on each with ``tools/train.py`` (mmengine Runner,
   mmseg's IoUMetric validation at the end);
3. runs ``tools/extrapolate.py`` on each checkpoint: mIoU, time and memory at the
   training resolution and far above it, as a table, JSON and PNG;
4. writes ``<work-dir>/demo_summary.json`` with the validation mIoU next to chance
   levels computed from the same validation labels.

Example::

    python tools/demo.py                       # both datasets, 300 iterations each
    python tools/demo.py --datasets ade20k --iters 100
    python tools/demo.py --data-only           # only write the datasets into ./data
"""
from __future__ import annotations

import argparse
import gc
import glob
import json
import os
import os.path as osp
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: Per dataset: config, generator, dataset folder under --data-root, default tests.
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


def chance_levels(label_files: List[str], reduce_zero_label: bool,
                  ignore_index: int = 255) -> Dict[str, float]:
    """Expected mIoU (%) of two label-blind predictors on these label maps, computed the
    way mmseg's IoUMetric averages (over classes with a non-empty union):

    * ``uniform``: every pixel gets one of the K classes present, uniformly at random
      (class c with pixel share p_c: IoU = (p_c / K) / (p_c + 1/K - p_c / K));
    * ``majority``: every pixel gets the most frequent class (IoU = p_max; the other
      present classes 0).
    """
    import cv2

    counts = np.zeros(256, np.int64)
    for f in label_files:
        seg = cv2.imread(f, cv2.IMREAD_UNCHANGED).astype(np.int64)
        if reduce_zero_label:
            seg = np.where(seg == 0, 256, seg - 1)
        seg = seg[(seg != ignore_index) & (seg < 256)]
        counts += np.bincount(seg.ravel(), minlength=256)[:256]
    p = counts[counts > 0] / counts.sum()
    k = len(p)
    uniform = np.mean((p / k) / (p + 1 / k - p / k))
    majority = p.max() / k
    return dict(uniform=100 * float(uniform), majority=100 * float(majority), classes=k)


def _val_miou(log_dir: str) -> float:
    """The last validation mIoU a Runner wrote to ``<log_dir>/vis_data/scalars.json``."""
    last = None
    with open(osp.join(log_dir, 'vis_data', 'scalars.json')) as f:
        for line in f:
            rec = json.loads(line)
            if 'mIoU' in rec:
                last = float(rec['mIoU'])
    if last is None:
        raise RuntimeError(f'no validation mIoU in {log_dir}: did training validate?')
    return last


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--datasets', nargs='+', choices=sorted(DEMOS),
                        default=['ade20k', 'cityscapes'], help='which demos to run (default: both)')
    parser.add_argument('--data-root', default='data',
                        help='folder for the generated datasets (default: data, where the '
                        'configs look)')
    parser.add_argument('--work-dir', default='work_dirs/demo',
                        help='folder for checkpoints, logs and reports (default: %(default)s)')
    parser.add_argument('--iters', type=int, default=300,
                        help='training iterations per dataset (default: 300)')
    parser.add_argument('--num-train', type=int, default=None,
                        help='training images to generate (default: 96 ADE20K, 48 Cityscapes)')
    parser.add_argument('--num-val', type=int, default=None,
                        help='validation images to generate (default: 16 ADE20K, 8 Cityscapes)')
    parser.add_argument('--tests', nargs='+', default=None, metavar='MODE@SIZE',
                        help='extrapolation tests (default: per dataset, see tools/extrapolate.py)')
    parser.add_argument('--regenerate', action='store_true',
                        help='rewrite the datasets even if they exist')
    parser.add_argument('--data-only', action='store_true',
                        help='only write the datasets, then stop')
    parser.add_argument('--threads', type=int, default=1,
                        help='CPU threads for PyTorch ops (default: 1, which is the fastest '
                        'for these tiny models on a busy 2-core machine; 0: PyTorch\'s choice)')
    parser.add_argument('--cfg-options', nargs='+', default=[], metavar='KEY=VALUE',
                        help='extra --cfg-options for training (e.g. to shrink the model '
                        'in tests)')
    return parser.parse_args(argv)


def _generate(name: str, args: argparse.Namespace) -> str:
    from lookhere_dense.data.synthetic_seg import make_ade20k_like, make_cityscapes_like

    root = osp.join(args.data_root, DEMOS[name]['folder'])
    if osp.isdir(root) and not args.regenerate:
        print(f'[demo] {name}: using the existing dataset in {root} (--regenerate rewrites it)')
        return root
    kw = {k: v for k, v in (('num_train', args.num_train), ('num_val', args.num_val))
          if v is not None}
    t0 = time.time()
    make = make_ade20k_like if name == 'ade20k' else make_cityscapes_like
    root = str(make(args.data_root, **kw))
    print(f'[demo] {name}: wrote a tiny dataset in {root} ({time.time() - t0:.1f} s)')
    return root


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the demo; returns the summary."""
    from lookhere_dense.cli import quiet_known_warnings
    quiet_known_warnings()
    args = parse_args(argv)
    roots = {name: _generate(name, args) for name in args.datasets}
    if args.data_only:
        return dict(data=roots)

    import lookhere_dense
    lookhere_dense.register_all_modules()
    from lookhere_dense.cli import apply_threads, load_tool
    apply_threads(args.threads or None)
    train, extrapolate = load_tool('train'), load_tool('extrapolate')

    summary: Dict[str, Any] = dict(iters=args.iters, datasets={})
    for name in args.datasets:
        demo = DEMOS[name]
        # relative when run from the repository root, so the reports name it portably
        cfg_path = demo['config'] if osp.isfile(demo['config']) else str(REPO / demo['config'])
        work = osp.join(args.work_dir, name)
        roots_opts = [f'{split}_dataloader.dataset.data_root={roots[name]}'
                      for split in ('train', 'val', 'test')]
        iters = [f'train_cfg.max_iters={args.iters}', f'train_cfg.val_interval={args.iters}',
                 f'default_hooks.checkpoint.interval={args.iters}']
        t0 = time.time()
        print(f'[demo] {name}: training {args.iters} iterations with tools/train.py', flush=True)
        runner = train.main([cfg_path, '--work-dir', work, '--cfg-options', *roots_opts,
                             *iters, *args.cfg_options])
        log_dir = runner.log_dir
        del runner  # frees the model, optimizer and dataloader workers before the report
        gc.collect()
        train_s = time.time() - t0
        ckpt = osp.join(work, f'iter_{args.iters}.pth')
        tests = args.tests or demo['tests']
        t0 = time.time()
        print(f'[demo] {name}: extrapolation report with tools/extrapolate.py', flush=True)
        report = extrapolate.main([cfg_path, ckpt, '--out-dir', work, '--tests', *tests,
                                   '--cfg-options', *roots_opts, *args.cfg_options])
        labels = sorted(glob.glob(osp.join(roots[name], demo['val_labels'])))
        summary['datasets'][name] = dict(
            config=demo['config'], checkpoint=ckpt, train_seconds=round(train_s, 1),
            report_seconds=round(time.time() - t0, 1), val_mIoU=_val_miou(log_dir),
            chance=chance_levels(labels, demo['reduce_zero_label']),
            report_json=report['json'], report_png=report['png'], rows=report['rows'])
    os.makedirs(args.work_dir, exist_ok=True)
    path = osp.join(args.work_dir, 'demo_summary.json')
    with open(path, 'w') as f:
        json.dump(summary, f, indent=2)
    print('\n[demo] summary')
    for name, d in summary['datasets'].items():
        c = d['chance']
        print(f"  {name}: validation mIoU {d['val_mIoU']:.2f} after {args.iters} iterations "
              f"({d['train_seconds']:.0f} s); chance {c['uniform']:.2f} (uniform over the "
              f"{c['classes']} classes present), {c['majority']:.2f} (majority class); "
              f"report {d['report_png']}")
    print(f'  written: {path}')
    return summary


if __name__ == '__main__':
    from lookhere_dense.cli import run_main
    run_main(main)
