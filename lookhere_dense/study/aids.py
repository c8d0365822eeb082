"""Extrapolation aids the study measures: known tricks that help a model trained on small
crops predict larger frames.

=================  =====  ==================================================================
aid                when   what it does
=================  =====  ==================================================================
``log_n``          test   the backbone's ``log_n_scaling``: queries scaled by
                          ``log(N_test) / log(N_train)`` (N: keys per query), see
                          :class:`~lookhere_dense.models.backbones.LookHereViT`. Every run is
                          evaluated once more with it (mode ``log_n``); training is unchanged
``mixed_crops``    train  training on crops of several sizes, one size per batch
                          (:class:`~lookhere_dense.data.mixed_crops.MixedCropSegDataPreProcessor`):
                          the pipeline's ``RandomCrop`` yields the largest size, the data
                          preprocessor crops each batch to one size drawn from
                          ``extrapolation.mixed_crop_scales`` (default 1, 1.5, 2) times the
                          training crop. A separate run, named ``ENCODING+mixed_crops``
=================  =====  ==================================================================

A run spec is an encoding with training aids: ``'lookhere:lh45+mixed_crops'``
(:func:`split_run_spec`). ``--aids`` names aids for every run: test aids add a mode,
training aids turn every encoding into its aided run (:func:`run_specs`).
"""
from __future__ import annotations

import copy
from typing import Any, Dict, List, Sequence, Tuple

from .encodings import parse_encoding

__all__ = ['TEST_AIDS', 'TRAIN_AIDS', 'AIDS', 'DEFAULT_MIXED_CROP_SCALES', 'check_aids',
           'split_run_spec', 'run_specs', 'apply_train_aids', 'mixed_crop_sizes']

#: test-time aids: name -> what it does
TEST_AIDS = {'log_n': 'scale attention logits by log(N_test)/log(N_train) at test time'}
#: training aids: name -> what it does
TRAIN_AIDS = {'mixed_crops': 'train on crops of several sizes (one size per batch)'}
#: every aid
AIDS = {**TEST_AIDS, **TRAIN_AIDS}
#: ``mixed_crops`` sizes as multiples of the training crop when the config names none
DEFAULT_MIXED_CROP_SCALES = (1.0, 1.5, 2.0)


def check_aids(aids: Sequence[str]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """``(test aids, training aids)`` of ``aids``, each in the order given, without repeats.

    Raises:
        ValueError: an unknown aid, naming the allowed ones.
    """
    unknown = [a for a in aids if a not in AIDS]
    if unknown:
        raise ValueError(f'unknown aid(s) {unknown}; allowed: {list(AIDS)}')
    aids = list(dict.fromkeys(aids))
    return (tuple(a for a in aids if a in TEST_AIDS), tuple(a for a in aids if a in TRAIN_AIDS))


def split_run_spec(spec: str) -> Tuple[str, Tuple[str, ...]]:
    """``'lookhere:lh45+mixed_crops'`` -> ``('lookhere:lh45', ('mixed_crops',))``; the
    encoding part is checked by :func:`~lookhere_dense.study.encodings.parse_encoding`.

    Raises:
        ValueError: an unknown encoding or aid, a test-time aid in a run spec (it is an
            evaluation of the same model: give it with ``--aids``), an aid twice.
    """
    encoding, *aids = spec.split('+')
    parse_encoding(encoding)
    for aid in aids:
        if aid in TEST_AIDS:
            raise ValueError(f'run {spec!r}: {aid!r} is a test-time aid (the same trained '
                             f'model, evaluated once more): give it with --aids {aid}')
        if aid not in TRAIN_AIDS:
            raise ValueError(f'run {spec!r}: unknown training aid {aid!r}; allowed: '
                             f'{list(TRAIN_AIDS)}')
    if len(set(aids)) != len(aids):
        raise ValueError(f'run {spec!r} names an aid twice')
    return encoding, tuple(aids)


def run_specs(encodings: Sequence[str], aids: Sequence[str] = ()) -> List[str]:
    """The runs of a study: every encoding (or run spec), with the training aids of
    ``aids`` appended to each (``['abs'], ['mixed_crops'] -> ['abs+mixed_crops']``).

    Raises:
        ValueError: see :func:`check_aids` and :func:`split_run_spec`.
    """
    _, train_aids = check_aids(aids)
    runs = []
    for spec in encodings:
        encoding, own = split_run_spec(spec)
        extra = [a for a in train_aids if a not in own]
        runs.append('+'.join([encoding, *own, *extra]))
    if len(set(runs)) != len(runs):
        raise ValueError(f'runs {runs} name one run twice')
    return runs


def _pipeline_crop(cfg) -> Tuple[List[Dict[str, Any]], int]:
    """The training pipeline (a list of dicts) and the index of its ``RandomCrop``.

    Raises:
        ValueError: no ``train_dataloader.dataset.pipeline`` or no ``RandomCrop`` in it.
    """
    from lookhere_dense.evaluation.resize import transform_name

    pipeline = (cfg.get('train_dataloader') or {}).get('dataset', {}).get('pipeline')
    if pipeline is None:
        raise ValueError('the mixed_crops aid needs train_dataloader.dataset.pipeline (a '
                         'dataset wrapper without its own pipeline is not supported)')
    pipeline = [copy.deepcopy(dict(t)) for t in pipeline]
    index = next((i for i, t in enumerate(pipeline) if transform_name(t) == 'RandomCrop'), None)
    if index is None:
        raise ValueError('the mixed_crops aid needs a RandomCrop in the training pipeline (it '
                         'crops to the largest size; the data preprocessor crops each batch)')
    return pipeline, index


def mixed_crop_sizes(crop: Sequence[int], scales: Sequence[float]) -> List[Tuple[int, int]]:
    """Crop sizes ``round(crop * s)`` for every scale, sorted, without repeats.

    Raises:
        ValueError: a scale < 1 or no scales.
    """
    if not scales or min(scales) < 1:
        raise ValueError(f'mixed_crop_scales must be >= 1 (multiples of the training crop), '
                         f'got {tuple(scales)}')
    return sorted({(int(round(crop[0] * s)), int(round(crop[1] * s))) for s in scales})


def apply_train_aids(cfg, aids: Sequence[str]) -> None:
    """Rewrite the run config ``cfg`` (in place) for its training aids.

    ``mixed_crops``: the pipeline's ``RandomCrop`` crops the largest size and the data
    preprocessor (``SegDataPreProcessor``) becomes ``MixedCropSegDataPreProcessor`` with
    sizes ``extrapolation.mixed_crop_scales`` (default :data:`DEFAULT_MIXED_CROP_SCALES`)
    times the training crop (the ``RandomCrop``'s ``crop_size``).

    Raises:
        ValueError: an unknown aid; a config without the ``RandomCrop`` or with another
            data preprocessor.
    """
    _, train_aids = check_aids(aids)
    if 'mixed_crops' not in train_aids:
        return
    pipeline, index = _pipeline_crop(cfg)
    crop = pipeline[index]['crop_size']
    crop = (crop, crop) if isinstance(crop, int) else tuple(crop)
    scales = (cfg.get('extrapolation') or {}).get('mixed_crop_scales',
                                                  DEFAULT_MIXED_CROP_SCALES)
    sizes = mixed_crop_sizes(crop, scales)
    pipeline[index]['crop_size'] = sizes[-1]
    cfg.train_dataloader.dataset.pipeline = pipeline
    dp = dict(cfg.model.get('data_preprocessor') or {})
    if dp.get('type', 'SegDataPreProcessor') not in ('SegDataPreProcessor',
                                                       'mmseg.SegDataPreProcessor'):
        raise ValueError(f'the mixed_crops aid replaces SegDataPreProcessor; the config has '
                         f'model.data_preprocessor.type={dp.get("type")!r}')
    dp.update(type='MixedCropSegDataPreProcessor', crop_sizes=[list(s) for s in sizes])
    if dp.get('size'):
        dp['size'] = sizes[-1]
    cfg.model.data_preprocessor = dp
