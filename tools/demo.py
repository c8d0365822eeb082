#!/usr/bin/env python
"""The end-to-end demo on CPU, in minutes: tiny datasets, train, validate, extrapolation report.

1. writes a tiny ADE20K-layout dataset (and a Cityscapes-layout one) of procedurally drawn
   scenes (``research.datasets.synthetic_seg``) into ``--data-root``;
2. trains a LookHere ViT-T Segmenter on each as ``tools/train.py`` does (mmengine Runner,
   mmseg's IoUMetric validation at the end);
3. runs the extrapolation report of ``tools/extrapolate.py`` on each checkpoint: mIoU, time
   and memory at the training resolution and far above it, as a table, JSON and PNG; for
   the Cityscapes layout also the field-of-view view (``fov_view.md/.json/.png``): the
   whole frame in one pass vs sliding windows of the training crop, same pixel scale;
4. writes ``<work-dir>/demo_summary.json`` with the validation mIoU next to chance
   levels computed from the same validation labels, and the environment (versions,
   threads, CPU, commit).

The same command gives the same numbers on every run on one machine: the data come from
fixed seeds (a folder is reused only when its stamp says it was written with the same
settings), training is seeded (data order, augmentation, dataloader workers) and runs on
``--threads`` PyTorch threads.

Example::

    python tools/demo.py                       # both datasets, 300 iterations each
    python tools/demo.py --datasets ade20k --iters 100
    python tools/demo.py --data-only           # only write the datasets into ./data

The steps are :mod:`research.demo`.
"""

from __future__ import annotations

import argparse
import os.path as osp
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from research.demo import DEMOS  # noqa: E402


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--datasets',
        nargs='+',
        choices=sorted(DEMOS),
        default=['ade20k', 'cityscapes'],
        help='which demos to run (default: both)',
    )
    parser.add_argument(
        '--data-root',
        default='data',
        help='folder for the generated datasets (default: data, where the configs look)',
    )
    parser.add_argument(
        '--work-dir',
        default='work_dirs/demo',
        help='folder for checkpoints, logs and reports (default: %(default)s)',
    )
    parser.add_argument(
        '--iters', type=int, default=300, help='training iterations per dataset (default: 300)'
    )
    parser.add_argument(
        '--num-train',
        type=int,
        default=None,
        help='training images to generate (default: 96 ADE20K, 48 Cityscapes)',
    )
    parser.add_argument(
        '--num-val',
        type=int,
        default=None,
        help='validation images to generate (default: 16 ADE20K, 8 Cityscapes)',
    )
    parser.add_argument(
        '--tests',
        nargs='+',
        default=None,
        metavar='MODE@SIZE',
        help='extrapolation tests (default: per dataset, see tools/extrapolate.py)',
    )
    parser.add_argument(
        '--regenerate',
        action='store_true',
        help="rewrite the demo's datasets even if their stamp matches "
        '(a folder the demo did not write is never touched)',
    )
    parser.add_argument(
        '--data-only', action='store_true', help='only write the datasets, then stop'
    )
    parser.add_argument(
        '--threads',
        type=int,
        default=1,
        help='CPU threads for PyTorch ops (default: 1, which is the fastest '
        "for these tiny models on a busy 2-core machine; 0: PyTorch's choice)",
    )
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        default=[],
        metavar='KEY=VALUE',
        help='extra --cfg-options for training (e.g. to shrink the model in tests)',
    )
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run the demo; returns the summary."""
    from lookhere_dense.apis.cli import quiet_known_warnings

    quiet_known_warnings()
    from research.demo import generate_dataset, run_demo

    args = parse_args(argv)
    roots = {
        name: generate_dataset(
            name, args.data_root, args.num_train, args.num_val, args.regenerate, log=print
        )
        for name in args.datasets
    }
    if args.data_only:
        return dict(data=roots)

    import lookhere_dense

    lookhere_dense.register_all_modules()
    from lookhere_dense.apis.cli import apply_threads

    apply_threads(args.threads or None)
    summary = run_demo(roots, args.work_dir, args.iters, args.tests, args.cfg_options)
    print('\n[demo] summary')
    for name, d in summary['datasets'].items():
        c = d['chance']
        print(
            f'  {name}: validation mIoU {d["val_mIoU"]:.2f} after {args.iters} iterations '
            f'({d["train_seconds"]:.0f} s); chance {c["uniform"]:.2f} (uniform over the '
            f'{c["classes"]} classes present), {c["majority"]:.2f} (majority class); '
            f'report {d["report_png"]}'
        )
        if d.get('fov_view'):
            print(
                f'  {name} field of view (whole frame vs sliding windows, '
                f'{d["fov_view"]["png"]}):\n{d["fov_view"]["table"]}'
            )
    print(f'  written: {osp.join(args.work_dir, "demo_summary.json")}')
    return summary


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
