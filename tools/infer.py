#!/usr/bin/env python
"""Segment one image or a folder of images and write colour-overlay PNGs, at any resolution.

By default images go through the config's test resize and the config's inference mode;
``--native`` keeps each image's own size, ``--short-side`` / ``--size`` pick another one,
and ``--whole`` / ``--slide`` choose one pass over the whole image or sliding windows of
the training crop. Overlays are written as ``<out-dir>/<image name>.png`` (and the raw
class ids as ``<image name>_labels.png`` with ``--save-labels``).

Examples::

    python tools/infer.py configs/segmenter_lookhere_ade20k.py CKPT photo.jpg --whole --native
    python tools/infer.py configs/segmenter_lookhere_cityscapes.py CKPT frames/ \\
        --size 2048x4096 --whole --out-dir vis
"""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

IMAGE_SUFFIXES = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def _hw(text: str) -> Tuple[int, int]:
    try:
        h, w = (int(v) for v in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected HxW such as 1024x2048, got {text!r}')
    if h < 1 or w < 1:
        raise argparse.ArgumentTypeError(f'sizes must be positive, got {text!r}')
    return h, w


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """Command-line arguments."""
    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('config', help='the config the checkpoint was trained with')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument('input', help='an image file or a folder of images')
    parser.add_argument('--out-dir', default='work_dirs/infer',
                        help='folder for the overlay PNGs (default: %(default)s)')
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument('--whole', action='store_true',
                      help='predict the whole image in one pass (any size)')
    mode.add_argument('--slide', action='store_true',
                      help='predict in sliding windows of --crop with --stride')
    size = parser.add_mutually_exclusive_group()
    size.add_argument('--native', action='store_true',
                      help="keep each image's own size (no resize)")
    size.add_argument('--short-side', type=int, metavar='S',
                      help='resize so the short side is S px (aspect kept)')
    size.add_argument('--size', type=_hw, metavar='HxW', help='resize to exactly HxW')
    parser.add_argument('--crop', type=_hw, metavar='HxW',
                        help="slide window (default: the config's slide crop, else its "
                        'training crop)')
    parser.add_argument('--stride', type=_hw, metavar='HxW',
                        help='slide stride (default: the config\'s, else 2/3 of the crop)')
    parser.add_argument('--opacity', type=float, default=0.5,
                        help='overlay opacity of the class colours, 0..1 (default: 0.5)')
    parser.add_argument('--save-labels', action='store_true',
                        help='also write the predicted class ids as <name>_labels.png')
    parser.add_argument('--device', default=None,
                        help='cpu or cuda[:N] (default: cuda when available, else cpu)')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, metavar='KEY=VALUE',
                        help='override config entries')
    from lookhere_dense.cli import add_threads_arg
    add_threads_arg(parser)
    return parser.parse_args(argv)


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


def inference_pipeline(cfg, args: argparse.Namespace) -> List[Dict[str, Any]]:
    """Load -> (resize) -> pack, following the config's test resize unless told
    otherwise."""
    test_pipeline = cfg.get('test_dataloader', {}).get('dataset', {}).get('pipeline', [])
    resize = next((dict(t) for t in test_pipeline
                   if str(t.get('type', '')).split('.')[-1] == 'Resize'), None)
    if args.native:
        resize = None
    elif args.short_side:
        resize = dict(type='Resize', scale=(1 << 20, args.short_side), keep_ratio=True)
    elif args.size:
        resize = dict(type='Resize', scale=(args.size[1], args.size[0]), keep_ratio=False)
    steps = [dict(type='LoadImageFromFile')]
    if resize:
        steps.append(resize)
    steps.append(dict(type='PackSegInputs'))
    return steps


def inference_test_cfg(cfg, args: argparse.Namespace) -> Dict[str, Any]:
    """The model ``test_cfg`` for ``--whole`` / ``--slide`` (default: the config's)."""
    tc = dict(cfg.model.get('test_cfg') or dict(mode='whole'))
    if args.whole:
        return dict(mode='whole')
    if args.slide or tc.get('mode') == 'slide':
        crop = args.crop or tc.get('crop_size') or \
            (cfg.model.get('data_preprocessor') or {}).get('size')
        if not crop:
            from lookhere_dense.swap import ConfigError
            raise ConfigError('--slide needs --crop (the config has no slide crop and no '
                              'model.data_preprocessor.size)')
        crop = tuple(crop)
        stride = args.stride or (tc.get('stride') if not args.crop else None) or \
            tuple(max(1, c * 2 // 3) for c in crop)
        return dict(mode='slide', crop_size=crop, stride=tuple(stride))
    return tc


def overlay(rgb: np.ndarray, labels: np.ndarray, palette: Sequence[Sequence[int]],
            opacity: float, ignore_index: int = 255) -> np.ndarray:
    """Blend class colours into an RGB image (labels outside the palette stay unpainted)."""
    pal = np.zeros((256, 3), np.float32)
    n = min(len(palette), 255)
    pal[:n] = np.asarray(palette[:n], np.float32)
    painted = (labels < n) & (labels != ignore_index)
    out = rgb.astype(np.float32)
    colours = pal[np.clip(labels, 0, 255)]
    out[painted] = (1 - opacity) * out[painted] + opacity * colours[painted]
    return np.clip(out, 0, 255).astype(np.uint8)


def _palette(meta: Optional[Dict[str, Any]], cfg, num_classes: int) -> List[List[int]]:
    if meta and meta.get('palette'):
        return [list(p) for p in meta['palette']]
    from mmseg.registry import DATASETS
    ds_type = cfg.get('test_dataloader', {}).get('dataset', {}).get('type')
    cls = DATASETS.get(ds_type) if isinstance(ds_type, str) else None
    if cls is not None and getattr(cls, 'METAINFO', {}).get('palette'):
        return [list(p) for p in cls.METAINFO['palette']]
    rng = np.random.default_rng(0)
    return rng.integers(0, 255, (num_classes, 3)).tolist()


def main(argv: Optional[List[str]] = None) -> List[str]:
    """Write the overlays; returns their paths."""
    from lookhere_dense.cli import quiet_known_warnings
    quiet_known_warnings()
    import lookhere_dense
    lookhere_dense.register_all_modules()
    import cv2
    import torch
    from mmcv.transforms import Compose
    from mmengine.config import ConfigDict
    from tqdm import tqdm

    from lookhere_dense.cli import build_model_from_checkpoint, load_config

    args = parse_args(argv)
    from lookhere_dense.cli import apply_threads
    apply_threads(args.threads)
    if not 0.0 <= args.opacity <= 1.0:
        raise SystemExit(f'--opacity must be in 0..1, got {args.opacity}')
    images = list_images(args.input)
    cfg = load_config(args.config, args.cfg_options)
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    model, meta = build_model_from_checkpoint(cfg, args.checkpoint, device)
    model.test_cfg = ConfigDict(inference_test_cfg(cfg, args))
    pipeline = Compose(inference_pipeline(cfg, args))
    num_classes = int(getattr(model.decode_head, 'num_classes', 0) or 0)
    palette = _palette(meta, cfg, num_classes)
    os.makedirs(args.out_dir, exist_ok=True)
    written = []
    for path in tqdm(images, desc='infer', unit='img', dynamic_ncols=True,
                     disable=None):
        data = pipeline(dict(img_path=path))
        batch = dict(inputs=[data['inputs']], data_samples=[data['data_samples']])
        with torch.no_grad():
            result = model.test_step(batch)[0]
        labels = result.pred_sem_seg.data[0].cpu().numpy().astype(np.uint8)
        bgr = cv2.imread(path, cv2.IMREAD_COLOR)
        if bgr.shape[:2] != labels.shape:  # prediction is at the original size
            bgr = cv2.resize(bgr, labels.shape[::-1])
        rgb = overlay(bgr[..., ::-1], labels, palette, args.opacity)
        stem = osp.splitext(osp.basename(path))[0]
        out = osp.join(args.out_dir, f'{stem}.png')
        cv2.imwrite(out, np.ascontiguousarray(rgb[..., ::-1]))
        written.append(out)
        if args.save_labels:
            cv2.imwrite(osp.join(args.out_dir, f'{stem}_labels.png'), labels)
    print(f'wrote {len(written)} overlay(s) to {args.out_dir} '
          f'({model.test_cfg.get("mode")} inference on {device})')
    return written


if __name__ == '__main__':
    from lookhere_dense.cli import run_main
    run_main(main)
