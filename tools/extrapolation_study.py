#!/usr/bin/env python
"""Train one segmentation model per position encoding with identical settings at one
resolution, evaluate each on a ladder of larger test resolutions, and tabulate / plot it.

Every run is a real mmengine ``Runner`` on an mmseg config (``--config``) in which only
``model.backbone.pos_encoding`` (and, for LookHere, its preset) changes; with one seed the
runs share the trunk's initial weights (see :func:`lookhere_dense.lookhere.pos_encoding.isolated_rng`)
and the order of the training data. After training, each test scale gets its own mmengine
``ValLoop`` with mmseg's ``IoUMetric``.

Test ladder (``--ladder``, else the config's ``extrapolation`` dict):

* ``--ladder fov`` (CPU default ``configs/study/fov_vit_tiny.py``): the field of view. The
  models train on 64 px crops of generated scenes (:mod:`research.datasets.fov_scenes`);
  other scenes whose frames are 1x..4x the crop side at the *same* pixel scale are
  predicted whole (one pass) and with mmseg's sliding windows of the training crop, each
  timed and its peak memory measured; with ``--aids log_n`` also whole with the backbone's
  ``log_n_scaling``.
* ``ladder='rendered'`` (the default without ``--ladder``,
  ``configs/study/relational_vit_tiny.py``): zoom; the validation scenes of
  :mod:`research.datasets.relational`, rendered natively at every scale into
  ``val_x{scale}`` folders (written on first use), from 0.5x (below the training size) to
  4x, plus the native-aspect rows: other scenes at aspect ratios 1:2 to 2:1 whose *longer*
  side is the scale times the training side (``val_aspect_x{scale}``).
* ``ladder='resize'`` (any other mmseg config with a ``LookHereViT`` backbone, e.g. the
  Segmenter ADE20K / Cityscapes configs on a GPU): zoom; every ``Resize`` of the test
  pipeline is multiplied by the scale and the model tests in ``'whole'`` mode (a sliding
  window would hide the larger input; ``--keep-test-mode`` keeps the config's).
  Predictions are scored at the annotation's own size, as mmseg does.

Scales below 1 (``--scales 0.5 0.75 1 ...``) test below the training size on the zoom
ladders. ``--native-aspect`` (zoom ladders; on in the CPU default config) adds a
``native aspect`` row per encoding: images at their own aspect ratio, longer side the scale
times the training side (``resize``: a long-side ``Resize``, as ImageNet-Val at 384 px).

Extrapolation aids (``--aids``, :mod:`research.study.aids`): ``log_n`` (test time:
every run is also evaluated with ``log_n_scaling``) and ``mixed_crops`` (training on crops
of 1x, 1.5x and 2x the crop side, one size per batch; the runs are named
``ENCODING+mixed_crops``, or give ``ENCODING+mixed_crops`` in ``--encodings``). The
learnable-slopes ablation is one more run spec: ``--encodings lookhere
lookhere+learnable_slopes`` (fixed vs learned LookHere slopes, in one report); so is the
Jumbo trunk: ``--encodings lookhere:lh180+jumbo abs+jumbo`` (``extrapolation.jumbo_tokens``
Jumbo tokens, default 6, in place of the CLS token).

``--robustness``: every run is also attacked (FGSM and PGD at 1, 2, 4, 8 /255, 5 PGD
steps, unless the config's ``extrapolation.robustness`` says otherwise) on the 1x
validation images (:mod:`research.robustness.segmentor`; one checkpoint:
``tools/robustness.py``).

The machinery is :mod:`research.study` (encodings, aids, schedules, ladders, runs,
reports).

Outputs in ``--out-dir``: ``{name}.json`` (settings, seeds, versions, every run's metrics
per scale (and mode) incl. per-class IoU, time and memory, mean / std), ``{name}.csv`` (one
row per run, mode and scale), ``{name}_table.md`` (the tables printed to stdout) and
``{name}.png`` (metric vs test size, one line per encoding and mode, ±1 std bars with
several seeds; for the fov ladder also time and memory per frame); with ``--robustness``
also ``{name}_robustness.csv`` and ``{name}_robustness.png`` (mIoU vs attack strength).

Examples (CPU default, all encodings, one seed; then two more seeds, merged)::

    python tools/extrapolation_study.py --ladder fov --out-dir work_dirs --name study_fov
    python tools/extrapolation_study.py --out-dir docs --name study_relational
    python tools/extrapolation_study.py --seeds 1 2 --out-dir work_dirs --name seeds12
    python tools/extrapolation_study.py --merge docs/study_relational.json \\
        work_dirs/seeds12.json --out-dir docs --name study_relational_3seeds
    # fixed vs learnable LookHere slopes, and every run under FGSM / PGD
    python tools/extrapolation_study.py --encodings lookhere lookhere+learnable_slopes \\
        --robustness --out-dir work_dirs --name slopes_robustness
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
from lookhere_dense.lookhere.config import PRESETS  # noqa: E402
from lookhere_dense.lookhere.pos_encoding import POS_ENCODINGS  # noqa: E402
from research.study.aids import AIDS  # noqa: E402
from research.study.encodings import DEFAULT_ENCODINGS  # noqa: E402
from research.study.ladders import LADDERS  # noqa: E402
from research.study.reports import merge_reports, write_outputs  # noqa: E402
from research.study.runs import LADDER_CONFIGS, RunOptions, run_study  # noqa: E402


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    from lookhere_dense.apis.cli import CfgOptionsAction, positive_float, positive_int

    p = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        '--config',
        default=None,
        help='mmseg config with a LookHereViT backbone (and optionally the '
        'generated-dataset / `extrapolation` dicts of configs/study/*); '
        "default: the ladder's CPU default "
        f'({ {k: osp.relpath(v, REPO) for k, v in LADDER_CONFIGS.items()} })',
    )
    p.add_argument(
        '--ladder',
        choices=list(LADDERS),
        default=None,
        help="test ladder (default: the config's extrapolation.ladder): "
        + '; '.join(f'{k}: {v.description}' for k, v in LADDERS.items()),
    )
    p.add_argument(
        '--encodings',
        nargs='+',
        default=None,
        help=f'encodings to compare: {list(POS_ENCODINGS)}, or lookhere:PRESET '
        f'with PRESET in {sorted(PRESETS)}; ENCODING+mixed_crops trains '
        'with that aid, lookhere+learnable_slopes learns the LookHere slopes, '
        'ENCODING+jumbo trains with Jumbo tokens in place of CLS '
        "(default: the config's extrapolation.encodings, else "
        f"{list(DEFAULT_ENCODINGS)}); options of an encoding (e.g. pape's "
        'parabolas) come from extrapolation.encoding_options',
    )
    p.add_argument(
        '--aids',
        nargs='*',
        default=None,
        choices=list(AIDS),
        metavar='AID',
        help=f"extrapolation aids for every run, replacing the config's "
        f'extrapolation.aids: {AIDS}',
    )
    p.add_argument(
        '--seeds',
        nargs='+',
        type=int,
        default=[0],
        help='one run per encoding and seed; several seeds give mean ± std',
    )
    p.add_argument(
        '--scales',
        nargs='+',
        type=float,
        default=None,
        help='test resolutions as multiples of the training size, below 1 too '
        "(default: the config's extrapolation.scales, else 1 1.5 2 3 4)",
    )
    p.add_argument(
        '--native-aspect',
        action=argparse.BooleanOptionalAction,
        default=None,
        help="zoom ladders: add a row per encoding at the images' own aspect "
        "ratio, longer side = scale x training side (default: the config's "
        'extrapolation.native_aspect)',
    )
    p.add_argument(
        '--robustness',
        action='store_true',
        help='also attack every run with FGSM / PGD on the 1x validation images '
        "(settings: the config's extrapolation.robustness, else FGSM and "
        '5-step PGD at 1 2 4 8 /255)',
    )
    p.add_argument(
        '--max-memory',
        metavar='SIZE',
        default=None,
        help='memory budget of one evaluation pass (e.g. 8G): a rung whose estimated peak '
        'exceeds it is refused before it allocates and shown as refused; the other rungs '
        'run (default: the memory the machine or its cgroup has left; off: no limit)',
    )
    p.add_argument(
        '--iters',
        type=positive_int,
        default=None,
        help="training iterations (default: the config's max_iters); "
        'iteration-based LR schedules are stretched to match',
    )
    p.add_argument(
        '--batch-size',
        type=positive_int,
        default=None,
        help="training batch size (default: the config's)",
    )
    p.add_argument(
        '--lr', type=positive_float, default=None, help="learning rate (default: the config's)"
    )
    p.add_argument(
        '--metric',
        default=None,
        help='metric of the table and plot (default: extrapolation.metric, else mIoU)',
    )
    p.add_argument(
        '--val-interval',
        type=positive_int,
        default=None,
        help='also validate at 1x every N iterations while training (default: never; '
        'the ladder is evaluated after training)',
    )
    p.add_argument(
        '--keep-test-mode',
        action='store_true',
        help="keep the config's model.test_cfg (default: force mode='whole' so the "
        'model sees the whole larger image)',
    )
    p.add_argument(
        '--threads',
        type=positive_int,
        default=None,
        help="PyTorch CPU threads (default: PyTorch's choice; 1 is much faster "
        'on a machine whose cores are busy with other jobs)',
    )
    p.add_argument(
        '--work-dir',
        default=osp.join('work_dirs', 'extrapolation_study'),
        help='where the runs keep their logs and last checkpoints',
    )
    p.add_argument(
        '--out-dir', default=None, help='where to write the results (default: --work-dir)'
    )
    p.add_argument('--name', default='study', help='file stem of the JSON / CSV / PNG / table')
    p.add_argument(
        '--merge',
        nargs='+',
        default=None,
        metavar='JSON',
        help='train nothing: combine the runs of earlier reports made with the same '
        'settings (e.g. other seeds) into one report, table and plot',
    )
    p.add_argument(
        '--cfg-options',
        nargs='+',
        action=CfgOptionsAction,
        default=None,
        help='override config entries, e.g. relational.num_train=1000 model.backbone.num_layers=4',
    )
    args = p.parse_args(argv)
    repeated = sorted({s for s in args.seeds if args.seeds.count(s) > 1})
    if repeated:
        p.error(
            f'--seeds {" ".join(map(str, args.seeds))}: seed {repeated[0]} is given twice '
            '(each seed is one run per encoding, in one work dir)'
        )
    return args


def check_outputs(out_dir: str, name: str, command: str, merged: Sequence[str] = ()) -> None:
    """Refuse, before anything trains, a study whose ``<out_dir>/<name>.json`` would
    replace the report of another command (a study takes minutes to hours; its .csv,
    _table.md and .png would go too). The same command again replaces its own report, and
    a ``--merge`` replaces one of the reports it merges (``merged``: their paths).

    Raises:
        lookhere_dense.errors.ToolError: naming the file, its command, ``--name`` and
            ``--out-dir``.
    """
    import json

    from lookhere_dense.errors import ToolError

    path = osp.join(out_dir, f'{name}.json')
    if osp.realpath(path) in {osp.realpath(p) for p in merged}:
        return  # read first, merged into the new report
    try:
        with open(path) as f:
            old = json.load(f).get('command')
    except (OSError, ValueError, AttributeError):
        return  # none there, or not a report: written as before
    if isinstance(old, str) and old != command:
        raise ToolError(
            f'{path!r} is the report of another study ({old}); this one would replace it '
            'and its .csv, _table.md and .png: give it another --name or --out-dir, or '
            'remove that file'
        )


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run (or ``--merge``) the study and write its outputs; returns the report."""
    args = parse_args(argv)
    command = 'python ' + ' '.join(
        shlex.quote(a)
        for a in [osp.relpath(__file__, os.getcwd())]
        + list(sys.argv[1:] if argv is None else argv)
    )
    from lookhere_dense.apis.cli import apply_threads

    apply_threads(args.threads)
    check_outputs(args.out_dir or args.work_dir, args.name, command, args.merge or ())
    if args.merge:
        report = merge_reports(args.merge, command, args.metric)
    else:
        report = run_study(
            args.config,
            args.encodings,
            args.seeds,
            RunOptions(
                iters=args.iters,
                batch_size=args.batch_size,
                lr=args.lr,
                val_interval=args.val_interval,
                keep_test_mode=args.keep_test_mode,
            ),
            work_dir=args.work_dir,
            scales=args.scales,
            metric=args.metric,
            cfg_options=args.cfg_options,
            command=command,
            ladder=args.ladder,
            aids=args.aids,
            native_aspect=args.native_aspect,
            robustness=args.robustness,
            max_memory=args.max_memory,
        )
    out_dir = args.out_dir or args.work_dir
    write_outputs(report, out_dir, args.name)
    stem = osp.join(out_dir, args.name)
    cost = (
        f'\n\nseconds and peak memory per frame:\n{report["cost_table"]}'
        if report.get('cost_table')
        else ''
    )
    if report.get('robustness_table'):
        cost += f'\n\nunder attack (eps /255):\n{report["robustness_table"]}'
    if report.get('slopes_table'):
        cost += f'\n\nlearned LookHere slopes:\n{report["slopes_table"]}'
    more = ', _robustness.csv, _robustness.png' if report.get('robustness_table') else ''
    print(
        f'\n{report["settings"]["metric"]} by test resolution ({len(report["runs"])} runs, '
        f'{report["wall_seconds"]:.0f} s):\n{report["table"]}{cost}\n\nwrote {stem}.json, '
        f'.csv, _table.md, .png{more}'
    )
    return report


if __name__ == '__main__':
    from lookhere_dense.apis.cli import run_main

    run_main(main)
