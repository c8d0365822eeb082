"""Checks of the model part of an OpenMMLab config, run before anything is built.

:func:`check_model_cfg` (run by ``tools/train.py`` / ``tools/test.py`` and by
:func:`~lookhere_dense.swap.swap_backbone`) turns an unknown backbone / neck / head type or
a head that cannot read the ``LookHereViT`` outputs into a :class:`ConfigError` that says
what to set. :func:`clear_inherited_pretrained` drops the ``model.pretrained`` a stock mmseg
config passes down when the LookHere backbone has weights of its own;
:func:`check_pretrained_files` stops a run whose pretrained file is missing (random init
only on request: :func:`drop_missing_pretrained`). :func:`model_registry` is the ``MODELS``
registry of a scope. All are also importable from :mod:`lookhere_dense.swap`.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import math
import os.path as osp
import re
import textwrap
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from .errors import ConfigError, PosEncodingError
from .registry import CONFIG_IMPORT, type_name
from .validation import close_names, is_int, is_number

__all__ = [
    'accepted_arguments',
    'check_model_cfg',
    'check_seg_test_cfg',
    'check_section_types',
    'check_loop_values',
    'seg_test_modes',
    'check_pretrained_files',
    'clear_inherited_pretrained',
    'drop_missing_pretrained',
    'model_registry',
    'neck_strides',
]


def model_registry(scope: Optional[str]):
    """The ``MODELS`` registry of an OpenMMLab scope (``'mmseg'`` or ``'mmdet'``)."""
    if scope == 'mmdet':
        from mmdet.registry import MODELS
    elif scope in (None, 'mmseg'):
        from mmseg.registry import MODELS
    else:
        from mmengine.registry import MODELS
    return MODELS


def _heads(model: Mapping) -> List[Tuple[str, Mapping]]:
    out = []
    if isinstance(model.get('decode_head'), Mapping):
        out.append(('model.decode_head', model['decode_head']))
    aux = model.get('auxiliary_head')
    if isinstance(aux, Mapping):
        out.append(('model.auxiliary_head', aux))
    elif isinstance(aux, (list, tuple)):
        out += [(f'model.auxiliary_head[{i}]', h) for i, h in enumerate(aux)]
    return out


def _parts(model: Mapping) -> List[Tuple[str, Mapping]]:
    """``(key, config)`` of the model's parts built from ``MODELS``: backbone, neck,
    decode / auxiliary heads (mmseg), RPN / RoI heads, a single-stage head, and the RoI
    head's box / mask heads and RoI extractors (each a dict, or a list in cascades)
    (mmdet)."""
    parts = [(f'model.{k}', model.get(k)) for k in ('backbone', 'neck')]
    parts += _heads(model)
    parts += [(f'model.{k}', model.get(k)) for k in ('rpn_head', 'bbox_head', 'roi_head')]
    parts += _roi_parts(
        model, ('bbox_roi_extractor', 'bbox_head', 'mask_roi_extractor', 'mask_head')
    )
    return [(where, node) for where, node in parts if isinstance(node, Mapping)]


def _roi_parts(model: Mapping, keys: Sequence[str]) -> List[Tuple[str, Any]]:
    """``(key, config)`` of the RoI head's ``keys`` (a dict each, or a list of them in
    cascades: ``model.roi_head.bbox_head[1]``); absent ones are left out."""
    roi = model.get('roi_head')
    if not isinstance(roi, Mapping):
        return []
    found: List[Tuple[str, Any]] = []
    for key in keys:
        node = roi.get(key)
        if isinstance(node, (list, tuple)):
            found += [(f'model.roi_head.{key}[{i}]', n) for i, n in enumerate(node)]
        elif node is not None:
            found.append((f'model.roi_head.{key}', node))
    return found


def _calls_super_init(node: ast.AST, owner: str) -> bool:
    """Whether ``node`` is ``super().__init__`` or ``super(owner, self).__init__`` (the
    next ``__init__`` of the MRO; ``super(Other, self)`` skips classes: not followed)."""
    if not (
        isinstance(node, ast.Attribute)
        and node.attr == '__init__'
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == 'super'
    ):
        return False
    args = node.value.args
    return not args or (len(args) == 2 and isinstance(args[0], ast.Name) and args[0].id == owner)


def _only_handed_to_super(init: Callable, var_keyword: str, owner: str) -> bool:
    """Whether an ``__init__`` (of the class named ``owner``)'s ``**var_keyword`` is used
    only as ``**var_keyword`` in ``super().__init__(...)`` calls (read from its source;
    False where there is none)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    except (OSError, TypeError, SyntaxError):
        return False
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == var_keyword]
    handed = {
        id(kw.value)
        for call in ast.walk(tree)
        if isinstance(call, ast.Call) and _calls_super_init(call.func, owner)
        for kw in call.keywords
        if kw.arg is None and isinstance(kw.value, ast.Name) and kw.value.id == var_keyword
    }
    return bool(uses) and all(id(n) in handed for n in uses)


def accepted_arguments(cls: Any) -> Optional[FrozenSet[str]]:
    """The keyword arguments ``cls(**cfg)`` accepts, or None when that cannot be told.

    Walks ``cls.__mro__``: an ``__init__`` without ``**kwargs`` ends the walk; one whose
    ``**kwargs`` only go on to ``super().__init__(**kwargs)`` (mmseg's heads) adds its
    names and goes on to the next ``__init__``; ``torch.nn.Module``'s ends it (it takes
    none). Anything else -- ``**kwargs`` used otherwise, a decorated ``__init__`` (it may
    rename arguments), no source, ``object.__init__`` reached -- gives None, so only
    arguments that would certainly raise ``TypeError`` are ever called unknown (over the
    1,460 model configs shipped with mmseg 1.2.2 and mmdet 3.3.0 it names one argument:
    ``FPN``'s ``force_grad_on_level`` in mmdet's V3Det FCOS config, which mmdet 3.3.0's
    ``FPN`` indeed does not take).
    """
    import torch.nn as nn

    if not isinstance(cls, type):
        return None
    names = set()
    for klass in cls.__mro__:
        if klass is nn.Module:
            return frozenset(names)
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        if not inspect.isfunction(init) or hasattr(init, '__wrapped__'):
            return None
        params = list(inspect.signature(init).parameters.values())[1:]  # no self
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        var = [p.name for p in params if p.kind == p.VAR_KEYWORD]
        if not var:
            return frozenset(names)
        if not _only_handed_to_super(init, var[0], klass.__name__):
            return None
    return frozenset(names)


def _check_arguments(where: str, node: Mapping, registry) -> None:
    """Refuse keys of a part's config that its class cannot take (a typo would be a
    ``TypeError`` traceback when the Runner builds the model), naming the close ones."""
    typ = node.get('type')
    cls = registry.get(typ) if isinstance(typ, str) else typ
    accepted = accepted_arguments(cls)
    if accepted is None:
        return
    problems = []
    for key in node:
        if key in ('type', '_scope_') or key in accepted:
            continue
        close = close_names(key, sorted(accepted))
        problems.append(
            f'{where}.{key}: {cls.__name__} has no argument {key!r}'
            + (f'; did you mean {" or ".join(repr(c) for c in close)}?' if close else '')
        )
    if problems:
        unknown = [k for k in node if k not in ('type', '_scope_') and k not in accepted]
        merged = (  # no near miss among them: likely a base config's section of another type
            f'. Keys of another type merged from a _base_ config? Replace the whole section: '
            f"{where}=dict(_delete_=True, type='{cls.__name__}', ...)"
            if not any(close_names(k, sorted(accepted)) for k in unknown)
            else ''
        )
        raise ConfigError(
            '; '.join(problems) + f' ({cls.__name__} takes {", ".join(sorted(accepted))})' + merged
        )


def _check_registered(where: str, node: Mapping, registry, scope: str) -> None:
    typ = node.get('type')
    if not isinstance(typ, str) or registry.get(typ) is not None:
        return
    names = set(registry.module_dict)
    if registry.parent is not None:
        names |= set(registry.parent.module_dict)
    close = difflib.get_close_matches(typ, sorted(names), n=3, cutoff=0.6)
    hint = f' Did you mean {close}?' if close else ''
    raise ConfigError(
        f'{where}.type={typ!r} is not a registered model in the {scope} registry.{hint} '
        'LookHereViT and the other lookhere-dense modules register when '
        f"{CONFIG_IMPORT} is imported: keep custom_imports=dict(imports=['{CONFIG_IMPORT}']) "
        'in the config (tools/train.py and tools/test.py register for you); modules of '
        'other packages need their own custom_imports.'
    )


def _lookhere_checks(model: Mapping, registry: Any = None) -> None:
    """The checks of a ``LookHereViT`` model (see :func:`check_model_cfg`); ``registry``:
    the mmdet ``MODELS`` for a detector's pyramid checks (None: not a detector)."""
    from .lookhere import BACKENDS
    from .lookhere.attention import RETIRED
    from .lookhere.pos_encoding import parse_pos_encoding

    bb = model['backbone']
    # LookHereViT also takes mmdet ViTDet's names for these (MMDET_VIT_NAMES in
    # models/backbones/lookhere_vit.py, which refuses both names given together)
    num_layers = bb.get('num_layers', bb.get('depth', 12))
    num_heads = bb.get('num_heads', 12)
    embed_dims = bb.get('embed_dims', bb.get('embed_dim', 768))
    try:
        spec = parse_pos_encoding(
            bb.get('pos_encoding', 'lookhere'), bb.get('lh_config'), bb.get('preset')
        )
    except PosEncodingError as err:  # unknown name / preset / direction / option: named
        raise ConfigError(f'model.backbone.{err.key}: {err}') from None
    backend = bb.get('attn_backend', 'auto')
    if backend not in BACKENDS and backend not in RETIRED:  # retired: the engine warns
        raise ConfigError(f'model.backbone.attn_backend={backend!r} is not one of {BACKENDS}')
    dims_key = 'embed_dim' if 'embed_dim' in bb and 'embed_dims' not in bb else 'embed_dims'
    for name, value in (('num_heads', num_heads), (dims_key, embed_dims)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f'model.backbone.{name} must be a positive int, got {value!r}')
    if embed_dims % num_heads:
        raise ConfigError(
            f'model.backbone: embed_dims={embed_dims} is not divisible by num_heads={num_heads}'
        )
    cfg = spec.lh_config
    if cfg is not None:
        try:
            cfg.validate(num_heads, num_layers)
        except ValueError as err:
            raise ConfigError(
                f'model.backbone (LookHereViT): {err}. Set model.backbone.num_heads to one '
                f'that fits (embed_dims={embed_dims} must be divisible by it), or choose '
                'another preset with model.backbone.preset.'
            ) from None
    outs = bb.get('out_indices', -1)
    n_out = (1 if isinstance(outs, int) else len(outs)) + int(bool(bb.get('out_origin')))
    cls_out = bool(bb.get('output_cls_token', False))
    heads = _heads(model)
    dpt = [w for w, h in heads if str(h.get('type')).endswith('DPTHead')]
    if dpt and bb.get('jumbo_tokens'):
        raise ConfigError(
            f'{dpt[0]} (DPTHead) reads one embed_dims-wide CLS token per backbone output; '
            f'model.backbone.jumbo_tokens={bb["jumbo_tokens"]} gives the Jumbo tokens side by '
            'side (J * embed_dims) instead. Use another head, or jumbo_tokens=0 with '
            'with_cls_token=True.'
        )
    if dpt and not cls_out:
        raise ConfigError(
            f'{dpt[0]} (DPTHead) reads the CLS token of every backbone output: set '
            'model.backbone.with_cls_token=True and model.backbone.output_cls_token=True.'
        )
    if cls_out:
        readers = [w for w, h in heads if not str(h.get('type')).endswith('DPTHead')]
        if model.get('neck') or readers:
            raise ConfigError(
                'model.backbone.output_cls_token=True makes every backbone output a '
                f'[feature_map, cls_token] pair, which only DPTHead reads; '
                f'{(["model.neck"] if model.get("neck") else []) + readers} expect feature '
                'maps. Set model.backbone.output_cls_token=False.'
            )
    if isinstance(model.get('neck'), Mapping):
        _check_neck(model['neck'], embed_dims, n_out, outs)
        if registry is not None:
            _check_det_pyramid(model, registry)
        return  # the neck decides what the heads see
    for where, head in heads:
        idx = head.get('in_index', -1)
        idxs = [idx] if isinstance(idx, int) else list(idx)
        bad = [i for i in idxs if not -n_out <= i < n_out]
        if bad:
            raise ConfigError(
                f'{where}.in_index={idx} but the backbone gives {n_out} output(s) '
                f'(out_indices={outs}): set model.backbone.out_indices to give enough maps, '
                f'or {where}.in_index to one of 0..{n_out - 1}.'
            )
        chans = head.get('in_channels')
        chans = [chans] if isinstance(chans, int) else list(chans or [])
        if chans and any(c != embed_dims for c in chans):
            raise ConfigError(
                f'{where}.in_channels={head.get("in_channels")} but LookHereViT gives '
                f'{embed_dims}-channel maps (model.backbone.embed_dims): make them equal.'
            )


def _check_neck(neck: Mapping, embed_dims: int, n_out: int, outs: Any) -> None:
    """A neck that cannot read the ``LookHereViT`` outputs, refused before the model is
    built (else: at the first forward, after start-up): ``SimpleFPN`` (its
    ``in_channels`` / ``backbone_channel`` and ``in_index``), mmseg's ``MultiLevelNeck``
    and an ``FPN`` (one ``in_channels`` entry per backbone output)."""
    typ = type_name(neck)
    key = 'backbone_channel' if neck.get('backbone_channel') is not None else 'in_channels'
    chans = neck.get(key)
    if typ == 'SimpleFPN':
        if isinstance(chans, int) and chans != embed_dims:
            raise ConfigError(
                f'model.neck.{key}={chans} but LookHereViT gives {embed_dims}-channel maps '
                '(model.backbone.embed_dims): make them equal.'
            )
        idx = neck.get('in_index', -1)
        if isinstance(idx, int) and not -n_out <= idx < n_out:
            raise ConfigError(
                f'model.neck.in_index={idx} but the backbone gives {n_out} output(s) '
                f'(out_indices={outs}): set model.neck.in_index to one of 0..{n_out - 1}.'
            )
    elif typ in ('MultiLevelNeck', 'FPN') and isinstance(chans, (list, tuple)):
        if len(chans) != n_out:
            raise ConfigError(
                f'model.neck.in_channels={list(chans)} lists {len(chans)} map(s) but the '
                f'backbone gives {n_out} (out_indices={outs}): one entry per backbone '
                'output.'
            )
        if any(c != embed_dims for c in chans):
            raise ConfigError(
                f'model.neck.in_channels={list(chans)} but LookHereViT gives '
                f'{embed_dims}-channel maps (model.backbone.embed_dims): make them equal.'
            )


# ----------------------------------------------------------------------------------------
# mmdet: the feature pyramid the heads expect, and the classes
# ----------------------------------------------------------------------------------------
def _defaults(registry: Any, node: Mapping) -> Dict[str, Any]:
    """The keyword defaults of the class a registry config names (empty when unknown)."""
    try:
        cls = registry.get(type_name(node))
        params = inspect.signature(cls.__init__).parameters.values()
    except (KeyError, TypeError, ValueError, AttributeError):
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def _strides(value: Any) -> Optional[List[float]]:
    """A list of strides (ints, or square ``(w, h)`` pairs) as floats; None otherwise."""
    if not isinstance(value, (list, tuple)) or not value:
        return None
    out = []
    for v in value:
        if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == v[1]:
            v = v[0]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        out.append(float(v))
    return out


def _show(strides: Sequence[float]) -> str:
    return '[' + ', '.join(f'{s:g}' for s in strides) + ']'


def neck_strides(
    neck: Mapping, patch_size: int, registry: Any
) -> Optional[Tuple[List[float], str, str]]:
    """The strides of a neck's outputs on ``LookHereViT`` maps of stride ``patch_size``:
    ``(strides, how, advice)``, or None for a neck this cannot tell (``SimpleFPN`` and
    mmdet's ``FPN`` are known; levels beyond the resampled ones double the stride)."""
    typ, d = type_name(neck), _defaults(registry, neck)
    if typ == 'SimpleFPN':
        factors = neck.get('scale_factors', d.get('scale_factors'))
        if not isinstance(factors, (list, tuple)) or not factors:
            return None
        strides = [patch_size / float(f) for f in factors]
        how = (
            f'SimpleFPN scale_factors {tuple(factors)} on the stride-{patch_size} map of '
            f'LookHereViT (patch_size {patch_size})'
        )
        advice = (
            'choose model.neck.scale_factors so that patch_size / factor gives the '
            "heads' strides, or set the heads' strides to the neck's"
        )
    elif typ == 'FPN':
        chans = neck.get('in_channels')
        if not isinstance(chans, (list, tuple)) or not chans:
            return None
        start, end = neck.get('start_level', 0), neck.get('end_level', -1)
        stop = len(chans) if end in (-1, len(chans) - 1) else end + 1
        strides = [float(patch_size)] * max(0, stop - start)
        how = (
            f"mmdet's FPN keeps each input's stride, and every LookHereViT output has "
            f'stride {patch_size} (a plain ViT)'
        )
        advice = (
            'use SimpleFPN, which builds strides patch_size/4 .. patch_size*2 from one map '
            "(model.neck=dict(type='SimpleFPN', in_channels=EMBED_DIMS, out_channels=256, "
            'num_outs=5), as configs/mask_rcnn_lookhere-b16_sfpn_*.py; docs/vitdet.md)'
        )
    else:
        return None
    num_outs = neck.get('num_outs', d.get('num_outs'))
    if is_int(num_outs):
        while len(strides) < num_outs:
            strides.append(strides[-1] * 2)
    return strides, how, advice


def _simple_fpn_for(strides: Sequence[float], patch_size: int) -> str:
    """`` (here: model.neck.scale_factors=(...), model.neck.num_outs=N)``: the SimpleFPN
    settings that give ``strides`` on a stride-``patch_size`` map ('' when none do)."""
    factors = [patch_size / s for s in strides]
    if not all(f > 0 and math.log2(f).is_integer() for f in factors):
        return ''
    keep = [f for f in factors if f >= 0.5] or factors[:1]
    if any(b != a * 2 for a, b in zip(strides[len(keep) - 1 :], strides[len(keep) :])):
        return ''  # levels past the resampled ones are pooled: each doubles the stride
    shown = ', '.join(f'{f:.1f}' if f >= 1 else f'{f:g}' for f in keep)
    return (
        f' (here: model.neck.scale_factors=({shown}{"," if len(keep) == 1 else ""}), '
        f'model.neck.num_outs={len(strides)})'
    )


def _head_strides(model: Mapping) -> List[Tuple[str, List[float]]]:
    """``(key, strides)`` of the strides an mmdet detector's heads assume (anchor / prior
    generators, an anchor-free head's ``strides``, the RoI extractors' ``featmap_strides``),
    where the config states them."""
    found: List[Tuple[str, List[float]]] = []

    def add(where: str, node: Any, key: str) -> None:
        strides = _strides(node.get(key)) if isinstance(node, Mapping) else None
        if strides:
            found.append((f'{where}.{key}', strides))

    for head in ('rpn_head', 'bbox_head'):
        node = model.get(head)
        if isinstance(node, Mapping):
            for gen in ('anchor_generator', 'prior_generator'):
                add(f'model.{head}.{gen}', node.get(gen), 'strides')
            add(f'model.{head}', node, 'strides')
    for where, node in _roi_parts(model, ('bbox_roi_extractor', 'mask_roi_extractor')):
        add(where, node, 'featmap_strides')
    return found


def _check_det_pyramid(model: Mapping, registry: Any) -> None:
    """mmdet: the neck's strides against the heads' (a mismatch trains anchors and RoIs on
    the wrong levels without an error) and the heads' channels against the neck's."""
    neck = model.get('neck')
    if not isinstance(neck, Mapping):
        return
    patch = model['backbone'].get('patch_size', 16)
    if is_int(patch):
        found = neck_strides(neck, patch, registry)
        if found is not None:
            have, how, advice = found
            for where, want in _head_strides(model):
                n = min(len(want), len(have))
                if len(want) > len(have) or want[:n] != have[:n]:
                    fit = _simple_fpn_for(want, patch) if type_name(neck) == 'SimpleFPN' else ''
                    raise ConfigError(
                        f'{where}={_show(want)} but the neck gives maps at strides '
                        f'{_show(have)} ({how}), so the heads would read the wrong levels: '
                        f'{advice}{fit}.'
                    )
    out_channels = neck.get('out_channels', _defaults(registry, neck).get('out_channels'))
    if not is_int(out_channels):
        return
    readers = [
        (f'model.{h}.in_channels', (model.get(h) or {}).get('in_channels'))
        for h in ('rpn_head', 'bbox_head')
    ]
    for where, node in _roi_parts(model, ('bbox_roi_extractor', 'mask_roi_extractor')):
        if isinstance(node, Mapping):  # a dict each, or one per stage in cascades
            readers.append((f'{where}.out_channels', node.get('out_channels')))
    for where, chans in readers:
        if is_int(chans) and chans != out_channels:
            raise ConfigError(
                f'{where}={chans} but the neck gives {out_channels}-channel maps '
                '(model.neck.out_channels): make them equal.'
            )


def dataset_class(ds: Mapping, scope: str) -> Any:
    """The class a dataset config builds: its ``type`` when that is a class, else the
    name's entry in ``scope``'s ``DATASETS`` registry; None where it cannot be told."""
    import importlib

    if isinstance(ds.get('type'), type):
        return ds['type']
    try:
        return importlib.import_module(f'{scope}.registry').DATASETS.get(type_name(ds))
    except (ImportError, AttributeError, KeyError, TypeError):
        return None


def dataset_class_names(
    ds: Mapping, scope: str, where: str = ''
) -> Tuple[Optional[Tuple[str, ...]], bool]:
    """The class names a dataset config trains on, and whether they are its own
    ``metainfo.classes`` (True; a string names a file of one class per line, as mmengine
    reads it) or its class's ``METAINFO`` (False; mmdet's ``CocoDataset``: the 80 COCO
    classes); ``(None, False)`` where neither says.

    Raises:
        ConfigError: ``metainfo.classes`` is a string that names no file (``('box')``
            for ``('box',)``), naming ``where`` (the dataset's config key).
    """
    meta = ds.get('metainfo')
    if isinstance(meta, Mapping) and isinstance(meta.get('classes'), (list, tuple)):
        return tuple(meta['classes']), True
    if isinstance(meta, Mapping) and isinstance(meta.get('classes'), str):
        classes = _classes_file(meta['classes'], f'{where}.' if where else '')
        return classes, classes is not None
    classes = (getattr(dataset_class(ds, scope), 'METAINFO', None) or {}).get('classes')
    return (tuple(classes), False) if isinstance(classes, (list, tuple)) else (None, False)


def _classes_file(value: str, where: str) -> Optional[Tuple[str, ...]]:
    """``metainfo.classes`` given as a string: mmengine reads a file of that name, one
    class per line; any other string it keeps as it is, and ``len('box')`` is 3 classes
    (``'b'``, ``'o'``, ``'x'``) -- ``classes = ('box')`` is the string, not a one-class
    tuple.

    Raises:
        ConfigError: the string is no file, naming the tuple to write.
    """
    if '://' in value:
        return None  # remote (mmengine's backends read it): not told here
    if osp.isfile(value):
        with open(value, encoding='utf-8') as f:
            return tuple(line.rstrip('\r\n') for line in f)
    raise ConfigError(
        f'{where}metainfo.classes={value!r} is a string, not a tuple of class names (and no file '
        'of class names): mmengine would take its characters as classes. A one-class '
        f'tuple needs its comma: classes=({value!r},)'
    )


def _dataset_classes(cfg: Mapping) -> Optional[Tuple[int, str]]:
    """How many classes the training (else validation / test) dataset of an mmdet config
    has, and where that comes from: its ``metainfo.classes``, else its class's
    ``METAINFO`` (wrappers' inner datasets followed)."""
    for split in ('train', 'val', 'test'):
        loader = cfg.get(f'{split}_dataloader')
        ds = loader.get('dataset') if isinstance(loader, Mapping) else None
        where = f'{split}_dataloader.dataset'
        while isinstance(ds, Mapping) and ('dataset' in ds or 'datasets' in ds):
            inner = ds.get('dataset')
            if inner is None and isinstance(ds.get('datasets'), (list, tuple)) and ds['datasets']:
                inner, where = ds['datasets'][0], f'{where}.datasets[0]'
            else:
                where = f'{where}.dataset'
            ds = inner
        if not isinstance(ds, Mapping):
            continue
        classes, own = dataset_class_names(ds, 'mmdet', where)
        if classes is not None:
            source = (
                f'{where}.metainfo.classes' if own else f"{type_name(ds)}'s classes ({where}.type)"
            )
            return len(classes), source
    return None


def _check_det_classes(cfg: Mapping, model: Mapping) -> None:
    """An mmdet head whose ``num_classes`` is not the dataset's class count: fewer trains
    the missing classes as background without an error, more never sees data for some.
    Not checked: panoptic models (their box heads count the "thing" classes only) and
    open-vocabulary detectors (``num_classes`` counts text tokens: GroundingDINO, GLIP)."""
    if any(k in model for k in ('panoptic_head', 'semantic_head', 'panoptic_fusion_head')):
        return
    if any(w in type_name(model) for w in ('Grounding', 'GLIP')):
        return
    heads = [('model.bbox_head', model.get('bbox_head'))]
    heads += _roi_parts(model, ('bbox_head', 'mask_head'))
    heads = [(w, h) for w, h in heads if isinstance(h, Mapping) and is_int(h.get('num_classes'))]
    if not heads:
        return
    found = _dataset_classes(cfg)
    if found is None:
        return
    n, source = found
    for where, head in heads:
        if head['num_classes'] != n:
            raise ConfigError(
                f'{where}.num_classes={head["num_classes"]} but the dataset has {n} classes '
                f'({source}): set {", ".join(w + ".num_classes" for w, _ in heads)} to {n} '
                "(or the dataset's metainfo.classes to the classes the heads predict)."
            )


#: The keys a two-stage mmdet detector reads from ``model.train_cfg`` / ``model.test_cfg``
#: (``TwoStageDetector.__init__`` / ``loss``); anything else there is never read.
_TWO_STAGE_CFG_KEYS = {'train_cfg': ('rpn', 'rpn_proposal', 'rcnn'), 'test_cfg': ('rpn', 'rcnn')}


def _reads_no_cfg_of_its_own(cls: type, base: type) -> bool:
    """Whether no class of ``cls``'s MRO above ``base`` reads a ``train_cfg`` /
    ``test_cfg`` key itself (mmdet's panoptic detectors read ``test_cfg.panoptic``); False
    where a source cannot be read."""
    for owner in cls.__mro__:
        if owner is base:
            return True
        try:
            src = inspect.getsource(owner)
        except (OSError, TypeError):
            return False
        if re.search(r'(train|test)_cfg(\.\w|\[|\.get\()', src):
            return False
    return True


def _check_det_loop_cfgs(model: Mapping, registry: Any) -> None:
    """An mmdet ``model.test_cfg`` / ``train_cfg`` key the detector never reads: a
    segmentation ``mode='slide'`` (mmdet detectors have no sliding-window inference) or, in
    a two-stage detector that reads no key of its own (:func:`_reads_no_cfg_of_its_own`),
    a key beside ``rpn`` / ``rcnn`` (``score_thr`` set one level too high). Both were
    accepted and silently ignored."""
    from mmdet.models.detectors import TwoStageDetector

    typ = model.get('type')
    cls = registry.get(typ) if isinstance(typ, str) else typ
    two_stage = (
        isinstance(cls, type)
        and issubclass(cls, TwoStageDetector)
        and _reads_no_cfg_of_its_own(cls, TwoStageDetector)
    )
    for section, allowed in _TWO_STAGE_CFG_KEYS.items():
        node = model.get(section)
        if not isinstance(node, Mapping):
            continue
        if section == 'test_cfg' and 'mode' in node:
            raise ConfigError(
                f'model.test_cfg.mode={node["mode"]!r}: mmdet detectors ({type_name(model)}) '
                'have no whole / sliding-window test modes (an mmseg segmentor setting) and '
                'would ignore it; a detector predicts on the resized image of the test '
                "pipeline (test_dataloader.dataset.pipeline's Resize scale sets its size)"
            )
        if not two_stage:
            continue
        for key in node:
            if key not in allowed:
                close = close_names(str(key), allowed, n=1)
                hint = f'did you mean model.{section}.{close[0]}? ' if close else ''
                raise ConfigError(
                    f'model.{section}.{key}: {type_name(model)} (a two-stage detector) reads '
                    f'only {", ".join(allowed)} from model.{section} and would ignore it; '
                    f"{hint}the RoI head's settings go under model.{section}.rcnn, the "
                    f"RPN's under model.{section}.rpn"
                )


# ----------------------------------------------------------------------------------------
# the types of the other sections (optimizer, schedulers, hooks, weight initialisation)
# ----------------------------------------------------------------------------------------
def _scope_registries(scope: str) -> Dict[str, Any]:
    """The registries the non-model sections are built from, in ``scope``."""
    if scope == 'mmdet':
        from mmdet import registry
    elif scope == 'mmseg':
        from mmseg import registry
    else:
        from mmengine import registry
    return {
        name: getattr(registry, name)
        for name in (
            'OPTIM_WRAPPERS',
            'OPTIM_WRAPPER_CONSTRUCTORS',
            'OPTIMIZERS',
            'PARAM_SCHEDULERS',
            'HOOKS',
            'WEIGHT_INITIALIZERS',
        )
    }


def _section_types(cfg: Mapping) -> List[Tuple[str, Any, str]]:
    """``(key, type name, registry)`` of the config's optimizer wrapper, its constructor
    and optimizer, the LR / momentum schedulers, the hooks and the backbone's
    ``init_cfg``: what mmengine builds by name (a typo was a ``KeyError`` traceback); an
    entry with its own ``_scope_`` is left to that scope's registry."""

    def each(where: str, value: Any) -> List[Tuple[str, Any]]:  # one entry, or a list
        if isinstance(value, (list, tuple)):
            return [(f'{where}[{i}]', v) for i, v in enumerate(value)]
        return [(where, value)]

    wrapper = cfg.get('optim_wrapper')
    optimizer = wrapper.get('optimizer') if isinstance(wrapper, Mapping) else None
    model = cfg.get('model')
    backbone = model.get('backbone') if isinstance(model, Mapping) else None
    init = backbone.get('init_cfg') if isinstance(backbone, Mapping) else None
    # (where, entry, the entry's key that names the type, registry)
    entries: List[Tuple[str, Any, str, str]] = [
        ('optim_wrapper', wrapper, 'type', 'OPTIM_WRAPPERS'),
        ('optim_wrapper', wrapper, 'constructor', 'OPTIM_WRAPPER_CONSTRUCTORS'),
        ('optim_wrapper.optimizer', optimizer, 'type', 'OPTIMIZERS'),
    ]
    entries += [
        (w, s, 'type', 'PARAM_SCHEDULERS')
        for w, s in each('param_scheduler', cfg.get('param_scheduler'))
    ]
    entries += [(w, h, 'type', 'HOOKS') for w, h in each('custom_hooks', cfg.get('custom_hooks'))]
    entries += [
        (f'default_hooks.{name}', hook, 'type', 'HOOKS')
        for name, hook in (cfg.get('default_hooks') or {}).items()
    ]
    entries += [
        (w, part, 'type', 'WEIGHT_INITIALIZERS')
        for w, part in each('model.backbone.init_cfg', init)
    ]
    return [
        (f'{where}.{field}', node[field], registry)
        for where, node, field, registry in entries
        if isinstance(node, Mapping)
        and '_scope_' not in node
        and isinstance(node.get(field), str)
        and node[field]
    ]


def check_section_types(cfg: Mapping) -> None:
    """Refuse a ``type`` of the optimizer wrapper, its constructor and optimizer, a
    scheduler, a hook or the backbone's ``init_cfg`` that the config's scope has not
    registered, with the close names (mmengine builds them after start-up, ending in a
    ``KeyError`` traceback).

    Raises:
        ConfigError: naming the key, the type and the close names.
    """
    scope = cfg.get('default_scope') or 'mmseg'
    registries = _scope_registries(scope)
    for key, typ, reg_name in _section_types(cfg):
        registry = registries[reg_name]
        if registry.get(typ) is not None:
            continue
        names = set(registry.module_dict)
        if registry.parent is not None:
            names |= set(registry.parent.module_dict)
        close = difflib.get_close_matches(typ.split('.')[-1], sorted(names), n=3, cutoff=0.6)
        raise ConfigError(
            f'{key}={typ!r} is not registered in the {scope} {registry.name} registry'
            + (f'; did you mean {" or ".join(repr(c) for c in close)}?' if close else '.')
            + (
                f" lookhere-dense's register when {CONFIG_IMPORT} is imported "
                '(custom_imports; the tools register for you).'
                if 'LookHere' in typ or 'LookHere' in ''.join(close)
                else _unregistered_fix(key)
            )
        )


def _unregistered_fix(key: str) -> str:
    """What to do with a type no registry knows: import the module that registers it, or
    (an optional hook) drop the entry."""
    register = ' Import the module that registers it (custom_imports=dict(imports=[MODULE]))'
    if key.startswith('custom_hooks['):
        return (
            f"{register}; mmdet's projects/ (ViTDet's Fp16CompresssionHook) are not in its pip "
            'package. Or drop the hook: --cfg-options custom_hooks=[] (all of them).'
        )
    return register + '.'


#: Keys of an ``optim_wrapper`` section that mmengine's builder takes before the wrapper
#: class sees the rest (``build_optim_wrapper``: the constructor and its ``paramwise_cfg``).
OPTIM_WRAPPER_BUILDER_KEYS = frozenset({'type', 'constructor', 'paramwise_cfg', '_scope_'})


def check_optim_wrapper_keys(cfg: Mapping) -> None:
    """Refuse a key of ``optim_wrapper`` that its wrapper class cannot take
    (``optim_wrapper.dtpye=bfloat16`` for ``dtype``: a ``TypeError`` traceback from the
    wrapper's ``__init__`` after the model was built), or of ``optim_wrapper.optimizer``
    that its optimizer class cannot take (``learning_rate``), naming the close names.
    ``MixedPrecisionOptimWrapper`` takes ``AmpOptimWrapper``'s arguments; a wrapper whose
    arguments cannot be told (:func:`accepted_arguments`), a constructor that is no
    ``DefaultOptimWrapperConstructor`` (it may read keys of its own) and a section without
    ``optimizer`` (``MultiOptimWrapperConstructor``'s) are left alone.

    Raises:
        ConfigError: naming the key, the close names and what the wrapper takes.
    """
    wrapper = cfg.get('optim_wrapper')
    if not isinstance(wrapper, Mapping) or '_scope_' in wrapper or 'optimizer' not in wrapper:
        return  # no optimizer: a multi-optimizer section, its constructor's keys
    registries = _scope_registries(cfg.get('default_scope') or 'mmseg')
    constructor = wrapper.get('constructor')
    if constructor is not None:  # another constructor may read keys of its own
        from mmengine.optim import DefaultOptimWrapperConstructor

        kind = registries['OPTIM_WRAPPER_CONSTRUCTORS'].get(constructor)
        if not (isinstance(kind, type) and issubclass(kind, DefaultOptimWrapperConstructor)):
            return
    registry = registries['OPTIM_WRAPPERS']
    typ = wrapper.get('type', 'OptimWrapper')
    cls = registry.get(typ) if isinstance(typ, str) else typ
    if getattr(cls, '__name__', None) == 'MixedPrecisionOptimWrapper':
        cls = cls.__mro__[1]  # mmengine's AmpOptimWrapper: the same arguments
    accepted = accepted_arguments(cls)
    if accepted is None:
        return
    for key in wrapper:
        if key in OPTIM_WRAPPER_BUILDER_KEYS or key in accepted:
            continue
        names = sorted(accepted | {'constructor', 'paramwise_cfg'})
        close = close_names(key, names)
        amp = (
            '' if close else ', '.join(repr(c) for c in close_names(key, ['dtype', 'loss_scale']))
        )
        raise ConfigError(
            f'optim_wrapper.{key}: {cls.__name__} has no argument {key!r}'
            + (f'; did you mean {" or ".join(repr(c) for c in close)}?' if close else '')
            + f' ({cls.__name__} takes {", ".join(names)})'
            + (
                f'; {amp} is a mixed-precision setting: optim_wrapper.type=AmpOptimWrapper '
                '(or tools/train.py --amp)'
                if amp
                else ''
            )
        )
    _check_optimizer_keys(wrapper['optimizer'], registries['OPTIMIZERS'])


#: other libraries' names of torch optimizers' arguments (Keras, Hugging Face, ...)
_OPTIMIZER_ALIASES = {
    'learning_rate': ('lr',),
    'base_lr': ('lr',),
    'wd': ('weight_decay',),
    'beta1': ('betas',),
    'beta2': ('betas',),
    'epsilon': ('eps',),
}


def _check_optimizer_keys(optimizer: Any, registry: Any) -> None:
    """Refuse a key of ``optim_wrapper.optimizer`` its class cannot take
    (``learning_rate`` for ``lr``: torch's ``TypeError`` after the model was built),
    naming the close names; an optimizer whose arguments cannot be told is left alone."""
    if not isinstance(optimizer, Mapping):
        return
    if optimizer.get('_scope_'):  # mmengine builds it in that scope (and drops the key)
        registry = _scope_registries(optimizer['_scope_'])['OPTIMIZERS']
    typ = optimizer.get('type')
    cls = registry.get(typ) if isinstance(typ, str) else typ
    accepted = accepted_arguments(cls)
    if accepted is None:
        return
    names = sorted(accepted - {'params'})
    for key in optimizer:
        if key in ('type', '_scope_') or key in names:
            continue
        close = close_names(key, names) or [
            n for n in _OPTIMIZER_ALIASES.get(key.lower(), ()) if n in names
        ]
        raise ConfigError(
            f'optim_wrapper.optimizer.{key}: {cls.__name__} has no argument {key!r}'
            + (f'; did you mean {" or ".join(repr(c) for c in close)}?' if close else '')
            + f' ({cls.__name__} takes {", ".join(names)})'
        )


def check_loop_values(cfg: Mapping, splits: Sequence[str] = ('train', 'val', 'test')) -> None:
    """Refuse a dataloader ``batch_size`` of the ``splits`` below 1, a negative (or
    non-numeric) learning rate and a ``train_cfg.val_interval`` below 1 (torch's sampler
    and optimizer and mmengine's loop refused them after start-up, in tracebacks).

    Raises:
        ConfigError: naming the key and the value.
    """
    for split in splits:
        loader = cfg.get(f'{split}_dataloader')
        size = loader.get('batch_size') if isinstance(loader, Mapping) else None
        if size is not None and not (is_int(size) and size >= 1):
            raise ConfigError(
                f'{split}_dataloader.batch_size={size!r}: images per batch must be a whole '
                'number >= 1'
            )
    wrapper = cfg.get('optim_wrapper')
    optimizer = wrapper.get('optimizer') if isinstance(wrapper, Mapping) else None
    lr = optimizer.get('lr') if isinstance(optimizer, Mapping) else None
    if 'train' in splits and lr is not None:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 <= lr < math.inf:
            raise ConfigError(  # NaN, and inf (which trained on until it diverged)
                f'optim_wrapper.optimizer.lr={lr!r}: the learning rate must be a finite '
                'number >= 0'
            )
    train_cfg = cfg.get('train_cfg')
    interval = train_cfg.get('val_interval') if isinstance(train_cfg, Mapping) else None
    validates = all(cfg.get(k) is not None for k in ('val_cfg', 'val_dataloader', 'val_evaluator'))
    if (
        'train' in splits
        and validates
        and interval is not None
        and not (is_number(interval) and interval >= 1)  # 1e6 is a float: mmengine takes it
    ):
        raise ConfigError(  # mmengine divided by it after the first iteration
            f'train_cfg.val_interval={interval!r}: validate every N >= 1 iterations (or '
            'epochs); to never validate, start validating after the run '
            '(train_cfg.val_begin=1000000: a val_interval larger than the run still '
            'validates at its end) or val_cfg=None val_dataloader=None val_evaluator=None'
        )


def preprocessor_scale_note(cfg: Mapping) -> Optional[str]:
    """A warning for ``model.data_preprocessor`` ``mean`` / ``std`` written on the 0..1
    scale (timm's ``IMAGENET_DEFAULT_MEAN``): mmseg / mmdet load images as 0..255, so the
    model then sees inputs ~255x too large -- it trains without an error, to a few % mIoU.
    None when both are on the 0..255 scale or not given."""
    model = cfg.get('model')
    pre = model.get('data_preprocessor') if isinstance(model, Mapping) else None
    if not isinstance(pre, Mapping):
        return None
    mean, std = pre.get('mean'), pre.get('std')
    values = (
        [v for v in (mean or []) + (std or []) if is_number(v)]
        if isinstance(mean, (list, tuple)) and isinstance(std, (list, tuple))
        else []
    )
    if not values or max(abs(v) for v in values) > 1.5:
        return None
    return (
        f'model.data_preprocessor mean={list(mean)} std={list(std)} are on the 0..1 scale, '
        'but the images are loaded as 0..255: the model sees inputs ~255x too large (it '
        'trains, to a few % mIoU). For ImageNet statistics on 0..255 images use '
        'mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]'
    )


#: The inference modes of mmseg's ``EncoderDecoder`` (``model.test_cfg.mode``).
SEG_TEST_MODES = ('whole', 'slide')


def seg_test_modes(model: Mapping, registry: Any = None) -> Optional[Tuple[str, ...]]:
    """The ``test_cfg.mode`` values the config's segmentor takes: :data:`SEG_TEST_MODES`
    for ``EncoderDecoder`` and the subclasses that keep its ``inference`` (mmseg's
    ``CascadeEncoderDecoder``, ours); None where that cannot be told (another class, e.g.
    mmseg's ``DepthEstimator`` with its ``'slide_flip'``, or one not registered)."""
    from mmseg.models.segmentors import EncoderDecoder

    typ = model.get('type')
    cls = (registry or model_registry('mmseg')).get(typ) if isinstance(typ, str) else typ
    if isinstance(cls, type) and issubclass(cls, EncoderDecoder):
        if cls.inference is EncoderDecoder.inference:
            return SEG_TEST_MODES
    return None


def _pair(value: Any) -> Optional[Tuple[int, int]]:
    """``(H, W)`` of a two-int sequence (what mmseg's sliding inference unpacks)."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(map(is_int, value)):
        return (value[0], value[1])
    return None


#: mmseg backbones that pad a frame to whole patches themselves (``patch_pad`` /
#: ``padding='corner'``; ``LookWhereViT``'s extractor: its grid is ``ceil(side / p)``), with
#: their default patch size
PATCH_PADDING_BACKBONES = {'LookHereViT': 16, 'VisionTransformer': 16, 'LookWhereViT': 16}


def patch_side(patch: Any) -> Optional[int]:
    """The smallest side that is a whole number of patches both ways: a patch size (an
    int, or ``(H, W)``: the least common multiple of its sides, so a ``size_divisor`` or
    crop that is a multiple of it fits both) as an int above 1, else None."""
    if isinstance(patch, (tuple, list)) and len(patch) == 2 and all(map(is_int, patch)):
        patch = math.lcm(*patch) if min(patch) > 0 else None
    return patch if is_int(patch) and patch > 1 else None


def pads_test_frames(test_cfg: Any, patch: int) -> bool:
    """Whether a data preprocessor's ``test_cfg`` pads test frames to multiples of
    ``patch``: a ``size_divisor`` that is one, or a fixed ``size``."""
    test_cfg = test_cfg or {}
    divisor = test_cfg.get('size_divisor')
    return test_cfg.get('size') is not None or (is_int(divisor) and divisor % patch == 0)


def self_padding_patch(model: Any) -> Optional[int]:
    """The patch size in px of the backbone of a ``model`` config where that backbone pads
    its input to whole patches itself (:data:`PATCH_PADDING_BACKBONES`): an input side
    that is no patch multiple then gives a grid the head stretches over the input. None
    for other backbones and a patch size of 1 or one that is not an int."""
    backbone = model.get('backbone') if isinstance(model, Mapping) else None
    name = type_name(backbone) if isinstance(backbone, Mapping) else None
    if name not in PATCH_PADDING_BACKBONES:
        return None
    if name == 'LookWhereViT':  # the extractor's patches
        backbone = backbone.get('extractor') or {}
        if not isinstance(backbone, Mapping):
            return None
    return patch_side(backbone.get('patch_size', PATCH_PADDING_BACKBONES[name]))


def check_patch_multiple(size: Any, patch: Optional[int], key: str, what: str) -> None:
    """Refuse an input size ``(H, W)`` that is no multiple of the backbone's ``patch``
    (:func:`self_padding_patch`): the backbone pads it to whole patches and mmseg's head
    stretches the padded grid over the input -- predictions (or, in training, the logits
    the loss compares with the labels) up to ``patch - 1`` px off at the far edge, with
    no error anywhere.

    Args:
        size: ``(H, W)`` ints (anything else is left to the other checks).
        patch: the patch size in px; None: nothing to check.
        key: where the size is set (``--crop``, ``model.test_cfg.crop_size``), for the
            message.
        what: what is padded, e.g. ``'each sliding window'``.

    Raises:
        ConfigError: naming ``key``, its value, the patch and the nearest multiples.
    """
    hw = _pair(size)
    if patch is None or hw is None or all(s % patch == 0 for s in hw):
        return
    h, w = hw
    down = tuple(max(patch, s // patch * patch) for s in hw)
    up = tuple(-(-s // patch) * patch for s in hw)
    raise ConfigError(
        f"{key}={h}x{w} is not a multiple of the backbone's {patch}-px patch: {what} is "
        f'padded to {up[0]}x{up[1]} inside the backbone and the head stretches the padded '
        f'grid over {h}x{w} px (up to {patch - 1} px off at the far edge); use '
        f'{down[0]}x{down[1]}' + (f' or {up[0]}x{up[1]}' if up != down else '')
    )


def check_training_crop_grid(cfg: Mapping) -> None:
    """Refuse an mmseg ``model.data_preprocessor.size`` (the size every training batch is
    padded to) that is no multiple of the patch of a backbone that pads to whole patches
    itself (:func:`check_patch_multiple`): the logits the loss compares with the labels
    are the padded grid stretched over the crop. For training runs only (the
    preprocessor's ``size`` is not used in tests)."""
    model = cfg.get('model')
    if (cfg.get('default_scope') or 'mmseg') != 'mmseg' or not isinstance(model, Mapping):
        return
    pre = model.get('data_preprocessor')
    if isinstance(pre, Mapping):
        check_patch_multiple(
            pre.get('size'),
            self_padding_patch(model),
            'model.data_preprocessor.size',
            'every training crop',
        )


def check_seg_test_cfg(
    test_cfg: Any,
    crop_key: str = 'model.test_cfg.crop_size',
    stride_key: str = 'model.test_cfg.stride',
    modes: Optional[Sequence[str]] = SEG_TEST_MODES,
    patch_size: Optional[int] = None,
) -> None:
    """Refuse an mmseg ``test_cfg`` that would fail (or leave pixels unpredicted) only at
    the first test image: a ``mode`` mmseg does not have (``'Whole'``), a ``'slide'``
    without ``crop_size`` / ``stride``, or a stride longer than the window (mmseg's
    sliding inference then has pixels no window covers and stops on a bare
    ``AssertionError``), and a window that is no multiple of ``patch_size``
    (:func:`check_patch_multiple`).

    Args:
        crop_key, stride_key: how the message names where the window and the stride
            come from (``tools/infer.py``: ``--crop`` / ``--stride``).
        modes: the modes the segmentor takes (:func:`seg_test_modes`); None: any.
            Default: :data:`SEG_TEST_MODES`.
        patch_size: the patch size of a backbone that pads to whole patches itself
            (:func:`self_padding_patch`). Default: None (not checked).

    Raises:
        ConfigError: naming the key, its value and what works.
    """
    if not isinstance(test_cfg, Mapping) or 'mode' not in test_cfg:
        return
    mode = test_cfg['mode']
    if modes is not None and mode not in modes:
        close = close_names(str(mode).lower(), modes, n=1)
        raise ConfigError(
            f"model.test_cfg.mode={mode!r} is not one of the test modes of mmseg's "
            f'EncoderDecoder {tuple(modes)}' + (f'; did you mean {close[0]!r}?' if close else '')
        )
    if mode != 'slide':
        return
    crop, stride = _pair(test_cfg.get('crop_size')), _pair(test_cfg.get('stride'))
    if crop is None or stride is None:
        raise ConfigError(
            f"model.test_cfg.mode='slide' needs {crop_key} and {stride_key} as (H, W) ints, "
            f'got crop_size={test_cfg.get("crop_size")!r}, stride={test_cfg.get("stride")!r}'
        )
    if any(s < 1 for s in stride) or stride[0] > crop[0] or stride[1] > crop[1]:
        raise ConfigError(
            f'{stride_key}={stride[0]}x{stride[1]} with {crop_key}={crop[0]}x{crop[1]}: '
            'sliding windows must step by 1 px to the window size at most, else pixels '
            f'between windows get no prediction; use a stride of at most '
            f'{crop[0]}x{crop[1]} (mmseg configs use about 2/3 of the window)'
        )
    check_patch_multiple(crop, patch_size, crop_key, 'each sliding window')


def check_model_cfg(cfg: Mapping) -> None:
    """Check the model part of a config before building it.

    * every ``type`` of the model, backbone, neck and heads is registered in the scope's
      ``MODELS`` (an unknown one gets close matches and the ``custom_imports`` hint);
    * their other keys are arguments their classes take (a misspelt one is named with the
      close ones; :func:`accepted_arguments`: only where that can be told for sure);
    * for ``LookHereViT``: the LookHere head layout fits ``num_heads``, DPT heads get CLS
      tokens, other heads do not, head ``in_index`` / ``in_channels`` match the outputs,
      and so do a ``SimpleFPN``, ``MultiLevelNeck`` or mmdet ``FPN`` neck's; in a detector
      (mmdet) the heads' strides (anchor / prior generators, RoI extractors) are the
      neck's (:func:`neck_strides`) and their channels its ``out_channels``;
    * in an mmdet config, the heads' ``num_classes`` is the dataset's class count
      (``metainfo.classes``, else the dataset class's ``METAINFO``);
    * an mmseg ``model.test_cfg`` whose mode or sliding windows cannot work
      (:func:`check_seg_test_cfg`), and, for a backbone that pads to whole patches
      itself, sliding windows that are no patch multiple (:func:`check_patch_multiple`;
      training crops: :func:`check_training_crop_grid`); an mmdet ``model.test_cfg`` / ``train_cfg`` key the
      detector never reads (a ``mode``; beside ``rpn`` / ``rcnn`` in a two-stage one).

    Raises:
        ConfigError: naming the key to set.
    """
    model = cfg.get('model')
    if not isinstance(model, Mapping):
        return
    scope = cfg.get('default_scope') or 'mmseg'
    registry = model_registry(scope)
    parts = [('model', model)] + _parts(model)
    for where, node in parts:
        _check_registered(where, node, registry, scope)
    for where, node in parts:
        _check_arguments(where, node, registry)
    if scope == 'mmseg':
        modes = seg_test_modes(model, registry)
        patch = self_padding_patch(model)
        if modes is not None:  # another segmentor: its own modes and checks
            check_seg_test_cfg(model.get('test_cfg'), modes=modes, patch_size=patch)
    bb = model.get('backbone')
    if isinstance(bb, Mapping) and str(bb.get('type', '')).split('.')[-1] == 'LookHereViT':
        _lookhere_checks(model, registry if scope == 'mmdet' else None)
    if scope == 'mmdet':
        _check_det_classes(cfg, model)
        _check_det_loop_cfgs(model, registry)


def _local_missing(path: Any) -> bool:
    return isinstance(path, str) and '://' not in path and not osp.isfile(path)


def _is_lookhere(backbone: Any) -> bool:
    return (
        isinstance(backbone, Mapping)
        and str(backbone.get('type', '')).split('.')[-1] == 'LookHereViT'
    )


def clear_inherited_pretrained(cfg: Mapping, note: Callable[[str], None]) -> Optional[str]:
    """Clear a ``model.pretrained`` that conflicts with a LookHereViT backbone's own weights.

    mmseg's stock ViT configs (``mmseg::vit/...``, ``mmseg::segmenter/...``) set
    ``model.pretrained`` to weights of *their* backbone; a config that inherits one and
    replaces the backbone (``backbone=dict(_delete_=True, type='LookHereViT', ...,
    init_cfg=dict(type='Pretrained', checkpoint=...))``) still carries it, and mmseg's
    ``EncoderDecoder`` hands it to the backbone, which cannot take both. When the
    LookHereViT backbone names its own weights (``init_cfg`` or ``pretrained``), the
    model-level one is cleared and ``note`` says so. Without weights of its own the
    backbone keeps ``model.pretrained`` (mmseg's way to give it weights).

    Returns:
        The cleared path, or None.
    """
    model = cfg.get('model')
    if not isinstance(model, Mapping):
        return None
    bb = model.get('backbone')
    inherited = model.get('pretrained')
    if inherited is None or not _is_lookhere(bb):
        return None
    if bb.get('init_cfg') is not None:
        own = 'model.backbone.init_cfg'
    elif bb.get('pretrained') is not None:
        own = 'model.backbone.pretrained'
    else:
        return None
    model['pretrained'] = None
    note(
        f"model.pretrained={inherited!r} (weights for the base config's backbone) was "
        f'cleared: the LookHereViT backbone takes its weights from {own}, and mmseg cannot '
        'pass both. To use model.pretrained instead, set '
        f'{own}=None.'
    )
    return inherited


def _pretrained_entries(model: Mapping) -> List[Tuple[str, str, str]]:
    """``(key, path, key that opts out)`` of every local pretrained file named by the
    model part of a config that does not exist."""
    out = []
    if _local_missing(model.get('pretrained')):
        out.append(('model.pretrained', model['pretrained'], 'model.pretrained'))
    bb = model.get('backbone')
    if isinstance(bb, Mapping):
        if _local_missing(bb.get('pretrained')):
            out.append(
                ('model.backbone.pretrained', bb['pretrained'], 'model.backbone.pretrained')
            )
        init = bb.get('init_cfg')
        if (
            isinstance(init, Mapping)
            and init.get('type') == 'Pretrained'
            and _local_missing(init.get('checkpoint'))
        ):
            out.append(
                (
                    'model.backbone.init_cfg.checkpoint',
                    init['checkpoint'],
                    'model.backbone.init_cfg',
                )
            )
    return out


_WHERE = (
    'the official LookHere ImageNet checkpoints LH_180/LH_90/LH_45_weights_and_'
    'config.pth are linked from github.com/GreenCUBIC/lookhere'
)


def check_pretrained_files(
    cfg: Mapping, allow_random_init: bool = False, warn: Callable[[str], None] = print
) -> List[str]:
    """Stop when the config names pretrained weights whose local file does not exist.

    Fine-tuning from random weights runs to the end and gives a plausible but wrong
    number, so a missing file is an error unless ``allow_random_init`` (then the settings
    are cleared and ``warn`` says so: :func:`drop_missing_pretrained`). Remote paths
    (``https://``...) are left to the loader.

    Returns:
        The missing paths that were dropped (only with ``allow_random_init``).

    Raises:
        ConfigError: naming the key, the path, and how to fix it.
    """
    model = cfg.get('model')
    if not isinstance(model, Mapping):
        return []
    missing = _pretrained_entries(model)
    if missing and not allow_random_init:
        key, path, off = missing[0]
        raise ConfigError(
            f'{key}={path!r}: pretrained weights not found. Put the file there ({_WHERE}), '
            f'or point to it with --cfg-options {key}=PATH. To train from random weights '
            f'on purpose pass --allow-random-init (or set {off}=None).'
        )
    return drop_missing_pretrained(cfg, warn)


def drop_missing_pretrained(cfg: Mapping, warn: Callable[[str], None]) -> List[str]:
    """Clear pretrained-weight settings whose local file does not exist, so training
    starts (from random init), and ``warn`` about each one.

    Looks at ``model.pretrained``, ``model.backbone.pretrained`` and a
    ``model.backbone.init_cfg`` of type ``Pretrained``. Remote paths (``http://``...) are
    left to the loader.

    Returns:
        The missing paths (empty when nothing was dropped).
    """
    model = cfg.get('model')
    if not isinstance(model, Mapping):
        return []
    dropped = []
    for key, path, off in _pretrained_entries(model):
        dropped.append(path)
        warn(
            f'{key}={path!r}: file not found, so the backbone starts from RANDOM weights '
            f'(random init allowed). Fine-tuning needs the weights: put the file there '
            f'({_WHERE}) or set --cfg-options {key}=PATH. --cfg-options {off}=None '
            'trains from scratch without this warning.'
        )
        if key == 'model.pretrained':
            model['pretrained'] = None
        elif key == 'model.backbone.pretrained':
            model['backbone']['pretrained'] = None
        else:
            model['backbone']['init_cfg'] = None
    return dropped
