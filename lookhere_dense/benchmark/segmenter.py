"""Whole-frame memory of a segmentation model against its backbone alone, side by side.

:func:`whole_frame_memory` builds the model of an mmseg config (random init: no
checkpoint, no data) and measures, each case in a fresh child process so that peaks do
not carry over:

``backbone``  the config's backbone alone (built alone) on the preprocessed frame;
``model``     the whole model's test-time ``predict`` in whole mode (what ``tools/test.py``
              and ``tools/extrapolate.py`` run per frame after the data preprocessor:
              backbone, decode head, upsampling, crop / resize to ``ori_shape``, argmax,
              the data samples holding ``seg_logits`` and ``pred_sem_seg``);
``mmseg``     the same with mmseg's original classes in place of lookhere-dense's lean
              drop-ins (:data:`MMSEG_ORIGINALS`), for contrast; skipped when the config
              uses none of them.

Memory is :class:`lookhere_dense.evaluation.memory.PeakMemory`: the process's peak RSS on
the CPU (exact kernel high-water mark, reset after building the model, making the
inputs and a warm-up), ``torch.cuda.max_memory_allocated`` on CUDA. Peaks are of the
whole process / all allocated memory (weights included); ``rise`` is what the measured
call added. The ratios divide by the backbone's.

Command line (one or more configs; ``-h`` for the options)::

    python -m lookhere_dense.benchmark.segmenter \\
        configs/segmenter_lookhere_cityscapes_whole.py \\
        configs/segmenter_lookhere_linear_cityscapes_whole.py --threads 1 --json out.json
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ['whole_frame_memory', 'format_result', 'case_ratios', 'run_case', 'mmseg_original_cfg', 'MMSEG_ORIGINALS',
           'CASES', 'TARGET_RATIO', 'main']

#: lookhere-dense's lean drop-ins -> the mmseg classes they replace (same arguments,
#: weights and outputs).
MMSEG_ORIGINALS = {
    'LeanEncoderDecoder': 'EncoderDecoder',
    'LeanSegmenterMaskTransformerHead': 'SegmenterMaskTransformerHead',
}
#: The measured cases, in order.
CASES = ('backbone', 'model', 'mmseg')
#: Issue 10's bound: whole-frame peak of the model <= 1.3x the backbone's.
TARGET_RATIO = 1.3

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]


def mmseg_original_cfg(model_cfg: Mapping) -> Tuple[dict, List[str]]:
    """A copy of a model config with every lean drop-in replaced by mmseg's class.

    Args:
        model_cfg: an mmseg model config (``cfg.model``).

    Returns:
        ``(config, swapped)``: the new config (plain dicts) and the ``'Old -> New'``
        replacements made (empty: the config has none of :data:`MMSEG_ORIGINALS`).
    """
    swapped: List[str] = []

    def visit(node):
        if isinstance(node, Mapping):
            out = {k: visit(v) for k, v in node.items()}
            name = out.get('type')
            if isinstance(name, str) and name.split('.')[-1] in MMSEG_ORIGINALS:
                out['type'] = MMSEG_ORIGINALS[name.split('.')[-1]]
                swapped.append(f'{name} -> {out["type"]}')
            return out
        if isinstance(node, (list, tuple)):
            return type(node)(visit(v) for v in node)
        return copy.deepcopy(node)

    return visit(model_cfg), swapped


# ----------------------------------------------------------------------------------------
# One case, in a child process
# ----------------------------------------------------------------------------------------
def _model_cfg(spec: Dict[str, Any]) -> dict:
    """The config's model for a case: no checkpoint, whole-frame test mode."""
    from mmengine.config import Config
    cfg = Config.fromfile(spec['config'])
    if spec.get('cfg_options'):
        cfg.merge_from_dict(spec['cfg_options'])
    model = cfg.model.to_dict()
    model.pop('pretrained', None)
    if isinstance(model.get('backbone'), dict):
        model['backbone'].pop('pretrained', None)
        init = model['backbone'].get('init_cfg')
        if isinstance(init, dict) and init.get('type') == 'Pretrained':
            model['backbone']['init_cfg'] = None
    model['test_cfg'] = dict(mode='whole')
    return model


def _frame(preprocessor, size: Sequence[int], device: str):
    """A random uint8 frame through the data preprocessor (test mode): inputs, samples."""
    import torch
    from mmseg.structures import SegDataSample
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, *size), generator=g, dtype=torch.uint8)
    sample = SegDataSample(metainfo=dict(ori_shape=tuple(size), img_shape=tuple(size)))
    data = preprocessor(dict(inputs=[img], data_samples=[sample]), training=False)
    return data['inputs'].to(device), data['data_samples']


def run_case(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Measure one case in this process (called in a fresh child by :func:`whole_frame_memory`).

    Args:
        spec: ``config`` (path), ``cfg_options`` (dict or None), ``case`` (one of
            :data:`CASES`), ``size`` ``(H, W)``, ``device``, ``threads`` (int or None).

    Returns:
        ``spec`` plus ``peak_bytes``, ``start_bytes``, ``rise_bytes``, ``kind`` (of the
        meter), ``seconds`` (the measured call), ``types`` (segmentor, backbone, head).
    """
    import torch
    from mmengine.config import ConfigDict
    from mmseg.registry import MODELS

    from lookhere_dense.evaluation.memory import PeakMemory, free_memory
    from lookhere_dense.registry import register_all_modules

    if spec.get('threads'):
        torch.set_num_threads(int(spec['threads']))
    register_all_modules(init_default_scope=True)
    device, case, size = spec['device'], spec['case'], tuple(spec['size'])
    model_cfg = _model_cfg(spec)
    if case == 'mmseg':
        model_cfg, _ = mmseg_original_cfg(model_cfg)
    model_cfg = ConfigDict(model_cfg)
    preprocessor = MODELS.build(model_cfg['data_preprocessor'])
    if case == 'backbone':
        net = MODELS.build(model_cfg['backbone'])
        types = dict(backbone=type(net).__name__)
    else:
        net = MODELS.build(model_cfg)
        types = dict(segmentor=type(net).__name__, backbone=type(net.backbone).__name__,
                     head=type(net.decode_head).__name__)
    net = net.to(device).eval()

    def call(inputs, samples):
        if case == 'backbone':
            return net(inputs)
        return net.predict(inputs, samples)

    # warm-up outside the meter (kernel set-up; on CUDA also compilation at the real shape)
    warm = size if str(device).startswith('cuda') else (64, 128)
    with torch.no_grad():
        call(*_frame(preprocessor, warm, device))
    inputs, samples = _frame(preprocessor, size, device)
    free_memory()
    with torch.no_grad(), PeakMemory(device) as mem:
        t0 = time.perf_counter()
        out = call(inputs, samples)
        if str(device).startswith('cuda'):
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - t0
    if case != 'backbone':  # the prediction is what mmseg's path gives back
        assert tuple(out[0].pred_sem_seg.data.shape[-2:]) == size
    return dict(spec, peak_bytes=mem.peak_bytes, start_bytes=mem.start_bytes,
                rise_bytes=mem.rise_bytes, kind=mem.kind, seconds=seconds, types=types)


def _run_child(spec: Dict[str, Any], timeout: float) -> Dict[str, Any]:
    """Run :func:`run_case` in a fresh interpreter; its last stdout line is the JSON result."""
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (str(_PACKAGE_ROOT), env.get('PYTHONPATH')) if p)
    cmd = [sys.executable, '-m', 'lookhere_dense.benchmark.segmenter', '--child',
           json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(spec, error=f'timed out after {timeout:.0f} s')
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('{')]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return dict(spec, error=f'exit {proc.returncode}: ' + ' | '.join(tail))
    return json.loads(lines[-1])


# ----------------------------------------------------------------------------------------
# The side-by-side measurement
# ----------------------------------------------------------------------------------------
def whole_frame_memory(config: Union[str, os.PathLike, Any], size: Sequence[int] = (1024, 2048),
                       device: str = 'cpu', threads: Optional[int] = 1,
                       cases: Sequence[str] = CASES, cfg_options: Optional[dict] = None,
                       timeout: float = 3600.0) -> Dict[str, Any]:
    """Peak memory of whole-frame inference of a config's model vs its backbone alone.

    Every case runs in a fresh child process (``python -m
    lookhere_dense.benchmark.segmenter --child ...``), one after the other.

    Args:
        config: an mmseg config file (``mmseg::...`` paths too), or an mmengine ``Config`` (dumped to a temporary
            file for the children).
        size: frame ``(H, W)`` in pixels. Default: ``(1024, 2048)``.
        device: ``'cpu'`` or a CUDA device. Default: ``'cpu'``.
        threads: torch threads per child (None: torch's default). Default: 1.
        cases: a subset of :data:`CASES`. Default: all.
        cfg_options: overrides merged into the config (as ``--cfg-options``). Default: None.
        timeout: seconds per child. Default: 3600.

    Returns:
        ``config``, ``size``, ``device``, ``threads``, ``cases`` (one dict per case: the
        :func:`run_case` result, or ``error``), ``swapped`` (the mmseg contrast's
        replacements), ``ratios`` (``<case>_peak`` and ``<case>_rise`` divided by the
        backbone's, for every case measured besides it), ``target`` (:data:`TARGET_RATIO`)
        and ``meets_target`` (the model's peak ratio <= target; None if not measured).

    Raises:
        ValueError: an unknown case.
    """
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f'unknown cases {unknown}; choose from {list(CASES)}')
    tmp = None
    if not isinstance(config, (str, os.PathLike)):  # an mmengine Config
        tmp = tempfile.NamedTemporaryFile('w', suffix='.py', delete=False)
        tmp.close()
        config.dump(tmp.name)
        config_path = tmp.name
    else:
        from lookhere_dense.cli import resolve_config_path
        config_path = resolve_config_path(str(config))
    try:
        from mmengine.config import Config
        cfg = Config.fromfile(config_path)
        if cfg_options:
            cfg.merge_from_dict(cfg_options)
        _, swapped = mmseg_original_cfg(cfg.model.to_dict())
        results: Dict[str, Any] = {}
        for case in cases:
            if case == 'mmseg' and not swapped:
                results[case] = dict(skipped='the config uses no lean drop-in: the model '
                                             'case is already mmseg\'s')
                continue
            spec = dict(config=config_path, cfg_options=cfg_options, case=case,
                        size=list(size), device=str(device), threads=threads)
            results[case] = _run_child(spec, timeout)
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
    ratios = case_ratios(results)
    meets = (ratios['model_peak'] <= TARGET_RATIO) if 'model_peak' in ratios else None
    return dict(config=str(config) if tmp is None else '<Config>', size=list(size),
                device=str(device), threads=threads, cases=results, swapped=swapped,
                ratios=ratios, target=TARGET_RATIO, meets_target=meets)


def case_ratios(results: Mapping[str, Mapping[str, Any]]) -> Dict[str, float]:
    """``<case>_peak`` and ``<case>_rise`` of every measured case over the backbone's
    (cases without numbers, and all of them without a backbone, are left out)."""
    ratios: Dict[str, float] = {}
    base = results.get('backbone', {})
    if 'peak_bytes' not in base:
        return ratios
    for case, r in results.items():
        if case != 'backbone' and 'peak_bytes' in r:
            ratios[f'{case}_peak'] = r['peak_bytes'] / base['peak_bytes']
            ratios[f'{case}_rise'] = r['rise_bytes'] / max(base['rise_bytes'], 1)
    return ratios


def format_result(res: Dict[str, Any]) -> str:
    """A small text table of one :func:`whole_frame_memory` result."""
    mib = 2 ** 20
    lines = [f'{res["config"]}  {res["size"][0]}x{res["size"][1]}  {res["device"]}  '
             f'threads={res["threads"]}',
             f'  {"case":<9} {"peak MiB":>9} {"rise MiB":>9} {"seconds":>8}  '
             f'{"peak / backbone":>15}  classes']
    for case, r in res['cases'].items():
        if 'peak_bytes' not in r:
            lines.append(f'  {case:<9} {r.get("error") or r.get("skipped")}')
            continue
        ratio = res['ratios'].get(f'{case}_peak', 1.0 if case == 'backbone' else None)
        types = ', '.join(f'{v}' for v in r['types'].values())
        lines.append(f'  {case:<9} {r["peak_bytes"] / mib:9.0f} {r["rise_bytes"] / mib:9.0f} '
                     f'{r["seconds"]:8.1f}  {ratio:15.3f}  {types}')
    if res['meets_target'] is not None:
        lines.append(f'  model peak <= {res["target"]} x backbone: '
                     f'{"yes" if res["meets_target"] else "NO"}')
    return '\n'.join(lines)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog='python -m lookhere_dense.benchmark.segmenter',
        description='Whole-frame peak memory of segmentation configs vs their backbone '
                    'alone (each case in a fresh process).')
    p.add_argument('configs', nargs='*', help='mmseg config files')
    p.add_argument('--size', type=int, nargs=2, default=(1024, 2048), metavar=('H', 'W'),
                   help='frame size in pixels (default: 1024 2048)')
    p.add_argument('--device', default='cpu', help='cpu or cuda[:N] (default: cpu)')
    p.add_argument('--threads', type=int, default=1,
                   help='torch threads per child; 0: torch default (default: 1)')
    p.add_argument('--cases', nargs='+', default=list(CASES), choices=CASES)
    p.add_argument('--timeout', type=float, default=3600.0, help='seconds per child')
    p.add_argument('--json', help='write the results (and the command) to this file')
    p.add_argument('--child', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.child and not args.configs:
        p.error('give at least one config')
    return args


def main(argv: Optional[Sequence[str]] = None) -> List[Dict[str, Any]]:
    """Command-line entry (see the module docstring)."""
    args = parse_args(argv)
    if args.child:
        print(json.dumps(run_case(json.loads(args.child))), flush=True)
        return []
    out = []
    for config in args.configs:
        res = whole_frame_memory(config, size=args.size, device=args.device,
                                 threads=args.threads or None, cases=args.cases,
                                 timeout=args.timeout)
        print(format_result(res), flush=True)
        out.append(res)
    if args.json:
        import shlex
        cmd = 'python -m lookhere_dense.benchmark.segmenter ' + ' '.join(
            shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
        import platform

        import torch
        env = dict(torch=torch.__version__, python=platform.python_version(),
                   cpu_count=os.cpu_count(), load_average=os.getloadavg())
        Path(args.json).write_text(json.dumps(dict(command=cmd, environment=env, results=out),
                                              indent=1))
    return out


if __name__ == '__main__':
    main()
