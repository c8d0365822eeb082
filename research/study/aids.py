"""Extrapolation aids the study measures: known tricks that help a model trained on small
crops predict larger frames, and the learnable-slopes variant of LookHere.

====================  =====  ===============================================================
aid                   when   what it does
====================  =====  ===============================================================
``log_n``             test   the backbone's ``log_n_scaling``: queries scaled by
                             ``log(N_test) / log(N_train)`` (N: keys per query), see
                             :class:`~lookhere_dense.models.backbones.LookHereViT`. Every
                             run is evaluated once more with it (mode ``log_n``); training
                             is unchanged
``mixed_crops``       train  training on crops of several sizes, one size per batch
                             (:class:`~lookhere_dense.data.mixed_crops.MixedCropSegDataPreProcessor`):
                             the pipeline's ``RandomCrop`` yields the largest size, the data
                             preprocessor crops each batch to one size drawn from
                             ``extrapolation.mixed_crop_scales`` (default 1, 1.5, 2) times
                             the training crop. A separate run, named
                             ``ENCODING+mixed_crops``
``learnable_slopes``  train  LookHere's (or 2D-ALiBi's) global, layer and head slopes become
                             parameters (``lh_config.learnable_slopes=True`` on top of the
                             config's or the spec's preset, without weight decay; the slope
                             report hook ``LookHereSlopeLoggerHook`` is added): the ablation
                             fixed vs learned slopes, run ``lookhere+learnable_slopes`` next
                             to ``lookhere``. Only for ``lookhere`` / ``alibi2d`` runs
``jumbo``             train  the trunk variant of "Thicker and Quicker" (Fuller et al. 2025):
                             ``model.backbone.jumbo_tokens = extrapolation.jumbo_tokens``
                             (default :data:`DEFAULT_JUMBO_TOKENS`) Jumbo tokens with their
                             shared wide MLP in place of the CLS token
                             (``with_cls_token=False``); for any encoding, e.g.
                             ``lookhere:lh180+jumbo`` next to ``lookhere:lh180``
====================  =====  ===============================================================

A run spec is an encoding with training aids: ``'lookhere:lh45+mixed_crops'``
(:func:`split_run_spec`). ``--aids`` names aids for every run: test aids add a mode,
training aids turn every encoding into its aided run (:func:`run_specs`).
``learnable_slopes`` and ``jumbo`` are variants of the model rather than tricks for all:
name them in a run spec (``--encodings lookhere lookhere+learnable_slopes abs+jumbo``).
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Sequence, Tuple

from lookhere_dense.errors import ConfigError

from .encodings import parse_encoding

__all__ = [
    'TEST_AIDS',
    'TRAIN_AIDS',
    'AIDS',
    'DEFAULT_MIXED_CROP_SCALES',
    'DEFAULT_JUMBO_TOKENS',
    'check_aids',
    'split_run_spec',
    'run_specs',
    'apply_train_aids',
    'mixed_crop_sizes',
    'SLOPE_OPTIMIZER_KEY',
]

#: test-time aids: name -> what it does
TEST_AIDS = {'log_n': 'scale attention logits by log(N_test)/log(N_train) at test time'}
#: training aids: name -> what it does
TRAIN_AIDS = {
    'mixed_crops': 'train on crops of several sizes (one size per batch)',
    'learnable_slopes': 'lookhere / alibi2d only: learn the slopes '
    '(lh_config.learnable_slopes=True)',
    'jumbo': 'Jumbo tokens with a shared wide MLP in place of CLS (model.backbone.jumbo_tokens)',
}
#: the optimizer's ``paramwise_cfg.custom_keys`` entry that keeps weight decay off the
#: learnable slopes (their log-ratio parameters ``pos_enc.slopes.*``; decay would pull them
#: back to the configured slopes)
SLOPE_OPTIMIZER_KEY = ('slopes', dict(decay_mult=0.0))
#: every aid
AIDS = {**TEST_AIDS, **TRAIN_AIDS}
#: ``mixed_crops`` sizes as multiples of the training crop when the config names none
DEFAULT_MIXED_CROP_SCALES = (1.0, 1.5, 2.0)
#: Jumbo tokens of the ``jumbo`` variant when the config's ``extrapolation`` names none
DEFAULT_JUMBO_TOKENS = 6


def check_aids(aids: Sequence[str]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """``(test aids, training aids)`` of ``aids``, each in the order given, without repeats.

    Raises:
        ValueError: an unknown aid, naming the allowed ones.
    """
    unknown = [a for a in aids if a not in AIDS]
    if unknown:
        raise ConfigError(f'unknown aid(s) {unknown}; allowed: {list(AIDS)}')
    aids = list(dict.fromkeys(aids))
    return (tuple(a for a in aids if a in TEST_AIDS), tuple(a for a in aids if a in TRAIN_AIDS))


def split_run_spec(spec: str) -> Tuple[str, Tuple[str, ...]]:
    """``'lookhere:lh45+mixed_crops'`` -> ``('lookhere:lh45', ('mixed_crops',))``; the
    encoding part is checked by :func:`~research.study.encodings.parse_encoding`.

    Raises:
        ValueError: an unknown encoding or aid, a test-time aid in a run spec (it is an
            evaluation of the same model: give it with ``--aids``), an aid twice,
            ``learnable_slopes`` on an encoding without LookHere slopes.
    """
    from lookhere_dense.lookhere.pos_encoding import LOOKHERE_BIAS_ENCODINGS

    encoding, *aids = spec.split('+')
    name, _ = parse_encoding(encoding)
    for aid in aids:
        if aid in TEST_AIDS:
            raise ConfigError(
                f'run {spec!r}: {aid!r} is a test-time aid (the same trained '
                f'model, evaluated once more): give it with --aids {aid}'
            )
        if aid not in TRAIN_AIDS:
            raise ConfigError(
                f'run {spec!r}: unknown training aid {aid!r}; allowed: {list(TRAIN_AIDS)}'
            )
    if len(set(aids)) != len(aids):
        raise ConfigError(f'run {spec!r} names an aid twice')
    if 'learnable_slopes' in aids and name not in LOOKHERE_BIAS_ENCODINGS:
        raise ConfigError(
            f'run {spec!r}: learnable_slopes learns the slopes of '
            f'{list(LOOKHERE_BIAS_ENCODINGS)}; {name!r} has none (name it per '
            f'run, e.g. --encodings lookhere lookhere+learnable_slopes)'
        )
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
        run = '+'.join([encoding, *own, *extra])
        split_run_spec(run)  # the aids of --aids may not fit this encoding
        runs.append(run)
    if len(set(runs)) != len(runs):
        raise ConfigError(f'runs {runs} name one run twice')
    return runs


def _pipeline_crop(cfg) -> Tuple[List[Dict[str, Any]], int]:
    """The training pipeline (a list of dicts) and the index of its ``RandomCrop``.

    Raises:
        ValueError: no ``train_dataloader.dataset.pipeline`` or no ``RandomCrop`` in it.
    """
    from lookhere_dense.evaluation.resize import transform_name

    pipeline = (cfg.get('train_dataloader') or {}).get('dataset', {}).get('pipeline')
    if pipeline is None:
        raise ConfigError(
            'the mixed_crops aid needs train_dataloader.dataset.pipeline (a '
            'dataset wrapper without its own pipeline is not supported)'
        )
    pipeline = [copy.deepcopy(dict(t)) for t in pipeline]
    index = next((i for i, t in enumerate(pipeline) if transform_name(t) == 'RandomCrop'), None)
    if index is None:
        raise ConfigError(
            'the mixed_crops aid needs a RandomCrop in the training pipeline (it '
            'crops to the largest size; the data preprocessor crops each batch)'
        )
    return pipeline, index


def mixed_crop_sizes(crop: Sequence[int], scales: Sequence[float]) -> List[Tuple[int, int]]:
    """Crop sizes ``round(crop * s)`` for every scale, sorted, without repeats.

    Raises:
        ValueError: a scale < 1 or no scales.
    """
    if not scales or min(scales) < 1:
        raise ConfigError(
            f'mixed_crop_scales must be >= 1 (multiples of the training crop), got {tuple(scales)}'
        )
    return sorted({(int(round(crop[0] * s)), int(round(crop[1] * s))) for s in scales})


def _learn_slopes(cfg) -> None:
    """The ``learnable_slopes`` aid (see :func:`apply_train_aids`)."""
    from lookhere_dense.apis.train import SLOPE_HOOK

    backbone = cfg.model.backbone
    lh_config = backbone.get('lh_config')
    if lh_config is None:
        lh_config = {}
    elif not isinstance(lh_config, dict):
        raise ConfigError(
            f'the learnable_slopes aid sets model.backbone.lh_config.'
            f"learnable_slopes; the config's lh_config is {lh_config!r}, not a "
            f'dict (name the preset with preset= instead)'
        )
    backbone['lh_config'] = {**lh_config, 'learnable_slopes': True}
    hooks = list(cfg.get('custom_hooks') or [])
    if SLOPE_HOOK not in {str(h.get('type', '')).split('.')[-1] for h in hooks}:
        hooks.append(dict(type=SLOPE_HOOK))
    cfg.custom_hooks = hooks
    optim = cfg.get('optim_wrapper') or {}
    if optim.get('constructor') in (None, 'DefaultOptimWrapperConstructor'):
        paramwise = dict(optim.get('paramwise_cfg') or {})
        keys = dict(paramwise.get('custom_keys') or {})
        key, value = SLOPE_OPTIMIZER_KEY
        if key not in keys:
            keys[key] = dict(value)
            paramwise['custom_keys'] = keys
            cfg.optim_wrapper.paramwise_cfg = paramwise


def _add_jumbo(cfg) -> None:
    """The ``jumbo`` variant (see :func:`apply_train_aids`)."""
    tokens = (cfg.get('extrapolation') or {}).get('jumbo_tokens', DEFAULT_JUMBO_TOKENS)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ConfigError(f'extrapolation.jumbo_tokens must be an int >= 1, got {tokens!r}')
    backbone = cfg.model.backbone
    backbone['jumbo_tokens'] = tokens
    backbone['with_cls_token'] = False


def apply_train_aids(cfg, aids: Sequence[str]) -> None:
    """Rewrite the run config ``cfg`` (in place) for its training aids.

    ``mixed_crops``: the pipeline's ``RandomCrop`` crops the largest size and the data
    preprocessor (``SegDataPreProcessor``) becomes ``MixedCropSegDataPreProcessor`` with
    sizes ``extrapolation.mixed_crop_scales`` (default :data:`DEFAULT_MIXED_CROP_SCALES`)
    times the training crop (the ``RandomCrop``'s ``crop_size``).

    ``learnable_slopes``: ``model.backbone.lh_config.learnable_slopes=True`` (the rest of
    the ``lh_config`` and the preset kept; call after the backbone's encoding is set), the
    ``LookHereSlopeLoggerHook`` in ``custom_hooks`` and, for mmengine's default optimizer
    constructor, :data:`SLOPE_OPTIMIZER_KEY` in ``paramwise_cfg.custom_keys`` unless the
    config has a ``'slopes'`` key (the layer-decay constructor handles the slopes itself).

    ``jumbo``: ``model.backbone.jumbo_tokens`` from ``extrapolation.jumbo_tokens`` (default
    :data:`DEFAULT_JUMBO_TOKENS`) and ``with_cls_token=False``.

    Raises:
        ValueError: an unknown aid; a config without the ``RandomCrop`` or with another
            data preprocessor (``mixed_crops``); an ``lh_config`` that is not a dict
            (``learnable_slopes``).
    """
    _, train_aids = check_aids(aids)
    if 'learnable_slopes' in train_aids:
        _learn_slopes(cfg)
    if 'jumbo' in train_aids:
        _add_jumbo(cfg)
    if 'mixed_crops' not in train_aids:
        return
    pipeline, index = _pipeline_crop(cfg)
    crop = pipeline[index]['crop_size']
    crop = (crop, crop) if isinstance(crop, int) else tuple(crop)
    scales = (cfg.get('extrapolation') or {}).get('mixed_crop_scales', DEFAULT_MIXED_CROP_SCALES)
    sizes = mixed_crop_sizes(crop, scales)
    pipeline[index]['crop_size'] = sizes[-1]
    cfg.train_dataloader.dataset.pipeline = pipeline
    dp = dict(cfg.model.get('data_preprocessor') or {})
    if dp.get('type', 'SegDataPreProcessor') not in (
        'SegDataPreProcessor',
        'mmseg.SegDataPreProcessor',
    ):
        raise ConfigError(
            f'the mixed_crops aid replaces SegDataPreProcessor; the config has '
            f'model.data_preprocessor.type={dp.get("type")!r}'
        )
    dp.update(type='MixedCropSegDataPreProcessor', crop_sizes=[list(s) for s in sizes])
    if dp.get('size'):
        dp['size'] = sizes[-1]
    cfg.model.data_preprocessor = dp
