#!/usr/bin/env python
"""Train one segmentation model per position encoding with identical settings at one
resolution, evaluate each on a ladder of larger test resolutions, and tabulate / plot it.

Every run is a real mmengine ``Runner`` on an mmseg config (``--config``) in which only
``model.backbone.pos_encoding`` (and, for LookHere, its preset) changes; with one seed the
runs share the trunk's initial weights (see :func:`lookhere_dense.models.pos_encoding.isolated_rng`)
and the order of the training data. After training, each test scale gets its own mmengine
``ValLoop`` with mmseg's ``IoUMetric``.

Test ladder, chosen by the config's ``extrapolation`` dict:

* ``ladder='rendered'`` (the CPU default, ``configs/study/relational_vit_tiny.py``): the
  validation scenes of :mod:`lookhere_dense.data.relational`, rendered natively at every
  scale into ``val_x{scale}`` folders (written on first use).
* ``ladder='resize'`` (any other mmseg config with a ``LookHereViT`` backbone, e.g. the
  Segmenter ADE20K / Cityscapes configs on a GPU): every ``Resize`` of the test pipeline is
  multiplied by the scale and the model tests in ``'whole'`` mode (a sliding window would
  hide the larger input; ``--keep-test-mode`` keeps the config's). Predictions are scored at
  the annotation's own size, as mmseg does.

The machinery is :mod:`lookhere_dense.study` (encodings, schedules, ladders, runs, reports).

Outputs in ``--out-dir``: ``{name}.json`` (settings, seeds, versions, every run's metrics
per scale incl. per-class IoU, mean / std), ``{name}.csv`` (one row per run and scale),
``{name}_table.md`` (the table printed to stdout) and ``{name}.png`` (metric vs test
resolution, one line per encoding, ±1 std bars with several seeds).

Examples (CPU default, all encodings, one seed; then two more seeds, merged)::

    python tools/extrapolation_study.py --out-dir docs --name study_relational
    python tools/extrapolation_study.py --seeds 1 2 --out-dir work_dirs --name seeds12
    python tools/extrapolation_study.py --merge docs/study_relational.json \
        work_dirs/seeds12.json --out-dir docs --name study_relational_3seeds
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import shlex
import sys
from typing import Any, Dict, Optional, Sequence

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import lookhere_dense  # noqa: E402

lookhere_dense.register_all_modules()
from lookhere_dense.lookhere.bias import PRESETS  # noqa: E402
from lookhere_dense.models.pos_encoding import POS_ENCODINGS  # noqa: E402
from lookhere_dense.study.encodings import DEFAULT_ENCODINGS  # noqa: E402
from lookhere_dense.study.reports import merge_reports, write_outputs  # noqa: E402
from lookhere_dense.study.runs import DEFAULT_CONFIG, RunOptions, run_study  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    from mmengine.config import DictAction
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument('--config', default=DEFAULT_CONFIG,
                   help='mmseg config with a LookHereViT backbone (and optionally the '
                        '`relational` / `extrapolation` dicts of configs/study/*)')
    p.add_argument('--encodings', nargs='+', default=list(DEFAULT_ENCODINGS),
                   help=f'encodings to compare: {list(POS_ENCODINGS)}, or lookhere:PRESET '
                        f'with PRESET in {sorted(PRESETS)}')
    p.add_argument('--seeds', nargs='+', type=int, default=[0],
                   help='one run per encoding and seed; several seeds give mean ± std')
    p.add_argument('--scales', nargs='+', type=float, default=None,
                   help='test resolutions as multiples of the training size '
                        '(default: the config\'s extrapolation.scales, else 1 1.5 2 3 4)')
    p.add_argument('--iters', type=int, default=None,
                   help='training iterations (default: the config\'s max_iters); '
                        'iteration-based LR schedules are stretched to match')
    p.add_argument('--batch-size', type=int, default=None,
                   help='training batch size (default: the config\'s)')
    p.add_argument('--lr', type=float, default=None, help='learning rate (default: the config\'s)')
    p.add_argument('--metric', default=None,
                   help='metric of the table and plot (default: extrapolation.metric, else mIoU)')
    p.add_argument('--val-interval', type=int, default=None,
                   help='also validate at 1x every N iterations while training (default: never; '
                        'the ladder is evaluated after training)')
    p.add_argument('--keep-test-mode', action='store_true',
                   help="keep the config's model.test_cfg (default: force mode='whole' so the "
                        'model sees the whole larger image)')
    p.add_argument('--work-dir', default=osp.join('work_dirs', 'extrapolation_study'),
                   help='where the runs keep their logs and last checkpoints')
    p.add_argument('--out-dir', default=None, help='where to write the results (default: --work-dir)')
    p.add_argument('--name', default='study', help='file stem of the JSON / CSV / PNG / table')
    p.add_argument('--merge', nargs='+', default=None, metavar='JSON',
                   help='train nothing: combine the runs of earlier reports made with the same '
                        'settings (e.g. other seeds) into one report, table and plot')
    p.add_argument('--cfg-options', nargs='+', action=DictAction, default=None,
                   help='override config entries, e.g. relational.num_train=1000 '
                        'model.backbone.num_layers=4')
    return p.parse_args(argv)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run (or ``--merge``) the study and write its outputs; returns the report."""
    args = parse_args(argv)
    command = 'python ' + ' '.join(shlex.quote(a) for a in
                                   [osp.relpath(__file__, os.getcwd())] +
                                   list(sys.argv[1:] if argv is None else argv))
    if args.merge:
        report = merge_reports(args.merge, command)
    else:
        report = run_study(
            args.config, args.encodings, args.seeds,
            RunOptions(iters=args.iters, batch_size=args.batch_size, lr=args.lr,
                       val_interval=args.val_interval, keep_test_mode=args.keep_test_mode),
            work_dir=args.work_dir, scales=args.scales, metric=args.metric,
            cfg_options=args.cfg_options, command=command)
    out_dir = args.out_dir or args.work_dir
    write_outputs(report, out_dir, args.name)
    stem = osp.join(out_dir, args.name)
    print(f'\n{report["settings"]["metric"]} by test resolution ({len(report["runs"])} runs, '
          f'{report["wall_seconds"]:.0f} s):\n{report["table"]}\n\nwrote {stem}.json, .csv, '
          '_table.md, .png')
    return report


if __name__ == '__main__':
    main()
