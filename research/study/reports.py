"""The study's reports: mean / std over seeds (:func:`summarise`), the Markdown table, the
CSV, the plot, merging reports of other seeds (:func:`merge_reports`) and writing them all
(:func:`write_outputs`).

A report is the dict :func:`research.study.runs.run_study` returns: ``command``,
``date``, ``wall_seconds``, ``versions``, ``settings`` (config, encodings, seeds, scales,
ladder, metric, train_size, iters, ...) and ``runs`` (one per encoding and seed, with
``eval = {scale: {metric: value}}``). Outputs in the output folder: ``{name}.json`` (the
report plus ``summary`` and ``table``), ``{name}.csv`` (one row per run and scale),
``{name}_table.md`` and ``{name}.png`` (metric vs test resolution, one line per encoding,
±1 std bars with several seeds).

Reports with several prediction modes per rung (``settings['modes']``: the field-of-view
ladder's ``whole`` / ``slide``, test-time aids such as ``log_n``) keep the first mode in
``eval`` and the others in each run's ``modes = {mode: {scale: {metric: value}}}``; their
``summary`` has the first mode as above and ``summary_modes = {mode: summary}``, the CSV a
``mode`` column (one row per run, mode and scale), the table one row per encoding and mode
(:func:`format_mode_table`, plus time and peak memory when measured,
:func:`format_cost_table`) and the plot one line style per mode (:func:`plot_modes`).
The ``native_aspect`` mode's column ``s`` holds images at their own aspect ratio with the
longer side ``s`` times the training side (its CSV rows have no ``test_h`` / ``test_w``).

Reports with ``settings['robustness']`` (``--robustness``) hold each run's attack results
in ``robustness`` (``{'clean': row, attack: {eps: row}}``); the outputs gain
``summary_robustness``, a table (:func:`format_robustness`: clean, every strength, the mean
over strengths, mean ± std over seeds), ``{name}_robustness.csv`` and
``{name}_robustness.png``. Runs that learned their slopes (``+learnable_slopes``) list the
learned values (:func:`format_slopes`).
"""

from __future__ import annotations

import datetime
import json
import os.path as osp
import statistics
from typing import Any, Dict, List, Optional, Sequence

from .. import reporting
from ..reporting import markdown_table

__all__ = [
    'summarise',
    'mode_summaries',
    'format_table',
    'format_mode_table',
    'format_cost_table',
    'write_csv',
    'plot',
    'plot_modes',
    'merge_reports',
    'write_outputs',
    'MERGEABLE',
    'MODE_LABELS',
    'mode_label',
    'attack_settings',
    'summarise_robustness',
    'format_robustness',
    'write_robustness_csv',
    'format_slopes',
]

#: how the tables and plots name the prediction modes (``log_n``: the first mode + log-n)
MODE_LABELS = {
    'test': 'test',
    'whole': 'whole',
    'slide': 'slide',
    'native_aspect': 'native aspect',
}


def mode_label(mode: str, modes: Sequence[str]) -> str:
    """The name of ``mode`` in tables and plots: ``'log_n'`` of ``('whole', ...)`` ->
    ``'whole + log-n'``."""
    if mode == 'log_n':
        return f'{mode_label(modes[0], modes)} + log-n'
    return MODE_LABELS.get(mode, mode)


def _evals(run: Dict[str, Any], mode: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """``{scale: metrics}`` of ``run``: its ``eval`` (``mode`` None) or ``modes[mode]``
    (empty when the run has no such mode)."""
    return run['eval'] if mode is None else run.get('modes', {}).get(mode, {})


def summarise(
    runs: Sequence[Dict[str, Any]], metric: str, mode: Optional[str] = None, digits: int = 2
) -> Dict[str, Dict[str, Dict]]:
    """``{encoding: {scale: {'mean', 'std', 'n', 'values'}}}`` of ``metric`` over seeds
    (``std`` is the sample std, 0 with one seed; both rounded to ``digits``), of the runs'
    ``eval`` or, with ``mode``, of their ``modes[mode]``; a run without ``metric`` (e.g. a
    zoom report from before the zoom ladders were timed, or a rung the memory guard
    refused: then counted in a ``refused`` entry) counts as missing."""
    out: Dict[str, Dict[str, Dict[str, Any]]] = {}
    for run in runs:
        for scale, metrics in _evals(run, mode).items():
            entry = out.setdefault(run['encoding'], {}).setdefault(scale, {'values': []})
            entry['values'].append(metrics.get(metric))
            if metrics.get('refused'):
                entry['refused'] = entry.get('refused', 0) + 1
    for per_scale in out.values():
        for entry in per_scale.values():
            vals = [v for v in entry['values'] if v is not None]
            entry['n'] = len(vals)
            entry['mean'] = round(statistics.fmean(vals), digits) if vals else None
            entry['std'] = round(statistics.stdev(vals), digits) if len(vals) > 1 else 0.0
    return out


def format_table(summary: Dict[str, Dict[str, Dict]], study: Dict[str, Any]) -> str:
    """A Markdown table: one row per encoding, one column per test scale."""
    return markdown_table(
        ['encoding'] + _scale_headers(study),
        [
            [enc] + [_cell(per_scale.get(f'{s:g}')) for s in study['scales']]
            for enc, per_scale in summary.items()
        ],
    )


def _cell(entry: Optional[Dict[str, Any]], digits: int = 2) -> str:
    """A table cell: ``mean`` (``mean ± std`` with several seeds), ``refused`` when the
    memory guard refused every seed's pass, ``-`` when missing; ``(n of m refused)``
    follows a mean some seeds' refusals left out."""
    if entry is None or entry['mean'] is None:
        return 'refused' if entry and entry.get('refused') else '-'
    if entry['n'] > 1:
        cell = f'{entry["mean"]:.{digits}f} ± {entry["std"]:.{digits}f}'
    else:
        cell = f'{entry["mean"]:.{digits}f}'
    if entry.get('refused'):
        cell += f' ({entry["refused"]} of {len(entry["values"])} refused)'
    return cell


def _scale_headers(study: Dict[str, Any]) -> List[str]:
    th, tw = study['train_size']
    return [f'{s:g}x ({round(th * float(s))}x{round(tw * float(s))})' for s in study['scales']]


def write_csv(path: str, runs: Sequence[Dict[str, Any]], study: Dict[str, Any]) -> None:
    """One row per (encoding, seed, scale) with the summary metrics of that evaluation;
    with ``study['modes']``, one row per (encoding, seed, mode, scale) and a ``mode``
    column."""
    modes = study.get('modes')
    keys: List[str] = []
    for run in runs:
        for evals in [run['eval'], *run.get('modes', {}).values()]:
            for metrics in evals.values():
                keys += [k for k in metrics if not k.startswith('IoU.') and k not in keys]
    rows = []
    for run in runs:
        for i, mode in enumerate(modes or [None]):
            for scale, metrics in _evals(run, None if i == 0 else mode).items():
                th, tw = (round(v * float(scale)) for v in study['train_size'])
                if mode == 'native_aspect':  # sizes differ per image
                    th = tw = ''
                rows.append(
                    [
                        run['encoding'],
                        run['seed'],
                        *([mode] if modes else []),
                        scale,
                        th,
                        tw,
                        *[metrics.get(k) for k in keys],
                        run['train_seconds'],
                    ]
                )
    reporting.write_csv(
        path,
        [
            'encoding',
            'seed',
            *(['mode'] if modes else []),
            'scale',
            'test_h',
            'test_w',
            *keys,
            'train_seconds',
        ],
        rows,
    )


def format_mode_table(
    summaries: Dict[str, Dict[str, Dict[str, Dict]]], study: Dict[str, Any]
) -> str:
    """A Markdown table: one row per encoding and mode (``summaries = {mode: summary}``,
    modes in ``study['modes']`` order), one column per test scale."""
    modes = list(study['modes'])
    rows = []
    encodings = list(dict.fromkeys(e for m in modes for e in summaries.get(m, {})))
    for enc in encodings:
        for i, mode in enumerate(modes):
            per_scale = summaries.get(mode, {}).get(enc)
            if per_scale is None:
                continue
            rows.append(
                [enc if i == 0 else '', mode_label(mode, modes)]
                + [_cell(per_scale.get(f'{s:g}')) for s in study['scales']]
            )
    return markdown_table(['encoding', 'mode'] + _scale_headers(study), rows)


def mode_summaries(
    runs: Sequence[Dict[str, Any]], metric: str, modes: Sequence[str], digits: int = 2
) -> Dict[str, Dict[str, Dict[str, Dict]]]:
    """``{mode: summarise(...)}`` for every mode (the first one is the runs' ``eval``)."""
    return {m: summarise(runs, metric, None if i == 0 else m, digits) for i, m in enumerate(modes)}


def _measured(runs: Sequence[Dict[str, Any]]) -> bool:
    """Whether the runs' evaluations carry time and memory (every ladder's do since the
    zoom ladders were timed; merged older zoom runs do not)."""
    return any('sec_per_img' in m for r in runs for m in r['eval'].values())


def format_cost_table(runs: Sequence[Dict[str, Any]], study: Dict[str, Any]) -> str:
    """A Markdown table of the cost per frame, mean over the seeds of each encoding:
    seconds per frame (model time) and peak memory per mode and scale (``-`` for runs
    without); ``''`` when no run of the report has measurements. ``log_n`` costs what its
    base mode costs and is left out."""
    if not _measured(runs):
        return ''
    modes = [m for m in study['modes'] if m != 'log_n']
    timed = mode_summaries(runs, 'sec_per_img', study['modes'], 4)
    memory = mode_summaries(runs, 'peak_mem_mb', study['modes'], 1)
    rows = []
    for enc in dict.fromkeys(e for t in timed.values() for e in t):
        for i, mode in enumerate(modes):
            cells = [enc if i == 0 else '', mode_label(mode, modes)]
            for s in study['scales']:
                t = timed[mode].get(enc, {}).get(f'{s:g}')
                m = memory[mode].get(enc, {}).get(f'{s:g}')
                if t is None or t['mean'] is None:
                    cells.append('refused' if t and t.get('refused') else '-')
                else:
                    some = (
                        f' ({t["refused"]} of {len(t["values"])} refused)'
                        if t.get('refused')
                        else ''
                    )
                    cells.append(f'{t["mean"]:.3f} s, {m["mean"]:.0f} MB{some}')
            rows.append(cells)
    return markdown_table(['encoding', 'mode'] + _scale_headers(study), rows)


def _mark_refused(ax, per_scale: Dict[str, Dict], scales: Sequence[float], colour) -> bool:
    """An ``x`` at the foot of the axis at every scale whose passes the memory guard
    refused (no mean to plot); whether there was one."""
    xs = [
        s
        for s in scales
        if per_scale.get(f'{s:g}', {}).get('mean') is None
        and per_scale.get(f'{s:g}', {}).get('refused')
    ]
    if xs:
        ax.plot(
            xs,
            [0.03] * len(xs),
            ls='',
            marker='x',
            ms=9,
            mew=2,
            color=colour,
            transform=ax.get_xaxis_transform(),
            clip_on=False,
        )
    return bool(xs)


def _refused_handle():
    from matplotlib.lines import Line2D

    return Line2D([], [], ls='', marker='x', mew=2, color='black', label='refused (memory)')


def plot(
    path: str, summary: Dict[str, Dict[str, Dict]], study: Dict[str, Any], title: str
) -> None:
    """Metric vs test resolution, one line per encoding (error bars: ±1 std over seeds)."""
    with reporting.figure(path, figsize=(7, 4.5), dpi=120) as (_, ax):
        _plot_scales(ax, summary, study, title)


def _plot_scales(
    ax, summary: Dict[str, Dict[str, Dict]], study: Dict[str, Any], title: str
) -> None:
    """The one panel of :func:`plot`."""
    scales = list(study['scales'])
    refused = False
    for enc, per_scale in summary.items():
        xs = [s for s in scales if per_scale.get(f'{s:g}', {}).get('mean') is not None]
        ys = [per_scale[f'{s:g}']['mean'] for s in xs]
        err = [per_scale[f'{s:g}']['std'] for s in xs]
        style = dict(marker='o', lw=2.2 if enc.startswith('lookhere') else 1.4, label=enc)
        if any(err):
            (line, *_) = ax.errorbar(xs, ys, yerr=err, capsize=3, **style)
        else:
            (line,) = ax.plot(xs, ys, **style)
        refused |= _mark_refused(ax, per_scale, scales, line.get_color())
    th, tw = study['train_size']
    ax.set_xscale('log', base=2)
    ax.set_xticks(scales)
    ax.set_xticklabels([f'{s:g}x\n{round(th * s)}x{round(tw * s)}' for s in scales])
    ax.axvline(1.0, color='grey', ls=':', lw=1)
    ax.set_xlabel('test resolution (multiple of the training size)')
    ax.set_ylabel(study['metric'])
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if refused:
        handles.append(_refused_handle())
    ax.legend(handles=handles, fontsize=8)


def plot_modes(
    path: str,
    summaries: Dict[str, Dict[str, Dict[str, Dict]]],
    costs: Dict[str, Dict[str, Dict[str, Dict[str, Dict]]]],
    study: Dict[str, Any],
    title: str,
) -> None:
    """Metric vs test size: one colour per encoding, one line style per mode (solid: the
    first mode, dashed: ``slide``, dotted: ``log_n``); with ``costs`` (``{'sec_per_img' |
    'peak_mem_mb': {mode: summary}}``, empty when not measured) a second panel: seconds and
    peak memory per frame vs size, mean over encodings, per mode."""
    has_cost = bool(costs)
    with reporting.figure(
        path, 1, 2 if has_cost else 1, figsize=(13 if has_cost else 7.5, 5), dpi=120, squeeze=False
    ) as (_, axes):
        _plot_mode_panels(axes[0], summaries, costs, study, title)


def _plot_mode_panels(
    axes,
    summaries: Dict[str, Dict[str, Dict[str, Dict]]],
    costs: Dict[str, Dict[str, Dict[str, Dict[str, Dict]]]],
    study: Dict[str, Any],
    title: str,
) -> None:
    """The panels of :func:`plot_modes`: metric vs size, and (with ``costs``) the costs."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    modes = list(study['modes'])
    styles = {modes[0]: '-', 'slide': '--', 'log_n': ':'}
    scales = list(study['scales'])
    has_cost = bool(costs)
    ax = axes[0]
    encodings = list(dict.fromkeys(e for m in modes for e in summaries.get(m, {})))
    colours = plt.get_cmap('tab10' if len(encodings) <= 10 else 'tab20')
    refused = False
    for j, enc in enumerate(encodings):
        for mode in modes:
            per_scale = summaries.get(mode, {}).get(enc, {})
            refused |= _mark_refused(ax, per_scale, scales, colours(j))
            xs = [s for s in scales if per_scale.get(f'{s:g}', {}).get('mean') is not None]
            if not xs:
                continue
            ys = [per_scale[f'{s:g}']['mean'] for s in xs]
            err = [per_scale[f'{s:g}']['std'] for s in xs]
            ax.errorbar(
                xs,
                ys,
                yerr=err if any(err) else None,
                capsize=3,
                color=colours(j),
                ls=styles.get(mode, '-.'),
                marker='o' if mode == modes[0] else '.',
                lw=2.2 if enc.startswith('lookhere') and mode == modes[0] else 1.3,
            )
    th, tw = study['train_size']
    ticks = [f'{s:g}x\n{round(th * s)}x{round(tw * s)}' for s in scales]
    axis_label = (
        'test frame (multiple of the training crop side)'
        if study.get('ladder') == 'fov'
        else 'test resolution (multiple of the training size; native aspect: longer side)'
    )
    if min(scales) < 1:  # below the training size: a log axis keeps 0.5x .. 4x readable
        ax.set_xscale('log', base=2)
        ax.axvline(1.0, color='grey', ls=':', lw=1)
    ax.set_xticks(scales)
    ax.set_xticklabels(ticks)
    ax.set_xlabel(axis_label)
    ax.set_ylabel(study['metric'])
    ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colours(j), lw=2, label=e) for j, e in enumerate(encodings)]
    handles += [
        Line2D([], [], color='black', ls=styles.get(m, '-.'), label=mode_label(m, modes))
        for m in modes
    ]
    if refused:
        handles.append(_refused_handle())
    ax.legend(handles=handles, fontsize=7, ncol=2)
    ax.set_title(title, fontsize=9)
    if has_cost:
        ax2 = axes[1]
        ax3 = ax2.twinx()
        for mode in [m for m in modes if m != 'log_n']:
            for key, axis, marker in (('sec_per_img', ax2, 'o'), ('peak_mem_mb', ax3, 's')):
                per_enc = costs[key].get(mode, {})
                ys = []
                for s in scales:
                    vals = [
                        p[f'{s:g}']['mean']
                        for p in per_enc.values()
                        if p.get(f'{s:g}', {}).get('mean') is not None
                    ]
                    ys.append(statistics.fmean(vals) if vals else float('nan'))
                axis.plot(
                    scales,
                    ys,
                    ls=styles.get(mode, '-.'),
                    marker=marker,
                    color='tab:green' if key == 'sec_per_img' else 'tab:red',
                    label=f'{mode_label(mode, modes)}: '
                    f'{"s / frame" if key == "sec_per_img" else "peak MB"}',
                )
        ax2.set_yscale('log')
        if min(scales) < 1:
            ax2.set_xscale('log', base=2)
        ax2.set_xticks(scales)
        ax2.set_xticklabels(ticks)
        ax2.set_xlabel(axis_label)
        ax2.set_ylabel('seconds per frame (model time, log scale)', color='tab:green')
        ax3.set_ylabel('peak memory (MB)', color='tab:red')
        lines = ax2.get_legend_handles_labels()
        more = ax3.get_legend_handles_labels()
        ax2.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7)
        ax2.set_title('cost per frame, mean over encodings', fontsize=9)
        ax2.grid(alpha=0.3)


def attack_settings(settings: Dict[str, Any]):
    """The :class:`~research.robustness.AttackSettings` of a report's
    ``settings['robustness']``."""
    from ..robustness import AttackSettings, settings_from_dict

    fields = set(AttackSettings.__dataclass_fields__)
    return settings_from_dict({k: v for k, v in settings['robustness'].items() if k in fields})


def _robust_runs(runs: Sequence[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """``{encoding: [robustness results of each seed]}`` of the runs that were attacked."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for run in runs:
        if run.get('robustness'):
            out.setdefault(run['encoding'], []).append(run['robustness'])
    return out


def summarise_robustness(
    runs: Sequence[Dict[str, Any]], metric: str = 'mIoU', digits: int = 2
) -> Dict[str, Dict[str, Any]]:
    """``{encoding: {'clean': entry, attack: {eps: entry}, attack + '_mean': entry}}`` with
    ``entry = {'mean', 'std', 'n', 'values'}`` over seeds (``attack_mean``: the mean over the
    strengths of each seed, then over seeds)."""
    from ..robustness import strength_means

    def entry(values):
        return dict(
            values=values,
            n=len(values),
            mean=round(statistics.fmean(values), digits),
            std=round(statistics.stdev(values), digits) if len(values) > 1 else 0.0,
        )

    out: Dict[str, Dict[str, Any]] = {}
    for enc, many in _robust_runs(runs).items():
        summary: Dict[str, Any] = {'clean': entry([r['clean'][metric] for r in many])}
        for attack in [a for a in many[0] if a != 'clean']:
            summary[attack] = {
                eps: entry([r[attack][eps][metric] for r in many]) for eps in many[0][attack]
            }
            summary[f'{attack}_mean'] = entry([strength_means(r, metric)[attack] for r in many])
        out[enc] = summary
    return out


def format_robustness(
    runs: Sequence[Dict[str, Any]], settings: Dict[str, Any], metric: str = 'mIoU'
) -> str:
    """The robustness table of a report (one row per encoding, mean ± std over seeds;
    :func:`~research.robustness.format_robustness_table`)."""
    from ..robustness import format_robustness_table

    return format_robustness_table(
        _robust_runs(runs), attack_settings(settings), metric, 'encoding'
    )


def write_robustness_csv(path: str, runs: Sequence[Dict[str, Any]]) -> None:
    """One row per (encoding, seed, attack, strength) with the row's summary metrics,
    ``loss`` and ``max_linf`` (the clean model: attack ``clean``, eps 0)."""
    keys = ['mIoU', 'aAcc', 'mAcc', 'loss', 'max_linf', 'images', 'seconds']
    rows = []
    for run in runs:
        res = run.get('robustness')
        if not res:
            continue
        rows.append(
            [run['encoding'], run['seed'], 'clean', 0, *[res['clean'].get(k) for k in keys]]
        )
        for attack in [a for a in res if a != 'clean']:
            for eps, row in res[attack].items():
                rows.append(
                    [run['encoding'], run['seed'], attack, eps, *[row.get(k) for k in keys]]
                )
    reporting.write_csv(path, ['encoding', 'seed', 'attack', 'eps', *keys], rows)


def format_slopes(runs: Sequence[Dict[str, Any]]) -> str:
    """A Markdown table of the learned LookHere slopes (global, per layer) of every run
    that learned them; ``''`` when none did."""
    rows = [r for r in runs if r.get('slopes')]
    if not rows:
        return ''
    return markdown_table(
        ['run', 'seed', 'global slope', 'layer slopes'],
        [
            [
                r['encoding'],
                r['seed'],
                f'{r["slopes"]["global_slope"]:.3f}',
                ', '.join(f'{v:.3f}' for v in r['slopes']['layer']),
            ]
            for r in rows
        ],
    )


#: settings that may differ between reports merged with ``--merge``
MERGEABLE = ('encodings', 'seeds')


#: settings only the reports with such runs record (``jumbo_tokens``: of the ``+jumbo``
#: runs); they must agree where both reports have them
ONE_SIDED = ('jumbo_tokens',)


def merge_reports(
    paths: Sequence[str], command: str, metric: Optional[str] = None
) -> Dict[str, Any]:
    """Combine the runs of earlier ``{name}.json`` reports made with the same settings
    (e.g. seeds run on different machines) into one report; ``metric``: tabulate this one
    of the runs' metrics instead of the reports' (None: theirs).

    Raises:
        ConfigError: a file twice, settings that differ (by name), one (encoding, seed)
            twice, a ``metric`` no run has.
        FileNotFoundError: a missing report.
    """
    from lookhere_dense.errors import ConfigError
    from lookhere_dense.validation import is_number

    from .ladders import check_metric

    if len(set(map(osp.abspath, paths))) < len(paths):
        raise ConfigError(f'--merge: a report is named twice ({list(paths)})')
    reports = []
    for path in paths:
        if not osp.isfile(path):
            raise FileNotFoundError(f'--merge: report {path!r} not found')
        with open(path) as f:
            reports.append(json.load(f))
    base = reports[0]['settings']
    for path, rep in zip(paths[1:], reports[1:]):
        diff = sorted(
            k
            for k in set(base) | set(rep['settings'])
            if k not in MERGEABLE
            and not (k in ONE_SIDED and (k not in base or k not in rep['settings']))
            and json.dumps(base.get(k), sort_keys=True, default=str)
            != json.dumps(rep['settings'].get(k), sort_keys=True, default=str)
        )
        if diff:
            raise ConfigError(
                f'cannot merge {path!r} into {paths[0]!r}: settings differ in {diff}'
            )
    runs, seen = [], set()
    for path, rep in zip(paths, reports):
        for run in rep['runs']:
            key = (run['encoding'], run['seed'])
            if key in seen:
                raise ConfigError(f'encoding {key[0]!r} seed {key[1]} appears twice ({path!r})')
            seen.add(key)
            runs.append(run)
    settings = dict(base)
    for rep in reports[1:]:
        settings.update({k: rep['settings'][k] for k in ONE_SIDED if k in rep['settings']})
    if metric is not None:
        found = sorted(
            {
                k
                for r in runs
                for row in _evals(r, None).values()
                for k, v in row.items()
                if is_number(v)
            }
        )
        check_metric(metric, found, 'the merged runs')
        settings['metric'] = metric
    settings['encodings'] = list(dict.fromkeys(r['encoding'] for r in runs))
    settings['seeds'] = sorted({r['seed'] for r in runs})
    sources = [
        dict(
            path=p,
            command=r['command'],
            date=r['date'],
            wall_seconds=r['wall_seconds'],
            versions=r['versions'],
        )
        for p, r in zip(paths, reports)
    ]
    return dict(
        command=command,
        date=datetime.datetime.now().isoformat(timespec='seconds'),
        wall_seconds=round(sum(r['wall_seconds'] for r in reports), 1),
        versions=reports[0]['versions'],
        merged_from=sources,
        settings=settings,
        runs=runs,
    )


def write_outputs(report: Dict[str, Any], out_dir: str, name: str) -> Dict[str, Any]:
    """Add the summary and table to ``report`` and write ``<out_dir>/<name>.json``,
    ``.csv``, ``_table.md`` and ``.png`` (with robustness also ``_robustness.csv`` and
    ``_robustness.png``); returns ``report``."""
    settings = report['settings']
    study = dict(
        scales=tuple(settings['scales']),
        metric=settings['metric'],
        train_size=tuple(settings['train_size']),
        ladder=settings['ladder'],
    )
    if settings.get('modes'):
        study['modes'] = tuple(settings['modes'])
    report['summary'] = summarise(report['runs'], study['metric'])
    size = f'{study["train_size"][0]}x{study["train_size"][1]}'
    title = (
        f'{osp.basename(settings["config"])}: {settings["iters"]} iters, seeds '
        f'{settings["seeds"]}, trained at {size}'
    )
    if 'modes' in study:
        summaries = mode_summaries(report['runs'], study['metric'], study['modes'])
        report['summary_modes'] = {m: summaries[m] for m in study['modes'][1:]}
        table = format_mode_table(summaries, study)
        cost = format_cost_table(report['runs'], study)
        report['table'] = table
        if cost:
            report['cost_table'] = cost
        text = (
            f'{study["metric"]} by test frame and mode (trained at {size}, seeds '
            f'{settings["seeds"]})\n\n{table}\n'
        )
        if cost:
            text += (
                f'\nseconds per frame (model time) and peak memory '
                f'({_memory_kind(report["runs"])}), mean over seeds\n\n{cost}\n'
            )
    else:
        report['table'] = table = format_table(report['summary'], study)
        text = (
            f'{study["metric"]} by test resolution (trained at {size}, seeds '
            f'{settings["seeds"]})\n\n{table}\n'
        )
    if study.get('modes') and 'native_aspect' in study['modes']:
        text += (
            f'\nnative aspect: images at their own aspect ratio, the longer side the '
            f"column's scale x {max(study['train_size'])} px\n"
        )
    if settings.get('robustness'):
        rob = settings['robustness']
        report['summary_robustness'] = summarise_robustness(report['runs'], study['metric'])
        report['robustness_table'] = rob_table = format_robustness(
            report['runs'], settings, study['metric']
        )
        pgd = f', PGD {rob["steps"]} steps' if 'pgd' in rob['attacks'] else ''
        text += (
            f'\n{study["metric"]} under attack (L-inf eps in pixel units /255{pgd}; '
            f'validation images at 1x; mean over seeds)\n\n{rob_table}\n'
        )
    slopes = format_slopes(report['runs'])
    if slopes:
        report['slopes_table'] = slopes
        text += f'\nlearned LookHere slopes\n\n{slopes}\n'
    stem = osp.join(reporting.ensure_dir(out_dir), name)
    reporting.write_json(stem + '.json', report, indent=1, default=str)
    write_csv(stem + '.csv', report['runs'], study)
    if settings.get('robustness'):
        from ..robustness import plot_robustness

        write_robustness_csv(stem + '_robustness.csv', report['runs'])
        plot_robustness(
            stem + '_robustness.png',
            _robust_runs(report['runs']),
            attack_settings(settings),
            f'{title}; attacked at 1x',
            study['metric'],
        )
    reporting.write_text(stem + '_table.md', text)
    if 'modes' in study:
        costs = (
            {
                k: mode_summaries(report['runs'], k, study['modes'], 4)
                for k in ('sec_per_img', 'peak_mem_mb')
            }
            if _measured(report['runs'])
            else {}
        )
        plot_modes(stem + '.png', summaries, costs, study, title)
    else:
        plot(stem + '.png', report['summary'], study, title)
    return report


def _memory_kind(runs: Sequence[Dict[str, Any]]) -> str:
    """What the peak memory of a report measured (``process_rss``: the process's peak
    resident set size; ``cuda_max_allocated``)."""
    kinds = {
        m.get('memory_kind')
        for r in runs
        for evals in [r['eval'], *r.get('modes', {}).values()]
        for m in evals.values()
        if m.get('memory_kind')
    }
    return ', '.join(sorted(kinds)) or 'not measured'
