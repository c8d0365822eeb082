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
  same input,
  ``repeats`` times.

Memory is what the model adds: the peak RSS of the process during the runs minus its RSS
before the model (torch) or the session (onnxruntime) was created -- weights plus
activations, without the libraries' own imports. The outputs of the two are compared.
"""

from __future__ import annotations

import os.path as osp
import statistics
import time
from typing import Any, Dict, Optional, Sequence

from .fresh import run_child

__all__ = ['deploy_case', 'bench_deploy', 'STAGES']

#: the cases of one deploy measurement, in order
STAGES = ('export', 'torch', 'onnxruntime')


def _input(size: Sequence[int]):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.standard_normal((1, 3, *size)).astype('float32')


def deploy_case(case: Dict[str, Any]) -> Dict[str, Any]:
    """One stage in this process: ``stage``, ``config``, ``size``, ``out`` (the file),
    ``repeats``, ``threads``, ``cfg_options``."""
    import numpy as np
    import torch

    from ..memory import current_rss, peak_rss, reset_peak_rss

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

    if case['stage'] == 'torch':
        build = _torch_model_builder(case)  # the libraries imported: not the model's memory
        before = current_rss()
        model = build()

        def run():
            return model(torch.from_numpy(x)).numpy()

        context = torch.inference_mode
    else:
        import onnxruntime  # noqa: F401  (imported before the memory baseline)

        before = current_rss()
        session = onnxruntime_session(case['out'], threads)
        name = session.get_inputs()[0].name

        def run():
            return session.run(None, {name: x})[0]

        context = contextlib.nullcontext
    loaded = current_rss()
    exact = reset_peak_rss()
    times = []
    with context():
        for _ in range(case['repeats']):
            t0 = time.perf_counter()
            out = run()
            times.append(time.perf_counter() - t0)
    peak = peak_rss()
    np.save(case['out'] + f'.{case["stage"]}.npy', out)
    return dict(
        case,
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

    Returns:
        ``{'config', 'size', 'stages': {stage: result}, 'max_abs_diff', 'peak_ratio',
        'time_ratio'}`` (onnxruntime over torch).
    """
    import numpy as np

    stem = osp.splitext(osp.basename(config.split('::')[-1]))[0]
    out = osp.join(out_dir, f'{stem}_{size[0]}x{size[1]}.onnx')
    base = dict(
        kind='deploy',
        config=config,
        size=list(size),
        out=out,
        repeats=repeats,
        threads=threads,
        cfg_options=cfg_options,
    )
    stages = {stage: run_child(dict(base, stage=stage), timeout) for stage in STAGES}
    res: Dict[str, Any] = dict(config=config, size=list(size), out=out, stages=stages)
    t, o = stages['torch'], stages['onnxruntime']
    if 'error' not in t and 'error' not in o:
        a, b = (np.load(out + f'.{s}.npy') for s in ('torch', 'onnxruntime'))
        res['max_abs_diff'] = float(np.abs(a - b).max())
        res['peak_ratio'] = o['peak_over_before'] / max(t['peak_over_before'], 1)
        res['time_ratio'] = o['seconds'] / t['seconds']
    return res
