"""Writing generated segmentation datasets in mmseg's folder layout (numpy + Pillow).

The generated tasks of the extrapolation study (:mod:`.relational`, :mod:`.fov_scenes`)
write the same layout::

    ROOT/img_dir/<split>/00000.png   RGB image
    ROOT/ann_dir/<split>/00000.png   uint8 class indexes
    ROOT/meta.json                   the settings that made the folder, classes, palette,
                                     and per split: size, images, pixels per class

which mmseg's ``BaseSegDataset`` (``img_suffix='.png'``, ``seg_map_suffix='.png'``) reads.
:func:`write_dataset` writes such a folder; :func:`ensure_dataset` writes it only when
``meta.json`` is absent or was made with other settings.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Callable, Dict, Iterator, Sequence, Tuple

import numpy as np

__all__ = ['Split', 'write_png', 'write_dataset', 'ensure_dataset']

#: one split to write: ``(name, (H, W), number of images)``
Split = Tuple[str, Tuple[int, int], int]


def write_png(path: str, array: np.ndarray) -> None:
    """Write a uint8 ``(H, W, 3)`` RGB or ``(H, W)`` label array as PNG (fast compression)."""
    from PIL import Image

    Image.fromarray(array).save(path, compress_level=1)


def write_dataset(
    root: str,
    splits: Sequence[Split],
    images: Callable[[str, Tuple[int, int], int], Iterator[Tuple[np.ndarray, np.ndarray]]],
    meta: Dict[str, Any],
    num_classes: int,
    progress: bool = False,
) -> Dict[str, Any]:
    """(Re)write the dataset folder ``root`` (see the module docstring).

    Args:
        root: the folder (its ``img_dir`` / ``ann_dir`` are removed first).
        splits: the splits to write, in order.
        images: ``images(name, size, number)`` yields ``number`` ``(image, label)`` pairs
            of the split (``(H, W, 3)`` uint8 RGB and ``(H, W)`` uint8 class indexes).
        meta: what ``meta.json`` holds besides ``splits`` (the settings, classes, palette).
        num_classes: length of the per-class pixel counts.
        progress: show a tqdm progress bar. Default: False.

    Returns:
        The ``meta.json`` content: ``meta`` plus ``splits = {name: dict(size, images,
        pixels_per_class)}``.
    """
    if os.path.isdir(root):
        for sub in ('img_dir', 'ann_dir'):
            shutil.rmtree(os.path.join(root, sub), ignore_errors=True)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=sum(n for _, _, n in splits), desc=f'writing {root}', unit='img', mininterval=5
        )
    written: Dict[str, Dict[str, Any]] = {}
    for name, size, number in splits:
        img_dir = os.path.join(root, 'img_dir', name)
        ann_dir = os.path.join(root, 'ann_dir', name)
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(ann_dir, exist_ok=True)
        hist = np.zeros(num_classes, dtype=np.int64)
        for i, (image, label) in enumerate(images(name, tuple(size), number)):
            write_png(os.path.join(img_dir, f'{i:05d}.png'), image)
            write_png(os.path.join(ann_dir, f'{i:05d}.png'), label)
            hist += np.bincount(label.ravel(), minlength=num_classes)
            if bar is not None:
                bar.update()
        written[name] = dict(size=list(size), images=number, pixels_per_class=hist.tolist())
    if bar is not None:
        bar.close()
    out = dict(meta, splits=written)
    with open(os.path.join(root, 'meta.json'), 'w') as f:
        json.dump(out, f, indent=1)
    return out


def ensure_dataset(
    root: str, settings: Dict[str, Any], write: Callable[[], Dict[str, Any]]
) -> Dict[str, Any]:
    """The dataset at ``root``: its ``meta.json`` content when that file exists and its
    ``settings`` equal ``settings``; otherwise ``write()`` (which writes the folder and
    returns the new content)."""
    path = os.path.join(root, 'meta.json')
    if os.path.isfile(path):
        with open(path) as f:
            meta = json.load(f)
        if meta.get('settings') == settings:
            return meta
    return write()
