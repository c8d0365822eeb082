"""Segment images at any resolution and write colour overlays (``tools/infer.py``).

By default images go through the config's test resize and the config's inference mode;
``native`` keeps each image's own size, ``short_side`` / ``size`` pick another one (the
one resize rewrite, :mod:`lookhere_dense.evaluation.resize`), and ``whole`` / ``slide``
choose one pass over the whole image or sliding windows of the training crop. Overlays
carry a legend of the classes present (:mod:`lookhere_dense.visualization.legend`).
Segmentation (mmseg) configs only: a detection config is refused by name, with mmdet's
``DetInferencer`` and ``tools/test.py --show-dir`` as what runs it
(:func:`check_segmentation_config`).

Every input is checked before the model is built: a file that is not an image, and one
that the prediction's reader cannot decode (corrupt, or stored in a type it does not read:
a float32 TIFF, named with its type; :func:`read_image` both lists and predicts), is named
before anything is predicted, and so are two outputs that would get one file name
(:func:`output_files`) and a resize flag below one patch of the backbone
(:func:`~lookhere_dense.evaluation.resize.check_resize_sides`). The checkpoint is
loaded strictly (:func:`build_model_from_checkpoint`, also what the test, export and
extrapolation tools build their model with), and every write
is checked (a file that cannot be written is named; nothing is reported as written that
was not).
"""

from __future__ import annotations

import copy
import inspect
import os
import os.path as osp
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..config_checks import check_seg_test_cfg, seg_test_modes
from ..errors import ConfigError, ToolError
from ..evaluation.resize import (
    check_resize_sides,
    exact_resize,
    find_resize,
    short_side_resize,
)

__all__ = [
    'build_model_from_checkpoint',
    'IMAGE_SUFFIXES',
    'read_image',
    'list_images',
    'skipped_files',
    'inference_pipeline',
    'inference_test_cfg',
    'backbone_padding_patch',
    'pad_whole_frames',
    'overlay',
    'class_palette',
    'class_names',
    'output_stems',
    'output_files',
    'check_segmentation_config',
    'saved_label_offset',
    'backbone_patch',
    'Overlays',
    'segment_images',
]

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def build_model_from_checkpoint(
    cfg, checkpoint: str, device: str = 'cpu', checkpoint_num_heads: Optional[int] = None
):
    """Build ``cfg.model`` in its scope, load ``checkpoint`` into it strictly
    (:func:`lookhere_dense.lookhere.loading.load_model_weights`: every key and shape must fit,
    and the LookHere backbone's head count; pretrained-weight settings of the config are
    ignored: the checkpoint has the weights), move it to ``device`` in eval mode.

    Args:
        checkpoint_num_heads: the head count of the checkpoint's LookHere backbone, for
            files that do not record it. Default: None.

    Returns:
        ``(model, dataset_meta)``; ``dataset_meta`` comes from the checkpoint's ``meta``
        (written by the Runner) or None.

    Raises:
        FileNotFoundError: the checkpoint is missing;
        lookhere_dense.errors.CheckpointError: it cannot be read
            (``UnreadableCheckpointError``) or does not fit the model (naming the missing,
            unexpected and wrongly shaped keys, or the head counts).
    """
    from mmengine.registry import init_default_scope

    from ..checkpoint import load_checkpoint_file
    from ..config_checks import model_registry
    from ..engine.terminal import MMSEG_LOSS_WARNINGS
    from ..lookhere.loading import load_model_weights

    ckpt = load_checkpoint_file(checkpoint)  # before the (slow) build: a bad file fails fast
    scope = cfg.get('default_scope') or 'mmseg'
    init_default_scope(scope)
    model_cfg = copy.deepcopy(cfg.model)
    model_cfg.pop('pretrained', None)
    backbone = model_cfg.get('backbone')
    if isinstance(backbone, dict):
        backbone.pop('init_cfg', None)
        backbone.pop('pretrained', None)
    with warnings.catch_warnings():
        for pattern in MMSEG_LOSS_WARNINGS:  # an inference model computes no loss
            warnings.filterwarnings('ignore', message=pattern)
        model = model_registry(scope).build(model_cfg)
    load_model_weights(model, ckpt, source=checkpoint, checkpoint_num_heads=checkpoint_num_heads)
    model.to(device).eval()
    meta = (ckpt.get('meta') or {}).get('dataset_meta')
    return model, meta


def read_image(path: str) -> Optional[np.ndarray]:
    """``path`` decoded as the prediction reads it: 8-bit BGR, as mmcv's
    ``LoadImageFromFile`` (OpenCV's ``IMREAD_COLOR``) loads it for the model; None where
    that reader cannot decode it. :func:`list_images` checks every input with it, so an
    image it cannot read is named before anything is predicted."""
    import cv2

    try:
        return cv2.imread(path, cv2.IMREAD_COLOR)
    except cv2.error:
        return None


#: the format names of the image suffixes, for messages
_FORMATS = {'.jpg': 'JPEG', '.jpeg': 'JPEG', '.tif': 'TIFF', '.tiff': 'TIFF'}


def _undecodable(path: str) -> Optional[str]:
    """Why :func:`read_image` cannot decode ``path``, where OpenCV reads it unconverted:
    what it holds (a float32 3-channel TIFF: OpenCV reads only 8- and 16-bit integer
    samples as colour images) and what to do; None where OpenCV cannot decode it at all
    (corrupt, or not an image)."""
    import cv2

    try:
        raw = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    except cv2.error:
        raw = None
    if not isinstance(raw, np.ndarray) or raw.size == 0:
        return None
    suffix = osp.splitext(path)[1].lower()
    fmt = _FORMATS.get(suffix, suffix.lstrip('.').upper())
    channels = 1 if raw.ndim == 2 else raw.shape[2]
    article = 'an' if str(raw.dtype).startswith('int') else 'a'
    return (
        f'cannot read the image {path!r} as a colour image: it is {article} {raw.dtype} '
        f'{channels}-channel {fmt} ({raw.shape[0]}x{raw.shape[1]} px), and the model reads '
        "8- or 16-bit integer images only (OpenCV's IMREAD_COLOR, as mmcv's "
        'LoadImageFromFile): convert it to 8- or 16-bit'
    )


def list_images(path: str) -> List[str]:
    """``path`` itself, or the images in the folder ``path`` (sorted, not recursive), each
    decoded once with the prediction's reader (:func:`read_image`), so that none fails
    after other images were predicted.

    Raises:
        FileNotFoundError: ``path`` does not exist, is a file that is not an image (or one
            OpenCV cannot decode at all), is a folder that holds no images, or holds a
            file named like an image that is not one (named; its header is checked).
        lookhere_dense.errors.ToolError: an image of the folder that the prediction's
            reader cannot decode (corrupt), or an image stored in a type it does not read
            (named, with what it holds: ``it is a float32 3-channel TIFF ...: convert it
            to 8- or 16-bit``).
    """
    import cv2

    not_an_image = (
        f'input {path!r} is not an image OpenCV can read '
        f'(give an image file or a folder of {IMAGE_SUFFIXES})'
    )
    if osp.isfile(path):
        if not cv2.haveImageReader(path):
            raise FileNotFoundError(not_an_image)
        files = [path]
    elif not osp.isdir(path):
        raise FileNotFoundError(f'input {path!r} is neither an image file nor a folder')
    else:
        files = _folder_images(path)
    bad = [f for f in files if read_image(f) is None]
    if not bad:
        return files
    why = _undecodable(bad[0])
    if why is None and bad[0] == path:  # one file that OpenCV cannot decode at all
        raise FileNotFoundError(not_an_image)
    more = f' (and {len(bad) - 1} more in the folder)' if len(bad) > 1 else ''
    raise ToolError(
        (why or f'cannot decode the image {bad[0]!r} (corrupt or not an image)')
        + f'{more}; nothing was predicted'
    )


def _folder_images(path: str) -> List[str]:
    """The files of the folder ``path`` named like images, each with an OpenCV reader
    (:func:`list_images`)."""
    import cv2

    files = sorted(
        osp.join(path, f)
        for f in os.listdir(path)
        if f.lower().endswith(IMAGE_SUFFIXES) and osp.isfile(osp.join(path, f))
    )
    if not files:
        nested = sorted(
            osp.join(folder, f)
            for folder, _, names in os.walk(path)
            for f in names
            if f.lower().endswith(IMAGE_SUFFIXES)
        )
        raise FileNotFoundError(
            f'no images ({", ".join(IMAGE_SUFFIXES)}) in {path!r}'
            + (
                f'; its subfolders hold {len(nested)} (e.g. '
                f'{osp.relpath(nested[0], path)!r}, as Cityscapes keeps one folder per '
                f'city): give a folder of images, e.g. {osp.dirname(nested[0])!r} (folders '
                'are not searched recursively)'
                if nested
                else ''
            )
        )
    bad = [f for f in files if not cv2.haveImageReader(f)]
    if bad:
        more = f' (and {len(bad) - 1} more)' if len(bad) > 1 else ''
        raise FileNotFoundError(
            f'{bad[0]!r}{more} in the input folder is named like an image '
            'but is not one OpenCV can read: remove or fix it'
        )
    return files


def skipped_files(path: str) -> List[str]:
    """The files of the folder ``path`` that :func:`list_images` leaves out (names without
    an image suffix: ``notes.txt``, ``a.gif``), sorted; ``[]`` for a file or a missing path.
    Folders and hidden files (``.DS_Store``) are not counted."""
    if not osp.isdir(path):
        return []
    return sorted(
        f
        for f in os.listdir(path)
        if not f.startswith('.')
        and not f.lower().endswith(IMAGE_SUFFIXES)
        and osp.isfile(osp.join(path, f))
    )


def inference_pipeline(
    cfg,
    native: bool = False,
    short_side: Optional[int] = None,
    size: Optional[Tuple[int, int]] = None,
) -> List[Dict[str, Any]]:
    """Load -> (resize) -> pack: the config's first test ``Resize`` unless ``native`` (no
    resize), ``short_side`` (px, aspect kept) or ``size`` (``(H, W)``) say otherwise."""
    test_pipeline = cfg.get('test_dataloader', {}).get('dataset', {}).get('pipeline', [])
    idx = find_resize(test_pipeline)
    resize = dict(test_pipeline[idx]) if idx is not None else None
    if native:
        resize = None
    elif short_side is not None:
        resize = short_side_resize(short_side)
    elif size:
        resize = exact_resize(size)
    steps = [dict(type='LoadImageFromFile')]
    if resize:
        steps.append(resize)
    steps.append(dict(type='PackSegInputs'))
    return steps


def inference_test_cfg(
    cfg,
    whole: bool = False,
    slide: bool = False,
    crop: Optional[Tuple[int, int]] = None,
    stride: Optional[Tuple[int, int]] = None,
    patch_size: Optional[int] = None,
    pads_to_patches: bool = True,
) -> Dict[str, Any]:
    """The model ``test_cfg``: ``whole``, ``slide`` (windows of ``crop`` -- default the
    config's slide crop, else its training crop -- moved by ``stride`` -- default the
    config's, else 2/3 of the crop), or the config's own.

    Args:
        patch_size: the backbone's patch size in px: a slide window smaller than one
            patch is refused, and, where the backbone pads its input to whole patches
            (``pads_to_patches``), one that is no patch multiple
            (:func:`~lookhere_dense.config_checks.check_patch_multiple`). Default: None
            (not checked).
        pads_to_patches: the backbone pads to whole patches itself
            (:func:`backbone_padding_patch`; BEiT / MAE floor instead). Default: True.

    Raises:
        lookhere_dense.errors.ConfigError: ``crop`` / ``stride`` for whole-image inference
            (they would be ignored), slide inference without any crop, or with a
            window smaller than one ``patch_size`` patch (naming ``--crop`` or the config
            key it came from), or a stride longer than the window or a mode mmseg does not
            have (:func:`~lookhere_dense.config_checks.check_seg_test_cfg`).
    """
    tc = dict(cfg.model.get('test_cfg') or dict(mode='whole'))
    windowed = slide or (not whole and tc.get('mode') == 'slide')
    if (crop or stride) and not windowed:
        given = ' / '.join(n for n, v in (('--crop', crop), ('--stride', stride)) if v)
        raise ConfigError(
            f'{given} set the sliding windows, but this run predicts whole images '
            f'({"--whole" if whole else "the config test_cfg mode " + repr(tc.get("mode"))}): '
            'add --slide, or leave them out'
        )
    if whole:
        return dict(mode='whole')
    if windowed:
        window = (
            crop or tc.get('crop_size') or (cfg.model.get('data_preprocessor') or {}).get('size')
        )
        if not window:
            raise ConfigError(
                '--slide needs --crop (the config has no slide crop and no '
                'model.data_preprocessor.size)'
            )
        window = tuple(window)
        if patch_size and min(window) < patch_size:
            where = (
                f'--crop {window[0]}x{window[1]}'
                if crop
                else f'the slide window {window[0]}x{window[1]} (model.test_cfg.crop_size)'
                if tc.get('crop_size')
                else f'the slide window {window[0]}x{window[1]} (model.data_preprocessor.size)'
            )
            raise ConfigError(
                f'{where} is smaller than one {patch_size}x{patch_size} patch of the '
                f'backbone: give a --crop of at least {patch_size}x{patch_size}'
            )
        step = (
            stride
            or (tc.get('stride') if not crop else None)
            or tuple(max(1, c * 2 // 3) for c in window)
        )
        out = dict(mode='slide', crop_size=window, stride=tuple(step))
        check_seg_test_cfg(
            out,
            '--crop'
            if crop
            else 'model.test_cfg.crop_size'
            if tc.get('crop_size')
            else 'model.data_preprocessor.size',
            '--stride'
            if stride
            else 'model.test_cfg.stride'
            if not crop and tc.get('stride')
            else 'the default stride (2/3 of the window)',
            patch_size=patch_size if pads_to_patches else None,
        )
        return out
    check_seg_test_cfg(tc, modes=seg_test_modes(cfg.model))
    return tc


def backbone_padding_patch(model: Any) -> Optional[int]:
    """The patch size in px of a built segmentor's backbone where the backbone pads its
    input to whole patches itself
    (:data:`~lookhere_dense.config_checks.PATCH_PADDING_BACKBONES`), else None."""
    from ..config_checks import PATCH_PADDING_BACKBONES, patch_side

    backbone = getattr(model, 'backbone', None)
    name = type(backbone).__name__
    if name not in PATCH_PADDING_BACKBONES:
        return None
    if name == 'LookWhereViT':  # the extractor's patches
        backbone = getattr(backbone, 'extractor', None)
    return patch_side(getattr(backbone, 'patch_size', None))


def pad_whole_frames(model: Any) -> Optional[str]:
    """Pad whole frames to patch multiples in ``model``'s data preprocessor where its
    ``test_cfg`` mode is ``'whole'`` and its backbone pads to whole patches itself
    (:func:`backbone_padding_patch`) without a preprocessor ``test_cfg`` that pads so: the
    segmentor then crops the padding off the prediction, where the head stretched the
    backbone's padded grid over the frame (up to a patch minus one px off). For the tools
    that choose whole-image inference themselves (``tools/infer.py --whole``,
    ``tools/extrapolate.py``'s whole tests), whatever the config's own mode.

    Returns:
        The line to show where the preprocessor's ``test_cfg.size_divisor`` was set, else
        None (sliding windows, other backbones, a preprocessor that pads already).
    """
    import math

    from ..config_checks import pads_test_frames

    patch = backbone_padding_patch(model)
    pre = getattr(model, 'data_preprocessor', None)
    mode = (getattr(model, 'test_cfg', None) or {}).get('mode', 'whole')
    if patch is None or mode != 'whole' or not hasattr(pre, 'test_cfg'):
        return None
    if pads_test_frames(pre.test_cfg, patch):
        return None
    test_cfg = dict(pre.test_cfg or {})
    divisor = test_cfg.get('size_divisor')
    test_cfg['size_divisor'] = math.lcm(divisor, patch) if isinstance(divisor, int) else patch
    pre.test_cfg = test_cfg
    return (
        f'whole frames padded to multiples of {test_cfg["size_divisor"]} px in the data '
        'preprocessor (the config has no data_preprocessor.test_cfg.size_divisor that is a '
        f"multiple of the backbone's {patch}-px patch): the padding is cropped off the "
        'prediction, where the head would stretch the padded grid over the frame'
    )


def overlay(
    rgb: np.ndarray,
    labels: np.ndarray,
    palette: Sequence[Sequence[int]],
    opacity: float,
    ignore_index: int = 255,
) -> np.ndarray:
    """Blend class colours into an RGB image (labels outside the palette stay unpainted).

    Args:
        rgb: ``(H, W, 3)`` uint8.
        labels: ``(H, W)`` class ids.
        palette: one RGB colour per class.
        opacity: weight of the class colour, 0..1.
        ignore_index: label left unpainted. Default: 255.

    Returns:
        ``(H, W, 3)`` uint8.
    """
    pal = np.zeros((256, 3), np.float32)
    n = min(len(palette), 255)
    pal[:n] = np.asarray(palette[:n], np.float32)
    painted = (labels < n) & (labels != ignore_index)
    out = rgb.astype(np.float32)
    colours = pal[np.clip(labels, 0, 255)]
    out[painted] = (1 - opacity) * out[painted] + opacity * colours[painted]
    return np.clip(out, 0, 255).astype(np.uint8)


def class_palette(meta: Optional[Dict[str, Any]], cfg, num_classes: int) -> List[List[int]]:
    """The class colours: the checkpoint's ``dataset_meta``, else the config's test dataset
    class's ``METAINFO``, else ``num_classes`` fixed random colours."""
    if meta and meta.get('palette'):
        return [list(p) for p in meta['palette']]
    from mmseg.registry import DATASETS

    ds_type = cfg.get('test_dataloader', {}).get('dataset', {}).get('type')
    cls = DATASETS.get(ds_type) if isinstance(ds_type, str) else None
    if cls is not None and getattr(cls, 'METAINFO', {}).get('palette'):
        return [list(p) for p in cls.METAINFO['palette']]
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (num_classes, 3)).tolist()


def class_names(meta: Optional[Dict[str, Any]], cfg, num_classes: int) -> List[str]:
    """The class names: the checkpoint's ``dataset_meta``, else the config's test dataset
    class's ``METAINFO``, else ``class <id>``."""
    if meta and meta.get('classes'):
        return [str(c) for c in meta['classes']]
    from mmseg.registry import DATASETS

    ds_type = cfg.get('test_dataloader', {}).get('dataset', {}).get('type')
    cls = DATASETS.get(ds_type) if isinstance(ds_type, str) else None
    if cls is not None and getattr(cls, 'METAINFO', {}).get('classes'):
        return [str(c) for c in cls.METAINFO['classes']]
    return [f'class {i}' for i in range(num_classes)]


def output_stems(images: Sequence[str]) -> List[str]:
    """The output name of each image: its name without the suffix, or with it
    (``a.jpg`` -> ``a.jpg``) where two images share a stem (``a.jpg``, ``a.png``), so no
    overlay overwrites another."""
    stems = [osp.splitext(osp.basename(p))[0] for p in images]
    return [s if stems.count(s) == 1 else osp.basename(p) for s, p in zip(stems, images)]


def output_files(images: Sequence[str], save_labels: bool) -> List[Tuple[str, Optional[str]]]:
    """The file names each image's outputs get in ``--out-dir``, planned before anything is
    predicted: ``(<stem>.png, <stem>_labels.png or None)`` (the label map with
    ``save_labels``), the stems of :func:`output_stems` (an image name without its suffix,
    with it where two images share a stem).

    Raises:
        ToolError: two outputs with one file name, naming both images and the file (e.g.
            ``a.jpg``'s label map ``a_labels.png`` and the overlay of an input
            ``a_labels.png``, an earlier run's label map: it was overwritten without a
            word); nothing is written then.
    """
    files: List[Tuple[str, Optional[str]]] = []
    owner: Dict[str, Tuple[str, str]] = {}
    for image, stem in zip(images, output_stems(images)):
        overlay_name = f'{stem}.png'
        labels_name = f'{stem}_labels.png' if save_labels else None
        for name, kind in ((overlay_name, 'overlay'), (labels_name, 'label map')):
            if name is None:
                continue
            if name in owner:
                other, other_kind = owner[name]
                labels = 'label map' in (kind, other_kind)
                raise ToolError(
                    f'two outputs would be written as {name!r}: the {other_kind} of '
                    f'{other!r} and the {kind} of {image!r}'
                    + (
                        " (an input named like a label map: an earlier run's output?)"
                        if labels
                        else ''
                    )
                    + ': move one of the two images out of the input folder'
                    + (', or leave out --save-labels' if labels else '')
                    + '; nothing was predicted'
                )
            owner[name] = (image, kind)
        files.append((overlay_name, labels_name))
    return files


def _check_no_input_overwritten(
    images: Sequence[str], files: Sequence[Tuple[str, Optional[str]]], out_dir: str
) -> None:
    """Refuse, before anything is written, an ``--out-dir`` where an output
    (:func:`output_files`) would replace one of the input images (``--out-dir`` the input
    folder: ``a.png`` overwritten by its overlay, as happened without a word).

    Raises:
        ToolError: naming the folder and the first such image.
    """
    inputs = {osp.realpath(p) for p in images}
    for name in (n for pair in files for n in pair if n is not None):
        out = osp.realpath(osp.join(out_dir, name))
        if out in inputs:
            raise ToolError(
                f'--out-dir {out_dir!r}: the output {name!r} would overwrite the input '
                f'image {out!r}; write the overlays to another folder'
            )


def _write(path: str, image: np.ndarray) -> None:
    """Encode ``image`` as PNG and write it atomically: a write that fails (a full disk)
    leaves no truncated or empty file under ``path`` (cv2.imwrite reported success for
    half-written files).

    Raises:
        ToolError: naming the file and the cause.
    """
    import cv2

    from ..checkpoint.atomic import atomic_write_bytes, describe_os_error

    try:
        ok, data = cv2.imencode('.png', image)
    except cv2.error as err:
        raise ToolError(f'could not write {path!r}: {str(err).strip().splitlines()[-1]}') from None
    if not ok:
        raise ToolError(f'could not encode {path!r} as PNG')
    try:
        atomic_write_bytes(path, data.tobytes(), sync=False)
    except OSError as err:
        raise ToolError(f'could not write {path!r}: {describe_os_error(err)}') from None


def _make_out_dir(out_dir: str) -> None:
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as err:
        raise ToolError(
            f'cannot create the output folder {out_dir!r}: {err.strerror or err}'
        ) from None
    if not os.access(out_dir, os.W_OK):
        raise ToolError(f'the output folder {out_dir!r} is not writable')


def _dataset_reduce_zero_label(dataset: Any) -> Optional[bool]:
    """``reduce_zero_label`` of a dataset config: its own key, else an explicit one of its
    pipeline's ``LoadAnnotations`` (mmseg asserts the two agree), else that of the
    dataset it wraps (``dataset`` / the first of ``datasets``), else the default of the
    dataset class (``ADE20KDataset``: True, ``BaseSegDataset``: False); None when the
    class is unknown."""
    if not isinstance(dataset, dict):
        return None
    if dataset.get('reduce_zero_label') is not None:
        return bool(dataset['reduce_zero_label'])
    for step in dataset.get('pipeline') or []:
        if (
            isinstance(step, dict)
            and str(step.get('type', '')).split('.')[-1] == 'LoadAnnotations'
            and step.get('reduce_zero_label') is not None
        ):
            return bool(step['reduce_zero_label'])
    inner = dataset.get('dataset')
    if inner is None and dataset.get('datasets'):
        inner = dataset['datasets'][0]
    if inner is not None:
        return _dataset_reduce_zero_label(inner)
    ds_type = dataset.get('type')
    if isinstance(ds_type, str):
        from mmseg.registry import DATASETS

        ds_type = DATASETS.get(ds_type)
    if not isinstance(ds_type, type):
        return None
    try:
        param = inspect.signature(ds_type.__init__).parameters.get('reduce_zero_label')
    except (TypeError, ValueError):  # pragma: no cover - a C-implemented __init__
        return None
    if param is None or param.default is inspect.Parameter.empty:
        return None
    return bool(param.default)


def saved_label_offset(cfg, meta: Optional[Dict[str, Any]] = None) -> int:
    """What ``--save-labels`` adds to the model's class ids so that ``<name>_labels.png``
    numbers classes as the dataset's annotation files and ``tools/test.py --out`` do: 1
    for a ``reduce_zero_label`` dataset (ADE20K layout: file value 0 is "no class",
    ignored; class ``k`` of the model is value ``k + 1``; mmseg's ``IoUMetric`` adds the
    same 1 to what ``--out`` writes), else 0 (Cityscapes layout: value ``k`` is class
    ``k``).

    The config's test dataset decides (:func:`_dataset_reduce_zero_label`), as it does
    for ``tools/test.py``; a config without one falls back to the checkpoint's
    ``dataset_meta`` (the Runner records ``reduce_zero_label`` there), else 0.
    """
    dataset = (cfg.get('test_dataloader') or {}).get('dataset')
    reduce = _dataset_reduce_zero_label(dataset)
    if reduce is None and meta:
        reduce = meta.get('reduce_zero_label')
    return 1 if reduce else 0


def _saved_labels(pred: np.ndarray, offset: int) -> np.ndarray:
    """The class ids of one prediction as written to ``<name>_labels.png``: plus
    ``offset`` (:func:`saved_label_offset`); uint8, or uint16 where an id exceeds 255."""
    ids = pred.astype(np.int64) + offset
    return ids.astype(np.uint8 if ids.size == 0 or ids.max() <= 255 else np.uint16)


@dataclass
class Overlays:
    """What :func:`segment_images` wrote.

    Attributes:
        paths: the overlay PNGs, one per image.
        mode: the inference mode used (``'whole'`` or ``'slide'``).
        device: the device the model ran on.
        label_offset: what the ``<name>_labels.png`` files add to the model's class ids
            (:func:`saved_label_offset`: 1 for ``reduce_zero_label`` datasets such as
            ADE20K, whose annotation value 0 means "no class"; else 0).
        sizes: ``((H, W) of the first image, (H, W) the model saw of it)``: they differ
            where the pipeline resized it (the config's test ``Resize`` unless
            ``native``); None without images.
        gray: the images stored with one channel (grayscale), which were read as three
            equal channels.
    """

    paths: List[str]
    mode: str
    device: str
    label_offset: int = 0
    sizes: Optional[Tuple[Tuple[int, int], Tuple[int, int]]] = None
    gray: List[str] = field(default_factory=list)


#: PIL modes of one-channel (grayscale) images
_GRAY_MODES = ('1', 'L', 'LA', 'I', 'I;16', 'I;16B', 'I;16L', 'F')


def _is_gray(path: str) -> bool:
    """Whether the image file stores one channel (read from its header)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            return im.mode in _GRAY_MODES
    except Exception:  # noqa: BLE001 - cv2 reads what PIL cannot; not gray then
        return False


def _slide_window(cfg, crop, stride, patch) -> Optional[Tuple[int, int]]:
    """The window ``--slide`` would use (what the memory guard's advice offers to a
    whole-frame pass and checks a sliding one with), or None without any."""
    try:
        tc = inference_test_cfg(
            cfg,
            slide=True,
            crop=crop,
            stride=stride,
            patch_size=patch if isinstance(patch, int) else None,
        )
    except ConfigError:
        return None
    return tuple(int(c) for c in tc['crop_size'])


def check_segmentation_config(cfg, config: str) -> None:
    """Refuse a config that is not a segmentation (mmseg) one, naming it and what runs it.

    Raises:
        lookhere_dense.errors.ConfigError: ``default_scope`` is not mmseg (a detection
            config names mmdet's ``DetInferencer`` and ``tools/test.py --show-dir``).
    """
    scope = cfg.get('default_scope') or 'mmseg'
    if scope == 'mmseg':
        return
    model = (cfg.get('model') or {}).get('type')
    kind = 'a detection' if scope == 'mmdet' else f'a {scope}'
    advice = (
        "use mmdet's DetInferencer (from mmdet.apis import DetInferencer; "
        f"DetInferencer(model={config!r}, weights=CHECKPOINT)('image.jpg', out_dir='vis')) "
        f'or python tools/test.py {config} CHECKPOINT --show-dir DIR'
        if scope == 'mmdet'
        else f"use {scope}'s own inference tools"
    )
    raise ConfigError(
        f'tools/infer.py segments images with segmentation (mmseg) configs only; {config!r} '
        f'is {kind} config (default_scope={scope!r}, model {model}): {advice}'
    )


def _log_backends(model, size: Tuple[int, int]) -> None:
    """Log :func:`~lookhere_dense.lookhere.attention.backend_summary` for an image of
    ``size``: at the window the backbone sees (in slide mode the crop, at most the
    image), in the compute dtype (the autocast's around the call, e.g. ``--amp``)."""
    import torch
    from mmengine.logging import print_log

    from ..lookhere.attention import backend_summary

    crop = model.test_cfg.get('crop_size')
    if model.test_cfg.get('mode') == 'slide' and crop:
        size = tuple(min(int(s), int(c)) for s, c in zip(size, crop))
    param = next(model.parameters(), None)
    device_type = param.device.type if param is not None else 'cpu'
    dtype = (
        torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else None
    )
    line = backend_summary(model.backbone, size, training=False, dtype=dtype)
    if line:
        print_log(line, logger='current')


def backbone_patch(model: Any) -> Any:
    """The patch size of a built segmentor's backbone as it gives it (an int, or
    ``(H, W)``; ``LookWhereViT``: its extractor's), or None where it has none."""
    backbone = getattr(model, 'backbone', None)
    if type(backbone).__name__ == 'LookWhereViT':
        backbone = getattr(backbone, 'extractor', backbone)
    patch = getattr(backbone, 'patch_size', None)
    return tuple(patch) if isinstance(patch, list) else patch


def _check_resize_flags(
    model: Any, native: bool, short_side: Optional[int], size: Optional[Tuple[int, int]]
) -> None:
    """Refuse ``--short-side`` / ``--size`` below one patch of ``model``'s backbone
    (:func:`~lookhere_dense.evaluation.resize.check_resize_sides`): the model would see
    less than one patch and an overlay would be written without a word."""
    patch = backbone_patch(model)
    if native:  # no resize (inference_pipeline's order)
        return
    if short_side is not None:
        check_resize_sides(f'--short-side {short_side}', int(short_side), patch)
    elif size:
        check_resize_sides(f'--size {size[0]}x{size[1]}', tuple(size), patch)


def segment_images(
    config: str,
    checkpoint: str,
    input: str,
    out_dir: str = 'work_dirs/infer',
    whole: bool = False,
    slide: bool = False,
    native: bool = False,
    short_side: Optional[int] = None,
    size: Optional[Tuple[int, int]] = None,
    crop: Optional[Tuple[int, int]] = None,
    stride: Optional[Tuple[int, int]] = None,
    opacity: float = 0.5,
    save_labels: bool = False,
    device: Optional[str] = None,
    cfg_options: Optional[dict] = None,
    legend: bool = True,
    max_memory: Optional[str] = None,
) -> Overlays:
    """Segment an image or a folder of images; write ``<out_dir>/<image name>.png``
    overlays (and the class ids as ``<image name>_labels.png`` with ``save_labels``,
    numbered as the dataset's annotation files and ``tools/test.py --out``: for a
    ``reduce_zero_label`` dataset such as ADE20K class ``k`` of the model is written as
    ``k + 1`` and 0 is never written; see :func:`saved_label_offset`).

    Args: as ``tools/infer.py`` (``size``, ``crop``, ``stride``: ``(H, W)``); ``device``
    default: cuda when available, else cpu; ``legend``: draw the legend of the classes
    present (default: True); ``max_memory``: the budget of one pass (``'8G'``; default:
    None, the memory left): a frame whose estimated peak exceeds it is refused before it
    allocates (:func:`lookhere_dense.engine.memory_guard.install_memory_guard`).

    Raises:
        ValueError: ``opacity`` outside 0..1; FileNotFoundError: input / config /
        checkpoint missing, or an input named like an image that is not one;
        lookhere_dense.apis.cli.ToolError: an image that cannot be decoded (a float32
        TIFF: with its type; found when the input is listed, :func:`list_images`), two
        outputs with one file name (:func:`output_files`) or one that would replace an
        input (found before the model is built), an output that cannot be written (each
        named); lookhere_dense.errors.CheckpointError: the
        checkpoint cannot be read or does not fit the config's model;
        lookhere_dense.errors.ConfigError: see :func:`inference_test_cfg`, a config that
        is not a segmentation one (:func:`check_segmentation_config`), a ``device``
        this machine does not have (:func:`lookhere_dense.apis.cli.check_device`), and
        a ``short_side`` / ``size`` below one patch of the backbone
        (:func:`~lookhere_dense.evaluation.resize.check_resize_sides`, before any image is
        predicted).
    """
    import lookhere_dense

    lookhere_dense.register_all_modules()
    import cv2
    import torch
    from mmcv.transforms import Compose
    from mmengine.config import ConfigDict

    from ..visualization.legend import draw_legend
    from .cli import check_attn_backend, check_device, load_config, progress

    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f'--opacity must be in 0..1, got {opacity}')
    device = check_device(device)
    images = list_images(input)
    files = output_files(images, save_labels)
    _check_no_input_overwritten(images, files, out_dir)
    cfg = load_config(config, cfg_options)
    check_segmentation_config(cfg, config)
    check_attn_backend(cfg, device.startswith('cuda'), splits=('test',))
    model, meta = build_model_from_checkpoint(cfg, checkpoint, device)
    _check_resize_flags(model, native, short_side, size)
    _make_out_dir(out_dir)  # after the refusals above: a refused run leaves no folder
    patch = getattr(model.backbone, 'patch_size', None)
    pads = backbone_padding_patch(model) is not None
    model.test_cfg = ConfigDict(
        inference_test_cfg(
            cfg, whole, slide, crop, stride, patch if isinstance(patch, int) else None, pads
        )
    )
    padded_note = pad_whole_frames(model)
    if padded_note:
        from mmengine.logging import print_log

        print_log(padded_note, logger='current')
    from ..data.checks import size_after
    from ..engine.memory_guard import check_frame_size, install_memory_guard, parse_memory

    budget = None if max_memory is None else parse_memory(max_memory)
    install_memory_guard(model, budget, _slide_window(cfg, crop, stride, patch), '--slide')
    steps = inference_pipeline(cfg, native, short_side, size)
    resize_step = steps[1] if len(steps) == 3 else None
    pipeline = Compose(steps)
    num_classes = int(getattr(model.decode_head, 'num_classes', 0) or 0)
    palette = class_palette(meta, cfg, num_classes)
    names = class_names(meta, cfg, num_classes)
    offset = saved_label_offset(cfg, meta)
    written, sizes, gray = [], None, []
    for path, (overlay_name, labels_name) in progress(list(zip(images, files)), 'infer'):
        bgr = read_image(path)
        if bgr is None:  # it was read when listed: changed since
            why = (
                _undecodable(path) or f'cannot decode the image {path!r} (corrupt or not an image)'
            )
            raise ToolError(f'{why}; {len(written)} overlay(s) were written before it')
        # refused before the pipeline resizes the image (the guard sees the resized frame)
        check_frame_size(model, size_after(resize_step, bgr.shape[:2]), bgr.shape[:2])
        if _is_gray(path):
            gray.append(path)
        data = pipeline(dict(img_path=path))
        batch = dict(inputs=[data['inputs']], data_samples=[data['data_samples']])
        if not written:  # which attention backend each layer runs, one line
            seen = tuple(data['inputs'].shape[-2:])
            _log_backends(model, seen)
            sizes = (tuple(bgr.shape[:2]), seen)
        with torch.no_grad():
            result = model.test_step(batch)[0]
        pred = result.pred_sem_seg.data[0].cpu().numpy()
        labels = pred.astype(np.uint8)
        if bgr.shape[:2] != labels.shape:  # prediction is at the original size
            bgr = cv2.resize(bgr, labels.shape[::-1])
        rgb = overlay(bgr[..., ::-1], labels, palette, opacity)
        if legend:
            rgb = draw_legend(rgb, labels, palette, names)
        out = osp.join(out_dir, overlay_name)
        _write(out, np.ascontiguousarray(rgb[..., ::-1]))
        written.append(out)
        if labels_name is not None:
            _write(osp.join(out_dir, labels_name), _saved_labels(pred, offset))
    return Overlays(written, str(model.test_cfg.get('mode')), device, offset, sizes, gray)
