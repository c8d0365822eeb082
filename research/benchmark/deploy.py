"""Section ``deploy``: an exported segmentor in onnxruntime against the same model in torch,
side by side, each in a fresh process (torch alone for the cases that run; the export case
needs OpenMMLab to build the config's model).

Cases (kind ``deploy``, one per ``stage``):

* ``export``: build the config's model (random weights, seed 0), export it with
  :func:`lookhere_dense.apis.export.export_model` (``--check`` off: the run cases compare);
  export seconds, file sizes, the ratio to the fp32 weights, the largest constant;
* ``torch``: the same model in torch (its own attention engine), the segmentor's logits of
  one normalised input, ``repeats`` times;
* ``onnxruntime``: the exported file in an onnxruntime CPU session (memory pattern and
  buffer reuse off, arena on: :func:`~lookhere_dense.apis.export.onnxruntime_session`), the
  same input, ``repeats`` times.

:func:`trace_deploy` (``tools/deploy_memory.py``) runs the ``torch`` stage and the
``onnxruntime`` stage with each of :data:`SESSION_VARIANTS`, sampling the RSS over time.

Memory is what the model adds: the peak RSS of the process during the runs minus its RSS
before the model (torch) or the session (onnxruntime) was created -- weights plus
activations, without the libraries' own imports. The outputs of the two are compared.
"""

from __future__ import annotations

import os
import os.path as osp
import statistics
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..memory import MiB, current_rss
from .fresh import run_child

__all__ = [
    'export_path',
    'base_case',
    'deploy_case',
    'bench_deploy',
    'trace_deploy',
    'plot_deploy_trace',
    'STAGES',
    'SESSION_VARIANTS',
]

#: the cases of one deploy measurement, in order
STAGES = ('export', 'torch', 'onnxruntime')

#: onnxruntime session settings :func:`trace_deploy` compares (keywords of
#: :func:`~lookhere_dense.apis.export.onnxruntime_session`), by label
SESSION_VARIANTS: Dict[str, Dict[str, bool]] = {
    "onnxruntime's defaults (pattern, reuse, arena on)": dict(
        mem_pattern=True, mem_reuse=True, cpu_arena=True
    ),
    'pattern off, reuse on, arena off (before)': dict(
        mem_pattern=False, mem_reuse=True, cpu_arena=False
    ),
    'onnxruntime_session (pattern off, reuse off, arena on)': dict(),
}


def _input(size: Sequence[int]):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.standard_normal((1, 3, *size)).astype('float32')


#: the longest sampling interval :class:`_RssTrace` takes, in seconds
MAX_TRACE_INTERVAL = 60.0


class _RssTrace:
    """The process's RSS over time, sampled every ``interval`` seconds in a thread:
    ``samples`` = ``[(seconds since start, MiB over the RSS at start), ...]``.

    Args:
        interval: seconds between samples, in ``(0, MAX_TRACE_INTERVAL]``; None: no
            samples (only :meth:`elapsed`).
    """

    def __init__(self, interval: Optional[float]):
        if interval is not None and not 0 < interval <= MAX_TRACE_INTERVAL:
            raise ValueError(
                f'trace_interval must be in (0, {MAX_TRACE_INTERVAL:g}] seconds, got {interval!r}'
            )
        self.interval = interval
        self.samples: List[Tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = 0.0

    def elapsed(self) -> float:
        """Seconds since :meth:`start`."""
        return round(time.perf_counter() - self._t0, 3)

    def start(self, base: int) -> None:
        """Start the clock and, with an interval, the sampler thread; ``base``: the RSS
        in bytes the samples are counted over (0: the RSS is unknown here, no samples)."""
        self._t0 = t0 = time.perf_counter()
        if not self.interval or not base:
            return

        def sample():
            while True:
                self.samples.append((time.perf_counter() - t0, (current_rss() - base) / MiB))
                if self._stop.wait(self.interval):
                    return

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()

    def stop(self) -> List[List[float]]:
        """Stop the sampler; the samples as ``[[seconds, MiB], ...]`` (rounded)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        return [[round(t, 3), round(m, 1)] for t, m in self.samples]


def deploy_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """One stage in this process: ``stage``, ``config``, ``size``, ``out`` (the file),
    ``repeats``, ``threads``, ``cfg_options``; for ``onnxruntime`` also ``session``
    (keywords of :func:`~lookhere_dense.apis.export.onnxruntime_session`. Default: none,
    its defaults), and the session's resulting settings are returned as
    ``session_options``; ``trace_interval`` (seconds. Default: None, no trace): sample the
    RSS at that interval from before the model / session is built to the end of the runs
    (``trace`` and ``trace_loaded_at``, the moment the runs start, in the result)."""
    import numpy as np
    import torch

    from ..memory import peak_rss, reset_peak_rss

    threads = case.get('threads')
    if threads:
        torch.set_num_threads(threads)
    size = tuple(case['size'])
    x = _input(size)
    if case['stage'] == 'export':
        from lookhere_dense.apis.export import export_model

        report = export_model(
            case['config'],
            None,
            size,
            case['out'],
            cfg_options=case.get('cfg_options'),
            check=False,
            log=lambda *_: None,
            out_flag='--deploy-dir',
        )
        return dict(
            case,
            **{
                k: report[k]
                for k in (
                    'files',
                    'total_bytes',
                    'weights_bytes',
                    'ratio_to_weights',
                    'largest_constant',
                    'largest_weight_bytes',
                    'tables_bytes',
                    'export_seconds',
                    'grid',
                )
            },
        )
    import contextlib

    from lookhere_dense.apis.export import onnxruntime_session

    trace = _RssTrace(case.get('trace_interval'))
    session_options = None
    if case['stage'] == 'torch':
        build = _torch_model_builder(case)  # the libraries imported: not the model's memory
        before = current_rss()
        trace.start(before)
        model = build()

        def run():
            return model(torch.from_numpy(x)).numpy()

        context = torch.inference_mode
    else:
        import onnxruntime  # noqa: F401  (imported before the memory baseline)

        before = current_rss()
        trace.start(before)
        session = onnxruntime_session(case['out'], threads, **case.get('session', {}))
        opts = session.get_session_options()
        session_options = dict(
            mem_pattern=opts.enable_mem_pattern,
            mem_reuse=opts.enable_mem_reuse,
            cpu_arena=opts.enable_cpu_mem_arena,
        )
        name = session.get_inputs()[0].name

        def run():
            return session.run(None, {name: x})[0]

        context = contextlib.nullcontext
    loaded = current_rss()
    loaded_at = trace.elapsed()
    exact = reset_peak_rss()
    times = []
    with context():
        for _ in range(case['repeats']):
            t0 = time.perf_counter()
            out = run()
            times.append(time.perf_counter() - t0)
    peak = peak_rss()
    samples = trace.stop()
    np.save(case['out'] + f'.{case["stage"]}.npy', out)
    return dict(
        case,
        **(dict(trace=samples, trace_loaded_at=loaded_at) if samples else {}),
        **(dict(session_options=session_options) if session_options else {}),
        seconds=statistics.median(times),
        times=times,
        rss_before=before,
        rss_loaded=loaded,
        peak=peak,
        peak_over_before=peak - before,
        exact_peak=exact,
        output_shape=list(out.shape),
    )


def _torch_model_builder(case: Dict[str, Any]):
    """A function that builds the config's segmentor (random weights, seed 0: what the
    export case exported) as the :class:`~lookhere_dense.apis.export.SegmentorLogits` torch
    runs; the libraries are imported and the config read before it is returned."""
    import lookhere_dense

    lookhere_dense.register_all_modules()
    import torch
    from mmengine.registry import init_default_scope

    from lookhere_dense.apis.cli import load_config, quiet_mmengine_logger
    from lookhere_dense.apis.export import SegmentorLogits
    from lookhere_dense.swap import model_registry

    cfg = load_config(case['config'], case.get('cfg_options'))
    scope = cfg.get('default_scope') or 'mmseg'
    init_default_scope(scope)
    model_cfg = cfg.model.copy()
    model_cfg.pop('pretrained', None)
    model_cfg.get('backbone', {}).pop('init_cfg', None)

    def build():
        torch.manual_seed(0)  # as export_model's random weights
        model = model_registry(scope).build(model_cfg)
        with quiet_mmengine_logger():
            model.init_weights()
        return SegmentorLogits(model.eval(), tuple(case['size'])).eval()

    return build


def export_path(config: str, size: Sequence[int], out_dir: str = 'work_dirs/deploy') -> str:
    """Where the deploy section exports ``config`` at ``size``:
    ``OUT_DIR/<config stem>_<H>x<W>.onnx``."""
    stem = osp.splitext(osp.basename(config.split('::')[-1]))[0]
    return osp.join(out_dir, f'{stem}_{size[0]}x{size[1]}.onnx')


def base_case(
    config: str,
    size: Sequence[int],
    out: str,
    repeats: int,
    threads: Optional[int],
    cfg_options: Optional[dict],
) -> Dict[str, Any]:
    """The settings every stage of one deploy measurement shares (add ``stage``)."""
    return dict(
        kind='deploy',
        config=config,
        size=list(size),
        out=out,
        repeats=repeats,
        threads=threads,
        cfg_options=cfg_options,
    )


def bench_deploy(
    config: str,
    size: Sequence[int] = (1024, 2048),
    out_dir: str = 'work_dirs/deploy',
    repeats: int = 2,
    threads: Optional[int] = None,
    cfg_options: Optional[dict] = None,
    timeout: float = 3600,
) -> Dict[str, Any]:
    """Section ``deploy``: export, then torch and onnxruntime on the same input, each stage
    in a fresh process.

    The files of an earlier run at ``out`` (the export, its ``.data``, the stages'
    outputs) are removed first; where the export fails, torch and onnxruntime do not run
    (a stale file would be measured): their stages say ``skipped``, the result carries
    ``error`` and no ratios.

    Returns:
        ``{'config', 'size', 'stages': {stage: result}, 'max_abs_diff', 'peak_ratio',
        'time_ratio'}`` (onnxruntime over torch); ``error`` instead of the ratios where
        the export failed.
    """
    import numpy as np

    out = export_path(config, size, out_dir)
    for stale in (out, out + '.data', *(f'{out}.{stage}.npy' for stage in STAGES[1:])):
        if osp.lexists(stale):
            os.remove(stale)
    base = base_case(config, size, out, repeats, threads, cfg_options)
    stages = {'export': run_child(dict(base, stage='export'), timeout)}
    res: Dict[str, Any] = dict(config=config, size=list(size), out=out, stages=stages)
    if 'error' in stages['export']:
        res['error'] = f'export failed: {stages["export"]["error"]}'
        for stage in STAGES[1:]:
            stages[stage] = dict(stage=stage, skipped='the export failed')
        return res
    for stage in STAGES[1:]:
        stages[stage] = run_child(dict(base, stage=stage), timeout)
    t, o = stages['torch'], stages['onnxruntime']
    if 'error' not in t and 'error' not in o:
        a, b = (np.load(out + f'.{s}.npy') for s in ('torch', 'onnxruntime'))
        res['max_abs_diff'] = float(np.abs(a - b).max())
        res['peak_ratio'] = o['peak_over_before'] / max(t['peak_over_before'], 1)
        res['time_ratio'] = o['seconds'] / t['seconds']
    return res


def trace_deploy(
    config: str,
    onnx_file: str,
    size: Sequence[int] = (1024, 2048),
    repeats: int = 1,
    threads: Optional[int] = 1,
    interval: float = 0.05,
    variants: Optional[Dict[str, Dict[str, bool]]] = None,
    cfg_options: Optional[dict] = None,
    timeout: float = 3600,
    log: Callable[[str], None] = print,
) -> Dict[str, Any]:
    """The RSS over time of torch and of onnxruntime sessions on the same input, each in a
    fresh process.

    Args:
        config: the segmentation config (the torch model: random weights, seed 0).
        onnx_file: an export of ``config`` at ``size`` with the same weights (e.g. the
            deploy section's).
        size: input ``(H, W)``. Default: (1024, 2048).
        repeats: runs per process. Default: 1.
        threads: torch / onnxruntime threads. Default: 1.
        interval: seconds between RSS samples. Default: 0.05.
        variants: onnxruntime session settings by label. Default: :data:`SESSION_VARIANTS`.
        cfg_options: config overrides. Default: None.
        timeout: seconds per process. Default: 3600.
        log: progress lines. Default: ``print``.

    Returns:
        ``{'config', 'size', 'onnx', 'runs': {label: stage result with 'trace'}}``.
    """
    _RssTrace(interval)  # refuse a bad interval before any process starts
    variants = SESSION_VARIANTS if variants is None else variants
    base = dict(
        base_case(config, size, onnx_file, repeats, threads, cfg_options),
        trace_interval=interval,
    )
    cases = {'torch': dict(base, stage='torch')}
    for label, session in variants.items():
        cases[label] = dict(base, stage='onnxruntime', session=session)
    runs = {}
    for label, case in cases.items():
        log(f'[deploy trace] {label} ...')
        runs[label] = run_child(case, timeout)
        r = runs[label]
        if 'error' in r:
            log(f'[deploy trace] {label}: {r["error"]}')
        else:
            log(
                f'[deploy trace] {label}: peak {r["peak_over_before"] / MiB:,.0f} MiB over '
                f'the RSS before, {r["seconds"]:.1f} s / run'
            )
    return dict(config=config, size=list(size), onnx=onnx_file, runs=runs)


def plot_deploy_trace(result: Dict[str, Any], png: str) -> None:
    """One line per run of :func:`trace_deploy`: MiB over the RSS before the model /
    session against seconds, the exact peak in the legend, a dotted line where the runs
    start (matplotlib)."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=110)
    for label, r in result['runs'].items():
        if not r.get('trace'):
            continue
        t, m = zip(*r['trace'])
        peak = r['peak_over_before'] / MiB
        (line,) = ax.plot(t, m, lw=1.4, label=f'{label}: peak {peak:,.0f} MiB')
        at = r.get('trace_loaded_at')
        if at is not None:  # the model / session is built: the runs start
            ax.axvline(at, color=line.get_color(), lw=0.8, ls=':')
    h, w = result['size']
    ax.set_xlabel('seconds (building the model / session, dotted: the runs start)')
    ax.set_ylabel('MiB over the RSS before')
    ax.set_title(f'{osp.basename(result["config"])} at {h}x{w}, CPU', fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc='lower right')
    fig.tight_layout()
    fig.savefig(png)
    plt.close(fig)
