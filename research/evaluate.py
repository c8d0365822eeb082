"""The one evaluation loop of every report: predict every batch of a dataloader, score the
predictions with the config's evaluator, time the model and meter the peak memory.

* :func:`evaluate` -- the loop, with the per-batch work as a function (``step``);
* :func:`evaluate_loader` -- the segmentor predicting ``whole`` or with mmseg's ``slide``
  inference (the extrapolation report, the study's ladders);
* the attacks of :mod:`research.robustness` pass their own ``step``
  (perturb, then predict);
* :func:`model_for_report` -- the set-up the reports on one checkpoint share (config,
  checks, the model loaded strictly);
* :func:`refusal` -- what a report records of a pass the memory guard refused.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lookhere_dense.apis.cli import quiet_mmengine_logger
from lookhere_dense.errors import MemoryBudgetError

from .memory import PeakMemory, free_memory

__all__ = [
    'model_for_report',
    'evaluate',
    'evaluate_loader',
    'clear_position_caches',
    'start_clean',
    'refusal',
]


def refusal(err: MemoryBudgetError) -> Dict[str, Any]:
    """What a report records of an evaluation the memory guard refused
    (:class:`~lookhere_dense.errors.MemoryBudgetError` ``err``): ``refused`` (its message,
    with the cheaper options), ``estimate_mb`` / ``limit_mb`` (the pass's estimated peak
    and the limit it exceeded, in MiB despite the names; None when unknown) and
    ``limit_source`` (the ``--max-memory`` budget or the memory left)."""

    def mb(b: Optional[int]) -> Optional[float]:
        return None if b is None else round(b / 2**20, 1)

    return dict(
        refused=str(err),
        estimate_mb=mb(err.estimate),
        limit_mb=mb(err.limit),
        limit_source=err.source,
    )


def model_for_report(
    config: str,
    checkpoint: str,
    split: str,
    cfg_options: Optional[dict],
    tool: str,
    device: Optional[str] = None,
    check: Optional[Callable[[Any], None]] = None,
) -> Tuple[Any, Any, str]:
    """The set-up of a report on one segmentation checkpoint (``tools/extrapolate.py``,
    ``tools/robustness.py``): register lookhere-dense, load the config
    (:func:`lookhere_dense.apis.cli.load_segmentation_job`), run ``check(cfg)`` (the
    report's own checks, before anything is built), the pre-flight checks of the ``split``
    data, then build the model from the checkpoint, loaded strictly, in eval mode
    (:func:`lookhere_dense.apis.inference.build_model_from_checkpoint`).

    Args:
        config, checkpoint: the files (``mmseg::`` config paths allowed).
        split: ``'val'`` or ``'test'``: the dataloader the report reads.
        cfg_options: config overrides (``--cfg-options``), or None.
        tool: the tool's file name, for the error messages (``'extrapolate.py'``).
        device: ``'cpu'`` / ``'cuda[:N]'``. Default: None (cuda when available).
        check: the report's checks of the loaded config. Default: None.

    Returns:
        ``(cfg, model, device)``.

    Raises:
        FileNotFoundError, lookhere_dense.errors.ConfigError, CheckpointError: from the
        steps above, naming the file or key.
    """
    import lookhere_dense

    lookhere_dense.register_all_modules()
    import torch
    from mmengine.registry import init_default_scope

    from lookhere_dense.apis.cli import check_attn_backend, load_segmentation_job, preflight
    from lookhere_dense.apis.inference import build_model_from_checkpoint

    cfg = load_segmentation_job(config, checkpoint, split, cfg_options, tool)
    if check is not None:
        check(cfg)
    init_default_scope(cfg.get('default_scope') or 'mmseg')
    preflight(cfg, (split,), check_pretrained=False)
    device = device or ('cuda' if torch.cuda.is_available() else 'cpu')
    check_attn_backend(cfg, str(device).startswith('cuda'), (split,))  # --device cpu
    model, _ = build_model_from_checkpoint(cfg, checkpoint, device)
    return cfg, model, device


def clear_position_caches(model) -> int:
    """Empty the caches of every position encoding of ``model`` (LookHere biases, RoPE
    tables): ``clear_caches()`` of each
    :class:`~lookhere_dense.lookhere.pos_encoding.PositionEncoding` that has one.

    Returns:
        How many encodings were cleared.
    """
    from lookhere_dense.lookhere.pos_encoding import PositionEncoding

    cleared = 0
    for module in model.modules():
        if not isinstance(module, PositionEncoding):
            continue
        clear = getattr(module, 'clear_caches', None)
        if callable(clear):
            clear()
            cleared += 1
    return cleared


def start_clean(model) -> None:
    """Start a measurement from a clean slate: empty the position-encoding caches (each
    test pays for its own biases) and free memory (:func:`free_memory`), so the peak memory
    of one test does not carry the previous test's leftovers."""
    clear_position_caches(model)
    free_memory()


def evaluate(
    model,
    dataloader: Dict[str, Any],
    evaluator: Dict[str, Any],
    step: Callable[[Any], Sequence[Any]],
    device: str = 'cpu',
    desc: str = '',
    memory: bool = True,
) -> Dict[str, Any]:
    """THE evaluation loop: ``step`` every batch, score its outputs, measure.

    Args:
        model: the segmentor (for the clean start; ``step`` decides what it runs).
        dataloader: the dataloader config (built with mmengine's ``Runner.build_dataloader``).
        evaluator: the evaluator config (e.g. ``IoUMetric``).
        step: ``step(data_batch) -> outputs`` (a list of data samples): the timed work of one
            batch (data loading is not timed).
        device: ``'cpu'`` / ``'cuda[:N]'`` (for the memory meter and the timing).
            Default: ``'cpu'``.
        desc: progress-bar label. Default: ``''``.
        memory: meter the peak memory over the loop (:class:`PeakMemory`), after a clean
            start (:func:`start_clean`). Default: True.

    Returns:
        ``dict(metrics, seconds, total_seconds, shapes, images, peak_mem_mb, mem_rise_mb,
        memory_kind)``: the evaluator's metrics, model seconds per image of every batch and
        their total, the ``img_shape`` of every image, the image count, and (with
        ``memory``, else None) the peak memory and its rise above the memory in use at the
        start.
    """
    import torch
    from mmengine.evaluator import Evaluator
    from mmengine.runner import Runner

    from lookhere_dense.apis.cli import progress

    loader = Runner.build_dataloader(dataloader)
    with quiet_mmengine_logger(drop=('The prefix is not set in metric class',)):
        scorer = Evaluator(copy.deepcopy(evaluator))
    scorer.dataset_meta = loader.dataset.metainfo
    seconds: List[float] = []
    shapes: List[Tuple[int, int]] = []
    total = 0.0
    if memory:
        start_clean(model)
    meter = PeakMemory(device) if memory else contextlib.nullcontext()
    with meter:
        # a bar on a terminal, about ten plain lines in a log
        said = False
        for data in progress(loader, desc.strip(), leave=False):
            note = None if said else large_frame_note(data, desc)
            if note:  # one pass may take minutes: the bar counts whole images only
                print(note, file=sys.stderr, flush=True)
                said = True
            t0 = time.perf_counter()
            outputs = step(data)
            if device.startswith('cuda'):
                torch.cuda.synchronize()
            spent = time.perf_counter() - t0
            total += spent
            seconds.append(spent / max(1, len(outputs)))
            shapes += [tuple(o.metainfo['img_shape'][:2]) for o in outputs]
            scorer.process(data_samples=outputs, data_batch=data)
    with quiet_mmengine_logger():  # IoUMetric's per-class table
        metrics = scorer.evaluate(len(loader.dataset))
    return dict(
        metrics=metrics,
        seconds=seconds,
        total_seconds=total,
        shapes=shapes,
        images=len(shapes),
        peak_mem_mb=meter.peak_mb if memory else None,
        mem_rise_mb=meter.rise_mb if memory else None,
        memory_kind=meter.kind if memory else None,
    )


#: pixels of an input from which the evaluation loop says, before the pass, that one image
#: may take a while (a 2048 x 2048 frame: 16,384 patches of 16 px)
LARGE_FRAME_PIXELS = 2048 * 2048


def large_frame_note(data: Any, desc: str = '') -> Optional[str]:
    """One line for an input batch holding an image of :data:`LARGE_FRAME_PIXELS` or more
    (``data['inputs']``: ``(C, H, W)`` tensors): its size, and that the progress counts
    whole images (a 25600 x 6400 frame printed nothing for minutes); None for smaller ones."""
    inputs = data.get('inputs') if isinstance(data, dict) else None
    if hasattr(inputs, 'shape'):  # one stacked (B, C, H, W) tensor (default_collate)
        inputs = [inputs]
    sizes = [tuple(x.shape[-2:]) for x in inputs or () if hasattr(x, 'shape') and x.dim() >= 2]
    if not sizes:
        return None
    h, w = max(sizes, key=lambda s: s[0] * s[1])
    if h * w < LARGE_FRAME_PIXELS:
        return None
    return (
        f'{desc.strip() or "evaluation"}: a {h}x{w} px image ({h * w / 256:,.0f} patches of '
        '16 px): one pass may take minutes on a CPU; the progress counts whole images'
    )


def largest_frame(
    dataloader: Dict[str, Any],
) -> Optional[Tuple[Tuple[int, int], Tuple[int, int]]]:
    """The largest frame (by pixels) the dataloader config's pipeline gives: ``((H, W)
    after its first resize, (H, W) of the image file)``, from the files' headers (nothing
    decoded; :func:`lookhere_dense.data.checks.largest_frame` of the dataset it builds);
    None without images or for a dataset that is no mmseg one."""
    from mmseg.registry import DATASETS

    from lookhere_dense.data.checks import largest_frame as dataset_largest_frame

    dataset = DATASETS.build(copy.deepcopy(dataloader['dataset']))
    return dataset_largest_frame(dataset, dataloader['dataset'].get('pipeline') or [])


def evaluate_loader(
    model,
    dataloader: Dict[str, Any],
    evaluator: Dict[str, Any],
    mode: str,
    device: str,
    slide: Optional[Tuple[Tuple[int, int], Tuple[int, int]]] = None,
    desc: str = '',
) -> Dict[str, Any]:
    """Predict every image of a dataloader ``whole`` or with mmseg's ``slide`` inference
    (the segmentor's own ``test_step``) and score it (:func:`evaluate`): the evaluation of
    the extrapolation report and the study's ladders.

    Args:
        model: an mmseg segmentor in eval mode; its ``test_cfg`` is set to ``mode``
            (``whole``: its preprocessor pads to whole patches,
            :func:`~lookhere_dense.apis.inference.pad_whole_frames`).
        mode: ``'whole'`` or ``'slide'``.
        slide: ``(crop, stride)`` of ``slide`` mode (e.g.
            :func:`research.extrapolation.slide_settings`). Default: None.
        dataloader, evaluator, device, desc: as :func:`evaluate`.

    Returns:
        :func:`evaluate`'s dict.

    Raises:
        ValueError: ``slide`` mode without ``slide`` settings, or an unknown mode.
        lookhere_dense.errors.ConfigError: a slide window that is no multiple of a
            self-padding backbone's patch (:func:`~lookhere_dense.config_checks.check_patch_multiple`).
        lookhere_dense.errors.MemoryBudgetError: the largest frame is over the model's
            memory guard (:func:`largest_frame`), before any image is predicted.
    """
    import torch
    from mmengine.config import ConfigDict

    from lookhere_dense.apis.inference import backbone_padding_patch, pad_whole_frames
    from lookhere_dense.config_checks import check_patch_multiple

    pre = getattr(model, 'data_preprocessor', None)
    pre_test_cfg = getattr(pre, 'test_cfg', None)  # restored after a whole test
    if mode == 'whole':
        model.test_cfg = ConfigDict(mode='whole')
        note = pad_whole_frames(model)
        if note:
            print(note, file=sys.stderr, flush=True)
    elif mode == 'slide':
        if slide is None:
            raise ValueError("mode='slide' needs slide=(crop, stride)")
        crop, stride = slide
        model.test_cfg = ConfigDict(mode='slide', crop_size=tuple(crop), stride=tuple(stride))
        check_patch_multiple(
            crop, backbone_padding_patch(model), 'the slide window', 'each sliding window'
        )
    else:
        raise ValueError(f"mode must be 'whole' or 'slide', got {mode!r}")

    from lookhere_dense.engine.memory_guard import check_frame_size

    def step(data):
        with torch.no_grad():
            return model.test_step(data)

    try:
        frame = largest_frame(dataloader)
        if frame is not None:  # refused before any image is resized and loaded for it
            check_frame_size(model, *frame)
        return evaluate(model, dataloader, evaluator, step, device, desc)
    finally:  # the padding is the whole test's: a slide test after it pads as configured
        if pre is not None and hasattr(pre, 'test_cfg'):
            pre.test_cfg = pre_test_cfg
