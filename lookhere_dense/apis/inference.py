"""Segment images at any resolution and write colour overlays (``tools/infer.py``).

By default images go through the config's test resize and the config's inference mode;
``native`` keeps each image's own size, ``short_side`` / ``size`` pick another one (the
one resize rewrite, :mod:`lookhere_dense.evaluation.resize`), and ``whole`` / ``slide``
choose one pass over the whole image or sliding windows of the training crop.
"""
from __future__ import annotations

import os
import os.path as osp
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..evaluation.resize import exact_resize, find_resize, short_side_resize

__all__ = ['IMAGE_SUFFIXES', 'list_images', 'inference_pipeline', 'inference_test_cfg',
           'overlay', 'class_palette', 'Overlays', 'segment_images']

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def list_images(path: str) -> List[str]:
    """``path`` itself, or the images in the folder ``path`` (sorted, not recursive).

    Raises:
        FileNotFoundError: ``path`` does not exist, is a file that is not an image, or is
            a folder that holds no images.
    """
    if osp.isfile(path):
        import cv2
        if cv2.imread(path, cv2.IMREAD_UNCHANGED) is None:
            raise FileNotFoundError(f'input {path!r} is not an image OpenCV can read '
                                    f'(give an image file or a folder of {IMAGE_SUFFIXES})')
        return [path]
    if not osp.isdir(path):
        raise FileNotFoundError(f'input {path!r} is neither an image file nor a folder')
    files = sorted(osp.join(path, f) for f in os.listdir(path)
                   if f.lower().endswith(IMAGE_SUFFIXES))
    if not files:
        raise FileNotFoundError(f'no images ({", ".join(IMAGE_SUFFIXES)}) in {path!r}')
    return files


def inference_pipeline(cfg, native: bool = False, short_side: Optional[int] = None,
                       size: Optional[Tuple[int, int]] = None) -> List[Dict[str, Any]]:
    """Load -> (resize) -> pack: the config's first test ``Resize`` unless ``native`` (no
    resize), ``short_side`` (px, aspect kept) or ``size`` (``(H, W)``) say otherwise."""
    test_pipeline = cfg.get('test_dataloader', {}).get('dataset', {}).get('pipeline', [])
    idx = find_resize(test_pipeline)
    resize = dict(test_pipeline[idx]) if idx is not None else None
    if native:
        resize = None
    elif short_side:
        resize = short_side_resize(short_side)
    elif size:
        resize = exact_resize(size)
    steps = [dict(type='LoadImageFromFile')]
    if resize:
        steps.append(resize)
    steps.append(dict(type='PackSegInputs'))
    return steps


def inference_test_cfg(cfg, whole: bool = False, slide: bool = False,
                       crop: Optional[Tuple[int, int]] = None,
                       stride: Optional[Tuple[int, int]] = None) -> Dict[str, Any]:
    """The model ``test_cfg``: ``whole``, ``slide`` (windows of ``crop`` -- default the
    config's slide crop, else its training crop -- moved by ``stride`` -- default the
    config's, else 2/3 of the crop), or the config's own.

    Raises:
        lookhere_dense.swap.ConfigError: slide inference without any crop.
    """
    tc = dict(cfg.model.get('test_cfg') or dict(mode='whole'))
    if whole:
        return dict(mode='whole')
    if slide or tc.get('mode') == 'slide':
        window = crop or tc.get('crop_size') or \
            (cfg.model.get('data_preprocessor') or {}).get('size')
        if not window:
            from lookhere_dense.swap import ConfigError
            raise ConfigError('--slide needs --crop (the config has no slide crop and no '
                              'model.data_preprocessor.size)')
        window = tuple(window)
        step = stride or (tc.get('stride') if not crop else None) or \
            tuple(max(1, c * 2 // 3) for c in window)
        return dict(mode='slide', crop_size=window, stride=tuple(step))
    return tc


def overlay(rgb: np.ndarray, labels: np.ndarray, palette: Sequence[Sequence[int]],
            opacity: float, ignore_index: int = 255) -> np.ndarray:
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


@dataclass
class Overlays:
    """What :func:`segment_images` wrote.

    Attributes:
        paths: the overlay PNGs, one per image.
        mode: the inference mode used (``'whole'`` or ``'slide'``).
        device: the device the model ran on.
    """

    paths: List[str]
    mode: str
    device: str


def segment_images(config: str, checkpoint: str, input: str, out_dir: str = 'work_dirs/infer',
                   whole: bool = False, slide: bool = False, native: bool = False,
                   short_side: Optional[int] = None, size: Optional[Tuple[int, int]] = None,
                   crop: Optional[Tuple[int, int]] = None,
                   stride: Optional[Tuple[int, int]] = None, opacity: float = 0.5,
                   save_labels: bool = False, device: Optional[str] = None,
                   cfg_options: Optional[dict] = None) -> Overlays:
    """Segment an image or a folder of images; write ``<out_dir>/<image name>.png``
    overlays (and the class ids as ``<image name>_labels.png`` with ``save_labels``).

    Args: as ``tools/infer.py`` (``size``, ``crop``, ``stride``: ``(H, W)``); ``device``
    default: cuda when available, else cpu.

    Raises:
        ValueError: ``opacity`` outside 0..1; FileNotFoundError: input / config /
        checkpoint missing; lookhere_dense.swap.ConfigError (see
        :func:`inference_test_cfg`).
    """
    import lookhere_dense
    lookhere_dense.register_all_modules()
    import cv2
    import torch
    from mmcv.transforms import Compose
    from mmengine.config import ConfigDict
    from tqdm import tqdm

    from lookhere_dense.cli import build_model_from_checkpoint, load_config

    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f'--opacity must be in 0..1, got {opacity}')
    images = list_images(input)
    cfg = load_config(config, cfg_options)
    device = device or ('cuda' if torch.cuda.is_available() else 'cpu')
    model, meta = build_model_from_checkpoint(cfg, checkpoint, device)
    model.test_cfg = ConfigDict(inference_test_cfg(cfg, whole, slide, crop, stride))
    pipeline = Compose(inference_pipeline(cfg, native, short_side, size))
    num_classes = int(getattr(model.decode_head, 'num_classes', 0) or 0)
    palette = class_palette(meta, cfg, num_classes)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for path in tqdm(images, desc='infer', unit='img', dynamic_ncols=True, disable=None):
        data = pipeline(dict(img_path=path))
        batch = dict(inputs=[data['inputs']], data_samples=[data['data_samples']])
        with torch.no_grad():
            result = model.test_step(batch)[0]
        labels = result.pred_sem_seg.data[0].cpu().numpy().astype(np.uint8)
        bgr = cv2.imread(path, cv2.IMREAD_COLOR)
        if bgr.shape[:2] != labels.shape:  # prediction is at the original size
            bgr = cv2.resize(bgr, labels.shape[::-1])
        rgb = overlay(bgr[..., ::-1], labels, palette, opacity)
        stem = osp.splitext(osp.basename(path))[0]
        out = osp.join(out_dir, f'{stem}.png')
        cv2.imwrite(out, np.ascontiguousarray(rgb[..., ::-1]))
        written.append(out)
        if save_labels:
            cv2.imwrite(osp.join(out_dir, f'{stem}_labels.png'), labels)
    return Overlays(written, str(model.test_cfg.get('mode')), device)
