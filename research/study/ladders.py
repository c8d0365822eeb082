"""Test ladders: the validation data a trained run is evaluated on, one rung per scale,
and how each rung is predicted.

Two kinds of ladder, chosen by the config's ``extrapolation`` dict:

*Zoom* ladders: rung ``s`` shows the same scenes at ``s`` times the training resolution
(the content is the same, each object covers ``s``² times the pixels; ``s < 1`` tests
*below* the training size, as the LookHere rebuttal's 64-208 px for a 224 px model); the
model predicts each image whole (the config's ``test_cfg`` with ``--keep-test-mode``):

* ``ladder='rendered'`` (``configs/study/relational_vit_tiny.py``): the validation scenes
  of :mod:`research.datasets.relational`, rendered natively at every scale into
  ``val_x{scale}`` folders (written by :func:`prepare_data` on first use);
* ``ladder='resize'`` (any other mmseg config with a ``LookHereViT`` backbone, e.g. the
  Segmenter ADE20K / Cityscapes configs on a GPU): every ``Resize`` of the validation
  pipeline is multiplied by the scale (:func:`lookhere_dense.evaluation.resize.scale_resizes`).
  Predictions are scored at the annotation's own size, as mmseg does.

The *field-of-view* ladder, ``ladder='fov'`` (``configs/study/fov_vit_tiny.py``): rung ``s``
holds frames ``s`` times the training crop's side at the *same* pixel scale (``s``² times
as much of the scene; :mod:`research.datasets.fov_scenes`, folders ``val_x{scale}``),
and every frame is predicted twice: ``whole`` (one pass over the whole frame) and
``slide`` (mmseg's sliding-window inference with windows of the training crop,
:func:`slide_window`) -- the reference line whole-frame inference must beat. Each
prediction is timed and its peak memory measured
(:func:`research.evaluate.evaluate_loader`).

Test-time aids (``--aids log_n``, :mod:`.aids`) add a mode: ``log_n`` is the ladder's
whole-image prediction with the backbone's ``log_n_scaling`` on.

*Native aspect* (``extrapolation.native_aspect=True`` or ``--native-aspect``, zoom ladders):
one more mode, ``native_aspect``, whose rung ``s`` shows images at their own aspect ratio
with the *longer* side ``s`` times the training side (as ImageNet-Val tested at 384 px
without a square crop), predicted like the ``test`` mode, one image per batch
(:func:`native_aspect_dataloader`): for ``rendered`` the relational task's native-aspect
scenes (``relational.aspect_ratios``, folders ``val_aspect_x{scale}``), for ``resize`` the
pipeline's first ``Resize`` replaced by a long-side resize
(:func:`lookhere_dense.evaluation.resize.long_side_resize`).

A ladder is a :class:`Ladder` in :data:`LADDERS`: its rung builder ``(val_dataloader dict,
study settings, scale) -> val_dataloader dict`` (the ladder is called like it), the modes
it predicts with and its native-aspect rung builder (None: none).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lookhere_dense.errors import ConfigError
from lookhere_dense.evaluation.resize import long_side_resize, replace_resize, scale_resizes

__all__ = [
    'DEFAULT_SCALES',
    'NATIVE_ASPECT',
    'STUDY_ROBUSTNESS',
    'Ladder',
    'LADDERS',
    'GENERATED_DATASETS',
    'study_settings',
    'prepare_data',
    'rendered_ladder',
    'resize_ladder',
    'fov_ladder',
    'rendered_native_aspect',
    'resize_native_aspect',
    'slide_window',
    'ladder_modes',
    'ladder_dataloader',
    'native_aspect_dataloader',
    'ladder_evaluator',
]

#: test scales (multiples of the training size) when neither the command line nor the
#: config's ``extrapolation.scales`` give any
DEFAULT_SCALES = (1.0, 1.5, 2.0, 3.0, 4.0)
#: the mode of the native-aspect rows (see the module docstring)
NATIVE_ASPECT = 'native_aspect'
#: the attacks of ``--robustness`` where the config's ``extrapolation.robustness`` does not
#: say otherwise (:class:`~research.robustness.AttackSettings`): FGSM and
#: 5-step PGD at 1, 2, 4, 8 /255 on the validation images of the 1x rung
STUDY_ROBUSTNESS = dict(attacks=('fgsm', 'pgd'), eps=(1.0, 2.0, 4.0, 8.0), steps=5)


def rendered_ladder(
    dataloader: Dict[str, Any], study: Dict[str, Any], scale: float
) -> Dict[str, Any]:
    """Rung ``scale`` of the ``rendered`` ladder: the dataset reads the
    ``study['val_prefix']`` split (``val_x{scale:g}``), rendered at that scale. Changes
    ``dataloader`` in place and returns it."""
    return _read_split(dataloader, study['val_prefix'].format(scale=scale))


def _read_split(dataloader: Dict[str, Any], split: str) -> Dict[str, Any]:
    """Point ``dataloader``'s dataset at the generated folder layout's ``split``
    (``img_dir/{split}``, ``ann_dir/{split}``), in place; returns it."""
    dataloader['dataset']['data_prefix'] = dict(
        img_path=f'img_dir/{split}', seg_map_path=f'ann_dir/{split}'
    )
    return dataloader


def resize_ladder(
    dataloader: Dict[str, Any], study: Dict[str, Any], scale: float
) -> Dict[str, Any]:
    """Rung ``scale`` of the ``resize`` ladder: every ``Resize`` of the pipeline times
    ``scale`` (1 leaves the pipeline as it is). Changes ``dataloader`` in place and
    returns it.

    Raises:
        ValueError: the pipeline has no ``Resize`` to scale.
    """
    if scale == 1.0:
        return dataloader
    ds = dataloader['dataset']
    ds['pipeline'], scaled = scale_resizes(ds.get('pipeline', []), scale)
    if not scaled:
        raise ConfigError(
            "ladder='resize' needs a Resize transform in the val pipeline to "
            'scale; this config has none'
        )
    return dataloader


def fov_ladder(dataloader: Dict[str, Any], study: Dict[str, Any], scale: float) -> Dict[str, Any]:
    """Rung ``scale`` of the ``fov`` ladder: the dataset reads the ``study['val_prefix']``
    split (``val_x{scale:g}``), whose frames are ``scale`` times the training crop's side at
    the training pixel scale (the same folders as :func:`rendered_ladder`; what differs is
    the content of the folders and the modes). Changes ``dataloader`` in place and returns
    it."""
    return rendered_ladder(dataloader, study, scale)


def rendered_native_aspect(
    dataloader: Dict[str, Any], study: Dict[str, Any], scale: float
) -> Dict[str, Any]:
    """Native-aspect rung ``scale`` of the ``rendered`` ladder: the dataset reads the
    ``study['aspect_prefix']`` split (``val_aspect_x{scale:g}``: scenes at their own aspect,
    longer side ``scale`` times the training side). Changes ``dataloader`` in place and
    returns it."""
    return _read_split(dataloader, study['aspect_prefix'].format(scale=scale))


def resize_native_aspect(
    dataloader: Dict[str, Any], study: Dict[str, Any], scale: float
) -> Dict[str, Any]:
    """Native-aspect rung ``scale`` of the ``resize`` ladder: the pipeline's first
    ``Resize`` becomes a resize to the long side ``round(scale * max(train_size))``, aspect
    kept (inserted after the image loading when there is none). Changes ``dataloader`` in
    place and returns it."""
    ds = dataloader['dataset']
    long_side = int(round(scale * max(study['train_size'])))
    ds['pipeline'] = replace_resize(ds.get('pipeline', []), long_side_resize(long_side))
    return dataloader


@dataclass(frozen=True)
class Ladder:
    """A test ladder: how rung ``s`` reads its data and how it is predicted.

    Attributes:
        rung: ``(val_dataloader dict, study settings, scale) -> val_dataloader dict``.
        modes: the predictions of every rung: ``('test',)`` (the run's ``test_cfg``, through
            mmengine's ``ValLoop``) or ``('whole', 'slide')`` (timed and measured, through
            :func:`research.evaluate.evaluate_loader`). The first is
            the report's main line.
        description: one line for help texts.
        native_aspect: the rung builder of the ``native_aspect`` mode (same signature as
            ``rung``), or None when the ladder has none. Default: None.
    """

    rung: Callable[[Dict[str, Any], Dict[str, Any], float], Dict[str, Any]]
    modes: Tuple[str, ...]
    description: str
    native_aspect: Optional[Callable[[Dict[str, Any], Dict[str, Any], float], Dict[str, Any]]] = (
        None
    )

    def __call__(
        self, dataloader: Dict[str, Any], study: Dict[str, Any], scale: float
    ) -> Dict[str, Any]:
        return self.rung(dataloader, study, scale)


#: ladder name -> :class:`Ladder` (see the module docstring)
LADDERS: Dict[str, Ladder] = {
    'rendered': Ladder(
        rendered_ladder,
        ('test',),
        'zoom: the same scenes rendered natively at every scale',
        rendered_native_aspect,
    ),
    'resize': Ladder(
        resize_ladder,
        ('test',),
        "zoom: the config's test Resize multiplied by the scale",
        resize_native_aspect,
    ),
    'fov': Ladder(
        fov_ladder,
        ('whole', 'slide'),
        'field of view: frames s x the training crop at one pixel scale, predicted '
        'whole and with sliding windows of the crop',
    ),
}


def ladder_modes(study: Dict[str, Any]) -> Tuple[str, ...]:
    """The modes every rung of ``study`` is predicted with: the ladder's, then
    ``'native_aspect'`` when the study has it, then one per test-time aid (``'log_n'``)."""
    native = (NATIVE_ASPECT,) if study.get('native_aspect') else ()
    return LADDERS[study['ladder']].modes + native + tuple(study.get('aids', ()))


def slide_window(study: Dict[str, Any]) -> Tuple[Tuple[int, int], Tuple[int, int]]:
    """``(crop, stride)`` of the ``slide`` mode: windows of the training crop
    (``study['train_size']``), stride ``study['slide_stride']`` or 2/3 of the crop (mmseg's
    Cityscapes ratio, 768 / 512)."""
    crop = tuple(int(c) for c in study['train_size'])
    stride = study.get('slide_stride') or tuple(max(1, math.ceil(c * 2 / 3)) for c in crop)
    if isinstance(stride, int):
        stride = (stride, stride)
    return crop, tuple(int(s) for s in stride)


#: the summary metric of each mmseg ``iou_metrics`` entry (plus ``aAcc`` always):
#: what ``IoUMetric`` returns and a study can tabulate
_SUMMARY_METRICS = {
    'mIoU': ('mIoU', 'mAcc'),
    'mDice': ('mDice', 'mAcc'),
    'mFscore': ('mFscore', 'mPrecision', 'mRecall', 'mAcc'),
}


#: what every study row records beside the evaluator's metrics (:func:`~.runs.evaluate_rung`);
#: a table of any of them works too
STUDY_ROW_KEYS = ('sec_per_img', 'peak_mem_mb', 'mem_rise_mb', 'input_h', 'input_w', 'images')


def evaluator_metrics(cfg) -> List[str]:
    """What a study row of the config can tabulate: the summary metrics its
    ``val_evaluator`` returns (an ``IoUMetric``'s: ``aAcc`` and those of its
    ``iou_metrics``, under its ``prefix`` where it has one) and :data:`STUDY_ROW_KEYS`;
    ``[]`` for another evaluator (not checked)."""
    ev = cfg.get('val_evaluator') or {}
    if isinstance(ev, (list, tuple)) or str(ev.get('type', '')).split('.')[-1] not in (
        'IoUMetric',
        'PerClassIoUMetric',
    ):
        return []
    iou = ev.get('iou_metrics') or ['mIoU']
    names = ['aAcc']
    for m in [iou] if isinstance(iou, str) else iou:
        names += [n for n in _SUMMARY_METRICS.get(m, ()) if n not in names]
    prefix = ev.get('prefix')
    if prefix:
        names = [f'{prefix}/{n}' for n in names]
    return names + list(STUDY_ROW_KEYS)


def check_metric(metric: str, available: Sequence[str], where: str) -> None:
    """Refuse a ``--metric`` the study cannot tabulate (a misspelt one gave a table of
    ``-`` after the whole run), naming the available ones and a close match.

    Raises:
        ConfigError: ``metric`` is not one of ``available`` (nothing checked when empty).
    """
    import difflib

    if not available or metric in available or metric.startswith('IoU.'):
        return  # IoU.<class>: the study's PerClassIoUMetric returns one per class
    close = [n for n in available if n.lower() == metric.lower()] or difflib.get_close_matches(
        metric, list(available), n=1
    )
    raise ConfigError(
        f'--metric {metric!r}: {where} has no such metric'
        + (f' (did you mean {close[0]!r}?)' if close else '')
        + f'; available: {", ".join(available)}'
    )


def study_settings(
    cfg,
    scales: Optional[Sequence[float]] = None,
    metric: Optional[str] = None,
    ladder: Optional[str] = None,
    aids: Optional[Sequence[str]] = None,
    native_aspect: Optional[bool] = None,
    robustness: Optional[bool] = None,
) -> Dict[str, Any]:
    """The ladder settings of ``cfg`` (its ``extrapolation`` dict), the command line's
    ``scales`` / ``metric`` / ``ladder`` / ``aids`` / ``native_aspect`` / ``robustness``
    winning.

    Returns:
        ``dict(ladder, scales, metric, train_size, val_prefix)``; defaults: ladder
        ``'resize'``, scales :data:`DEFAULT_SCALES` (any > 0: below 1 tests below the
        training size), metric ``'mIoU'``, train size the backbone's ``img_size`` (224),
        val prefix ``'val_x{scale:g}'``. Plus ``aids`` (the test-time aids, :mod:`.aids`)
        when there are any; for the ``fov`` ladder ``slide_stride``
        (``extrapolation.slide_stride``, None: 2/3 of the crop); with native aspect
        (``extrapolation.native_aspect``, default False) ``native_aspect=True`` and
        ``aspect_prefix`` (``extrapolation.aspect_prefix``, default
        ``'val_aspect_x{scale:g}'``); with ``robustness`` (default False) ``robustness``,
        the :class:`~research.robustness.AttackSettings` of
        ``extrapolation.robustness`` as a dict (defaults: :data:`STUDY_ROBUSTNESS`).

    Raises:
        ValueError: an unknown ladder or aid, a scale <= 0, native aspect on a ladder
            without it, bad robustness settings.
        ConfigError: a metric the config's evaluator does not return.
    """
    from .aids import check_aids

    ext = dict(cfg.get('extrapolation') or {})
    ladder = ladder or ext.get('ladder', 'resize')
    if ladder not in LADDERS:
        raise ConfigError(f'unknown extrapolation.ladder {ladder!r}; allowed: {list(LADDERS)}')
    scales = tuple(float(s) for s in (scales or ext.get('scales') or DEFAULT_SCALES))
    if min(scales) <= 0:
        raise ConfigError(f'scales must be positive, got {scales}')
    train_size = ext.get('train_size') or cfg.model.backbone.get('img_size', 224)
    if isinstance(train_size, int):
        train_size = (train_size, train_size)
    study = dict(
        ladder=ladder,
        scales=scales,
        metric=metric or ext.get('metric', 'mIoU'),
        train_size=tuple(train_size),
        val_prefix=ext.get('val_prefix', 'val_x{scale:g}'),
    )
    check_metric(study['metric'], evaluator_metrics(cfg), "the config's val_evaluator")
    test_aids, _ = check_aids(ext.get('aids', ()) if aids is None else aids)
    if test_aids:
        study['aids'] = test_aids
    if ladder == 'fov':
        if min(scales) < 1:
            raise ConfigError(
                f'scales {[f"{s:g}" for s in scales]}: the fov ladder widens the view (a frame '
                'is at least one training crop), so its scales must be >= 1'
            )
        study['slide_stride'] = ext.get('slide_stride')
    if ext.get('native_aspect', False) if native_aspect is None else native_aspect:
        if LADDERS[ladder].native_aspect is None:
            raise ConfigError(
                f'native aspect needs a zoom ladder (rendered or resize); '
                f'ladder={ladder!r} has none'
            )
        study.update(
            native_aspect=True, aspect_prefix=ext.get('aspect_prefix', 'val_aspect_x{scale:g}')
        )
    if robustness:
        from ..robustness import settings_from_dict

        attack = {**STUDY_ROBUSTNESS, **dict(ext.get('robustness') or {})}
        study['robustness'] = settings_from_dict(attack).to_json()
    return study


#: config dict -> (generator module, its ``ensure_*`` writer, the settings field that is the
#: training size) of the generated datasets :func:`prepare_data` writes (every module has
#: ``settings_from_dict``)
GENERATED_DATASETS = {
    'relational': (
        'research.datasets.relational',
        'ensure_relational_dataset',
        'train_size',
    ),
    'fov_scenes': ('research.datasets.fov_scenes', 'ensure_fov_dataset', 'crop'),
}


def prepare_data(cfg, study: Dict[str, Any], progress: bool = True) -> Optional[Dict[str, Any]]:
    """Write the generated dataset the config describes (its ``relational`` or
    ``fov_scenes`` dict, :data:`GENERATED_DATASETS`) if it is not there yet, with every
    scale of the study.

    Returns:
        Its ``meta.json`` content, or None for configs without such a dict.

    Raises:
        ValueError: two such dicts, train sizes that disagree, or train and val
            ``data_root`` that differ.
    """
    import importlib

    present = [key for key in GENERATED_DATASETS if cfg.get(key) is not None]
    if not present:
        return None
    if len(present) > 1:
        raise ConfigError(f'the config describes two generated datasets {present}; keep one')
    key = present[0]
    module, ensure, size_key = GENERATED_DATASETS[key]
    module = importlib.import_module(module)
    rel = dict(cfg[key])
    extra = {1.0} if study.get('robustness') else set()  # attacked at the training size
    rel['scales'] = tuple(
        sorted(set(map(float, rel.get('scales', ()))) | set(study['scales']) | extra)
    )
    settings = module.settings_from_dict(rel)
    if study.get('native_aspect') and not getattr(settings, 'aspect_ratios', ()):
        raise ConfigError(
            f'native aspect needs scenes at other aspect ratios: set '
            f'{key}.aspect_ratios (width / height, e.g. (0.5, 0.75, 1.333, 2.0))'
        )
    if tuple(getattr(settings, size_key)) != tuple(study['train_size']):
        raise ConfigError(
            f'{key}.{size_key} {getattr(settings, size_key)} differs from '
            f'extrapolation.train_size {study["train_size"]}'
        )
    root = cfg.train_dataloader.dataset.get('data_root')
    if cfg.val_dataloader.dataset.get('data_root') != root:
        raise ConfigError(
            f'the {key} dataset needs train and val data_root to be equal, got '
            f'{root!r} and {cfg.val_dataloader.dataset.get("data_root")!r}'
        )
    return getattr(module, ensure)(root, settings, progress=progress)


def ladder_dataloader(cfg, study: Dict[str, Any], scale: float) -> Dict[str, Any]:
    """The ``val_dataloader`` config of rung ``scale`` of ``study['ladder']`` (a new dict;
    ``cfg`` is not changed)."""
    dl = copy.deepcopy(
        cfg.val_dataloader.to_dict()
        if hasattr(cfg.val_dataloader, 'to_dict')
        else dict(cfg.val_dataloader)
    )
    return LADDERS[study['ladder']](dl, study, scale)


def native_aspect_dataloader(cfg, study: Dict[str, Any], scale: float) -> Dict[str, Any]:
    """The ``val_dataloader`` config of the native-aspect rung ``scale`` (a new dict, one
    image per batch: the images differ in size).

    Raises:
        ValueError: the study's ladder has no native-aspect rungs.
    """
    build = LADDERS[study['ladder']].native_aspect
    if build is None:
        raise ConfigError(f'ladder {study["ladder"]!r} has no native-aspect rungs')
    dl = copy.deepcopy(
        cfg.val_dataloader.to_dict()
        if hasattr(cfg.val_dataloader, 'to_dict')
        else dict(cfg.val_dataloader)
    )
    dl = build(dl, study, scale)
    dl['batch_size'] = 1
    return dl


def ladder_evaluator(cfg) -> Dict[str, Any]:
    """The config's ``val_evaluator`` with ``IoUMetric`` swapped for
    :class:`~lookhere_dense.evaluation.metrics.PerClassIoUMetric` (also ``IoU.<class>``)."""
    ev = copy.deepcopy(cfg.val_evaluator)
    ev = ev.to_dict() if hasattr(ev, 'to_dict') else dict(ev)
    if ev.get('type') in ('IoUMetric', 'mmseg.IoUMetric'):
        ev['type'] = 'PerClassIoUMetric'
    return ev
