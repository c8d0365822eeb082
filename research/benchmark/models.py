"""Sections ``vit`` and ``frame``: whole ViT-B forwards (torch alone).

Every model is built by :func:`build_vit` from the same seed, so the LookHere models
(one per backend) and the no-bias baseline -- the identical trunk with
``pos_encoding='none'`` -- start from the same weights by construction (the encoding's
own initialisation runs under :func:`~lookhere_dense.lookhere.pos_encoding.isolated_rng`).
mmseg's ``VisionTransformer`` (absolute position embedding) is an outside reference where
mmseg is installed (:func:`build_mmseg_vit`, imported when called).

The models are the torch-only trunk
(:class:`~lookhere_dense.lookhere.vit.LookHereVisionTransformer`, what the registered
``LookHereViT`` wraps), so these sections run where only torch is installed.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from lookhere_dense.lookhere.vit import LookHereVisionTransformer

from ..memory import GiB, PeakMemory
from . import DTYPES
from .fresh import run_child
from .timing import interleaved, paired_ratio, rotations, timed

__all__ = [
    'vit_arch',
    'build_vit',
    'engine_of',
    'build_mmseg_vit',
    'frame_case',
    'bench_vit',
    'bench_frame',
    'NOBIAS',
]

#: Case name of the no-bias baseline (``pos_encoding='none'``).
NOBIAS = 'nobias'


def vit_arch(embed_dims: int = 768, num_layers: int = 12, num_heads: int = 12) -> Dict[str, Any]:
    """Architecture of the benchmarked ViT: ViT-B/16 (``mlp_ratio=4``) unless overridden."""
    return dict(
        patch_size=16,
        embed_dims=embed_dims,
        num_layers=num_layers,
        num_heads=num_heads,
        mlp_ratio=4,
    )


def build_vit(
    arch: Dict[str, Any],
    preset: str = 'lh90',
    backend: str = 'auto',
    block_size: int = 0,
    device: str = 'cpu',
    dtype: torch.dtype = torch.float32,
    pos_encoding: str = 'lookhere',
):
    """A LookHere ViT (the torch-only trunk) in eval mode, initialised from seed 0.

    Args:
        arch: :func:`vit_arch`.
        preset: LookHere preset (``pos_encoding='lookhere'`` only). Default: ``'lh90'``.
        backend: ``attn_backend``. Default: ``'auto'``.
        block_size: ``attn_block_size`` (0: automatic). Default: 0.
        pos_encoding: ``'lookhere'``, or ``'none'`` for the no-bias baseline: the same
            trunk with the same initial weights. Default: ``'lookhere'``.
    """
    torch.manual_seed(0)
    if pos_encoding == 'none':
        model = LookHereVisionTransformer(**arch, pos_encoding='none')
    else:
        model = LookHereVisionTransformer(
            **arch,
            preset=preset,
            attn_backend=backend,
            attn_block_size=block_size,
            pos_encoding=pos_encoding,
        )
    model.init_weights()
    return model.eval().to(device=device, dtype=dtype)


def engine_of(model):
    """The LookHere attention engine of a LookHere ViT (its position encoding's)."""
    return model.pos_enc.engine


def build_mmseg_vit(
    arch: Dict[str, Any],
    img_size: Tuple[int, int],
    device: str = 'cpu',
    dtype: torch.dtype = torch.float32,
):
    """mmseg's ``VisionTransformer`` (absolute position embedding) in eval mode, seed 0."""
    from mmseg.models.backbones import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=img_size, **arch, final_norm=True)
    model.init_weights()
    model.eval()  # mmseg's train() returns None
    return model.to(device=device, dtype=dtype)


def frame_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """One whole-frame inference case, in this process: peak memory and seconds/forward.

    Args:
        case: ``backend`` (``'nobias'`` or an ``attn_backend``), ``block_size``, ``size``
            ``[H, W]``, ``arch``, ``preset``, ``device``, ``dtype`` (name), ``repeats``;
            optional ``threads``.

    Returns:
        ``case`` plus ``seconds`` (median), ``times``, ``peak``, ``peak_rise``, ``start``
        (bytes; CPU: process RSS, CUDA: allocator), ``exact_peak``, ``chosen`` (the
        backend ``auto`` picked; None for the baseline) and ``tokens``.
    """
    device, dtype = case['device'], DTYPES[case['dtype']]
    if case.get('threads'):
        torch.set_num_threads(case['threads'])
    plain = case['backend'] == NOBIAS
    model = build_vit(
        case['arch'],
        case['preset'],
        'auto' if plain else case['backend'],
        case.get('block_size', 0),
        device,
        dtype,
        pos_encoding='none' if plain else 'lookhere',
    )
    x = torch.randn(1, 3, *case['size'], device=device, dtype=dtype)
    times = []
    with torch.inference_mode():
        with PeakMemory(device) as mem:
            for _ in range(case['repeats']):
                times.append(timed(lambda: model(x), device))
    chosen = None if plain else engine_of(model).last_backend
    return dict(
        case,
        seconds=statistics.median(times),
        times=times,
        peak=mem.peak_bytes,
        peak_rise=mem.rise_bytes,
        start=mem.start_bytes,
        chosen=chosen,
        exact_peak=mem.kind != 'process_rss_sampled',
        tokens=(math.ceil(case['size'][0] / 16) * math.ceil(case['size'][1] / 16) + 1),
    )


def bench_vit(
    arch: Dict[str, Any],
    size: int = 512,
    batch: int = 1,
    preset: str = 'lh90',
    backends: Sequence[str] = ('chunked',),
    block_size: int = 0,
    with_mmseg: bool = True,
    device: str = 'cpu',
    dtype: str = 'float32',
    repeats: int = 5,
) -> Dict[str, Any]:
    """Section ``vit``: LookHereViT (``auto`` and each of ``backends``) vs the same trunk
    without position encoding vs mmseg's ViT, timed in interleaved rounds.

    Args:
        arch: :func:`vit_arch`.
        size: image side. Default: 512.
        batch: images per forward. Default: 1.
        backends: LookHere backends timed besides ``auto``. Default: chunked.
        with_mmseg: also time mmseg's ``VisionTransformer`` (skipped, and said so in
            ``skipped``, where mmseg is not installed). Default: True.
        dtype: name in :data:`~research.benchmark.DTYPES`. Default: float32.
        repeats: interleaved rounds. Default: 5.

    Returns:
        ``cold_seconds`` (first call: builds the caches) and median ``seconds`` per model,
        every round's ``times``, ``ratio_vs_nobias`` (median of per-round ratios),
        ``auto_backend`` and the ``auto`` engine's ``cache`` statistics.
    """
    torch_dtype = DTYPES[dtype]
    img = (size, size)
    x = torch.randn(batch, 3, *img, device=device, dtype=torch_dtype)
    lookhere = build_vit(arch, preset, 'auto', block_size, device, torch_dtype)
    nets = {'lookhere': lookhere}
    for b in backends:
        nets[f'lookhere-{b}'] = build_vit(arch, preset, b, block_size, device, torch_dtype)
    nets[NOBIAS] = build_vit(arch, device=device, dtype=torch_dtype, pos_encoding='none')
    skipped = {}
    if with_mmseg:
        try:
            nets['mmseg_vit'] = build_mmseg_vit(arch, img, device, torch_dtype)
        except ImportError as err:  # a torch-only machine
            skipped['mmseg_vit'] = f'mmseg is not installed ({err})'
    models: Dict[str, Callable[[], Any]] = {
        name: (lambda net=net: net(x)) for name, net in nets.items()
    }
    cold = {}
    with torch.inference_mode():
        for name, fn in models.items():  # first call: builds tables / dense caches
            cold[name] = timed(fn, device)
        times = interleaved(models, repeats, device)
    engine = engine_of(lookhere)
    return dict(
        size=list(img),
        batch=batch,
        tokens=math.ceil(size / arch['patch_size']) ** 2 + 1,  # the trunk pads to ceil
        auto_backend=engine.last_backend,
        cold_seconds=cold,
        seconds={n: statistics.median(t) for n, t in times.items()},
        times=times,
        ratio_vs_nobias={n: paired_ratio(t, times[NOBIAS]) for n, t in times.items()},
        cache=engine.cache_info(),
        skipped=skipped,
    )


def bench_frame(
    arch: Dict[str, Any],
    size: Tuple[int, int] = (1024, 2048),
    preset: str = 'lh90',
    backends: Sequence[str] = (NOBIAS, 'auto', 'chunked:256', 'sdpa'),
    block_size: int = 0,
    device: str = 'cpu',
    dtype: str = 'float32',
    repeats: int = 2,
    max_dense_gib: float = 8.0,
    threads: Optional[int] = None,
    timeout: float = 1800,
) -> Dict[str, Any]:
    """Section ``frame``: whole-frame inference per backend, fresh process per case.

    Args:
        arch: :func:`vit_arch`.
        size: ``(H, W)`` of the image. Default: 1024 x 2048.
        backends: cases: ``'nobias'``, a backend, or ``'chunked:<block rows>'``.
        block_size: chunked rows where a case gives none (0: automatic). Default: 0.
        repeats: fresh-process runs per case, interleaved (``A B C``, ``B C A``, ...).
            Default: 2.
        max_dense_gib: skip ``sdpa`` / ``reference`` cases whose dense biases (all layers)
            exceed this. Default: 8.
        threads: torch threads in the children. Default: None (torch's default).
        timeout: seconds per child. Default: 1800.

    Returns:
        Per case (``cases``): median ``seconds``, ``times``, the largest ``peak`` and
        ``peak_rise``, ``chosen``; with the baseline also ``time_ratio``, ``peak_ratio``,
        ``peak_rise_ratio``. ``skipped``: cases not run, and why.
    """
    size = tuple(size)
    patch = arch['patch_size']
    tokens = math.ceil(size[0] / patch) * math.ceil(size[1] / patch) + 1
    dense_gib = arch['num_layers'] * arch['num_heads'] * tokens**2 * DTYPES[dtype].itemsize / GiB
    cases = []
    skipped = {}
    for spec in backends:
        backend, _, block = spec.partition(':')
        if backend in ('sdpa', 'reference') and dense_gib > max_dense_gib:
            skipped[spec] = (
                f'needs the dense bias of every layer: {dense_gib:.1f} GiB '
                f'(> --max-dense-gib {max_dense_gib})'
            )
            continue
        if backend == 'flex' and device != 'cuda':
            skipped[spec] = 'flex is benchmarked on CUDA only (eager flex materialises scores)'
            continue
        cases.append(
            dict(
                kind='frame',
                backend=backend,
                spec=spec,
                block_size=int(block) if block else block_size,
                size=list(size),
                arch=arch,
                preset=preset,
                device=device,
                dtype=dtype,
                repeats=1,
                threads=threads,
            )
        )
    runs: Dict[str, List[Dict[str, Any]]] = {c['spec']: [] for c in cases}
    for _, order in rotations(cases, repeats):
        for c in order:
            runs[c['spec']].append(run_child(c, timeout))
    res: Dict[str, Any] = dict(
        size=list(size),
        tokens=tokens,
        skipped=skipped,
        dense_bias_gib_all_layers=dense_gib,
        cases={},
    )
    for spec, rs in runs.items():
        ok = [r for r in rs if 'error' not in r]
        if not ok:
            res['cases'][spec] = dict(error=rs[0].get('error') if rs else 'not run')
            continue
        res['cases'][spec] = dict(
            seconds=statistics.median(r['seconds'] for r in ok),
            times=[r['seconds'] for r in ok],
            peak=max(r['peak'] for r in ok),
            peak_rise=max(r['peak_rise'] for r in ok),
            start=ok[0]['start'],
            chosen=ok[0]['chosen'],
            exact_peak=all(r['exact_peak'] for r in ok),
        )
    base = res['cases'].get(NOBIAS)
    if base and 'error' not in base:
        for c in res['cases'].values():
            if 'error' in c:
                continue
            c['time_ratio'] = c['seconds'] / base['seconds']
            c['peak_ratio'] = c['peak'] / base['peak']
            c['peak_rise_ratio'] = c['peak_rise'] / max(base['peak_rise'], 1)
    return res
