"""Tiny, learnable segmentation datasets in the real ADE20K and Cityscapes folder layouts.

The images are procedurally drawn scenes (sky / wall above a horizon, ground below,
objects on top). Every class has its own colour and texture (bricks, planks, leaves,
grass blades, gradients, ...) and its own typical shape and place, so a segmenter can
learn it from local appearance plus context in a few hundred CPU iterations — the
demo's mIoU then means something. ``person`` and ``car`` (ADE20K layout) share one
random colour per image and differ only by shape, so part of the task needs context
beyond one 16x16 patch.

The files are exactly what mmseg's ``ADE20KDataset`` / ``CityscapesDataset`` read::

    <root>/ade/ADEChallengeData2016/images/{training,validation}/ADE_{train,val}_%08d.jpg
    <root>/ade/ADEChallengeData2016/annotations/{training,validation}/ADE_..._%08d.png
        uint8, 0 = "other" (ignored with reduce_zero_label=True), k = ADE class k-1
    <root>/cityscapes/leftImg8bit/{train,val}/<city>/<city>_%06d_%06d_leftImg8bit.png
    <root>/cityscapes/gtFine/{train,val}/<city>/<city>_%06d_%06d_gtFine_labelTrainIds.png
        uint8 train ids 0..18, 255 = ignore (the ego-vehicle hood)

Command line: ``python -m research.datasets.synthetic_seg --out data`` (see ``--help``).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

import cv2
import numpy as np

__all__ = [
    'ADE_CLASSES',
    'CITYSCAPES_CLASSES',
    'make_ade20k_like',
    'make_cityscapes_like',
    'ade_scene',
    'cityscapes_scene',
    'main',
]

#: ADE20K class indices (0-based, as in ``ADE20KDataset.METAINFO``) the scenes use.
ADE_CLASSES: Dict[str, int] = {
    'wall': 0,
    'building': 1,
    'sky': 2,
    'floor': 3,
    'tree': 4,
    'road': 6,
    'grass': 9,
    'person': 12,
    'car': 20,
    'painting': 22,
}
#: Cityscapes train ids the scenes use.
CITYSCAPES_CLASSES: Dict[str, int] = {
    'road': 0,
    'sidewalk': 1,
    'building': 2,
    'pole': 5,
    'traffic light': 6,
    'traffic sign': 7,
    'vegetation': 8,
    'sky': 10,
    'person': 11,
    'car': 13,
}

Rng = np.random.Generator


# ----------------------------------------------------------------------------------------
# Textures: (h, w, 3) float32 RGB images in 0..255
# ----------------------------------------------------------------------------------------
def _jitter(rgb: Sequence[int], rng: Rng, amount: int = 18) -> np.ndarray:
    return np.clip(np.asarray(rgb, np.float32) + rng.integers(-amount, amount + 1, 3), 0, 255)


def _noise(h: int, w: int, rng: Rng, sigma: float) -> np.ndarray:
    return rng.normal(0.0, sigma, (h, w, 1)).astype(np.float32)


def _blobs(h: int, w: int, rng: Rng, cell: int) -> np.ndarray:
    """Smooth random field in [-1, 1] with features of about ``cell`` px."""
    small = rng.uniform(-1, 1, (max(2, h // cell + 2), max(2, w // cell + 2))).astype(np.float32)
    return cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)[..., None].clip(-1, 1)


def _tex_flat(h, w, rgb, rng):
    return _jitter(rgb, rng) + _noise(h, w, rng, 6)


def _tex_gradient(h, w, rgb, rng):
    top = _jitter(rgb, rng)
    ramp = np.linspace(0, 1, h, dtype=np.float32)[:, None, None]
    return top * (1 - 0.35 * ramp) + 255 * 0.35 * ramp + _noise(h, w, rng, 3)


def _tex_bricks(h, w, rgb, rng):
    img = np.repeat(np.repeat(_jitter(rgb, rng)[None, None], h, 0), w, 1)
    bh, bw = int(rng.integers(7, 10)), int(rng.integers(14, 20))
    ys, xs = np.mgrid[0:h, 0:w]
    row = ys // bh
    mortar = (ys % bh == 0) | (((xs + (row % 2) * bw // 2) % bw) == 0)
    img[mortar] = 215
    return img + _noise(h, w, rng, 8)


def _tex_planks(h, w, rgb, rng):
    base = _jitter(rgb, rng)
    period = int(rng.integers(9, 14))
    ys = np.arange(h)[:, None, None]
    shade = 1.0 - 0.25 * ((ys % period) < 2)
    grain = 1.0 + 0.08 * np.sin(np.arange(w)[None, :, None] / 3.0 + rng.uniform(0, 6))
    return base * shade * grain + _noise(h, w, rng, 5)


def _tex_leaves(h, w, rgb, rng):
    return _jitter(rgb, rng) * (1.0 + 0.45 * _blobs(h, w, rng, 5)) + _noise(h, w, rng, 8)


def _tex_blades(h, w, rgb, rng):
    stripes = np.sin(np.arange(w, dtype=np.float32) * rng.uniform(1.2, 1.8))[None, :, None]
    return _jitter(rgb, rng) * (1.0 + 0.18 * stripes) + _noise(h, w, rng, 10)


def _tex_asphalt(h, w, rgb, rng):
    return _jitter(rgb, rng, 8) + _noise(h, w, rng, 14)


def _tex_checker(h, w, rgb, rng):
    cell = int(rng.integers(6, 10))
    ys, xs = np.mgrid[0:h, 0:w]
    check = ((ys // cell + xs // cell) % 2 == 0)[..., None]
    other = 255 - _jitter(rgb, rng)
    return np.where(check, _jitter(rgb, rng), other) + _noise(h, w, rng, 4)


def _tex_vivid(h, w, rgb, rng):  # ``rgb`` is ignored: one random saturated colour
    hsv = np.uint8([[[rng.integers(0, 180), rng.integers(170, 256), rng.integers(150, 240)]]])
    colour = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)[0, 0].astype(np.float32)
    return colour * (1.0 + 0.1 * _blobs(h, w, rng, 12)) + _noise(h, w, rng, 5)


def _tex_metal(h, w, rgb, rng):
    ramp = np.linspace(-1, 1, w, dtype=np.float32)[None, :, None]
    return _jitter(rgb, rng) * (1.0 + 0.25 * ramp) + _noise(h, w, rng, 3)


Texture = Callable[[int, int, Sequence[int], Rng], np.ndarray]


@dataclass(frozen=True)
class _Look:
    rgb: Tuple[int, int, int]
    texture: Texture


_ADE_LOOKS: Dict[str, _Look] = {
    'wall': _Look((205, 195, 170), _tex_flat),
    'building': _Look((150, 75, 55), _tex_bricks),
    'sky': _Look((110, 165, 235), _tex_gradient),
    'floor': _Look((165, 110, 60), _tex_planks),
    'tree': _Look((35, 100, 40), _tex_leaves),
    'road': _Look((85, 85, 90), _tex_asphalt),
    'grass': _Look((105, 175, 60), _tex_blades),
    'person': _Look((0, 0, 0), _tex_vivid),
    'car': _Look((0, 0, 0), _tex_vivid),
    'painting': _Look((230, 200, 40), _tex_checker),
}
_CITY_LOOKS: Dict[str, _Look] = {
    'road': _Look((90, 85, 95), _tex_asphalt),
    'sidewalk': _Look((200, 170, 190), _tex_bricks),
    'building': _Look((120, 110, 100), _tex_bricks),
    'pole': _Look((150, 150, 150), _tex_metal),
    'traffic light': _Look((40, 230, 200), _tex_flat),
    'traffic sign': _Look((230, 210, 30), _tex_flat),
    'vegetation': _Look((60, 130, 40), _tex_leaves),
    'sky': _Look((100, 150, 215), _tex_gradient),
    'person': _Look((200, 40, 80), _tex_flat),
    'car': _Look((20, 40, 140), _tex_metal),
}


class _Canvas:
    """An image and its label map, painted region by region."""

    def __init__(
        self,
        h: int,
        w: int,
        looks: Dict[str, _Look],
        ids: Dict[str, int],
        rng: Rng,
        background: int,
    ):
        self.h, self.w, self.looks, self.ids, self.rng = h, w, looks, ids, rng
        self.img = np.zeros((h, w, 3), np.float32)
        self.label = np.full((h, w), background, np.uint8)
        self._tex: Dict[str, np.ndarray] = {}

    def texture(self, name: str) -> np.ndarray:
        if name not in self._tex:  # one texture per class and image: objects match
            look = self.looks[name]
            self._tex[name] = look.texture(self.h, self.w, look.rgb, self.rng)
        return self._tex[name]

    def paint(
        self, mask: np.ndarray, name: str, label: int = None, texture: np.ndarray = None
    ) -> None:
        mask = mask.astype(bool)
        self.img[mask] = (self.texture(name) if texture is None else texture)[mask]
        self.label[mask] = self.ids[name] if label is None else label

    def empty(self) -> np.ndarray:
        return np.zeros((self.h, self.w), np.uint8)

    def result(self) -> Tuple[np.ndarray, np.ndarray]:
        return np.clip(self.img, 0, 255).astype(np.uint8), self.label


def _rect(canvas: _Canvas, x0: float, y0: float, x1: float, y1: float) -> np.ndarray:
    m = canvas.empty()
    cv2.rectangle(m, (int(x0), int(y0)), (int(x1), int(y1)), 1, -1)
    return m


def _ellipse(canvas: _Canvas, cx: float, cy: float, ax: float, ay: float) -> np.ndarray:
    m = canvas.empty()
    cv2.ellipse(m, (int(cx), int(cy)), (max(1, int(ax)), max(1, int(ay))), 0, 0, 360, 1, -1)
    return m


def _poly(canvas: _Canvas, pts: Sequence[Tuple[float, float]]) -> np.ndarray:
    m = canvas.empty()
    cv2.fillPoly(m, [np.asarray(pts, np.int32)], 1)
    return m


def _person(c: _Canvas, x: float, foot: float, height: float) -> np.ndarray:
    w = height * 0.28
    body = _ellipse(c, x, foot - height * 0.45, w / 2, height * 0.36)
    head = _ellipse(c, x, foot - height * 0.88, w * 0.35, w * 0.35)
    return body | head


def _car(c: _Canvas, x: float, bottom: float, width: float) -> Tuple[np.ndarray, np.ndarray]:
    """Car body mask and its (darker) wheels' mask."""
    h = width * 0.38
    body = _rect(c, x - width / 2, bottom - h * 0.75, x + width / 2, bottom - h * 0.2)
    cabin = _poly(
        c,
        [
            (x - width * 0.3, bottom - h * 0.75),
            (x - width * 0.18, bottom - h),
            (x + width * 0.2, bottom - h),
            (x + width * 0.32, bottom - h * 0.75),
        ],
    )
    wheels = _ellipse(c, x - width * 0.3, bottom - h * 0.2, h * 0.2, h * 0.2) | _ellipse(
        c, x + width * 0.3, bottom - h * 0.2, h * 0.2, h * 0.2
    )
    return body | cabin | wheels, wheels


def ade_scene(height: int, width: int, rng: Rng) -> Tuple[np.ndarray, np.ndarray]:
    """One ADE20K-style scene: RGB ``(H, W, 3)`` uint8 and annotation ``(H, W)`` uint8 in
    the file convention (0 = other, class k stored as k + 1)."""
    ids = {k: v + 1 for k, v in ADE_CLASSES.items()}
    c = _Canvas(height, width, _ADE_LOOKS, ids, rng, background=0)
    h, w = height, width
    horizon = rng.uniform(0.35, 0.6) * h
    indoor = rng.random() < 0.4
    c.paint(_rect(c, 0, 0, w, horizon), 'wall' if indoor else 'sky')
    if indoor:
        c.paint(_rect(c, 0, horizon, w, h), 'floor')
        for _ in range(int(rng.integers(1, 3))):  # paintings on the wall
            pw, ph = rng.uniform(0.12, 0.25) * w, rng.uniform(0.12, 0.25) * h
            px, py = rng.uniform(0, w - pw), rng.uniform(0.05 * h, max(0.06 * h, horizon - ph))
            c.paint(_rect(c, px, py, px + pw, py + ph), 'painting')
    else:
        ground = 'grass' if rng.random() < 0.5 else 'road'
        c.paint(_rect(c, 0, horizon, w, h), ground)
        if ground == 'grass' and rng.random() < 0.6:  # a road across the grass
            y0 = rng.uniform(horizon, h * 0.85)
            c.paint(
                _poly(
                    c,
                    [
                        (0, y0),
                        (w, y0 - rng.uniform(-0.1, 0.1) * h),
                        (w, y0 + 0.15 * h),
                        (0, y0 + 0.15 * h),
                    ],
                ),
                'road',
            )
        x = 0.0
        while x < w:  # skyline of buildings and trees standing on the horizon
            bw = rng.uniform(0.15, 0.35) * w
            if rng.random() < 0.45:
                bh = rng.uniform(0.15, 0.35) * h
                c.paint(_rect(c, x, horizon - bh, x + bw, horizon + 1), 'building')
            elif rng.random() < 0.6:
                r = bw * 0.4
                c.paint(_ellipse(c, x + bw / 2, horizon - r * 0.9, r, r * 1.1), 'tree')
            x += bw
    # people and cars: same random colour, told apart by shape
    vivid = _tex_vivid(h, w, (0, 0, 0), rng)
    for _ in range(int(rng.integers(1, 4))):
        foot = rng.uniform(horizon + 0.15 * h, h)
        scale = (foot - horizon) / (h - horizon + 1e-6)
        px = rng.uniform(0.05, 0.95) * w
        if rng.random() < 0.5:
            c.paint(_person(c, px, foot, (0.25 + 0.35 * scale) * h), 'person', texture=vivid)
        else:
            body, wheels = _car(c, px, foot, (0.25 + 0.3 * scale) * w)
            c.paint(body, 'car', texture=vivid)
            c.paint(wheels, 'car', texture=np.full_like(vivid, 30.0))
    if rng.random() < 0.5:  # an unlabelled ("other") grey blob, ignored in training
        r = rng.uniform(0.04, 0.08) * min(h, w)
        c.paint(
            _ellipse(c, rng.uniform(0, w), rng.uniform(horizon, h), r, r * 0.7),
            'road',
            label=0,
            texture=np.full_like(vivid, 128.0) + _noise(h, w, rng, 20),
        )
    return c.result()


#: the side of a small object (:func:`cityscapes_scene`'s ``small_objects``) in pixels,
#: whatever the frame size
SMALL_OBJECT_PX = (12, 28)


def cityscapes_scene(
    height: int, width: int, rng: Rng, small_objects: float = 0.0
) -> Tuple[np.ndarray, np.ndarray]:
    """One Cityscapes-style street scene: RGB ``(H, W, 3)`` uint8 and train ids ``(H, W)``
    uint8 (255 = ignore).

    Everything is drawn in proportion to the frame (a larger frame shows the same kind of
    street larger), except ``small_objects``: that many traffic lights per 256x512 pixels
    (``round(small_objects * H * W / (256 * 512))`` of them), upright boxes
    :data:`SMALL_OBJECT_PX` wide and 1.6x as tall *in pixels* at every frame size, above
    the road -- detail that a lower resolution loses. Default: 0 (none; the scene and the
    generator's draws are those of the scene without them).
    """
    if not (np.isfinite(small_objects) and small_objects >= 0):
        raise ValueError(f'cityscapes_scene: small_objects={small_objects!r} is not >= 0')
    c = _Canvas(height, width, _CITY_LOOKS, CITYSCAPES_CLASSES, rng, background=255)
    h, w = height, width
    horizon = rng.uniform(0.4, 0.55) * h
    vx = rng.uniform(0.35, 0.65) * w  # vanishing point
    c.paint(_rect(c, 0, 0, w, h), 'sky')
    x = 0.0
    while x < w:  # facades
        bw = rng.uniform(0.08, 0.2) * w
        top = rng.uniform(0.02, 0.3) * h
        name = 'vegetation' if rng.random() < 0.25 else 'building'
        if name == 'vegetation':
            c.paint(_ellipse(c, x + bw / 2, horizon - bw * 0.4, bw * 0.7, bw * 0.6), name)
        else:
            c.paint(_rect(c, x, top, x + bw, horizon + 1), name)
        x += bw
    c.paint(_rect(c, 0, horizon, w, h), 'sidewalk')
    spread = rng.uniform(0.35, 0.5) * w
    c.paint(
        _poly(
            c,
            [(vx - 2, horizon), (vx + 2, horizon), (vx + spread * 1.6, h), (vx - spread * 1.6, h)],
        ),
        'road',
    )
    for _ in range(int(rng.integers(1, 3))):  # poles with a sign
        px = rng.choice([rng.uniform(0.02, 0.25), rng.uniform(0.75, 0.98)]) * w
        foot = rng.uniform(horizon + 0.1 * h, h * 0.9)
        ph = (foot - horizon) * 3.0 + 0.1 * h
        pw = max(2.0, 0.012 * w * (1 + (foot - horizon) / h * 3))
        c.paint(_rect(c, px - pw / 2, foot - ph, px + pw / 2, foot), 'pole')
        s = pw * 4
        c.paint(_rect(c, px - s / 2, foot - ph, px + s / 2, foot - ph + s), 'traffic sign')
    for _ in range(int(rng.integers(1, 4))):  # cars on the road
        bottom = rng.uniform(horizon + 0.12 * h, h * 0.95)
        depth = (bottom - horizon) / (h - horizon)
        cx = vx + rng.uniform(-0.8, 0.8) * spread * 1.2 * depth
        body, _ = _car(c, cx, bottom, (0.08 + 0.25 * depth) * w)
        c.paint(body, 'car')
    for _ in range(int(rng.integers(1, 4))):  # people on the sidewalk
        foot = rng.uniform(horizon + 0.1 * h, h * 0.95)
        depth = (foot - horizon) / (h - horizon)
        px = rng.choice([rng.uniform(0.0, 0.2), rng.uniform(0.8, 1.0)]) * w
        c.paint(_person(c, px, foot, (0.15 + 0.45 * depth) * h), 'person')
    for _ in range(int(round(small_objects * h * w / (256 * 512)))):  # fixed pixel size
        side = rng.uniform(*SMALL_OBJECT_PX)
        x0 = rng.uniform(0, w - side)
        y0 = rng.uniform(0.05 * h, horizon)
        c.paint(_rect(c, x0, y0, x0 + side, y0 + 1.6 * side), 'traffic light')
    hood = _ellipse(c, w / 2, h * 1.05, w * 0.6, h * 0.12)  # ego vehicle: ignored
    c.paint(hood, 'car', label=255, texture=np.full((h, w, 3), 40.0, np.float32))
    return c.result()


# ----------------------------------------------------------------------------------------
# Writers
# ----------------------------------------------------------------------------------------
def _write_rgb(path: Path, rgb: np.ndarray, jpeg: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    params = [cv2.IMWRITE_JPEG_QUALITY, 95] if jpeg else []
    if not cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), params):
        raise OSError(f'could not write {path}')


def _write_label(path: Path, label: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(path), label):
        raise OSError(f'could not write {path}')


def make_ade20k_like(
    root: str | Path,
    num_train: int = 96,
    num_val: int = 16,
    short_side: Tuple[int, int] = (160, 208),
    seed: int = 0,
) -> Path:
    """Write a tiny dataset in mmseg's ADE20K layout under ``root``.

    Args:
        root: folder that gets ``ade/ADEChallengeData2016/...`` (like mmseg's ``data/``).
        num_train: training images. Default: 96.
        num_val: validation images. Default: 16.
        short_side: range of the images' short side in px (aspect 1 to 1.5, landscape
            or portrait). Default: (160, 208).
        seed: random seed; the same seed writes the same files. Default: 0.

    Returns:
        The dataset root (``root/ade/ADEChallengeData2016``), the config's ``data_root``.
    """
    data_root = Path(root) / 'ade' / 'ADEChallengeData2016'
    for split, prefix, n, offset in (
        ('training', 'ADE_train', num_train, 0),
        ('validation', 'ADE_val', num_val, 1_000_000),
    ):
        for i in range(n):
            rng = np.random.default_rng([seed, offset + i])
            s = int(rng.integers(short_side[0], short_side[1] + 1))
            l = int(s * rng.uniform(1.0, 1.5))
            hh, ww = (s, l) if rng.random() < 0.75 else (l, s)
            img, ann = ade_scene(hh, ww, rng)
            name = f'{prefix}_{i + 1:08d}'
            _write_rgb(data_root / 'images' / split / f'{name}.jpg', img, jpeg=True)
            _write_label(data_root / 'annotations' / split / f'{name}.png', ann)
    return data_root


def make_cityscapes_like(
    root: str | Path,
    num_train: int = 48,
    num_val: int = 8,
    size: Tuple[int, int] = (128, 256),
    seed: int = 0,
) -> Path:
    """Write a tiny dataset in mmseg's Cityscapes layout under ``root``.

    Args:
        root: folder that gets ``cityscapes/{leftImg8bit,gtFine}/...``.
        num_train: training frames (city ``synthtown``). Default: 48.
        num_val: validation frames (city ``synthville``). Default: 8.
        size: ``(H, W)`` of every frame; Cityscapes is 1024x2048, the default is 1/8 of
            it. Default: (128, 256).
        seed: random seed. Default: 0.

    Returns:
        The dataset root (``root/cityscapes``).
    """
    data_root = Path(root) / 'cityscapes'
    for split, city, n, offset in (
        ('train', 'synthtown', num_train, 0),
        ('val', 'synthville', num_val, 1_000_000),
    ):
        for i in range(n):
            rng = np.random.default_rng([seed + 7, offset + i])
            img, ids = cityscapes_scene(size[0], size[1], rng)
            stem = f'{city}_{i // 30:06d}_{(i % 30) * 19 + 19:06d}'
            _write_rgb(data_root / 'leftImg8bit' / split / city / f'{stem}_leftImg8bit.png', img)
            _write_label(
                data_root / 'gtFine' / split / city / f'{stem}_gtFine_labelTrainIds.png', ids
            )
    return data_root


def main(argv: List[str] = None) -> None:
    """Command line: write the tiny datasets."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--out', default='data', help='folder that receives ade/ and cityscapes/ (default: data)'
    )
    parser.add_argument(
        '--datasets',
        nargs='+',
        choices=['ade20k', 'cityscapes'],
        default=['ade20k', 'cityscapes'],
        help='which layouts to write',
    )
    parser.add_argument(
        '--num-train',
        type=int,
        default=None,
        help='training images per dataset (default: 96 ADE20K, 48 Cityscapes)',
    )
    parser.add_argument(
        '--num-val',
        type=int,
        default=None,
        help='validation images per dataset (default: 16 ADE20K, 8 Cityscapes)',
    )
    parser.add_argument('--seed', type=int, default=0, help='random seed (default: 0)')
    args = parser.parse_args(argv)
    kw = {
        k: v
        for k, v in (('num_train', args.num_train), ('num_val', args.num_val))
        if v is not None
    }
    if 'ade20k' in args.datasets:
        print(f'ADE20K layout:     {make_ade20k_like(args.out, seed=args.seed, **kw)}')
    if 'cityscapes' in args.datasets:
        print(f'Cityscapes layout: {make_cityscapes_like(args.out, seed=args.seed, **kw)}')


if __name__ == '__main__':
    main()
