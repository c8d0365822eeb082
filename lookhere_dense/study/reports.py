"""The study's reports: mean / std over seeds (:func:`summarise`), the Markdown table, the
CSV, the plot, merging reports of other seeds (:func:`merge_reports`) and writing them all
(:func:`write_outputs`).

A report is the dict :func:`lookhere_dense.study.runs.run_study` returns: ``command``,
``date``, ``wall_seconds``, ``versions``, ``settings`` (config, encodings, seeds, scales,
ladder, metric, train_size, iters, ...) and ``runs`` (one per encoding and seed, with
``eval = {scale: {metric: value}}``). Outputs in the output folder: ``{name}.json`` (the
report plus ``summary`` and ``table``), ``{name}.csv`` (one row per run and scale),
``{name}_table.md`` and ``{name}.png`` (metric vs test resolution, one line per encoding,
±1 std bars with several seeds).
"""
from __future__ import annotations

import csv
import datetime
import json
import os
import os.path as osp
import statistics
from typing import Any, Dict, List, Sequence

__all__ = ['summarise', 'format_table', 'write_csv', 'plot', 'merge_reports',
           'write_outputs', 'MERGEABLE']


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


#: settings that may differ between reports merged with ``--merge``
MERGEABLE = ('encodings', 'seeds')


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
        diff = sorted(k for k in set(base) | set(rep['settings']) if k not in MERGEABLE
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
    """Add the summary and table to ``report`` and write ``<out_dir>/<name>.json``,
    ``.csv``, ``_table.md`` and ``.png``; returns ``report``."""
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
    return report


