"""The robustness report (``tools/robustness.py``): the clean model and every attack at every
strength (:func:`~.segmentor.robustness_sweep`) as a table, JSON and a plot, through the one
reporting layer (:mod:`research.reporting`).
"""

from __future__ import annotations

import copy
import functools
import os.path as osp
import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..reporting import (
    checkpoint_report,
    config_stem,
    figure,
    markdown_table,
    precision_label,
    write_json,
    write_text,
)
from .attacks import AttackSettings
from .segmentor import check_attackable, eps_key, robustness_sweep, strength_means

__all__ = ['attack_warnings', 'format_robustness_table', 'plot_robustness', 'robustness_report']

_print = functools.partial(print, flush=True)


def format_robustness_table(
    rows: Dict[str, Any], settings: AttackSettings, metric: str = 'mIoU', first: str = 'model'
) -> str:
    """A Markdown table, one row per model (``rows = {name: sweep results}``, header of the
    name column ``first``): the clean metric, then per attack one column per strength and
    its mean over the strengths. Cells are ``mean`` or ``mean ± std`` when a row holds
    several results (a list, e.g. seeds)."""
    head = [first, 'clean']
    for attack in settings.attacks:
        head += [f'{attack} {e:g}/255' for e in settings.eps] + [f'{attack} mean']
    table = []
    for name, results in rows.items():
        many = results if isinstance(results, list) else [results]
        cells = [name, _mean_cell([r['clean'][metric] for r in many])]
        for attack in settings.attacks:
            cells += [
                _mean_cell([r[attack][eps_key(e)][metric] for r in many]) for e in settings.eps
            ]
            cells.append(_mean_cell([strength_means(r, metric)[attack] for r in many]))
        table.append(cells)
    return markdown_table(head, table)


def attack_warnings(
    results: Dict[str, Any], metric: str = 'mIoU', tolerance: float = 0.5
) -> List[str]:
    """Where an attack *raised* ``metric`` above the clean model's by more than
    ``tolerance`` points: a sweep whose numbers measure no robustness. The attacks ascend
    the decode head's loss, not the metric; on an undertrained model (near-chance
    predictions) a higher loss can still flip pixels to the right class, and a step too
    small for the model's scale can leave noise only. One line per attack, naming its
    strengths; empty when every attack lowered (or kept) the metric."""
    clean = results['clean'][metric]
    lines = []
    for attack, per_eps in results.items():
        if attack == 'clean':
            continue
        raised = [(key, r[metric]) for key, r in per_eps.items() if r[metric] > clean + tolerance]
        if raised:
            cells = ', '.join(f'{value:.2f} at eps {key}' for key, value in raised)
            lines.append(
                f"{attack} raised {metric} above the clean model's {clean:.2f} ({cells}): "
                'the attack ascends the loss, not the metric, and did not lower it here -- '
                'typical of an undertrained model (near-chance predictions); these rows '
                'measure no robustness. Attack a trained checkpoint, or check the step size '
                '(--step-size) and the number of steps (--steps)'
            )
    return lines


def _mean_cell(values: Sequence[float]) -> str:
    if len(values) > 1:
        return f'{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}'
    return f'{values[0]:.2f}'


def plot_robustness(
    path: str,
    curves: Dict[str, Dict[str, Any]],
    settings: AttackSettings,
    title: str,
    metric: str = 'mIoU',
) -> None:
    """PNG: ``metric`` vs strength, one panel per attack, one line per model (``curves =
    {name: sweep results or a list of them (mean, ±1 std bars)}``); strength 0 is the
    clean model."""
    attacks = list(settings.attacks)
    xs = [0.0, *settings.eps]
    with figure(
        path,
        1,
        len(attacks),
        figsize=(6 * len(attacks), 4.3),
        dpi=120,
        title=title,
        title_size=9,
        squeeze=False,
    ) as (_, axes):
        for ax, attack in zip(axes[0], attacks):
            _plot_attack(ax, attack, curves, settings, xs, metric)


def _plot_attack(
    ax,
    attack: str,
    curves: Dict[str, Dict[str, Any]],
    settings: AttackSettings,
    xs: Sequence[float],
    metric: str,
) -> None:
    """One panel of :func:`plot_robustness`."""
    for name, results in curves.items():
        many = results if isinstance(results, list) else [results]
        series = [[r['clean'][metric] for r in many]]
        series += [[r[attack][eps_key(e)][metric] for r in many] for e in settings.eps]
        ys = [statistics.fmean(v) for v in series]
        err = [statistics.stdev(v) if len(v) > 1 else 0.0 for v in series]
        ax.errorbar(
            xs,
            ys,
            yerr=err if any(err) else None,
            marker='o',
            capsize=3,
            lw=2.2 if name.startswith('lookhere') else 1.4,
            label=name,
        )
    ax.set_xscale('symlog', linthresh=1.0)
    ax.set_xticks(xs)
    ax.set_xticklabels([f'{x:g}' for x in xs])
    steps = f', {settings.steps} steps' if attack == 'pgd' else ''
    ax.set_title(f'{attack.upper()}{steps}', fontsize=10)
    ax.set_xlabel('eps (L-inf, pixel units /255; 0 = clean)')
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def robustness_report(
    config: str,
    checkpoint: str,
    settings: AttackSettings = AttackSettings(),
    split: str = 'val',
    out_dir: Optional[str] = None,
    name: str = 'robustness',
    device: Optional[str] = None,
    cfg_options: Optional[dict] = None,
    command: str = '',
    log: Callable[[str], None] = _print,
) -> Dict[str, Any]:
    """Attack ``checkpoint`` on the ``split`` set at every strength of ``settings`` and
    write ``<out_dir>/<name>.json``, ``.md`` (the table) and ``.png``.

    Images are predicted one per batch (``whole`` mode), as ``tools/extrapolate.py`` does.

    Args:
        config: the mmseg config the checkpoint was trained with (``mmseg::`` paths allowed).
        checkpoint: the checkpoint file.
        settings: attacks, strengths, PGD settings, ``max_images``. Default:
            :class:`AttackSettings` ``()``.
        split: ``'val'`` or ``'test'``: which dataloader of the config. Default: ``'val'``.
        out_dir: output folder. Default: ``work_dirs/<config name>/robustness``.
        name: file stem. Default: ``'robustness'``.
        device: ``'cpu'`` / ``'cuda[:N]'``. Default: None (cuda when available).
        cfg_options: config overrides. Default: None.
        command: the command line, stored in the report. Default: ``''``.
        log: progress lines, the table and the written paths. Default: print (flushed).

    Returns:
        The JSON content (``results``, ``means``, ``table``, ...), plus ``json`` / ``md`` /
        ``png`` (the written paths).

    Raises:
        lookhere_dense.errors.ConfigError: a non-mmseg config, a bad split, a split whose
        pipeline loads no labels or a model without a decode head (:func:`check_attackable`,
        before the model is built), an evaluator without ``mIoU`` (after the clean
        evaluation, before the attacks);
        FileNotFoundError: config or checkpoint missing; the pre-flight data checks'
        errors (:func:`lookhere_dense.apis.cli.preflight`).
    """
    from ..evaluate import model_for_report
    from ..reporting import check_report_target

    check_report_target(config, checkpoint, out_dir, 'robustness', name)
    cfg, model, device = model_for_report(
        config,
        checkpoint,
        split,
        cfg_options,
        'robustness.py',
        device,
        lambda cfg: check_attackable(cfg, split),
    )

    dl_cfg = copy.deepcopy(cfg.get(f'{split}_dataloader'))
    dl_cfg = dl_cfg.to_dict() if hasattr(dl_cfg, 'to_dict') else dict(dl_cfg)
    dl_cfg.update(
        batch_size=1,
        persistent_workers=False,
        num_workers=min(int(dl_cfg.get('num_workers', 0)), 2),
    )
    step = '2.5 eps / steps' if settings.step_size is None else f'{settings.step_size:g}'
    steps = f', PGD {settings.steps} steps of {step}' if 'pgd' in settings.attacks else ''
    log(
        f'{", ".join(settings.attacks)} at eps {", ".join(f"{e:g}" for e in settings.eps)} '
        f'(/255){steps}, on the {split} split'
        f'{f" (first {settings.max_images} images)" if settings.max_images else ""}, '
        f'device {device}, {precision_label(device)}'
    )
    results = robustness_sweep(model, dl_cfg, cfg.get(f'{split}_evaluator'), settings, device, log)
    means = strength_means(results)
    table = format_robustness_table({osp.basename(checkpoint): results}, settings)
    log('\n' + table)
    warnings = attack_warnings(results)
    for line in warnings:
        log(f'\nwarning: {line}')
    out_dir, report = checkpoint_report(
        config,
        checkpoint,
        split,
        device,
        command,
        out_dir,
        'robustness',
        settings=settings.to_json(),
        space='L-inf in 0-255 pixel units (attacked in the normalised input space, '
        'clipped to valid pixels, not re-quantised)',
        loss='decode head (decode.*loss*) against the ground-truth labels',
        results=results,
        means=means,
        table=table,
        warnings=warnings,
    )
    paths = {ext: osp.join(out_dir, f'{name}.{ext}') for ext in ('json', 'md', 'png')}
    write_json(paths['json'], report, indent=1)
    write_text(
        paths['md'],
        f'mIoU under attack ({osp.basename(checkpoint)}, {split} split)\n\n{table}\n'
        + ''.join(f'\n**Warning**: {line}\n' for line in warnings),
    )
    plot_robustness(
        paths['png'],
        {osp.basename(checkpoint): results},
        settings,
        f'{config_stem(config)} — {osp.basename(checkpoint)} ({device}'
        + ('' if report['precision'] == 'float32' else f', {report["precision"]}')
        + ')',
    )
    log(f'\nwrote {paths["json"]}, {paths["md"]} and {paths["png"]}')
    report.update(paths)
    return report
