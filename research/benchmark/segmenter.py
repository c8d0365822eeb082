"""Section ``segmenter``: whole-frame memory of a segmentation model against its
backbone alone, side by side (needs OpenMMLab).

:func:`whole_frame_memory` builds the model of an mmseg config (random init: no
checkpoint, no data) and measures, each case in a fresh child process
(:func:`research.benchmark.fresh.run_child`, case kind ``segmenter``) so that peaks
do not carry over:

``backbone``  the config's backbone alone (built alone) on the preprocessed frame;
``model``     the whole model's test-time ``predict`` in whole mode (what ``tools/test.py``
              and ``tools/extrapolate.py`` run per frame after the data preprocessor:
              backbone, decode head, upsampling, crop / resize to ``ori_shape``, argmax,
              the data samples holding ``seg_logits`` and ``pred_sem_seg``);
``mmseg``     the same with mmseg's original classes in place of lookhere-dense's lean
              drop-ins (:data:`MMSEG_ORIGINALS`), for contrast; skipped when the config
              uses none of them.

Memory is :class:`research.memory.PeakMemory`: the process's peak RSS on
the CPU (exact kernel high-water mark, reset after building the model, making the
inputs and a warm-up), ``torch.cuda.max_memory_allocated`` on CUDA. Peaks are of the
whole process / all allocated memory (weights included); ``rise`` is what the measured
call added. The ratios divide by the backbone's. :func:`bench_segmenter` runs it for
several configs (the section of ``tools/benchmark.py``)::

    python tools/benchmark.py --sections segmenter --threads 1 \\
        --segmenter-configs configs/segmenter_lookhere_cityscapes_whole.py \\
        configs/segmenter_lookhere_linear_cityscapes_whole.py
"""

from __future__ import annotations

import copy
import os
import tempfile
import time
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .fresh import run_child

__all__ = [
    'whole_frame_memory',
    'bench_segmenter',
    'case_ratios',
    'segmenter_case',
    'mmseg_original_cfg',
    'MMSEG_ORIGINALS',
    'CASES',
    'TARGET_RATIO',
]

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
# One case (in a fresh child: benchmark.child, kind 'segmenter')
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


def segmenter_case(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Measure one case in this process (what the fresh child of :func:`whole_frame_memory`
    runs: :mod:`.child`, case kind ``segmenter``).

    Args:
        spec: ``config`` (path), ``cfg_options`` (dict or None), ``case`` (one of
            :data:`CASES`), ``size`` ``(H, W)``, ``device``, ``threads`` (int or None);
            ``kind`` and anything else is passed through.

    Returns:
        ``spec`` plus ``peak_bytes``, ``start_bytes``, ``rise_bytes``, ``meter`` (the
        :class:`~research.memory.PeakMemory` kind), ``seconds`` (the
        measured call), ``types`` (segmentor, backbone, head).
    """
    import torch
    from mmengine.config import ConfigDict
    from mmseg.registry import MODELS

    from lookhere_dense.registry import register_all_modules

    from ..memory import PeakMemory, free_memory

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
        types = dict(
            segmentor=type(net).__name__,
            backbone=type(net.backbone).__name__,
            head=type(net.decode_head).__name__,
        )
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
    return dict(
        spec,
        peak_bytes=mem.peak_bytes,
        start_bytes=mem.start_bytes,
        rise_bytes=mem.rise_bytes,
        meter=mem.kind,
        seconds=seconds,
        types=types,
    )


# ----------------------------------------------------------------------------------------
# The side-by-side measurement
# ----------------------------------------------------------------------------------------
def whole_frame_memory(
    config: Union[str, os.PathLike, Any],
    size: Sequence[int] = (1024, 2048),
    device: str = 'cpu',
    threads: Optional[int] = 1,
    cases: Sequence[str] = CASES,
    cfg_options: Optional[dict] = None,
    timeout: float = 3600.0,
) -> Dict[str, Any]:
    """Peak memory of whole-frame inference of a config's model vs its backbone alone.

    Every case runs in a fresh child process (:func:`.fresh.run_child` with
    ``kind='segmenter'``: :func:`segmenter_case`), one after the other.

    Args:
        config: an mmseg config file (``mmseg::...`` paths too), or an mmengine ``Config``
            (dumped to a temporary file for the children).
        size: frame ``(H, W)`` in pixels. Default: ``(1024, 2048)``.
        device: ``'cpu'`` or a CUDA device. Default: ``'cpu'``.
        threads: torch threads per child (None: torch's default). Default: 1.
        cases: a subset of :data:`CASES`. Default: all.
        cfg_options: overrides merged into the config (as ``--cfg-options``). Default: None.
        timeout: seconds per child. Default: 3600.

    Returns:
        ``config``, ``size``, ``device``, ``threads``, ``cases`` (one dict per case: the
        :func:`segmenter_case` result, or ``error``, or ``skipped``), ``swapped`` (the
        mmseg contrast's replacements), ``ratios`` (``<case>_peak`` and ``<case>_rise``
        divided by the backbone's, for every case measured besides it), ``target``
        (:data:`TARGET_RATIO`) and ``meets_target`` (the model's peak ratio <= target;
        None if not measured).

    Raises:
        ValueError: an unknown case.
        FileNotFoundError: a config file that does not exist.
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
        from lookhere_dense.apis.cli import resolve_config_path

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
                results[case] = dict(
                    skipped="the config uses no lean drop-in: the model case is already mmseg's"
                )
                continue
            spec = dict(
                kind='segmenter',
                config=config_path,
                cfg_options=cfg_options,
                case=case,
                size=list(size),
                device=str(device),
                threads=threads,
            )
            results[case] = run_child(spec, timeout)
    finally:
        if tmp is not None:
            os.unlink(tmp.name)
    ratios = case_ratios(results)
    meets = (ratios['model_peak'] <= TARGET_RATIO) if 'model_peak' in ratios else None
    return dict(
        config=str(config) if tmp is None else '<Config>',
        size=list(size),
        device=str(device),
        threads=threads,
        cases=results,
        swapped=swapped,
        ratios=ratios,
        target=TARGET_RATIO,
        meets_target=meets,
    )


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


def bench_segmenter(
    configs: Sequence[str],
    size: Sequence[int] = (1024, 2048),
    device: str = 'cpu',
    threads: Optional[int] = 1,
    cases: Sequence[str] = CASES,
    cfg_options: Optional[dict] = None,
    timeout: float = 3600.0,
) -> Dict[str, Any]:
    """Section ``segmenter``: :func:`whole_frame_memory` of every config, one after the other.

    Args:
        configs: mmseg config files (``mmseg::...`` paths too).
        size, device, threads, cases, cfg_options, timeout: as :func:`whole_frame_memory`
            (``cfg_options`` applies to every config).

    Returns:
        ``size``, ``device``, ``threads``, ``cases``, ``cfg_options``, ``target``
        (:data:`TARGET_RATIO`), ``results`` (one :func:`whole_frame_memory` result per
        config, in order) and ``all_meet_target`` (every config's ``meets_target`` is
        True).

    Raises:
        ValueError: no config, or an unknown case.
        FileNotFoundError: a config file that does not exist (before anything runs).
    """
    if not configs:
        raise ValueError('bench_segmenter needs at least one config')
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f'unknown cases {unknown}; choose from {list(CASES)}')
    from lookhere_dense.apis.cli import resolve_config_path

    for config in configs:  # fail before the first child, not after an hour
        resolve_config_path(str(config))
    results = [
        whole_frame_memory(c, size, device, threads, cases, cfg_options, timeout) for c in configs
    ]
    return dict(
        size=list(size),
        device=str(device),
        threads=threads,
        cases=list(cases),
        cfg_options=cfg_options,
        target=TARGET_RATIO,
        results=results,
        all_meet_target=all(r['meets_target'] is True for r in results),
    )
