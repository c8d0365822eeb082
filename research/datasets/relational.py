"""A procedurally generated segmentation task where a pixel's class is a *relation*.

Every image shows one white square, the **anchor**, and a few coloured rectangles and discs
on a noisy grey background. Each object lies entirely in one quadrant around the anchor's
centre, and its class says which one:

=====  ==============  =================================================================
label  class           pixels of ...
=====  ==============  =================================================================
0      ``background``  the background
1      ``anchor``      the white square
2      ``up-left``     an object above and to the left of the anchor's centre
3      ``up-right``    an object above and to the right
4      ``down-left``   an object below and to the left
5      ``down-right``  an object below and to the right
=====  ==============  =================================================================

Object colours are drawn from one palette whatever the quadrant, so a patch's own colour
says nothing about classes 2-5: a model must find the anchor, possibly far away, and know
in which *direction* it lies. Position and context matter; local colour does not suffice.

Scenes live in continuous image coordinates (``[0, 1]^2``, y down), so the *same* scene
can be rendered natively at any size: the validation scenes are written once per scale of
the extrapolation ladder (``val_x1``, ``val_x1.5``, ...), sharp at every size (no resize
blur), with labels at that size. Images and labels are PNG files in mmseg's layout::

    ROOT/img_dir/train/00000.png   ROOT/ann_dir/train/00000.png
    ROOT/img_dir/val_x2/00000.png  ROOT/ann_dir/val_x2/00000.png
    ROOT/meta.json                 the settings that made the folder

so mmseg's ``BaseSegDataset`` (``img_suffix='.png'``, ``seg_map_suffix='.png'``,
``metainfo=dict(classes=CLASSES, palette=PALETTE)``) and its pipelines read them.

*Native aspect* (``aspect_ratios``, empty by default): the training and ``val_x*`` scenes
are square; with aspect ratios ``(r1, r2, ...)`` (width / height) other validation scenes
are drawn for those aspects (scene ``i`` has ``r[i % len(r)]``, squares stay square in
pixels) and rendered with their *longer* side ``scale`` times the training side, the
shorter side following the aspect (``val_aspect_x{scale}``, :func:`aspect_size`): the
study's native-aspect rows, as ImageNet-Val tested at its own aspect ratios.
No OpenMMLab imports here (numpy + Pillow).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from lookhere_dense.validation import check_int
from lookhere_dense.validation import settings_from_dict as _from_dict

from .folders import ensure_dataset, write_dataset, write_png

__all__ = [
    'CLASSES',
    'PALETTE',
    'RelationalSettings',
    'Scene',
    'sample_scene',
    'render_scene',
    'split_name',
    'aspect_split_name',
    'aspect_size',
    'write_relational_dataset',
    'ensure_relational_dataset',
    'settings_from_dict',
    'save_examples',
]

CLASSES = ('background', 'anchor', 'up-left', 'up-right', 'down-left', 'down-right')
PALETTE = [[0, 0, 0], [255, 255, 255], [230, 25, 75], [60, 180, 75], [0, 130, 200], [245, 130, 48]]
#: RGB colours of the non-anchor objects (no white, no grey): the same for every quadrant.
OBJECT_COLOURS = (
    (220, 40, 40),
    (40, 200, 60),
    (50, 90, 230),
    (240, 220, 40),
    (40, 210, 220),
    (210, 60, 210),
)
ANCHOR_COLOUR = (255, 255, 255)
FORMAT_VERSION = 1


@dataclass(frozen=True)
class RelationalSettings:
    """What a relational dataset folder holds (stored as ``meta.json``).

    Args:
        num_train: training images. Default: 4000.
        num_val: validation scenes (each rendered at every scale). Default: 200.
        train_size: ``(H, W)`` of the training images in pixels. Default: ``(64, 64)``.
        scales: validation sizes as multiples of ``train_size``. Default: 1, 1.5, 2, 3, 4.
        seed: seed of the scene generator (train and val use disjoint streams). Default: 0.
        objects: ``(min, max)`` non-anchor objects per scene. Default: ``(3, 6)``.
        anchor_side: ``(min, max)`` anchor side as a fraction of the image. Default:
            ``(0.12, 0.18)``.
        object_half: ``(min, max)`` half extent of an object (fraction). Default:
            ``(0.04, 0.11)``.
        noise_std: std of the Gaussian pixel noise (0-255 scale). Default: 6.
        aspect_ratios: width / height of the native-aspect validation scenes (each
            rendered at every scale, ``val_aspect_x{scale}``); empty: none. Default: ``()``.
        size_multiple: every image side is a multiple of this (set it to the model's patch
            size so that no test image is padded to whole patches, which would stretch the
            prediction over the padding): square sizes must be multiples already (an
            error names the scale otherwise), native-aspect shorter sides are rounded to
            the nearest multiple (so a 3:4 scene of long side 48 px is 48x40 with 8, not
            48x36). Sides below one multiple are an error. Default: 1.
    """

    num_train: int = 4000
    num_val: int = 200
    train_size: Tuple[int, int] = (64, 64)
    scales: Tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0)
    seed: int = 0
    objects: Tuple[int, int] = (3, 6)
    anchor_side: Tuple[float, float] = (0.12, 0.18)
    object_half: Tuple[float, float] = (0.04, 0.11)
    noise_std: float = 6.0
    aspect_ratios: Tuple[float, ...] = ()
    size_multiple: int = 1

    def __post_init__(self):
        for name in (
            'train_size',
            'scales',
            'objects',
            'anchor_side',
            'object_half',
            'aspect_ratios',
        ):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, 'scales', tuple(float(s) for s in self.scales))
        object.__setattr__(self, 'aspect_ratios', tuple(float(r) for r in self.aspect_ratios))
        if self.num_train < 1 or self.num_val < 1:
            raise ValueError(
                f'num_train and num_val must be >= 1, got {self.num_train}, {self.num_val}'
            )
        if len(self.train_size) != 2 or min(self.train_size) < 8:
            raise ValueError(f'train_size must be (H, W) >= 8 px, got {self.train_size}')
        if not self.scales or min(self.scales) <= 0:
            raise ValueError(f'scales must be positive, got {self.scales}')
        small = [s for s in self.scales if min(self.size_at(s)) < 4]
        if small:
            raise ValueError(
                f'scales {small} render {self.train_size} images below 4 px a '
                'side; use larger scales'
            )
        if any(not 0.1 <= r <= 10 for r in self.aspect_ratios):
            raise ValueError(
                f'aspect_ratios (width / height) must lie in [0.1, 10], got {self.aspect_ratios}'
            )
        m = self.size_multiple
        check_int('size_multiple', m, description='an int >= 1')
        for scale in self.scales:
            size = self.size_at(scale)
            if min(size) < m or size[0] % m or size[1] % m:
                raise ValueError(
                    f'scale {scale:g} renders {size[0]}x{size[1]} px images, not '
                    f'whole multiples of size_multiple={m} (the patch size); '
                    'choose scales whose sizes are'
                )
            for aspect in self.aspect_ratios:
                long_side = int(round(max(self.train_size) * scale))
                if long_side * min(aspect, 1.0 / aspect) < m / 2:
                    raise ValueError(
                        f'scale {scale:g} at aspect {aspect:g} has a shorter side of '
                        f'{long_side * min(aspect, 1.0 / aspect):.1f} px, below one '
                        f'size_multiple={m} (the patch size)'
                    )
        if not 1 <= self.objects[0] <= self.objects[1]:
            raise ValueError(
                f'objects must be (min, max) with 1 <= min <= max, got {self.objects}'
            )

    def size_at(self, scale: float) -> Tuple[int, int]:
        """Image ``(H, W)`` at ``scale`` (rounded to whole pixels)."""
        return (int(round(self.train_size[0] * scale)), int(round(self.train_size[1] * scale)))

    def to_json(self) -> Dict[str, Any]:
        """A JSON-able dict (tuples as lists) with the format version; without
        ``aspect_ratios`` when there are none (so folders written before the option
        existed still match)."""
        d = asdict(self)
        d = {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}
        if not self.aspect_ratios:
            d.pop('aspect_ratios')
        if self.size_multiple == 1:
            d.pop('size_multiple')
        d['format_version'] = FORMAT_VERSION
        return d


@dataclass
class Scene:
    """One scene in image coordinates (``[0, 1]``, y down, x right).

    Attributes:
        anchor: ``(cy, cx, half_h, half_w)`` of the white square.
        objects: ``(shape, cy, cx, half_h, half_w, rgb, label)`` with ``shape`` in
            ``('rect', 'disc')``.
        background: grey level of the background (0-255).
        noise_seed: seed of the pixel noise (combined with the render size).
    """

    anchor: Tuple[float, float, float, float]
    objects: List[Tuple[str, float, float, float, float, Tuple[int, int, int], int]] = field(
        default_factory=list
    )
    background: int = 50
    noise_seed: int = 0


def _quadrant_label(up: bool, left: bool) -> int:
    return 2 + 2 * int(not up) + int(not left)


def sample_scene(
    rng: np.random.Generator,
    settings: RelationalSettings,
    max_tries: int = 50,
    aspect: Optional[float] = None,
) -> Scene:
    """Draw one scene: an anchor, then objects each inside one quadrant around the anchor's
    centre, not touching the anchor (rejection sampling; an object that does not fit in
    ``max_tries`` is skipped, so a scene may have fewer than ``objects[0]`` objects).

    Aspect: sides are fractions of the image *height* in y and of the *width* in x, scaled
    by the aspect so squares stay square on non-square images.

    Args:
        aspect: width / height of the image the scene is for (a native-aspect scene);
            its sizes are fractions of the image's *longer* side, so that its shapes are
            as large in pixels as in the square image of that side. Default: None (the
            aspect of ``settings.train_size``, sizes fractions of the height).
    """
    h, w = settings.train_size
    if aspect is None:  # y / x extents are multiplied by these so shapes keep their aspect
        ky, kx = 1.0, h / w
    else:
        ky, kx = (float(aspect), 1.0) if aspect >= 1 else (1.0, 1.0 / aspect)
    side = rng.uniform(*settings.anchor_side)
    a_hh, a_hw = side / 2 * ky, side / 2 * kx
    acy, acx = rng.uniform(0.25, 0.75), rng.uniform(0.25, 0.75)
    scene = Scene(
        (acy, acx, a_hh, a_hw), [], int(rng.integers(15, 90)), int(rng.integers(0, 2**31 - 1))
    )
    margin = 0.02
    n = int(rng.integers(settings.objects[0], settings.objects[1] + 1))
    for _ in range(n):
        up, left = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
        shape = 'rect' if rng.random() < 0.5 else 'disc'
        colour = OBJECT_COLOURS[int(rng.integers(0, len(OBJECT_COLOURS)))]
        for _ in range(max_tries):
            half = rng.uniform(*settings.object_half)
            hh = half * ky
            hw = (half if shape == 'disc' else rng.uniform(*settings.object_half)) * kx
            # the quadrant, shrunk by the object's extent and a margin
            y0, y1 = (hh, acy - margin - hh) if up else (acy + margin + hh, 1 - hh)
            x0, x1 = (hw, acx - margin - hw) if left else (acx + margin + hw, 1 - hw)
            if y1 <= y0 or x1 <= x0:
                continue
            cy, cx = rng.uniform(y0, y1), rng.uniform(x0, x1)
            clear_y = abs(cy - acy) >= hh + a_hh + margin
            clear_x = abs(cx - acx) >= hw + a_hw + margin
            if clear_y or clear_x:  # the object's box does not touch the anchor's
                scene.objects.append((shape, cy, cx, hh, hw, colour, _quadrant_label(up, left)))
                break
    return scene


def render_scene(
    scene: Scene, size: Tuple[int, int], noise_std: float = 6.0
) -> Tuple[np.ndarray, np.ndarray]:
    """Render ``scene`` at ``size = (H, W)`` pixels.

    A pixel belongs to a shape when its centre ``((i + .5) / H, (j + .5) / W)`` does.
    Later objects are drawn over earlier ones (they may overlap only within one quadrant,
    so the label of a pixel never depends on the order); the anchor is drawn last.

    Returns:
        ``(image, label)``: ``(H, W, 3)`` uint8 RGB and ``(H, W)`` uint8 class indexes.
    """
    height, width = size
    yy = ((np.arange(height) + 0.5) / height)[:, None]
    xx = ((np.arange(width) + 0.5) / width)[None, :]
    image = np.empty((height, width, 3), dtype=np.float32)
    image[:] = scene.background
    label = np.zeros((height, width), dtype=np.uint8)

    def paint(mask: np.ndarray, rgb: Sequence[int], cls: int) -> None:
        image[mask] = rgb
        label[mask] = cls

    for shape, cy, cx, hh, hw, rgb, cls in scene.objects:
        dy, dx = (yy - cy) / hh, (xx - cx) / hw
        if shape == 'rect':
            mask = (np.abs(dy) <= 1) & (np.abs(dx) <= 1)
        else:
            mask = dy * dy + dx * dx <= 1
        paint(mask, rgb, cls)
    acy, acx, a_hh, a_hw = scene.anchor
    paint((np.abs(yy - acy) <= a_hh) & (np.abs(xx - acx) <= a_hw), ANCHOR_COLOUR, 1)
    if noise_std > 0:
        noise_rng = np.random.default_rng([scene.noise_seed, height, width])
        image += noise_rng.normal(0.0, noise_std, image.shape).astype(np.float32)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), label


def split_name(scale: float) -> str:
    """Validation split folder of a scale: ``1 -> 'val_x1'``, ``1.5 -> 'val_x1.5'``."""
    return f'val_x{float(scale):g}'


def aspect_split_name(scale: float) -> str:
    """Native-aspect validation split of a scale: ``1 -> 'val_aspect_x1'``."""
    return f'val_aspect_x{float(scale):g}'


def aspect_size(settings: RelationalSettings, scale: float, aspect: float) -> Tuple[int, int]:
    """``(H, W)`` of a native-aspect image: the longer side ``scale`` times the longer
    training side, the shorter one ``aspect`` (width / height) times shorter, rounded to the
    nearest multiple of ``settings.size_multiple`` (halves up; at least one multiple)."""
    m = settings.size_multiple
    long_side = int(round(max(settings.train_size) * scale))
    short_side = max(1, int(math.floor(long_side * min(aspect, 1.0 / aspect) / m + 0.5))) * m
    return (short_side, long_side) if aspect >= 1 else (long_side, short_side)


def write_relational_dataset(
    root: str, settings: RelationalSettings = RelationalSettings(), progress: bool = False
) -> Dict[str, Any]:
    """(Re)write the dataset folder ``root`` for ``settings`` (see the module docstring;
    written by :func:`research.datasets.folders.write_dataset`).

    Train scenes come from ``default_rng([seed, 0])``, validation scenes from
    ``default_rng([seed, 1])``: the validation scenes are the same at every scale. The
    native-aspect scenes (``aspect_ratios``) come from ``default_rng([seed, 2])``, the same
    at every scale; scene ``i`` has aspect ``aspect_ratios[i % len(aspect_ratios)]``.

    Args:
        progress: show a tqdm progress bar.

    Returns:
        The ``meta.json`` content.
    """
    splits = [('train', settings.train_size, settings.num_train)]
    splits += [(split_name(s), settings.size_at(s), settings.num_val) for s in settings.scales]
    ratios = settings.aspect_ratios
    if ratios:  # meta.json gives these splits' size as (long side, long side)
        splits += [
            (aspect_split_name(s), (aspect_size(settings, s, 1.0)[0],) * 2, settings.num_val)
            for s in settings.scales
        ]

    def images(name: str, size: Tuple[int, int], number: int):
        if name.startswith('val_aspect_x'):
            rng = np.random.default_rng([settings.seed, 2])
            scale = float(name[len('val_aspect_x') :])
            for i in range(number):
                aspect = ratios[i % len(ratios)]
                yield render_scene(
                    sample_scene(rng, settings, aspect=aspect),
                    aspect_size(settings, scale, aspect),
                    settings.noise_std,
                )
            return
        rng = np.random.default_rng([settings.seed, 0 if name == 'train' else 1])
        for _ in range(number):
            yield render_scene(sample_scene(rng, settings), size, settings.noise_std)

    meta = dict(settings=settings.to_json(), classes=list(CLASSES), palette=PALETTE)
    return write_dataset(root, splits, images, meta, len(CLASSES), progress)


def ensure_relational_dataset(
    root: str, settings: RelationalSettings = RelationalSettings(), progress: bool = False
) -> Dict[str, Any]:
    """The dataset at ``root``, written only if ``meta.json`` is absent or was made with
    other settings. Returns the ``meta.json`` content."""
    return ensure_dataset(
        root, settings.to_json(), lambda: write_relational_dataset(root, settings, progress)
    )


def settings_from_dict(cfg: Optional[Dict[str, Any]]) -> RelationalSettings:
    """:class:`RelationalSettings` from a config dict (unknown keys are an error, by name)."""
    return _from_dict(RelationalSettings, cfg, 'relational dataset settings')


def save_examples(
    path: str,
    num: int = 6,
    scales: Sequence[float] = (1.0, 2.0),
    settings: RelationalSettings = RelationalSettings(),
    seed: int = 0,
) -> None:
    """Write a PNG sheet of ``num`` scenes: for each scale, a row of images and a row of
    their labels in :data:`PALETTE` colours, every tile enlarged to the largest size."""
    rng = np.random.default_rng(seed)
    scenes = [sample_scene(rng, settings) for _ in range(num)]
    big = settings.size_at(max(scales))
    rows = []
    for scale in scales:
        size = settings.size_at(scale)
        tiles = [render_scene(s, size, settings.noise_std) for s in scenes]
        for part in (0, 1):
            row = []
            for image, label in tiles:
                tile = image if part == 0 else np.asarray(PALETTE, dtype=np.uint8)[label]
                rep = (big[0] // size[0], big[1] // size[1])
                tile = tile.repeat(rep[0], 0).repeat(rep[1], 1)
                row.append(np.pad(tile, ((2, 2), (2, 2), (0, 0)), constant_values=128))
            rows.append(np.concatenate(row, axis=1))
    write_png(path, np.concatenate(rows, axis=0))
