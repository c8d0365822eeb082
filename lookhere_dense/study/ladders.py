"""Test ladders: the validation data a trained run is evaluated on, one rung per scale.

Both ladders here are *zoom* ladders: rung ``s`` shows the same scenes at ``s`` times the
training resolution (the content is the same, each object covers ``s``² times the pixels).
The config's ``extrapolation`` dict chooses one:

* ``ladder='rendered'`` (the CPU default, ``configs/study/relational_vit_tiny.py``): the
  validation scenes of :mod:`lookhere_dense.data.relational`, rendered natively at every
  scale into ``val_x{scale}`` folders (written by :func:`prepare_data` on first use);
* ``ladder='resize'`` (any other mmseg config with a ``LookHereViT`` backbone, e.g. the
  Segmenter ADE20K / Cityscapes configs on a GPU): every ``Resize`` of the validation
  pipeline is multiplied by the scale (:func:`lookhere_dense.evaluation.resize.scale_resizes`).
  Predictions are scored at the annotation's own size, as mmseg does.

A ladder is a function ``(val_dataloader dict, study settings, scale) -> val_dataloader
dict`` in :data:`LADDERS`; another kind of ladder (e.g. one that widens the field of view
at a fixed pixel density) is one more entry there.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Optional, Sequence

from ..evaluation.resize import scale_resizes

__all__ = ['DEFAULT_SCALES', 'LADDERS', 'study_settings', 'prepare_data', 'rendered_ladder',
           'resize_ladder', 'ladder_dataloader', 'ladder_evaluator']

#: test scales (multiples of the training size) when neither the command line nor the
#: config's ``extrapolation.scales`` give any
DEFAULT_SCALES = (1.0, 1.5, 2.0, 3.0, 4.0)


def rendered_ladder(dataloader: Dict[str, Any], study: Dict[str, Any],
                    scale: float) -> Dict[str, Any]:
    """Rung ``scale`` of the ``rendered`` ladder: the dataset reads the
    ``study['val_prefix']`` split (``val_x{scale:g}``), rendered at that scale. Changes
    ``dataloader`` in place and returns it."""
    split = study['val_prefix'].format(scale=scale)
    dataloader['dataset']['data_prefix'] = dict(img_path=f'img_dir/{split}',
                                                seg_map_path=f'ann_dir/{split}')
    return dataloader


def resize_ladder(dataloader: Dict[str, Any], study: Dict[str, Any],
                  scale: float) -> Dict[str, Any]:
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
        raise ValueError("ladder='resize' needs a Resize transform in the val pipeline to "
                         'scale; this config has none')
    return dataloader


#: ladder name -> rung builder (see the module docstring)
LADDERS: Dict[str, Callable[[Dict[str, Any], Dict[str, Any], float], Dict[str, Any]]] = {
    'rendered': rendered_ladder,
    'resize': resize_ladder,
}


def study_settings(cfg, scales: Optional[Sequence[float]] = None,
                   metric: Optional[str] = None) -> Dict[str, Any]:
    """The ladder settings of ``cfg`` (its ``extrapolation`` dict), the command line's
    ``scales`` / ``metric`` winning.

    Returns:
        ``dict(ladder, scales, metric, train_size, val_prefix)``; defaults: ladder
        ``'resize'``, scales :data:`DEFAULT_SCALES`, metric ``'mIoU'``, train size the
        backbone's ``img_size`` (224), val prefix ``'val_x{scale:g}'``.

    Raises:
        ValueError: an unknown ladder or a scale <= 0.
    """
    ext = dict(cfg.get('extrapolation') or {})
    ladder = ext.get('ladder', 'resize')
    if ladder not in LADDERS:
        raise ValueError(f'unknown extrapolation.ladder {ladder!r}; allowed: {list(LADDERS)}')
    scales = tuple(float(s) for s in (scales or ext.get('scales') or DEFAULT_SCALES))
    if min(scales) <= 0:
        raise ValueError(f'scales must be positive, got {scales}')
    train_size = ext.get('train_size') or cfg.model.backbone.get('img_size', 224)
    if isinstance(train_size, int):
        train_size = (train_size, train_size)
    return dict(ladder=ladder, scales=scales, metric=metric or ext.get('metric', 'mIoU'),
                train_size=tuple(train_size), val_prefix=ext.get('val_prefix', 'val_x{scale:g}'))


def prepare_data(cfg, study: Dict[str, Any], progress: bool = True) -> Optional[Dict[str, Any]]:
    """Write the relational dataset the config describes (if any, and if not there yet),
    with every scale of the study rendered.

    Returns:
        Its ``meta.json`` content, or None for configs without a ``relational`` dict.

    Raises:
        ValueError: train sizes that disagree, or train and val ``data_root`` that differ.
    """
    from lookhere_dense.data.relational import ensure_relational_dataset, settings_from_dict

    if cfg.get('relational') is None:
        return None
    rel = dict(cfg.relational)
    rel['scales'] = tuple(sorted(set(map(float, rel.get('scales', ()))) | set(study['scales'])))
    settings = settings_from_dict(rel)
    if tuple(settings.train_size) != tuple(study['train_size']):
        raise ValueError(f'relational.train_size {settings.train_size} differs from '
                         f'extrapolation.train_size {study["train_size"]}')
    root = cfg.train_dataloader.dataset.get('data_root')
    if cfg.val_dataloader.dataset.get('data_root') != root:
        raise ValueError('the relational dataset needs train and val data_root to be equal, got '
                         f'{root!r} and {cfg.val_dataloader.dataset.get("data_root")!r}')
    return ensure_relational_dataset(root, settings, progress=progress)


def ladder_dataloader(cfg, study: Dict[str, Any], scale: float) -> Dict[str, Any]:
    """The ``val_dataloader`` config of rung ``scale`` of ``study['ladder']`` (a new dict;
    ``cfg`` is not changed)."""
    dl = copy.deepcopy(cfg.val_dataloader.to_dict() if hasattr(cfg.val_dataloader, 'to_dict')
                       else dict(cfg.val_dataloader))
    return LADDERS[study['ladder']](dl, study, scale)


def ladder_evaluator(cfg) -> Dict[str, Any]:
    """The config's ``val_evaluator`` with ``IoUMetric`` swapped for
    :class:`~lookhere_dense.evaluation.metrics.PerClassIoUMetric` (also ``IoU.<class>``)."""
    ev = copy.deepcopy(cfg.val_evaluator)
    ev = ev.to_dict() if hasattr(ev, 'to_dict') else dict(ev)
    if ev.get('type') in ('IoUMetric', 'mmseg.IoUMetric'):
        ev['type'] = 'PerClassIoUMetric'
    return ev
