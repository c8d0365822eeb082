"""Section ``bias``: building the LookHere bias of a large grid, ours vs the baseline.

Ours are the relative-offset tables every backend uses
(:func:`~lookhere_dense.lookhere.build_grid_bias`); the baseline is
:func:`.official.official_style_bias`. Each construction runs in a fresh process
(:func:`.fresh.run_child`) so that its peak memory (the rise of the process's peak RSS,
:class:`~research.memory.PeakMemory`) is its own. The baseline runs
``baseline_depth`` layers (12 would need ~40 GB for a 64x64 grid) and is extrapolated
linearly in depth from its measured per-layer stage; the result says so.

Torch only (numpy for the baseline).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Dict, Optional

import torch

from lookhere_dense.lookhere import build_grid_bias, resolve_lh_config

from ..memory import GiB, PeakMemory
from .fresh import run_child

__all__ = ['bias_case', 'bench_bias']


def _exact(mem: PeakMemory) -> bool:
    """Whether ``mem`` read the kernel's (or CUDA's) peak rather than sampling the RSS."""
    return mem.kind != 'process_rss_sampled'


def bias_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """Time and peak-RSS rise of one bias construction, in this process.

    Args:
        case: ``impl`` (``'ours'`` or ``'baseline'``), ``preset``, ``grid`` ``[H, W]``,
            ``depth``, ``heads``; optional ``repeats`` (ours: timed rebuilds after the
            first, default 5) and ``threads``.

    Returns:
        ``case`` plus ``seconds`` (ours: the median build), ``peak_rise``, ``peak``,
        ``exact_peak``; ours also ``first_seconds``, ``table_bytes``,
        ``dense_layer_seconds`` / ``dense_layer_rise`` (one layer's dense bias with CLS
        from the tables); the baseline ``shared_s`` / ``layers_s`` and ``shared_rise`` /
        ``layers_rise`` (its head stage and its per-layer stage).
    """
    if case.get('threads'):
        torch.set_num_threads(case['threads'])
    cfg = resolve_lh_config(case['preset'])
    grid, depth, heads = tuple(case['grid']), case['depth'], case['heads']
    if case['impl'] == 'baseline':
        from .official import official_style_bias

        official_style_bias(cfg, (3, 3), depth, heads)  # warm-up of numpy code paths
        marks: Dict[str, float] = {}
        with PeakMemory('cpu') as mem:
            t0 = time.perf_counter()
            official_style_bias(cfg, grid, depth, heads, marks)
            seconds = time.perf_counter() - t0
        return dict(
            case,
            seconds=seconds,
            peak_rise=mem.rise_bytes,
            peak=mem.peak_bytes,
            exact_peak=_exact(mem),
            shared_s=marks['shared_s'],
            layers_s=marks['layers_s'],
            shared_rise=marks['shared_rss'] - mem.start_bytes,
            layers_rise=marks['layers_rss'] - marks['shared_rss'],
        )
    if case['impl'] != 'ours':
        raise ValueError(
            f"unknown bias implementation {case['impl']!r}; allowed: ['ours', 'baseline']"
        )
    build_grid_bias(cfg, (3, 3), depth, heads)  # warm-up of torch code paths
    with PeakMemory('cpu') as mem:
        t0 = time.perf_counter()
        gb = build_grid_bias(cfg, grid, depth, heads)
        seconds = time.perf_counter() - t0
    times = [seconds]
    for _ in range(case.get('repeats', 5)):
        t0 = time.perf_counter()
        build_grid_bias(cfg, grid, depth, heads)
        times.append(time.perf_counter() - t0)
    table_bytes = gb.table.numel() * gb.table.element_size()
    with PeakMemory('cpu') as dense_mem:
        t0 = time.perf_counter()
        gb.dense(0, cls_token=True)
        dense_s = time.perf_counter() - t0
    return dict(
        case,
        seconds=statistics.median(times),
        first_seconds=seconds,
        peak_rise=mem.rise_bytes,
        peak=mem.peak_bytes,
        exact_peak=_exact(mem),
        table_bytes=table_bytes,
        dense_layer_seconds=dense_s,
        dense_layer_rise=dense_mem.rise_bytes,
    )


def _baseline_matches(preset: str) -> Optional[bool]:
    """:func:`.official.baseline_matches`, or None where numpy is missing."""
    try:
        from .official import baseline_matches
    except ImportError:  # pragma: no cover - numpy comes with nearly every torch install
        return None
    return baseline_matches(preset)


def bench_bias(
    preset: str = 'lh45',
    grid: int = 64,
    layers: int = 12,
    heads: int = 12,
    baseline_depth: int = 1,
    repeats: int = 5,
    threads: Optional[int] = None,
    timeout: float = 1800,
) -> Dict[str, Any]:
    """Section ``bias``: our tables vs the loop-based official-style construction.

    Args:
        preset: LookHere preset; ``lh45`` uses the triangle masks. Default: ``'lh45'``.
        grid: side of the square patch grid. Default: 64.
        layers: layers of our build (and of the extrapolated baseline). Default: 12.
        heads: heads per layer. Default: 12.
        baseline_depth: layers the baseline really builds. Default: 1.
        repeats: timed rebuilds of ours. Default: 5.
        threads: torch threads in the children; None: torch's default. Default: None.
        timeout: seconds per child. Default: 1800.

    Returns:
        ``ours`` and ``baseline`` (see :func:`bias_case`; ``error`` when a child failed),
        ``baseline_matches_ours``, and (when both ran) ``baseline_extrapolated``,
        ``speedup_vs_measured`` / ``_vs_extrapolated`` and ``memory_ratio_vs_measured`` /
        ``_vs_extrapolated`` (ours / baseline).
    """
    base = dict(kind='bias', preset=preset, grid=(grid, grid), heads=heads, threads=threads)
    ours = run_child(dict(base, impl='ours', depth=layers, repeats=repeats), timeout)
    theirs = run_child(dict(base, impl='baseline', depth=baseline_depth), timeout)
    out = dict(
        preset=preset,
        grid=[grid, grid],
        layers=layers,
        heads=heads,
        ours=ours,
        baseline=theirs,
        baseline_matches_ours=_baseline_matches(preset),
    )
    if 'error' in ours or 'error' in theirs:
        return out
    d = baseline_depth
    per_layer_s = theirs['layers_s'] / d
    per_layer_rise = theirs['layers_rise'] / d
    extra = layers - d
    est_s = theirs['seconds'] + extra * per_layer_s
    est_rise = theirs['peak_rise'] + extra * max(per_layer_rise, 0)
    n = grid**2
    out.update(
        baseline_extrapolated=dict(
            layers=layers,
            seconds=est_s,
            peak_rise=est_rise,
            how=(
                f'measured with {d} layer(s); the per-layer stage (scale, nan_to_num, '
                f'bf16) x {layers}, its peak-RSS growth likewise; the float64 '
                f'(layers, heads, N, N) array alone is '
                f'{layers * heads * n * n * 8 / GiB:.1f} GiB'
            ),
        ),
        speedup_vs_measured=theirs['seconds'] / ours['seconds'],
        speedup_vs_extrapolated=est_s / ours['seconds'],
        memory_ratio_vs_measured=ours['peak_rise'] / max(theirs['peak_rise'], 1),
        memory_ratio_vs_extrapolated=ours['peak_rise'] / max(est_rise, 1),
    )
    return out
