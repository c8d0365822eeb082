"""Tiny generated instance-segmentation datasets in the real COCO and Cityscapes layouts.

Every image shows a few non-overlapping filled shapes on a noisy background; each shape
is one instance whose class decides its kind (box, disc, triangle, ...) and colour. The
annotations are COCO json (polygon segmentation, ``[x, y, w, h]`` boxes, polygon areas), so
mmdet's own ``CocoDataset`` / ``CityscapesDataset``, pipelines and ``CocoMetric`` read them
unchanged. Everything is drawn from a seeded generator: the same call writes the same files.

Layouts written::

    make_coco_instances(root):
        root/annotations/instances_train2017.json, root/train2017/000000000001.png, ...
        root/annotations/instances_val2017.json,   root/val2017/...
    make_cityscapes_instances(root):
        root/annotations/instancesonly_filtered_gtFine_train.json,
        root/leftImg8bit/train/synthcity/synthcity_000000_000019_leftImg8bit.png, ...
        root/annotations/instancesonly_filtered_gtFine_val.json, root/leftImg8bit/val/...

(the Cityscapes file names follow the official ``{city}_{seq}_{frame}_leftImg8bit.png``
pattern; the json is what mmdet's ``cityscapes2coco`` converter writes).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Dict, List, Mapping, Sequence, Tuple, Union

import cv2
import numpy as np

__all__ = [
    'SHAPE_CLASSES',
    'CITYSCAPES_THING_CLASSES',
    'CITYSCAPES_THING_IDS',
    'shape_polygon',
    'polygon_area',
    'write_instance_split',
    'make_coco_instances',
    'make_cityscapes_instances',
]

#: Class names of the COCO-like set; class ``i`` is drawn as ``_KINDS[i % len(_KINDS)]``.
SHAPE_CLASSES = ('box', 'disc', 'triangle')
#: Cityscapes "thing" classes in mmdet's ``CityscapesDataset`` order, with the official ids.
CITYSCAPES_THING_CLASSES = (
    'person',
    'rider',
    'car',
    'truck',
    'bus',
    'train',
    'motorcycle',
    'bicycle',
)
CITYSCAPES_THING_IDS = (24, 25, 26, 27, 28, 31, 32, 33)

_KINDS = ('box', 'disc', 'triangle', 'diamond')
_PALETTE = (
    (220, 40, 40),
    (40, 180, 60),
    (50, 70, 220),
    (230, 200, 30),
    (200, 60, 200),
    (30, 200, 210),
    (240, 130, 20),
    (120, 120, 255),
)


def shape_polygon(kind: str, box: Tuple[float, float, float, float]) -> np.ndarray:
    """Outline of a shape inscribed in ``box = (x0, y0, x1, y1)``.

    Returns:
        ``(K, 2)`` float64 ``(x, y)`` vertices, counter-clockwise in image axes.
    """
    x0, y0, x1, y1 = box
    cx, cy, rx, ry = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) / 2, (y1 - y0) / 2
    if kind == 'box':
        pts = [(x0, y0), (x0, y1), (x1, y1), (x1, y0)]
    elif kind == 'disc':
        t = np.linspace(0, 2 * math.pi, 24, endpoint=False)
        pts = np.stack([cx + rx * np.cos(t), cy - ry * np.sin(t)], 1)
    elif kind == 'triangle':
        pts = [(cx, y0), (x0, y1), (x1, y1)]
    elif kind == 'diamond':
        pts = [(cx, y0), (x0, cy), (cx, y1), (x1, cy)]
    else:
        raise ValueError(f'unknown shape kind {kind!r}; allowed: {list(_KINDS)}')
    return np.asarray(pts, dtype=np.float64)


def polygon_area(poly: np.ndarray) -> float:
    """Area of a simple polygon ``(K, 2)`` (shoelace formula)."""
    x, y = poly[:, 0], poly[:, 1]
    return float(abs(np.dot(x, np.roll(y, -1)) - np.dot(y, np.roll(x, -1))) / 2)


def _draw_image(
    rng: np.random.Generator, size: Tuple[int, int], num_classes: int, max_objects: int
) -> Tuple[np.ndarray, List[Tuple[int, np.ndarray]]]:
    """One BGR image ``(H, W, 3)`` and its ``(class_index, polygon)`` instances.

    Objects sit in separate vertical strips, so they never overlap and every polygon is
    exactly the visible region (up to rasterisation).
    """
    width, height = size
    base = rng.integers(60, 140)
    img = np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)
    count = int(rng.integers(1, max_objects + 1))
    strip = width / count
    instances = []
    for i in range(count):
        cls = int(rng.integers(num_classes))
        w = rng.uniform(0.45, 0.9) * strip
        h = rng.uniform(0.25, 0.7) * height
        x0 = i * strip + rng.uniform(0, strip - w)
        y0 = rng.uniform(0, height - h)
        poly = shape_polygon(_KINDS[cls % len(_KINDS)], (x0, y0, x0 + w, y0 + h))
        color = _PALETTE[cls % len(_PALETTE)]
        cv2.fillPoly(img, [np.round(poly).astype(np.int32)], color[::-1])
        instances.append((cls, poly))
    return img, instances


def write_instance_split(
    image_dir: Union[str, Path],
    ann_file: Union[str, Path],
    classes: Sequence[str],
    cat_ids: Sequence[int],
    file_names: Sequence[str],
    image_size: Tuple[int, int],
    seed: int = 0,
    max_objects: int = 3,
    first_image_id: int = 1,
) -> Path:
    """Draw ``len(file_names)`` images into ``image_dir`` and write their COCO json.

    Args:
        image_dir: folder the ``file_names`` are relative to.
        ann_file: the json to write.
        classes: category names.
        cat_ids: their COCO category ids.
        file_names: image paths relative to ``image_dir`` (``.png``; folders are created).
        image_size: ``(width, height)`` of every image.
        seed: generator seed. Default: 0.
        max_objects: at most this many instances per image (at least one). Default: 3.
        first_image_id: id of the first image. Default: 1.

    Returns:
        ``ann_file`` as a :class:`~pathlib.Path`.
    """
    if len(classes) != len(cat_ids):
        raise ValueError(f'{len(classes)} classes but {len(cat_ids)} category ids')
    width, height = image_size
    if width < 16 or height < 16:
        raise ValueError(f'image_size must be at least 16x16, got {image_size}')
    if max_objects < 1:
        raise ValueError(f'max_objects must be >= 1, got {max_objects}')
    rng = np.random.default_rng(seed)
    image_dir, ann_file = Path(image_dir), Path(ann_file)
    images, annotations = [], []
    for offset, name in enumerate(file_names):
        image_id = first_image_id + offset
        img, instances = _draw_image(rng, (width, height), len(classes), max_objects)
        path = image_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if not cv2.imwrite(str(path), img):
            raise OSError(f'could not write {path}')
        images.append(dict(id=image_id, file_name=name, width=width, height=height))
        for cls, poly in instances:
            x0, y0 = poly.min(0)
            x1, y1 = poly.max(0)
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=image_id,
                    category_id=int(cat_ids[cls]),
                    segmentation=[[round(float(v), 2) for v in poly.reshape(-1)]],
                    area=round(polygon_area(poly), 2),
                    bbox=[
                        round(float(x0), 2),
                        round(float(y0), 2),
                        round(float(x1 - x0), 2),
                        round(float(y1 - y0), 2),
                    ],
                    iscrowd=0,
                )
            )
    categories = [dict(id=int(i), name=n) for i, n in zip(cat_ids, classes)]
    ann_file.parent.mkdir(parents=True, exist_ok=True)
    ann_file.write_text(
        json.dumps(dict(images=images, annotations=annotations, categories=categories))
    )
    return ann_file


Splits = Union[Mapping[str, int], Sequence[Tuple[str, int]]]


def make_coco_instances(
    root: Union[str, Path],
    splits: Splits = (('train2017', 4), ('val2017', 2)),
    image_size: Tuple[int, int] = (160, 128),
    classes: Sequence[str] = SHAPE_CLASSES,
    seed: int = 0,
    max_objects: int = 3,
) -> Dict[str, Path]:
    """A COCO-layout instance dataset under ``root``.

    Args:
        root: dataset root (``data_root`` of an mmdet config).
        splits: ``{split: number of images}``; images go to ``root/<split>/`` and the json
            to ``root/annotations/instances_<split>.json``.
            Default: ``{'train2017': 4, 'val2017': 2}``.
        image_size: ``(width, height)``. Default: ``(160, 128)``.
        classes: category names (ids ``1..n``). Default: :data:`SHAPE_CLASSES`.
        seed: base seed (split ``i`` uses ``seed + i``). Default: 0.
        max_objects: instances per image, at most. Default: 3.

    Returns:
        ``{split: annotation json path}``.
    """
    root = Path(root)
    out = {}
    image_id = 1
    for i, (split, count) in enumerate(dict(splits).items()):
        names = [f'{image_id + k:012d}.png' for k in range(count)]
        out[split] = write_instance_split(
            root / split,
            root / 'annotations' / f'instances_{split}.json',
            classes,
            list(range(1, len(classes) + 1)),
            names,
            image_size,
            seed + i,
            max_objects,
            first_image_id=image_id,
        )
        image_id += count
    return out


def make_cityscapes_instances(
    root: Union[str, Path],
    splits: Splits = (('train', 2), ('val', 1)),
    image_size: Tuple[int, int] = (2048, 1024),
    seed: int = 0,
    max_objects: int = 3,
    city: str = 'synthcity',
) -> Dict[str, Path]:
    """A Cityscapes instance dataset in mmdet's layout (converted COCO json) under ``root``.

    Args:
        root: dataset root (``data_root`` of an mmdet Cityscapes config).
        splits: ``{split: number of images}``; images go to
            ``root/leftImg8bit/<split>/<city>/`` and the json to
            ``root/annotations/instancesonly_filtered_gtFine_<split>.json``.
            Default: ``{'train': 2, 'val': 1}``.
        image_size: ``(width, height)``. Default: ``(2048, 1024)``, the Cityscapes size.
        seed: base seed. Default: 0.
        max_objects: instances per image, at most. Default: 3.
        city: the city folder / file-name prefix. Default: ``'synthcity'``.

    Returns:
        ``{split: annotation json path}``.
    """
    root = Path(root)
    out = {}
    image_id = 1
    for i, (split, count) in enumerate(dict(splits).items()):
        names = [f'{city}/{city}_{k:06d}_{19:06d}_leftImg8bit.png' for k in range(count)]
        out[split] = write_instance_split(
            root / 'leftImg8bit' / split,
            root / 'annotations' / f'instancesonly_filtered_gtFine_{split}.json',
            CITYSCAPES_THING_CLASSES,
            CITYSCAPES_THING_IDS,
            names,
            image_size,
            seed + i,
            max_objects,
            first_image_id=image_id,
        )
        image_id += count
    return out
