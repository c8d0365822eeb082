"""Section ``compile``: ``torch.compile`` of the LookHere trunk against eager, side by side
(torch alone).

One fresh process per case (a clean dynamo / inductor state, so the first call pays the
whole compilation): the trunk of :func:`~.models.build_vit`, eager and compiled, at one
image size; ``inference`` (``torch.inference_mode``) or ``train`` (forward and backward of
the sum of the outputs). Reported: the first compiled call (compilation included), the
steady-state seconds of both in interleaved rounds, their ratio, the largest difference of
the outputs, and how many times dynamo compiled (frames and recompilations).
"""

from __future__ import annotations

import statistics
from typing import Any, Dict, Optional, Sequence, Tuple

from . import DTYPES
from .fresh import run_child
from .models import build_vit
from .timing import interleaved, paired_ratio, timed

__all__ = ['compile_case', 'bench_compile']


def compile_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """One compile case in this process: ``arch``, ``preset``, ``size``, ``mode``
    (``'inference'`` / ``'train'``), ``backend`` (torch.compile's), ``repeats``, ``device``,
    ``dtype``, optional ``threads``."""
    import torch._dynamo

    if case.get('threads'):
        torch.set_num_threads(case['threads'])
    device, dtype = case['device'], DTYPES[case['dtype']]
    model = build_vit(case['arch'], case['preset'], 'auto', 0, device, dtype)
    x = torch.randn(1, 3, *case['size'], device=device, dtype=dtype)
    train = case['mode'] == 'train'
    if train:
        model.train()
    compiled = torch.compile(model, backend=case['backend'])

    def run(net):
        if train:
            sum(o.float().sum() for o in net(x)).backward()
            return None
        with torch.inference_mode():
            return net(x)

    eager_out = run(model)
    torch._dynamo.utils.counters.clear()
    first = timed(lambda: run(compiled), device)
    frames = dict(torch._dynamo.utils.counters['stats'])
    compiled_out = run(compiled)
    diff = None
    if not train:
        diff = max(
            float((a.float() - b.float()).abs().max())
            for a, b in zip(eager_out, compiled_out, strict=True)
        )
    times = interleaved(
        {'eager': lambda: run(model), 'compiled': lambda: run(compiled)}, case['repeats'], device
    )
    return dict(
        case,
        first_call_seconds=first,
        times=times,
        seconds={k: statistics.median(v) for k, v in times.items()},
        ratio=paired_ratio(times['compiled'], times['eager']),
        max_abs_diff=diff,
        dynamo=dict(
            frames=frames.get('unique_graphs'), calls_captured=frames.get('calls_captured')
        ),
    )


def bench_compile(
    arch: Dict[str, Any],
    size: Tuple[int, int] = (512, 512),
    preset: str = 'lh90',
    modes: Sequence[str] = ('inference', 'train'),
    backend: str = 'inductor',
    device: str = 'cpu',
    dtype: str = 'float32',
    repeats: int = 5,
    threads: Optional[int] = None,
    timeout: float = 3600,
) -> Dict[str, Any]:
    """Section ``compile``: one fresh process per mode (:func:`compile_case`).

    Returns:
        ``{'size', 'backend', 'cases': {mode: result}}``, each result with
        ``first_call_seconds``, ``seconds`` (median of eager / compiled), ``ratio``
        (compiled / eager, median of per-round ratios), ``max_abs_diff`` (inference) and
        ``dynamo`` (graphs compiled in the first call).
    """
    cases = {}
    for mode in modes:
        cases[mode] = run_child(
            dict(
                kind='compile',
                arch=arch,
                preset=preset,
                size=list(size),
                mode=mode,
                backend=backend,
                device=device,
                dtype=dtype,
                repeats=repeats,
                threads=threads,
            ),
            timeout,
        )
    return dict(size=list(size), backend=backend, preset=preset, cases=cases)
