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
import copy
import csv
import datetime
import gc
import json
import os
import os.path as osp
import platform
import shlex
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import lookhere_dense  # noqa: E402

lookhere_dense.register_all_modules()
from lookhere_dense.data.relational import (ensure_relational_dataset,  # noqa: E402
                                            settings_from_dict)
from lookhere_dense.lookhere.bias import PRESETS  # noqa: E402
from lookhere_dense.models.pos_encoding import POS_ENCODINGS  # noqa: E402

DEFAULT_CONFIG = osp.join(REPO, 'configs', 'study', 'relational_vit_tiny.py')
DEFAULT_ENCODINGS = ('lookhere', 'rope2d', 'rope2d_mixed', 'abs', 'alibi2d', 'none')
DEFAULT_SCALES = (1.0, 1.5, 2.0, 3.0, 4.0)
LADDERS = ('rendered', 'resize')


# ----------------------------------------------------------------------------------------
# Encodings and configs
# ----------------------------------------------------------------------------------------
def parse_encoding(spec: str) -> Tuple[str, Optional[str]]:
    """``'rope2d'`` -> ``('rope2d', None)``; ``'lookhere:lh45'`` -> ``('lookhere', 'lh45')``.

    Raises:
        ValueError: unknown encoding or preset, naming the allowed ones.
    """
    name, _, preset = spec.partition(':')
    if name not in POS_ENCODINGS:
        raise ValueError(f'unknown encoding {spec!r}; allowed: {list(POS_ENCODINGS)} '
                         "(LookHere presets as 'lookhere:PRESET')")
    if preset and name != 'lookhere':
        raise ValueError(f'{spec!r}: only lookhere takes a preset (lookhere:PRESET)')
    if preset and preset not in PRESETS:
        raise ValueError(f'{spec!r}: unknown LookHere preset {preset!r}; allowed: '
                         f'{sorted(PRESETS)}')
    return name, preset or None


def backbone_for(backbone: Dict[str, Any], spec: str) -> Dict[str, Any]:
    """The config's backbone dict with encoding ``spec``: LookHere keeps the config's
    ``preset`` / ``lh_config`` unless the spec names a preset; the others drop them."""
    name, preset = parse_encoding(spec)
    if backbone.get('type') != 'LookHereViT':
        raise ValueError(f"the study needs model.backbone.type='LookHereViT', the config has "
                         f'{backbone.get("type")!r}')
    out = dict(backbone)
    if name != 'lookhere' or preset:
        out.pop('preset', None)
        out.pop('lh_config', None)
    if preset:
        out['preset'] = preset
    out['pos_encoding'] = name
    return out


def _schedule_to(cfg, iters: int) -> None:
    """Set the train loop to ``iters`` and clip / stretch iteration-based schedulers: a
    scheduler that ran to the old end now runs to ``iters``, none runs past it."""
    old = cfg.train_cfg.get('max_iters')
    if old is None:
        raise ValueError('--iters needs an iteration-based train_cfg (max_iters)')
    cfg.train_cfg.max_iters = iters
    schedulers = cfg.get('param_scheduler') or []
    for sch in [schedulers] if isinstance(schedulers, dict) else schedulers:
        if sch.get('by_epoch', True):
            continue
        end = sch.get('end', old)
        sch['end'] = iters if end >= old else min(end, iters)
        sch['begin'] = min(sch.get('begin', 0), sch['end'] - 1)
        if 'T_max' in sch:
            sch['T_max'] = sch['end'] - sch['begin']


def study_settings(cfg, args: argparse.Namespace) -> Dict[str, Any]:
    """The ladder settings: ``ladder``, ``scales``, ``metric``, ``train_size``, ``val_prefix``."""
    ext = dict(cfg.get('extrapolation') or {})
    ladder = ext.get('ladder', 'resize')
    if ladder not in LADDERS:
        raise ValueError(f'unknown extrapolation.ladder {ladder!r}; allowed: {list(LADDERS)}')
    scales = tuple(float(s) for s in (args.scales or ext.get('scales') or DEFAULT_SCALES))
    if min(scales) <= 0:
        raise ValueError(f'scales must be positive, got {scales}')
    train_size = ext.get('train_size') or cfg.model.backbone.get('img_size', 224)
    if isinstance(train_size, int):
        train_size = (train_size, train_size)
    return dict(ladder=ladder, scales=scales, metric=args.metric or ext.get('metric', 'mIoU'),
                train_size=tuple(train_size), val_prefix=ext.get('val_prefix', 'val_x{scale:g}'))


def prepare_data(cfg, study: Dict[str, Any], progress: bool = True) -> Optional[Dict[str, Any]]:
    """Write the relational dataset the config describes (if any, and if not there yet).

    Returns:
        Its ``meta.json`` content, or None for configs without a ``relational`` dict.
    """
    if cfg.get('relational') is None:
        return None
    rel = dict(cfg.relational)
    rel['scales'] = tuple(sorted(set(map(float, rel.get('scales', ()))) | set(study['scales'])))
    settings = settings_from_dict(rel)
    if tuple(settings.train_size) != tuple(study['train_size']):
        raise ValueError(f'relational.train_size {settings.train_size} differs from '
                         f'extrapolation.train_size {study["train_size"]}')
    root = cfg.train_dataloader.dataset.get('data_root')
    if cfg.val_dataloader.dataset.get('data_root') != root:
        raise ValueError('the relational dataset needs train and val data_root to be equal, got '
                         f'{root!r} and {cfg.val_dataloader.dataset.get("data_root")!r}')
    return ensure_relational_dataset(root, settings, progress=progress)


def _scale_resize(pipeline: List[Dict[str, Any]], scale: float) -> int:
    """Multiply every ``Resize`` of ``pipeline`` by ``scale`` in place; returns how many."""
    found = 0
    for t in pipeline:
        if t.get('type') not in ('Resize', 'mmseg.Resize', 'mmcv.Resize'):
            continue
        found += 1
        if t.get('scale') is not None:
            s = t['scale']
            t['scale'] = (tuple(int(round(v * scale)) for v in s) if isinstance(s, (list, tuple))
                          else int(round(s * scale)))
        elif t.get('scale_factor') is not None:
            f = t['scale_factor']
            t['scale_factor'] = (tuple(v * scale for v in f) if isinstance(f, (list, tuple))
                                 else f * scale)
    return found


def ladder_dataloader(cfg, study: Dict[str, Any], scale: float) -> Dict[str, Any]:
    """The ``val_dataloader`` config for one test scale (see the module docstring)."""
    dl = copy.deepcopy(cfg.val_dataloader.to_dict() if hasattr(cfg.val_dataloader, 'to_dict')
                       else dict(cfg.val_dataloader))
    ds = dl['dataset']
    if study['ladder'] == 'rendered':
        split = study['val_prefix'].format(scale=scale)
        ds['data_prefix'] = dict(img_path=f'img_dir/{split}', seg_map_path=f'ann_dir/{split}')
    elif scale != 1.0 and _scale_resize(ds.get('pipeline', []), scale) == 0:
        raise ValueError("ladder='resize' needs a Resize transform in the val pipeline to "
                         'scale; this config has none')
    return dl


def run_config(base_cfg, spec: str, seed: int, args: argparse.Namespace, work_dir: str):
    """A deep copy of ``base_cfg`` for one run (encoding ``spec``, ``seed``, CLI overrides)."""
    cfg = copy.deepcopy(base_cfg)
    cfg.model.backbone = backbone_for(cfg.model.backbone, spec)
    cfg.work_dir = work_dir
    cfg.randomness = dict(seed=seed, deterministic=False)
    if args.iters:
        _schedule_to(cfg, args.iters)
    if args.batch_size:
        cfg.train_dataloader.batch_size = args.batch_size
    if args.lr:
        cfg.optim_wrapper.optimizer.lr = args.lr
    cfg.train_cfg.val_interval = (args.val_interval if args.val_interval
                                  else cfg.train_cfg.max_iters + 1)
    if cfg.get('visualizer'):
        cfg.visualizer.pop('name', None)  # one global visualizer name per Runner
    if not args.keep_test_mode:
        cfg.model.test_cfg = dict(mode='whole')
    return cfg


# ----------------------------------------------------------------------------------------
# A metric that also returns per-class IoU
# ----------------------------------------------------------------------------------------
def _register_metric():
    from mmseg.evaluation.metrics import IoUMetric
    from mmseg.registry import METRICS

    @METRICS.register_module(name='StudyIoUMetric', force=True)
    class StudyIoUMetric(IoUMetric):
        """mmseg's ``IoUMetric`` that also returns ``IoU.<class>`` for every class."""

        def compute_metrics(self, results: list) -> Dict[str, float]:
            per = tuple(zip(*results))
            inter, union = sum(per[0]), sum(per[1])
            metrics = super().compute_metrics(results)
            iou = (inter / union).tolist()
            for name, value in zip(self.dataset_meta['classes'], iou):
                metrics[f'IoU.{name}'] = round(100 * value, 2) if value == value else None
            return metrics

    return StudyIoUMetric


def ladder_evaluator(cfg) -> Dict[str, Any]:
    """The config's ``val_evaluator`` with ``IoUMetric`` swapped for the per-class one."""
    ev = copy.deepcopy(cfg.val_evaluator)
    ev = ev.to_dict() if hasattr(ev, 'to_dict') else dict(ev)
    if ev.get('type') in ('IoUMetric', 'mmseg.IoUMetric'):
        ev['type'] = 'StudyIoUMetric'
    return ev


def _plain(value: Any) -> Any:
    """numpy / float32 scalars -> Python numbers rounded to 4 decimals (for JSON)."""
    value = value.item() if hasattr(value, 'item') else value
    return round(value, 4) if isinstance(value, float) else value


def train_and_evaluate(cfg, study: Dict[str, Any]) -> Dict[str, Any]:
    """Train one run with the mmengine ``Runner`` and evaluate it at every ladder scale.

    Returns:
        ``dict(train_seconds, eval_seconds, eval={scale: {metric: value}}, params)``.
    """
    from mmengine.logging import print_log
    from mmengine.runner import Runner, ValLoop

    runner = Runner.from_cfg(cfg)
    start = time.time()
    runner.train()
    train_seconds = time.time() - start
    model = runner.model.module if hasattr(runner.model, 'module') else runner.model
    params = sum(p.numel() for p in model.parameters())
    results: Dict[str, Dict[str, Any]] = {}
    start = time.time()
    for scale in study['scales']:
        loop = ValLoop(runner, ladder_dataloader(cfg, study, scale), ladder_evaluator(cfg))
        metrics = {k: _plain(v) for k, v in loop.run().items()}
        results[f'{scale:g}'] = metrics
        print_log(f'[study] {cfg.model.backbone.pos_encoding} scale {scale:g}: '
                  f'{study["metric"]} {metrics.get(study["metric"])}', logger='current')
    eval_seconds = time.time() - start
    del runner, loop, model
    gc.collect()
    return dict(train_seconds=round(train_seconds, 1), eval_seconds=round(eval_seconds, 1),
                params=params, eval=results)


# ----------------------------------------------------------------------------------------
# Aggregation and outputs
# ----------------------------------------------------------------------------------------
def summarise(runs: Sequence[Dict[str, Any]], metric: str) -> Dict[str, Dict[str, Dict]]:
    """``{encoding: {scale: {'mean', 'std', 'n', 'values'}}}`` of ``metric`` over seeds
    (``std`` is the sample std, 0 with one seed)."""
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for run in runs:
        for scale, metrics in run['eval'].items():
            out.setdefault(run['encoding'], {}).setdefault(scale, {'values': []})['values'].append(
                metrics[metric])
    for per_scale in out.values():
        for entry in per_scale.values():
            vals = [v for v in entry['values'] if v is not None]
            entry['n'] = len(vals)
            entry['mean'] = round(statistics.fmean(vals), 2) if vals else None
            entry['std'] = round(statistics.stdev(vals), 2) if len(vals) > 1 else 0.0
    return out


def format_table(summary: Dict[str, Dict[str, Dict]], study: Dict[str, Any]) -> str:
    """A Markdown table: one row per encoding, one column per test scale."""
    scales = [f'{s:g}' for s in study['scales']]
    th, tw = study['train_size']
    head = ['encoding'] + [f'{s}x ({round(th * float(s))}x{round(tw * float(s))})'
                           for s in scales]
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for enc, per_scale in summary.items():
        cells = [enc]
        for s in scales:
            e = per_scale.get(s)
            if e is None or e['mean'] is None:
                cells.append('-')
            elif e['n'] > 1:
                cells.append(f"{e['mean']:.2f} ± {e['std']:.2f}")
            else:
                cells.append(f"{e['mean']:.2f}")
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def write_csv(path: str, runs: Sequence[Dict[str, Any]], study: Dict[str, Any]) -> None:
    """One row per (encoding, seed, scale) with the summary metrics of that evaluation."""
    keys: List[str] = []
    for run in runs:
        for metrics in run['eval'].values():
            keys += [k for k in metrics if not k.startswith('IoU.') and k not in keys]
    with open(path, 'w', newline='') as f:
        w = csv.writer(f)
        w.writerow(['encoding', 'seed', 'scale', 'test_h', 'test_w', *keys, 'train_seconds'])
        for run in runs:
            for scale, metrics in run['eval'].items():
                th, tw = (round(v * float(scale)) for v in study['train_size'])
                w.writerow([run['encoding'], run['seed'], scale, th, tw,
                            *[metrics.get(k) for k in keys], run['train_seconds']])


def plot(path: str, summary: Dict[str, Dict[str, Dict]], study: Dict[str, Any],
         title: str) -> None:
    """Metric vs test resolution, one line per encoding (error bars: ±1 std over seeds)."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    scales = list(study['scales'])
    for enc, per_scale in summary.items():
        xs = [s for s in scales if per_scale.get(f'{s:g}', {}).get('mean') is not None]
        ys = [per_scale[f'{s:g}']['mean'] for s in xs]
        err = [per_scale[f'{s:g}']['std'] for s in xs]
        style = dict(marker='o', lw=2.2 if enc.startswith('lookhere') else 1.4, label=enc)
        if any(err):
            ax.errorbar(xs, ys, yerr=err, capsize=3, **style)
        else:
            ax.plot(xs, ys, **style)
    th, tw = study['train_size']
    ax.set_xscale('log', base=2)
    ax.set_xticks(scales)
    ax.set_xticklabels([f'{s:g}x\n{round(th * s)}x{round(tw * s)}' for s in scales])
    ax.axvline(1.0, color='grey', ls=':', lw=1)
    ax.set_xlabel('test resolution (multiple of the training size)')
    ax.set_ylabel(study['metric'])
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _versions() -> Dict[str, str]:
    import mmengine
    import mmseg
    import torch
    return dict(python=platform.python_version(), torch=torch.__version__,
                mmengine=mmengine.__version__, mmseg=mmseg.__version__,
                lookhere_dense=lookhere_dense.__version__, machine=platform.machine(),
                torch_threads=torch.get_num_threads(),
                device='cuda:' + torch.cuda.get_device_name(0) if torch.cuda.is_available()
                else 'cpu')


# ----------------------------------------------------------------------------------------
# CLI
# ----------------------------------------------------------------------------------------
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


def run_study(args: argparse.Namespace, command: str) -> Dict[str, Any]:
    """Train and evaluate every (seed, encoding) of ``args``; returns the report dict."""
    from mmengine.config import Config
    from mmengine.logging import print_log

    _register_metric()
    for spec in args.encodings:
        parse_encoding(spec)  # fail early, before any training
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    backbone_for(cfg.model.backbone, args.encodings[0])
    study = study_settings(cfg, args)
    data_meta = prepare_data(cfg, study)

    runs: List[Dict[str, Any]] = []
    total = len(args.encodings) * len(args.seeds)
    started = time.time()
    first_cfg = None
    for i, (seed, spec) in enumerate((s, e) for s in args.seeds for e in args.encodings):
        work_dir = osp.join(args.work_dir, spec.replace(':', '-'), f'seed{seed}')
        cfg_run = run_config(cfg, spec, seed, args, work_dir)
        first_cfg = first_cfg or cfg_run
        print_log(f'[study] run {i + 1}/{total}: encoding {spec}, seed {seed}, '
                  f'{cfg_run.train_cfg.max_iters} iters -> {work_dir}', logger='current')
        result = train_and_evaluate(cfg_run, study)
        runs.append(dict(encoding=spec, seed=seed, **result))
        print_log(f'[study] run {i + 1}/{total} done: train {result["train_seconds"]} s, '
                  f'eval {result["eval_seconds"]} s', logger='current')

    test_cfg = first_cfg.model.test_cfg
    settings = dict(
        config=osp.relpath(osp.abspath(args.config), REPO), encodings=list(args.encodings),
        seeds=list(args.seeds), scales=list(study['scales']), ladder=study['ladder'],
        metric=study['metric'], train_size=list(study['train_size']),
        iters=first_cfg.train_cfg.max_iters,
        batch_size=first_cfg.train_dataloader.batch_size,
        optimizer=first_cfg.optim_wrapper.optimizer.to_dict(),
        backbone={k: v for k, v in first_cfg.model.backbone.items()
                  if k not in ('pos_encoding', 'preset', 'lh_config')},
        test_cfg=test_cfg.to_dict() if hasattr(test_cfg, 'to_dict') else test_cfg,
        cfg_options=args.cfg_options, dataset=data_meta)
    return dict(command=command, date=datetime.datetime.now().isoformat(timespec='seconds'),
                wall_seconds=round(time.time() - started, 1), versions=_versions(),
                settings=settings, runs=runs)


#: settings that may differ between reports merged with ``--merge``
_MERGEABLE = ('encodings', 'seeds')


def merge_reports(paths: Sequence[str], command: str) -> Dict[str, Any]:
    """Combine the runs of earlier ``{name}.json`` reports made with the same settings
    (e.g. seeds run on different machines) into one report.

    Raises:
        ValueError: settings that differ (by name), or one (encoding, seed) twice.
    """
    reports = []
    for path in paths:
        with open(path) as f:
            reports.append(json.load(f))
    base = reports[0]['settings']
    for path, rep in zip(paths[1:], reports[1:]):
        diff = sorted(k for k in set(base) | set(rep['settings']) if k not in _MERGEABLE
                      and json.dumps(base.get(k), sort_keys=True, default=str)
                      != json.dumps(rep['settings'].get(k), sort_keys=True, default=str))
        if diff:
            raise ValueError(f'cannot merge {path!r} into {paths[0]!r}: settings differ in {diff}')
    runs, seen = [], set()
    for path, rep in zip(paths, reports):
        for run in rep['runs']:
            key = (run['encoding'], run['seed'])
            if key in seen:
                raise ValueError(f'encoding {key[0]!r} seed {key[1]} appears twice ({path!r})')
            seen.add(key)
            runs.append(run)
    settings = dict(base)
    settings['encodings'] = list(dict.fromkeys(r['encoding'] for r in runs))
    settings['seeds'] = sorted({r['seed'] for r in runs})
    sources = [dict(path=p, command=r['command'], date=r['date'],
                    wall_seconds=r['wall_seconds'], versions=r['versions'])
               for p, r in zip(paths, reports)]
    return dict(command=command, date=datetime.datetime.now().isoformat(timespec='seconds'),
                wall_seconds=round(sum(r['wall_seconds'] for r in reports), 1),
                versions=reports[0]['versions'], merged_from=sources, settings=settings,
                runs=runs)


def write_outputs(report: Dict[str, Any], out_dir: str, name: str) -> Dict[str, Any]:
    """Add the summary and table to ``report`` and write the JSON, CSV, table and plot."""
    settings = report['settings']
    study = dict(scales=tuple(settings['scales']), metric=settings['metric'],
                 train_size=tuple(settings['train_size']), ladder=settings['ladder'])
    report['summary'] = summarise(report['runs'], study['metric'])
    report['table'] = table = format_table(report['summary'], study)
    os.makedirs(out_dir, exist_ok=True)
    stem = osp.join(out_dir, name)
    with open(stem + '.json', 'w') as f:
        json.dump(report, f, indent=1, default=str)
    write_csv(stem + '.csv', report['runs'], study)
    size = f'{study["train_size"][0]}x{study["train_size"][1]}'
    with open(stem + '_table.md', 'w') as f:
        f.write(f'{study["metric"]} by test resolution (trained at {size}, seeds '
                f'{settings["seeds"]})\n\n{table}\n')
    plot(stem + '.png', report['summary'], study,
         f'{osp.basename(settings["config"])}: {settings["iters"]} iters, seeds '
         f'{settings["seeds"]}, trained at {size}')
    print(f'\n{study["metric"]} by test resolution ({len(report["runs"])} runs, '
          f'{report["wall_seconds"]:.0f} s):\n{table}\n\nwrote {stem}.json, .csv, _table.md, .png')
    return report


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run (or ``--merge``) the study and write its outputs; returns the report."""
    args = parse_args(argv)
    command = 'python ' + ' '.join(shlex.quote(a) for a in
                                   [osp.relpath(__file__, os.getcwd())] +
                                   list(sys.argv[1:] if argv is None else argv))
    report = merge_reports(args.merge, command) if args.merge else run_study(args, command)
    return write_outputs(report, args.out_dir or args.work_dir, args.name)


if __name__ == '__main__':
    main()
