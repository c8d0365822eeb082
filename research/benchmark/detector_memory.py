"""The memory guard on an mmdet detector: its estimate of a whole-frame pass (the LookHere
trunk's formula plus the neck and heads its calibration measures) against the measured
rise of the process's peak RSS, with the calibration's time.

Run: ``python -m research.benchmark.detector_memory CONFIG [--size 1024 2048] [--passes 3]
[--threads 1]``, e.g. with
``configs/mask_rcnn_lookhere-b16_sfpn_lsj-1024-24k_cityscapes.py`` (random weights: memory
does not depend on them). Each pass runs with the score threshold at 0, so the heads keep
the most detections the config allows (``max_per_img``), the worst case the estimate
covers; the heap is trimmed before each pass (:func:`research.memory.free_memory`).
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='an mmdet detector config')
    parser.add_argument('--size', type=int, nargs=2, default=(1024, 2048), help='H W')
    parser.add_argument('--passes', type=int, default=3, help='Default: 3')
    parser.add_argument('--threads', type=int, default=1, help='Default: 1')
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    import lookhere_dense.openmmlab  # noqa: F401  (registers LookHereViT)
    from lookhere_dense.engine.memory_guard import (
        estimate_model_peak,
        format_size,
        unscaled_detection_sample,
    )
    from research.memory import PeakMemory, free_memory

    register_all_modules()
    cfg = Config.fromfile(args.config)
    cfg.model.backbone.init_cfg = None
    model = MODELS.build(cfg.model).eval()
    h, w = args.size
    x = torch.randn(1, 3, h, w)
    with torch.no_grad():
        start = time.perf_counter()
        first = estimate_model_peak(model, x)  # measures the neck and heads (once)
        with_calibration = time.perf_counter() - start
        start = time.perf_counter()
        parts = estimate_model_peak(model, x)
        without = time.perf_counter() - start
    assert parts == first
    print(
        f'{type(model).__name__} at {h}x{w}: estimate {format_size(parts["total"])} ('
        + ', '.join(f'{k} {format_size(v)}' for k, v in parts.items() if k != 'total' and v)
        + f'); calibration {with_calibration - without:.1f} s ({args.threads} thread(s))',
        flush=True,
    )
    model.roi_head.test_cfg.score_thr = 0.0
    rises = []
    for i in range(args.passes):
        free_memory()
        with PeakMemory('cpu') as mem, torch.no_grad():
            res = model.predict(x, [unscaled_detection_sample(h, w)])
        rises.append(mem.rise_bytes)
        print(
            f'pass {i + 1}: peak rise {format_size(mem.rise_bytes)}, '
            f'{len(res[0].pred_instances)} detections',
            flush=True,
        )
        del res
    median = sorted(rises)[len(rises) // 2]
    print(f'median rise {format_size(median)}: estimate / measured {parts["total"] / median:.2f}')


if __name__ == '__main__':
    main()
