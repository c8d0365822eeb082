#!/usr/bin/env python
"""Benchmarks of the LookHere attention engine, ratios measured side by side in one run.

Sections (``--sections``, default all that apply to the device):

``bias``   Building the LookHere bias of a 64x64 grid for 12 layers x 12 heads: our
           relative-offset tables (what every backend uses) vs a loop-based
           construction that follows the official algorithm (Python loops over query
           patches, per-query triangle masks with ``np.tri``, float64 numpy, dense
           ``(depth, heads, N, N)`` result, bf16 rounding). Each case runs in a fresh
           subprocess; peak memory is the rise of the process's peak RSS (``VmHWM``,
           reset after imports and a tiny warm-up). The baseline runs ``--baseline-depth``
           layers (default 1: 12 would need ~40 GB) and is extrapolated linearly in depth
           from its measured per-layer stage; the output says so.
``vit``    ViT-B forward at 512x512 (batch 1, inference): LookHereViT (``auto`` backend,
           plus each of ``--vit-backends``) vs the same trunk with plain SDPA and no
           position bias vs mmseg's ``VisionTransformer``. Repeats are interleaved
           (rotating order); ratios are medians of per-round ratios.
``frame``  ViT-B whole-frame 1024x2048 inference (batch 1): peak memory and time per
           backend, each case in a fresh subprocess (order interleaved over repeats).
``attn``   (``--device cuda`` only) attention-only microbenchmark at 1024 / 4096 / 8192
           tokens: LookHere flex (compiled, block mask) vs SDPA without bias vs SDPA with
           the materialised bias. On CPU this section only reports the block-mask tile
           sparsity (the fraction of tiles flex skips), which needs no GPU.

Output: a table on stdout and, with ``--json``, the results and the exact command.

Examples::

    python tools/benchmark.py --json docs/benchmark_cpu.json          # full CPU run
    python tools/benchmark.py --quick                                 # < 1 min smoke run
    python tools/benchmark.py --device cuda --json docs/benchmark_cuda.json
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from lookhere_dense.lookhere import (LookHereAttentionEngine, build_grid_bias,  # noqa: E402
                                     head_layout, layer_slopes, resolve_lh_config)
from lookhere_dense.lookhere.flex import (flex_attention_lookhere,  # noqa: E402
                                          lookhere_block_mask)

GiB = 2 ** 30
MiB = 2 ** 20
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
SECTIONS = ('bias', 'vit', 'frame', 'attn')


# ----------------------------------------------------------------------------------------
# Memory and timing helpers
# ----------------------------------------------------------------------------------------
def _proc_status(field: str) -> Optional[int]:
    """A ``kB`` field of ``/proc/self/status`` in bytes, or None off Linux."""
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset the process's peak RSS (``VmHWM``) to its current RSS; False if unsupported."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False


def peak_rss() -> int:
    """Peak resident set size of this process in bytes (``VmHWM``, else ``ru_maxrss``)."""
    hwm = _proc_status('VmHWM')
    if hwm is not None:
        return hwm
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss() -> int:
    """Current resident set size in bytes (0 if unknown)."""
    return _proc_status('VmRSS') or 0


class MemoryWindow:
    """Peak memory of a code region: host RSS rise, or CUDA allocator peak on ``cuda``."""

    def __init__(self, device: str):
        self.device = device

    def __enter__(self) -> 'MemoryWindow':
        gc.collect()
        if self.device == 'cuda':
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.exact = reset_peak_rss()
            self.start = current_rss() if self.exact else peak_rss()
        return self

    def __exit__(self, *exc) -> None:
        if self.device == 'cuda':
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated()
        else:
            self.peak = peak_rss()
        self.rise = max(0, self.peak - self.start)


def sync(device: str) -> None:
    """Wait for queued device work (CUDA) so wall-clock timings are honest."""
    if device == 'cuda':
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    """Seconds one call of ``fn`` takes (device-synchronised)."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def interleaved(cases: Dict[str, Callable[[], Any]], repeats: int, device: str
                ) -> Dict[str, List[float]]:
    """Time every case ``repeats`` times, rotating the order each round (drift cancels)."""
    names = list(cases)
    times: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            times[n].append(timed(cases[n], device))
    return times


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of ``num[i] / den[i]`` (robust to load changes between rounds)."""
    return statistics.median(a / b for a, b in zip(num, den))


def run_child(case: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """Run one benchmark case in a fresh interpreter; its last stdout line is JSON."""
    cmd = [sys.executable, str(Path(__file__).resolve()), '--child', json.dumps(case)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return dict(case, error=f'timed out after {timeout:.0f} s')
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return dict(case, error=f'exit {proc.returncode}: ' + ' | '.join(tail))
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------------------
# Baseline: the official algorithm, written as plain loops over numpy arrays
# ----------------------------------------------------------------------------------------
def _cone_rows(height: int, width: int, qy: int, qx: int) -> Dict[str, np.ndarray]:
    """Visible keys ``(H, W)`` of the four 90-degree cones of query ``(qy, qx)``.

    Built from shifted triangular matrices (``np.tri``) per query, the official way.
    ``i``/``j`` are key rows/columns; ``dy = i - qy``, ``dx = j - qx``.
    """
    d, s = qx - qy, qx + qy
    tri = lambda k: np.tri(height, width, k=k, dtype=bool)  # noqa: E731  j <= i + k
    dx_ge_dy = ~tri(d - 1)                                   # j - i >= qx - qy
    dx_le_dy = tri(d)                                        # j - i <= qx - qy
    sum_le = ~np.fliplr(tri(width - 2 - s))                  # i + j <= qx + qy
    sum_ge = np.fliplr(tri(width - 1 - s))                   # i + j >= qx + qy
    return {'up': dx_ge_dy & sum_le, 'down': dx_le_dy & sum_ge,
            'left': dx_le_dy & sum_le, 'right': dx_ge_dy & sum_ge}


def _half_rows(height: int, width: int, qy: int, qx: int) -> Dict[str, np.ndarray]:
    """Visible keys ``(H, W)`` of the four half planes of query ``(qy, qx)``."""
    i = np.arange(height)[:, None].repeat(width, 1)
    j = np.arange(width)[None, :].repeat(height, 0)
    return {'up': i <= qy, 'down': i >= qy, 'left': j <= qx, 'right': j >= qx}


def official_style_bias(config, grid_size: Tuple[int, int], depth: int, num_heads: int,
                        marks: Optional[Dict[str, float]] = None) -> torch.Tensor:
    """Dense LookHere bias ``(depth, heads, N, N)`` the way the official code builds it.

    Loops over query patches for the direction masks (per-query ``np.tri`` triangles and
    half planes), float64 numpy distance matrices tiled over heads, per-head fill, slopes,
    then per layer: scale, ``nan_to_num(posinf=bf16 max)``, bfloat16, negate. Only the
    head layout/slope rules are shared with the package (:func:`head_layout`).

    Args:
        marks: if given, filled with ``{'shared_s', 'layers_s', 'shared_rss',
            'layers_rss'}`` (seconds and peak RSS after the head stage / after all layers).

    Returns:
        bfloat16 tensor; blocked entries hold ``-bfloat16.max`` as in the official code.
    """
    t0 = time.perf_counter()
    height, width = grid_size
    n = height * width
    direction = config.layer_direction(0)
    specs, head_slopes, _ = head_layout(direction, num_heads)
    ys = np.array([y for y in range(height) for x in range(width)], dtype=np.float64)
    xs = np.array([x for y in range(height) for x in range(width)], dtype=np.float64)
    dist = np.empty((n, n))
    for q in range(n):  # one query row at a time
        dist[q] = np.sqrt((ys - ys[q]) ** 2 + (xs - xs[q]) ** 2)
    if config.distance == 'sqrt':
        dist = dist ** 0.5
    elif config.distance == 'square':
        dist = dist ** 2
    centre = np.sqrt((xs - (width - 1) / 2) ** 2 + (ys - (height - 1) / 2) ** 2)

    prims = {p for spec in specs for p in spec}
    need_cones = any(p.startswith(('tri_', 'diag_')) for p in prims)
    visible = {}  # primitive -> (N, N) bool, built query by query
    for name in ('up', 'down', 'left', 'right'):
        visible[name] = np.ones((n, n), dtype=bool)
        if need_cones:
            visible['tri_' + name] = np.ones((n, n), dtype=bool)
    for q in range(n):
        qy, qx = divmod(q, width)
        for name, rows in _half_rows(height, width, qy, qx).items():
            visible[name][q] = rows.ravel()
        if need_cones:
            for name, rows in _cone_rows(height, width, qy, qx).items():
                visible['tri_' + name][q] = rows.ravel()

    lh = np.tile(dist, (num_heads, 1, 1))
    for h, spec in enumerate(specs):
        blocked = np.zeros((n, n), dtype=bool)
        for prim in spec:
            if prim == 'center':
                lh[h] = centre[None, :]
            elif prim == 'zero':
                lh[h] = 0.0
            elif prim.startswith('diag_'):
                _, a, b = prim.split('_')
                blocked |= ~(visible['tri_' + a] | visible['tri_' + b])
            else:
                blocked |= ~visible[prim]
            if config.fill_with == 'inf':
                lh[h][blocked] = np.inf
            elif config.fill_with == 'zero':
                lh[h][blocked] = 0.0
            else:
                lh[h][blocked] = lh[h].max()
    lh *= head_slopes.numpy()[:, None, None]
    t1 = time.perf_counter()
    shared_rss = peak_rss()

    bf16_max = float(torch.finfo(torch.bfloat16).max)
    out = torch.empty(depth, num_heads, n, n, dtype=torch.bfloat16)
    for layer, slope in enumerate(layer_slopes(config, depth)):
        scaled = np.nan_to_num(config.global_slope * slope * lh, posinf=bf16_max)
        out[layer] = torch.from_numpy(scaled).to(torch.bfloat16) * -1.0
        del scaled
    if marks is not None:
        marks.update(shared_s=t1 - t0, layers_s=time.perf_counter() - t1,
                     shared_rss=shared_rss, layers_rss=peak_rss())
    return out


def baseline_matches(preset: str = 'lh45', grid: Tuple[int, int] = (5, 7)) -> bool:
    """Whether the baseline gives our dense bias (bf16 max <-> -inf) on a small grid."""
    from lookhere_dense.lookhere import lookhere_bias
    ok = True
    for p in (preset, 'lh90', 'lh180'):
        cfg = resolve_lh_config(p)
        ours = lookhere_bias(cfg, grid, 3, 12, dtype=torch.float32)
        theirs = official_style_bias(cfg, grid, 3, 12).float()
        theirs[theirs == -torch.finfo(torch.bfloat16).max] = -math.inf
        ok &= bool(torch.equal(ours, theirs))
    return ok


# ----------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------
class PlainAttention:
    """Stands in for the LookHere engine: plain SDPA, no position bias (same trunk)."""

    def __call__(self, q, k, v, layer, grid_size, cls_token, dropout_p=0.0, backend=None):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)


def set_engine(model, engine) -> None:
    """Make ``model`` (a LookHereViT with ``pos_encoding='lookhere'``) attend with ``engine``."""
    model.pos_enc.engine = engine
    model.lookhere = engine


def vit_kwargs(args) -> Dict[str, Any]:
    """Architecture of the benchmarked ViT (ViT-B/16 unless overridden)."""
    return dict(patch_size=16, embed_dims=args.embed_dims, num_layers=args.num_layers,
                num_heads=args.num_heads, mlp_ratio=4)


def build_lookhere(arch: Dict[str, Any], preset: str, backend: str, block_size: int,
                   device: str, dtype: torch.dtype, plain: bool = False):
    """A LookHereViT in eval mode (``plain``: its engine replaced by :class:`PlainAttention`)."""
    from lookhere_dense.models.backbones.lookhere_vit import LookHereViT
    torch.manual_seed(0)
    model = LookHereViT(**arch, preset=preset, attn_backend='auto' if plain else backend,
                        attn_block_size=block_size)
    model.init_weights()
    if plain:
        set_engine(model, PlainAttention())
    return model.eval().to(device=device, dtype=dtype)


def build_mmseg_vit(arch: Dict[str, Any], img_size: Tuple[int, int], device: str,
                    dtype: torch.dtype):
    """mmseg's ``VisionTransformer`` (absolute position embedding) in eval mode."""
    from mmseg.models.backbones import VisionTransformer
    torch.manual_seed(0)
    model = VisionTransformer(img_size=img_size, **arch, final_norm=True)
    model.init_weights()
    model.eval()  # mmseg's train() returns None
    return model.to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------------------
# Child cases (fresh process each)
# ----------------------------------------------------------------------------------------
def child_bias(case: Dict[str, Any]) -> Dict[str, Any]:
    """Time and peak-RSS rise of one bias construction (ours or the baseline)."""
    if case.get('threads'):
        torch.set_num_threads(case['threads'])
    cfg = resolve_lh_config(case['preset'])
    grid, depth, heads = tuple(case['grid']), case['depth'], case['heads']
    if case['impl'] == 'baseline':
        official_style_bias(cfg, (3, 3), depth, heads)  # warm-up of numpy code paths
        marks: Dict[str, float] = {}
        with MemoryWindow('cpu') as mem:
            t0 = time.perf_counter()
            official_style_bias(cfg, grid, depth, heads, marks)
            seconds = time.perf_counter() - t0
        return dict(case, seconds=seconds, peak_rise=mem.rise, peak=mem.peak,
                    exact_peak=mem.exact, shared_s=marks['shared_s'],
                    layers_s=marks['layers_s'], shared_rise=marks['shared_rss'] - mem.start,
                    layers_rise=marks['layers_rss'] - marks['shared_rss'])
    build_grid_bias(cfg, (3, 3), depth, heads)  # warm-up of torch code paths
    with MemoryWindow('cpu') as mem:
        t0 = time.perf_counter()
        gb = build_grid_bias(cfg, grid, depth, heads)
        seconds = time.perf_counter() - t0
    times = [seconds]
    for _ in range(case.get('repeats', 5)):
        t0 = time.perf_counter()
        build_grid_bias(cfg, grid, depth, heads)
        times.append(time.perf_counter() - t0)
    table_bytes = gb.table.numel() * gb.table.element_size()
    with MemoryWindow('cpu') as dense_mem:
        t0 = time.perf_counter()
        gb.dense(0, cls_token=True)
        dense_s = time.perf_counter() - t0
    return dict(case, seconds=statistics.median(times), first_seconds=seconds,
                peak_rise=mem.rise, peak=mem.peak, exact_peak=mem.exact,
                table_bytes=table_bytes, dense_layer_seconds=dense_s,
                dense_layer_rise=dense_mem.rise)


def child_frame(case: Dict[str, Any]) -> Dict[str, Any]:
    """One whole-frame inference case: peak memory and seconds per forward."""
    device, dtype = case['device'], DTYPES[case['dtype']]
    if case.get('threads'):
        torch.set_num_threads(case['threads'])
    plain = case['backend'] == 'nobias'
    model = build_lookhere(case['arch'], case['preset'],
                           'auto' if plain else case['backend'], case.get('block_size', 0),
                           device, dtype, plain=plain)
    x = torch.randn(1, 3, *case['size'], device=device, dtype=dtype)
    times = []
    with torch.inference_mode():
        with MemoryWindow(device) as mem:
            for _ in range(case['repeats']):
                times.append(timed(lambda: model(x), device))
    chosen = None if plain else model.lookhere.last_backend
    return dict(case, seconds=statistics.median(times), times=times, peak=mem.peak,
                peak_rise=mem.rise, start=mem.start, chosen=chosen,
                exact_peak=getattr(mem, 'exact', True),
                tokens=(math.ceil(case['size'][0] / 16) * math.ceil(case['size'][1] / 16) + 1))


# ----------------------------------------------------------------------------------------
# Sections
# ----------------------------------------------------------------------------------------
def bench_bias(args) -> Dict[str, Any]:
    """Section ``bias``: our tables vs the loop-based official-style construction."""
    grid = (args.grid, args.grid)
    base = dict(kind='bias', preset=args.bias_preset, grid=grid, heads=args.num_heads,
                threads=args.threads)
    ours = run_child(dict(base, impl='ours', depth=args.bias_layers, repeats=args.repeats),
                     args.child_timeout)
    theirs = run_child(dict(base, impl='baseline', depth=args.baseline_depth),
                       args.child_timeout)
    out = dict(preset=args.bias_preset, grid=list(grid), layers=args.bias_layers,
               heads=args.num_heads, ours=ours, baseline=theirs,
               baseline_matches_ours=baseline_matches())
    if 'error' in ours or 'error' in theirs:
        return out
    d = args.baseline_depth
    per_layer_s = theirs['layers_s'] / d
    per_layer_rise = theirs['layers_rise'] / d
    extra = args.bias_layers - d
    est_s = theirs['seconds'] + extra * per_layer_s
    est_rise = theirs['peak_rise'] + extra * max(per_layer_rise, 0)
    n = args.grid ** 2
    out.update(
        baseline_extrapolated=dict(
            layers=args.bias_layers, seconds=est_s, peak_rise=est_rise,
            how=(f'measured with {d} layer(s); the per-layer stage (scale, nan_to_num, '
                 f'bf16) x {args.bias_layers}, its peak-RSS growth likewise; the float64 '
                 f'(layers, heads, N, N) array alone is '
                 f'{args.bias_layers * args.num_heads * n * n * 8 / GiB:.1f} GiB')),
        speedup_vs_measured=theirs['seconds'] / ours['seconds'],
        speedup_vs_extrapolated=est_s / ours['seconds'],
        memory_ratio_vs_measured=ours['peak_rise'] / max(theirs['peak_rise'], 1),
        memory_ratio_vs_extrapolated=ours['peak_rise'] / max(est_rise, 1))
    return out


def bench_vit(args) -> Dict[str, Any]:
    """Section ``vit``: LookHereViT vs the same trunk without bias vs mmseg's ViT."""
    device, dtype = args.device, DTYPES[args.dtype]
    size = (args.vit_size, args.vit_size)
    arch = vit_kwargs(args)
    lookhere = build_lookhere(arch, args.preset, 'auto', args.block_size, device, dtype)
    x = torch.randn(args.vit_batch, 3, *size, device=device, dtype=dtype)
    engines = {'lookhere': lookhere.lookhere}
    for b in args.vit_backends:
        engines[f'lookhere-{b}'] = LookHereAttentionEngine(
            lookhere.lh_config, arch['num_layers'], arch['num_heads'], b, args.block_size)
    engines['nobias'] = PlainAttention()
    models: Dict[str, Callable[[], Any]] = {}

    def run_with(engine):
        def fn():
            set_engine(lookhere, engine)
            return lookhere(x)
        return fn

    for name, eng in engines.items():
        models[name] = run_with(eng)
    if not args.no_mmseg:
        mmseg_vit = build_mmseg_vit(arch, size, device, dtype)
        models['mmseg_vit'] = lambda: mmseg_vit(x)
    cold = {}
    with torch.inference_mode():
        for name, fn in models.items():  # first call: builds tables / dense caches
            cold[name] = timed(fn, device)
        times = interleaved(models, args.repeats, device)
    chosen = engines['lookhere'].last_backend
    set_engine(lookhere, engines['lookhere'])
    tokens = (args.vit_size // 16) ** 2 + 1
    res = dict(size=list(size), batch=args.vit_batch, tokens=tokens, auto_backend=chosen,
               cold_seconds=cold, seconds={n: statistics.median(t) for n, t in times.items()},
               times=times,
               ratio_vs_nobias={n: paired_ratio(t, times['nobias']) for n, t in times.items()},
               cache=engines['lookhere'].cache_info())
    return res


def bench_frame(args) -> Dict[str, Any]:
    """Section ``frame``: whole-frame inference per backend, fresh process per case."""
    arch = vit_kwargs(args)
    size = tuple(args.frame_size)
    tokens = math.ceil(size[0] / 16) * math.ceil(size[1] / 16) + 1
    dense_gib = args.num_layers * args.num_heads * tokens ** 2 * DTYPES[args.dtype].itemsize / GiB
    cases = []
    skipped = {}
    for spec in args.frame_backends:
        backend, _, block = spec.partition(':')
        if backend in ('sdpa', 'reference') and dense_gib > args.max_dense_gib:
            skipped[spec] = (f'needs the dense bias of every layer: {dense_gib:.1f} GiB '
                             f'(> --max-dense-gib {args.max_dense_gib})')
            continue
        if backend == 'flex' and args.device != 'cuda':
            skipped[spec] = 'flex is benchmarked on CUDA only (eager flex materialises scores)'
            continue
        cases.append(dict(kind='frame', backend=backend, spec=spec,
                          block_size=int(block) if block else args.block_size,
                          size=list(size), arch=arch, preset=args.preset, device=args.device,
                          dtype=args.dtype, repeats=1, threads=args.threads))
    runs: Dict[str, List[Dict[str, Any]]] = {c['spec']: [] for c in cases}
    for r in range(args.frame_repeats):  # interleave: A B C, B C A, ...
        order = cases[r % len(cases):] + cases[:r % len(cases)] if cases else []
        for c in order:
            runs[c['spec']].append(run_child(c, args.child_timeout))
    res: Dict[str, Any] = dict(size=list(size), tokens=tokens, skipped=skipped,
                               dense_bias_gib_all_layers=dense_gib, cases={})
    for spec, rs in runs.items():
        ok = [r for r in rs if 'error' not in r]
        if not ok:
            res['cases'][spec] = dict(error=rs[0].get('error') if rs else 'not run')
            continue
        res['cases'][spec] = dict(
            seconds=statistics.median(r['seconds'] for r in ok),
            times=[r['seconds'] for r in ok], peak=max(r['peak'] for r in ok),
            peak_rise=max(r['peak_rise'] for r in ok), start=ok[0]['start'],
            chosen=ok[0]['chosen'], exact_peak=all(r['exact_peak'] for r in ok))
    base = res['cases'].get('nobias')
    if base and 'error' not in base:
        for spec, c in res['cases'].items():
            if 'error' in c:
                continue
            c['time_ratio'] = c['seconds'] / base['seconds']
            c['peak_ratio'] = c['peak'] / base['peak']
            c['peak_rise_ratio'] = c['peak_rise'] / max(base['peak_rise'], 1)
    return res


def bench_attention(args) -> Dict[str, Any]:
    """Section ``attn``: flex vs SDPA (no bias) vs SDPA (materialised bias); CUDA timings."""
    device = args.device
    dtype = DTYPES[args.attn_dtype]
    cfg = resolve_lh_config(args.preset)
    res: Dict[str, Any] = dict(preset=args.preset, dtype=args.attn_dtype, cases={})
    for tokens in args.attn_tokens:
        grid = _grid_for(tokens)
        eng = LookHereAttentionEngine(cfg, 1, args.num_heads, 'flex')
        gb = eng.grid_bias(grid, torch.device(device))
        sparsity = {}
        for name, order in (('row order', None),
                            ('tile order', eng.flex_order(grid, False, torch.device(device)))):
            bm = lookhere_block_mask(gb, 0, False, order=order)
            sparsity[name] = 0.0 if bm is None else bm.sparsity() / 100
        case: Dict[str, Any] = dict(grid=list(grid), skipped_tile_fraction=sparsity)
        if device == 'cuda':
            q, k, v = (torch.randn(1, args.num_heads, tokens, args.embed_dims // args.num_heads,
                                   device=device, dtype=dtype) for _ in range(3))
            bias = eng.dense_bias(0, grid, False, q.device, dtype)[None]
            mask = eng.block_mask(0, grid, False, q.device)
            mod = eng.score_mod(0, grid, False, q.device)
            order = eng.flex_order(grid, False, q.device)
            fns = {
                'flex': lambda: flex_attention_lookhere(q, k, v, gb, 0, False, mask, True, mod,
                                                        order),
                'sdpa_nobias': lambda: F.scaled_dot_product_attention(q, k, v),
                'sdpa_dense_bias': lambda: F.scaled_dot_product_attention(q, k, v,
                                                                          attn_mask=bias),
            }
            ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                 attn_mask=bias.float())
            with torch.inference_mode():
                for fn in fns.values():  # compile / warm up
                    for _ in range(3):
                        fn()
                err = (fns['flex']().float() - ref).abs().max().item()
                times = interleaved(fns, max(args.repeats, 10), device)
            case.update(
                seconds={n: statistics.median(t) for n, t in times.items()},
                flex_vs_nobias=paired_ratio(times['flex'], times['sdpa_nobias']),
                dense_vs_flex=paired_ratio(times['sdpa_dense_bias'], times['flex']),
                flex_max_abs_err=err)
            del q, k, v, bias
            torch.cuda.empty_cache()
        res['cases'][str(tokens)] = case
    return res


def _grid_for(tokens: int) -> Tuple[int, int]:
    """A patch grid with ``tokens`` patches, as square as possible (H <= W)."""
    h = int(math.isqrt(tokens))
    while tokens % h:
        h -= 1
    return h, tokens // h


# ----------------------------------------------------------------------------------------
# Output
# ----------------------------------------------------------------------------------------
def _mb(x: Optional[float]) -> str:
    return '-' if x is None else f'{x / MiB:,.0f} MiB'


def format_table(results: Dict[str, Any]) -> str:
    """Human-readable summary of :func:`main`'s results."""
    lines = [f"device: {results['env']['device_name']} | torch {results['env']['torch']} | "
             f"threads {results['env']['threads']}", '']
    b = results.get('bias')
    if b:
        lines.append(f"[bias] {b['grid'][0]}x{b['grid'][1]} grid, {b['layers']} layers x "
                     f"{b['heads']} heads, preset {b['preset']} "
                     f"(baseline == ours on small grids: {b['baseline_matches_ours']})")
        o, t = b['ours'], b['baseline']
        if 'error' in o or 'error' in t:
            lines.append(f"  error: {o.get('error') or t.get('error')}")
        else:
            e = b['baseline_extrapolated']
            lines += [
                f"  ours (tables, {b['layers']} layers): {o['seconds'] * 1e3:9.2f} ms   "
                f"peak RSS rise {_mb(o['peak_rise'])}",
                f"  baseline ({t['depth']} layer measured): {t['seconds']:9.2f} s    "
                f"peak RSS rise {_mb(t['peak_rise'])}",
                f"  baseline ({e['layers']} layers, extrapolated): {e['seconds']:9.2f} s    "
                f"peak RSS rise {_mb(e['peak_rise'])}",
                f"  speed-up {b['speedup_vs_extrapolated']:,.0f}x "
                f"({b['speedup_vs_measured']:,.0f}x vs the measured 1-layer run); memory "
                f"1/{1 / max(b['memory_ratio_vs_extrapolated'], 1e-12):,.0f} "
                f"(1/{1 / max(b['memory_ratio_vs_measured'], 1e-12):,.0f} vs 1 layer)",
                f"  (one layer's dense (heads, N+1, N+1) bias from the tables: "
                f"{o['dense_layer_seconds'] * 1e3:.0f} ms)", '']
    v = results.get('vit')
    if v:
        lines.append(f"[vit] {v['size'][0]}x{v['size'][1]}, batch {v['batch']}, {v['tokens']} "
                     f"tokens; auto -> {v['auto_backend']}")
        lines.append(f"  {'model':<22}{'median s':>10}{'x no-bias':>11}{'cold s':>9}")
        for n, s in v['seconds'].items():
            lines.append(f"  {n:<22}{s:>10.3f}{v['ratio_vs_nobias'][n]:>11.3f}"
                         f"{v['cold_seconds'][n]:>9.2f}")
        lines.append('')
    f = results.get('frame')
    if f:
        lines.append(f"[frame] {f['size'][0]}x{f['size'][1]}, batch 1, {f['tokens']} tokens "
                     f"(dense bias of all layers would be "
                     f"{f['dense_bias_gib_all_layers']:.1f} GiB)")
        lines.append(f"  {'backend':<14}{'chosen':<10}{'s/forward':>10}{'x time':>8}"
                     f"{'peak':>12}{'x peak':>8}{'fwd rise':>12}{'x rise':>8}")
        for spec, c in f['cases'].items():
            if 'error' in c:
                lines.append(f"  {spec:<14}error: {c['error']}")
                continue
            lines.append(f"  {spec:<14}{str(c['chosen'] or '-'):<10}{c['seconds']:>10.2f}"
                         f"{c.get('time_ratio', float('nan')):>8.3f}{_mb(c['peak']):>12}"
                         f"{c.get('peak_ratio', float('nan')):>8.3f}{_mb(c['peak_rise']):>12}"
                         f"{c.get('peak_rise_ratio', float('nan')):>8.3f}")
        for spec, why in f['skipped'].items():
            lines.append(f"  {spec:<14}not run: {why}")
        lines.append('')
    a = results.get('attn')
    if a:
        lines.append(f"[attn] preset {a['preset']}, {a['dtype']}; fraction of 128x128 tiles "
                     f"flex skips (all heads)")
        for tokens, c in a['cases'].items():
            line = (f"  {tokens:>6} tokens {c['grid'][0]}x{c['grid'][1]}: "
                    + ', '.join(f'{d} {s:.0%}' for d, s in c['skipped_tile_fraction'].items()))
            if 'seconds' in c:
                line += (f" | flex {c['seconds']['flex'] * 1e3:.2f} ms, x no-bias "
                         f"{c['flex_vs_nobias']:.2f}, dense-bias/flex {c['dense_vs_flex']:.2f}")
            lines.append(line)
    return '\n'.join(lines)


def environment(args) -> Dict[str, Any]:
    """Machine and library facts recorded with the results."""
    name = platform.processor() or platform.machine()
    if args.device == 'cuda':
        name = torch.cuda.get_device_name(0)
    else:
        try:
            with open('/proc/cpuinfo') as f:
                name = next(ln.split(':', 1)[1].strip() for ln in f if 'model name' in ln)
        except (OSError, StopIteration):
            pass
    try:
        commit = subprocess.run(['git', '-C', str(REPO), 'rev-parse', '--short', 'HEAD'],
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = None
    return dict(device=args.device, device_name=name, torch=torch.__version__, commit=commit,
                threads=torch.get_num_threads(), cpus=os.cpu_count(),
                python=platform.python_version(),
                load_avg=os.getloadavg() if hasattr(os, 'getloadavg') else None)


# ----------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------
QUICK = dict(grid=12, bias_layers=3, baseline_depth=1, embed_dims=96, num_layers=2,
             vit_size=64, frame_size=[64, 128], repeats=2, frame_repeats=1,
             attn_tokens=[64, 256], vit_backends=['chunked'], threads=1,
             frame_backends=['nobias', 'auto'])


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                epilog='Sections and measurement method: see the module '
                                       'docstring and docs/performance.md.')
    p.add_argument('--device', choices=('cpu', 'cuda'), default='cpu',
                   help='where to run (cuda adds the attention timings); default: cpu')
    p.add_argument('--sections', nargs='+', choices=SECTIONS, default=None,
                   help='sections to run (default: all: bias vit frame attn)')
    p.add_argument('--quick', action='store_true',
                   help='tiny sizes for a smoke test (< 1 min); explicit flags still win')
    p.add_argument('--json', type=Path, default=None,
                   help='write the results as JSON here (default: no file)')
    p.add_argument('--preset', default='lh90',
                   help='LookHere preset of the models (default: lh90)')
    p.add_argument('--bias-preset', default='lh45',
                   help='preset of the bias-build section; lh45 uses the triangle masks '
                        '(default: lh45)')
    p.add_argument('--grid', type=int, default=None,
                   help='side of the square grid of the bias section (default 64)')
    p.add_argument('--bias-layers', type=int, default=None,
                   help='layers of our bias build (default 12)')
    p.add_argument('--baseline-depth', type=int, default=None,
                   help='layers the baseline really builds; the rest is extrapolated (default 1)')
    p.add_argument('--embed-dims', type=int, default=None, help='ViT width (default 768)')
    p.add_argument('--num-layers', type=int, default=None, help='ViT depth (default 12)')
    p.add_argument('--num-heads', type=int, default=12, help='ViT heads (default: 12)')
    p.add_argument('--dtype', choices=tuple(DTYPES), default='float32',
                   help='model dtype of the vit and frame sections (default: float32)')
    p.add_argument('--vit-size', type=int, default=None,
                   help='image side of the vit section (default 512)')
    p.add_argument('--vit-batch', type=int, default=1,
                   help='batch of the vit section (default: 1)')
    p.add_argument('--vit-backends', nargs='*', default=None,
                   help="LookHere backends timed besides 'auto' in the vit section "
                        "(default: chunked; on cuda chunked flex)")
    p.add_argument('--no-mmseg', action='store_true',
                   help="skip mmseg's VisionTransformer in the vit section")
    p.add_argument('--frame-size', type=int, nargs=2, default=None, metavar=('H', 'W'),
                   help='image size of the frame section (default 1024 2048)')
    p.add_argument('--frame-backends', nargs='+', default=None,
                   help="frame cases: 'nobias', a backend, or 'chunked:<block rows>' "
                        "(default: nobias auto chunked:256 sdpa; on cuda nobias auto flex "
                        "chunked sdpa)")
    p.add_argument('--frame-repeats', type=int, default=None,
                   help='fresh-process runs per frame case, interleaved (default 2)')
    p.add_argument('--max-dense-gib', type=float, default=8.0,
                   help='skip frame cases whose dense biases would exceed this many GiB '
                        '(default: 8)')
    p.add_argument('--block-size', type=int, default=0,
                   help='query rows per block of the chunked backend (default: 0 = automatic)')
    p.add_argument('--attn-tokens', type=int, nargs='+', default=None,
                   help='token counts of the attn section (default 1024 4096 8192)')
    p.add_argument('--attn-dtype', choices=tuple(DTYPES), default='bfloat16',
                   help='dtype of the attn section (default: bfloat16)')
    p.add_argument('--repeats', type=int, default=None,
                   help='timed repeats per case in-process (default 5)')
    p.add_argument('--threads', type=int, default=None,
                   help='torch threads (default: torch default; 1 with --quick, where tiny '
                        'ops on busy cores otherwise spend their time in thread hand-offs)')
    p.add_argument('--child-timeout', type=float, default=1800,
                   help='seconds before a subprocess case is abandoned (default: 1800)')
    p.add_argument('--child', default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = dict(grid=64, bias_layers=12, baseline_depth=1, embed_dims=768, num_layers=12,
                    vit_size=512, frame_size=[1024, 2048], repeats=5, frame_repeats=2,
                    attn_tokens=[1024, 4096, 8192], vit_backends=['chunked'], threads=None,
                    frame_backends=['nobias', 'auto', 'chunked:256', 'sdpa'])
    if args.device == 'cuda':  # flex is the CUDA path for large grids
        defaults.update(vit_backends=['chunked', 'flex'],
                        frame_backends=['nobias', 'auto', 'flex', 'chunked', 'sdpa'])
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, QUICK[key] if args.quick and key in QUICK else value)
    if args.sections is None:
        args.sections = list(SECTIONS)
    return args


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Run the chosen sections, print the table, write the JSON; return the results."""
    args = parse_args(argv)
    if args.child is not None:
        case = json.loads(args.child)
        fn = child_bias if case['kind'] == 'bias' else child_frame
        print(json.dumps(fn(case)))
        return {}
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda: no CUDA device available')
    if args.threads:
        torch.set_num_threads(args.threads)
    results: Dict[str, Any] = dict(
        command='python tools/benchmark.py ' + ' '.join(
            shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv)),
        env=environment(args), args={k: (str(v) if isinstance(v, Path) else v)
                                    for k, v in vars(args).items() if k != 'child'})
    t0 = time.perf_counter()
    for section, fn in (('bias', bench_bias), ('vit', bench_vit), ('frame', bench_frame),
                        ('attn', bench_attention)):
        if section in args.sections:
            s0 = time.perf_counter()
            results[section] = fn(args)
            results[section]['section_seconds'] = time.perf_counter() - s0
    results['total_seconds'] = time.perf_counter() - t0
    results['env']['load_avg_end'] = os.getloadavg() if hasattr(os, 'getloadavg') else None
    print(format_table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1, default=str) + '\n')
        print(f'\nwrote {args.json}')
    return results


if __name__ == '__main__':
    main()
