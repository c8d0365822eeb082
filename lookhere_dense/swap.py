"""Backbones in OpenMMLab configs: swap a plain ViT for ``LookHereViT``.

:func:`swap_backbone` turns any mmseg config whose backbone is a plain ViT
(``VisionTransformer`` — Segmenter, ViT/DeiT UPerNet, SETR, DPT — or ``BEiT`` / ``MAE``)
into the same model on a LookHere backbone: the architecture arguments (embed dims,
layers, heads, out_indices, CLS-token outputs, norms, drop rates, ...) are carried over,
the position-embedding ones are dropped, and the heads are checked against what
LookHereViT gives. mmseg's layer-decay optimizer constructors (the BEiT and MAE configs'),
which know only BEiT / MAE / ConvNeXt backbones by class name, become
``LookHereLayerDecayOptimizerConstructor`` with the same decay rate
(:data:`MMSEG_LAYER_DECAY_CONSTRUCTORS`). ``tools/swap_backbone.py`` does it on the command
line::

    python tools/swap_backbone.py mmseg::setr/setr_vit-l_pup_8xb1-80k_cityscapes-768x768.py \\
        configs/setr_lookhere_pup_cityscapes.py --preset lh90

The checks of a config's model part (:func:`check_model_cfg`, which a swapped config
passes, and the pretrained-file checks) are :mod:`lookhere_dense.config_checks`; their
names stay importable from here.
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
from typing import Any, Callable, Dict, List, Mapping, Optional

from .config_checks import (  # the checks live there; importable from here too
    check_model_cfg,
    check_pretrained_files,
    clear_inherited_pretrained,
    drop_missing_pretrained,
    model_registry,
)
from .errors import ConfigError
from .registry import CONFIG_IMPORT

__all__ = [
    'SOURCE_BACKBONES',
    'MMSEG_LAYER_DECAY_CONSTRUCTORS',
    'lookhere_backbone_cfg',
    'lookhere_config_summary',
    'swap_backbone',
    'check_model_cfg',
    'drop_missing_pretrained',
    'check_pretrained_files',
    'clear_inherited_pretrained',
    'model_registry',
]


#: Arguments every supported plain-ViT backbone shares with ``LookHereViT``.
_SHARED = (
    'img_size',
    'patch_size',
    'in_channels',
    'embed_dims',
    'num_layers',
    'num_heads',
    'mlp_ratio',
    'out_indices',
    'attn_drop_rate',
    'drop_path_rate',
    'norm_cfg',
    'act_cfg',
    'patch_norm',
    'final_norm',
    'num_fcs',
    'norm_eval',
)

#: Per source backbone type: arguments carried over as they are, renamed, and dropped.
#: Dropped: position-embedding settings (LookHere has none), weight-file settings (the
#: source's pretrained files are for another architecture) and ``patch_bias`` (LookHere
#: keeps the official patch-embedding bias so its checkpoints load).
SOURCE_BACKBONES: Dict[str, Dict[str, Any]] = {
    'VisionTransformer': dict(
        copy=_SHARED
        + (
            'patch_pad',
            'out_origin',
            'qkv_bias',
            'drop_rate',
            'with_cls_token',
            'output_cls_token',
            'pre_norm',
            'with_cp',
            'frozen_exclude',
        ),
        rename={},
        drop=('interpolate_mode', 'patch_bias', 'pretrained', 'init_cfg'),
    ),
    'BEiT': dict(
        copy=_SHARED + ('init_values',),
        rename={'qv_bias': 'qkv_bias'},
        drop=('pretrained', 'init_cfg'),
    ),
    'MAE': dict(copy=_SHARED + ('init_values',), rename={}, drop=('pretrained', 'init_cfg')),
}


#: mmseg's layer-decay optimizer wrapper constructors, and the ``paramwise_cfg`` key each
#: reads the decay rate from. They pick a parameter's layer by the backbone's *class name*
#: (BEiT / MAE / ConvNeXt) and raise a bare ``NotImplementedError`` for any other, so the
#: swap rewrites them to ``LookHereLayerDecayOptimizerConstructor``
#: (:mod:`lookhere_dense.engine.layer_decay`): the same layer ids (0 before the blocks,
#: ``i + 1`` for block ``i``, ``num_layers + 1`` after) and learning-rate scales
#: (``decay_rate ** (num_layers + 1 - layer)``).
MMSEG_LAYER_DECAY_CONSTRUCTORS: Dict[str, str] = {
    'LayerDecayOptimizerConstructor': 'layer_decay_rate',
    'LearningRateDecayOptimizerConstructor': 'decay_rate',
}
#: ``decay_type`` values of mmseg's ``LearningRateDecayOptimizerConstructor`` that mean
#: layer-wise decay of a ViT (``'stage_wise'`` is for ConvNeXt only).
_LAYER_WISE = ('layer_wise', 'layer_wise_vit')
#: Constructors that do not look at the backbone's type: kept as they are.
_GENERIC_CONSTRUCTORS = ('DefaultOptimWrapperConstructor', 'ForceDefaultOptimWrapperConstructor')
_LOOKHERE_CONSTRUCTOR = 'LookHereLayerDecayOptimizerConstructor'
#: Other constructors known to need something of the backbone LookHereViT does not have.
_BACKBONE_BOUND_CONSTRUCTORS = {
    'LearningRateDecayOptimWrapperConstructor': (
        "mmpretrain's layer decay asks the model for get_layer_depth(), which mmseg "
        'models with a LookHereViT backbone do not have'
    ),
}


def _constructor_name(ctor: Any) -> str:
    """``'LayerDecayOptimizerConstructor'`` of ``'mmseg.LayerDecayOptimizerConstructor'``
    or of the class itself."""
    name = ctor if isinstance(ctor, str) else getattr(ctor, '__name__', repr(ctor))
    return name.rsplit('.', 1)[-1]


def _swap_optim_constructor(cfg, depth: Optional[int], report: Callable[[str], None]) -> None:
    """Make ``cfg.optim_wrapper.constructor`` work with a LookHereViT backbone of ``depth``
    blocks (in place): mmseg's layer decay becomes LookHere's, with the source's rate;
    ``report`` says what was rewritten.

    Raises:
        ConfigError: a constructor that cannot work with LookHereViT, or an mmseg layer
            decay without a rate / with ConvNeXt's ``stage_wise`` decay.
    """
    wrapper = cfg.get('optim_wrapper')
    if not isinstance(wrapper, Mapping) or wrapper.get('constructor') is None:
        return
    ctor = wrapper['constructor']
    shown = ctor if isinstance(ctor, str) else _constructor_name(ctor)
    name = _constructor_name(ctor)
    paramwise = dict(wrapper.get('paramwise_cfg') or {})
    if name in _GENERIC_CONSTRUCTORS:
        return
    if name == _LOOKHERE_CONSTRUCTOR:
        if depth is not None and paramwise.get('num_layers') not in (None, depth):
            report(
                f'optim_wrapper.paramwise_cfg.num_layers: {paramwise["num_layers"]} -> {depth} '
                '(the LookHereViT depth)'
            )
            paramwise['num_layers'] = depth
            wrapper['paramwise_cfg'] = paramwise
        return
    if name in _BACKBONE_BOUND_CONSTRUCTORS:
        raise ConfigError(
            f'optim_wrapper.constructor={shown!r} cannot work with LookHereViT: '
            f'{_BACKBONE_BOUND_CONSTRUCTORS[name]}. For layer-wise lr decay set '
            f"optim_wrapper.constructor='{_LOOKHERE_CONSTRUCTOR}' with "
            'paramwise_cfg=dict(decay_rate=..., num_layers=...), or remove the constructor'
        )
    if name not in MMSEG_LAYER_DECAY_CONSTRUCTORS:
        report(
            f'optim_wrapper.constructor={shown!r} kept as it is (swap_backbone does not know '
            'it; check that it does not depend on the backbone type)'
        )
        return
    rate_key = MMSEG_LAYER_DECAY_CONSTRUCTORS[name]
    if name == 'LearningRateDecayOptimizerConstructor':
        decay_type = paramwise.get('decay_type', 'layer_wise')
        if decay_type not in _LAYER_WISE:
            raise ConfigError(
                f'optim_wrapper.paramwise_cfg.decay_type={decay_type!r} (of {shown}) is '
                "ConvNeXt's stage-wise decay; a LookHereViT backbone takes layer-wise decay: "
                "set optim_wrapper.paramwise_cfg.decay_type='layer_wise'"
            )
    rate = paramwise.get(rate_key)
    if rate is None:
        raise ConfigError(
            f'optim_wrapper.constructor={shown!r} without '
            f'optim_wrapper.paramwise_cfg.{rate_key}: set the layer-decay rate there'
        )
    new_paramwise: Dict[str, Any] = dict(decay_rate=rate)
    notes = []
    if depth is not None:
        new_paramwise['num_layers'] = depth
        if paramwise.get('num_layers') != depth:
            notes.append(f'num_layers is the LookHereViT depth, {depth}')
    ignored = sorted(set(paramwise) - {rate_key, 'num_layers', 'decay_type'})
    if ignored:
        notes.append(f'{ignored} dropped: {name} ignores them')
    wrapper['constructor'] = _LOOKHERE_CONSTRUCTOR
    wrapper['paramwise_cfg'] = new_paramwise
    report(
        f'optim_wrapper: constructor={shown!r}, paramwise_cfg={paramwise} -> '
        f'constructor={_LOOKHERE_CONSTRUCTOR!r}, paramwise_cfg={new_paramwise} ({name} '
        'assigns layers by the backbone class name, BEiT / MAE / ConvNeXt only, and fails '
        'on LookHereViT; the same layer-wise lr scales' + ''.join(f'; {n}' for n in notes) + ')'
    )


def _source_defaults(type_name: str) -> Dict[str, Any]:
    cls = model_registry('mmseg').get(type_name)
    if cls is None:  # pragma: no cover - the three are always in mmseg 1.x
        return {}
    return {
        k: p.default
        for k, p in inspect.signature(cls.__init__).parameters.items()
        if p.default is not inspect.Parameter.empty
    }


def lookhere_backbone_cfg(
    source: Mapping[str, Any],
    preset: Optional[str] = None,
    num_heads: Optional[int] = None,
    checkpoint: Optional[str] = None,
    **overrides: Any,
) -> Dict[str, Any]:
    """The ``LookHereViT`` config equivalent to a plain-ViT backbone config.

    Arguments the source config leaves out take the *source* class's defaults (so e.g.
    mmseg's ``VisionTransformer`` keeps ``final_norm=False``), then LookHere's own
    (``init_values=1e-4`` LayerScale, ``patch_bias=True``: the official architecture).

    Args:
        source: the backbone config (``type`` one of :data:`SOURCE_BACKBONES`).
        preset: LookHere preset (``'lh180'``, ``'lh90'``, ``'lh45'``); None: lh180, or the
            config stored in ``checkpoint``. Default: None.
        num_heads: override the head count (LookHere head layouts need 6, 12 or 16 heads;
            12 or 16 for lh45). Default: None (keep the source's).
        checkpoint: weights for ``init_cfg=dict(type='Pretrained', ...)`` (official
            LookHere, timm / DeiT-III or lookhere-dense files). Default: None.
        **overrides: any other ``LookHereViT`` argument.

    Raises:
        ConfigError: an unsupported source type or an argument it cannot carry over.
    """
    src = dict(source)
    typ = src.pop('type', None)
    if typ not in SOURCE_BACKBONES:
        raise ConfigError(
            f'cannot swap backbone type {typ!r} for LookHereViT; supported '
            f"plain-ViT types: {sorted(SOURCE_BACKBONES)} (the plain ViTs of mmseg's "
            'configs). A convolutional or pyramid backbone (ResNet, Swin, PVT) feeds its '
            'neck maps at several strides, which a plain ViT does not give: for a '
            "detector, set model.backbone=dict(type='LookHereViT', ...) and "
            "model.neck=dict(type='SimpleFPN', ...) by hand (docs/vitdet.md)"
        )
    rule = SOURCE_BACKBONES[typ]
    unknown = sorted(set(src) - set(rule['copy']) - set(rule['rename']) - set(rule['drop']))
    if unknown:
        raise ConfigError(
            f'{typ} arguments {unknown} have no LookHereViT counterpart that '
            'swap_backbone knows; remove them from the source config or pass '
            'the LookHereViT equivalent as an override'
        )
    effective = {**_source_defaults(typ), **src}
    out: Dict[str, Any] = dict(type='LookHereViT')
    for key in rule['copy']:
        if key in effective:
            out[key] = copy.deepcopy(effective[key])
    for old, new in rule['rename'].items():
        if old in effective:
            out[new] = effective[old]
    if num_heads is not None:
        out['num_heads'] = num_heads
    if preset is not None:
        out['preset'] = preset
    if checkpoint is not None:
        out['init_cfg'] = dict(type='Pretrained', checkpoint=checkpoint)
    out.update(overrides)
    return out


#: mmseg's ImageNet normalisation (the official LookHere models were trained with it)
IMAGENET_MEAN = [123.675, 116.28, 103.53]
IMAGENET_STD = [58.395, 57.12, 57.375]


@functools.lru_cache(maxsize=2)
def _read_weights(path: str, stamp: Any) -> Any:
    """:func:`~.lookhere.weights.backbone_weights` of ``path``, read once per ``stamp``
    (the file's size and time), or the reason (a string) it cannot be read here."""
    from .checkpoint import load_checkpoint_file
    from .errors import CheckpointError
    from .lookhere.weights import backbone_weights

    try:
        return backbone_weights(load_checkpoint_file(path))
    except FileNotFoundError:
        return 'file not found'
    except CheckpointError as err:
        return str(err).splitlines()[0]


def checkpoint_weights(path: str) -> Any:
    """The backbone weights of the file ``path`` (a
    :class:`~.lookhere.weights.BackboneWeights`), or the reason (a string) they cannot be
    read where this runs (a remote file, a missing or unreadable one)."""
    if '://' in path:
        return 'a remote file, not read here'
    try:
        st = os.stat(path)
    except OSError:
        return 'file not found'
    return _read_weights(os.path.abspath(path), (st.st_size, st.st_mtime_ns))


def _checkpoint_lh_config(path: str) -> Any:
    """The LookHere config recorded in the weights file ``path`` (as LookHereViT reads
    it when ``init_cfg=Pretrained`` loads it): a :class:`~.lookhere.config.LookHereConfig`,
    None when the file records none, or the reason (a string) it cannot be read here."""
    from .lookhere.config import resolve_lh_config

    weights = checkpoint_weights(path)
    if isinstance(weights, str):
        return weights
    if weights.lh_config is None or weights.pos_encoding not in (None, 'lookhere'):
        return None
    try:
        return resolve_lh_config(dict(weights.lh_config))
    except (TypeError, ValueError) as err:
        return f'its LookHere config cannot be used: {err}'


def _fit_checkpoint(
    cfg, path: str, init_values_given: bool, report: Callable[[str], None]
) -> None:
    """Make a swapped config fit its backbone file ``path`` where the file decides (in
    place), and refuse one that cannot load it, before anything is built.

    * width and depth must be the file's, and so must a head count the file records (or a
      LookHere file's 12); one the loader can only assume (``embed_dims / 64``,
      :func:`~.lookhere.weights.heads_assumed`), which ``checkpoint_num_heads``
      overrides, gets a note;
    * LayerScale follows the file: without ``ls1`` / ``ls2`` gammas in it,
      ``init_values=None`` (a timm / DeiT / mmseg ViT file), unless ``init_values`` was
      given;
    * an official LookHere file: the data preprocessor's mean / std become ImageNet's,
      which the official models were trained with (Segmenter's configs normalise with
      127.5 / 127.5 for their own ViT files).

    A file that cannot be read here (remote, missing) is left to the loader.

    Raises:
        ConfigError: naming the file, both values and the flag or key to set.
    """
    from .lookhere.weights import (
        file_depth,
        file_embed_dims,
        file_num_heads,
        has_layerscale,
        heads_assumed,
    )

    weights = checkpoint_weights(path)
    if isinstance(weights, str):
        return
    bb = cfg['model']['backbone']
    sd = weights.state_dict
    dims = file_embed_dims(sd)
    depth = file_depth(sd)
    for key, have in (('embed_dims', dims), ('num_layers', depth)):
        want = bb.get(key)
        if have and want is not None and have != want:
            raise ConfigError(
                f'--checkpoint {path!r} has {key}={have}, the swapped backbone {want} (from '
                f"the source config): swap a config of the file's size, or add "
                f'--cfg-options model.backbone.{key}={have} (applied to the source config)'
            )
    heads, how = file_num_heads(weights)
    init_cfg = bb.get('init_cfg') if isinstance(bb.get('init_cfg'), Mapping) else {}
    stated = init_cfg.get('checkpoint_num_heads')
    if heads is not None and bb.get('num_heads') not in (None, heads):
        if not heads_assumed(weights):
            raise ConfigError(
                f'--checkpoint {path!r} has {heads} attention heads per block ({how}), the '
                f'swapped backbone num_heads={bb["num_heads"]}: set --num-heads {heads}'
            )
        if stated is None:
            report(
                f'{path} records no head count; loading assumes {heads} ({how}), not '
                f'num_heads={bb["num_heads"]}: if the file has {bb["num_heads"]} heads, add '
                f'checkpoint_num_heads={bb["num_heads"]} to model.backbone.init_cfg'
            )
    if not has_layerscale(sd) and bb.get('init_values', 1e-4) and not init_values_given:
        bb['init_values'] = None
        report(f'init_values=None: {path} has no LayerScale (ls1 / ls2 gammas)')
    if weights.format == 'official':
        changed = []
        for where, pre in (
            ('model.data_preprocessor', cfg['model'].get('data_preprocessor')),
            ('data_preprocessor', cfg.get('data_preprocessor')),
        ):
            if not isinstance(pre, Mapping):
                continue
            # the channel order the preprocessor normalises in (RGB unless bgr_to_rgb=False)
            order = slice(None, None, -1) if pre.get('bgr_to_rgb') is False else slice(None)
            mean, std = IMAGENET_MEAN[order], IMAGENET_STD[order]
            if [float(v) for v in pre.get('mean') or []] != mean or [
                float(v) for v in pre.get('std') or []
            ] != std:
                old = (pre.get('mean'), pre.get('std'))
                pre['mean'], pre['std'] = list(mean), list(std)
                changed.append(f'{where} mean / std {old[0]} / {old[1]}')
        if changed:
            report(
                f"{' and '.join(changed)} -> ImageNet's {IMAGENET_MEAN} / {IMAGENET_STD}: "
                f'{path} is an official LookHere file, trained with them'
            )


def lookhere_config_summary(backbone: Mapping[str, Any]) -> str:
    """The LookHere config a swapped ``LookHereViT`` backbone config builds with, in words
    (what ``tools/swap_backbone.py`` prints): ``preset=lh90`` (given), ``lh_config={...}``
    (given), ``preset=lh90 (recorded in PATH)`` (no preset given: the
    ``init_cfg=Pretrained`` file's own config, which the backbone adopts when it loads
    the file), ``preset=lh180 (default; PATH records no LookHere config)`` or
    ``preset=lh180 (default)``. A file that cannot be read here is said so (the
    backbone adopts its config when it loads it)."""
    encoding = backbone.get('pos_encoding')
    if encoding not in (None, 'lookhere'):
        return f'pos_encoding={encoding!r}'
    preset, given = backbone.get('preset'), backbone.get('lh_config')
    if isinstance(given, str):  # a preset name given as lh_config
        preset, given = given, None
    if given is not None:
        return f'lh_config={dict(given)!r}' + (f' on preset={preset}' if preset else '')
    if preset is not None:
        return f'preset={preset}'
    init_cfg = backbone.get('init_cfg')
    path = init_cfg.get('checkpoint') if isinstance(init_cfg, Mapping) else None
    if not isinstance(path, str):
        return 'preset=lh180 (default)'
    stored = _checkpoint_lh_config(path)
    if stored is None:
        return f'preset=lh180 (default; {path} records no LookHere config)'
    if isinstance(stored, str):
        return (
            f'preset=lh180 (default) unless {path} records another LookHere config, '
            f'which the backbone adopts when it loads the file ({stored})'
        )
    from .lookhere.config import preset_name

    name = preset_name(stored)
    shown = f'preset={name}' if name else f'lh_config={stored.to_dict()}'
    return f'{shown} (recorded in {path})'


def _pad_whole_frames(model: Dict[str, Any], report: Callable[[str], None]) -> None:
    """Whole-image evaluation pads test images to patch multiples in the preprocessor
    (mmseg's ViT UPerNet configs test whole 512x683 ADE20K frames without: the backbone
    pads, and the head stretches the padded grid over the frame)."""
    from .data.checks import unpadded_whole_frame_patch

    patch = unpadded_whole_frame_patch(dict(model=model))
    pre = model.get('data_preprocessor')
    if patch is None or not isinstance(pre, dict):
        return
    pre['test_cfg'] = {**(pre.get('test_cfg') or {}), 'size_divisor': patch}
    report(
        f'model.data_preprocessor.test_cfg.size_divisor={patch}: whole-image tests pad to '
        'whole patches (cropped off the prediction); the backbone padded them and the head '
        'stretched the padded grid over the image'
    )


def swap_backbone(
    cfg,
    preset: Optional[str] = None,
    num_heads: Optional[int] = None,
    checkpoint: Optional[str] = None,
    keep_pretrained: bool = False,
    report: Optional[Callable[[str], None]] = None,
    **overrides: Any,
):
    """A copy of an mmseg config with its plain-ViT backbone replaced by ``LookHereViT``.

    Also: ``custom_imports`` gains ``lookhere_dense.openmmlab`` (importing it registers
    lookhere-dense); the model-level ``pretrained``
    (weights of the source architecture) is cleared unless ``keep_pretrained``; mmseg's
    layer-decay optimizer constructors (:data:`MMSEG_LAYER_DECAY_CONSTRUCTORS`: BEiT and
    MAE configs), which only know BEiT / MAE / ConvNeXt backbones, become
    ``LookHereLayerDecayOptimizerConstructor`` with the source's decay rate and
    ``num_layers`` = the new backbone's depth; with ``checkpoint`` the config is fitted to
    the file where it decides (:func:`_fit_checkpoint`: LayerScale as the file has it, an
    official file's ImageNet normalisation; another width, depth or head count refused);
    whole-image evaluation gets ``data_preprocessor.test_cfg.size_divisor`` = the patch
    (:func:`_pad_whole_frames`); the result passes :func:`check_model_cfg`.

    Args:
        cfg: an ``mmengine.Config`` (or a dict with ``model``).
        preset, num_heads, checkpoint, **overrides: see :func:`lookhere_backbone_cfg`.
        keep_pretrained: keep ``model.pretrained``. Default: False.
        report: called with one line per change beyond the backbone (the optimizer
            constructor rewritten, one it keeps unchecked). Default: None (silent).

    Returns:
        The new config (the input is not changed).

    Raises:
        ConfigError: unsupported backbone, the heads need something the LookHere
            backbone cannot give as configured, or an optimizer constructor that cannot
            work with it (the message says what to set).
    """
    new = copy.deepcopy(cfg)
    model = new['model']
    backbone = model.get('backbone')
    if not isinstance(backbone, Mapping):
        raise ConfigError('the config has no model.backbone to swap')
    model['backbone'] = lookhere_backbone_cfg(backbone, preset, num_heads, checkpoint, **overrides)
    notes: List[str] = []
    if checkpoint is not None:
        _fit_checkpoint(new, checkpoint, 'init_values' in overrides, notes.append)
    elif backbone.get('type') == 'VisionTransformer' and 'init_values' not in overrides:
        notes.append(
            f'init_values={model["backbone"].get("init_values", 1e-4)}: LayerScale, as in the '
            "official LookHere models (mmseg's VisionTransformer has none; --init-values none "
            '/ init_values=None builds its blocks without it)'
        )
    _swap_optim_constructor(new, model['backbone'].get('num_layers'), notes.append)
    _pad_whole_frames(model, notes.append)
    if not keep_pretrained and model.get('pretrained') is not None:
        model['pretrained'] = None
    imports = new.get('custom_imports') or dict(imports=[], allow_failed_imports=False)
    imports = dict(imports)
    mods = list(imports.get('imports') or [])
    if isinstance(mods, str):
        mods = [mods]
    if CONFIG_IMPORT not in mods:
        mods.append(CONFIG_IMPORT)
    imports['imports'] = mods
    new['custom_imports'] = imports
    check_model_cfg(new)
    for note in notes if report is not None else ():
        report(note)
    return new
