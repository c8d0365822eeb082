"""Checks that turn bad segmentation data into messages that say what to fix.

Three kinds of mistakes otherwise surface as tracebacks deep inside a dataloader or the
loss (``IndexError: Target 151 is out of bounds``, a CUDA device-side assert, an empty
dataset, training on nothing but padding):

* a dataset folder that is missing or empty (:func:`check_dataset_layout`, run by
  ``tools/train.py`` / ``tools/test.py`` before anything is built);
* label values outside ``0..num_classes-1`` (other than the ignore index):
  :class:`~.transforms.CheckSegLabels`, a pipeline transform that checks every loaded annotation,
  and :func:`check_label_values`, a sampled scan before training;
* a training crop larger than the images even at the pipeline's largest resize
  (:func:`check_crop_fits`);
* an annotation of another size than its image (the crops would pair pixels with the
  wrong labels), an image or annotation file that cannot be read, and annotations that hold
  nothing but the ignore index (nothing to learn; mmseg's ``acc_seg`` reports 100 for
  them): :func:`check_label_values` (sizes from the file headers, all files up to a
  budget) and :class:`~.transforms.CheckSegLabels` (every loaded pair).

Every failure raises a subclass of :class:`~lookhere_dense.errors.DataCheckError` whose message names the
file / folder / setting and what to change.
"""

from __future__ import annotations

import os.path as osp
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import (
    ConfigError,
    CropSizeError,
    DataCheckWarning,
    DatasetLayoutError,
    LabelRangeError,
    LabelSizeError,
)
from ..registry import type_name
from ..validation import is_number, path_inside
from .labels import (
    all_ignored_message,
    bad_label_values,
    channels_message,
    label_message,
    label_values,
    reduce_zero_label_verdict,
    size_message,
    unreadable_file,
    wide_labels_message,
)

__all__ = [
    'check_dataset_layout',
    'check_dataset_arguments',
    'check_coco_annotations',
    'check_label_values',
    'check_crop_fits',
    'check_seg_data',
    'check_output_outside_data',
    'sync_label_checks',
    'loss_ignore_index',
    'crop_padding_note',
    'drop_eval_pads',
    'whole_frame_pad_note',
    'unpadded_whole_frame_patch',
    'image_size',
    'largest_size_after',
    'size_after',
    'largest_frame',
    'LAYOUT_HINTS',
]


#: How each dataset type expects its files (shown when something is missing).
LAYOUT_HINTS: Dict[str, str] = {
    'ADE20KDataset': (
        'ADE20K layout: <data_root>/images/{training,validation}/*.jpg and '
        '<data_root>/annotations/{training,validation}/*.png (uint8; 0 = other, k = class '
        'k-1), e.g. data_root=data/ade/ADEChallengeData2016 from ADEChallengeData2016.zip'
    ),
    'CityscapesDataset': (
        'Cityscapes layout: <data_root>/leftImg8bit/{train,val}/<city>/*_leftImg8bit.png and '
        '<data_root>/gtFine/{train,val}/<city>/*_gtFine_labelTrainIds.png (train ids 0..18, '
        "255 = ignore; made from the official labels by mmseg's "
        'tools/dataset_converters/cityscapes.py), e.g. data_root=data/cityscapes/'
    ),
}
_DEMO_HINT = (
    'To try the pipeline without the real data, write the tiny datasets in these '
    'layouts: python tools/demo.py --data-only (into ./data).'
)


# ----------------------------------------------------------------------------------------
# Dataset configs and layout
# ----------------------------------------------------------------------------------------
def _scope(ds: Mapping, default_scope: str) -> str:
    """The registry scope a dataset config is built in (``mmdet.CocoDataset`` -> mmdet)."""
    typ = ds.get('type')
    if isinstance(typ, str) and '.' in typ:
        return typ.split('.')[0]
    if isinstance(typ, type):
        return typ.__module__.split('.')[0]
    return default_scope


def _dataset_nodes(ds_cfg: Mapping, key: str, wrappers: Tuple[Tuple[str, Mapping], ...] = ()):
    """``(config key, dataset config, (key, config) of the wrappers around it, outermost
    first)`` of every concrete dataset inside ``ds_cfg``.

    Wrappers are walked through their ``dataset`` (RepeatDataset, ClassBalancedDataset,
    MultiImageMixDataset, ...) or ``datasets`` list (ConcatDataset), whatever their type,
    so that ``key`` is the exact ``--cfg-options`` path of the dataset
    (``train_dataloader.dataset.dataset``, ``train_dataloader.dataset.datasets.1``)."""
    subs = ds_cfg.get('datasets')
    if isinstance(subs, (list, tuple)):
        for i, sub in enumerate(subs):
            if isinstance(sub, Mapping):
                yield from _dataset_nodes(sub, f'{key}.datasets.{i}', wrappers + ((key, ds_cfg),))
        return
    if isinstance(ds_cfg.get('dataset'), Mapping):
        yield from _dataset_nodes(ds_cfg['dataset'], f'{key}.dataset', wrappers + ((key, ds_cfg),))
        return
    yield key, ds_cfg, wrappers


def _leaf_datasets(ds_cfg: Mapping) -> List[Mapping]:
    """The concrete dataset configs inside wrappers (RepeatDataset, ConcatDataset, ...)."""
    return [ds for _, ds, _ in _dataset_nodes(ds_cfg, '')]


def _nodes(cfg: Mapping, splits: Iterable[str]):
    """``(dataloader, config key, dataset config, wrappers)`` of the dataloaders of
    ``splits``."""
    for split in splits:
        dl = cfg.get(f'{split}_dataloader')
        if dl and isinstance(dl.get('dataset'), Mapping):
            for key, ds, wrappers in _dataset_nodes(dl['dataset'], f'{split}_dataloader.dataset'):
                yield f'{split}_dataloader', key, ds, wrappers


def _dataloaders(cfg: Mapping, splits: Iterable[str]) -> List[Tuple[str, Mapping]]:
    return [(where, ds) for where, _, ds, _ in _nodes(cfg, splits)]


def _at_root(root: str, path: str) -> str:
    """``path`` as the layout shows it: ``<data_root>/path`` when relative to data_root."""
    if not root or osp.isabs(path) or '://' in path:
        return repr(path)
    return f'<data_root>/{path}'


def _expected_files(ds: Mapping, scope: str) -> str:
    """What a dataset type without a known layout reads, from its config: the annotation
    file and the folders of ``data_prefix``."""
    root = ds.get('data_root') or ''
    ann = ds.get('ann_file')
    parts = []
    if isinstance(ann, str) and ann:
        coco = scope == 'mmdet' and ann.endswith('.json')
        parts.append(f'{_at_root(root, ann)} (ann_file' + (', COCO-format JSON)' if coco else ')'))
    prefix = ds.get('data_prefix') or {}
    for key, sub in prefix.items() if isinstance(prefix, Mapping) else ():
        if isinstance(sub, str) and sub:
            what = 'the images it lists' if key in ('img', 'img_path') and parts else key
            parts.append(f'{what} under {_at_root(root, sub)} (data_prefix.{key})')
    if not parts:
        return ''
    return f' {type_name(ds)} expects ' + ' and '.join(parts) + '.'


def _hint(ds: Mapping, scope: str = 'mmseg') -> str:
    """The layout of ``ds``; the tiny demo datasets only for the segmentation layouts
    ``tools/demo.py --data-only`` writes."""
    scope = _scope(ds, scope)
    typ = type_name(ds)
    if scope == 'mmseg' and typ in LAYOUT_HINTS:
        return ' ' + LAYOUT_HINTS[typ] + '. ' + _DEMO_HINT
    return _expected_files(ds, scope)


def _join(root: str, path: str) -> str:
    return path if (not root or osp.isabs(path) or '://' in path) else osp.join(root, path)


def _evaluators(cfg: Mapping):
    """``(config key, evaluator config)`` of ``val_evaluator`` / ``test_evaluator`` (one
    or a list)."""
    for name in ('val_evaluator', 'test_evaluator'):
        ev = cfg.get(name)
        if isinstance(ev, Mapping):
            yield name, ev
        elif isinstance(ev, (list, tuple)):
            for i, e in enumerate(ev):
                if isinstance(e, Mapping):
                    yield f'{name}.{i}', e


def _annotation_loaders(pipeline: Any) -> List[Mapping]:
    """The steps of ``pipeline`` that load annotations (mmseg's ``LoadAnnotations``,
    ``LoadBiomedicalAnnotation``, ``LoadDepthAnnotation``, ...), also inside the
    ``transforms`` of a wrapper step (``TestTimeAug``: a list of lists), in order."""
    found: List[Mapping] = []
    for step in pipeline if isinstance(pipeline, (list, tuple)) else ():
        if isinstance(step, (list, tuple)):
            found += _annotation_loaders(step)
        elif isinstance(step, Mapping):
            name = type_name(step)
            if name.startswith('Load') and 'Annotation' in name:
                found.append(step)
            found += _annotation_loaders(step.get('transforms'))
    return found


def _scoring_evaluators(cfg: Mapping, split: str) -> List[str]:
    """The config keys of the evaluators of ``split`` (``val`` / ``test``) that score the
    predictions against the annotations (no ``format_only``)."""
    return [
        k for k, ev in _evaluators(cfg) if k.split('_')[0] == split and not ev.get('format_only')
    ]


def _reads_no_annotations(cfg: Mapping, where: str, ds: Mapping) -> bool:
    """Whether nothing of the run reads the annotations of the split ``where``
    (``test_dataloader``) names: a validation / test pipeline without an annotation loader
    (mmseg's set-up for a test set without labels: no ``LoadAnnotations``, the evaluator
    ``format_only=True``). A training split always reads them.

    Raises:
        ConfigError: such a pipeline under an evaluator that scores against the
            annotations (``format_only`` not set: mmseg's ``IoUMetric`` fails on the first
            batch, on the missing ``gt_sem_seg``).
    """
    split = where.split('_')[0]
    if split == 'train' or _annotation_loaders(ds.get('pipeline')):
        return False
    scoring = _scoring_evaluators(cfg, split)
    if scoring:
        raise ConfigError(
            f'{where}: the pipeline loads no annotations (no LoadAnnotations), but '
            f'{" and ".join(scoring)} scores the predictions against them (format_only is not '
            "set: mmseg's IoUMetric would fail on the missing gt_sem_seg). To score, add "
            "dict(type='LoadAnnotations') to the pipeline after the image is loaded; for a "
            f'split without annotations set {scoring[0]}.format_only=True (and its '
            'output_dir) to write the predictions instead'
        )
    return True


def _same_root_options(cfg: Mapping, key: str, root: str) -> List[str]:
    """The ``--cfg-options`` that move data_root ``root`` to ``PATH``: ``key`` first, then
    every other dataset of the train / val / test dataloaders with the same data_root, and
    the evaluators' ``ann_file`` under it (set from data_root when the config was read,
    so they do not follow a new data_root)."""
    options = [f'{key}.data_root=PATH']
    for _, other, ds, _ in _nodes(cfg, ('train', 'val', 'test')):
        if other != key and ds.get('data_root') == root:
            options.append(f'{other}.data_root=PATH')
    for ev_key, ev in _evaluators(cfg):
        ann = ev.get('ann_file')
        if not isinstance(ann, str) or not ann.startswith(root) or osp.exists(ann):
            continue
        rest = ann[len(root) :]
        if root.endswith('/') or rest.startswith('/'):  # under root, not a sibling folder
            options.append(f'{ev_key}.ann_file=PATH/{rest.lstrip("/")}')
    return options


def _where_note(key: str, ds: Mapping, wrappers: Sequence[Tuple[str, Mapping]]) -> str:
    """``'; <key> is the <type> inside the <wrapper>'`` when wrappers hide the dataset, and
    a data_root set on a wrapper (where no dataset reads it); ``''`` without wrappers."""
    if not wrappers:
        return ''
    chain = ' inside the '.join(type_name(w) for _, w in reversed(wrappers))
    note = f'; {key} is the {type_name(ds)} inside the {chain}'
    for w_key, w in wrappers:
        if 'data_root' in w:
            note += (
                f'; {w_key}.data_root={w["data_root"]!r} is set on the {type_name(w)} '
                f'wrapper, which does not pass it on: set {key}.data_root instead'
            )
    return note


def check_dataset_arguments(
    cfg: Mapping, splits: Sequence[str] = ('train', 'val', 'test')
) -> None:
    """Refuse a dataset config key its class cannot take (``reduce_zero_label`` on mmdet's
    ``CocoDataset``: a ``TypeError`` when the Runner builds the dataloader), naming the
    close ones: :func:`~lookhere_dense.config_checks.accepted_arguments` of the class the
    dataset's scope registers (only keys that would certainly fail).

    Raises:
        ConfigError: naming the key, the class and what it takes.
    """
    from ..config_checks import accepted_arguments, dataset_class
    from ..validation import close_names

    default_scope = cfg.get('default_scope') or 'mmseg'
    for _, key, ds, _ in _nodes(cfg, splits):
        cls = dataset_class(ds, _scope(ds, default_scope))
        accepted = accepted_arguments(cls)
        if not accepted:
            continue
        for name in ds:
            if name in ('type', '_scope_') or name in accepted:
                continue
            close = close_names(name, sorted(accepted))
            raise ConfigError(
                f'{key}.{name}: {cls.__name__} has no argument {name!r}'
                + (f'; did you mean {" or ".join(repr(c) for c in close)}?' if close else '')
                + f' ({cls.__name__} takes {", ".join(sorted(accepted))})'
            )


def check_dataset_layout(cfg: Mapping, splits: Sequence[str] = ('train', 'val', 'test')) -> None:
    """Check that every folder / file the dataloaders of ``splits`` name exists.

    Works for any OpenMMLab dataset config (``data_root``, ``data_prefix``, ``ann_file``),
    also inside dataset wrappers (``dataset`` / ``datasets``: RepeatDataset, ConcatDataset,
    ...).

    Also the ``ann_file`` of the ``val`` / ``test`` evaluators of ``splits`` (mmdet's
    ``CocoMetric`` reads one).

    A missing annotation folder (``data_prefix.seg_map_path``) of a validation / test
    split whose pipeline loads no annotations passes when its evaluators only write the
    predictions (``format_only=True``: mmseg's set-up for a test set without labels).

    Raises:
        DatasetLayoutError: naming the dataloader (or evaluator), the missing path (also
            made absolute), the exact ``--cfg-options`` key(s) to set (through the
            wrappers) and the layout the dataset type expects (the ``tools/demo.py``
            datasets only for the segmentation layouts it writes).
        ConfigError: a missing annotation folder of a split whose pipeline loads no
            annotations while its evaluator scores against them (:func:`_reads_no_annotations`).
    """
    check_dataset_arguments(cfg, splits)
    default_scope = cfg.get('default_scope') or 'mmseg'
    for where, key, ds, wrappers in _nodes(cfg, splits):
        hint = _hint(ds, default_scope)
        root = ds.get('data_root') or ''
        if '://' in root:
            continue  # remote storage: nothing to check locally
        if root and not osp.isdir(root):
            options = ' '.join(_same_root_options(cfg, key, root))
            raise DatasetLayoutError(
                f'{where}: dataset folder data_root={root!r} not found (looked in '
                f'{osp.abspath(root)!r}). Put the dataset there or point to it with '
                f'--cfg-options {options} (PATH: the dataset folder'
                + _where_note(key, ds, wrappers)
                + ').'
                + hint
            )
        prefix = ds.get('data_prefix') or {}
        for name, sub in prefix.items():
            if not isinstance(sub, str) or not sub:
                continue
            path = _join(root, sub)
            if '://' not in path and not osp.exists(path):
                if name == 'seg_map_path' and _reads_no_annotations(cfg, where, ds):
                    continue  # a split without annotations (format_only): nothing reads them
                raise DatasetLayoutError(
                    f'{where}: {name} folder {path!r} not found (data_root={root!r}, '
                    f'data_prefix.{name}={sub!r}; set with --cfg-options '
                    f'{key}.data_root=PATH or {key}.data_prefix.{name}=FOLDER'
                    + _where_note(key, ds, wrappers)
                    + ').'
                    + hint
                )
        ann = ds.get('ann_file') or ''
        if ann and '://' not in ann:
            path = _join(root, ann)
            if not osp.exists(path):
                raise DatasetLayoutError(
                    f'{where}: ann_file {path!r} not found (data_root={root!r}, '
                    f'ann_file={ann!r}; set with --cfg-options {key}.data_root=PATH or '
                    f'{key}.ann_file=FILE' + _where_note(key, ds, wrappers) + ').' + hint
                )
    for ev_key, ev in _evaluators(cfg):  # mmdet's CocoMetric reads its own ann_file
        if ev_key.split('_')[0] not in splits:
            continue
        ann = ev.get('ann_file')
        if isinstance(ann, str) and ann and '://' not in ann and not osp.exists(ann):
            raise DatasetLayoutError(
                f"{ev_key}: the evaluator's ann_file {ann!r} not found (looked in "
                f'{osp.abspath(ann)!r}); set it with --cfg-options {ev_key}.ann_file=FILE '
                '(it does not follow a new data_root: it was joined to the old one when the '
                'config was read).'
            )
        if isinstance(ann, str) and ann and '://' not in ann:
            _check_evaluator_file(cfg, ev_key, ann)


def _check_evaluator_file(cfg: Mapping, ev_key: str, ann: str) -> None:
    """An evaluator's ``ann_file`` (mmdet's ``CocoMetric`` scores against its own file)
    that is not the annotation file of its split's dataset and lists other images: the
    dataset moved (``--cfg-options test_dataloader.dataset.data_root=NEW``) and the
    evaluator did not (its path was joined to the old data_root when the config was
    read), so the predictions on the new images were scored against the old ground truth
    (wrong metrics, no word), or failed in pycocotools (``Results do not correspond to
    current coco set``). A copy of the file, or one listing the same images, passes.

    Raises:
        DatasetLayoutError: naming both files and the option to set.
    """
    split = ev_key.split('_')[0]
    files = {
        _join(ds.get('data_root') or '', ds['ann_file']): key
        for _, key, ds, _ in _nodes(cfg, (split,))
        if isinstance(ds.get('ann_file'), str) and ds['ann_file'].endswith('.json')
    }
    if len(files) != 1:
        return  # no COCO file, or several (a ConcatDataset): nothing to pair
    ((path, key),) = files.items()
    if '://' in path or not osp.isfile(path) or not osp.isfile(ann) or osp.samefile(path, ann):
        return
    if _image_names(path) == _image_names(ann):
        return
    raise DatasetLayoutError(
        f'{ev_key}.ann_file={ann!r} is not the annotation file of {key} ({path!r}) and '
        'lists other images: the evaluator scores the predictions against its own file, so '
        "the metrics would be of another set's ground truth (a new data_root does not move "
        f'the evaluator: its path was joined to the old one when the config was read). '
        f'Set it with --cfg-options {ev_key}.ann_file={path}'
    )


def _image_names(path: str) -> set:
    """The ``file_name`` of every image a COCO file lists.

    Raises:
        DatasetLayoutError: the file is no COCO JSON (:func:`read_coco_json`).
    """
    data = read_coco_json(path)
    return {im.get('file_name') for im in data.get('images') or [] if isinstance(im, Mapping)}


def read_coco_json(path: str) -> Dict[str, Any]:
    """A COCO-format annotation file as a dict.

    Raises:
        DatasetLayoutError: the file is no JSON (a truncated download: ``json``'s
            position of the error), not UTF-8, or not a JSON object.
    """
    import json

    try:
        with open(path, encoding='utf-8') as f:
            data = json.load(f)
    except json.JSONDecodeError as err:
        raise DatasetLayoutError(
            f'{path!r} is no valid JSON ({err.msg} at line {err.lineno}, column '
            f'{err.colno}): a truncated or damaged COCO annotation file? Download or '
            'write it again'
        ) from None
    except UnicodeDecodeError as err:
        raise DatasetLayoutError(
            f'{path!r} is not UTF-8 text ({err.reason} at byte {err.start}): no COCO '
            'annotation file'
        ) from None
    if not isinstance(data, dict):
        raise DatasetLayoutError(
            f'{path!r} holds a JSON {type(data).__name__}, not the object of a COCO '
            "annotation file ('images', 'annotations', 'categories')"
        )
    return data


def check_output_outside_data(
    out: str, cfg: Mapping, splits: Sequence[str], option: str = '--out'
) -> None:
    """Refuse an output folder that is one of the dataset's image or annotation folders
    (``data_root`` + ``data_prefix``), or below one: mmseg's ``IoUMetric`` writes
    ``<out>/<image name>.png``, the name of an ADE20K annotation and of a Cityscapes
    image, so such a folder had its ground truth overwritten without a word (the next
    test then scored 100 %).

    Raises:
        lookhere_dense.errors.ConfigError: naming the option, the folder and the dataset key.
    """
    for _, key, ds, _ in _nodes(cfg, splits):
        root = ds.get('data_root') or ''
        if '://' in root:
            continue
        folders = [
            (f'{key}.data_prefix.{name}', _join(root, sub))
            for name, sub in (ds.get('data_prefix') or {}).items()
            if isinstance(sub, str) and sub and '://' not in sub
        ]
        for what, folder in folders:
            if path_inside(out, [folder]):
                raise ConfigError(
                    f'{option} {out!r} is a folder of the dataset ({what}: {folder!r}); the '
                    "predictions are written as '<image name>.png', which would overwrite its "
                    'annotations or images: choose a folder outside the dataset'
                )


def _loss_heads(cfg: Mapping) -> List[Tuple[str, Mapping]]:
    """``(config key, head config)`` of every head whose loss reads the label maps: the
    decode head (one, or a list in mmseg's ``CascadeEncoderDecoder``) and the auxiliary
    head(s), of ``model`` or of the segmentor a test-time-augmentation model wraps
    (``model.module``)."""
    model = cfg.get('model') or {}
    prefix = 'model'
    if 'decode_head' not in model and isinstance(model.get('module'), Mapping):
        model, prefix = model['module'], 'model.module'
    heads = []
    for name in ('decode_head', 'auxiliary_head'):
        node = model.get(name)
        if isinstance(node, Mapping):
            heads.append((f'{prefix}.{name}', node))
        elif isinstance(node, (list, tuple)):
            heads += [
                (f'{prefix}.{name}.{i}', h) for i, h in enumerate(node) if isinstance(h, Mapping)
            ]
    return heads


def _head_ignore_index(key: str, head: Mapping) -> Tuple[int, str, str]:
    """``(value, config key, how)`` of the label value a head's loss ignores: its
    ``ignore_index`` (``how``: ``''``), else the default of its class (mmseg's
    ``BaseDecodeHead``: 255; ``how``: ``"<class>'s default"``)."""
    value = head.get('ignore_index')
    if isinstance(value, int) and not isinstance(value, bool):
        return value, f'{key}.ignore_index', ''
    from ..config_checks import model_registry

    typ = head.get('type')
    try:
        cls = typ if isinstance(typ, type) else model_registry('mmseg').get(type_name(head))
    except Exception:  # noqa: BLE001 - an unknown type: the model checks name it
        cls = None
    default = _class_default(cls, 'ignore_index')[0] if isinstance(cls, type) else None
    if not isinstance(default, int) or isinstance(default, bool):
        default = 255
    name = cls.__name__ if isinstance(cls, type) else 'the head'
    return default, f'{key}.ignore_index', f"{name}'s default"


def loss_ignore_index(cfg: Mapping) -> Optional[Tuple[int, str, str]]:
    """The label value the segmentation loss ignores, which the label checks allow beside
    the classes: ``(value, config key, how)`` (``how``: ``''``, or ``"<class>'s default"``
    where the key is not set), or None for a config without a decode head.

    mmseg hands ``model.decode_head.ignore_index`` (default 255) to the loss
    (``BaseDecodeHead.loss_by_feat``); a dataset's ``ignore_index`` is stored but read by
    neither the loss nor ``IoUMetric``, so where the two disagree the head's counts: a
    value only the dataset names ignored is a class index to the loss (out of range: a
    CUDA device-side assert; in range: trained as that class), and is refused.

    Raises:
        ConfigError: heads (decode and auxiliary) whose losses ignore different values:
            they read the same label maps, so a value one ignores is a class to another.
    """
    values = [_head_ignore_index(key, head) for key, head in _loss_heads(cfg)]
    if not values:
        return None
    if len({v for v, _, _ in values}) > 1:
        said = ', '.join(f'{k}={v}' + (f' ({how})' if how else '') for v, k, how in values)
        raise ConfigError(
            f"the heads ignore different label values ({said}): every head's loss reads the "
            'same label maps, so a value one ignores is a class index to another (out of '
            'range: the loss fails; in range: trained as that class). Set their ignore_index '
            'alike'
        )
    return values[0]


def sync_label_checks(cfg: Mapping, splits: Sequence[str]) -> List[str]:
    """Set the ``num_classes`` of every ``CheckSegLabels`` in the pipelines of ``splits``
    to the decode head's, where they differ (``--cfg-options
    model.decode_head.num_classes=30`` left the config's ``CheckSegLabels(num_classes=150)``
    behind: labels 30-149 passed it and training died in the loss with ``IndexError:
    Target 39 is out of bounds``; 171 classes had label 160 refused as "outside the 150
    classes of the model"), and its ``ignore_index`` to the value the loss ignores
    (:func:`loss_ignore_index`: ``model.decode_head.ignore_index=100`` left
    ``CheckSegLabels`` refusing 100; ``CheckSegLabels(ignore_index=100)`` under a head that
    ignores 255 passed the value 100 on to the loss); returns a note per change. Heads
    that ignore different values leave ``ignore_index`` as it is (the data check refuses
    them).
    """
    head = (cfg.get('model') or {}).get('decode_head') or {}
    n = head.get('num_classes') if isinstance(head, Mapping) else None
    if not isinstance(n, int) or isinstance(n, bool):
        n = None
    try:
        ignore = loss_ignore_index(cfg)
    except ConfigError:
        ignore = None
    notes = []
    for _, key, ds, _ in _nodes(cfg, splits):
        for i, step in enumerate(ds.get('pipeline') or []):
            if not isinstance(step, Mapping) or type_name(step) != 'CheckSegLabels':
                continue
            had = step.get('num_classes')
            if n is not None and had != n:
                step['num_classes'] = n
                notes.append(
                    f'{key}.pipeline[{i}] CheckSegLabels: num_classes={n}, the decode '
                    f"head's (the config wrote {had})"
                )
            had = step.get('ignore_index', 255)  # CheckSegLabels' default
            if ignore is not None and had != ignore[0]:
                value, source, how = ignore
                step['ignore_index'] = value
                notes.append(
                    f'{key}.pipeline[{i}] CheckSegLabels: ignore_index={value}, the value the '
                    f'loss ignores ({source}' + (f', {how}' if how else '') + f'; the config '
                    f'wrote {had})'
                )
    return notes


def check_coco_annotations(
    cfg: Mapping, splits: Sequence[str] = ('train', 'val', 'test')
) -> Dict[str, Tuple[int, int]]:
    """Check the COCO-format annotation files of the dataloaders of ``splits`` (mmdet's
    ``CocoDataset`` and its subclasses: an ``ann_file`` ending in ``.json``) before
    anything is built, where mmdet says nothing or fails late:

    * every class the dataset trains on (``metainfo.classes``, else the type's 80 COCO
      classes) must be a category name of the file: mmdet keeps the annotations of the
      matching names only, so a file of other names trained on nothing (an empty dataset:
      ``need at least one array to concatenate``) and a misspelt name (``Triangle`` for
      ``triangle``) dropped that class's annotations without a word;
    * the classes must be listed in the file's category order: mmdet numbers the labels
      in the file's order, whatever the order of ``metainfo.classes``, whose names then
      go to other classes (visualisations, per-class scores);
    * every image the file lists must exist (mmdet reads it when it comes up in training,
      hours in on a real dataset).
    * every annotation's ``category_id`` must be a category's ``id`` (mmdet drops the others
      without a word), and a training file must hold an annotation of the classes (an
      evaluation file without one is warned about: every metric -1)
      (:func:`_usable_annotations`).
    * the images' sizes on disk (headers of up to 64, spread over the list) must be the
      file's ``width`` / ``height``: images resized or rotated after the file was written
      had every box in the wrong place (:func:`_check_coco_image_sizes`).

    Reads each file once (``json.load``: seconds for COCO's 450 MB train file).

    Returns:
        ``{dataloader: (images, annotations of the dataset's classes)}`` of the checked
        files.

    Raises:
        DatasetLayoutError: naming the file, the classes it lacks (with the file's close
            names) and the option to set, the first missing image and how many are
            missing, or the first image of another size than the file says.
    """

    from ..config_checks import dataset_class_names
    from ..validation import close_names

    default_scope = cfg.get('default_scope') or 'mmseg'
    counts: Dict[str, Tuple[int, int]] = {}
    done = set()
    for where, key, ds, wrappers in _nodes(cfg, splits):
        root = ds.get('data_root') or ''
        ann = ds.get('ann_file') or ''
        path = _join(root, ann) if ann else ''
        if not path.endswith('.json') or '://' in path or path in done:
            continue
        scope = _scope(ds, default_scope)
        if scope != 'mmdet' or not osp.isfile(path):
            continue
        done.add(path)
        prefixes = ds.get('data_prefix') or {}
        if 'img' not in prefixes:  # mmdet's COCO datasets read data_prefix['img']: KeyError
            raise DatasetLayoutError(
                f"{where}: data_prefix={dict(prefixes)!r} has no 'img': mmdet's "
                f'{type_name(ds)} reads its images from data_prefix.img (img_path and '
                "seg_map_path are mmseg's names); set it with --cfg-options "
                f'{key}.data_prefix.img=FOLDER' + _where_note(key, ds, wrappers)
            )
        data = read_coco_json(path)
        names = [c.get('name') for c in data.get('categories') or []]
        classes, _ = dataset_class_names(ds, scope, key)
        missing = [c for c in classes or () if c not in names]
        if missing:
            near = {c: close_names(c, names, 1) for c in missing}
            said = ', '.join(
                f'{c!r}' + (f' (the file has {near[c][0]!r})' if near[c] else '') for c in missing
            )
            raise DatasetLayoutError(
                f'{where}: {len(missing)} of the {len(classes)} classes the dataset trains on '
                f'are no category of {path!r}: {said}; mmdet keeps only the annotations of '
                "matching names, so those classes would have none. The file's categories: "
                f"{names}. Set the classes to the file's names with --cfg-options "
                f'"{key}.metainfo.classes=(...)"' + _where_note(key, ds, wrappers) + ' (and the '
                "heads' num_classes to their number), or fix the file."
            )
        in_file_order = [n for n in names if n in set(classes or ())]
        if classes and len(set(in_file_order)) < len(in_file_order):
            _check_repeated_categories(where, path, data, classes)
            in_file_order = list(dict.fromkeys(in_file_order))  # first of each name
        if classes and in_file_order != list(classes) and len(set(in_file_order)) == len(classes):
            raise DatasetLayoutError(
                f'{where}: the classes {tuple(classes)} are listed in another order than the '
                f'categories of {path!r} {tuple(in_file_order)}: mmdet numbers the labels in '
                "the file's order (pycocotools' getCatIds), so class k would be shown and "
                "scored under the name of another. List them in the file's order: "
                f'--cfg-options "{key}.metainfo.classes={tuple(in_file_order)!r}"'
                + _where_note(key, ds, wrappers)
                + ' (and every other dataloader alike).'
            )
        prefix = prefixes['img'] or ''
        folder = _join(root, prefix) if prefix else root
        images = [im.get('file_name') for im in data.get('images') or []]
        unnamed = [i for i, n in enumerate(images) if not isinstance(n, str) or not n.strip()]
        if unnamed:
            first = (data.get('images') or [])[unnamed[0]]
            ident = first.get('id') if isinstance(first, Mapping) else None
            raise DatasetLayoutError(
                f'{where}: {len(unnamed)} of the {len(images)} images {path!r} lists have no '
                f'file_name, e.g. images[{unnamed[0]}]'
                + (f' (id {ident})' if ident is not None else '')
                + ": mmdet stops on it (KeyError: 'file_name'). Give every image "
                'entry the file name of its image, relative to data_prefix.img.'
            )
        absent = [n for n in images if n and not osp.isfile(osp.join(folder, n))]
        if absent:
            raise DatasetLayoutError(
                f'{where}: {len(absent)} of the {len(images)} images {path!r} lists are not '
                f'in {folder!r}, e.g. {osp.join(folder, absent[0])!r} (data_root={root!r}, '
                f'data_prefix.img={prefix!r}; set with --cfg-options {key}.data_root=PATH '
                f'or {key}.data_prefix.img=FOLDER' + _where_note(key, ds, wrappers) + ').'
            )
        _check_coco_image_sizes(where, path, folder, data, _orientation_applied(ds))
        counts[where] = (len(images), _usable_annotations(cfg, where, ds, path, data, classes))
    return counts


def _check_repeated_categories(
    where: str, path: str, data: Mapping, classes: Sequence[str]
) -> None:
    """A COCO file whose ``categories`` name one of the dataset's classes more than once.
    mmdet maps every category of a class's name to a label, in the file's order
    (``getCatIds``): the second id of a name gets a label past the classes, which the
    heads take as background -- its annotations are dropped without a word. Refused where
    annotations use such a repeated id; a repeated category no annotation uses is a
    :class:`DataCheckWarning` (nothing is lost; mmdet trains as if it were absent).

    Raises:
        DatasetLayoutError: naming the name, its ids and how many annotations use the
            repeats.
    """
    ids: Dict[str, List[Any]] = {}
    for cat in data.get('categories') or []:
        if isinstance(cat, Mapping) and cat.get('name') in set(classes):
            ids.setdefault(cat['name'], []).append(cat.get('id'))
    repeated = {name: got for name, got in ids.items() if len(got) > 1}
    extra = {i for got in repeated.values() for i in got[1:]}
    used = sum(
        1
        for a in data.get('annotations') or []
        if isinstance(a, Mapping) and a.get('category_id') in extra
    )
    said = ', '.join(f'{name!r} (ids {got})' for name, got in repeated.items())
    msg = (
        f'{where}: {path!r} lists the categories {said} more than once; mmdet labels only '
        'the first id of a name as its class, later ones get a label past the classes '
        '(background to the heads)'
    )
    if used:
        raise DatasetLayoutError(
            f'{msg}: {used} annotations use a repeated id and would be dropped without a '
            'word. Give each category one id (and its annotations that id), or give the '
            'categories distinct names and list them in metainfo.classes.'
        )
    warnings.warn(
        DataCheckWarning(f'{msg}; no annotation uses the repeats, so nothing is lost'),
        stacklevel=3,
    )


def _check_coco_image_sizes(
    where: str, path: str, folder: str, data: Mapping, orientation: bool, max_images: int = 64
) -> None:
    """The size on disk (header only; after the EXIF orientation where the pipeline's
    loader applies it, :func:`_orientation_applied`) of up to ``max_images`` of the images
    the COCO file ``data`` lists, spread over the list, against their ``width`` /
    ``height`` in the file. Entries without them, and headers that cannot be read, are
    passed.

    Raises:
        DatasetLayoutError: images resized, rotated or replaced on disk after the file was
            written: mmdet loads them at their size on disk and keeps the boxes and masks
            in the file's coordinates, so every one lands in the wrong place.
    """
    if '://' in folder:
        return
    sized = [
        im
        for im in data.get('images') or []
        if isinstance(im, Mapping)
        and isinstance(im.get('file_name'), str)
        and im['file_name']
        and is_number(im.get('width'))
        and is_number(im.get('height'))
    ]
    wrong = []
    checked = 0
    for i in _spread(len(sized), max_images):
        im = sized[i]
        try:
            h, w = image_size(osp.join(folder, im['file_name']), orientation)
        except Exception:  # unreadable: the image checks' business
            continue
        checked += 1
        if (w, h) != (im['width'], im['height']):
            wrong.append((im['file_name'], (w, h), (im['width'], im['height'])))
    if not wrong:
        return
    name, (w, h), (fw, fh) = wrong[0]
    full = osp.join(folder, name)
    turned = orientation and image_size(full) != (h, w)  # its header, read a moment ago
    raise DatasetLayoutError(
        f'{where}: {len(wrong)} of {checked} images checked (of the {len(sized)} with a '
        f'width/height {path!r} lists) have another size on disk than the file says, e.g. '
        f'{full!r}: {w}x{h} on disk{" after its EXIF orientation" if turned else ""}, '
        f'{fw}x{fh} (width x height) in the file. mmdet loads an image at its size on disk '
        "but keeps its boxes and masks in the file's coordinates, so they would land in the "
        'wrong place without a word. Export the annotations again at the new sizes, or '
        'restore the original images.'
    )


def _usable_annotations(
    cfg: Mapping,
    where: str,
    ds: Mapping,
    path: str,
    data: Mapping,
    classes: Optional[Sequence[str]],
) -> int:
    """How many annotations of the COCO file ``data`` mmdet keeps for ``classes`` (None:
    every category of the file).

    Raises:
        DatasetLayoutError: annotations whose ``category_id`` is no category's ``id`` in
            the file (mmdet drops them without a word: a 0-based / 1-based shift dropped a
            class and moved the others), or a training file without one annotation of
            the classes whose dataset filters images without one out
            (``filter_cfg.filter_empty_gt``: mmdet stops late, on ``need at least one
            array to concatenate``; with ``filter_empty_gt=False`` the images train
            without boxes, as the unlabelled part of a semi-supervised set: passed).
    """
    categories = [c for c in data.get('categories') or [] if isinstance(c, Mapping)]
    ids = {c.get('id') for c in categories}
    anns = [a for a in data.get('annotations') or [] if isinstance(a, Mapping)]
    unknown = sorted({a.get('category_id') for a in anns} - ids, key=repr)
    if unknown:
        n = sum(1 for a in anns if a.get('category_id') not in ids)
        raise DatasetLayoutError(
            f'{where}: {n} of the {len(anns)} annotations of {path!r} have a category_id that '
            f"is no category's id in the file ({unknown[:5]}"
            f"{' ...' if len(unknown) > 5 else ''}; the categories' ids: "
            f'{sorted(ids, key=repr)}): mmdet drops them without a word. Number their '
            "category_id as the categories' id (ids shifted by one?), or fix the categories."
        )
    kept = {c.get('id') for c in categories if classes is None or c.get('name') in classes}
    usable = sum(1 for a in anns if a.get('category_id') in kept)
    filters = bool((ds.get('filter_cfg') or {}).get('filter_empty_gt', False))
    if usable == 0 and where.startswith('train') and filters and not ds.get('test_mode'):
        raise DatasetLayoutError(
            f'{where}: {path!r} holds no annotation of the classes the dataset trains on '
            f'({len(anns)} annotations in all): mmdet leaves out images without one '
            '(filter_cfg.filter_empty_gt=True), so nothing would train (mmengine stops on '
            "'need at least one array to concatenate'). Give a file with annotations (an "
            'unlabelled part of a semi-supervised set: filter_empty_gt=False).'
        )
    if usable == 0 and not where.startswith('train'):
        split = where.split('_')[0]
        evaluators = [e for k, e in _evaluators(cfg) if k.split('_')[0] == split]
        if not any(e.get('format_only') for e in evaluators):
            warnings.warn(
                DataCheckWarning(
                    f"{where}: {path!r} holds no annotation of the dataset's classes: every "
                    f'metric would be -1. For a file without annotations (COCO test-dev) set '
                    f'{split}_evaluator.format_only=True (and outfile_prefix) to write the '
                    'predictions instead'
                ),
                stacklevel=2,
            )
    return usable


# ----------------------------------------------------------------------------------------
# Labels
# ----------------------------------------------------------------------------------------
def _build_seg_dataset(ds_cfg: Mapping):
    from mmseg.registry import DATASETS

    cfg = dict(ds_cfg)
    cfg['lazy_init'] = True
    cfg['pipeline'] = []
    cfg['serialize_data'] = False  # mmengine cannot serialize an empty list of images
    return DATASETS.build(cfg)


def image_size(
    path: str, apply_orientation: bool = False, decode: bool = False
) -> Tuple[int, int]:
    """``(H, W)`` of an image file, read from its header (PIL; nothing is decoded unless
    ``decode``).

    Args:
        path: the file.
        apply_orientation: the size after the EXIF orientation is applied (rotated by 90
            degrees for orientations 5-8), as mmcv's image loaders do with their default
            ``color_type='color'``. Default: False.
        decode: also decode the pixels (finds truncated files). Default: False.

    Raises:
        OSError / PIL's errors: the file is no readable image.
    """
    from PIL import Image

    with Image.open(path) as im:
        width, height = im.size
        if decode:
            im.load()
        if apply_orientation and im.getexif().get(0x0112, 1) in (5, 6, 7, 8):
            # Pillow gives some formats' size turned already (a TIFF's): turn the stored one
            tags = getattr(im, 'tag_v2', None)
            stored = (tags.get(256), tags.get(257)) if tags is not None else None
            if stored is None or None in stored or stored == (width, height):
                width, height = height, width
    return int(height), int(width)


def _orientation_applied(ds_cfg: Mapping) -> bool:
    """Whether the pipeline's image loader applies EXIF orientation (mmcv: ``color_type``
    ``'color'`` / ``'grayscale'``, the default, does with its ``cv2`` and ``pillow``
    decoders; ``'unchanged'``, ``'*_ignore_orientation'`` and the ``turbojpeg`` and
    ``tifffile`` decoders (``imdecode_backend``) do not)."""
    for t in ds_cfg.get('pipeline') or []:
        if str(t.get('type', '')).endswith('LoadImageFromFile'):
            if str(t.get('imdecode_backend', 'cv2')) in ('turbojpeg', 'tifffile'):
                return False
            color = str(t.get('color_type', 'color'))
            return color in ('color', 'grayscale')
    return True


def _check_pair_sizes(
    where: str, infos: Sequence[Mapping], orientation: bool, max_files: int
) -> None:
    """Image vs annotation size (headers only) of up to ``max_files`` pairs."""
    wrong = []
    for i in _spread(len(infos), max_files):
        img, seg = infos[i]['img_path'], infos[i]['seg_map_path']
        if '://' in img or '://' in seg:
            continue
        try:
            img_hw = image_size(img, orientation)
        except Exception as err:
            raise unreadable_file(where, 'image', img, err) from None
        try:
            seg_hw = image_size(seg)
        except Exception as err:
            raise unreadable_file(where, 'annotation', seg, err) from None
        if img_hw != seg_hw:
            wrong.append((img, img_hw, seg, seg_hw))
    if wrong:
        raise LabelSizeError(size_message(where, *wrong[0], more=len(wrong) - 1))


def _num_classes(cfg: Mapping, dataset) -> int:
    head = (cfg.get('model') or {}).get('decode_head') or {}
    if isinstance(head, Mapping) and isinstance(head.get('num_classes'), int):
        return head['num_classes']
    return len(dataset.metainfo['classes'])


def _spread(n: int, k: int) -> List[int]:
    """``k`` indexes spread evenly over ``range(n)``."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)}) if k > 1 else [0]


_JPEG = ('.jpg', '.jpeg')
#: file endings an image mmseg does not read for its suffix may have
_IMAGE_EXTS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def _same_format(name: str, suffix: str) -> bool:
    """``name``'s ending is ``suffix``'s format spelt otherwise (``.JPG``, ``.jpeg`` for
    ``'.jpg'``; ``_leftImg8bit.PNG`` for ``'_leftImg8bit.png'``)."""
    name, suffix = name.lower(), suffix.lower()
    if name.endswith(suffix):
        return True
    stem, _, ext = suffix.rpartition('.')  # not osp.splitext: it keeps '.jpg' whole
    return '.' + ext in _JPEG and any(name.endswith(stem + e) for e in _JPEG)


def _unread_images(
    dataset: Any, infos: Sequence[Mapping], limit: int = 100000
) -> Tuple[List[str], List[str]]:
    """``(misspelt, other_format)``: images that have an annotation file but that
    ``dataset`` does not read because of their suffix -- mmseg lists images by
    ``img_suffix`` and leaves such pairs out without a word. ``misspelt``: the same format
    spelt otherwise (``.JPG``, ``.jpeg`` for ``'.jpg'``); ``other_format``: saved in
    another format (``x.png`` in a ``.jpg`` dataset, ``x_leftImg8bit.jpg`` in Cityscapes).
    One walk of the annotation folder (at most ``limit`` files); none for split lists
    (``ann_file`` chooses the images on purpose) or remote folders."""
    import os

    seg_dir = dataset.data_prefix.get('seg_map_path', dataset.data_root)
    img_dir = dataset.data_prefix.get('img_path', dataset.data_root)
    suffix, want = dataset.seg_map_suffix, dataset.img_suffix
    if getattr(dataset, 'ann_file', '') or not isinstance(suffix, str):
        return [], []
    if not isinstance(want, str) or not img_dir or not seg_dir:
        return [], []
    if '://' in str(seg_dir) or '://' in str(img_dir) or not osp.isdir(seg_dir):
        return [], []
    read = {osp.normpath(i['seg_map_path']) for i in infos}
    read |= {osp.normpath(i['img_path']) for i in infos}  # images and labels in one folder
    base = want.lower().rpartition('.')[0]  # '_leftimg8bit' of '_leftImg8bit.png', '' of '.jpg'
    listed: Dict[str, Dict[str, List[str]]] = {}  # image folder -> lower-case name -> names

    def images_named(folder: str, stem: str) -> List[str]:
        if folder not in listed:
            names: Dict[str, List[str]] = {}
            for name in os.listdir(folder) if osp.isdir(folder) else ():
                names.setdefault(name.lower(), []).append(name)
            listed[folder] = names
        wanted = (stem + base + e for e in _IMAGE_EXTS)
        return sorted(n for w in wanted for n in listed[folder].get(w, ()))

    misspelt, other, seen = [], [], 0
    for folder, _, names in os.walk(seg_dir):
        for name in names:
            seen += 1
            if seen > limit:
                return sorted(misspelt), sorted(other)
            path = osp.normpath(osp.join(folder, name))
            if not name.endswith(suffix) or path in read:
                continue
            rel = osp.relpath(path, seg_dir)[: -len(suffix)]
            image_folder = osp.join(img_dir, osp.dirname(rel))
            for image in images_named(image_folder, osp.basename(rel).lower()):
                image_path = osp.join(image_folder, image)
                if osp.normpath(image_path) == path or image.endswith(want):
                    continue
                (misspelt if _same_format(image, want) else other).append(image_path)
                break
    return sorted(misspelt), sorted(other)


def _raw_labels(path: str, backend: str = 'pillow', backend_args: Optional[dict] = None) -> Any:
    """The label file's values as stored, decoded as mmseg's ``LoadAnnotations`` with
    ``imdecode_backend=backend`` and ``backend_args`` decodes it (it then casts them to
    uint8 and applies ``reduce_zero_label``). Default: ``'pillow'``, None (its defaults)."""
    import mmcv
    from mmengine import fileio

    data = fileio.get(path, backend_args=backend_args)
    return mmcv.imfrombytes(data, flag='unchanged', backend=backend)


def _class_default(cls: type, name: str) -> Tuple[Any, Optional[type]]:
    """``(default, class)``: the default of argument ``name`` of ``cls``'s constructor (its
    own, or the nearest base class's that names it) and the class that sets it; ``(None,
    None)`` where none does."""
    import inspect

    for klass in cls.__mro__:
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        param = inspect.signature(init).parameters.get(name)
        if param is not None and param.default is not inspect.Parameter.empty:
            return param.default, klass
    return None, None


def _decode_image(where: str, path: str) -> None:
    """Decode the local image ``path`` whole (remote ones are left to the pipeline).

    Raises:
        UnreadableFileError: it cannot be decoded, naming ``where`` and the file.
    """
    if '://' in path:
        return
    try:
        image_size(path, decode=True)
    except Exception as err:
        raise unreadable_file(where, 'image', path, err) from None


def _states_default_for_classes(dataset: Any, owner: Optional[type], num_classes: int) -> bool:
    """Whether ``dataset``'s ``reduce_zero_label`` default (set by ``owner``'s constructor,
    :func:`_class_default`) is stated for the classes it names: the class that names them
    in its own ``METAINFO`` (the first of its type's bases that does) is ``owner`` or a
    base of it, or is a dataset class of mmseg's own other than ``BaseSegDataset``
    (CityscapesDataset: files of a layout mmseg documents, whose default ``False`` it
    inherits); and the dataset names those classes, as many as the model has
    (:func:`_names_own_classes`). Not a user's subclass with a ``METAINFO`` of its own that
    inherits ``BaseSegDataset``'s default: that says nothing about its files."""
    from mmseg.datasets import BaseSegDataset

    namer = next(
        (
            k
            for k in type(dataset).__mro__
            if isinstance(k.__dict__.get('METAINFO'), Mapping)
            and k.__dict__['METAINFO'].get('classes')
        ),
        None,
    )
    if namer is None or owner is None or not _names_own_classes(dataset, namer, num_classes):
        return False
    mmseg_own = namer.__module__.split('.')[0] == 'mmseg' and namer is not BaseSegDataset
    return issubclass(owner, namer) or mmseg_own


def _names_own_classes(dataset: Any, klass: Any, num_classes: int) -> bool:
    """``dataset`` names ``klass``'s own classes (its ``METAINFO``), and the model has as
    many."""
    own = tuple(getattr(klass, 'METAINFO', {}).get('classes') or ())
    names = tuple(dataset.metainfo.get('classes') or ())
    return bool(own) and names == own and num_classes == len(own)


#: Seconds between two ``progress`` lines of :func:`check_label_values`.
PROGRESS_SECONDS = 10.0


def check_label_values(
    cfg: Mapping,
    splits: Sequence[str] = ('train', 'val'),
    max_files: int = 64,
    max_header_files: int = 25000,
    progress: Optional[Callable[[str], None]] = None,
    images_only: Optional[Dict[str, int]] = None,
) -> Dict[str, int]:
    """Check the images and annotations of every segmentation dataloader of ``splits``.

    * every image has its annotation file;
    * image and annotation have the same size (read from the file headers, up to
      ``max_header_files`` pairs spread over the dataset: all of ADE20K and Cityscapes);
    * up to ``max_files`` annotations (spread over the dataset) hold no label value
      outside the model's classes other than the value the loss ignores
      (:func:`loss_ignore_index`: ``model.decode_head.ignore_index``, not the dataset's
      ``ignore_index``, which mmseg does not read), and their images decode;
    * annotations that hold only the ignore index: a :class:`DataCheckWarning` naming
      them, an error when every checked one does;
    * the checked files' stored values fit 8 bits (mmseg casts label maps to uint8) and
      agree with ``reduce_zero_label`` (:func:`~.labels.reduce_zero_label_verdict`:
      Cityscapes-style files with 255 reduced, ADE20K's own files not reduced);
    * images in another format than ``img_suffix`` beside their annotation: a warning;
    * annotations saved as JPEG (lossy: class ids change along region edges): a warning.

    Loads annotations with mmseg's own ``LoadAnnotations`` given the pipeline's
    ``imdecode_backend`` and ``backend_args`` (so the decoder, ``reduce_zero_label`` and
    ``label_map`` apply exactly as in training).

    A validation / test split whose pipeline loads no annotations, under evaluators that
    only write the predictions (``format_only=True``: a test set without labels), has its
    images checked only, and is not counted (:func:`_reads_no_annotations`): ``images_only``,
    where given, gets ``{dataloader: number of images}`` of those. Default: None.

    ``progress`` (e.g. a logger's ``info``), where given, gets a line about every 10 s
    while the files are decoded (``train_dataloader: 1200 of 20210 images and
    annotations decoded``): a check of every file (``max_files`` above the dataset's size)
    takes minutes on ADE20K. Default: None.

    Returns:
        ``{dataloader: number of images}`` of the dataloaders whose annotations were
        checked.

    Raises:
        DatasetLayoutError: no images, or images without annotation files.
        LabelSizeError: an annotation of another size than its image.
        UnreadableFileError: an image or annotation file that cannot be read.
        LabelRangeError: a label value outside ``0..num_classes-1`` / the ignore index,
            every checked annotation holds only the ignore index, a value above 255 in the
            file, or a ``reduce_zero_label`` the files contradict.
        ConfigError: a pipeline that loads no annotations under an evaluator that scores
            against them, a ``LoadAnnotations(reduce_zero_label=...)`` other than its
            dataset's, or heads that ignore different label values.
    """
    from mmseg.datasets import BaseSegDataset
    from mmseg.datasets.transforms import LoadAnnotations

    sizes = {}
    loss_ignore = loss_ignore_index(cfg)
    for where, ds_cfg in _dataloaders(cfg, splits):
        ds = _build_seg_dataset(ds_cfg)
        if not isinstance(ds, BaseSegDataset):
            continue
        ds.full_init()
        n = len(ds)
        img_dir = ds.data_prefix.get('img_path', ds.data_root)
        if n == 0:
            raise DatasetLayoutError(
                f'{where}: no images ending in {ds.img_suffix!r} under {img_dir!r}.'
                + _hint(ds_cfg)
            )
        infos = [ds.get_data_info(i) for i in range(n)]
        if _reads_no_annotations(cfg, where, ds_cfg):
            for i in _spread(n, max_files):
                _decode_image(where, infos[i]['img_path'])
            if images_only is not None:
                images_only[where] = n
            continue
        missing = [i['seg_map_path'] for i in infos if not osp.exists(i['seg_map_path'])]
        if missing:
            raise DatasetLayoutError(
                f'{where}: {len(missing)} of {n} images have no annotation file, e.g. '
                f'{missing[0]!r} (annotations must end in {ds.seg_map_suffix!r}, same '
                f'name and sub-folders as the image).' + _hint(ds_cfg)
            )
        key = next(k for w, k, d, _ in _nodes(cfg, splits) if d is ds_cfg)
        lossy = [i['seg_map_path'] for i in infos if i['seg_map_path'].lower().endswith(_JPEG)]
        if lossy:
            warnings.warn(
                DataCheckWarning(
                    f'{where}: {len(lossy)} of {n} annotations are JPEG files, e.g. '
                    f'{lossy[0]!r} ({key}.seg_map_suffix={ds.seg_map_suffix!r}): JPEG is '
                    'lossy, so class ids along region edges are not the ones labelled (a '
                    'neighbouring id, or one of no region), and mmseg trains and scores on '
                    'them as they are: export the labels again as PNG'
                ),
                stacklevel=2,
            )
        unread, other = _unread_images(ds, infos)
        if other:
            warnings.warn(
                DataCheckWarning(
                    f'{where}: {len(other)} image(s) with an annotation are not read because '
                    f'they are saved in another format than img_suffix={ds.img_suffix!r}, '
                    f'e.g. {other[0]!r} (mmseg leaves them out without a word): convert '
                    f'them (the run uses the {n} images that are read)'
                ),
                stacklevel=2,
            )
        if unread:
            warnings.warn(
                DataCheckWarning(
                    f'{where}: {len(unread)} image(s) with an annotation are not read because '
                    f'their names do not end in img_suffix={ds.img_suffix!r}, e.g. '
                    f'{unread[0]!r}: rename them, or set {key}.img_suffix (training uses the '
                    f'{n} others)'
                ),
                stacklevel=2,
            )
        _check_pair_sizes(where, infos, _orientation_applied(ds_cfg), max_header_files)
        num_classes = _num_classes(cfg, ds)
        step = next(
            (
                t
                for t in _annotation_loaders(ds_cfg.get('pipeline'))
                if type_name(t) == 'LoadAnnotations'
            ),
            {},
        )
        reduce = step.get('reduce_zero_label')
        if reduce is not None and bool(reduce) != bool(ds.reduce_zero_label):
            raise ConfigError(
                f"{key}.pipeline's LoadAnnotations has reduce_zero_label={reduce!r}, but "
                f"{key}.reduce_zero_label={ds.reduce_zero_label!r}: mmseg's LoadAnnotations "
                "stops on the first annotation (an AssertionError). Set the dataset's "
                'reduce_zero_label and drop it from LoadAnnotations (which then follows it)'
            )
        backend = step.get('imdecode_backend') or 'pillow'
        backend_args = step.get('backend_args')
        loader = LoadAnnotations(imdecode_backend=backend, backend_args=backend_args)
        if loss_ignore is not None:
            ignore_index, ignore_key, how = loss_ignore
        else:  # no decode head in the config: the dataset's
            ignore_index, ignore_key = int(ds.ignore_index), f'{key}.ignore_index'
            how = '' if 'ignore_index' in ds_cfg else "mmseg's default"
        sample = _spread(n, max_files)
        ignored = []
        with_zero = with_255 = 0
        raw_top = -1  # the largest raw value other than 255
        shown = time.monotonic()
        for done, i in enumerate(sample):
            if progress is not None and time.monotonic() - shown > PROGRESS_SECONDS:
                progress(f'{where}: {done} of {len(sample)} images and annotations decoded')
                shown = time.monotonic()
            info = infos[i]
            _decode_image(where, info['img_path'])
            try:
                seg = loader(dict(info))['gt_seg_map']
                raw = _raw_labels(info['seg_map_path'], backend, backend_args)
            except Exception as err:
                raise unreadable_file(where, 'annotation', info['seg_map_path'], err) from None
            values = label_values(raw)  # the stored values, sorted
            # mmseg casts to uint8: v > 255 trains as v % 256; the type's largest value
            # (65535) is the one 16-bit ignore value that stays ignored (255) as meant
            wider = raw.dtype.kind in 'iu' and raw.dtype.itemsize > 1
            top = np.iinfo(raw.dtype).max if wider else None
            wide = [int(v) for v in values if v > 255 and v != top] if wider else []
            if wide:
                raise LabelRangeError(
                    wide_labels_message(where, info['seg_map_path'], raw.dtype, wide[-1])
                )
            with_zero += 0 in values
            with_255 += 255 in values
            raw_top = max([raw_top, *(int(v) for v in values if v < 255)])
            if seg.ndim != 2:
                msg = channels_message(where, info['seg_map_path'], seg.shape)
                if backend != 'pillow' and _raw_labels(info['seg_map_path']).ndim == 2:
                    msg = (  # a palette PNG: pillow reads its indices, cv2 its colours
                        f'{where}: annotation {info["seg_map_path"]!r} is a palette PNG of '
                        f"class ids, which {key}.pipeline's LoadAnnotations(imdecode_backend="
                        f'{backend!r}) decodes to its colours (shape {tuple(seg.shape)}): drop '
                        "imdecode_backend (mmseg's default 'pillow' reads the ids), or save "
                        'the ids as a greyscale PNG'
                    )
                raise LabelRangeError(msg)
            bad = bad_label_values(seg, num_classes, ignore_index)
            if bad:
                msg = label_message(
                    info['seg_map_path'],
                    bad,
                    num_classes,
                    ignore_index,
                    ds.reduce_zero_label,
                    f'default of {ignore_key}' if how else ignore_key,
                )
                theirs = int(ds.ignore_index)
                if 'ignore_index' in ds_cfg and theirs != ignore_index and theirs in bad:
                    msg += (
                        f' {key}.ignore_index={theirs} is read by neither the loss nor the '
                        f'metric in mmseg: to ignore {theirs}, set {ignore_key}={theirs} (and '
                        'the ignore_index of CheckSegLabels, RandomCrop and IoUMetric, and '
                        'model.data_preprocessor.seg_pad_val, alike).'
                    )
                raise LabelRangeError(msg)
            if seg.size and bool((seg == ignore_index).all()):
                ignored.append(info['seg_map_path'])
        default, owner = _class_default(type(ds), 'reduce_zero_label')
        verdict, is_error = reduce_zero_label_verdict(
            key,
            bool(ds.reduce_zero_label),
            default,
            type(ds).__name__,
            with_zero,
            with_255,
            len(sample),
            raw_top,
            num_classes,
            _names_own_classes(ds, owner, num_classes),
            _states_default_for_classes(ds, owner, num_classes),
        )
        if verdict and is_error:
            raise LabelRangeError(f'{where}: {verdict}.')
        if verdict:
            warnings.warn(DataCheckWarning(f'{where}: {verdict}.'), stacklevel=2)
        if ignored:
            msg = f'{where}: ' + all_ignored_message(ignored, ignore_index, len(sample))
            if len(ignored) == len(sample):
                raise LabelRangeError(msg + ' Nothing to train or evaluate on.')
            warnings.warn(DataCheckWarning(msg), stacklevel=2)
        sizes[where] = n
    return sizes


# ----------------------------------------------------------------------------------------
# Crop size
# ----------------------------------------------------------------------------------------
def _pair(x) -> Tuple[float, float]:
    return (float(x), float(x)) if isinstance(x, (int, float)) else (float(x[0]), float(x[1]))


def _resized(
    h: float, w: float, scale_wh: Tuple[float, float], keep_ratio: bool
) -> Tuple[float, float]:
    """Image size after mmcv's ``Resize`` to ``scale`` (given as ``(w, h)``)."""
    if not keep_ratio:
        return scale_wh[1], scale_wh[0]
    f = min(max(scale_wh) / max(h, w), min(scale_wh) / min(h, w))
    return h * f, w * f


def largest_size_after(t: Mapping, h: float, w: float) -> Tuple[float, float]:
    """The largest size transform ``t`` can give an ``h x w`` image (resizes only; other
    transforms keep the size): ``(H, W)``, unrounded."""
    kind = t.get('type', '')
    typ = (kind if isinstance(kind, str) else getattr(kind, '__name__', '')).split('.')[-1]
    keep = bool(t.get('keep_ratio', False))  # mmcv's default
    if typ in ('RandomResize', 'Resize') and t.get('scale') is not None:
        scale = t['scale']
        one = not isinstance(scale, list) or all(isinstance(v, (int, float)) for v in scale)
        scales = [scale] if one else scale  # [w, h] is one scale, [(w, h), ...] several
        ratio = max(t.get('ratio_range') or (1.0,)) if typ == 'RandomResize' else 1.0
        best = (0.0, 0.0)
        for s in scales:
            sw, sh = _pair(s)
            best = max(
                best, _resized(h, w, (sw * ratio, sh * ratio), keep), key=lambda x: x[0] * x[1]
            )
        return best
    if typ == 'Resize' and t.get('scale_factor') is not None:
        # mmcv: the scale is the image's size times the factor, then resized to it as
        # to any scale (keep_ratio: the largest that fits it)
        fw, fh = _pair(t['scale_factor'])
        return _resized(h, w, (int(w * fw + 0.5), int(h * fh + 0.5)), keep)
    if typ == 'RandomChoiceResize' and t.get('scales'):
        return max(
            (_resized(h, w, _pair(s), keep) for s in t['scales']), key=lambda x: x[0] * x[1]
        )
    return h, w


def size_after(t: Optional[Mapping], hw: Tuple[int, int]) -> Tuple[int, int]:
    """``(H, W)`` an ``hw`` image has after the resize ``t`` (None: its own), rounded as
    mmcv rounds (``int(x + 0.5)``): :func:`largest_size_after` of a test-time resize."""
    if t is None:
        return int(hw[0]), int(hw[1])
    h, w = largest_size_after(t, float(hw[0]), float(hw[1]))
    return int(h + 0.5), int(w + 0.5)


def largest_frame(
    dataset: Any, pipeline: Sequence[Mapping]
) -> Optional[Tuple[Tuple[int, int], Tuple[int, int]]]:
    """The largest frame (by pixels) a test pipeline gives the images of a dataset:
    ``((H, W) after the pipeline's first resize, (H, W) of that image file)``, from the
    files' headers (nothing is decoded: what a memory check needs before the first image
    is resized). None for a dataset that is no mmseg ``BaseSegDataset``, a pipeline with a
    resize it cannot size (``ResizeShortestEdge``, a custom one, test-time augmentation:
    the guard checks those frames when they reach the model) or without local images; a
    file that cannot be read is left to the pipeline, which names it.

    Args:
        dataset: a built dataset (its ``full_init`` is called).
        pipeline: its pipeline as transform dicts (the config's).
    """
    from mmseg.datasets import BaseSegDataset

    from ..evaluation.resize import find_resize, transform_name

    if not isinstance(dataset, BaseSegDataset):
        return None
    pipeline = list(pipeline or [])
    if any(  # size_after reads the first Resize; another resize sizes the frame otherwise
        transform_name(t) != 'Resize'
        and any(w in transform_name(t) for w in ('Resize', 'Rescale', 'TestTimeAug'))
        for t in pipeline
        if isinstance(t, Mapping)
    ):
        return None  # a size this cannot tell (another resize, test-time augmentation)
    dataset.full_init()
    idx = find_resize(pipeline)
    best = None
    for i in range(len(dataset)):
        path = dataset.get_data_info(i).get('img_path')
        if not isinstance(path, str) or '://' in path:
            continue
        try:
            ori = image_size(path, apply_orientation=True)
        except Exception:  # noqa: BLE001 - the pipeline names an unreadable file
            continue
        size = size_after(pipeline[idx] if idx is not None else None, ori)
        if best is None or size[0] * size[1] > best[0][0] * best[0][1]:
            best = (size, ori)
    return best


def check_crop_fits(cfg: Mapping, max_images: int = 8) -> None:
    """Check that the training ``RandomCrop`` fits in the training images, at least at
    the largest size the pipeline's resizes can give them (checks up to
    ``max_images`` images spread over each training dataset).

    A crop larger than the image is legal in mmseg: the crop is the whole image and the
    data preprocessor pads it (label ``seg_pad_val``, ignored). The rule: a crop that
    would be *mostly* padding -- more than half its area -- for a checked image even at
    the largest resize is refused (it would be so at every scale: a configuration
    mistake); a crop that some checked image falls short of by less (a 120x200 image
    under a 128x128 crop: 6% padding) is a :class:`DataCheckWarning`, once per dataset.

    Raises:
        CropSizeError: naming the image, its size, the largest resized size, the crop, the
            share of padding and what to change.
    """
    from PIL import Image

    for where, ds_cfg in _dataloaders(cfg, ['train']):
        pipeline = list(ds_cfg.get('pipeline') or [])
        crops = [t for t in pipeline if str(t.get('type', '')).endswith('RandomCrop')]
        if not crops:
            continue
        ds = _build_seg_dataset(ds_cfg)
        ds.full_init()
        short = []  # (padding share, crop, image, its size, resized size)
        checked = _spread(len(ds), max_images)
        for i in checked:
            path = ds.get_data_info(i)['img_path']
            with Image.open(path) as im:
                w0, h0 = im.size
            h, w = float(h0), float(w0)
            for t in pipeline:
                if str(t.get('type', '')).endswith('RandomCrop'):
                    ch, cw = _pair(t['crop_size'])
                    rh, rw = round(h), round(w)
                    if ch > rh or cw > rw:
                        padding = 1 - min(ch, rh) * min(cw, rw) / (ch * cw)
                        crop = tuple(int(c) for c in (ch, cw))
                        if padding > 0.5:
                            raise CropSizeError(
                                f'{where}: RandomCrop crop_size={crop} is larger than image '
                                f'{path!r} ({h0}x{w0} px), which the pipeline resizes to at '
                                f'most {rh}x{rw}: every crop would be mostly padding '
                                f'({padding:.0%} of its area, more than half). Lower '
                                'crop_size (and model.data_preprocessor.size and '
                                'test_cfg.crop_size with it), or raise the RandomResize / '
                                'Resize scale.'
                            )
                        short.append((padding, crop, path, (h0, w0), (rh, rw)))
                    h, w = min(h, ch), min(w, cw)
                else:
                    h, w = largest_size_after(t, h, w)
        if short:
            padding, crop, path, (h0, w0), (rh, rw) = max(short)
            warnings.warn(
                DataCheckWarning(
                    f'{where}: RandomCrop crop_size={crop} is larger than {len(short)} of '
                    f'the {len(checked)} checked images even at their largest resized size, '
                    f'e.g. {path!r} ({h0}x{w0} px, at most {rh}x{rw}): their crops are '
                    f'padded (up to {padding:.0%} of a crop, ignored by the loss). Fine for '
                    'a few small images; else lower crop_size or raise the resize scale'
                ),
                stacklevel=2,
            )


def crop_padding_note(cfg: Mapping) -> Optional[str]:
    """The warning for a training ``RandomCrop`` smaller than
    ``model.data_preprocessor.size``: the preprocessor pads every crop up to that size
    (labels 255, ignored), so training runs on part padding at the larger size (e.g. the
    crop lowered with ``--cfg-options`` and the size left). None when they fit."""
    preprocessor = (cfg.get('model') or {}).get('data_preprocessor') or {}
    size, pad = preprocessor.get('size'), preprocessor.get('seg_pad_val', 255)
    if size is None:
        return None
    sh, sw = _pair(size)
    for where, ds_cfg in _dataloaders(cfg, ['train']):
        for t in ds_cfg.get('pipeline') or []:
            if not str(t.get('type', '')).endswith('RandomCrop') or 'crop_size' not in t:
                continue
            ch, cw = _pair(t['crop_size'])
            if ch <= sh and cw <= sw and (ch < sh or cw < sw):
                share = 100 * (1 - ch * cw / (sh * sw))
                return (
                    f'{where}: RandomCrop crop_size={(int(ch), int(cw))} is smaller than '
                    f'model.data_preprocessor.size={(int(sh), int(sw))}: every training crop '
                    f'is padded to {int(sh)}x{int(sw)} ({share:.0f}% padding, label {pad}) and '
                    'the model trains at that size. Set model.data_preprocessor.size='
                    f'({int(ch)}, {int(cw)}) too (and model.test_cfg.crop_size for sliding '
                    'inference)'
                )
    return None


def _has_mask_head(cfg: Mapping) -> bool:
    """Whether the config's model has a mask head (``roi_head.mask_head``: Mask R-CNN,
    Cascade Mask R-CNN, ...), whose masks are pasted at the original image size."""
    model = cfg.get('model') or {}
    roi = model.get('roi_head') if isinstance(model, Mapping) else None
    return isinstance(roi, Mapping) and roi.get('mask_head') is not None


def drop_eval_pads(cfg: Mapping, splits: Sequence[str]) -> List[str]:
    """Remove ``Pad`` steps from the mmdet validation / test pipelines of ``splits`` of a
    detector with a mask head, in place; returns one note per removed step. mmdet's
    ViTDet project configs pad every test image to 1024x1024: mmcv's ``Pad`` sets
    ``img_shape`` to the padded size, so the detector clips its boxes to the padded image,
    not the image -- boxes reach into the padding, and Mask R-CNN's mask pasting at the
    original size fails (``upper bound and lower bound inconsistent with step sign`` in
    mmdet's ``_do_paste_mask``: a new-user trial trained, then died at the first
    validation). Without the step the model's data preprocessor pads the batch
    (``pad_size_divisor``), as this project's configs test. Nothing for mmseg configs,
    models without a mask head (RTMDet and YOLOX letterbox-pad their tests by design) and
    pipelines without ``Pad``."""
    if (cfg.get('default_scope') or 'mmseg') != 'mmdet' or not _has_mask_head(cfg):
        return []  # box detectors (RTMDet, YOLOX) letterbox-pad their tests by design
    notes = []
    for where, ds in _dataloaders(cfg, [s for s in splits if s != 'train']):
        pipeline = ds.get('pipeline')
        if not isinstance(pipeline, list):
            continue
        for i in reversed(range(len(pipeline))):
            if isinstance(pipeline[i], Mapping) and type_name(pipeline[i]) == 'Pad':
                del pipeline[i]
                notes.append(
                    f'{where}: pipeline[{i}] Pad removed for this run: it set img_shape to '
                    'the padded size, so the predicted boxes were clipped to the padded image, '
                    "not the image, and Mask R-CNN's mask pasting could fail (mmdet's "
                    '_do_paste_mask: "upper bound and lower bound inconsistent with step '
                    'sign"). The data preprocessor pads the batch (pad_size_divisor); drop '
                    "the Pad from the config to silence this (lookhere-dense's configs have none)"
                )
    return notes


def unpadded_whole_frame_patch(cfg: Mapping) -> Optional[int]:
    """The backbone's patch size where the config evaluates whole images of a ViT without
    padding them to patch multiples in the preprocessor (no
    ``data_preprocessor.test_cfg.size_divisor`` that is a patch multiple, no fixed
    ``size``), else None (sliding windows, other backbones, a fitting divisor)."""
    from ..config_checks import pads_test_frames, self_padding_patch

    model = cfg.get('model') or {}
    patch = self_padding_patch(model)
    if patch is None or (model.get('test_cfg') or {}).get('mode', 'whole') != 'whole':
        return None
    pre = (model.get('data_preprocessor') or {}).get('test_cfg')
    return None if pads_test_frames(pre, patch) else patch


def whole_frame_pad_note(cfg: Mapping, splits: Sequence[str]) -> Optional[str]:
    """The warning for whole-image evaluation of a ViT without ``size_divisor``
    (:func:`unpadded_whole_frame_patch`): the backbone pads a frame whose sides are not
    patch multiples, and mmseg's head stretches the padded grid over the frame
    (predictions up to a patch minus one pixel off at the far edge, 56% of the pixels'
    classes changed in a test). With ``data_preprocessor.test_cfg.size_divisor`` the
    preprocessor pads and the segmentor crops the padding off. None for training-only
    runs and where :func:`unpadded_whole_frame_patch` is None."""
    if not [s for s in splits if s != 'train']:
        return None
    patch = unpadded_whole_frame_patch(cfg)
    if patch is None:
        return None
    return (
        "model.test_cfg mode='whole' without model.data_preprocessor.test_cfg.size_divisor: a "
        f'frame whose sides are not multiples of the {patch}-px patch is padded inside the '
        f'backbone, and the head stretches the padded grid over the frame (predictions up to '
        f'{patch - 1} px off at the far edge). Set model.data_preprocessor.test_cfg='
        f'dict(size_divisor={patch}): the preprocessor pads and the padding is cropped off '
        "the prediction (lookhere-dense's configs do)"
    )


def check_seg_data(
    cfg: Mapping,
    splits: Sequence[str] = ('train', 'val', 'test'),
    max_label_files: int = 64,
    max_header_files: int = 25000,
    progress: Optional[Callable[[str], None]] = None,
    images_only: Optional[Dict[str, int]] = None,
) -> Dict[str, int]:
    """All checks for a segmentation config: layout, images and annotations (sizes,
    readable files, label values), crop size. ``progress``, ``images_only``: see
    :func:`check_label_values`. Default: None.

    Returns:
        ``{dataloader: number of images}`` of the checked segmentation dataloaders.
    """
    check_dataset_layout(cfg, splits)
    sizes = check_label_values(
        cfg, splits, max_label_files, max_header_files, progress, images_only
    )
    if 'train' in splits:
        check_crop_fits(cfg)
    return sizes
